"""Every analysis one registered module: attnviz/analyses/<command>.py holds its options (a dataclass whose fields
carry their help; the command line's options are made from it: attnviz.cli.options), `compute(run, options)` giving
its result, and registers them under the command's name. run.<command>() and the command line read the registry.

    from attnviz import analyses
    analyses.available()                       # ("heads", "entropy", …)
    heads = analyses.get("heads")
    heads.options(top=5)                       # the options, their defaults the function's and the flag's
    heads.compute(run, heads.options(top=5))   # what run.heads(top=5) and attnviz heads --top 5 give

Importing this package imports no analysis module: each loads when it is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Analysis", "available", "get", "register", "MODULES"]

# command -> its module, in the order the command line lists them
MODULES: dict[str, str] = {
    "heatmap": "attnviz.analyses.heatmap",
    "token": "attnviz.analyses.token",
    "steps": "attnviz.analyses.steps",
    "positions": "attnviz.analyses.positions",
    "compare": "attnviz.analyses.compare",
    "heads": "attnviz.analyses.heads",
    "entropy": "attnviz.analyses.entropy",
    "rollout": "attnviz.analyses.rollout",
    "norms": "attnviz.analyses.norms",
    "sinks": "attnviz.analyses.sinks",
    "contributions": "attnviz.analyses.contributions",
    "logit-attr": "attnviz.analyses.logit_attr",
    "lens": "attnviz.analyses.lens",
    "why": "attnviz.analyses.why",
    "faithfulness": "attnviz.analyses.faithfulness",
    "ablate": "attnviz.analyses.ablate",
    "importance": "attnviz.analyses.importance",
    "detect": "attnviz.analyses.detect",
    "patch": "attnviz.analyses.patch",
    "discover": "attnviz.analyses.discover",
    "circuits": "attnviz.analyses.circuits",
    "retrieval": "attnviz.analyses.retrieval",
    "massive": "attnviz.analyses.massive",
    "align": "attnviz.analyses.align",
    "explain": "attnviz.analyses.explain",
    "verify": "attnviz.analyses.verify",
    "scaling": "attnviz.analyses.scaling",
    "capture": "attnviz.analyses.capture",
    "generate": "attnviz.analyses.generate",
    "export": "attnviz.analyses.export",
    "view": "attnviz.analyses.view",
    "corpus": "attnviz.analyses.corpus",
    "cost": "attnviz.analyses.cost",
    "serve": "attnviz.analyses.serve",
}


@dataclass(frozen=True)
class Analysis:
    """One registered analysis: the command's `name`, its `options` dataclass, `compute(run, options)` giving its
    result, and `summary` (what the command's --help says it does)."""

    name: str
    options: type
    compute: Callable[[Any, Any], Any]
    summary: str
    reads: str = "run"  # compute's first argument: a Run; a Model (the weights alone); "nothing" (explain: None)
    intervenes: bool = False  # runs the model itself (an intervention, other inputs): passes beyond the run's
    shows_alpha: bool = False  # a view of α itself (its result holds the weights: L·H·T² numbers at most)

    @property
    def inputs(self) -> tuple[str, ...]:
        """What compute must be given beside its subject and options, in order (token; corrupt, answers; audio;
        *others: any number)."""
        import inspect

        params = list(inspect.signature(self.compute).parameters.values())[2:]
        return tuple(("*" if p.kind is p.VAR_POSITIONAL else "") + p.name for p in params
                     if p.kind is p.VAR_POSITIONAL or p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty)

    def __call__(self, subject: Any, *inputs: Any, **options: Any) -> Any:
        """The analysis of `subject` (a Run, or a Model where `reads` is "model") with these options (the others
        at their defaults); `inputs`: what some analyses read beside the run (discover: the corrupted prompt and
        the two answers)."""
        return self.compute(subject, self.options(**options), *inputs)


_REGISTRY: dict[str, Analysis] = {}


def register(name: str, options: type, summary: str, reads: str = "run", intervenes: bool = False,
             shows_alpha: bool = False) -> Callable[[Callable], Callable]:
    """Decorator of an analysis module's compute(run, options) (or compute(model, options) where `reads` is
    "model"): registers it under the command's `name`. `intervenes`: it runs the model itself (erasure, ablation,
    patching, another input) rather than reading the run's pass; `shows_alpha`: its result is a view of α itself
    (heatmap, capture, …)."""
    if name not in MODULES:
        raise ValueError(f"{name!r} is not in attnviz.analyses.MODULES")

    def decorate(compute: Callable) -> Callable:
        _REGISTRY[name] = Analysis(name, options, compute, summary, reads, intervenes, shows_alpha)
        return compute

    return decorate


def available() -> tuple[str, ...]:
    """Every registered analysis, by its command's name."""
    return tuple(MODULES)


def get(name: str) -> Analysis:
    """The analysis of the command `name` (its module imported now)."""
    if name not in MODULES:
        raise KeyError(f"no analysis {name!r}: {', '.join(MODULES)}")
    if name not in _REGISTRY:
        importlib.import_module(MODULES[name])
    return _REGISTRY[name]
