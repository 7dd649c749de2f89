"""What one picture shows, decided once. A Panel holds a matrix, its row and column labels, the cells
that are not drawn, the colour scale, the title and the file name; a Page is the panels that go into one
figure or one screen, with the title over them. Every renderer (PNG/SVG/PDF, terminal, the export and
its gallery) consumes these and decides nothing about content: head selection, hidden special tokens,
the causal mask, titles and names are all made here. Labels and titles are display-safe (control
characters made visible). numpy only.

One job a module: page (Scale, Panel, Page), names (labels and titles), attention (α panels, the heatmap
page), summaries (rollout, entropy, head grids), removal (attnviz ablate), steps (attnviz steps and
positions), one_token (attnviz token). This package re-exports their public names.
"""

from __future__ import annotations

from attnviz.panels.page import (AUTO_LINEAR_MAX_T, coarsen, HeadChoice, LOG_RANGE, NORMS, Page, Panel,
                                 pool_columns, Scale, ScaleChoice)
from attnviz.panels.names import (generated_split, grid_title, head_filename, head_label, kept_tokens, key_labels,
                                  PART_TITLES, short_model, splits, text_subtitle, token_labels)
from attnviz.panels.attention import (apply_scale, attention_panels, heatmap_page, quantity_scale, window_page,
                                      window_panels, with_shared_scale)
from attnviz.panels.summaries import entropy_panel, head_grid_panel, label_share_page, rollout_panel
from attnviz.panels.removal import delta_layers, delta_page, DELTA_PANELS
from attnviz.panels.steps import positions_page, steps_page
from attnviz.panels.image import image_page, query_of
from attnviz.panels.one_token import generation_steps, STRIPE_SHARE, token_links, token_page

__all__ = ["apply_scale", "attention_panels", "AUTO_LINEAR_MAX_T", "coarsen", "delta_layers", "delta_page",
           "DELTA_PANELS", "entropy_panel", "generated_split", "generation_steps", "grid_title", "head_filename",
           "head_grid_panel", "head_label", "HeadChoice", "heatmap_page", "image_page", "query_of", "kept_tokens",
           "key_labels", "label_share_page", "LOG_RANGE", "NORMS", "Page", "Panel", "pool_columns", "PART_TITLES",
           "positions_page", "quantity_scale", "rollout_panel", "Scale", "ScaleChoice", "short_model", "splits",
           "steps_page", "STRIPE_SHARE", "text_subtitle", "token_labels", "token_links", "token_page",
           "window_page", "window_panels", "with_shared_scale"]
