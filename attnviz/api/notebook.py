"""What a Capture shows in a notebook: the interactive viewer inline, a heatmap Figure, the head table, the
page written to a file. These need the renderers, which sit above the Capture, so they register themselves
in attnviz.base.registry (imported by attnviz/__init__.py) rather than being imported from below.

The renderers are imported inside each function: `import attnviz` stays light (no numpy, no matplotlib).
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.base import registry
from attnviz.base.arguments import checked

# `import attnviz` imports this module (it registers the views), so everything beyond the standard library
# is imported inside the functions: `import attnviz` loads no numpy, matplotlib or torch.

FRAME_HEIGHT_PX = 760  # the frame's height until the page inside says how tall it is (at most FRAME_MAX_PX)
FRAME_MAX_PX = 2000

# Beside the frame: resize it to the height its page posts (a number, from that frame's window only).
_FIT = ("<script>(function () {{ var f = document.getElementById('{id}'); if (!f) return;"
        " window.addEventListener('message', function (e) {{ if (e.source !== f.contentWindow || !e.data) return;"
        " var h = Number(e.data.attnvizHeight); if (h > 0 && h < {max}) f.style.height = Math.round(h) + 'px'; }});"
        " }})();</script>")


def inline_html(whole: Any) -> str:
    """The interactive viewer as one sandboxed frame: its own document (scripts, styles, data and the page's
    Content-Security-Policy inside), so several views in one notebook never share an id or a script. The page
    posts its height and a few lines beside the frame fit the frame to it (where the notebook runs them:
    Jupyter and VS Code do; elsewhere the frame keeps FRAME_HEIGHT_PX)."""
    from attnviz.render.viewer import viewer_data, viewer_html

    return framed(viewer_html(viewer_data(whole, command="attnviz in a notebook")))


def framed(page: str) -> str:
    """A whole page (the viewer's) as a sandboxed frame that fits its height (inline_html)."""
    import uuid

    frame = f"attnviz-view-{uuid.uuid4().hex[:12]}"
    return (f'<iframe id="{frame}" class="attnviz-view" srcdoc="{html.escape(page, quote=True)}" '
            f'sandbox="allow-scripts" style="width: 100%; height: {FRAME_HEIGHT_PX}px; border: 0" '
            f'title="attnviz view"></iframe>' + _FIT.format(id=frame, max=FRAME_MAX_PX))


def heatmap_figure(whole: Any, layer: int = -1, head: int | str = "mean", *, cmap: str = "viridis",
                   hide_special: bool = False, vmax: float | None = None, ax=None):
    """α of one layer and head (an index, "mean" or "max") as a matplotlib Figure, or drawn on the axes `ax`
    (returned)."""
    from attnviz.render import png

    drawn = png.heatmap_figure(whole, whole.layer_index(layer), head, hide_special=hide_special, cmap=cmap,
                               vmax=vmax, ax=ax)
    return drawn if ax is not None else drawn.figure


def records_html(records: Sequence[dict], columns: Sequence[str], title: str = "") -> str:
    """Records as an HTML table (numbers to 3 significant digits, every string escaped)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)

    def cell(value) -> str:
        return f"{value:.3g}" if isinstance(value, float) else html.escape(str(value))

    rows = "".join("<tr>" + "".join(f"<td>{cell(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in records)
    caption = f"<caption>{html.escape(title)}</caption>" if title else ""
    return f'<table class="attnviz-table">{caption}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


@dataclass(frozen=True)
class HeadTable:
    """The head statistics of a capture: one record per layer and head, every registered metric and the
    pattern label. Shown as an HTML table in a notebook; `to_records()` for data."""

    records: tuple[dict, ...]

    def to_records(self) -> list[dict]:
        return [dict(r) for r in self.records]

    def to_dict(self) -> list[dict]:
        return self.to_records()

    def __len__(self) -> int:
        return len(self.records)

    def _repr_html_(self) -> str:
        from attnviz.metrics import METRICS

        present = self.records[0] if self.records else {}
        columns = ["layer", "head", "label", *(m.name for m in METRICS if m.name in present)]
        return records_html(self.records, columns).replace('class="attnviz-table"', 'class="attnviz-heads"', 1)


def head_table(whole: Any) -> HeadTable:
    from attnviz.metrics import head_records

    return HeadTable(tuple(head_records(whole)))


@checked
def write_view(whole: Any, path: str | os.PathLike, *, layers: Sequence[int] | None = None) -> Path:
    """The interactive page as one offline HTML file at `path`, written atomically. `layers`: the layers of the
    capture (of an encoder-decoder model's, the encoder's) to include, by index (-1 is the last)."""
    from attnviz.data.capture import Capture
    from attnviz.data.parts import Parts
    from attnviz.errors import InputError, SelectionError, arg
    from attnviz.base.files import atomic_output
    from attnviz.render.viewer import viewer_data, viewer_html

    if not isinstance(whole, (Capture, Parts)):
        raise InputError(f"view takes a Capture (or an encoder-decoder model's Parts); got {type(whole).__name__}")
    if layers is not None:
        count = (whole if isinstance(whole, Capture) else whole.part(whole.names[0])).n_layers
        if not layers or not all(-count <= layer < count for layer in layers):
            raise SelectionError(f"{arg('layers')} takes layer indices from 0 to {count - 1} (or -1 for the last); got "
                                 f"{str(list(layers))[:60]}", "layers")
        layers = sorted({layer % count for layer in layers})
    target = Path(path).expanduser()
    with atomic_output(target) as tmp:
        tmp.write_text(viewer_html(viewer_data(whole, layers=layers, command="attnviz in Python")), encoding="utf-8")
    return target


for _name, _function in (("html", inline_html), ("heatmap", heatmap_figure), ("heads", head_table),
                         ("view", write_view)):
    registry.register_view(_name, _function)
