"""A causal language model's output layer (lm_head), loaded when an analysis first needs next-token logits: a
decoder loaded without it (transformers' AutoModel) gets it around the very same blocks, never a second copy of
them. A model is causal or not by what it is (is_decoder), never by whether its head was loaded (has_head)."""

from __future__ import annotations

from pathlib import Path

from attnviz.engine.models import CAUSAL_MODEL_TYPES, LoadedModel, first_line, resolve_model
from attnviz.errors import InputError, ModelLoadError


def is_decoder(model) -> bool:
    """A decoder-only model by what it is (its config), whether or not its language-model head was loaded."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return False
    return bool(getattr(config, "is_decoder", False)) or str(getattr(config, "model_type", "")) in CAUSAL_MODEL_TYPES


def has_head(model) -> bool:
    """The model object carries an output layer (a causal LM's lm_head: its outputs are next-token logits)."""
    heads = getattr(model, "get_output_embeddings", None)
    try:
        return callable(heads) and heads() is not None
    except (AttributeError, NotImplementedError, TypeError):
        return False


def attach_head(loaded: LoadedModel) -> None:
    """Give a decoder loaded without its language-model head (transformers' AutoModel: what load() gives by
    default, and load_model() from Python) its head, in place, the first time an analysis needs next-token
    logits: the family's ForCausalLM class is built on the meta device around the loaded model itself (never a
    second copy of its blocks) and only the output layer is made: the input embeddings where the model ties
    them (SmolLM2, Gemma, GPT-2), else lm_head's weights read from the model's own safetensors files. A model
    object handed in whose head is not tied and was not handed in is refused: its head cannot be known."""
    import torch
    from transformers import AutoModelForCausalLM

    base = loaded.model
    if has_head(base) or not is_decoder(base):
        return
    config = base.config
    refuse = (f"{loaded.name} is a causal language model loaded without its output layer (lm_head), which this "
              f"reads")
    try:
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(config, attn_implementation=getattr(config, "_attn_implementation",
                                                                                       None) or "eager")
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise InputError(f"{refuse}, and transformers has no causal-LM head for it ({first_line(exc)}): load it "
                         f"with attnviz.load_model(name, lm_head=True)") from None
    prefix = getattr(lm, "base_model_prefix", "")
    inner = getattr(lm, prefix, None) if prefix else None
    if inner is None or type(inner) is not type(base):
        raise InputError(f"{refuse}; attnviz cannot fit a head around it: load it with "
                         f"attnviz.load_model(name, lm_head=True)")
    setattr(lm, prefix, base)  # the loaded blocks themselves: nothing copied
    lm.config = config
    head = lm.get_output_embeddings()
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    embedding = base.get_input_embeddings().weight
    own = {f"{name}": value for name, value in lm.named_parameters() if not name.startswith(prefix + ".")}
    if getattr(text_config, "tie_word_embeddings", False) and set(own) <= {"lm_head.weight"} and \
            head.weight.shape == embedding.shape:
        head.weight = embedding
    else:
        found = _checkpoint_tensors(loaded, list(own))
        if found is None:
            raise InputError(f"{refuse}, and its weights are not where attnviz can read them: "
                             + ("load it with attnviz.load_model(name, lm_head=True)" if loaded.source else
                                "hand in the model with its head (AutoModelForCausalLM), as it was trained"))
        modules = dict(lm.named_modules())
        for name, tensor in found.items():
            owner, _, leaf = name.rpartition(".")
            setattr(modules[owner], leaf, torch.nn.Parameter(tensor.to(embedding.device, embedding.dtype),
                                                             requires_grad=embedding.requires_grad))
    left = [n for n, t in list(lm.named_parameters()) + list(lm.named_buffers()) if t.is_meta]
    if left:
        raise InputError(f"{refuse}, and its head holds more than attnviz can fill ({left[0]}): load it with "
                         f"attnviz.load_model(name, lm_head=True)")
    lm.train(base.training)
    loaded.model = lm


def _checkpoint_tensors(loaded: LoadedModel, names: list[str]) -> dict | None:
    """The tensors `names` of a model loaded by name, read from its folder's safetensors files (None: a model
    handed in, a folder without them, or a name missing)."""
    if not loaded.source or not names:
        return None
    try:
        source, _ = resolve_model(loaded.source)
    except ModelLoadError:
        return None
    folder = Path(source)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    found: dict = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in set(names) & set(handle.keys()):
                found[name] = handle.get_tensor(name)
    return found if set(found) == set(names) else None
