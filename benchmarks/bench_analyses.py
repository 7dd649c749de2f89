"""What each long-running analysis costs, and what dominates it: every analysis of the guides run once from Python
on a model already loaded (its load timed apart, as a command pays it once), each phase timed from the progress the
analysis reports (its spinners and bars), on an idle machine.

    python benchmarks/bench_analyses.py                      # every row below
    python benchmarks/bench_analyses.py --only faithfulness  # the rows whose name holds this

Prints a Markdown table: the analysis, its seconds, and its phases largest first with their share. The docs'
guides quote it. Nothing here asserts a time (tests never do).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator

CAT = "The cat sat on the mat"
FRANCE, ITALY = "The capital of France is", "The capital of Italy is"
EIFFEL = "The Eiffel Tower is in the city of"


def rows() -> list[tuple[str, str, Callable]]:
    """(name, model, call(model, reporter)) for every analysis the guides time."""
    import attnviz

    corpus = open(os.path.join(os.path.dirname(__file__), "..", "scripts", "faithfulness_corpus.txt"),
                  encoding="utf-8").read().splitlines()[:10]
    return [
        ("faithfulness, one sentence (MiniLM)", "minilm",
         lambda m, r: attnviz.faithfulness(CAT, model=m, reporter=r)),
        ("faithfulness, one sentence (SmolLM2)", "smollm2",
         lambda m, r: attnviz.faithfulness(EIFFEL, model=m, reporter=r)),
        ("faithfulness --corpus, 10 sentences (MiniLM)", "minilm",
         lambda m, r: attnviz.faithfulness(corpus, model=m, reporter=r)),
        ("discover, one pair (SmolLM2, EAP-IG)", "smollm2",
         lambda m, r: attnviz.discover(FRANCE, ITALY, answers=(" Paris", " Rome"), model=m, reporter=r)),
        ("patch, heads (SmolLM2)", "smollm2",
         lambda m, r: attnviz.patch(FRANCE, ITALY, answers=(" Paris", " Rome"), model=m, reporter=r)),
        ("patch --method atp (SmolLM2)", "smollm2",
         lambda m, r: attnviz.patch(FRANCE, ITALY, answers=(" Paris", " Rome"), method="atp", model=m,
                                    reporter=r)),
        ("importance (MiniLM)", "minilm",
         lambda m, r: attnviz.importance("The cat sat on the mat because it was tired", model=m, reporter=r)),
        ("detect (SmolLM2)", "smollm2", lambda m, r: attnviz.detect(model=m, reporter=r)),
        ("contributions (MiniLM)", "minilm",
         lambda m, r: attnviz.contributions("The cat sat on the mat because it was tired", model=m)),
        ("logit-attr (SmolLM2)", "smollm2", lambda m, r: attnviz.logit_attr(EIFFEL, model=m)),
        ("circuits (SmolLM2)", "smollm2", lambda m, r: attnviz.circuits(model=m, reporter=r)),
        ("massive (SmolLM2)", "smollm2", lambda m, r: attnviz.massive(EIFFEL, model=m, reporter=r)),
        ("retrieval, 2 lengths × 2 depths (Gemma 3)", "gemma3",
         lambda m, r: attnviz.retrieval(model=m, lengths=[300, 700], depths=[0.2, 0.8], reporter=r)),
    ]


class Timed:
    """A Reporter that times every phase the analysis reports (a spinner's text, a bar's label)."""

    def __init__(self) -> None:
        from attnviz.progress import Reporter

        self.phases: dict[str, float] = {}
        self.base = Reporter

    def reporter(self):
        timed = self

        class Recording(self.base):  # type: ignore[misc, name-defined]
            @contextlib.contextmanager
            def status(self, text: str) -> Iterator[None]:
                with timed.timing(text):
                    yield

            @contextlib.contextmanager
            def progress(self, what: str, total: int, unit: str, *args, **kwargs):
                with timed.timing(what):
                    yield lambda n: None

        return Recording()

    @contextlib.contextmanager
    def timing(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only the rows whose name holds this")
    options = parser.parse_args()
    import attnviz

    warnings.simplefilter("ignore")
    loaded: dict[str, object] = {}
    lines = ["| analysis | load (s) | seconds | what dominates |", "|---|---|---|---|"]
    print(f"load average {os.getloadavg()[0]:.2f} (an idle machine reads near 0)", flush=True)
    for name, model, call in rows():
        if options.only not in name:
            continue
        load = 0.0
        if model not in loaded:
            start = time.perf_counter()
            loaded[model] = attnviz.load_model(model, device="cpu", lm_head="auto")
            load = time.perf_counter() - start
        timed = Timed()
        start = time.perf_counter()
        call(loaded[model], timed.reporter())
        total = time.perf_counter() - start
        phases = sorted(timed.phases.items(), key=lambda kv: -kv[1])
        told = ", ".join(f"{what.rstrip('…')} {seconds:.1f} s ({seconds / total:.0%})" for what, seconds in phases[:4])
        lines.append(f"| {name} | {load:.1f} | {total:.1f} | {told or '(one phase)'} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
