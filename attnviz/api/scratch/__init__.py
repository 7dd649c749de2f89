"""The checks and lessons computed from the model's own weights, not from its attention: verify (α recomputed
from the formula, against what the model reports), steps (one head's formula step by step), positions (what
position embeddings do), scaling (why divide by √d_k). The torch side of each is attnviz.engine.scratch."""
