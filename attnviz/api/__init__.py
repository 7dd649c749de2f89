"""attnviz from Python and notebooks: the one door to the library. The command line calls these functions and
nothing else of the library's model side; so can you.

    import attnviz
    model = attnviz.load_model("minilm")                  # or "multilingual", "smollm2", a folder, a .gguf
    cap = attnviz.capture("The cat sat on the mat", model=model)
    cap                                                   # in Jupyter / VS Code: the interactive viewer
    attnviz.heatmap(cap, layer=0, head=2).figure()        # a matplotlib figure
    attnviz.verify("The cat sat on the mat", model=model).passed

Every command is one function of the same name (hyphens as underscores: `attnviz logit-attr` is
attnviz.logit_attr), which takes its input first and everything else by keyword (`fn(text, *, model=None, …)`)
and returns a frozen, typed result that owns its output: `to_dict()` (exactly what the command's --json
prints), `to_rows()` (its --csv), `report()` (its terminal table), `figure()` where it draws and `html()` where it
has a page. Errors are attnviz.AttnvizError subclasses whose messages name these functions' arguments.

The public names come from one table, PUBLIC: each module loads when one of its names is first used (PEP 562),
so that importing attnviz imports neither torch nor transformers, and the command line, which calls one
function, loads only what that command needs.
"""

from __future__ import annotations

import importlib
import warnings

# module -> the public names it defines: the one list of the API (attnviz.__all__ and the docs follow it).
PUBLIC: dict[str, tuple[str, ...]] = {
    "attnviz.api.capturing": ("capture", "capture_audio", "capture_image", "from_outputs", "Keep", "load_capture",
                              "picture", "Picture", "sound", "Sound", "to_words"),
    "attnviz.api.views": ("heatmap", "Heatmap", "token", "TokenAttention", "compare", "Comparison", "view", "View"),
    "attnviz.api.stats": ("heads", "HeadTable", "entropy", "Entropy", "rollout", "Rollout", "explain", "Glossary"),
    "attnviz.api.scratch.verify": ("verify", "Verification", "TOLERANCE"),
    "attnviz.api.scratch.steps": ("steps", "Steps"),
    "attnviz.api.scratch.positions": ("positions", "Positions", "grid_positions", "GridPositions",
                                      "POSITION_TOLERANCE"),
    "attnviz.api.scratch.scaling": ("scaling", "Scaling"),
    "attnviz.api.values": ("norms", "Norms", "sinks", "Sinks", "sink_rate", "SinkRate"),
    "attnviz.api.attribution.contributions": ("contributions", "Contributions"),
    "attnviz.api.attribution.logits": ("logit_attr", "LogitAttribution", "HeadEffect", "LOGIT_TOLERANCE"),
    "attnviz.api.attribution.lens": ("lens", "Lens", "LENS_TOLERANCE"),
    "attnviz.api.attribution.why": ("why", "Why", "WHY_TOLERANCE"),
    "attnviz.api.attribution.faithfulness": ("faithfulness", "Faithfulness", "FaithfulnessCorpus",
                                             "MethodFaithfulness", "RandomBaseline", "FAITHFULNESS_METHODS"),
    "attnviz.api.ablation.removing": ("ablate", "Ablation", "MAX_MEAN_TEXTS"),
    "attnviz.api.ablation.ranking": ("importance", "Importance", "MAX_IMPORTANCE_TEXTS"),
    "attnviz.api.ablation.detectors": ("detect", "Detection"),
    "attnviz.api.patching.activation": ("patch", "Patching", "PATCH_TOLERANCE"),
    "attnviz.api.patching.paths": ("path_patch", "PathPatching"),
    "attnviz.api.patching.discovery": ("discover", "Discovery"),
    "attnviz.api.mechanisms.circuits": ("circuits", "Circuits"),
    "attnviz.api.mechanisms.retrieval": ("retrieval", "RetrievalHeads"),
    "attnviz.api.mechanisms.massive": ("massive", "MassiveActivations"),
    "attnviz.api.speech": ("align", "WordTimings", "AlignmentHeads", "ALIGNMENT_TOLERANCE"),
    "attnviz.api.generation": ("generate", "Generation", "Decoding"),
    "attnviz.api.costs": ("cost", "Cost"),
    "attnviz.api.corpora": ("corpus", "Corpus", "CorpusState", "merge"),
    "attnviz.api.gallery": ("export", "Gallery"),
    "attnviz.api.models": ("ModelSpec", "resolve_model", "conversion_pending", "model_shape", "model_kind",
                           "list_families", "DEVICES", "DTYPES"),
    "attnviz.api.session": ("load", "load_model", "Model", "Run"),
    "attnviz.data.capture": ("Capture",),
    "attnviz.data.parts": ("Parts",),
    "attnviz.metrics": ("list_metrics", "register_metric"),
    "attnviz.errors": ("AttnvizError", "AttnvizWarning"),
    "attnviz.progress": ("Reporter",),
}

# old name -> (its new name, what changed): they work, with a DeprecationWarning, until the release CHANGELOG.md
# names; the command line keeps its old spellings as hidden aliases.
RENAMED: dict[str, tuple[str, str]] = {
    "logit_attribution": ("logit_attr", "named as its command, attnviz logit-attr"),
    "retrieval_heads": ("retrieval", "named as its command, attnviz retrieval"),
    "patch_positions": ("grid_positions", "'patch' is activation patching's word; a picture has a grid of cells"),
    "PatchPositions": ("GridPositions", "'patch' is activation patching's word; a picture has a grid of cells"),
}

HOMES: dict[str, str] = {name: module for module, names in PUBLIC.items() for name in names}

__all__ = sorted(HOMES, key=str.lower)


def __getattr__(name: str):
    """A public name, imported when first used; an old name, with a DeprecationWarning naming the new one."""
    if name in RENAMED:
        new, why = RENAMED[name]
        warnings.warn(f"attnviz.{name} is now attnviz.{new} ({why}); the old name goes in a later release",
                      DeprecationWarning, stacklevel=2)
        return __getattr__(new)
    home = HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'attnviz.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
