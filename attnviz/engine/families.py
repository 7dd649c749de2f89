"""The model families attnviz is tested on, and what works for each: one registration per family.

capture  the model's own α (eager attention, output_attentions): every family whose eager attention returns
         weights, tested or not
stream   long inputs a block of query rows at a time, through attnviz's function in transformers' attention
         interface (engine/interface.py); tested per family against the full path
verify   α recomputed from the weights by a hand-written adapter (engine/scratch/adapters.py), which does
         not call the model's attention: a family names its adapter here, and nowhere else says which
         families an adapter serves

The docs' table of families (docs/models.md), the help and the tests all read FAMILIES. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnviz.errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class Family:
    name: str  # as shown
    model_types: tuple[str, ...]  # config.model_type values
    kind: str  # "encoder", "decoder" or "encoder-decoder"
    adds: str = ""  # what its attention adds to softmax(Q·Kᵀ/√d_k)·V
    stream: bool = False
    adapter: str = ""  # the class in engine/scratch/adapters.py that recomputes its α ("": none, no verify)
    sinks: bool = False  # per-head sink logits: a row's weights over the real keys sum to less than 1

    @property
    def verify(self) -> bool:
        return bool(self.adapter)


FAMILIES: tuple[Family, ...] = (
    Family("BERT (MiniLM)", ("bert",), "encoder", "", stream=True, adapter="BertAdapter"),
    Family("RoBERTa, XLM-R", ("roberta", "xlm-roberta", "camembert"), "encoder", "", stream=True,
           adapter="BertAdapter"),
    Family("ELECTRA", ("electra",), "encoder", "", stream=True, adapter="BertAdapter"),
    Family("DistilBERT", ("distilbert",), "encoder", "", stream=True, adapter="DistilBertAdapter"),
    Family("ModernBERT", ("modernbert",), "encoder", "rotary; local (sliding-window) layers between global ones",
           stream=True, adapter="ModernBertAdapter"),
    Family("GPT-2", ("gpt2",), "decoder", "fused QKV", stream=True, adapter="GPT2Adapter"),
    Family("Llama (SmolLM2)", ("llama",), "decoder", "rotary, grouped-query", stream=True, adapter="LlamaAdapter"),
    Family("Mistral", ("mistral",), "decoder", "rotary, grouped-query, sliding window", stream=True,
           adapter="LlamaAdapter"),
    Family("Qwen2", ("qwen2",), "decoder", "rotary, grouped-query, QKV bias", stream=True, adapter="LlamaAdapter"),
    Family("Qwen3", ("qwen3",), "decoder", "QK-norm", stream=True, adapter="Qwen3Adapter"),
    Family("Phi-3", ("phi3",), "decoder", "fused QKV", stream=True, adapter="Phi3Adapter"),
    Family("Gemma 2", ("gemma2",), "decoder",
           "logit soft-capping, alternating sliding window, query_pre_attn_scalar", stream=True,
           adapter="GemmaAdapter"),
    Family("Gemma 3", ("gemma3_text",), "decoder", "QK-norm, sliding window, query_pre_attn_scalar", stream=True,
           adapter="GemmaAdapter"),
    Family("SmolLM3", ("smollm3",), "decoder", "layers without rotary positions", stream=True,
           adapter="Qwen3Adapter"),
    Family("OLMo 2", ("olmo2",), "decoder", "QK-norm over the whole projection", stream=True,
           adapter="Qwen3Adapter"),
    Family("Cohere 2", ("cohere2",), "decoder", "interleaved rotary in the sliding-window layers only", stream=True,
           adapter="Cohere2Adapter"),
    Family("gpt-oss", ("gpt_oss",), "decoder", "per-head sink logits, alternating sliding window", stream=True,
           adapter="GptOssAdapter", sinks=True),
    Family("T5", ("t5",), "encoder-decoder", "relative position bias, no 1/√d_k", adapter="T5Adapter"),
    Family("BART", ("bart",), "encoder-decoder", "", adapter="BartAdapter"),
    Family("Marian", ("marian",), "encoder-decoder", "", adapter="BartAdapter"),
    Family("Whisper", ("whisper",), "encoder-decoder", "", adapter="BartAdapter"),
    Family("DINOv2", ("dinov2", "dinov2_with_registers"), "vision",
           "patches of 14 px, [CLS] (and registers), interpolated positions, layer scale", adapter="VisionAdapter"),
    Family("ViT, DeiT", ("vit", "deit"), "vision", "patches, [CLS] (DeiT: and a distillation token)",
           adapter="VisionAdapter"),
    Family("CLIP, SigLIP vision", ("clip_vision_model", "siglip_vision_model"), "vision",
           "patches; CLIP: [CLS] and a norm before the blocks; SigLIP: no [CLS]", adapter="VisionAdapter"),
)

# Decoder families attnviz has not tested: their α is causal (lower-triangular) all the same.
OTHER_DECODERS = frozenset({"gpt_neo", "gpt_neox", "gptj", "mixtral", "phi", "gemma", "opt", "bloom", "falcon",
                            "olmo", "codegen", "gemma3"})
OTHER_ENCODERS = frozenset({"albert", "deberta", "deberta-v2", "mpnet", "xlm"})

WHAT = {"stream": "streaming (long inputs a block of rows at a time)", "verify": "verify (α from the weights)"}


def family_of(model_type: str) -> Family | None:
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def has_sinks(model_type: str) -> bool:
    family = family_of(model_type)
    return bool(family and family.sinks)


def layer_window(config, layer: int) -> int:
    """The sliding window the config gives layer `layer` (0: full attention): a decoder's window w (keys w or
    more back masked), an encoder's local reach (keys more than w away; for ModernBERT local_attention / 2).
    Layers alternate where the config lists layer_types."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return 0
    if getattr(config, "model_type", "") == "qwen2" and not getattr(config, "use_sliding_window", False):
        return 0
    types = getattr(config, "layer_types", None)
    if types:
        return window if layer < len(types) and types[layer] == "sliding_attention" else 0
    return window


def layer_windows(config, n_layers: int) -> list[int] | None:
    """Per layer, layer_window; None when no layer has one."""
    windows = [layer_window(config, n) for n in range(n_layers)]
    return windows if any(windows) else None


def decoder_types() -> frozenset[str]:
    return frozenset(t for f in FAMILIES if f.kind == "decoder" for t in f.model_types) | OTHER_DECODERS


def vision_types() -> frozenset[str]:
    return frozenset(t for f in FAMILIES if f.kind == "vision" for t in f.model_types)


def encoder_types() -> frozenset[str]:
    return frozenset(t for f in FAMILIES if f.kind == "encoder" for t in f.model_types) | OTHER_ENCODERS


def support_line(model_type: str) -> str:
    """One line: what works for a model of this type."""
    family = family_of(model_type)
    if family is None:
        return (f"{model_type!r} is not among the families attnviz tests: capture works where its eager attention "
                f"returns weights; streaming and verify do not (see the list of families in the docs, docs/models.md)")
    works = ["capture"] + [w for w in ("stream", "verify") if getattr(family, w)]
    missing = [w for w in ("stream", "verify") if not getattr(family, w)]
    text = f"{family.name} ({model_type}): {', '.join(works)}"
    return text + (f"; not {' or '.join(missing)}" if missing else "")


def can(loaded, what: str) -> bool:
    """Whether `what` ('stream' or 'verify') is tested for this model's family."""
    family = family_of(loaded.model_type)
    return bool(family and getattr(family, what))


def require(loaded, what: str) -> None:
    """Refuse, in one line, what is not tested for this model's family ('stream' or 'verify')."""
    model_type = loaded.model_type
    if not can(loaded, what):
        raise UnsupportedArchitectureError(f"{WHAT[what]} is not available for {model_type!r} models: "
                                           f"{support_line(model_type)}")


def markdown_table() -> str:
    """The docs' table of families, made from FAMILIES."""
    rows = ["| family | `model_type` | kind | what its attention adds | capture | stream | verify |",
            "|---|---|---|---|---|---|---|"]
    for f in FAMILIES:
        rows.append(f"| {f.name} | {', '.join(f'`{t}`' for t in f.model_types)} | {f.kind} | {f.adds or '—'} | ✓ | "
                    f"{'✓' if f.stream else '—'} | {'✓' if f.verify else '—'} |")
    return "\n".join(rows)
