"""How weights map to colours: the options every view of α shares (heatmap, token), one dataclass its views'
options extend."""

from __future__ import annotations

from dataclasses import dataclass

from attnviz.base.options import option


@dataclass(frozen=True)
class Look:
    scale: str = option("shared", "shared or per-head: one colour scale for every panel (shared), or each its own "
                                  "(per-head).", metavar="SCALE", choices=("shared", "per-head"),
                        aliases={"per_head": "per-head", "each": "per-head"})
    norm: str = option("auto", "auto, linear, sqrt or log: how weights map to colours (sqrt or log show small "
                               "weights; auto is linear up to 64 tokens, log beyond). Not --norms (value-weighted "
                               "norms).", metavar="NORM", choices=("auto", "linear", "sqrt", "log"),
                       aliases={"power": "sqrt"})
    vmax: float | None = option(None, "Top of the colour scale (default: the largest weight shown).", minimum=0.0,
                                metavar="NUMBER")
