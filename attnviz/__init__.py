"""attnviz: see what a transformer's self-attention does, from the command line and from Python.

Data flows one way, and the packages show it:

    cli/, serve/   parse what was asked, call ONE api function, hand its result to one emitter
    api/           attnviz.<command>(...) -> a typed result that owns its output (to_dict, rows, report, figure)
    engine/        the torch side, the only one that imports torch and transformers
    metrics/, panels/, render/, data/, corpora/   numpy: statistics, what a picture shows, how it is drawn, the
                   Capture and its file format
    base/          what every layer uses: argument checks, files, records, selections, plain text

Importing attnviz imports nothing heavy: the public names (attnviz.api.PUBLIC, one table) load on first use.

    import attnviz
    cap = attnviz.capture("The cat sat on the mat")     # the bundled MiniLM
    attnviz.heatmap(cap, layer=0, head=2).figure()      # a matplotlib figure
    cap                                                  # in a notebook: the interactive viewer
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz._version import __version__
from attnviz.api import RENAMED as _RENAMED, __all__ as _PUBLIC, __getattr__ as _public
from attnviz.api import notebook as _notebook  # noqa: F401 (registers the views every Capture shows; no numpy)

__all__ = [*_PUBLIC, "__version__"]

if TYPE_CHECKING:  # what a type checker sees: each public name from its home (kept equal to attnviz.api.PUBLIC
    # by tests/package/test_front_door.py); at run time they load on first use (__getattr__ below)
    from attnviz import analyses as analyses
    from attnviz.api.capturing import (capture as capture, capture_audio as capture_audio,
                                       capture_image as capture_image, from_outputs as from_outputs, Keep as Keep,
                                       load_capture as load_capture, picture as picture, Picture as Picture,
                                       sound as sound, Sound as Sound, to_words as to_words)
    from attnviz.api.views import (heatmap as heatmap, Heatmap as Heatmap, token as token,
                                   TokenAttention as TokenAttention, compare as compare, Comparison as Comparison,
                                   view as view, View as View)
    from attnviz.api.stats import (heads as heads, HeadTable as HeadTable, entropy as entropy, Entropy as Entropy,
                                   rollout as rollout, Rollout as Rollout, explain as explain, Glossary as Glossary)
    from attnviz.api.scratch.verify import (verify as verify, Verification as Verification, TOLERANCE as TOLERANCE)
    from attnviz.api.scratch.steps import (steps as steps, Steps as Steps)
    from attnviz.api.scratch.positions import (positions as positions, Positions as Positions,
                                               grid_positions as grid_positions, GridPositions as GridPositions,
                                               POSITION_TOLERANCE as POSITION_TOLERANCE)
    from attnviz.api.scratch.scaling import (scaling as scaling, Scaling as Scaling)
    from attnviz.api.values import (norms as norms, Norms as Norms, sinks as sinks, Sinks as Sinks,
                                    sink_rate as sink_rate, SinkRate as SinkRate)
    from attnviz.api.attribution.contributions import (contributions as contributions, Contributions as Contributions)
    from attnviz.api.attribution.lens import lens as lens, Lens as Lens, LENS_TOLERANCE as LENS_TOLERANCE
    from attnviz.api.attribution.why import why as why, Why as Why, WHY_TOLERANCE as WHY_TOLERANCE
    from attnviz.api.attribution.logits import (logit_attr as logit_attr, LogitAttribution as LogitAttribution,
                                                HeadEffect as HeadEffect, LOGIT_TOLERANCE as LOGIT_TOLERANCE)
    from attnviz.api.attribution.faithfulness import (faithfulness as faithfulness, Faithfulness as Faithfulness,
                                                      FaithfulnessCorpus as FaithfulnessCorpus,
                                                      MethodFaithfulness as MethodFaithfulness,
                                                      RandomBaseline as RandomBaseline,
                                                      FAITHFULNESS_METHODS as FAITHFULNESS_METHODS)
    from attnviz.api.ablation.removing import (ablate as ablate, Ablation as Ablation,
                                               MAX_MEAN_TEXTS as MAX_MEAN_TEXTS)
    from attnviz.api.ablation.ranking import (importance as importance, Importance as Importance,
                                              MAX_IMPORTANCE_TEXTS as MAX_IMPORTANCE_TEXTS)
    from attnviz.api.ablation.detectors import (detect as detect, Detection as Detection)
    from attnviz.api.patching.activation import (patch as patch, Patching as Patching,
                                                 PATCH_TOLERANCE as PATCH_TOLERANCE)
    from attnviz.api.patching.paths import (path_patch as path_patch, PathPatching as PathPatching)
    from attnviz.api.patching.discovery import (discover as discover, Discovery as Discovery)
    from attnviz.api.mechanisms.circuits import (circuits as circuits, Circuits as Circuits)
    from attnviz.api.mechanisms.retrieval import (retrieval as retrieval, RetrievalHeads as RetrievalHeads)
    from attnviz.api.mechanisms.massive import (massive as massive, MassiveActivations as MassiveActivations)
    from attnviz.api.speech import (align as align, WordTimings as WordTimings, AlignmentHeads as AlignmentHeads,
                                    ALIGNMENT_TOLERANCE as ALIGNMENT_TOLERANCE)
    from attnviz.api.generation import (generate as generate, Generation as Generation, Decoding as Decoding)
    from attnviz.api.costs import (cost as cost, Cost as Cost)
    from attnviz.api.corpora import (corpus as corpus, Corpus as Corpus, CorpusState as CorpusState, merge as merge)
    from attnviz.api.gallery import (export as export, Gallery as Gallery)
    from attnviz.api.models import (ModelSpec as ModelSpec, resolve_model as resolve_model,
                                    conversion_pending as conversion_pending, model_shape as model_shape,
                                    model_kind as model_kind, list_families as list_families, DEVICES as DEVICES,
                                    DTYPES as DTYPES)
    from attnviz.api.session import (load as load, load_model as load_model, Model as Model, Run as Run)
    from attnviz.data.capture import (Capture as Capture)
    from attnviz.data.parts import (Parts as Parts)
    from attnviz.metrics import (list_metrics as list_metrics, register_metric as register_metric)
    from attnviz.errors import (AttnvizError as AttnvizError, AttnvizWarning as AttnvizWarning)
    from attnviz.progress import (Reporter as Reporter)


def __getattr__(name: str):
    """The public names, imported when first used (PEP 562), so `import attnviz` and the CLI start fast; an old
    name works with a DeprecationWarning."""
    if name in _RENAMED:
        import warnings

        new, why = _RENAMED[name]
        warnings.warn(f"attnviz.{name} is now attnviz.{new} ({why}); the old name goes in a later release",
                      DeprecationWarning, stacklevel=2)
        return _public(new)
    if name == "analyses":  # the registry of analyses (attnviz.analyses.available()), light to import
        import importlib

        return importlib.import_module("attnviz.analyses")
    if name not in _PUBLIC:
        raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
    value = _public(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
