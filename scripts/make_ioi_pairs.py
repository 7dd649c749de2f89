"""Write scripts/ioi_pairs.jsonl: 24 indirect-object-identification pairs for `attnviz discover --pairs`, made
from the templates of Wang et al. 2022 ("Interpretability in the Wild"). Each clean prompt repeats the subject
(When Mary and John went to the store, John gave a drink to → Mary); its corrupted twin names a third person
instead (the "ABC" corruption of Wang et al. and of Hanna et al. 2024's EAP-IG), so nothing in it says which of
the two to give to. The answers: the indirect object, then the subject. Every name is one token, with its
leading space, in SmolLM2's and GPT-2's vocabularies, so the two prompts of a pair have as many tokens.

    python scripts/make_ioi_pairs.py
"""

from __future__ import annotations

import json
from pathlib import Path

NAMES = ["Mary", "John", "Tom", "James", "Sarah", "Anna", "Paul", "Lisa", "Mark", "Kate", "David", "Emma"]
TEMPLATES = [
    "When {A} and {B} went to the {P}, {C} gave a {O} to",
    "After {A} and {B} went to the {P}, {C} gave a {O} to",
    "Then, {A} and {B} went to the {P}. {C} gave a {O} to",
    "While {A} and {B} were working at the {P}, {C} gave a {O} to",
    "When {A} and {B} got a {O} at the {P}, {C} decided to give it to",
    "Friends {A} and {B} went to the {P}. {C} gave a {O} to",
]
PLACES = ["store", "garden", "school", "restaurant"]
OBJECTS = ["drink", "book", "ring", "bone"]


def pairs() -> list[dict]:
    made, k = [], 0
    for t, template in enumerate(TEMPLATES):
        for j in range(4):
            a, b, c = (NAMES[(3 * k + i) % len(NAMES)] for i in range(3))
            k += 1
            place, thing = PLACES[(t + j) % 4], OBJECTS[(t + 2 * j) % 4]
            made.append({"clean": template.format(A=a, B=b, C=b, P=place, O=thing),
                         "corrupt": template.format(A=a, B=b, C=c, P=place, O=thing), "answers": [" " + a, " " + b]})
    return made


if __name__ == "__main__":
    target = Path(__file__).resolve().parent / "ioi_pairs.jsonl"
    target.write_text("".join(json.dumps(p) + "\n" for p in pairs()), encoding="utf-8")
    print(f"{target.name}: {len(pairs())} pairs")
