"""importance: every head removed alone, ranked by its effect, beside the gradient estimate of Michel et al."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from attnviz.api.ablation.removing import ablation_model, encoded_inputs
from attnviz.api.models import borrows
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.text import check_text, shorten, visible
from attnviz.engine.ablation import ImportanceRun
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import short_model
from attnviz.progress import Reporter

__all__ = ["importance", "Importance", "MAX_IMPORTANCE_TEXTS"]

MAX_IMPORTANCE_TEXTS = 1_000  # texts importance runs every head's removal on


@dataclass
class Importance(ImportanceRun, Result):
    """Every head removed alone (the numbers: attnviz.engine's ImportanceRun), ranked by its effect (`ranked`),
    beside the gradient estimate of Michel et al. 2019, and the rank correlation of the two."""

    command: ClassVar[str] = "importance"
    model: str = ""
    batched: bool = True
    top: int = 15  # heads in the report
    first_text: str = ""
    source: str | None = None  # what the texts came from (a file), said in the figure
    ranked: list[dict] = field(default_factory=list)

    figure_name: ClassVar[str] = "attnviz_importance.png"

    @property
    def causal(self) -> bool:
        return self.kind == "causal"

    @property
    def effect_name(self) -> str:
        return "mean KL of the next-token distributions, nats" if self.causal else "‖Δê‖ of the unit sentence embedding"

    @property
    def estimate_name(self) -> str:
        return "|Δloss|" if self.causal else "‖Δê‖"

    @property
    def spearman_estimated(self) -> float:
        from attnviz.metrics import spearman

        return spearman(self.gradient, self.estimated)

    @property
    def spearman_effect(self) -> float:
        from attnviz.metrics import spearman

        return spearman(self.gradient, self.effect)

    def to_dict(self) -> dict:
        """What `attnviz importance --json` prints."""
        return {"model": self.model, "kind": self.kind, "mode": self.mode, "texts": self.texts, "tokens": self.tokens,
                "effect": self.effect_name, "clean_loss": self.clean_loss,
                "spearman_gradient_vs_estimated": self.spearman_estimated,
                "spearman_gradient_vs_effect": self.spearman_effect, "estimated": self.estimate_name,
                "batched": self.batched, "without_alpha": self.lean, "heads": self.ranked}

    def to_rows(self) -> list[dict]:
        return self.ranked

    def csv_columns(self) -> list[str]:
        return ["rank", "layer", "head", "effect", *(["delta_loss"] if self.causal else []), "gradient"]

    def report(self, **style: Any) -> list:
        from attnviz.render.tables import records_table

        columns = [("rank", "#", "d"), ("layer", "layer", "d"), ("head", "head", "d"), ("effect", "effect", ".4f")]
        if self.causal:
            columns.append(("delta_loss", "Δloss", "+.4f"))
        columns.append(("gradient", "gradient", ".4f"))
        on = f"{self.texts} texts" if self.texts > 1 else "the text"
        top = self.top
        return [records_table(self.ranked[:top], columns,
                              f"{short_model(self.model)} · every head removed alone ({self.mode}) on {on}: the "
                              f"{min(top, len(self.ranked))} with the largest effect of {len(self.ranked)}"),
                Line(f"effect: {self.effect_name}"
                     + ("; Δloss: the next-token loss with the head removed minus without" if self.causal else "")
                     + f"; gradient: {'|∂loss/∂ξ_h|' if self.causal else '‖∂ê/∂ξ_h‖'} at ξ = 1 (Michel et al. 2019), "
                       f"the first-order estimate of {self.estimate_name}.", style="dim"),
                Line(f"Spearman ρ between the gradient estimate and {self.estimate_name}: "
                     f"{self.spearman_estimated:.3f}; and the effect: {self.spearman_effect:.3f} (over "
                     f"{len(self.ranked)} heads)" if self.causal else  # an encoder: what it estimates is the effect
                     f"Spearman ρ between the gradient estimate and the effect it estimates ({self.estimate_name}): "
                     f"{self.spearman_effect:.3f} (over {len(self.ranked)} heads)"),
                *([Line(f"Ran without α: {self.tokens:,} tokens' attention weights would not fit the memory budget, "
                        f"so every run used the model's own SDPA attention, each head's removal starting from the "
                        f"clean run's kept state below its layer and the gradient's blocks recomputed in the backward "
                        f"pass as the budget needs (the same numbers).", style="dim")] if self.lean else [])]

    def figure(self, *, ax=None):
        """Both as layers × heads: each head's effect, and its gradient estimate."""
        from attnviz.panels import Page, Scale, head_grid_panel
        from attnviz.render.png import mixed_figure

        title = f"{short_model(self.model)} · every head removed alone ({self.mode})"
        panels = (head_grid_panel(self.effect, Scale(0.0, max(float(self.effect.max()), 1e-9), "effect"),
                                  title, "importance", short=f"effect: {self.effect_name}"),
                  head_grid_panel(self.gradient, Scale(0.0, max(float(self.gradient.max()), 1e-9), "gradient"),
                                  title, "importance", short="gradient estimate (Michel et al. 2019)"))
        read = (f"“{visible(shorten(self.first_text, 400))}”" if self.texts == 1 else
                f"{self.texts} texts of {visible(str(self.source))}: “{visible(shorten(self.first_text, 200))}” …")
        page = Page(panels=panels, title=title, name="attnviz_importance", subtitle=read,
                    notes=(f"Spearman ρ (gradient vs {self.estimate_name}) = {self.spearman_estimated:.3f}",))
        return mixed_figure(page, ncols=2, ax=ax)


def _ranked(run: ImportanceRun) -> list[dict]:
    records = []
    L, H = run.effect.shape
    for layer in range(L):
        for head in range(H):
            record: dict = {"layer": layer, "head": head, "effect": float(run.effect[layer, head])}
            if run.kind == "causal":
                assert run.loss is not None
                record["delta_loss"] = float(run.loss[layer, head])
            record["gradient"] = float(run.gradient[layer, head])
            records.append(record)
    ranked = sorted(records, key=lambda r: -r["effect"])
    for rank, record in enumerate(ranked, 1):
        record["rank"] = rank
    return ranked


@borrows
@checked
def importance(texts: str | Sequence[str], *, model: Any = None, tokenizer: Any = None, mode: str = "zero",
               top: int = 15, source: str | None = None, truncate: bool = True, device: str = "auto",
               dtype: str = "float32", batched: bool = True, reporter: Reporter | None = None) -> Importance:
    """Every head removed alone (batched), ranked by its effect, beside Michel et al.'s gradient estimate;
    averaged over `texts` (one text or several; `source`, what they came from, is named in the figure). `top`:
    the heads the report lists."""
    from attnviz.engine.ablation import MODES, importance as run_importance
    from attnviz.engine.memory import check_memory, fits

    if mode not in MODES:
        raise UsageError(f"{arg('mode')} is one of {', '.join(MODES)}, not {str(mode)[:20]!r}", "mode")
    if not 1 <= top <= 100_000:
        raise UsageError(f"{arg('top')} takes a whole number from 1 to 100,000; got {top}", "top")
    given = [texts] if isinstance(texts, str) else list(texts)
    if not given:
        raise InputError("no texts to remove heads on")
    if len(given) > MAX_IMPORTANCE_TEXTS:
        raise InputError(f"{len(given):,} texts: importance takes at most {MAX_IMPORTANCE_TEXTS:,} (each runs every "
                         f"head's removal)")
    for text in given:
        check_text(text)
    loaded, where = ablation_model(model, tokenizer, device=device, dtype=dtype)
    inputs = encoded_inputs(loaded, given, truncate)
    T = max(int(i["input_ids"].shape[1]) for i in inputs)
    plan = None
    if not fits(loaded, T, copies=3.0):  # α would not fit: the long path, every removal without it
        plan = lean_plan(loaded, T, where)
        if not batched:  # --loop: each head's removal a whole run of its own, as on the full path
            from dataclasses import replace

            plan = replace(plan, every=where.layers, copies=1)
        where.lean = True
    else:
        check_memory(loaded, T, copies=3.0)
    run = run_importance(where, inputs, mode=mode, batched=batched, reporter=reporter or Reporter(), plan=plan)
    return Importance(**{f.name: getattr(run, f.name) for f in fields(run)}, model=loaded.name, batched=batched,
                      top=top, first_text=given[0], source=source, ranked=_ranked(run))


def lean_plan(loaded: Any, T: int, where: Any) -> Any:
    """How importance runs on the long path within the budget (engine/ablation/ranking_lean.LeanPlan), refused
    before running where even its least would not fit: the clean run's final states and a copy's (2·T·D float32),
    one block's activations, a causal LM's next-token distributions of a block of positions (six (positions, V)
    float64 tensors) and the stream entering every block, kept for the gradient's backward pass (L·T·D). The
    rest of the budget keeps the clean run's block outputs (each T·D: the layers below a head then run once),
    then runs more heads at once, and (the gradient pass) keeps blocks' activations instead of recomputing."""
    from attnviz.engine.ablation import ATTENTION_BYTES, is_causal_lm
    from attnviz.engine.ablation.removing import distribution_positions
    from attnviz.engine.ablation.ranking_lean import kept_blocks, LeanPlan
    from attnviz.engine.lean import attention_kept_bytes, block_activation_bytes, recomputing
    from attnviz.engine.memory import check_parts, memory_budget

    config = loaded.model.config
    L, H = where.layers, where.heads
    D = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or getattr(config, "dim", 0) or 1024)
    state = 4 * T * D
    block = block_activation_bytes(config, T)
    parts = {"the clean run's final states and a copy's": 2 * state, "one block's activations": block}
    if is_causal_lm(where.model):
        V = int(loaded.model.get_output_embeddings().weight.shape[0])
        parts["a block of positions' next-token distributions"] = 6 * 8 * V * min(T, distribution_positions(V))
        parts["the stream entering every block, kept for the gradient's backward pass"] = state * (L + 2)
    check_parts(loaded, parts, f"every head removed alone on {T:,} tokens without α (the model's own SDPA "
                               f"attention)", "shorten the text (on this path the memory grows linearly in the tokens)")
    budget = loaded.memory_budget or memory_budget()
    spare = budget - sum(parts.values())
    every = next((k for k in range(1, L + 1) if len(kept_blocks(L, k)) * state <= spare), L)
    spare -= len(kept_blocks(L, every)) * state
    copies = 1 + max(0, min(H - 1, ATTENTION_BYTES // block - 1, spare // (block + 3 * state)))
    recomputed, keeping = recomputing(L, budget - sum(parts.values()), block, attention_kept_bytes(config, T))
    return LeanPlan(every=every, copies=copies, recomputed=recomputed, keeping=keeping)

