"""A model writes, and its attention is kept step by step: generate."""

from __future__ import annotations

from dataclasses import dataclass, replace
import html
from typing import Any

from attnviz.base.arguments import checked
from attnviz.api.capturing import capture as capture_text
from attnviz.api.models import borrows, resolve_model
from attnviz.data.capture import Capture
from attnviz.data.parts import Parts
from attnviz.engine.generation import Decoding
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import generation_steps
from attnviz.progress import Reporter
from attnviz.base.text import check_text

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["generate", "Generation", "Decoding"]


@dataclass(frozen=True)
class Generation:
    """What a model wrote from `prompt`, and the attention of prompt + written tokens: `capture` (of an
    encoder-decoder model, the part asked for, default cross-attention; `whole`: all three parts).
    `capture.generated` flags the new tokens; meta holds generated_text, decoding and why it stopped."""

    capture: Capture
    whole: Parts | None = None

    @property
    def prompt(self) -> str:
        return self.capture.meta["prompt"]

    @property
    def text(self) -> str:
        """The generated text."""
        return self.capture.meta["generated_text"]

    @property
    def new_tokens(self) -> int:
        """How many tokens the model wrote."""
        generated = self.capture.generated
        return int(generated.sum()) if generated is not None else 0

    @property
    def stopped(self) -> str:
        """"eos", "max_new_tokens" or "max_positions"."""
        return self.capture.meta["stopped"]

    def steps(self, layer: int = -1, head: int | str = "mean", top: int = 3) -> list[dict]:
        """Per new token: the `top` earlier tokens its row of α (this layer and head) weighs most."""

        capture = self.capture
        return generation_steps(capture, capture.layer_index(layer), head if isinstance(head, str)
                                else capture.head_index(head), top)

    def to_dict(self, layer: int = -1, head: int | str = "mean", top: int = 3, path: str | None = None) -> dict:
        """What `attnviz generate --json` prints (`path`: where the capture was saved)."""
        capture, meta = self.capture, self.capture.meta
        layer_index = capture.layer_index(layer)
        head_index = head if isinstance(head, str) else capture.head_index(head)
        return {"model": capture.model, "prompt": meta["prompt"], "generated_text": meta["generated_text"],
                "decoding": meta["decoding"], "stopped": meta["stopped"], "tokens": list(capture.tokens),
                "generated": capture.generated, "layer": layer_index, "head": head_index,
                "steps": self.steps(layer_index, head_index, top), "capture": path}

    def save(self, path):
        """The capture of prompt + generated tokens as .npz (all three parts of an encoder-decoder model)."""
        return (self.whole or self.capture).save(path)

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(self.prompt)}<b>{html.escape(self.text)}</b></p>" + self.capture._repr_html_()


@borrows
@checked
def generate(text: str, *, model: Any = None, tokenizer: Any = None, decoding: Decoding | None = None,
             max_new_tokens: int | None = None, part: str | None = None, truncate: bool = True, device: str = "auto",
             dtype: str = "float32", reporter: Reporter | None = None) -> Generation:
    """A causal language model (or an encoder-decoder model's decoder) continues `text` with the KV cache; every
    layer's and head's attention row of every new token is kept as it is produced. `decoding`: greedy by
    default, or an attnviz.Decoding(sample=True, temperature=…, top_p=…, seed=…); `max_new_tokens` (default
    20) when no decoding is given. `part`: of an encoder-decoder model, the decoder or cross attention."""
    check_text(text)
    decoding = decoding or Decoding(max_new_tokens=20 if max_new_tokens is None else max_new_tokens)
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head=True)
    reporter = reporter or Reporter()
    if loaded.seq2seq:  # the decoder writes; the per-step view follows `part` (default: cross-attention)
        if part == "encoder":
            raise UsageError("the encoder reads the source and writes nothing: the per-step view is of the decoder "
                             "or cross-attention", "part")
        whole = capture_text(text, model=loaded, decoding=decoding, truncate=truncate, reporter=reporter)
        assert isinstance(whole, Parts)  # an encoder-decoder model without `part`: all three
        chosen = whole.part(part or "cross")
        chosen = replace(chosen, meta={**chosen.meta, "prompt": text,
                                       "generated_text": chosen.meta.get("target_text", "")})
        return Generation(chosen, whole)
    if part is not None:
        raise InputError(f"{loaded.name} has one kind of attention (self-attention); {arg('part')} is for "
                         f"encoder-decoder models (T5, BART, Marian)", "part")
    from attnviz.engine.generation import generate_capture

    with reporter.progress("Generating", decoding.max_new_tokens, "tokens") as step:
        return Generation(generate_capture(loaded, text, decoding, truncate=truncate, on_step=step))
