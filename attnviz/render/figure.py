"""The matplotlib Figure every picture is drawn on: an ordinary Figure (built explicitly, never through
pyplot) that also shows itself as an image in Jupyter, JupyterLab and VS Code, with no `%matplotlib inline`.
Imports matplotlib: the renderers import this module only when they draw."""

from __future__ import annotations

import io
import re
from typing import Any

from matplotlib.figure import Figure

NOTEBOOK_DPI = 100  # what a notebook shows; files are written at their own dpi


class NotebookFigure(Figure):
    """A Figure whose PNG is its rich display (`_repr_png_`, IPython's protocol), so that a figure returned
    to a notebook cell is drawn, not printed as `<Figure size 614x579 with 2 Axes>`. Where IPython's own
    matplotlib formatter is active (`%matplotlib inline`), that one draws it, once."""

    def draw(self, renderer) -> None:
        """Every text drawn as it is: a "$" in a user's sentence or a model's token is a dollar sign, never
        matplotlib's mathtext (where "$\\frac$" would fail to parse and "$x$" turn italic). Texts made before
        the draw are set so; those the draw makes (tick labels) take the setting from the rc context."""
        import matplotlib
        from matplotlib.text import Text

        with matplotlib.rc_context({"text.parse_math": False}):
            for text in self.findobj(Text):
                text.set_parse_math(False)
            for ax in self.axes:  # colour bars included: they are axes of the figure
                for axis in (ax.xaxis, ax.yaxis):
                    plain_log_labels(axis.get_major_formatter())
                    plain_log_labels(axis.get_minor_formatter())
            super().draw(renderer)

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=NOTEBOOK_DPI)
        return buffer.getvalue()


_SUPERSCRIPT = str.maketrans("0123456789-+.", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺·")
_POWER = re.compile(r"\^\{([^{}]*)\}|\^(-?\d)")
_PLAIN: dict[type, type] = {}


def plain_math(label: str) -> str:
    """A tick label matplotlib wrote in mathtext (`$\\mathdefault{2\\times10^{-4}}$`) as the plain text it
    means ("2×10⁻⁴"): with mathtext off (every text drawn as it is) the source would be printed. Other labels are
    returned as they are."""
    if not (label.startswith("$") and label.endswith("$") and len(label) > 1):
        return label
    inner = label[1:-1]
    found = re.fullmatch(r"\\mathdefault\{(.*)\}", inner)
    inner = found.group(1) if found else inner
    inner = _POWER.sub(lambda m: (m.group(1) if m.group(1) is not None else m.group(2)).translate(_SUPERSCRIPT),
                       inner)
    inner = inner.replace("\\times", "×").replace("\\cdot", "·").replace("\\,", "").replace("\\ ", " ")
    return inner.replace("-", "−").replace("{", "").replace("}", "")


def plain_log_labels(formatter) -> None:
    """Make a log axis's formatter (matplotlib's LogFormatterMathtext and its kind, which write 10^{-4} in
    mathtext) write plain Unicode instead: the formatter's class is swapped, in place, for a subclass whose
    labels go through plain_math, so that every setting it holds (and the axis's own bookkeeping) stays."""
    from matplotlib.ticker import LogFormatterMathtext

    kind = type(formatter)
    if not isinstance(formatter, LogFormatterMathtext) or getattr(kind, "plain_unicode", False):
        return
    if kind not in _PLAIN:
        def __call__(self, x, pos=None, _call=kind.__call__):
            return plain_math(_call(self, x, pos))

        _PLAIN[kind] = type(kind.__name__, (kind,), {"__call__": __call__, "plain_unicode": True,
                                                      "__module__": __name__})
    formatter.__class__ = _PLAIN[kind]


def canvas(ax, figsize: tuple[float, float], *, rows: int = 1, cols: int = 1, **grid: Any) -> tuple[Any, list]:
    """(figure, axes) a chart is drawn on: a new NotebookFigure with rows × cols subplots (constrained layout;
    `grid`: subplots' width_ratios, sharey, …), or, given the caller's `ax`, its figure and `ax` as the first
    (main) axes, the others on a scratch figure that is dropped: figure(ax=ax) draws a result's main chart on
    the caller's axes, as seaborn draws."""
    if ax is None:
        fig = NotebookFigure(figsize=figsize, layout="constrained")
        return fig, list(fig.subplots(rows, cols, squeeze=False, **grid).ravel())
    scratch = NotebookFigure()
    return ax.figure, [ax, *(scratch.add_subplot() for _ in range(rows * cols - 1))]


def titled(fig, ax, title: str, **style):
    """The chart's end: the figure's title and the figure returned; given the caller's `ax`, the title above the
    main axes' own (the figure is the caller's) and `ax` returned."""
    if ax is None:
        fig.suptitle(title, **style)
        return fig
    own = ax.get_title()
    ax.set_title(title + (f"\n{own}" if own else ""), fontsize=9)
    return ax
