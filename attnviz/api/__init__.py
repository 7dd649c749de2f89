"""attnviz from Python and notebooks: the one door to the library. The command line calls these functions and
nothing else of the library's model side; so can you.

    import attnviz
    model = attnviz.load_model("minilm")                  # or "multilingual", "smollm2", a folder, a .gguf
    cap = attnviz.capture("The cat sat on the mat", model=model)
    cap                                                   # in Jupyter / VS Code: the interactive viewer
    cap.heatmap(layer=0, head=2)                          # a matplotlib Figure
    attnviz.verify("The cat sat on the mat", model=model).passed

Every function takes its input first and everything else by keyword (`fn(text, *, model=None, …)`), and
returns a frozen, typed result with `to_dict()` (what the command's --json prints) and, where a picture
suits, `figure()`. Errors are attnviz.AttnvizError subclasses whose messages name these functions' arguments.
Importing this module imports neither torch nor transformers; they load with the first model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> the module that defines it. Each module loads when one of its names is first used (PEP 562), so the
# command line, which imports one function, loads only what that command needs (removal's module, for one,
# imports torch).
_HOMES = {
    **dict.fromkeys(("Keep", "capture", "capture_audio", "capture_image", "from_outputs", "load_capture", "picture",
                     "Picture", "sound", "Sound", "to_words"),
                    "attnviz.api.capturing"),
    **dict.fromkeys(("Contributions", "HeadEffect", "LOGIT_TOLERANCE", "LogitAttribution", "contributions",
                     "logit_attribution"), "attnviz.api.attribution"),
    **dict.fromkeys(("patch", "Patching", "PATCH_TOLERANCE", "path_patch", "PathPatching"), "attnviz.api.patching"),
    **dict.fromkeys(("CorpusState", "corpus", "merge"), "attnviz.api.corpora"),
    **dict.fromkeys(("Circuits", "MassiveActivations", "RetrievalHeads", "SinkRate", "circuits", "massive",
                     "retrieval_heads", "sink_rate"), "attnviz.api.mechanisms"),
    **dict.fromkeys(("Cost", "cost"), "attnviz.api.costs"),
    **dict.fromkeys(("WordTimings", "align", "ALIGNMENT_TOLERANCE"), "attnviz.api.speech"),
    **dict.fromkeys(("DEVICES", "DTYPES", "Model", "conversion_pending", "list_families", "load_model",
                     "model_shape", "resolve_model"), "attnviz.api.models"),
    **dict.fromkeys(("MAX_IMPORTANCE_TEXTS", "MAX_MEAN_TEXTS", "Ablation", "Detection", "Importance", "ablate",
                     "detect", "importance"), "attnviz.api.ablation"),
    **dict.fromkeys(("TOLERANCE", "Positions", "Scaling", "Steps", "Verification", "positions", "scaling", "steps",
                     "verify", "patch_positions", "PatchPositions", "POSITION_TOLERANCE"), "attnviz.api.scratch"),
    **dict.fromkeys(("HeadTable", "Rollout", "heads", "rollout"), "attnviz.api.stats"),
    **dict.fromkeys(("Norms", "Sinks", "norms", "sinks"), "attnviz.api.values"),
    **dict.fromkeys(("Decoding", "Generation", "generate"), "attnviz.api.generation"),
    "Capture": "attnviz.data.capture", "Parts": "attnviz.data.parts", "ModelSpec": "attnviz.engine.models",
    "export": "attnviz.api.gallery", "list_metrics": "attnviz.metrics", "register_metric": "attnviz.metrics",
}
_RENAMED = {"view": ("attnviz.api.notebook", "write_view")}

if TYPE_CHECKING:
    from attnviz.api.capturing import (Keep, Picture, Sound, capture, capture_audio, capture_image, from_outputs,
                                       load_capture, picture, sound, to_words)
    from attnviz.api.speech import ALIGNMENT_TOLERANCE, WordTimings, align
    from attnviz.api.attribution import (Contributions, HeadEffect, LOGIT_TOLERANCE, LogitAttribution,
                                           contributions, logit_attribution)
    from attnviz.api.patching import PATCH_TOLERANCE, PathPatching, Patching, patch, path_patch
    from attnviz.api.corpora import CorpusState, corpus, merge
    from attnviz.api.mechanisms import (Circuits, MassiveActivations, RetrievalHeads, SinkRate, circuits, massive,
                                        retrieval_heads, sink_rate)
    from attnviz.api.costs import Cost, cost
    from attnviz.api.models import (DEVICES, DTYPES, Model, conversion_pending, list_families,
                                    load_model, model_shape, resolve_model)
    from attnviz.api.ablation import (MAX_IMPORTANCE_TEXTS, MAX_MEAN_TEXTS, Ablation, Detection,
                                     Importance, ablate, detect, importance)
    from attnviz.api.scratch import (POSITION_TOLERANCE, TOLERANCE, PatchPositions, Positions, Scaling, Steps,
                                     Verification, patch_positions, positions, scaling, steps, verify)
    from attnviz.api.stats import HeadTable, Rollout, heads, rollout
    from attnviz.api.values import Norms, Sinks, norms, sinks
    from attnviz.api.generation import Decoding, Generation, generate
    from attnviz.data.capture import Capture
    from attnviz.data.parts import Parts
    from attnviz.api.notebook import write_view as view
    from attnviz.engine.models import ModelSpec
    from attnviz.api.gallery import export
    from attnviz.metrics import list_metrics, register_metric


def __getattr__(name: str):
    if name in _RENAMED:
        home, attribute = _RENAMED[name]
    elif name in _HOMES:
        home, attribute = _HOMES[name], name
    else:
        raise AttributeError(f"module 'attnviz.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = ["ALIGNMENT_TOLERANCE", "Ablation", "Capture", "Circuits", "Contributions", "CorpusState", "Cost",
           "DEVICES", "DTYPES", "Decoding", "Detection", "Generation", "HeadEffect", "HeadTable", "Importance",
           "Keep", "LOGIT_TOLERANCE", "LogitAttribution", "MAX_IMPORTANCE_TEXTS", "MAX_MEAN_TEXTS",
           "MassiveActivations", "Model", "ModelSpec", "Norms", "Parts", "Positions", "RetrievalHeads", "Rollout",
           "PATCH_TOLERANCE", "PatchPositions", "Patching", "PathPatching", "Picture", "POSITION_TOLERANCE",
           "Scaling", "SinkRate", "Sinks", "Sound", "Steps", "TOLERANCE", "Verification", "WordTimings", "ablate",
           "align", "capture", "capture_audio", "capture_image", "circuits", "contributions", "conversion_pending",
           "corpus", "cost", "detect", "export", "from_outputs", "generate", "heads", "importance", "list_families",
           "list_metrics", "load_capture", "load_model", "logit_attribution", "massive", "merge", "model_shape",
           "norms", "patch", "patch_positions", "path_patch", "picture", "positions", "register_metric",
           "resolve_model", "retrieval_heads", "rollout", "scaling", "sink_rate", "sinks", "sound", "steps",
           "to_words", "verify", "view"]
