"""The matplotlib Figure every picture is drawn on: an ordinary Figure (built explicitly, never through
pyplot) that also shows itself as an image in Jupyter, JupyterLab and VS Code, with no `%matplotlib inline`.
Imports matplotlib: the renderers import this module only when they draw."""

from __future__ import annotations

import io

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
            super().draw(renderer)

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=NOTEBOOK_DPI)
        return buffer.getvalue()
