"""The logit lens drawn: streams (the embeddings, then after each block) × positions, each cell its top token,
coloured by that token's probability."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnviz.render.figure import canvas, titled


def lens_figure(tokens: np.ndarray, p: np.ndarray, streams: Sequence[str], positions: Sequence[str], title: str,
                *, cmap: str = "viridis", ax=None):
    """`tokens` (S, P) the top token of each stream and position, `p` (S, P) its probability; the embeddings at
    the bottom, the model's own output at the top. With ax=, drawn on those axes (returned)."""
    S, P = p.shape
    fig, axes = canvas(ax, (min(3.0 + 1.3 * P, 18.0), min(2.0 + 0.32 * S, 16.0)))
    main = axes[0]
    image = main.imshow(p, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", origin="lower")
    if S * P <= 1200:  # the tokens written where they can be read
        size = 8 if P <= 8 else 6
        for s in range(S):
            for i in range(P):
                shown = str(tokens[s, i])
                shown = "'" + shown[:12] + ("…" if len(shown) > 12 else "") + "'"  # quoted: ' Paris' is not 'Paris'
                main.text(i, s, shown, ha="center", va="center", fontsize=size,
                          color="black" if p[s, i] > 0.6 else "white")
    main.set_yticks(range(S), list(streams), fontsize=7)
    main.set_xticks(range(P), list(positions), rotation=45 if P > 4 else 0, ha="right" if P > 4 else "center",
                    fontsize=8)
    main.set_xlabel("position (its token): the next token predicted there")
    main.figure.colorbar(image, ax=main, shrink=0.8, label="probability of the top token")
    return titled(fig, ax, title, fontsize=10)
