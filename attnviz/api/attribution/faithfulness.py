"""faithfulness: which explanation to trust. Every attribution attnviz gives for one prediction (α, rollout,
attention flow, ALTI, ALTI-Logit, value zeroing, gradient × input, integrated gradients, leave-one-out) put to
the same tests: ERASER's comprehensiveness and sufficiency with their AOPC (DeYoung et al. 2020), agreement
with leave-one-out (Kendall's τ), a random baseline it must beat, and the sanity check of cascading
parameter randomisation (Adebayo et al. 2018)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np

from attnviz.api.attribution.faithfulness_corpus import (corpus_estimate, corpus_plan, corpus_result,
                                                         ESTIMATE_AFTER, FaithfulnessCorpus, summary, token_counts,
                                                         work_per_text)
from attnviz.api.attribution.faithfulness_methods import FAITHFULNESS, baseline_token, distinct_f, method_scores
from attnviz.api.attribution.faithfulness_result import (COMPLETE_WITHIN, DEFAULT_STEPS, DESCRIBE,  # noqa: F401
                                                         Faithfulness, MethodFaithfulness, RandomBaseline)
from attnviz.api.models import borrows, resolve_model
from attnviz.base.arguments import checked
from attnviz.base.text import check_text, visible
from attnviz.errors import InputError, UnsupportedArchitectureError, UsageError, arg
from attnviz.metrics.faithfulness import (BINS, sanity_layers)
from attnviz.progress import Reporter

__all__ = ["faithfulness", "Faithfulness", "FaithfulnessCorpus", "MethodFaithfulness", "RandomBaseline",
           "FAITHFULNESS_METHODS", "MAX_CORPUS_TEXTS",
           "MAX_FAITHFULNESS_TOKENS", "COMPLETENESS_TOLERANCE"]

FAITHFULNESS_METHODS = FAITHFULNESS.names()  # the registry's, in its order
CAUSAL_ONLY = tuple(m.name for m in FAITHFULNESS if m.causal_only)
MAX_FAITHFULNESS_TOKENS = 256  # leave-one-out runs the text once per token, flow a max-flow per token pair: a
                               # longer text runs without α (the long path), with the methods that need neither
DEFAULT_ORDERS = 20  # random orders, each erasing 2 × 5 texts
LONG_ORDERS = 4  # the same on a long text, where each erased text is a long forward pass
MAX_ORDERS = 10_000
MAX_SEED = 2**32 - 1  # the command line's range: a seed numpy and torch both take
MAX_CORPUS_TEXTS = 10_000  # texts measured in one call (each runs every method and every erasure)
COMPLETENESS_TOLERANCE = 0.02  # |Σ IG − (f(x) − f(baseline))| / max(|f(x) − f(baseline)|, 0.01) at 400 points
DEFAULT_SANITY = 1  # one depth: the whole model randomised (what the verdict reads); more draw the cascade
@overload
def faithfulness(text: str, *, model: Any = None, tokenizer: Any = None,
                 methods: Sequence[str] | None = None, target: str | int | None = None, orders: int | None = None,
                 steps: int = DEFAULT_STEPS, sanity: int = DEFAULT_SANITY, seed: int = 0, truncate: bool = True,
                 device: str = "auto", dtype: str = "float32", engine: str = "local", address: str | None = None,
                 workers: int = 2, reporter: Reporter | None = None) -> Faithfulness: ...


@overload
def faithfulness(text: list[str] | tuple[str, ...], *, model: Any = None, tokenizer: Any = None,
                 methods: Sequence[str] | None = None, target: str | int | None = None, orders: int | None = None,
                 steps: int = DEFAULT_STEPS, sanity: int = DEFAULT_SANITY, seed: int = 0, truncate: bool = True,
                 device: str = "auto", dtype: str = "float32", engine: str = "local", address: str | None = None,
                 workers: int = 2, reporter: Reporter | None = None) -> FaithfulnessCorpus: ...


@borrows
@checked
def faithfulness(text: str | Sequence[str], *, model: Any = None, tokenizer: Any = None,
                 methods: Sequence[str] | None = None, target: str | int | None = None, orders: int | None = None,
                 steps: int = DEFAULT_STEPS, sanity: int = DEFAULT_SANITY, seed: int = 0, truncate: bool = True,
                 device: str = "auto", dtype: str = "float32", engine: str = "local", address: str | None = None,
                 workers: int = 2, reporter: Reporter | None = None) -> Faithfulness | FaithfulnessCorpus:
    """How faithful each attribution of one prediction is (see the module). `methods`: names from
    FAITHFULNESS_METHODS (default: all that apply; alti-logit needs a causal LM); `target` (causal LM) the token
    whose probability f is, as text (" Paris") or an id, default the model's top token; `orders` random
    orders (2 to 10,000; default 20, 4 on a text of more than MAX_FAITHFULNESS_TOKENS tokens, which runs without α:
    the methods that need no α, on the model's own SDPA attention, no τ with leave-one-out); `steps` integrated
    gradients' points (1 to 1,000); `sanity` how many depths of cascading randomisation (0: none; at most the
    model's layers); `seed` for the random orders and weights.

    `text` a list of texts (a corpus, at most MAX_CORPUS_TEXTS): every text measured alike (a text that cannot
    be is skipped, with why), then per method the mean AOPC with a 95 % bootstrap interval and whether its lead
    over the next method is significant (a paired sign-flip test): a FaithfulnessCorpus. `engine` "ray" spreads
    the texts over Ray Data as attnviz corpus does (`address` a cluster to join, default a local Ray; `workers`
    actors, each loading the model named by `model`, a name or an attnviz.ModelSpec)."""
    many = not isinstance(text, str)
    if many:
        texts = [str(t) for t in text]
        if not texts:
            raise UsageError(f"{arg('text')} is an empty list: give a text, or a list of texts", "text")
        if len(texts) > MAX_CORPUS_TEXTS:
            raise UsageError(f"{arg('text')} holds {len(texts):,} texts; faithfulness measures at most "
                             f"{MAX_CORPUS_TEXTS:,} at once", "text")
    else:
        check_text(text)
        texts = [str(text)]
    asked = _methods(methods)
    if engine not in ("local", "ray"):
        raise UsageError(f"{arg('engine')} is local or ray, not {visible(str(engine))[:20]!r}", "engine")
    if engine == "ray" and not many:
        raise UsageError(f"{arg('engine', 'ray')} spreads a corpus over Ray: give a list of texts", "engine")
    if not 1 <= workers <= 4096:
        raise UsageError(f"{arg('workers')} takes 1 to 4,096 actors; got {workers}", "workers")
    if orders is not None and not 2 <= orders <= MAX_ORDERS:
        raise UsageError(f"{arg('orders')} takes 2 to {MAX_ORDERS:,} random orders; got {orders}", "orders")
    if not 1 <= steps <= 1000:
        raise UsageError(f"{arg('steps')} takes 1 to 1,000 points; got {steps}", "steps")
    if not 0 <= sanity <= 1000:
        raise UsageError(f"{arg('sanity')} takes 0 to 1,000 depths; got {sanity}", "sanity")
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"{arg('seed')} takes a whole number from 0 to 4,294,967,295; got {seed}", "seed")
    if isinstance(target, str) and not target:
        raise UsageError(f"{arg('target')} is empty: give a token of the vocabulary, e.g. ' Paris'", "target")
    if engine == "ray":
        return _on_ray(texts, model, dict(asked=asked, explicit=methods is not None, target=target, orders=orders,
                                          steps=steps, sanity=sanity, seed=seed, truncate=truncate),
                       device=device, dtype=dtype, address=address, workers=workers, reporter=reporter or Reporter())
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    loaded.require_single("faithfulness")
    from attnviz.engine.ablation.runs import is_causal_lm

    causal = is_causal_lm(loaded.model)
    if methods is None:
        asked = [m for m in asked if causal or m not in CAUSAL_ONLY]
    elif not causal and any(m in CAUSAL_ONLY for m in asked):
        raise InputError(f"alti-logit explains a causal language model's next token; {loaded.name} is an encoder",
                         "methods")
    if target is not None and not causal:
        raise InputError(f"{arg('target')} names a next token; {loaded.name} is an encoder, whose f is the cosine "
                         f"of the sentence embeddings", "target")
    reporter = reporter or Reporter()
    options: dict[str, Any] = dict(asked=asked, explicit=methods is not None, causal=causal, target=target,
                                   orders=orders, steps=steps, sanity=sanity, seed=seed, truncate=truncate)
    if not many:
        return _one(loaded, text, reporter=reporter, **options)  # type: ignore[arg-type]
    measured: list[dict] = []
    skipped: list[tuple[int, str]] = []
    scoring = [m for m in asked if FAITHFULNESS.get(m).scored and (causal or m not in CAUSAL_ONLY)]
    depths = len(sanity_layers(loaded.shape[0], sanity))
    per_text = work_per_text(scoring, depths)
    counts = token_counts(texts, loaded)
    reporter.note(corpus_plan(counts, scoring, depths, options))
    started = time.perf_counter()
    warm = started  # when the first text ended: it pays the warm-up, so the estimate reads the texts after it
    with reporter.progress(f"Measuring {len([m for m in asked if FAITHFULNESS.get(m).scored])} methods on each text",
                           len(texts) * per_text, "steps") as step:
        for number, one in enumerate(texts, 1):
            done = [0]

            def tick(n: int, done: list[int] = done) -> None:
                done[0] += n
                step(n)

            found = measure_one(loaded, number, one, {**options, "tick": tick})
            (skipped if isinstance(found, tuple) else measured).append(found)  # type: ignore[arg-type]
            step(per_text - done[0])  # a text skipped part-way still counts whole
            now = time.perf_counter()
            if number == 1:
                warm = now
            elif number == ESTIMATE_AFTER and len(texts) > ESTIMATE_AFTER:
                reporter.note(corpus_estimate(counts, number, now - started, now - warm))
    if not measured:
        raise InputError(f"none of the {len(texts):,} texts could be measured (the first: "
                         f"{skipped[0][1] if skipped else 'none'})")
    return corpus_result(measured, skipped, seed=seed)


def _on_ray(texts: list[str], model: Any, options: dict, *, device: str, dtype: str, address: str | None,
            workers: int, reporter: Reporter) -> FaithfulnessCorpus:
    """The corpus on Ray: the texts measured by actors that load their own copies of the model."""
    from attnviz.engine.corpora.ray import measure_each
    from attnviz.api.models import ModelSpec

    if model is not None and not isinstance(model, (str, ModelSpec)):
        raise UsageError(f"{arg('engine', 'ray')} loads the model in each worker: give its name (or an "
                         f"attnviz.ModelSpec), not a loaded model", "model")
    spec = model if isinstance(model, ModelSpec) else ModelSpec(model, None, device, dtype)
    measured, skipped = measure_each(texts, spec.as_kwargs(), options, measure_one, address=address,
                                       workers=workers, reporter=reporter)
    if not measured:
        raise InputError(f"none of the {len(texts):,} texts could be measured (the first: "
                         f"{skipped[0][1] if skipped else 'none'})")
    return corpus_result(measured, skipped, seed=int(options["seed"]))


def measure_one(loaded, number: int, text: str, options: dict) -> dict | tuple[int, str]:
    """One text of a corpus: its summary, or (its number, why it cannot be measured). `options` as
    faithfulness() takes them; what the model is (causal or not) is read from it here."""
    from attnviz.engine.ablation.runs import is_causal_lm

    causal = is_causal_lm(loaded.model)
    asked = options["asked"] if options["explicit"] else [m for m in options["asked"]
                                                          if causal or m not in CAUSAL_ONLY]
    try:
        if options["explicit"] and not causal and any(m in CAUSAL_ONLY for m in asked):
            raise InputError(f"alti-logit explains a causal language model's next token; {loaded.name} is an "
                             f"encoder", "methods")
        check_text(text)
        return summary(_one(loaded, text, reporter=Reporter(), **{**options, "asked": asked, "causal": causal}))
    except InputError as exc:
        return number, str(exc)


def _one(loaded, text: str, *, asked: list[str], explicit: bool, causal: bool, target: str | int | None,
         orders: int | None, steps: int, sanity: int, seed: int, truncate: bool, reporter: Reporter,
         tick: Callable[[int], None] | None = None) -> Faithfulness:
    """One text through every method asked, measured. `tick(n)`: n more steps of work_per_text done (a corpus's
    progress bar). A text of more than MAX_FAITHFULNESS_TOKENS tokens runs without α (long_methods())."""
    tick = tick or (lambda n: None)
    from attnviz.api.attribution.logits import check_spelling, target_id
    from attnviz.engine.attribution.faithfulness import drawn_bytes, Explained, Randomised
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory

    encoded = encode(loaded, text, truncate=truncate)
    T = len(encoded.tokens)
    long = T > MAX_FAITHFULNESS_TOKENS
    skipped: list[str] = []
    if long:
        asked, skipped = long_methods(asked, explicit, T)
    methods = asked if explicit else None
    if orders is None:
        orders = LONG_ORDERS if long else DEFAULT_ORDERS
    ranked_ok = ~np.asarray(encoded.special, bool)
    if causal:
        ranked_ok[T - 1] = False
    erasable = np.flatnonzero(ranked_ok)
    if len(erasable) < 2:
        raise InputError(f"faithfulness ranks and erases tokens: this text has {len(erasable)} that can be erased "
                         f"(not special{', not the last' if causal else ''}); give a longer text")
    drawn = drawn_bytes(loaded.model) if sanity else 0
    recomputed = keeping = 0
    if long:
        batch = _ig_batch(T) if "integrated-gradients" in asked else 1
        recomputed, keeping = check_lean_faithfulness(loaded, T, drawn, batch=batch)
    else:
        check_memory(loaded, T, copies=4.0, beside=drawn, beside_text="the sanity check's randomised blocks")
    wanted = target_id(loaded, target)
    reporter = reporter or Reporter()
    with reporter.status("Running the model…"):
        explained = Explained(loaded.model, encoded.inputs, causal=causal, target=wanted, lean=long,
                              recomputed=recomputed, keeping=keeping)
    explained.baseline_id = baseline_token(loaded.tokenizer, int(loaded.model.get_input_embeddings().weight.shape[0]))
    if causal and target is not None and explained.target is not None:
        check_spelling(loaded, target, explained.target, explained.logits)
    scores: dict[str, np.ndarray] = {}
    completeness = None
    scored = [name for name in asked if FAITHFULNESS.get(name).scored]
    with reporter.progress("Scoring the tokens with each method", len(scored), "methods") as step:
        for name in scored:
            try:
                scores[name], found = method_scores(name, explained, encoded.inputs, erasable, steps)
            except UnsupportedArchitectureError as exc:
                if methods is not None:
                    raise InputError(f"{name}: {exc}", "methods") from None
                skipped.append(f"{name} ({exc})")
                continue
            finally:
                step(1)
                tick(1)
            if found is not None:
                completeness = found
    from attnviz.metrics import spearman
    from attnviz.metrics.faithfulness import bin_sizes, kendall_tau, only, ranked, without

    sizes = bin_sizes(len(erasable))
    subsets: list[np.ndarray] = []
    plans: dict[str, list[np.ndarray]] = {}  # each method's top tokens, one set per bin
    for name, values in scores.items():
        order = ranked(values, erasable)
        plans[name] = [order[:k] for k in sizes]
    rng = np.random.default_rng(seed)
    random_orders = [rng.permutation(erasable) for _ in range(orders)] if "random" in asked else []
    loo_needed = bool(scores) and not long  # τ with leave-one-out: every method is compared to it
    for tops in plans.values():
        subsets += [without(T, top) for top in tops] + [only(T, erasable, top) for top in tops]
    for order in random_orders:
        subsets += [without(T, order[:k]) for k in sizes] + [only(T, erasable, order[:k]) for k in sizes]
    if loo_needed and "loo" not in scores:
        subsets += [without(T, np.array([i])) for i in erasable]
    values = distinct_f(explained, subsets, reporter)
    tick(1)
    f_of = iter(values)
    n = len(sizes)
    results: dict[str, tuple] = {}
    for name, tops in plans.items():
        comp = [float(next(f_of)) for _ in range(n)]
        suff = [float(next(f_of)) for _ in range(n)]
        results[name] = (tops, comp, suff)
    random = None
    if random_orders:
        comp_r = np.array([[next(f_of) for _ in range(n)] + [next(f_of) for _ in range(n)]
                           for _ in random_orders])  # (orders, 2n)
        drops = explained.f_full - comp_r
        c, s = drops[:, :n], drops[:, n:]
        random = RandomBaseline(orders, tuple((b, float(m), float(d)) for b, m, d in zip(BINS, c.mean(0), c.std(0))),
                                tuple((b, float(m), float(d)) for b, m, d in zip(BINS, s.mean(0), s.std(0))),
                                (float(c.mean(1).mean()), float(c.mean(1).std())),
                                (float(s.mean(1).mean()), float(s.mean(1).std())))
    loo = scores.get("loo")
    if loo is None and loo_needed:
        loo = np.zeros(T)
        loo[erasable] = explained.f_full - np.array([next(f_of) for _ in erasable])
    depths = sanity_layers(loaded.shape[0], sanity)
    sane: dict[str, list[tuple[int, float]]] = {name: [] for name in scores}
    if depths:
        with Randomised(loaded.model, seed=seed) as copy, reporter.progress(
                "Randomising the model from the top block down: every method again", len(depths) * len(scores),
                "methods") as step:
            for layer in depths:
                copy.down_to(layer)
                shaken = Explained(copy.model, encoded.inputs, causal=causal, target=explained.target, lean=long,
                                   recomputed=recomputed, keeping=keeping)
                shaken.baseline_id = explained.baseline_id
                for name in scores:
                    try:
                        again, _ = method_scores(name, shaken, encoded.inputs, erasable, steps)
                    except UnsupportedArchitectureError:
                        again = np.full(T, np.nan)
                    sane[name].append((layer, spearman(scores[name][erasable], again[erasable])))
                    step(1)
                    tick(1)
    built = []
    for name in asked:
        if name == "random" or name not in scores:
            continue
        tops, comp, suff = results[name]
        tau = kendall_tau(scores[name][erasable], loo[erasable]) if loo is not None else None
        built.append(MethodFaithfulness(
            name, scores[name],
            tuple((b, tuple(int(p) for p in sorted(top)), f) for b, top, f in zip(BINS, tops, comp)),
            tuple((b, tuple(int(p) for p in sorted(top)), f) for b, top, f in zip(BINS, tops, suff)),
            float(np.mean(explained.f_full - np.array(comp))), float(np.mean(explained.f_full - np.array(suff))),
            tau, tuple(sane[name])))
    if causal:
        target_text = loaded.tokenizer.decode([explained.target])
        quantity = f"p({visible(target_text)!r}) at the last position"
    else:
        target_text = None
        quantity = "cosine of the sentence embedding with the full text's"
    return Faithfulness(model=loaded.name, text=str(text), tokens=tuple(encoded.tokens),
                        ids=tuple(int(i) for i in encoded.inputs["input_ids"][0].tolist()), causal=causal,
                        quantity=quantity, target=target_text, target_id=explained.target, f_full=explained.f_full,
                        erasable=tuple(int(p) for p in erasable), bins=BINS, methods=tuple(built), random=random,
                        completeness=completeness, steps=steps, seed=seed, skipped=tuple(skipped), lean=long)


def long_methods(asked: list[str], explicit: bool, T: int) -> tuple[list[str], list[str]]:
    """The methods a long text (over MAX_FAITHFULNESS_TOKENS) runs, without α, and what is left out and why. Named
    methods that cannot run are refused in one line; unnamed, integrated gradients (--steps passes forward and
    backward) runs only when named."""
    cannot = [(m, FAITHFULNESS.get(m).long) for m in asked if FAITHFULNESS.get(m).long]
    runs = [m.name for m in FAITHFULNESS if not m.long]
    if explicit and cannot:
        name, why = cannot[0]
        raise InputError(f"{T:,} tokens is more than {MAX_FAITHFULNESS_TOKENS}: faithfulness runs without α, and "
                         f"{name} {why}; on a long text these run: {', '.join(runs)} (or shorten the text)",
                         "methods")
    kept = [m for m in asked if not FAITHFULNESS.get(m).long and (explicit or FAITHFULNESS.get(m).long_default)]
    skipped = []
    alpha = [m for m, why in cannot if m != "loo"]
    if alpha:
        skipped.append(f"{', '.join(alpha)} (they read every layer's α, which a text of {T:,} tokens runs "
                       f"without)")
    skipped.append(f"τ with leave-one-out (it runs the text once per token: a text of at most "
                   f"{MAX_FAITHFULNESS_TOKENS} tokens)")
    skipped += [f"{m} ({T:,} tokens forward and backward at each of --steps points: name it in --methods)"
                for m in asked if m not in kept and not FAITHFULNESS.get(m).long]
    return kept, skipped


def _ig_batch(T: int) -> int:
    from attnviz.engine.attribution.faithfulness import IG_BATCH, LEAN_TOKENS

    return max(1, min(IG_BATCH, LEAN_TOKENS // T))


def check_lean_faithfulness(loaded, T: int, drawn: int, batch: int) -> tuple[int, int]:
    """Refuse, before running, faithfulness on the long path whose holdings would not fit the budget: the stream
    entering every block, kept for the backward pass (L·T·D float32 for each of `batch` texts, with the
    embeddings and their gradient), one block's activations, and the sanity check's randomised blocks (`drawn`
    bytes). How many blocks to recompute in the backward pass, and how many of those keep their attention's
    output: as the rest of the budget allows (engine/lean.py recomputing)."""
    from attnviz.engine.attribution.faithfulness import LEAN_TOKENS
    from attnviz.engine.lean import attention_kept_bytes, block_activation_bytes, recomputing
    from attnviz.engine.memory import check_parts, memory_budget

    config = loaded.model.config
    L = loaded.shape[0]
    D = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or getattr(config, "dim", 0) or 1024)
    stream = 4 * T * D * (L + 2) * batch
    block = max(block_activation_bytes(config, T) * batch, block_activation_bytes(config, min(T, LEAN_TOKENS)))
    parts = {"the stream entering every block, kept for the backward pass": stream,
             "one block's activations": block}
    if drawn:
        parts["the sanity check's randomised blocks"] = drawn
    check_parts(loaded, parts, f"faithfulness on {T:,} tokens without α (the model's own SDPA attention)",
                "shorten the text (on this path the memory grows linearly in the tokens), or --sanity 0")
    spare = (loaded.memory_budget or memory_budget()) - sum(parts.values())
    return recomputing(L, spare, block, attention_kept_bytes(config, T) * batch)


def _methods(methods: Sequence[str] | None) -> list[str]:
    if methods is None:
        return list(FAITHFULNESS_METHODS)
    names = [str(m) for m in methods]
    unknown = [m for m in names if m not in FAITHFULNESS_METHODS]
    if unknown or not names:
        raise UsageError(f"{arg('methods')} takes names from {', '.join(FAITHFULNESS_METHODS)}; "
                         + (f"not {visible(unknown[0])[:40]!r}" if unknown else "none given"), "methods")
    return list(dict.fromkeys(names))
