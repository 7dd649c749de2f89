"""A model writes, and its attention is kept step by step: generate."""

from __future__ import annotations

from dataclasses import dataclass, replace
import html
from typing import Any, ClassVar

from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.options import renamed
from attnviz.base.records import plain
from attnviz.base.selection import selection
from attnviz.api.capturing import capture as capture_text
from attnviz.api.models import borrows, resolve_model
from attnviz.data.capture import Capture
from attnviz.data.parts import Parts
from attnviz.engine.generation import Decoding
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import generation_steps
from attnviz.progress import Reporter
from attnviz.base.text import check_text, visible

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["generate", "Generation", "Decoding", "STOPPED"]

STOPPED = {"eos": "the model's end-of-sequence token", "max_new_tokens": "max_new_tokens",
           "max_positions": "the model's maximum positions"}


@dataclass(frozen=True)
class Generation(Result):
    """What a model wrote from `prompt`, and the attention of prompt + written tokens: `capture` (of an
    encoder-decoder model, the part asked for, default cross-attention; `whole`: all three parts).
    `capture.generated` flags the new tokens; meta holds generated_text, decoding and why it stopped. The
    report's per-step view follows `layer` and `head` (one each, or "mean"), `top` earlier tokens a step;
    `saved` where the capture was written, if it was."""

    command: ClassVar[str] = "generate"
    capture: Capture
    whole: Parts | None = None
    layer: int = -1
    head: int | str = "mean"
    top: int = 3
    saved: str | None = None

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

    def to_dict(self, layer: int | None = None, head: int | str | None = None, top: int | None = None,
                path: str | None = None) -> dict:
        """What `attnviz generate --json` prints: the text written, and per new token the earlier tokens it
        attends to most (in `layer` and `head`, by default the ones asked for)."""
        capture, meta = self.capture, self.capture.meta
        layer_index = capture.layer_index(self.layer if layer is None else layer)
        head = self.head if head is None else head
        top = self.top if top is None else top
        path = self.saved if path is None else path
        head_index = head if isinstance(head, str) else capture.head_index(head)
        return plain({"model": capture.model, "prompt": meta["prompt"], "generated_text": meta["generated_text"],
                      "decoding": meta["decoding"], "stopped": meta["stopped"], "tokens": list(capture.tokens),
                      "generated": capture.generated, "layer": layer_index, "head": head_index,
                      "steps": self.steps(layer_index, head_index, top), "capture": path})

    def save(self, path):
        """The capture of prompt + generated tokens as .npz (all three parts of an encoder-decoder model)."""
        return (self.whole or self.capture).save(path)

    def report(self, *, color: bool = False, terminal: bool = False, tty: bool = True, **style: Any) -> list:
        """The prompt and what was written (in bold green where the terminal shows colour; to a file or a pipe,
        `tty` False, with the model's own line breaks and tabs), how many tokens and why it stopped (a note on
        stderr); `terminal`: per new token, the earlier tokens it attends to most; where the capture was saved,
        or that it was not."""
        from rich.text import Text

        from attnviz.panels import PART_TITLES, head_label, short_model

        capture, meta = self.capture, self.capture.meta
        arrow = " → " if self.whole is not None else ""
        if tty:  # a terminal: every control character shown (␊ for a line break), what was written in colour
            written: Any = Text(visible(meta["prompt"]) + arrow)
            written.append(visible(meta["generated_text"]), style="bold green" if color else "")
        else:  # a file or a pipe: the text as the model wrote it, lines and tabs and all (other controls shown)
            written = Line(meta["prompt"] + arrow + meta["generated_text"], wrap=False, lines=True)
        n_new = self.new_tokens
        items: list = [written, Line(f"{n_new} new token{'s' if n_new != 1 else ''} ({meta['decoding']}); stopped "
                                     f"at {STOPPED[meta['stopped']]}.", style="dim", wrap=False, stderr=True)]
        if terminal:
            from attnviz.render.tables import generation_table

            layer = capture.layer_index(self.layer)
            head = self.head if isinstance(self.head, str) else capture.head_index(self.head)
            which = head_label(head, capture.n_heads) if isinstance(head, str) else f"head {head}"
            what = f"{PART_TITLES[capture.part]}: " if capture.part else ""
            title = (f"{short_model(capture.model)} · {what}layer {layer} · {which}: what each new token attends to "
                     f"as it is read in (its row of α)")
            items.append(generation_table(self.steps(layer, head, self.top), title, color=color))
        if self.saved is not None:
            items.append(Line(f"{self.saved}  ({capture.n_layers} layers × {capture.n_heads} heads × "
                              f"{capture.n_tokens} tokens, {n_new} generated) · see it: attnviz heatmap --from "
                              f"{self.saved} --rows generated", wrap=False))
        else:
            items.append(Line(f"the attention of this run is not kept: {arg('output', 'gen.npz')} keeps it, for "
                              f"heatmap, heads, export … --from gen.npz (--rows generated: the new tokens' rows)",
                              style="dim", stderr=True))
        return items

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(self.prompt)}<b>{html.escape(self.text)}</b></p>" + self.capture._repr_html_()


@renamed(save="output")
@borrows
@checked
def generate(text: str, *, model: Any = None, tokenizer: Any = None, sample: bool = False,
             temperature: float | None = None, top_p: float | None = None, seed: int = 0,
             max_new_tokens: int | None = None, decoding: Decoding | None = None, output: Any = None,
             layer: Any = -1, head: Any = "mean", top: int = 3, part: str | None = None, truncate: bool = True,
             device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> Generation:
    """A causal language model (or an encoder-decoder model's decoder) continues `text` with the KV cache; every
    layer's and head's attention row of every new token is kept as it is produced: greedy by default, or
    `sample`d (`temperature`, `top_p` and `seed` as the command line's flags; or all of them as one
    attnviz.Decoding); `max_new_tokens` (default 20). `part`: of an encoder-decoder model, the decoder or cross
    attention. The per-step view (`steps()`, the report) follows one `layer` and one `head` (or "mean", "max"),
    `top` earlier tokens a step (1 to 20). `output`: a path to write the capture of prompt + written tokens to
    (.npz; `save`, its old name, works with a DeprecationWarning)."""
    check_text(text)
    decoding = _decoding(decoding, sample, temperature, top_p, seed, max_new_tokens)
    save = output
    layers, heads = selection(layer, "layer", field="layer"), selection(head, "head", keywords=("mean", "max"),
                                                                         field="head")
    if not 1 <= top <= 20:
        raise UsageError(f"{arg('top')} takes 1 to 20 tokens a step; got {top}", "top")
    if save is not None:
        from attnviz.base.files import check_suffix

        check_suffix(save, (".npz",))
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
        return _finish(Generation(chosen, whole), layers, heads, top, save)
    if part is not None:
        raise InputError(f"{loaded.name} has one kind of attention (self-attention); {arg('part')} is for "
                         f"encoder-decoder models (T5, BART, Marian)", "part")
    from attnviz.engine.generation import generate_capture

    with reporter.progress("Generating", decoding.max_new_tokens, "tokens") as step:
        written = Generation(generate_capture(loaded, text, decoding, truncate=truncate, on_step=step))
    return _finish(written, layers, heads, top, save)


def _decoding(decoding: Decoding | None, sample: bool, temperature: float | None, top_p: float | None, seed: int,
              max_new_tokens: int | None) -> Decoding:
    """How to decode: the Decoding given, or one made of the keywords (not both)."""
    if decoding is not None:
        if sample or temperature is not None or top_p is not None or seed != 0:
            raise UsageError(f"give {arg('decoding')} or {arg('sample')} and its settings, not both", "decoding")
        return decoding if max_new_tokens is None else replace(decoding, max_new_tokens=max_new_tokens)
    if not sample and (temperature is not None or top_p is not None):
        raise UsageError(f"{arg('temperature')} and {arg('top_p')} choose how to sample: add {arg('sample')}",
                         "sample")
    return Decoding(max_new_tokens=20 if max_new_tokens is None else max_new_tokens, sample=sample, seed=seed,
                    temperature=1.0 if temperature is None else temperature, top_p=1.0 if top_p is None else top_p)


def _finish(written: Generation, layers, heads, top: int, save: Any) -> Generation:
    """The per-step view's one layer and one head, checked against the capture; the capture saved if asked."""
    capture = written.capture
    chosen_layers, chosen_heads = layers.indices(capture.n_layers), heads.resolve(capture.n_heads)
    if len(chosen_layers) != 1 or len(chosen_heads) != 1:
        raise UsageError("the per-step view shows one layer and one head (or the head mean)",
                         "layer" if len(chosen_layers) != 1 else "head")
    saved = None if save is None else str(written.save(save))
    return replace(written, layer=chosen_layers[0], head=chosen_heads[0], top=top, saved=saved)
