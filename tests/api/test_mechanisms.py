"""What happens inside a model: massive activations (attnviz massive, attnviz.massive) and the model-level sink
rate (attnviz sinks --corpus, attnviz.sink_rate). Each quantity checked against an independent computation: the
detector on planted entries, Gu et al.'s importance written out as a loop, the intervention's loss recomputed
from the model's own final norm and head, a massive activation planted in a tiny model's embedding."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from helpers import build_tiny_model, one_line_error, read_three_ways, require_real, run

import attnviz
from attnviz.engine import offline
from attnviz.metrics import key_importance, massive_entries, sink_rate

TEXT = "The cat sat on the mat because it was tired"
PLANTED = 20000.0  # added to one dimension of the start token's embedding


def test_massive_entries_are_the_planted_ones_and_need_both_thresholds():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(3, 12, 40))  # median |h| ≈ 0.67
    hidden[1, 0, 7] = -900.0  # over 1000× the median, over 100
    hidden[2, 0, 7] = 2000.0
    hidden[2, 5, 3] = 400.0  # over 100 but only ≈ 600× the median
    medians, found, tops = massive_entries(hidden)
    np.testing.assert_allclose(medians, [np.median(np.abs(h)) for h in hidden])
    assert [(e.layer, e.position, e.dim, e.value) for e in found] == [(1, 0, 7, -900.0), (2, 0, 7, 2000.0)]
    assert found[0].ratio == pytest.approx(900.0 / medians[1])
    assert [(e.position, e.dim) for e in tops[2]][:2] == [(0, 7), (5, 3)] and len(tops[0]) == 3
    _, looser, _ = massive_entries(hidden, ratio=500.0)
    assert (2, 5, 3) in {(e.layer, e.position, e.dim) for e in looser}
    _, none, _ = massive_entries(hidden, minimum=5000.0)
    assert none == []


def test_key_importance_and_the_sink_rate_are_gu_et_als_loop():
    rng = np.random.default_rng(1)
    T = 9
    raw = rng.random((2, 3, T, T)) * np.tril(np.ones((T, T)))
    alpha = raw / raw.sum(-1, keepdims=True)
    loop = np.zeros((2, 3, T))
    for layer in range(2):
        for head in range(3):
            for k in range(T):  # the queries that can see key k: k … T − 1
                loop[layer, head, k] = sum(alpha[layer, head, i, k] for i in range(k, T)) / (T - k)
    np.testing.assert_allclose(key_importance(alpha, causal=True), loop, rtol=1e-12)
    np.testing.assert_array_equal(sink_rate(alpha, True, 0.3), loop[..., 0] > 0.3)
    np.testing.assert_allclose(key_importance(alpha, causal=False), alpha.sum(-2) / T, rtol=1e-12)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A tiny random Llama whose start token's embedding carries PLANTED on dimension 3: a massive activation by
    construction, in every layer's residual stream at position 0."""
    import torch

    from attnviz.engine.models import load

    folder = build_tiny_model("llama", tmp_path_factory.mktemp("planted") / "llama", lm=True, init=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load(str(folder), device="cpu", lm_head="auto")
    start = loaded.tokenizer.bos_token_id
    with torch.no_grad():
        loaded.model.get_input_embeddings().weight[start, 3] += PLANTED
    return loaded


def test_a_planted_massive_activation_is_found_in_every_layer(planted):
    result = attnviz.massive(TEXT, model=planted)
    L = planted.model.config.num_hidden_layers
    assert result.positions == (0,) and result.dims == (3,) and result.tokens[0] == "<s>"
    assert [(e.layer, e.position, e.dim) for e in result.entries] == [(n, 0, 3) for n in range(L)]
    assert all(e.value > PLANTED / 2 for e in result.entries)
    assert result.first_layers() == {(0, 3): 0} and result.output_check <= 1e-5
    assert np.isnan(result.value_ratio[0]) and np.isfinite(result.value_ratio[1:]).all()
    data = result.to_dict()
    assert data["tokens"] == list(result.tokens) and data["massive"][0]["token"] == "<s>"
    assert len(data["top"]) == L and data["dims"] == [3]


def test_the_intervention_is_the_model_run_on_the_changed_stream(planted):
    """Entries of the last block's output replaced: the loss equals the one computed by hand from that block's
    recorded output, changed, through the model's own final norm and head (float32: 1e-5); no change gives the
    model's own loss; an entry set to its own value changes nothing."""
    import torch

    from attnviz.engine.forward import encode
    from attnviz.engine.mechanisms.massive import block_outputs, intervened

    model = planted.model
    inputs = encode(planted, TEXT).inputs
    L = model.config.num_hidden_layers
    plain, alpha = intervened(model, inputs, {})
    with torch.inference_mode():
        own = model(**inputs, labels=inputs["input_ids"]).loss
    assert plain == pytest.approx(float(own), abs=1e-5) and alpha.shape[:2] == (L, 4)
    last = block_outputs(model, inputs, [L - 1])[L - 1]
    assert intervened(model, inputs, {L - 1: [(2, 5, float(last[2, 5]))]})[0] == pytest.approx(plain, abs=1e-6)
    changed = torch.tensor(last).clone()
    changed[2, 5], changed[4, 0] = 30.0, -12.0
    with torch.inference_mode():
        logits = model.lm_head(model.model.norm(changed[None]))[0, :-1].double()
    by_hand = float(torch.nn.functional.cross_entropy(logits, inputs["input_ids"][0, 1:]))
    loss, _ = intervened(model, inputs, {L - 1: [(2, 5, 30.0), (4, 0, -12.0)]})
    assert loss == pytest.approx(by_hand, abs=1e-5) and abs(loss - plain) > 1e-3


def test_the_planted_activation_set_to_zero_or_its_mean(planted):
    result = attnviz.massive(TEXT, model=planted, intervene=True, reference=["A dog barked.", "Rain fell all day."])
    runs = result.intervention
    assert runs["texts"] == 2 and [(e["layer"], e["position"], e["dim"]) for e in runs["entries"]] == [(0, 0, 3)]
    assert runs["entries"][0]["mean"] > PLANTED / 2  # the other texts' start tokens carry it too
    assert runs["plain"]["loss"] != runs["zero"]["loss"]
    assert abs(runs["mean"]["loss"] - runs["plain"]["loss"]) < abs(runs["zero"]["loss"] - runs["plain"]["loss"])
    for name in ("plain", "zero", "mean"):
        assert runs[name]["perplexity"] == pytest.approx(np.exp(runs[name]["loss"]))


def test_massive_from_the_command_line(tiny_lm_dir, tiny_model_dir, tmp_path):
    folder = tiny_lm_dir("llama")
    given, piped, filed = read_three_ways("massive", TEXT, tmp_path, "-m", folder)
    assert given == piped == filed and len(given["medians"]) == 2
    csv = run("massive", TEXT, "-m", folder, "--csv", "--ratio", "2", "--minimum", "0").stdout.splitlines()
    assert csv[0] == "layer,position,token,dim,value,ratio" and len(csv) > 1
    capture = attnviz.capture(TEXT, model=folder)
    assert given["tokens"] == list(capture.tokens)
    looser = json.loads(run("massive", TEXT, "-m", folder, "--json", "--ratio", "2", "--minimum", "0").stdout)
    assert len(looser["massive"]) > len(given["massive"])
    assert all(m["ratio"] > 2 for m in looser["massive"])
    shown = run("massive", TEXT, "-m", folder, "--intervene", "-o", tmp_path / "m.png",
                env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and "set to 0" in shown.stdout and (tmp_path / "m.png").is_file()
    reference = tmp_path / "ref.txt"
    reference.write_text("One.\nTwo dogs.\n", encoding="utf-8")
    data = json.loads(run("massive", TEXT, "-m", folder, "--intervene", "--reference", reference, "--ratio", "2",
                          "--minimum", "0", "--json").stdout)
    assert data["intervention"]["texts"] == 2
    assert "encoder" in one_line_error(run("massive", TEXT, "-m", tiny_model_dir("bert"), "--intervene"))
    assert "--intervene" in one_line_error(run("massive", TEXT, "-m", folder, "--reference", reference), 2)
    assert "--ratio" in one_line_error(run("massive", TEXT, "-m", folder, "--ratio", "0.5"), 2)
    encoder = json.loads(run("massive", TEXT, "-m", tiny_model_dir("bert"), "--json").stdout)
    assert encoder["intervention"] is None and len(encoder["medians"]) == 2


def test_the_sink_rate_over_a_corpus(tiny_lm_dir, tmp_path):
    """Sink₁^ε over texts equals Gu et al.'s formula applied by hand to attnviz.capture's α of each text's first
    tokens; the command reads text lines and JSON lines alike."""
    folder = tiny_lm_dir("llama")
    texts = [TEXT, "A dog barked at the mailman", "Rain fell on the quiet town all day long"]
    result = attnviz.sink_rate(texts, model=folder, epsilon=0.2, tokens=6)
    sinks = []
    for text in texts:
        alpha = attnviz.capture(text, model=folder).attentions[:, :, :6, :6].astype(np.float64)
        T = alpha.shape[-1]
        first = alpha[..., :, 0].sum(-1) / T  # every query sees the first token
        sinks.append(first > 0.2)
    np.testing.assert_allclose(result.by_head, np.mean(sinks, axis=0))
    assert result.rate == pytest.approx(float(np.mean(sinks))) and result.texts == 3
    lines = tmp_path / "c.txt"
    lines.write_text("\n".join(texts) + "\n", encoding="utf-8")
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n", encoding="utf-8")
    a = json.loads(run("sinks", "--corpus", lines, "-m", folder, "--json", "--threshold", "0.2", "--tokens",
                       "6").stdout)
    b = json.loads(run("sinks", "--corpus", jsonl, "-m", folder, "--json", "--threshold", "0.2", "--tokens",
                       "6").stdout)
    assert a == b and a["sink_rate"] == pytest.approx(result.rate) and a["texts"] == 3
    assert "not both" in one_line_error(run("sinks", TEXT, "--corpus", lines, "-m", folder), 2)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    assert "holds no text" in one_line_error(run("sinks", "--corpus", empty, "-m", folder))


@pytest.mark.slow
def test_smollm2_massive_activations_as_sun_et_al_find_them():
    """SmolLM2: one entry of the first token, dimension 507, about 23,000 from layer 11 on (over 1000× the
    median); zeroed where it appears the loss explodes, set to its mean over other texts it barely moves; the
    first token's value vectors are a fraction of a typical token's."""
    require_real(offline.SMOLLM2)
    result = attnviz.massive("Summer is warm. Winter is cold. The cat sat on the mat because it was tired.",
                             model="smollm2", intervene=True)
    assert result.positions == (0,) and result.dims[0] == 507
    assert min(e.layer for e in result.entries if e.dim == 507) == 11
    runs = result.intervention
    assert runs["zero"]["loss"] > runs["plain"]["loss"] + 5.0
    assert abs(runs["mean"]["loss"] - runs["plain"]["loss"]) < 0.1
    assert runs["zero"]["sink_rate"] < runs["plain"]["sink_rate"]
    assert np.nanmax(result.value_ratio[12:]) < 0.6


@pytest.mark.slow
def test_gemma3_massive_activations_and_its_sink_rate():
    require_real(offline.GEMMA3)
    result = attnviz.massive(TEXT, model="gemma3")
    assert set(result.dims[:2]) == {400, 163}
    assert all(e.position == 0 for e in result.entries if e.layer >= 5)  # the middle layers: <bos> alone
    rate = attnviz.sink_rate([TEXT, "A dog barked at the mailman.", "Rain fell all day."], model="gemma3")
    assert rate.rate > 0.8


# --- retrieval heads ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory) -> str:
    """A tiny random Llama that takes 2,048 positions (rotary: no table to grow), for haystacks: its small
    vocabulary spells most words out letter by letter."""
    folder = build_tiny_model("llama", tmp_path_factory.mktemp("long") / "llama", lm=True, init=0.3)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["max_position_embeddings"] = 2048
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(folder)


def test_haystacks_hold_one_needle_at_its_depth_and_come_from_the_seed(tiny_lm_dir):
    from attnviz.engine.models import load
    from attnviz.engine.mechanisms.retrieval import haystacks

    tokenizer = load(tiny_lm_dir("gpt2"), device="cpu").tokenizer
    made = haystacks(tokenizer, [200, 400], [0.0, 0.5, 1.0], seed=3)
    assert len(made) == 6 and made == haystacks(tokenizer, [200, 400], [0.0, 0.5, 1.0], seed=3)
    assert made != haystacks(tokenizer, [200, 400], [0.0, 0.5, 1.0], seed=4)
    for stack in made:
        assert stack.prompt.count(stack.needle) == 1
        assert stack.prompt[stack.needle_at:].startswith(stack.needle)
        assert stack.prompt.endswith(f"The secret number of {stack.name} is")
        assert stack.answer.strip() in stack.needle and stack.answer.strip().isdigit()
        haystack = stack.prompt[:stack.prompt.index("\nQuestion:")]
        before, total = stack.prompt[:stack.needle_at].count("."), haystack.count(".") - 1  # sentences
        assert before == round(stack.depth * total)
        tokens = len(tokenizer.encode(stack.prompt))
        assert 0.6 * stack.length <= tokens <= 1.6 * stack.length


def test_retrieval_hits_equal_a_full_forward_pass_over_what_was_written(long_llama):
    """The KV-cached decoding's most-attended keys, step by step, are those of one forward pass over the prompt
    and what it wrote (row by row; a tie within 1e-6 may go either way), and its hits are recounted from them."""
    import torch

    from attnviz.engine.forward import encode
    from attnviz.engine.models import load
    from attnviz.engine.mechanisms.retrieval import haystacks, needle_span, retrieval_hits

    loaded = load(long_llama, device="cpu", lm_head="auto")
    (stack,) = haystacks(loaded.tokenizer, [300], [0.5], seed=1)
    encoded = encode(loaded, stack.prompt, truncate=False)
    ids = encoded.inputs["input_ids"]
    span = needle_span(encoded.offsets, stack.needle_at, stack.needle_at + len(stack.needle))
    text = "".join(encoded.tokens[span[0]:span[1]])
    assert "secret" in text.replace("##", "") and span[1] - span[0] >= 5
    written, hits, tops = retrieval_hits(loaded.model, ids, span, max_new=6)
    assert len(written) == 6 and len(tops) == 6
    full = torch.cat([ids, torch.tensor([written[:-1]])], dim=1)
    with torch.inference_mode():
        alpha = torch.stack([a[0] for a in loaded.model(input_ids=full, output_attentions=True).attentions])
    T = ids.shape[1]
    keys = full[0].tolist()
    everywhere = (0, T)  # the whole prompt as the needle: a random model's heads do land on copies there
    _, wide, _ = retrieval_hits(loaded.model, ids, everywhere, max_new=6)
    for chosen, counted in ((span, hits), (everywhere, wide)):
        recount = np.zeros_like(counted)
        for step, top in enumerate(tops):
            row = alpha[:, :, T - 1 + step].double().numpy()  # (L, H, S): the query that wrote written[step]
            same = row.argmax(-1) == top
            assert np.all(same | (np.abs(np.take_along_axis(row, top[..., None], -1)[..., 0] - row.max(-1)) < 1e-6))
            recount += (top >= chosen[0]) & (top < chosen[1]) & (np.array(keys)[top] == written[step])
        np.testing.assert_array_equal(recount, counted)
    assert wide.sum() > 0


def test_answer_accuracy_with_heads_removed_equals_their_weights_zeroed(tiny_lm_dir):
    import torch

    from attnviz.engine.ablation.seam import site, weights_removed
    from attnviz.engine.models import load
    from attnviz.engine.mechanisms.retrieval import answer_accuracy

    loaded = load(tiny_lm_dir("llama"), device="cpu", lm_head="auto")
    where = site(loaded.model)
    ids = torch.tensor([[1, 20, 31, 42, 53, 64, 20, 31]])
    answer = [42, 53, 64]
    removed = [(0, 1), (1, 2)]
    full = torch.cat([ids, torch.tensor([answer])], dim=1)
    for heads in ([], removed):
        with weights_removed(where, heads), torch.inference_mode():
            logits = loaded.model(input_ids=full).logits[0, 7:10].double()
        right = float((logits.argmax(-1) == torch.tensor(answer)).double().mean())
        logp = float(torch.log_softmax(logits, -1)[torch.arange(3), torch.tensor(answer)].mean())
        accuracy, mean_logp = answer_accuracy(where, ids, answer, heads)
        assert accuracy == right and mean_logp == pytest.approx(logp, abs=1e-5)


def test_retrieval_heads_from_the_command_line(long_llama, tiny_model_dir, tmp_path):
    """A tiny random model answers no needle: every score 0, no causal test; the prompts are listed as made."""
    folder = long_llama
    data = json.loads(run("retrieval", "-m", folder, "--lengths", "200,300", "--depths", "0,1", "--json").stdout)
    assert len(data["prompts"]) == 4 and [p["depth"] for p in data["prompts"]] == [0.0, 1.0, 0.0, 1.0]
    assert np.array(data["scores"]).shape == (2, 4) and data["answered"] == sum(p["retrieved"] for p in data["prompts"])
    if not data["answered"]:
        assert data["causal"] is None and not np.any(data["scores"])
    shown = run("retrieval", "-m", folder, "--lengths", "200", "--depths", "0.5", "-o", tmp_path / "r.png",
                env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and "1 needles" in shown.stdout and (tmp_path / "r.png").is_file()
    assert "--lengths" in one_line_error(run("retrieval", "-m", folder, "--lengths", "a,b"), 2)
    assert "lengths" in one_line_error(run("retrieval", "-m", folder, "--lengths", "10"), 2)
    assert "depths" in one_line_error(run("retrieval", "-m", folder, "--depths", "1.5"), 2)
    assert "causal language model" in one_line_error(run("retrieval", "-m", tiny_model_dir("bert")))


@pytest.mark.slow
def test_gemma3_retrieves_through_its_full_attention_layers():
    """Gemma 3: the needle is copied by heads of the layers that see the whole text (5, 11, 17; the others see
    512 tokens); removing the top 8 heads loses most answer tokens, removing 8 random heads far fewer."""
    require_real(offline.GEMMA3)
    result = attnviz.retrieval(model="gemma3", lengths=[300, 700], depths=[0.2, 0.8], remove=8, draws=3)
    assert result.answered == 4
    assert all(t["layer"] in (5, 11, 17) for t in result.top(3))
    causal = result.causal
    assert causal["none"]["accuracy"] == 1.0
    assert causal["top"]["accuracy"] < np.mean([r["accuracy"] for r in causal["random"]]) - 0.4


# --- QK and OV circuits from the weights ---------------------------------------------------------------------


def _loaded_lm(folder):
    from attnviz.engine.models import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load(folder, device="cpu", lm_head="auto")


@pytest.fixture(scope="module")
def copying_model(tmp_path_factory):
    """A tiny Llama (4 query heads sharing 2 key/value heads, d = 8, D = 32) rebuilt by hand in layer 0: every
    norm's gain 1, the embedding centred and the output head equal to it, and key/value head 0 reading a
    subspace P (8 orthonormal directions): query head 0 writes it back (OV = P·Pᵀ, a copying head by
    construction), query head 1, sharing that value head, writes its negative (OV = −P·Pᵀ)."""
    import torch

    folder = build_tiny_model("llama", tmp_path_factory.mktemp("copying") / "llama", lm=True, init=0.3)
    loaded = _loaded_lm(str(folder))
    model = loaded.model
    rng = np.random.default_rng(5)
    P = torch.tensor(np.linalg.qr(rng.normal(size=(32, 8)))[0])  # (D, d), orthonormal columns
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.fill_(1.0)
        embedding = model.get_input_embeddings().weight
        embedding -= embedding.mean(dim=0, keepdim=True)
        model.lm_head.weight.copy_(embedding)
        attention = model.model.layers[0].self_attn
        attention.v_proj.weight[:8] = P.T.float()  # key/value head 0: W_V = P
        attention.o_proj.weight[:, 0:8] = P.float()  # query head 0: W_O = Pᵀ (o_proj holds W_Oᵀ)
        attention.o_proj.weight[:, 8:16] = -P.float()  # query head 1: W_O = −Pᵀ
    return loaded


def test_a_copying_head_built_by_hand_scores_one_and_its_negative_minus_one(copying_model):
    from attnviz.api.mechanisms.circuits import common_tokens
    from attnviz.engine.mechanisms.circuits import copying, head_weights

    weights = head_weights(copying_model.model)
    vocab = common_tokens(copying_model.tokenizer, 60)
    assert len(vocab) == 60
    score, positive = copying(weights, vocab)
    assert score[0, 0] == pytest.approx(1.0, abs=1e-9) and positive[0, 0] == pytest.approx(1.0, abs=1e-9)
    assert score[0, 1] == pytest.approx(-1.0, abs=1e-9) and positive[0, 1] == pytest.approx(0.0, abs=1e-9)
    assert np.all(np.abs(score) <= 1 + 1e-12)
    others = np.delete(score.ravel(), [0, 1])
    assert np.all(np.abs(others) < 0.999)  # random heads: neither


def test_the_ov_score_equals_the_full_vocabulary_matrix_eigenvalues(tiny_lm_dir):
    """The copying score from the d × d factor equals the one from the S × S matrix W_E[S]·W_V·W_O·W_U[:, S] built
    from the modules' own weights here (norm gains, the key/value head h // 2, W_U centred), and its
    eigenvalues, to 1e-9."""
    import torch

    from attnviz.api.mechanisms.circuits import common_tokens
    from attnviz.engine.mechanisms.circuits import copying, head_weights

    loaded = _loaded_lm(tiny_lm_dir("llama"))
    model = loaded.model
    vocab = common_tokens(loaded.tokenizer, 40)
    score, _ = copying(head_weights(model), vocab)
    E = model.get_input_embeddings().weight.detach().double()
    U = model.lm_head.weight.detach().double()
    U = (U - U.mean(0)) * model.model.norm.weight.detach().double()  # (V, D)
    for layer, head in ((0, 3), (1, 2)):
        block = model.model.layers[layer]
        gain = block.input_layernorm.weight.detach().double()
        kv = head // 2
        W_V = gain[:, None] * block.self_attn.v_proj.weight.detach().double()[kv * 8:(kv + 1) * 8].T  # (D, d)
        W_O = block.self_attn.o_proj.weight.detach().double()[:, head * 8:(head + 1) * 8].T  # (d, D)
        M = E[vocab] @ W_V @ W_O @ U[vocab].T  # (S, S)
        values = torch.linalg.eigvals(M)
        expected = float(values.sum().real / values.abs().sum())
        assert score[layer, head] == pytest.approx(expected, abs=1e-9)


def test_composition_equals_the_full_matrices_and_is_zero_within_a_layer(tiny_lm_dir):
    from attnviz.engine.mechanisms.circuits import composition, head_weights

    loaded = _loaded_lm(tiny_lm_dir("llama"))
    w = head_weights(loaded.model)
    scores = composition(w)

    def fro(m):
        return float(np.linalg.norm(m.numpy()))

    for (l1, h1), (l2, h2) in (((0, 0), (1, 3)), ((0, 2), (1, 1))):
        OV = w.v[l1][h1] @ w.o[l1][h1]  # (D, D)
        QK = w.q[l2][h2] @ w.k[l2][h2].T
        OV2 = w.v[l2][h2] @ w.o[l2][h2]
        for mode, R in (("q", QK), ("k", QK.T), ("v", OV2)):
            expected = fro(OV @ R) / (fro(OV) * fro(R))
            assert scores[mode][l1, h1, l2, h2] == pytest.approx(expected, rel=1e-9)
    for mode in "qkv":
        assert not scores[mode][1, :, 0, :].any() and not scores[mode][0, :, 0, :].any()
        assert np.all((scores[mode][0, :, 1, :] > 0) & (scores[mode][0, :, 1, :] <= 1))


def test_the_folded_weights_give_the_models_own_values_and_queries(tiny_lm_dir):
    """x̂·W_V^h (x̂ the block's input over its RMS, the norm's gain folded into W_V) is what v_proj gives for the
    key/value head h // 2; likewise W_Q for every query head."""
    import torch

    from attnviz.engine.mechanisms.circuits import head_weights

    loaded = _loaded_lm(tiny_lm_dir("llama"))
    model = loaded.model
    w = head_weights(model)
    seen: dict = {}
    block = model.model.layers[1]
    hooks = [block.register_forward_pre_hook(lambda m, args: seen.update(x=args[0].detach().double())),
             block.self_attn.v_proj.register_forward_hook(lambda m, a, out: seen.update(v=out.detach().double())),
             block.self_attn.q_proj.register_forward_hook(lambda m, a, out: seen.update(q=out.detach().double()))]
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([[1, 20, 31, 42, 53]]))
    finally:
        for hook in hooks:
            hook.remove()
    x = seen["x"][0]
    eps = model.config.rms_norm_eps
    normed = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    for head in range(4):
        kv = head // 2
        torch.testing.assert_close(normed @ w.v[1][head], seen["v"][0][:, kv * 8:(kv + 1) * 8], atol=1e-5, rtol=0)
        torch.testing.assert_close(normed @ w.q[1][head], seen["q"][0][:, head * 8:(head + 1) * 8], atol=1e-5,
                                   rtol=0)


def test_circuits_from_the_command_line(tiny_lm_dir, tiny_model_dir, tmp_path):
    folder = tiny_lm_dir("llama")
    data = json.loads(run("circuits", "-m", folder, "--tokens", "50", "--json").stdout)
    assert np.array(data["copying"]).shape == (2, 4) and data["tokens"] == 50
    assert np.array(data["composition"]["k"]).shape == (2, 4, 2, 4)
    assert len(data["qk"][1][3]) == 3 and set(data["qk"][1][3][0]) == {"query", "key", "score"}
    csv = run("circuits", "-m", folder, "--tokens", "50", "--csv").stdout.splitlines()
    assert csv[0].startswith("layer,head,copying") and len(csv) == 1 + 8
    shown = run("circuits", "-m", folder, "--tokens", "50", "-o", tmp_path / "c.png",
                env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and "K-composition" in shown.stdout and (tmp_path / "c.png").is_file()
    assert "--tokens" in one_line_error(run("circuits", "-m", folder, "--tokens", "5"), 2)
    assert "output head" in one_line_error(run("circuits", "-m", tiny_model_dir("bert")))


@pytest.mark.slow
def test_circuits_of_gemma3_map_its_shared_key_value_head():
    """Gemma 3: 4 query heads share 1 key/value head, so within a layer every head's W_V is the same; the scores
    are bounded and the composition runs forward only."""
    require_real(offline.GEMMA3)
    result = attnviz.circuits(model="gemma3", tokens=300)
    L, H = result.shape
    assert (L, H) == (18, 4) and np.all(np.abs(result.copying) <= 1 + 1e-9)
    for mode in "qkv":
        scores = result.composition[mode]
        assert all(not scores[n, :, m, :].any() for n in range(L) for m in range(n + 1))
    top = result.top_copying(3)
    assert all(t["copying"] > 0.8 for t in top)


def test_retrieval_keeps_no_weights_so_its_memory_check_counts_one_layer_at_a_time(long_llama):
    """A budget between one layer's weights (with the model's temporaries) and every layer's: holding the
    prompt's α is refused, retrieval runs (it keeps no α, only each step's row)."""
    from attnviz.engine.forward import encode
    from attnviz.engine.mechanisms.retrieval import haystacks

    loaded = attnviz.load_model(long_llama)
    (stack,) = haystacks(loaded.tokenizer, [200], [0.5], seed=0)
    T = len(encode(loaded, stack.prompt, truncate=False).tokens)
    L, H = 2, 4
    budget = 5 * H * T * T * 4  # (0 + 4) × H·T²·4 fits, (L + 4) × H·T²·4 does not
    tight = attnviz.load_model(long_llama, memory_budget=budget, lm_head="auto")
    from attnviz.engine.memory import check_memory

    with pytest.raises(attnviz.AttnvizError, match="budget"):
        check_memory(tight, T)
    result = attnviz.retrieval(model=tight, lengths=[200], depths=[0.5], remove=0)
    assert len(result.prompts) == 1 and result.prompts[0]["tokens"] == T and L + 4 > 5


@pytest.mark.parametrize("kind", ["gpt2", "phi3", "qwen3", "gemma3", "olmo2"])
def test_circuits_and_massive_read_every_layout_of_weights(kind, tmp_path):
    """GPT-2's fused c_attn, Phi-3's fused qkv_proj, QK-norm per head (Qwen3, Gemma 3, with Gemma's w − 1 and
    its norm after the attention) or over the projection (OLMo 2): the scores are bounded, composition runs
    forward only, and every head's folded W_O·W_V has the shapes of its model."""
    from attnviz.engine.mechanisms.circuits import head_weights

    folder = str(build_tiny_model(kind, tmp_path / kind, lm=True, init=0.3))
    result = attnviz.circuits(model=folder, tokens=30)
    L, H = result.shape
    assert np.all(np.abs(result.copying) <= 1 + 1e-9) and np.all((result.positive >= 0) & (result.positive <= 1))
    for mode in "qkv":
        assert not any(result.composition[mode][n, :, m, :].any() for n in range(L) for m in range(n + 1))
    weights = head_weights(_loaded_lm(folder).model)
    D = weights.embed.shape[1]
    assert all(q.shape[:2] == (H, D) and o.shape[0] == H and o.shape[2] == D for q, o in zip(weights.q, weights.o))
    massive = attnviz.massive(TEXT, model=folder)
    assert len(massive.medians) == L and massive.output_check <= 1e-5
