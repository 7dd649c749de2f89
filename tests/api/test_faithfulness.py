"""attnviz faithfulness: every reported f is a fresh forward pass on the kept ids; erasing nothing gives f_full;
attention flow against its definition; integrated gradients' completeness; the random baseline against its
expectation; Kendall's τ against SciPy; the sanity check's randomised copy leaves the model handed in as it
was; and every refusal in one line."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch
from helpers import one_line_error, run

import attnviz
from attnviz.api.attribution.faithfulness import COMPLETENESS_TOLERANCE
from attnviz.metrics.faithfulness import (attention_flow, bin_sizes, kendall_tau, only, ranked, residual_attention,
                                          without)

TEXT = "the cat sat on the mat because it was tired"
F_TOLERANCE = 1e-5  # a padded batch against one text alone, float32 through a few layers: rounding, ~1e-7 each


@pytest.fixture(scope="module")
def gpt2(tiny_lm_dir):
    return attnviz.load_model(tiny_lm_dir("gpt2"), device="cpu", lm_head=True)


@pytest.fixture(scope="module")
def bert(tiny_model_dir):
    return attnviz.load_model(tiny_model_dir("bert"), device="cpu")


def fresh_f(model, result, kept) -> float:
    """f of the text with only `kept`, from one forward pass of those ids alone (no batch, no padding)."""
    ids = torch.tensor([[result.ids[p] for p in kept]])
    with torch.inference_mode():
        out = model.model(input_ids=ids, attention_mask=torch.ones_like(ids))
    if result.causal:
        return float(torch.softmax(out.logits[0, -1].double(), -1)[result.target_id])
    full = torch.tensor([list(result.ids)])
    with torch.inference_mode():
        whole = model.model(input_ids=full, attention_mask=torch.ones_like(full)).last_hidden_state[0].double()
    a, b = out.last_hidden_state[0].double().mean(0), whole.mean(0)
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("which", ["gpt2", "bert"])
def test_every_reported_f_is_a_fresh_forward_pass_on_the_kept_ids(which, request):
    model = request.getfixturevalue(which)
    result = attnviz.faithfulness(TEXT, model=model, sanity=0, orders=20)
    T = len(result.tokens)
    erasable = np.array(result.erasable)
    assert result.f_full == pytest.approx(fresh_f(model, result, range(T)), abs=F_TOLERANCE)
    assert all(not s for s in np.array(attnviz.capture(TEXT, model=model).special)[erasable])
    if result.causal:
        assert T - 1 not in result.erasable
    checked = 0
    for m in result.methods:
        sizes = bin_sizes(len(erasable))
        order = ranked(m.scores, erasable)
        for (_fraction, erased, f), k in zip(m.comprehensiveness, sizes):
            assert sorted(erased) == sorted(order[:k].tolist()) and len(erased) == k
            assert f == pytest.approx(fresh_f(model, result, without(T, np.array(erased))), abs=F_TOLERANCE)
            checked += 1
        for (_fraction, kept, f), k in zip(m.sufficiency, sizes):
            assert sorted(kept) == sorted(order[:k].tolist())
            assert f == pytest.approx(fresh_f(model, result, only(T, erasable, np.array(kept))), abs=F_TOLERANCE)
            checked += 1
        aopc = np.mean([result.f_full - f for _, _, f in m.comprehensiveness])
        assert m.comprehensiveness_aopc == pytest.approx(aopc, abs=1e-12)
    assert checked >= 80
    loo = result.method("loo").scores
    for p in erasable[:4]:
        assert loo[p] == pytest.approx(result.f_full - fresh_f(model, result, without(T, np.array([p]))),
                                       abs=F_TOLERANCE)


def test_erasing_nothing_gives_f_full(gpt2, bert):
    from attnviz.engine.attribution.faithfulness import Explained
    from attnviz.engine.forward import encode

    for model in (gpt2, bert):
        encoded = encode(model, TEXT)
        causal = model is gpt2
        explained = Explained(model.model, encoded.inputs, causal=causal, target=None)
        T = explained.T
        again = explained.f([np.arange(T), np.arange(T)[1:], np.arange(T)])
        assert again[0] == again[2] and abs(again[0] - explained.f_full) < F_TOLERANCE
        assert abs(again[1] - explained.f_full) > 1e-4  # a token erased does change f: the check can fail


def test_flow_on_one_layer_is_the_normalised_attention_row_and_never_exceeds_what_enters():
    rng = np.random.default_rng(0)
    alpha = rng.random((1, 3, 6, 6))
    alpha /= alpha.sum(-1, keepdims=True)
    layers = residual_attention(alpha)
    assert np.allclose(layers.sum(-1), 1)
    for row in range(6):
        assert np.allclose(attention_flow(layers, np.array([row])), layers[0, row], atol=1e-9)
    assert np.allclose(attention_flow(layers, np.arange(6)), layers[0].mean(0), atol=1e-9)
    # two layers: the flow into each input token is at most the rollout's best path bound and sums to 1
    alpha2 = rng.random((2, 2, 5, 5))
    alpha2 /= alpha2.sum(-1, keepdims=True)
    two = residual_attention(alpha2)
    flow = attention_flow(two, np.array([4]))
    assert flow.sum() == pytest.approx(1.0) and (flow >= 0).all()
    cut = np.minimum(two[1, 4][:, None], two[0]).sum(0)  # max flow ≤ Σ_k min(edge above, edge below)... per sink
    raw = np.array([__import__("networkx").maximum_flow_value(_graph(two), (2, 4), (0, j)) for j in range(5)])
    assert np.all(raw <= cut + 1e-12) and np.allclose(flow, raw / raw.sum())


def _graph(layers):
    import networkx as nx

    graph = nx.DiGraph()
    L, T, _ = layers.shape
    for n in range(L):
        for i in range(T):
            for j in range(T):
                graph.add_edge((n + 1, i), (n, j), capacity=float(layers[n, i, j]))
    return graph


@pytest.mark.parametrize("L, T, causal, seed", [(2, 5, False, 0), (3, 9, True, 1), (4, 12, False, 2),
                                                (6, 16, True, 3), (5, 14, False, 4)])
def test_max_flow_on_the_layered_dag_equals_networkx_within_its_rounding(L, T, causal, seed):
    """Each token's maximum flow, solved on the layered DAG with capacities floored to multiples of 2⁻³⁰, is at
    most networkx's float max-flow on the graph as Abnar & Zuidema build it, and below it by less than the
    edges of a cut × 2⁻³⁰ (bounded here by every edge); dense and causal (zeros above the diagonal) graphs,
    from every row. The normalised flows then agree within T times that."""
    import networkx as nx

    from attnviz.metrics.faithfulness import FLOW_SCALE, max_flows

    rng = np.random.default_rng(seed)
    alpha = rng.random((L, 2, T, T)) ** 8  # uneven rows: cuts inside the graph, not only at its ends
    if causal:
        alpha = np.tril(alpha)
    alpha /= alpha.sum(-1, keepdims=True)
    layers = residual_attention(alpha)
    graph = nx.DiGraph()
    for n in range(L):
        for i in range(T):
            for j in np.flatnonzero(layers[n, i] > 0):
                graph.add_edge((n + 1, i), (n, int(j)), capacity=float(layers[n, i, j]))
    bound = L * T * T / FLOW_SCALE + 1e-12
    inner = False  # some flow cut inside the graph, not by what the row emits (1) or what its token takes in
    for row in range(T):
        ours = max_flows(layers, row)
        theirs = np.array([nx.maximum_flow_value(graph, (L, row), (0, j)) if graph.has_node((0, j)) else 0.0
                           for j in range(T)])
        assert np.all(ours <= theirs + 1e-12) and np.all(theirs - ours < bound), (row, np.abs(ours - theirs).max())
        assert np.allclose(attention_flow(layers, np.array([row])), theirs / theirs.sum(), atol=2 * T * bound)
        inner |= bool(np.any(theirs < np.minimum(1.0, layers[0].sum(0)) - 1e-6))
    assert inner


def test_flow_of_a_one_layer_model_is_its_attention_row(tmp_path):
    from helpers import build_tiny_model

    folder = build_tiny_model("gpt2", tmp_path / "one", lm=True, init=0.3)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_layer": 1}))
    model = attnviz.load_model(str(folder), device="cpu", lm_head=True)
    result = attnviz.faithfulness(TEXT, model=model, methods=["flow", "rollout"], sanity=0)
    alpha = attnviz.capture(TEXT, model=model).attentions  # (1, H, T, T)
    expected = residual_attention(alpha)[0, -1]
    assert np.allclose(result.method("flow").scores, expected, atol=1e-6)
    assert np.allclose(result.method("rollout").scores, expected, atol=1e-6)


@pytest.fixture(scope="module")
def llama(tiny_lm_dir):
    return attnviz.load_model(tiny_lm_dir("llama"), device="cpu", lm_head=True)


@pytest.mark.parametrize("which", ["gpt2", "bert", "llama"])
def test_integrated_gradients_are_complete_within_the_quadratures_error(which, request):
    """Σ attributions = f(x) − f(baseline) up to the quadrature's error, which is estimated as Gauss-Legendre's
    is, by the change when the points are doubled; and it shrinks with more points."""
    pytest.importorskip("captum", reason='integrated gradients need Captum: pip install "attnviz[trust]"')
    from attnviz.engine.attribution.faithfulness import Explained, gradient_scores
    from attnviz.engine.forward import encode

    model = request.getfixturevalue(which)
    result = attnviz.faithfulness(TEXT, model=model, methods=["integrated-gradients"], sanity=0, steps=50)
    total, gap = result.completeness
    assert abs(gap) > 1e-3  # the baseline is far from the input: completeness says something
    scores = result.method("integrated-gradients").scores
    assert scores.sum() == pytest.approx(total, rel=1e-9)
    assert np.all(scores[[i for i in range(len(scores)) if i not in result.erasable]] == 0)  # baseline = input
    encoded = encode(model, TEXT)
    explained = Explained(model.model, encoded.inputs, causal=result.causal, target=result.target_id)
    erasable = np.array(result.erasable)
    from attnviz.api.attribution.faithfulness_methods import baseline_token

    base = baseline_token(model.tokenizer)
    totals = {n: gradient_scores(explained, "integrated-gradients", erasable, steps=n, baseline_id=base)[1]
              for n in (50, 100, 400)}
    assert totals[50] == pytest.approx(total, abs=1e-6)
    estimate = abs(totals[50] - totals[100])  # the error of 50 points, as the doubled rule measures it
    assert abs(totals[50] - gap) <= 2 * estimate + 1e-5, (totals, gap)
    assert abs(totals[400] - gap) <= abs(totals[50] - gap) + 1e-6
    assert abs(totals[400] - gap) <= COMPLETENESS_TOLERANCE * max(abs(gap), 0.01), (totals, gap)


def test_the_random_baseline_matches_its_expectation_where_f_ignores_which_tokens_go(bert):
    """A text of one word repeated: deleting any k of its copies leaves the same ids, so every order gives the
    same f, the random mean is exactly f_full − f(T − k copies) per bin and its sd 0."""
    text = " ".join(["cat"] * 12)
    result = attnviz.faithfulness(text, model=bert, methods=["loo", "random"], sanity=0, orders=25)
    T, erasable = len(result.tokens), np.array(result.erasable)
    for (_fraction, mean, sd), k in zip(result.random.comprehensiveness, bin_sizes(len(erasable))):
        expected = result.f_full - fresh_f(bert, result, without(T, erasable[:k]))
        assert mean == pytest.approx(expected, abs=F_TOLERANCE) and sd < F_TOLERANCE
    for (_fraction, mean, sd), k in zip(result.random.sufficiency, bin_sizes(len(erasable))):
        expected = result.f_full - fresh_f(bert, result, only(T, erasable, erasable[-k:]))
        assert mean == pytest.approx(expected, abs=F_TOLERANCE) and sd < F_TOLERANCE
    assert result.random.orders == 25


def test_kendall_tau_b_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for n in (2, 5, 17, 40):
        x, y = rng.integers(0, 4, n).astype(float), rng.normal(size=n)
        y[: n // 3] = 0.5
        expected = stats.kendalltau(x, y).statistic
        got = kendall_tau(x, y)
        assert (np.isnan(got) and np.isnan(expected)) or got == pytest.approx(expected, abs=1e-12)
    assert np.isnan(kendall_tau(np.ones(5), np.arange(5.0)))


def test_bins_and_order():
    assert bin_sizes(10) == [1, 1, 1, 2, 5] and bin_sizes(3) == [1, 1, 1, 1, 2] and bin_sizes(200)[0] == 2
    assert ranked(np.array([0.0, 0.5, 0.5, 0.9, 0.1]), np.array([1, 2, 3, 4])).tolist() == [3, 1, 2, 4]
    assert without(5, np.array([1, 3])).tolist() == [0, 2, 4]
    assert only(6, np.array([1, 2, 3, 4]), np.array([3])).tolist() == [0, 3, 5]


def test_the_sanity_check_randomises_from_the_top_down_and_gives_the_model_back(gpt2):
    """Cascading: the top block's matrices drawn first, then every block's; norms and biases kept. No copy of the
    model: the matrices are swapped for drawn ones and swapped back on leaving, so the model is given back
    bit for bit (the same tensors), its modes, flags and gradients as they were."""
    from attnviz.engine.attribution.faithfulness import drawn_bytes, Randomised

    before = {k: v.clone() for k, v in gpt2.model.state_dict().items()}
    storage = {k: p.data_ptr() for k, p in gpt2.model.named_parameters()}
    grads = {k: p.requires_grad for k, p in gpt2.model.named_parameters()}
    blocks = gpt2.model.transformer.h
    L = len(blocks)

    def changed() -> set[int]:
        return {n for n in range(L) if any(not torch.equal(p, before[f"transformer.h.{n}.{k}"])
                                           for k, p in blocks[n].named_parameters())}

    with Randomised(gpt2.model, seed=0) as copy:
        copy.down_to(L - 1)
        assert changed() == {L - 1}
        copy.down_to(0)
        assert changed() == set(range(L))
        kept = {k for k, p in blocks[0].named_parameters() if torch.equal(p, before[f"transformer.h.0.{k}"])}
        assert kept and all(blocks[0].get_parameter(k).ndim == 1 for k in kept)  # norms and biases
    assert changed() == set() and all(p.data_ptr() == storage[k] for k, p in gpt2.model.named_parameters())
    assert drawn_bytes(gpt2.model) == sum(p.numel() * 4 for b in blocks for p in b.parameters() if p.ndim >= 2)
    gpt2.model.train()
    result = attnviz.faithfulness(TEXT, model=gpt2, methods=["attention", "integrated-gradients", "loo"], sanity=2)
    assert gpt2.model.training  # the mode given back
    gpt2.model.eval()
    assert all(torch.equal(before[k], v) for k, v in gpt2.model.state_dict().items())
    assert {k: p.requires_grad for k, p in gpt2.model.named_parameters()} == grads
    assert all(p.grad is None for p in gpt2.model.parameters())
    for m in result.methods:
        assert [n for n, _ in m.sanity] == [L - 1, 0]
    assert result.method("loo").kendall_tau_loo == pytest.approx(1.0)


def test_the_memory_check_counts_the_sanity_check_s_drawn_blocks(gpt2):
    """The sanity check adds its drawn matrices to what the run holds (it once deep-copied the whole model, in
    no estimate: Qwen2.5-Coder-0.5B peaked at 5.4 GB with --sanity 1 against 2.45 GB without): a budget a byte
    under α's copies plus the drawn blocks refuses --sanity 1, naming them, and runs --sanity 0."""
    from attnviz.engine.attribution.faithfulness import drawn_bytes
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import attention_bytes

    T = len(encode(gpt2, TEXT).tokens)
    drawn = drawn_bytes(gpt2.model)
    old_budget = gpt2.memory_budget
    gpt2.memory_budget = attention_bytes(gpt2, T, 4.0) + drawn - 1
    try:
        with pytest.raises(attnviz.AttnvizError, match=r"for the sanity check's randomised blocks"):
            attnviz.faithfulness(TEXT, model=gpt2, methods=["attention"], sanity=1)
        assert attnviz.faithfulness(TEXT, model=gpt2, methods=["attention"], sanity=0).methods
        gpt2.memory_budget += 1
        assert attnviz.faithfulness(TEXT, model=gpt2, methods=["attention"], sanity=1).methods
    finally:
        gpt2.memory_budget = old_budget


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_sanity_check_stopped_midway_gives_every_weight_back(gpt2, monkeypatch, stop):
    """Ctrl-C (or an error) while the randomised model is measured: every matrix swapped back before it
    propagates, the model bit for bit as it was."""
    import attnviz.api.attribution.faithfulness_methods as methods_module

    before = {k: v.clone() for k, v in gpt2.model.state_dict().items()}
    real, calls = methods_module.method_scores, []

    def stopping(name, explained, *args, **kwargs):
        calls.append(name)
        if len(calls) == 3:  # the second method on the randomised model
            raise stop("stopped")
        return real(name, explained, *args, **kwargs)

    monkeypatch.setattr(methods_module, "method_scores", stopping)
    import attnviz.api.attribution.faithfulness as api_module

    monkeypatch.setattr(api_module, "method_scores", stopping, raising=False)
    with pytest.raises((stop, attnviz.AttnvizError)):
        attnviz.faithfulness(TEXT, model=gpt2, methods=["attention", "loo"], sanity=1)
    assert len(calls) == 3
    assert all(torch.equal(before[k], v) for k, v in gpt2.model.state_dict().items())


def test_the_json_holds_what_a_script_needs(gpt2):
    result = attnviz.faithfulness(TEXT, model=gpt2, methods=["attention", "random"], sanity=1, orders=20)
    data = json.loads(json.dumps(result.to_dict()))
    for key in ("ids", "tokens", "target", "target_id", "f_full", "erasable", "methods"):
        assert key in data
    assert len(data["ids"]) == len(data["tokens"]) == len(data["methods"]["attention"]["scores"])
    m = data["methods"]["attention"]
    assert {"aopc", "bins"} <= set(m["comprehensiveness"]) and {"erased", "fraction", "f"} <= \
        set(m["comprehensiveness"]["bins"][0])
    assert "kept" in m["sufficiency"]["bins"][0] and m["sanity"][0]["randomised_from_layer"] == 0
    assert {"aopc", "sd", "bins"} <= set(data["methods"]["random"]["comprehensiveness"])
    assert data["target"] == gpt2.tokenizer.decode([data["target_id"]])


def test_a_target_names_the_token_whose_probability_f_is(gpt2):
    top = attnviz.faithfulness(TEXT, model=gpt2, methods=["attention"], sanity=0, orders=20)
    other = (top.target_id + 7) % len(gpt2.tokenizer)
    chosen = attnviz.faithfulness(TEXT, model=gpt2, methods=["attention"], sanity=0, target=other)
    assert chosen.target_id == other and chosen.f_full < top.f_full


def test_without_captum_the_gradient_methods_are_skipped_or_refused_in_one_line(gpt2, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "captum" else real(name, *a))
    result = attnviz.faithfulness(TEXT, model=gpt2, sanity=0)
    assert "grad-x-input" not in [m.name for m in result.methods] and "attention" in [m.name for m in result.methods]
    assert any("attnviz[trust]" in s for s in result.skipped) and len(result.skipped) == 2
    with pytest.raises(attnviz.AttnvizError, match=r"integrated-gradients needs Captum: pip install"):
        attnviz.faithfulness(TEXT, model=gpt2, methods=["integrated-gradients"], sanity=0)


def test_refusals_are_one_line(gpt2, bert, tiny_lm_dir, tiny_model_dir, tiny_seq2seq_dir):
    for methods in (["bogus"], [], ["attention", "nope"]):
        with pytest.raises(attnviz.AttnvizError, match="attention, rollout, flow"):
            attnviz.faithfulness(TEXT, model=gpt2, methods=methods)
    with pytest.raises(attnviz.AttnvizError, match="can be erased"):
        attnviz.faithfulness("cat", model=bert)
    with pytest.raises(attnviz.AttnvizError, match="encoder"):
        attnviz.faithfulness(TEXT, model=bert, methods=["alti-logit"])
    with pytest.raises(attnviz.AttnvizError, match="encoder"):
        attnviz.faithfulness(TEXT, model=bert, target=" cat")
    line = one_line_error(run("faithfulness", TEXT, "-m", tiny_lm_dir("gpt2"), "--methods", "attention,bogus"), 2)
    assert "--methods" in line and "loo" in line and "bogus" in line
    assert "encoder-decoder" in one_line_error(run("faithfulness", TEXT, "-m", tiny_seq2seq_dir("t5")))
    assert "2 to 10,000" in one_line_error(run("faithfulness", TEXT, "--orders", "1"), 2)
    with pytest.raises(attnviz.AttnvizError, match="takes a string or a list; got Picture"):
        attnviz.faithfulness(attnviz.picture(__import__("helpers").photo()), model=gpt2)
    assert "--image" in one_line_error(run("faithfulness", "--image", "x.png", "-m", tiny_lm_dir("gpt2")), 2)


@pytest.mark.slow
def test_the_command_reads_text_stdin_and_a_file_alike(tiny_lm_dir, tmp_path):
    model = tiny_lm_dir("gpt2")
    args = ["--methods", "attention,loo,random", "--sanity", "0", "--json", "-m", model]
    path = tmp_path / "t.txt"
    path.write_text(TEXT + "\n", encoding="utf-8")
    outputs = [json.loads(run("faithfulness", TEXT, *args).stdout),
               json.loads(run("faithfulness", "-", *args, input=TEXT + "\n").stdout),
               json.loads(run("faithfulness", "--text-file", path, *args).stdout)]
    assert outputs[0] == outputs[1] == outputs[2]
    shown = run("faithfulness", TEXT, "--methods", "attention,loo,random", "--sanity", "0", "-m", model,
                "-o", tmp_path / "f.png")
    assert shown.exit_code == 0, shown.output
    T, erasable = len(outputs[0]["tokens"]), len(outputs[0]["erasable"])
    assert f"{erasable} of {T} tokens ranked" in shown.stdout and (tmp_path / "f.png").stat().st_size > 10_000


def test_explain_defines_every_method_and_measure():
    from attnviz.api.attribution.faithfulness import FAITHFULNESS_METHODS
    from attnviz.metrics.terms import lookup

    for term in (*FAITHFULNESS_METHODS, "faithfulness", "comprehensiveness", "sufficiency", "AOPC", "Kendall's τ",
                 "sanity check", "f"):
        assert lookup(term), term


CORPUS = [TEXT, "a dog ran across the park to find its ball", "hi", "birds sing in the morning when the sun rises"]


def test_a_corpus_is_every_text_measured_alike_then_gathered(gpt2):
    """The corpus means are the means of each text measured alone; a text that cannot be measured is skipped
    with why; every lead's p-value is the paired test's on the texts' differences."""
    from attnviz.metrics.faithfulness import paired_sign_flip

    methods = ["attention", "rollout", "loo", "random"]
    result = attnviz.faithfulness(CORPUS, model=gpt2, methods=methods, sanity=1, seed=2)
    alone = [attnviz.faithfulness(t, model=gpt2, methods=methods, sanity=1, seed=2) for t in CORPUS if t != "hi"]
    assert result.texts == 3 and [n for n, _ in result.skipped] == [3] and "can be erased" in result.skipped[0][1]
    diffs = {}
    for m in result.methods:
        comp = np.array([a.method(m.name).comprehensiveness_aopc for a in alone])
        suff = np.array([a.method(m.name).sufficiency_aopc for a in alone])
        diffs[m.name] = comp - suff
        assert m.comprehensiveness[0] == pytest.approx(comp.mean(), abs=1e-12)
        assert m.sufficiency[0] == pytest.approx(suff.mean(), abs=1e-12)
        assert np.isnan(m.comprehensiveness[1]) and np.isnan(m.sufficiency[2])  # 3 texts: no interval
        assert m.kendall_tau_loo == pytest.approx(np.mean([a.method(m.name).kendall_tau_loo for a in alone]))
    names = [m.name for m in result.methods]
    assert sorted(names) == sorted(methods[:3])
    assert [diffs[n].mean() for n in names] == sorted((diffs[n].mean() for n in names), reverse=True)
    for first, second in zip(result.methods, result.methods[1:]):
        gaps = diffs[first.name] - diffs[second.name]
        assert first.lead == pytest.approx(gaps.mean()) and first.p_value == paired_sign_flip(gaps, seed=2)
    assert result.methods[-1].lead is None
    data = result.to_dict()
    assert data["texts"] == 3 and len(data["per_text"]) == 3 and data["skipped"][0]["text"] == 3
    assert all(m["comprehensiveness"]["ci95"] is None for m in data["methods"].values())
    assert data["verdict"].startswith("no verdict: with 3 texts") and "0.25" in data["verdict"]
    assert data["trusted"] == [] and "at least 6 texts" in data["verdict"]
    json.dumps(data, allow_nan=False)  # plain JSON: no NaN where there is no interval
    with pytest.raises(attnviz.AttnvizError, match="could be measured"):
        attnviz.faithfulness(["hi", "yo"], model=gpt2, methods=methods, sanity=0)
    with pytest.raises(attnviz.AttnvizError, match="empty list"):
        attnviz.faithfulness([], model=gpt2)


def test_the_paired_test_and_the_interval():
    from attnviz.metrics.faithfulness import bootstrap_interval, paired_sign_flip

    d = np.array([0.3, 0.1, 0.2, -0.05, 0.4])
    flips = [abs(np.mean(d * np.array([1 - 2 * ((k >> i) & 1) for i in range(5)]))) for k in range(32)]
    assert paired_sign_flip(d) == pytest.approx(np.mean(np.array(flips) >= abs(d.mean()) - 1e-12))
    assert paired_sign_flip(np.zeros(4)) == 1.0 and paired_sign_flip(np.full(30, 0.2)) < 0.001
    big = np.random.default_rng(0).normal(0.0, 1.0, 40)
    assert paired_sign_flip(big, seed=1) > 0.05 or abs(big.mean()) > 0.3
    low, high = bootstrap_interval(np.arange(100.0), seed=0)
    assert low < 49.5 < high and high - low == pytest.approx(2 * 1.96 * np.std(np.arange(100.0)) / 10, rel=0.15)


@pytest.mark.slow
def test_the_command_reads_a_corpus_file_or_standard_input(tiny_lm_dir, tmp_path):
    model = tiny_lm_dir("gpt2")
    path = tmp_path / "c.txt"
    path.write_text("\n".join(CORPUS) + "\n\n", encoding="utf-8")
    args = ["--methods", "attention,loo,random", "--sanity", "0", "--json", "-m", model]
    by_file = run("faithfulness", "--corpus", path, *args)
    by_stdin = run("faithfulness", "--corpus", "-", *args, input="\n".join(CORPUS) + "\n\n")
    assert by_file.exit_code == 0, by_file.output
    assert json.loads(by_file.stdout) == json.loads(by_stdin.stdout)
    assert json.loads(by_file.stdout)["texts"] == 3 and "1 line of" in by_file.stderr
    assert "not both" in one_line_error(run("faithfulness", TEXT, "--corpus", path, "-m", model), 2)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    assert "holds no text" in one_line_error(run("faithfulness", "--corpus", empty, "-m", model))
    assert "folder" in one_line_error(run("faithfulness", "--corpus", tmp_path, "-m", model))
    shown = run("faithfulness", "--corpus", path, "--methods", "attention,loo,random", "--sanity", "0", "-m", model,
                "-o", tmp_path / "c.png")
    assert shown.exit_code == 0 and "3 texts measured, 1 skipped" in " ".join(shown.stdout.split())
    assert (tmp_path / "c.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.ray
def test_a_corpus_on_ray_is_the_same_as_here(tiny_lm_dir, tmp_path):
    """--engine ray: the texts spread over a local Ray's actors (each loading the model) give exactly what this
    process gives, skipped texts included; a loaded model cannot travel to the workers."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip('Ray Data is not installed (pip install "attnviz[ray]"); .ci/run installs it')
    model = tiny_lm_dir("gpt2")
    path = tmp_path / "c.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    args = ["--corpus", path, "--methods", "attention,loo,random", "--sanity", "1", "--json", "-m", model]
    on_ray = run("faithfulness", *args, "--engine", "ray", "--workers", "2")
    here = run("faithfulness", *args)
    assert on_ray.exit_code == 0, on_ray.output
    assert json.loads(on_ray.stdout) == json.loads(here.stdout)
    assert json.loads(on_ray.stdout)["skipped"][0]["text"] == 3
    with pytest.raises(attnviz.AttnvizError, match="not a loaded model"):
        attnviz.faithfulness(CORPUS, model=attnviz.load_model(model, device="cpu"), engine="ray")


def test_the_report_warns_where_integrated_gradients_are_not_complete(gpt2):
    import dataclasses

    from attnviz.api.result import Line

    result = attnviz.faithfulness(TEXT, model=gpt2, methods=["integrated-gradients"], sanity=0)

    def said(r) -> str:
        return " ".join(item.text for item in r.report() if isinstance(item, Line))

    assert result.complete and "not complete" not in said(result)
    broken = dataclasses.replace(result, completeness=(0.5, 0.3))
    assert broken.complete is False and "not complete: off by 0.2000" in said(broken)
    assert broken.to_dict()["integrated_gradients_completeness"]["complete"] is False


def test_the_corpus_table_fits_80_columns_with_every_mark():
    """At 80 columns no cell is cut: the longest method name whole, a significant lead's star shown."""
    from rich.console import Console

    from attnviz.api.attribution.faithfulness_corpus import CorpusMethod, FaithfulnessCorpus

    first = CorpusMethod("integrated-gradients", (0.366, 0.35, 0.39), (0.328, 0.31, 0.35), (0.04, 0.03, 0.05), 0.69,
                         -0.02, 0.4, 0.026, 0.009)  # a significant lead: the verdict line and the table both say it
    last = CorpusMethod("value-zeroing", (0.17, 0.15, 0.19), (0.588, 0.55, 0.62), (0.0, -0.1, 0.1), -0.03, 0.0, 0.05)
    result = FaithfulnessCorpus("m", "q", 102, (first, last), (), (), (0.1, 0.5), 0)
    console = Console(width=80, record=True, file=__import__("io").StringIO())
    for item in result.report():
        console.print(item)
    shown = console.export_text()
    assert "integrated-gradients" in shown and "+0.026*" in shown and "0.366±.02" in shown
    assert max(len(line.rstrip()) for line in shown.splitlines()) <= 80
    assert "trust: integrated-gradients (" in " ".join(shown.split())


@pytest.mark.slow
def test_an_endless_corpus_on_standard_input_stops_at_its_limit_in_one_line():
    """`cat /dev/zero | attnviz faithfulness --corpus -`: one endless line, read a block at a time and refused
    at MAX_CORPUS_BYTES, before any model loads."""
    from helpers import run_bounded

    with open("/dev/zero", "rb") as zero:
        done = run_bounded("faithfulness", "--corpus", "-", "-m", "/nonexistent/model", stdin=zero, timeout=120)
    assert done.returncode == 1 and "more than 64 MiB" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _method(name, comp, suff, rho=None):
    from attnviz.api.attribution.faithfulness import MethodFaithfulness

    sanity = () if rho is None else ((0, rho),)
    return MethodFaithfulness(name, np.zeros(4), (), (), comp, suff, 0.5, sanity)


def _result(methods, random=(0.2, 0.05, 0.6, 0.05)):
    from attnviz.api.attribution.faithfulness import Faithfulness, RandomBaseline

    baseline = None if random is None else RandomBaseline(20, (), (), random[:2], random[2:])
    return Faithfulness(model="m", text="t", tokens=("a",) * 4, ids=(1,) * 4, causal=False, quantity="q",
                        target=None, target_id=None, f_full=1.0, erasable=(0, 1, 2, 3), bins=(0.5,),
                        methods=tuple(methods), random=baseline)


def test_the_verdict_trusts_what_beats_random_and_passes_the_sanity_check_and_says_ties():
    """MiniLM on "The cat sat on the mat" printed "beat random on both: attention, alti, integrated-gradients, loo"
    though alti's ρ was 0.71 and loo's 0.60, and listed four exact ties in the order asked: the verdict now
    keeps only what passes both tests, says ties as ties, ranks them 1=, and the trust column says why not."""
    methods = [_method("attention", 0.578, 0.354, -0.09), _method("alti", 0.578, 0.354, 0.71),
               _method("integrated-gradients", 0.578, 0.354, -0.03), _method("loo", 0.578, 0.354, 0.60),
               _method("grad-x-input", 0.248, 0.493, 0.94), _method("rollout", 0.044, 0.869, 0.1)]
    result = _result(methods)
    assert result.trusted() == ["attention", "integrated-gradients"]
    assert result.verdict().startswith("trust on this text: attention = integrated-gradients (tied")
    assert [result.trust(m) for m in methods] == ["yes", "no: sanity", "yes", "no: sanity", "no: both",
                                                  "no: random"]
    assert result.ranks() == {"attention": "1=", "alti": "1=", "integrated-gradients": "1=", "loo": "1=",
                              "grad-x-input": "5", "rollout": "6"}
    assert result.ties()[0] == ["attention", "alti", "integrated-gradients", "loo"]
    data = result.to_dict()
    assert data["methods"]["alti"]["trust"] == "no: sanity" and data["methods"]["alti"]["passes_sanity"] is False
    assert data["trusted"] == ["attention", "integrated-gradients"] and data["verdict"] == result.verdict()


def test_when_nothing_qualifies_the_verdict_says_so_and_what_a_corpus_needs():
    """SmolLM2 said "none" while its table put alti first: now one line says none qualifies and that a corpus of at
    least 6 texts (10 for intervals) can tell the methods apart; without the sanity check it says it was skipped."""
    from attnviz.metrics.faithfulness import MIN_INTERVAL_TEXTS, MIN_SIGNIFICANT_TEXTS, paired_sign_flip

    result = _result([_method("alti", 0.3, 0.5, 0.51), _method("loo", 0.21, 0.6, 0.02)])
    line = result.verdict()
    assert result.trusted() == [] and line.startswith("trust on this text: none")
    assert f"at least {MIN_SIGNIFICANT_TEXTS} texts" in line and f"{MIN_INTERVAL_TEXTS} for its intervals" in line
    # the numbers the line gives are the test's own: 5 texts cannot reach 0.05, 6 can
    assert paired_sign_flip(np.ones(MIN_SIGNIFICANT_TEXTS - 1)) > 0.05 >= paired_sign_flip(
        np.ones(MIN_SIGNIFICANT_TEXTS))
    alone = _result([_method("alti", 0.3, 0.5, 0.51)]).verdict()  # one method: named, not "none of the 1"
    assert alone.startswith("trust on this text: alti does not beat random on both measures and pass the sanity")
    unchecked = _result([_method("alti", 0.5, 0.2), _method("loo", 0.21, 0.6)])
    assert unchecked.trusted() == ["alti"] and "sanity check was skipped" in unchecked.verdict()


def test_a_corpus_of_enough_texts_gives_intervals_and_names_its_first_group():
    """12 texts: bootstrap intervals are the metric's own; the first group runs to the first significant lead;
    trust asks for it, for random beaten in both means and for the sanity check."""
    from attnviz.api.attribution.faithfulness_corpus import corpus_result
    from attnviz.metrics.faithfulness import bootstrap_interval

    rng = np.random.default_rng(0)

    def text(k):
        noise = rng.normal(0, 0.01, 3)
        return {"text": f"t{k}", "model": "m", "causal": False, "quantity": "q", "f_full": 1.0, "tokens": 6,
                "random": [0.2, 0.6],
                "methods": {"a": {"comprehensiveness": 0.5 + noise[0], "sufficiency": 0.3, "kendall_tau_loo": 0.5,
                                  "sanity": [0, 0.1], "beats_random": "both"},
                            "b": {"comprehensiveness": 0.5 + noise[1], "sufficiency": 0.3, "kendall_tau_loo": 0.5,
                                  "sanity": [0, 0.8], "beats_random": "both"},
                            "c": {"comprehensiveness": 0.1 + noise[2], "sufficiency": 0.7, "kendall_tau_loo": 0.1,
                                  "sanity": [0, 0.0], "beats_random": "no"}}}

    measured = [text(k) for k in range(12)]
    result = corpus_result(measured, [], seed=0)
    a = next(m for m in result.methods if m.name == "a")
    comp = np.array([t["methods"]["a"]["comprehensiveness"] for t in measured])
    assert (a.comprehensiveness[1], a.comprehensiveness[2]) == bootstrap_interval(comp, seed=0)
    assert sorted(m.name for m in result.top_group()) == ["a", "b"] and result.methods[2].name == "c"
    assert result.trusted() == ["a"] and result.trust(next(m for m in result.methods if m.name == "b")) == \
        "no: sanity"
    assert result.trust(result.methods[2]).startswith("no: behind")
    assert result.verdict().startswith("trust: a (over 12 texts the first 2 cannot be told apart")


def test_a_corpus_says_its_plan_before_it_starts_and_its_time_from_the_texts_after_the_first():
    """The first text pays the warm-up (on SmolLM2's 102 sentences an estimate from it said 19 min for a run of 10):
    the estimate reads the seconds per token of the texts after it, times the tokens still to come."""
    from attnviz.api.attribution.faithfulness_corpus import corpus_estimate, corpus_plan

    counts = [5, 10, 10, 10, 20]
    assert corpus_estimate(counts, 4, elapsed=10.0, since_first=6.0).startswith("about 14 s in all for the 5 texts")
    plan = corpus_plan(counts, ["attention", "loo"], 1, {"orders": 20, "steps": 20})
    assert plan.startswith("faithfulness over 5 texts (5–20 tokens, 55 in all): 2 methods, each again at 1 sanity")


def test_the_command_says_the_plan_and_the_estimate_on_stderr(tiny_lm_dir, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"the cat sat on the mat number {n}" for n in range(6)) + "\n")
    done = run("faithfulness", "--corpus", corpus, "-m", tiny_lm_dir("gpt2"), "--methods", "attention,loo,random")
    assert done.exit_code == 0, done.output
    said = " ".join(done.stderr.split())
    assert "faithfulness over 6 texts" in said and "in all for the 6 texts (from the 4 measured so far)" in said
