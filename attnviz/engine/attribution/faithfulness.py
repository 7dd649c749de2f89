"""The torch side of faithfulness: the quantity an explanation explains, f, on any subset of a text's tokens
(erasure by deleting ids from the input, ERASER's way), batched; every method's per-token scores from one
model; and the model randomised from the top block down (Adebayo et al. 2018's cascading randomisation), its
matrices swapped for drawn ones and back, for the sanity check.

    f, causal LM   the probability of the target token at the position whose next token is explained (the
                   last one, never erased)
    f, encoder     the cosine between the sentence embedding (the mean over the tokens, as sentence-transformers
                   pools these models) of the erased text and of the full text
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from attnviz.engine.ablation.runs import last_logits, run_model
from attnviz.engine.lean import model_blocks
from attnviz.engine.scratch.adapters import adapter_for

ERASE_BATCH = 16  # erased texts per forward pass
IG_BATCH = 16  # integrated gradients' interpolation steps per forward pass
FLOW_ROWS = 16  # an encoder's flow is the mean over at most this many query rows, spread evenly
LEAN_TOKENS = 8192  # the long path: tokens per forward pass (erased texts of one length batched, or IG's points)
ROW_BLOCK = 256  # the long path: query rows of the last layer's α made at once for the attention method


class Explained:
    """One text and one model: f on any kept subset of positions, batched. `ids` (T,) the text's ids, `extra`
    the other inputs the model takes per token (token_type_ids), `target` the token explained (causal).

    `lean`: the long path (engine/lean.py): no α is asked for (`alpha` None), every pass runs on the model's own
    SDPA attention, erased texts are batched only with texts of their own length (no padding, so no mask of
    T² is made) and at most LEAN_TOKENS tokens at once, and the gradient methods' backward pass recomputes the
    first `recomputed` blocks, the first `keeping` of them keeping their attention's output."""

    def __init__(self, model, inputs: dict, *, causal: bool, target: int | None, lean: bool = False,
                 recomputed: int = 0, keeping: int = 0) -> None:
        self.model = model
        self.causal = causal
        self.lean = lean
        self.recomputed = recomputed
        self.keeping = keeping
        self.ids = inputs["input_ids"][0]
        self.device = self.ids.device
        self.types = inputs.get("token_type_ids")
        self.baseline_id: int | None = None  # integrated gradients' baseline token (gradient_scores)
        self.T = int(self.ids.shape[0])
        self.target: int | None
        self.reference: torch.Tensor | None
        read = last_logits(model) if lean and causal else {}
        self.last_rows: np.ndarray | None = None  # the long path: the last layer's α at rows(), mean over heads
        with self.passing(), torch.inference_mode(), self._last_rows():
            out = run_model(model, {"input_ids": self.ids[None], "attention_mask": torch.ones_like(self.ids)[None],
                                    **self._types(1, self.T), **read}, attentions=not lean)
        self.alpha: np.ndarray | None = None if lean else \
            np.stack([a[0].float().cpu().numpy() for a in out.attentions])  # (L, H, T, T)
        if causal:
            logits = out.logits[0, -1].double()
            self.logits = logits.cpu().numpy()
            self.target = int(logits.argmax()) if target is None else int(target)
            self.reference = None
            self.f_full = float(torch.softmax(logits, -1)[self.target])
        else:
            hidden = _hidden(out)[0].double()  # (T, D)
            pooled = hidden.mean(0)
            self.reference = pooled / pooled.norm().clamp_min(1e-12)
            self.target = None
            self.f_full = 1.0

    def _last_rows(self) -> contextlib.AbstractContextManager:
        """On the long path, what the attention method reads of α, made as the pass reaches the last layer: its
        weights at rows() (the explained position of a causal LM; every row of an encoder, a block of
        ROW_BLOCK rows at a time), the mean over heads and rows, (T,) — recomputed from the layer's own Q and K
        (as logit attribution's long path does), never a T × T matrix per head. None where the family adds a
        positional bias to its scores."""
        if not self.lean:
            return contextlib.nullcontext()
        from attnviz.engine.hooks import recording_inputs
        from attnviz.engine.scratch.adapters import layer_qkv
        from attnviz.engine.scratch.formula import attention_mask, attention_weights

        base = getattr(self.model, "base_model", self.model)
        adapter = adapter_for(base)
        modules = adapter.modules(base)
        last = len(modules) - 1
        rows = torch.as_tensor(self.rows())

        def on_seen(n: int, seen) -> None:
            if n != last:
                return
            qkv = layer_qkv(adapter, modules[n], seen, n, base.config)
            if qkv.bias is not None:
                return
            total = torch.zeros(self.T, dtype=torch.float64)
            for start in range(0, len(rows), ROW_BLOCK):
                some = rows[start:start + ROW_BLOCK]
                mask = attention_mask(torch.ones(1, self.T, dtype=torch.long), causal=adapter.causal,
                                      window=qkv.window, reach=qkv.reach, rows=some).to(qkv.q.device)
                alpha = attention_weights(qkv.q[:1, :, some].double(), qkv.k[:1].double(), mask, scale=qkv.scale,
                                          softcap=qkv.softcap, sinks=None if qkv.sinks is None else qkv.sinks.double())
                total += alpha[0].mean(0).sum(0).cpu()  # (T,): the mean over heads, summed over these rows
            self.last_rows = (total / len(rows)).numpy()

        return recording_inputs(modules[-1:], lambda n, seen: on_seen(last, seen))

    def passing(self, grad: bool = False) -> contextlib.AbstractContextManager:
        """How the model runs: as loaded, or on the long path (with `grad`, its first `recomputed` blocks
        recomputed in the backward pass, the first `keeping` of them keeping their attention's output)."""
        if not self.lean:
            return contextlib.nullcontext()
        from attnviz.engine.lean import lean

        blocks = list(model_blocks(self.model))[:self.recomputed] if grad else []
        return lean(self.model, blocks, grad=grad, keeping=self.keeping)

    def _batches(self, kept: Sequence[np.ndarray]) -> Iterator[list[int]]:
        """Which subsets run together: ERASE_BATCH at a time; on the long path only subsets of one length (no
        padding), at most LEAN_TOKENS tokens in all (one subset alone where it is longer)."""
        start = 0
        while start < len(kept):
            if not self.lean:
                yield list(range(start, min(len(kept), start + ERASE_BATCH)))
                start += ERASE_BATCH
                continue
            width = len(kept[start])
            end = start + 1
            while end < len(kept) and len(kept[end]) == width and (end - start + 1) * width <= LEAN_TOKENS:
                end += 1
            yield list(range(start, end))
            start = end

    def _types(self, B: int, T: int) -> dict:
        return {} if self.types is None else {"token_type_ids": torch.zeros(B, T, dtype=torch.long,
                                                                            device=self.device)}

    def f(self, kept: Sequence[np.ndarray], on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """f of the text with only the positions `kept` (each sorted ascending), one value per subset, in
        batches of ERASE_BATCH padded on the right (the attention mask hides the padding)."""
        values = np.empty(len(kept))
        with self.passing():
            for batch in self._batches(kept):
                values[batch] = self._f([np.asarray(kept[i], np.int64) for i in batch])
                if on_batch is not None:
                    on_batch(len(batch))
        return values

    def _f(self, chunk: list[np.ndarray]) -> np.ndarray:
        """f of one batch of kept subsets."""
        lengths = [len(k) for k in chunk]
        width = max(lengths)
        ids = torch.zeros(len(chunk), width, dtype=torch.long, device=self.device)
        mask = torch.zeros(len(chunk), width, dtype=torch.long, device=self.device)
        for b, k in enumerate(chunk):
            ids[b, :len(k)] = self.ids[torch.as_tensor(k, device=self.device)]
            mask[b, :len(k)] = 1
        last = torch.as_tensor(lengths, device=self.device) - 1
        keep = torch.unique(last)  # the rows f reads: the logits of no other position are made (a large vocabulary)
        read = last_logits(self.model, keep) if self.causal else {}
        with torch.inference_mode():
            out = run_model(self.model, {"input_ids": ids, "attention_mask": mask,
                                         **self._types(len(chunk), width), **read})
        if self.causal:
            where = torch.searchsorted(keep, last) if read else last
            logits = out.logits[torch.arange(len(chunk), device=self.device), where].double()  # (B, V)
            return torch.softmax(logits, -1)[:, self.target].cpu().numpy()
        hidden = _hidden(out).double() * mask[..., None]  # (B, T', D), padding zeroed
        pooled = hidden.sum(1) / mask.sum(1, keepdim=True)
        pooled = pooled / pooled.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        assert self.reference is not None
        return (pooled @ self.reference).cpu().numpy()

    def rows(self) -> np.ndarray:
        """The query rows whose attention explains f: the explained position (causal), else every row."""
        return np.array([self.T - 1]) if self.causal else np.arange(self.T)

    def embedding_f(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """f as a function of the input embeddings (B, T, D) -> (B,), for the gradient methods."""
        model, causal, target, reference = self.model, self.causal, self.target, self.reference

        def forward(embeds: torch.Tensor) -> torch.Tensor:
            B, T = embeds.shape[:2]
            kwargs = {"inputs_embeds": embeds, "attention_mask": torch.ones(B, T, dtype=torch.long,
                                                                             device=embeds.device),
                      **self._types(B, T)}
            out = model(**kwargs, use_cache=False, **last_logits(model)) if causal else model(**kwargs)
            if causal:
                return torch.softmax(out.logits[:, -1].float(), -1)[:, target]
            pooled = _hidden(out).float().mean(1)
            pooled = pooled / pooled.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            assert reference is not None
            return pooled @ reference.float()

        return forward


def _hidden(out) -> torch.Tensor:
    hidden = getattr(out, "last_hidden_state", None)
    return out.hidden_states[-1] if hidden is None else hidden


def gradient_scores(explained: Explained, method: str, erasable: np.ndarray, *, steps: int,
                    baseline_id: int | None = None) -> tuple[np.ndarray, float | None, float | None]:
    """Per-token scores (T,) of "grad-x-input" (Captum's InputXGradient) or "integrated-gradients" (Captum's
    IntegratedGradients, Gauss-Legendre, `steps` points) on the input embeddings, each token's attribution
    summed over the embedding's dimensions. The baseline: at every erasable position the embedding of the
    token `baseline_id` (the tokenizer's padding token, as Captum's text tutorials take it; None: the zero
    vector), the token's own embedding elsewhere (special tokens and the explained position are never
    credited). Not zero where there is a token to take: under RMSNorm f(a·x) hardly moves until a is near 0,
    so a path from zero puts nearly all of the integral in its first steps, where no quadrature sees it. For
    integrated gradients also (Σ attributions, f(x) − f(baseline)): completeness says they are equal."""
    from captum.attr import InputXGradient, IntegratedGradients

    model = explained.model
    embeds = model.get_input_embeddings()(explained.ids[None]).detach()  # (1, T, D)
    forward = explained.embedding_f()
    batch = max(1, min(IG_BATCH, LEAN_TOKENS // explained.T)) if explained.lean else IG_BATCH
    with torch.enable_grad(), explained.passing(grad=True):
        if method == "grad-x-input":
            attributions = InputXGradient(forward).attribute(embeds.clone().requires_grad_(True))
            total = gap = None
        else:
            baseline = embeds.clone()
            at = torch.as_tensor(erasable, device=embeds.device)
            if baseline_id is None:
                baseline[:, at] = 0.0
            else:
                filler = model.get_input_embeddings()(torch.tensor([baseline_id], device=embeds.device))
                baseline[:, at] = filler.detach().to(baseline.dtype)
            attributions = IntegratedGradients(forward).attribute(
                embeds, baselines=baseline, n_steps=steps, method="gausslegendre", internal_batch_size=batch)
            with torch.no_grad():
                gap = float(forward(embeds)[0] - forward(baseline)[0])
            total = float(attributions.double().sum())
    return attributions[0].double().sum(-1).detach().cpu().numpy(), total, gap


def alti_layers(model, inputs: dict) -> np.ndarray:
    """ALTI's per-layer contributions (L, T, T), rows summing to 1."""
    from attnviz.engine.attribution.alti import alti

    return alti(model, inputs)[0].astype(np.float64)


def zeroing_layers(model, inputs: dict) -> np.ndarray:
    """Value zeroing's per-layer contributions (L, T, T), rows summing to 1."""
    from attnviz.engine.attribution.zeroing import value_zeroing

    base = getattr(model, "base_model", model)
    return value_zeroing(model, inputs, adapter_for(base).modules(base))[0]


def alti_logit_scores(model, inputs: dict, target: int) -> np.ndarray | None:
    """ALTI-Logit per input token (T,): every head's direct effect on the target's logit at the last position,
    traced back to the input tokens (Ferrando et al. 2023), summed over the heads; None where ALTI does not
    split this family's blocks."""
    from attnviz.engine.attribution.alti import alti_logit
    from attnviz.engine.attribution.logits import logit_parts

    T = int(inputs["input_ids"].shape[1])
    parts, _ = logit_parts(model, inputs, position=T - 1, target=target)
    traced, _ = alti_logit(model, inputs, parts.by_source)
    return None if traced is None else traced.sum(axis=(0, 1))


class Randomised:
    """`model` with its blocks randomised from the top one down, one more at each `down_to(l)` (cascading): every
    weight matrix of a block drawn afresh from N(0, σ²), σ the config's initializer_range (0.02 where it has
    none), the norms and biases kept. No copy of the model is made: each matrix is swapped for its drawn one
    (the original set aside, not copied) and every one is swapped back by `give_back()` — a `with` block does
    it, on an error or Ctrl-C too. What it adds is the drawn matrices: `drawn_bytes(model, layer)`."""

    def __init__(self, model, seed: int = 0) -> None:
        self.model = model
        self.blocks = model_blocks(model)
        self.sigma = float(getattr(self.model.config, "initializer_range", 0.02) or 0.02)
        self.generator = torch.Generator().manual_seed(seed)
        self.lowest = len(self.blocks)
        self.originals: list[tuple[torch.nn.Parameter, torch.Tensor]] = []

    def __enter__(self) -> Randomised:
        return self

    def __exit__(self, *exc) -> None:
        self.give_back()

    def down_to(self, layer: int) -> None:
        with torch.no_grad():
            for n in range(self.lowest - 1, layer - 1, -1):
                for parameter in self.blocks[n].parameters():
                    if parameter.ndim >= 2:
                        drawn = torch.randn(parameter.shape, generator=self.generator) * self.sigma
                        self.originals.append((parameter, parameter.data))
                        parameter.data = drawn.to(device=parameter.device, dtype=parameter.dtype)
        self.lowest = min(self.lowest, layer)

    def give_back(self) -> None:
        """Every matrix swapped back, the last drawn first (a matrix shared by two blocks gets its own back)."""
        while self.originals:
            parameter, original = self.originals.pop()
            parameter.data = original
        self.lowest = len(self.blocks)


def drawn_bytes(model, layer: int = 0) -> int:
    """What randomising the blocks from `layer` up adds: their weight matrices, drawn afresh."""
    blocks = model_blocks(model)
    seen: set[int] = set()
    total = 0
    for block in blocks[layer:]:
        for parameter in block.parameters():
            if parameter.ndim >= 2 and id(parameter) not in seen:
                seen.add(id(parameter))
                total += parameter.numel() * parameter.element_size()
    return total
