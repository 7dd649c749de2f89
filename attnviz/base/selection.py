"""Layer and head selections as users type them: one parser behind every --layer and --head option.

    spec   := item ("," item)*
    item   := INDEX | INDEX "-" INDEX | INDEX ":" INDEX | "all" | KEYWORD     KEYWORD: "mean" or "max"
              (a-b includes b; a:b is Python's slice, without b: 4000:4100 is 4000-4099)
    INDEX  := an integer; negative counts from the end (-1 is the last)

`Selection.parse` checks the syntax only, so an option can be refused before any model work.
`Selection.resolve(n)` checks every endpoint against n *before* anything is expanded, so a range like
0-100000000 costs nothing and says "out of range". A reversed range, an empty spec and an unknown word
are errors whose message says what is valid; a selection is never silently empty. Pure Python.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union
import unicodedata

from attnviz.errors import SelectionError, UsageError, arg
from attnviz.base.text import visible

MAX_SPEC_CHARS = 1000
_RANGE = re.compile(r"^(-?\d{1,18})\s*-\s*(-?\d{1,18})$", re.ASCII)
_INDEX = re.compile(r"^-?\d{1,18}$", re.ASCII)
_SLICE = re.compile(r"^(-?\d{1,18})\s*:\s*(-?\d{1,18})$", re.ASCII)  # Python's half-open a:b (b not included)

Item = Union[int, tuple[int, int], str]  # an index, an inclusive (first, last) range, or a keyword
Choice = Union[int, str]  # a resolved index, or a keyword ("mean", "max")


def _shown(spec: str) -> str:
    return repr(visible(spec[:60] + ("…" if len(spec) > 60 else "")))


@dataclass(frozen=True)
class Selection:
    """A parsed selection of `what` ("layer", "head"), not yet checked against a size."""

    spec: str
    what: str
    items: tuple[Item, ...]
    field: str | None = None  # the argument it came from ("layers", "rows"), for messages

    @classmethod
    def parse(cls, spec: str, what: str = "layer", *, keywords: tuple[str, ...] = (),
              field: str | None = None) -> Selection:
        """Parse `spec`; raise SelectionError (a usage error) for anything malformed."""
        field = field or what
        words = " or ".join([*(repr(k) for k in ("all", *keywords))])
        valid = (f"use an index (0, or -1 for the last), a list (0,3,5), a range (0-2) or {words}")
        if len(spec) > MAX_SPEC_CHARS:
            raise SelectionError(f"{arg(field)}: the selection is {len(spec)} characters long; {valid}", field)
        if not spec.strip():
            raise SelectionError(f"{arg(field)}: the selection is empty; {valid}", field)
        items: list[Item] = []
        for part in spec.split(","):
            part = part.strip().lower()
            if not part:
                raise SelectionError(f"{arg(field)}: {_shown(spec)} has an empty item; {valid}", field)
            if part == "all" or part in keywords:
                items.append(part)
            elif _INDEX.match(part):
                items.append(int(part))
            elif (m := _SLICE.match(part)) is not None:
                first, stop = int(m.group(1)), int(m.group(2))
                if first >= 0 and stop >= 0 and stop <= first:
                    raise SelectionError(f"{arg(field)}: the slice {part} is empty; write a:b with b > a", field)
                items.append((first, stop - 1) if stop != 0 else (first, -1))
            elif (m := _RANGE.match(part)) is not None:
                first, last = int(m.group(1)), int(m.group(2))
                if first >= 0 and last >= 0 and first > last:
                    raise SelectionError(f"{arg(field)}: the range {part} is reversed; write {last}-{first}", field)
                items.append((first, last))
            else:
                raise SelectionError(f"{arg(field)}: {_shown(part)} is not a {what} selection; {valid}", field)
        return cls(spec=spec, what=what, items=tuple(items), field=field)

    @classmethod
    def everything(cls, what: str = "layer", field: str | None = None) -> Selection:
        return cls(spec="all", what=what, items=("all",), field=field or what)

    @property
    def argument(self) -> str:
        """The argument this selection was given as (for messages): its field, else what it selects."""
        return self.field or self.what

    def _index(self, value: int, n: int) -> int:
        if not -n <= value < n:
            plural = f"{self.what}s" if n != 1 else self.what
            raise SelectionError(f"{self.what} {value} is out of range: there are {n} {plural} (0..{n - 1}, "
                                 f"or -{n}..-1 from the end)", self.field)
        return value % n

    def resolve(self, n: int) -> list[Choice]:
        """The selected indices (0..n-1) and keywords, in the order typed, without repeats."""
        chosen: list[Choice] = []
        seen: set[Choice] = set()
        for item in self.items:
            if item == "all":
                values: list[Choice] = list(range(n))
            elif isinstance(item, str):
                values = [item]
            elif isinstance(item, tuple):
                first, last = (self._index(v, n) for v in item)  # bounds first: nothing expanded yet
                if first > last:
                    raise SelectionError(f"{arg(self.argument)}: the range {item[0]}-{item[1]} selects {self.what}s "
                                         f"{first} down to {last} of 0..{n - 1}, which is reversed; "
                                         f"write {last}-{first}", self.field)
                values = list(range(first, last + 1))
            else:
                values = [self._index(item, n)]
            for v in values:
                if v not in seen:
                    seen.add(v)
                    chosen.append(v)
        return chosen

    def indices(self, n: int, named: Mapping[str, Sequence[int]] | None = None) -> list[int]:
        """Only indices: a keyword is an error (e.g. 'mean' where heads are listed one by one), unless `named`
        gives its indices (e.g. {"generated": [5, 6, 7], "prompt": [0, ..., 4]} for --rows)."""
        named = named or {}
        chosen: list[int] = []
        for choice in self.resolve(n):
            if isinstance(choice, int):
                values: Sequence[int] = [choice]
            elif choice in named:
                values = named[choice]
                if not len(values):
                    raise SelectionError(f"{arg(self.argument)}: this input has no {choice} tokens"
                                         + (" (they come from attnviz generate)" if choice == "generated" else ""),
                                         self.field)
            else:
                raise SelectionError(f"{arg(self.argument)}: {choice!r} cannot be used here; give {self.what} indices, "
                                     f"ranges or 'all'", self.field)
            chosen.extend(int(v) for v in values)
        return list(dict.fromkeys(chosen))

    def one(self) -> int:
        """The one index of a selection parsed as a single layer or head (OneLayer, OneHead: a whole number)."""
        if len(self.items) != 1 or not isinstance(self.items[0], int) or isinstance(self.items[0], bool):
            raise UsageError(f"{arg(self.argument)} takes one whole number here, not {self.spec!r:.40}", self.field)
        return self.items[0]

    def __str__(self) -> str:
        return self.spec


# --- tokens ---------------------------------------------------------------------------------------------


def _norm(text: str) -> str:
    return unicodedata.normalize("NFC", text).casefold()


_NTH = re.compile(r"^(.+)#([0-9]{1,9})$", re.DOTALL)


def check_token(spec: str | int | None, field: str = "token") -> None:
    """A token as a user names one (an index, a token's text, text#n), checked before any model runs: None, a
    whole number or a text that is not blank."""
    if spec is None or (isinstance(spec, int) and not isinstance(spec, bool)):
        return
    if not isinstance(spec, str) or not spec.strip():
        raise SelectionError(f"{arg(field)} names a token by its position (3, -1) or its text (cat, the#2); got "
                             f"{visible(repr(spec))[:40]}", field)


def find_token(tokens: list[str] | tuple[str, ...], spec: str, field: str = "token") -> int:
    """The position of one token, chosen by index (negative counts from the end), by its text
    (case-insensitive, as uncased tokenizers lowercase; "##" may be left out), or as text#n for the n-th
    occurrence. An ambiguous text says which occurrences exist; a missing one lists the tokens."""

    spec = spec.strip()
    T = len(tokens)
    if _INDEX.match(spec):
        index = int(spec)
        if not -T <= index < T:
            raise SelectionError(f"token {index} is out of range: there are {T} tokens (0..{T - 1}, or -{T}..-1)",
                                 field)
        return index % T
    numbered = _NTH.match(spec)  # text#n with n in ASCII digits ("the#²" is a token's text, not #2)
    text, nth = (numbered.group(1), numbered.group(2)) if numbered else (spec, "")
    key = _norm(text)
    matches = [i for i, t in enumerate(tokens) if _norm(t) == key or _norm(t.removeprefix("##")) == key]
    shown = visible(text)
    if not matches:
        words = _words(tokens)
        split = next((pieces for pieces in words if _norm("".join(p.removeprefix("##") for p in pieces)) == key
                      and len(pieces) > 1), None)
        if split:
            raise SelectionError(f"{shown!r} is split into {' '.join(visible(p) for p in split)}: choose one piece, "
                                 f"e.g. {visible(split[0])!r}, or give its index", field)
        listing = " ".join(f"{i}:{visible(t)}" for i, t in enumerate(tokens[:60])) + (" …" if T > 60 else "")
        raise SelectionError(f"no token {shown!r}; the tokens are {listing}", field)
    if nth:
        n = int(nth)
        if not 1 <= n <= len(matches):
            raise SelectionError(f"{shown!r} occurs {len(matches)} time{'s' if len(matches) > 1 else ''}; "
                                 f"#{n} does not exist", field)
        return matches[n - 1]
    if len(matches) > 1:
        places = ", ".join(str(i) for i in matches)
        choices = " or ".join(f"{text}#{n}" for n in range(1, len(matches) + 1))
        raise SelectionError(f"{shown!r} occurs {len(matches)} times (tokens {places}): write {visible(choices)}, "
                             f"or give an index", field)
    return matches[0]


def _words(tokens) -> list[list[str]]:
    """Tokens grouped into words: a "##" piece joins the word before it."""
    words: list[list[str]] = []
    for token in tokens:
        if token.startswith("##") and words:
            words[-1].append(token)
        else:
            words.append([token])
    return words


# --- heads as layer.head pairs (attnviz ablate --heads 5.11,3.0) ---------------------------------------

_PAIR = re.compile(r"^(-?\d{1,9})\s*\.\s*(-?\d{1,9}|all)$", re.ASCII)


def looks_like_pairs(spec: str) -> bool:
    """Whether a --heads value names heads as layer.head pairs (rather than a plain head selection)."""
    return "." in spec


def parse_pairs(spec: str, field: str = "heads") -> tuple[tuple[int, int | str], ...]:
    """`5.11,3.0` (layer.head, negative counting from the end; `5.all` for every head of layer 5): the pairs,
    syntax checked only."""
    if len(spec) > MAX_SPEC_CHARS:
        raise SelectionError(f"{arg(field)}: the list is {len(spec)} characters long; give layer.head pairs", field)
    pairs: list[tuple[int, int | str]] = []
    for part in spec.split(","):
        m = _PAIR.match(part.strip().lower())
        if m is None:
            raise SelectionError(f"{arg(field)}: {_shown(part.strip())} is not a layer.head pair; write e.g. 5.11,3.0 "
                                 f"(layer 5 head 11 and layer 3 head 0), or 2.all", field)
        head = m.group(2)
        pairs.append((int(m.group(1)), head if head == "all" else int(head)))
    return tuple(pairs)


def resolve_pairs(pairs: Sequence[tuple[int, int | str]], layers: int, heads: int,
                  field: str = "heads") -> list[tuple[int, int]]:
    """The pairs as (layer, head) within layers × heads, in the order given, without repeats; out of range is
    an error naming the sizes."""
    layer_sel = Selection("", "layer", (), field)
    head_sel = Selection("", "head", (), field)
    chosen: list[tuple[int, int]] = []
    for layer, head in pairs:
        n = layer_sel._index(layer, layers)
        for h in (range(heads) if head == "all" else [head_sel._index(int(head), heads)]):
            if (n, h) not in chosen:
                chosen.append((n, h))
    return chosen


def pair_form(heads: Any, field: str = "heads") -> tuple:
    """`heads` as written ("5.11,3.0", or pairs (layer, head or "all")), their form checked before any model is
    at hand (whether they are within the model: resolve_pairs)."""
    if isinstance(heads, str):
        return parse_pairs(heads, field)

    def whole(value) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    if not isinstance(heads, (list, tuple)) or not heads or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 and whole(pair[0])
            and (whole(pair[1]) or pair[1] == "all") for pair in heads):
        raise UsageError(f"{arg(field)} takes heads as \"5.11,3.0\" or (layer, head) pairs such as [(5, 11), "
                         f"(3, \"all\")]; got {str(heads)[:60]}", field)
    return tuple((int(layer), head if head == "all" else int(head)) for layer, head in heads)


def head_pairs(heads: Any, L: int, H: int) -> list[tuple[int, int]]:
    """`heads` as (layer, head) pairs within the model: "5.11,3.0", or pairs (layer, head or "all")."""
    return resolve_pairs(pair_form(heads), L, H)


def selection(value: Any, what: str = "layer", *, keywords: tuple[str, ...] = (),
              field: str | None = None) -> Selection:
    """A selection as the library takes it: a Selection, an index, a list of indices, or a spec as typed
    ("0-2", "all", "mean")."""
    if isinstance(value, Selection):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return Selection.parse(str(int(value)), what, keywords=keywords, field=field)
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) or v in keywords for v in value):
        return Selection.parse(",".join(str(v) for v in value), what, keywords=keywords, field=field)
    if isinstance(value, str):
        return Selection.parse(value, what, keywords=keywords, field=field)
    raise UsageError(f"{arg(field or what)} takes an index, a list of indices or a selection such as \"0-2\" or "
                     f"\"all\"; got {str(value)[:40]}", field or what)
