"""attnviz: see what a transformer's self-attention does, from the command line and from Python.

Data flows one way: text -> model (model.py) -> Capture (capture.py) -> metrics (metrics.py) -> Panels
(panels.py) -> renderers (render/) -> the public API (api.py) -> CLI (cli/). Only model.py, scratch.py and
the modules they call import torch/transformers, and only when a model is loaded.

    import attnviz
    cap = attnviz.capture("The cat sat on the mat")     # the bundled MiniLM
    cap.heatmap(layer=0, head=2); cap.heads(); cap      # a Figure, a table, the viewer inline
"""

__version__ = "0.1.0"

from attnviz.capture import Capture, Parts
from attnviz.errors import AttnvizError
from attnviz.api import HeadTable, capture, load_model

__all__ = ["Capture", "Parts", "AttnvizError", "HeadTable", "capture", "load_model", "__version__"]
