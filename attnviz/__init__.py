"""attnviz: see what a transformer's self-attention does, from the command line.

Data flows one way: text -> model (model.py) -> Capture (capture.py) -> metrics (metrics.py) -> Panels
(panels.py) -> renderers (render/) -> CLI (cli/). Only model.py and scratch.py import torch/transformers.
"""

__version__ = "0.1.0"

from attnviz.capture import Capture
from attnviz.errors import AttnvizError

__all__ = ["Capture", "AttnvizError", "__version__"]
