"""explain: what every number and word in attnviz's tables means (attnviz.explain, attnviz explain): reads no model
and no run, the term asked about its input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register

if TYPE_CHECKING:
    from attnviz.api.stats import Glossary

SUMMARY = "What every number and word in attnviz's tables means: each metric, pattern label and term."


@dataclass(frozen=True)
class Options:
    pass


@register("explain", Options, SUMMARY, reads="nothing")
def compute(subject: Any, options: Options, term: str | None) -> Glossary:
    from attnviz.api.stats import explain

    return explain(term)
