"""What a head does, tested by removing it: ablate (named heads), importance (every head alone, ranked),
detect (previous-token, duplicate-token and induction heads, then the causal test)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnviz.base.arguments import checked
from attnviz.api.models import borrows, resolve_model
from attnviz.engine.ablation import Ablation, Detection, Importance
from attnviz.errors import InputError
from attnviz.progress import Reporter
from attnviz.base.selection import head_pairs
from attnviz.base.text import check_text

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["ablate", "importance", "detect", "Ablation", "Importance", "Detection", "MAX_MEAN_TEXTS",
           "MAX_IMPORTANCE_TEXTS"]


MAX_MEAN_TEXTS = 10_000  # texts a mean ablation averages over
MAX_IMPORTANCE_TEXTS = 1_000  # texts importance runs every head's removal on


def _ablation_model(model: Any, tokenizer: Any = None, *, device: str = "auto", dtype: str = "float32"):
    """A LoadedModel with its causal-LM head where it is a decoder, and where its heads can be removed."""
    from attnviz.engine.ablation import is_causal_lm, site

    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    if loaded.seq2seq:
        raise InputError(f"{loaded.name} is an encoder-decoder model; removing heads is shown for encoder-only "
                         f"and decoder-only models")
    if loaded.causal and not is_causal_lm(loaded.model):
        raise InputError(f"{loaded.name} is a decoder without its language-model head: load it with "
                         f"attnviz.load_model(name, lm_head=True) to see the next-token distributions")
    return loaded, site(loaded.model)


def _encoded_inputs(loaded, texts: Sequence[str], truncate: bool) -> list[dict]:
    from attnviz.engine.forward import encode

    return [encode(loaded, text, truncate=truncate).inputs for text in texts]


@borrows
@checked
def ablate(text: str, *, heads: Any, model: Any = None, tokenizer: Any = None, mode: str = "zero",
           mean_over: Sequence[str] | None = None, truncate: bool = True, device: str = "auto",
           dtype: str = "float32"):
    """The model on `text` with `heads` removed ("5.11,3.0", or (layer, head) pairs) against the clean model:
    next-token distributions (a causal LM) or the sentence embedding and each token's hidden state (an
    encoder), and every later layer's Δα. `mode`: "zero", or "mean" (each head's mean output over the text's
    tokens, or over the texts `mean_over`). Returns an attnviz.Ablation."""
    from attnviz.engine.ablation import ablate as run_ablation, head_means
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory

    check_text(text)
    loaded, where = _ablation_model(model, tokenizer, device=device, dtype=dtype)
    encoded = encode(loaded, text, truncate=truncate)
    check_memory(loaded, len(encoded.tokens), copies=2.0)
    removed = head_pairs(heads, where.layers, where.heads)
    fills, source = None, "the text"
    if mode == "mean" and mean_over is not None:
        texts = [t for t in mean_over if t.strip()][:MAX_MEAN_TEXTS]
        if not texts:
            raise InputError("the texts to average each head's output over are all empty")
        fills, source = head_means(where, _encoded_inputs(loaded, texts, truncate)), f"{len(texts)} texts"
    result = run_ablation(where, encoded.inputs, removed, mode=mode, fills=fills, means_from=source)
    result.tokens, result.token_ids = list(encoded.tokens), list(encoded.token_ids)
    result.model, result.text = loaded.name, text
    return result


@borrows
@checked
def importance(texts: str | Sequence[str], *, model: Any = None, tokenizer: Any = None, mode: str = "zero",
               truncate: bool = True, device: str = "auto", dtype: str = "float32", batched: bool = True,
               reporter: Reporter | None = None):
    """Every head removed alone (batched), ranked by its effect, beside Michel et al.'s gradient estimate;
    averaged over `texts` (one text or several). Returns an attnviz.Importance."""
    from attnviz.engine.ablation import importance as run_importance
    from attnviz.engine.memory import check_memory

    given = [texts] if isinstance(texts, str) else list(texts)
    if not given:
        raise InputError("no texts to remove heads on")
    if len(given) > MAX_IMPORTANCE_TEXTS:
        raise InputError(f"{len(given):,} texts: importance takes at most {MAX_IMPORTANCE_TEXTS:,} (each runs every "
                         f"head's removal)")
    for text in given:
        check_text(text)
    loaded, where = _ablation_model(model, tokenizer, device=device, dtype=dtype)
    inputs = _encoded_inputs(loaded, given, truncate)
    check_memory(loaded, max(int(i["input_ids"].shape[1]) for i in inputs), copies=3.0)
    return run_importance(where, inputs, mode=mode, batched=batched, reporter=reporter or Reporter())


@borrows
@checked
def detect(*, model: Any = None, tokenizer: Any = None, length: int = 50, sequences: int = 4, seed: int = 0,
           draws: int = 10, mode: str = "zero", device: str = "auto", dtype: str = "float32",
           reporter: Reporter | None = None):
    """Previous-token, duplicate-token and induction heads on random token sequences repeated once, scored as
    TransformerLens's head detector does; for a causal LM, the loss on the repeats with the detected induction
    heads removed against as many random heads. Returns an attnviz.Detection."""
    from attnviz.engine.ablation import detection

    loaded, where = _ablation_model(model, tokenizer, device=device, dtype=dtype)
    if loaded.max_positions and 2 * length + 1 > loaded.max_positions:
        raise InputError(f"{loaded.name} takes at most {loaded.max_positions} positions: give a length of at most "
                         f"{(loaded.max_positions - 1) // 2}")
    return detection(loaded, where, length=length, sequences=sequences, seed=seed, draws=draws, mode=mode,
                     reporter=reporter or Reporter())
