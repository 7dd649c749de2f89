"""Colours: matplotlib colormaps by name, as RGB for every renderer, and the text colour that reads on
a cell (black or white from the cell's relative luminance, as seaborn does), for any colormap."""

from __future__ import annotations

import functools

import numpy as np

from attnviz.errors import ColormapError

# matplotlib is imported inside the functions that draw, so that reading a capture and --help never load it.

DEFAULT_CMAP = "viridis"
MASKED_RGB = (242, 242, 242)  # cells that are not drawn (#f2f2f2)
LUMINANCE_SPLIT = 0.408  # seaborn's threshold: above it, dark text reads better than white


@functools.lru_cache(maxsize=32)
def colormap(name: str):
    """The matplotlib colormap `name`, with masked cells drawn light grey. ColormapError if unknown."""
    from matplotlib import colormaps

    try:
        return colormaps[name].with_extremes(bad="#f2f2f2")
    except (KeyError, TypeError, ValueError):
        from attnviz.base.text import visible

        raise ColormapError(f"unknown colormap {visible(str(name))!r}; try viridis, magma, Blues or any "
                            f"matplotlib colormap name", "cmap") from None


def rgb(cmap: str, x: np.ndarray | float) -> np.ndarray:
    """Colours of values x in [0, 1] as uint8 RGB. (..., 3)"""
    return np.asarray(colormap(cmap)(np.asarray(x, dtype=np.float64), bytes=True))[..., :3]


def relative_luminance(color: np.ndarray) -> np.ndarray:
    """WCAG relative luminance of uint8 RGB colours. (..., 3) -> (...)"""
    c = np.asarray(color, dtype=np.float64) / 255.0
    linear = np.where(c <= 0.03928, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return linear @ np.array([0.2126, 0.7152, 0.0722])


def text_on(color: np.ndarray) -> np.ndarray:
    """For each uint8 RGB cell colour: True where the text on it should be dark. (..., 3) -> (...) bool"""
    return relative_luminance(color) > LUMINANCE_SPLIT
