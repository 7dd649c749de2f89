"""Direct logit attribution (attnviz logit-attr, attnviz.logit_attr): the logit of the next token split
into heads, MLPs, embeddings and biases, each check against an independent computation."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from helpers import build_tiny_model, one_line_error, read_three_ways, require_real, run, TODAYS

import attnviz
from attnviz.engine import offline

TEXT = "The cat sat on the mat"
SPLITS = ("gpt2", "llama", "mistral", "qwen2", "mistral-window", "qwen3", "phi3", "smollm3", "cohere2", "gpt_oss")
POST_NORMS = ("gemma2", "gemma3", "olmo2")  # blocks that normalise what they add: refused


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made: dict = {}

    def folder(kind: str):
        if kind not in made:
            made[kind] = str(build_tiny_model(kind, tmp_path_factory.mktemp(kind) / kind,
                                              lm=kind in ("gpt2", "llama")))
        return made[kind]

    return folder


def attribute(folder, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a bare decoder gets a random head: the split holds all the same
        return attnviz.logit_attr(TEXT, model=folder, **kwargs)


@pytest.mark.parametrize("kind", SPLITS)
def test_the_parts_add_up_to_the_models_own_logit(kind, folders):
    """Σ heads + biases + MLPs + embeddings + final bias = the logit the model computes (float64 sums of
    float32 parts: 1e-4 of max(1, |logit|)); each output projection is rebuilt from the recomputed α and
    values, the stream from the parts, the final norm's output from its frozen-scale form."""
    result = attribute(folders(kind))
    assert result.passed and abs(result.rebuilt - result.logit) <= 1e-4 * max(1.0, abs(result.logit))
    assert result.output_diff < 1e-4 and result.stream_diff < 1e-5 and result.norm_diff < 1e-4
    np.testing.assert_allclose(result.by_source.sum(-1), result.heads, atol=1e-9)  # the split over sources


def test_a_heads_effect_equals_its_slice_of_the_models_own_output_projection(folders):
    """Independently of the recomputed α and values: what the model's own output projection receives (a
    hook), head h's slice through W_O, then the final norm with its scale frozen and the target's row of
    W_U, written out here for GPT-2's LayerNorm."""
    import torch

    from attnviz.engine.forward import encode
    from attnviz.engine.models import load

    loaded = load(folders("gpt2"), device="cpu", lm_head=True)
    result = attnviz.logit_attr(TEXT, model=loaded)
    model = loaded.model
    received, final = {}, {}
    hooks = [block.attn.c_proj.register_forward_pre_hook(lambda module, args, n=n: received.__setitem__(n, args[0]))
             for n, block in enumerate(model.transformer.h)]
    hooks.append(model.transformer.ln_f.register_forward_pre_hook(lambda m, args: final.__setitem__("x", args[0])))
    with torch.no_grad():
        model(**encode(loaded, TEXT).inputs)
    for hook in hooks:
        hook.remove()
    x = final["x"][0, -1].double()
    sigma = torch.sqrt(x.var(unbiased=False) + model.transformer.ln_f.eps)
    gamma = model.transformer.ln_f.weight.double()
    row = model.lm_head.weight[result.target_id].double()
    H = model.config.n_head
    d = model.config.n_embd // H
    for layer, z in received.items():
        W = model.transformer.h[layer].attn.c_proj.weight.double()  # Conv1D: x @ W, W (D_in, D_out)
        for head in range(H):
            c = z[0, -1, head * d:(head + 1) * d].double() @ W[head * d:(head + 1) * d]  # (D,)
            by_hand = float((row * gamma * (c - c.mean()) / sigma).sum())
            assert result.heads[layer, head] == pytest.approx(by_hand, abs=1e-6)


def test_the_target_and_position_are_the_users_to_choose(folders):
    folder = folders("llama")
    top = attribute(folder)
    assert top.rank == 0 and top.probability > 0
    chosen = attribute(folder, target=top.target_id + 1 if top.target_id < 10 else 3)
    assert chosen.passed and chosen.target_id != top.target_id and chosen.rank > 0
    earlier = attribute(folder, position=2)
    assert earlier.position == 2 and earlier.passed and earlier.by_source[..., 3:].max() == 0  # causal: no future
    with pytest.raises(attnviz.AttnvizError, match="out of range"):
        attribute(folder, position=99)
    with pytest.raises(attnviz.AttnvizError, match="tokens for"):
        attribute(folder, target="unbelievably long words")
    with pytest.raises(attnviz.AttnvizError, match="not a token id"):
        attribute(folder, target=10**9)


@pytest.mark.parametrize("kind", POST_NORMS)
def test_blocks_that_normalise_what_they_add_are_refused_in_one_line(kind, folders):
    result = run("logit-attr", TEXT, "-m", folders(kind))  # (saved without a head: a warning says so first)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith("Error: ") and "do not simply add" in lines[-1]
    assert all(line.startswith(("Warning: ", "Error: ")) for line in lines) and "Traceback" not in result.output


def test_an_encoder_is_refused_in_one_line(tiny_model_dir):
    assert "causal language model" in one_line_error(run("logit-attr", TEXT, "-m", tiny_model_dir("bert")))


def test_the_command_reads_text_standard_input_and_a_file_alike(folders, tmp_path):
    folder = folders("gpt2")
    given, piped, filed = read_three_ways("logit-attr", TEXT, tmp_path, "-m", folder)
    assert given == piped == filed
    assert given["passed"] and given["tokens"][-1] == given["tokens"][given["position"]]
    assert abs(given["rebuilt"] - given["logit"]) <= 1e-4 * max(1.0, abs(given["logit"]))
    assert len(given["heads"]) == 2 and len(given["heads"][0]) == 4 and len(given["top"]) == 8  # every head
    csv = run("logit-attr", TEXT, "-m", folder, "--csv").stdout.splitlines()
    assert csv[0] == "layer,head,effect" and len(csv) == 1 + 2 * 4


def test_the_table_and_the_picture(folders, tmp_path):
    folder = folders("llama")
    shown = run("logit-attr", TEXT, "-m", folder, "--top", "3", "-o", tmp_path / "la.png",
                env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0, shown.output
    assert "PASS: the parts add up to the model's own logit" in shown.stdout and "layer.head" in shown.stdout
    assert (tmp_path / "la.png").is_file()
    result = attribute(folder, top=3)
    lines = shown.stdout.splitlines()
    header = next(line for line in lines if "raises" in line and "lowers" in line)
    start, end = header.index("raises"), header.index("lowers")
    body = lines[lines.index(header) + 2:]
    column = [line[start:end].strip() for line in body[:next(i for i, line in enumerate(body) if not line.strip())]]
    # one token to a line, whole, as the model's vocabulary has it (spaces as ␣)
    assert [c for c in column if c] == [t.replace(" ", "␣") or "∅" for e in result.top for t in e.promotes[:3]]
    figure = result.figure()
    grid, sources, _ = figure.axes  # and ALTI-Logit (its own test)
    parts = [ax for ax in figure.get_axes() if "part by part" in ax.get_title()]  # the fourth slot: the logit's parts
    assert len(parts) == 1 and [t.get_text() for t in parts[0].get_yticklabels()] == [
        "heads", "MLPs", "embeddings", "biases", "logit"]
    widths = [bar.get_width() for bar in parts[0].patches]
    assert widths[-1] == pytest.approx(result.logit) and sum(widths[:-1]) == pytest.approx(result.logit, abs=1e-4)
    assert widths[0] == pytest.approx(float(result.heads.sum()))
    np.testing.assert_allclose(np.asarray(grid.images[0].get_array()), result.heads, atol=1e-6)
    assert [t.get_text() for t in sources.get_yticklabels()] == [f"{e.layer}.{e.head}" for e in result.top]
    low, high = grid.images[0].get_clim()
    assert low == -high  # centred on 0
    assert "--top" in one_line_error(run("logit-attr", TEXT, "-m", folder, "--top", "0"), 2)


@pytest.mark.slow
def test_smollm2_writes_paris_through_france():
    """The real model: after "The capital of France is" SmolLM2 predicts " Paris"; its largest direct effect
    is a head reading " France" (layer 23, head 4 here), and the parts rebuild the logit."""
    require_real(offline.SMOLLM2)
    result = attnviz.logit_attr("The capital of France is", model="smollm2")
    assert result.target == " Paris" and result.passed and result.difference < 1e-6
    first = result.top[0]
    assert (first.layer, first.head) == (23, 4) and first.sources[0][0] == "France" and first.effect > 2
    assert "France" in "".join(first.promotes)


assert set(POST_NORMS) | set(SPLITS) >= set(TODAYS) - {"modernbert"}  # every decoder family is tested


# --- value zeroing (attnviz contributions) ----------------------------------------------------------------

SENTENCE = "The cat sat on the mat because it was tired"


def value_module(attention):
    """The Linear that makes the value vectors, in each family's own naming."""
    for path in ("v_proj", "self.value", "value", "v_lin"):
        module = attention
        for part in path.split("."):
            module = getattr(module, part, None)
        if module is not None:
            return module
    raise AssertionError(type(attention).__name__)


@pytest.mark.parametrize("kind", ["bert", "llama", "distilbert"])
def test_value_zeroing_equals_zeroing_one_value_at_a_time(kind, tmp_path):
    """The batched run (every layer at once, each copy of the text zeroing its own token, the stream put back
    after each block) gives what the brute force gives: one forward pass per (layer, token) with that token's
    value rows zeroed by a hook on the value projection of that layer alone, through the family's own eager
    attention. Both are float32 forward passes of the same layer: 1 − cos agrees to float32 rounding (a few
    1e-7), so 1e-6."""
    import torch

    from attnviz.engine.forward import encode
    from attnviz.engine.scratch.adapters import adapter_for
    from attnviz.engine.models import load
    from attnviz.engine.attribution.zeroing import value_zeroing

    loaded = load(str(build_tiny_model(kind, tmp_path / kind)), device="cpu")
    encoded = encode(loaded, SENTENCE)
    modules = adapter_for(loaded.model).modules(loaded.model)
    scores, distances = value_zeroing(loaded.model, encoded.inputs, modules, batch=3)  # (the engine's own)
    single, _ = value_zeroing(loaded.model, encoded.inputs, modules, batch=1)
    np.testing.assert_allclose(scores, single, atol=1e-12, rtol=0)  # the batch size changes nothing
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-12)
    with torch.no_grad():
        clean = loaded.model(**encoded.inputs, output_hidden_states=True).hidden_states
    T = len(encoded.tokens)
    for layer, attention in enumerate(modules):
        for j in range(T):
            hook = value_module(attention).register_forward_hook(
                lambda m, args, out, j=j: out.index_fill(1, torch.tensor([j]), 0.0))
            with torch.no_grad():
                zeroed = loaded.model(**encoded.inputs, output_hidden_states=True).hidden_states
            hook.remove()
            cos = torch.nn.functional.cosine_similarity(clean[layer + 1][0].double(), zeroed[layer + 1][0].double(),
                                                        dim=-1)
            np.testing.assert_allclose(distances[layer, :, j], (1 - cos).clamp_min(0).numpy(), atol=1e-6)


def test_value_zeroing_keeps_no_cache_and_unembeds_no_position_it_does_not_read(folders, monkeypatch):
    """Value zeroing reads the blocks' outputs only. A causal LM with its head, called plainly, would keep every
    layer's K and V for each batch of copies and unembed all B·T positions (8 × 1,000 tokens × Qwen's 151,936
    words: 4.9 GB of float32 logits); every call asks for no cache and one position's logits, and the scores
    are those of the model without its head."""
    import functools

    from attnviz.engine.attribution.zeroing import value_zeroing
    from attnviz.engine.forward import encode
    from attnviz.engine.models import load
    from attnviz.engine.scratch.adapters import adapter_for

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load(folders("llama"), device="cpu", lm_head=True)
    encoded = encode(loaded, SENTENCE)
    base = loaded.model.base_model
    modules = adapter_for(base).modules(base)
    plain, _ = value_zeroing(base, encoded.inputs, modules, batch=4)
    seen = []
    real = loaded.model.forward

    @functools.wraps(real)
    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append((kwargs.get("use_cache"), out.logits.shape[1], getattr(out, "past_key_values", None)))
        return out

    monkeypatch.setattr(loaded.model, "forward", spy)
    scores, _ = value_zeroing(loaded.model, encoded.inputs, modules, batch=4)
    T = len(encoded.tokens)
    assert seen == [(False, 1, None)] * (1 + -(-T // 4))
    np.testing.assert_array_equal(scores, plain)


@pytest.mark.parametrize("kind, method", [
    ("gpt2", "value-zeroing"), ("qwen3", "value-zeroing"), ("gemma2", "value-zeroing"), ("modernbert", "value-zeroing"),
    *[(kind, "alti") for kind in ("bert", "distilbert", "gpt2", "llama", "qwen3", "phi3", "gpt_oss", "modernbert")]])
def test_contributions_on_other_families(kind, method, folders, tiny_model_dir):
    """Value zeroing through the attention interface, whatever the family; ALTI wherever each attention block
    is a sum of per-token parts, checked against the block's own output in every layer (float64 sums of
    float32 parts: 1e-5 of the output's size). Rows sum to 1, a causal model's future is 0, the rollout's rows
    sum to 1."""
    folder = tiny_model_dir(kind) if kind in ("bert", "distilbert") else folders(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = attnviz.contributions(SENTENCE, model=folder, method=method)
    scores = result.scores
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(result.rollout().sum(-1), 1.0, atol=1e-5)
    if result.capture.causal:
        assert np.abs(np.triu(scores, 1)).max() < 1e-6 and np.abs(np.triu(result.rollout(), 1)).max() < 1e-6
    assert result.capture.quantity == {"alti": "ALTI", "value-zeroing": "value zeroing"}[method]
    assert result.alpha.quantity == "alpha" and len(result.records) == result.capture.n_layers
    if method == "alti":
        assert result.checks is not None and float(result.checks.max()) < 1e-5


@pytest.mark.parametrize("kind", ["gemma2", "olmo2", "cohere2"])
def test_alti_refuses_blocks_it_cannot_split(kind, folders):
    """Gemma 2 and OLMo 2 normalise the attention's output before adding it, Cohere 2 runs attention and MLP
    side by side: the parts do not add up to an attention block's output, and ALTI says so in one line."""
    result = run("contributions", SENTENCE, "-m", folders(kind), "--method", "alti")
    assert "ALTI" in one_line_error(result)


def test_alti_on_three_tokens_equals_the_formula_written_out(tmp_path):
    """A one-layer BERT of width 4 with 2 heads on a 3-token input, everything recomputed here in numpy from
    its weights: α, f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h, T_i(x_j) = Σ_h α_ij f_h(x_j) + [i = j] x_i, the
    LayerNorm's scale frozen at σ of Σ_j T_i(x_j) + b_O, c_ij = max(0, ‖y_i‖₁ − ‖y_i − T'_i(x_j)‖₁), rows
    normalised (Ferrando et al. 2022, eqs. 7–9)."""
    import torch
    import transformers as tf

    from attnviz.engine.attribution.alti import alti

    torch.manual_seed(3)
    config = tf.BertConfig(vocab_size=10, hidden_size=4, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=8, initializer_range=0.8)
    config._attn_implementation = "eager"
    model = tf.BertModel(config, add_pooling_layer=False).eval()
    ids = torch.tensor([[1, 5, 2]])
    scores, checks, _ = alti(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    with torch.no_grad():
        x = model.embeddings(input_ids=ids)[0].double().numpy()  # (3, 4)
    a = model.encoder.layer[0].attention
    w = {name: getattr(a.self, name).weight.detach().double().numpy() for name in ("query", "key", "value")}
    b = {name: getattr(a.self, name).bias.detach().double().numpy() for name in ("query", "key", "value")}
    W_O, b_O = a.output.dense.weight.detach().double().numpy(), a.output.dense.bias.detach().double().numpy()
    ln = a.output.LayerNorm
    gamma, beta = ln.weight.detach().double().numpy(), ln.bias.detach().double().numpy()
    q, k, v = (x @ w[n].T + b[n] for n in ("query", "key", "value"))  # (3, 4)
    T_parts = np.zeros((3, 3, 4))
    for h in range(2):
        cols = slice(2 * h, 2 * h + 2)
        s = q[:, cols] @ k[:, cols].T / np.sqrt(2)
        alpha = np.exp(s - s.max(1, keepdims=True))
        alpha /= alpha.sum(1, keepdims=True)
        f = v[:, cols] @ W_O[:, cols].T  # (3, 4): token j's value through head h's slice of W_O
        T_parts += alpha[:, :, None] * f[None]
    for i in range(3):
        T_parts[i, i] += x[i]
    z = T_parts.sum(1) + b_O
    sigma = np.sqrt(z.var(1) + ln.eps)
    Tn = gamma * (T_parts - T_parts.mean(-1, keepdims=True)) / sigma[:, None, None]
    y = Tn.sum(1) + gamma * (b_O - b_O.mean()) / sigma[:, None] + beta
    c = np.maximum(0, np.abs(y).sum(-1)[:, None] - np.abs(y[:, None] - Tn).sum(-1))
    total = c.sum(1, keepdims=True)
    expected = np.where(total > 0, c / np.where(total > 0, total, 1), np.eye(3))  # no part closer than 0: itself
    np.testing.assert_allclose(scores[0], expected, atol=1e-6)
    assert checks.max() < 1e-6 and (total[:, 0] > 0).sum() >= 2  # the formula decided at least two rows


def test_contributions_from_the_command_line(tiny_model_dir, tmp_path):
    folder = tiny_model_dir("bert")
    path = tmp_path / "text.txt"
    path.write_text(SENTENCE, encoding="utf-8")
    given = json.loads(run("contributions", SENTENCE, "-m", folder, "--json").stdout)
    piped = json.loads(run("contributions", "-", "-m", folder, "--json", input=SENTENCE).stdout)
    filed = json.loads(run("contributions", "--text-file", path, "-m", folder, "--json").stdout)
    assert given == piped == filed and given["method"] == "alti" and max(given["checks"]) < 1e-5
    assert all(abs(sum(row) - 1) < 1e-5 for row in given["rollout"])
    zeroed = json.loads(run("contributions", SENTENCE, "-m", folder, "--json", "--method", "vz").stdout)
    assert zeroed["method"] == "value-zeroing" and "checks" not in zeroed
    T = len(given["tokens"])
    assert given["tokens"][0] == "[CLS]" and len(given["scores"]) == 2 and len(given["scores"][0]) == T
    assert all(abs(sum(row) - 1) < 1e-5 for layer in given["scores"] for row in layer)
    csv = run("contributions", SENTENCE, "-m", folder, "--csv").stdout.splitlines()
    assert csv[0].startswith("layer,alpha_on_special,contribution_on_special") and len(csv) == 3
    shown = run("contributions", SENTENCE, "-m", folder, "--layer", "0", "-o", tmp_path / "vz.png",
                env={"COLUMNS": "100", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and "in layer 0, and through all layers" in shown.stdout
    assert "it ←" in shown.stdout and "PASS" in shown.stdout and (tmp_path / "vz.png").is_file()
    assert "--method" in one_line_error(run("contributions", SENTENCE, "-m", folder, "--method", "lrp"), 2)


@pytest.mark.parametrize("method", ["alti", "value-zeroing"])
def test_the_contributions_picture_is_the_layer_beside_its_attention(tiny_model_dir, method):
    result = attnviz.contributions(SENTENCE, model=tiny_model_dir("bert"), method=method)
    figure = result.figure(layer=1)
    seen, moved = figure.axes
    np.testing.assert_allclose(np.asarray(moved.images[0].get_array()), result.scores[1], atol=1e-6)
    np.testing.assert_allclose(np.asarray(seen.images[0].get_array()), result.alpha.attentions[1].mean(0), atol=1e-6)


@pytest.mark.slow
def test_minilm_attends_to_special_tokens_that_contribute_little():
    """The bundled MiniLM: in every layer α puts more on [CLS] and [SEP] than they contribute (Kobayashi et
    al. 2020 and Mohebbi et al. 2023 find the same in BERT), by value zeroing and by ALTI; and ALTI's parts
    rebuild every attention block's output of the real model."""
    for method in ("value-zeroing", "alti"):
        result = attnviz.contributions(SENTENCE, method=method)
        assert all(r["alpha_on_special"] > r["contribution_on_special"] for r in result.records), method
    assert result.checks is not None and float(result.checks.max()) < 1e-6


# --- the contribution graph -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_the_strongest_paths_are_those_of_every_path_enumerated(seed):
    """Every path from an input token through L layers into the token, its weight the product of the
    matrices' entries along it, enumerated and sorted: the top ones are what strongest_paths keeps."""
    import itertools

    from attnviz.metrics import strongest_paths

    rng = np.random.default_rng(seed)
    L, T = 3, 5
    layers = rng.dirichlet(np.full(T, 0.5), size=(L, T))
    layers[1][:, 2] = 0  # a token that contributes nothing in one layer: no path through it there
    everything = sorted(((float(np.prod([layers[n][path[n + 1], path[n]] for n in range(L)])), path)
                         for path in (tuple(js) + (3,) for js in itertools.product(range(T), repeat=L))),
                        key=lambda pair: -pair[0])
    found = strongest_paths(layers, 3, top=6)
    assert [path for _, path in found] == [path for _, path in everything[:6]]
    np.testing.assert_allclose([w for w, _ in found], [w for w, _ in everything[:6]], rtol=1e-12)
    assert all(path[1] != 2 for _, path in found)  # (layer 1 takes nothing from token 2)


def test_the_graph_draws_every_edge_over_the_threshold(tiny_model_dir, tmp_path):
    from attnviz.render.charts import contribution_graph_figure

    result = attnviz.contributions(SENTENCE, model=tiny_model_dir("bert"))
    tokens = list(result.capture.tokens)
    figure, edges = contribution_graph_figure(result.scores, tokens, 0.1, result.paths(-2, 3), "t")
    assert edges == int((result.scores >= 0.1).sum())
    lines = [line for line in figure.axes[0].get_lines()]
    assert len(lines) == 3 and all(list(line.get_xdata())[-1] == len(tokens) - 2 for line in lines)
    shown = run("contributions", SENTENCE, "-m", tiny_model_dir("bert"), "--token", "it", "--graph",
                tmp_path / "graph.svg", "--threshold", "0.1", "--json")
    data = json.loads(shown.stdout)
    assert (tmp_path / "graph.svg").is_file() and data["paths_into"] == tokens.index("it")
    scores = np.array(data["scores"])
    for path in data["paths"]:
        product = np.prod([scores[n][path["tokens"][n + 1], path["tokens"][n]] for n in range(len(scores))])
        assert path["tokens"][-1] == tokens.index("it") and path["weight"] == pytest.approx(product, rel=1e-6)
    assert "--threshold" in one_line_error(run("contributions", SENTENCE, "-m", tiny_model_dir("bert"),
                                               "--threshold", "0"), 2)


# --- ALTI-Logit (attnviz logit-attr) ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3", "gpt_oss"])
def test_alti_logit_keeps_each_heads_effect_whole(kind, folders):
    """Each head's effect, traced back to the input tokens through ALTI's rows (each summing to 1), adds up to
    the head's direct effect: float32 rows of float64 sums, 1e-5 of the effect's scale. In layer 0 the tokens a
    head reads are the input tokens themselves: ALTI-Logit there is the split over sources, exactly."""
    result = attribute(folders(kind))
    assert result.by_input is not None and result.alti_note == ""
    scale = max(1.0, float(np.abs(result.heads).max()))
    np.testing.assert_allclose(result.by_input.sum(-1), result.heads, atol=1e-5 * scale)
    np.testing.assert_allclose(result.inputs.sum(), result.heads.sum(), atol=1e-5 * scale * result.heads.size)
    np.testing.assert_array_equal(result.by_input[0], result.by_source[0])
    assert np.abs(result.by_input[..., result.position + 1:]).max(initial=0) == 0  # causal: nothing from after


def test_alti_logit_is_every_path_through_the_layers_below_summed(folders):
    """Written out as paths, independently of the matrix products: token j_0's share of head (l, h) is the sum,
    over every path j_0 → j_1 → … → j_l of ALTI's contributions (a separate ALTI run, `attnviz.contributions`),
    of the product along the path times the head's effect through j_l."""
    import itertools

    folder = folders("gpt2")
    result = attribute(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scores = attnviz.contributions(TEXT, model=folder).scores.astype(np.float64)  # (L, T, T)
    L, H, T = result.by_input.shape
    for n in range(L):
        expected = np.zeros((H, T))
        for path in itertools.product(range(T), repeat=n + 1):  # (j_0, …, j_n): j_n is the token the head reads
            weight = np.prod([scores[m][path[m + 1], path[m]] for m in range(n)])
            expected[:, path[0]] += weight * result.by_source[n][:, path[-1]]
        np.testing.assert_allclose(result.by_input[n], expected, atol=1e-9)


def test_alti_logit_is_left_out_in_one_line_where_alti_does_not_apply(folders):
    """Cohere 2 runs attention and MLP side by side: the logit still splits into heads, ALTI does not, and the
    table says why instead of guessing."""
    result = attribute(folders("cohere2"))
    assert result.passed and result.by_input is None and result.inputs is None and "ALTI" in result.alti_note
    shown = run("logit-attr", TEXT, "-m", folders("cohere2"), env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "ALTI-Logit is left out: " in shown.stdout
    assert json.loads(run("logit-attr", TEXT, "-m", folders("cohere2"), "--json").stdout)["alti_logit"] is None


def test_alti_logit_from_the_command_line(folders, tmp_path):
    folder = folders("llama")
    data = json.loads(run("logit-attr", TEXT, "-m", folder, "--json").stdout)
    by_token = data["alti_logit"]["by_token"]
    assert len(by_token) == len(data["tokens"]) and sum(by_token) == pytest.approx(data["parts"]["heads"], abs=1e-4)
    assert all(len(e["inputs"]) == 3 and {i["token"] for i in e["inputs"]} <= set(data["tokens"]) for e in data["top"])
    shown = run("logit-attr", TEXT, "-m", folder, "-o", tmp_path / "la.png", env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and "Which input tokens push" in shown.stdout
    listed = [line.split() for line in shown.stdout.splitlines() if "through heads" in line]
    strongest = int(np.argmax(np.abs(by_token)))
    assert int(listed[0][0]) == strongest and float(listed[0][2]) == pytest.approx(by_token[strongest], abs=1e-3)
    figure = attribute(folder).figure()
    traced = [ax for ax in figure.axes if ax.get_title() == "ALTI-Logit: traced back to the input tokens"]
    assert len(traced) == 1 and traced[0].images[0].get_array().shape[0] == 1 + min(8, len(data["top"]))


# --- long inputs: ALTI streamed ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_streamed_alti_equals_the_full_path(kind, folders, tiny_model_dir):
    """Streamed, the model is not asked for its α and the parts are summed in float32: the contributions
    equal the full path's within float32 rounding of sums over T·H terms (1e-5), α's mean over heads (recomputed)
    equals the model's own mean within 1e-5, and every row still sums to 1."""
    folder = tiny_model_dir(kind) if kind == "bert" else folders(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = attnviz.contributions(SENTENCE, model=folder, stream=False)
        streamed = attnviz.contributions(SENTENCE, model=folder, stream=True)
    assert streamed.streamed and not full.streamed and streamed.alpha.n_heads == 1
    np.testing.assert_allclose(streamed.scores, full.scores, atol=1e-5)
    np.testing.assert_allclose(streamed.alpha.attentions[:, 0], full.alpha.attentions.mean(1), atol=1e-5)
    np.testing.assert_allclose(streamed.scores.sum(-1), 1.0, atol=1e-5)
    assert float(streamed.checks.max()) < 1e-5
    for a, b in zip(streamed.records, full.records):
        assert a["layer"] == b["layer"] and a["contribution_on_self"] == pytest.approx(b["contribution_on_self"],
                                                                                      abs=1e-5)


def test_a_long_input_streams_by_itself_and_is_refused_in_one_line_past_the_budget(tiny_model_dir, monkeypatch):
    """Past the memory budget the full path would take, ALTI streams without being asked (and says so);
    past what even the streamed path holds, one line states the formula. Value zeroing does not stream."""
    from attnviz.engine.models import load
    from attnviz.engine.memory import alti_bytes

    folder = tiny_model_dir("bert")
    loaded = load(folder, device="cpu")
    T = len(attnviz.contributions(SENTENCE, model=folder).capture.tokens)
    between = (alti_bytes(loaded, T, True) + alti_bytes(loaded, T, False)) // 2
    assert alti_bytes(loaded, T, True) < between < alti_bytes(loaded, T, False)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", str(between))
    assert attnviz.contributions(SENTENCE, model=folder).streamed
    shown = run("contributions", SENTENCE, "-m", folder, env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "Streamed (" in shown.stdout
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", str(alti_bytes(loaded, T, True) - 1))
    assert "even streamed" in one_line_error(run("contributions", SENTENCE, "-m", folder))
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET")
    assert "does not stream" in one_line_error(run("contributions", SENTENCE, "-m", folder, "--method",
                                                   "value-zeroing", "--stream"))


def test_rollout_rows_and_what_json_and_the_graph_leave_out(tiny_model_dir, monkeypatch):
    """rollout(rows), multiplied from the top down, equals those rows of the full rollout; --json leaves out
    matrices past JSON_MAX_CELLS and says so; the graph refuses more tokens than it can draw, in one line."""
    from attnviz.api.attribution import contributions as attribution

    result = attnviz.contributions(SENTENCE, model=tiny_model_dir("bert"))
    rows = [0, 3, -1]
    np.testing.assert_allclose(result.rollout(rows), result.rollout()[rows], atol=1e-12)
    with pytest.raises(attnviz.AttnvizError, match="out of range"):
        result.rollout([99])
    monkeypatch.setattr(attribution, "JSON_MAX_CELLS", 10)
    data = result.to_dict()
    assert "scores" not in data and "rollout" not in data and "attnviz.contributions" in data["omitted"]
    monkeypatch.setattr(attribution, "MAX_GRAPH_TOKENS", 5)
    with pytest.raises(attnviz.AttnvizError, match="at most 5"):
        result.graph()


@pytest.mark.parametrize("seed", range(3))
def test_the_strongest_paths_of_a_larger_graph_are_those_kept_by_every_prefix(seed):
    """Beside the enumeration above, a graph too large to enumerate (30 tokens, 5 layers): every level keeping
    every token's strongest prefixes from all T·top candidates, written out here, finds the same paths."""
    from attnviz.metrics import strongest_paths

    rng = np.random.default_rng(seed)
    L, T, top = 5, 30, 7
    layers = rng.dirichlet(np.full(T, 0.3), size=(L, T))
    best = [[(1.0, (j,))] for j in range(T)]
    for layer in layers:
        best = [sorted(((w * layer[i, j], (*p, i)) for j in range(T) for w, p in best[j]), key=lambda x: -x[0])[:top]
                for i in range(T)]
    found = strongest_paths(layers, 11, top)
    np.testing.assert_allclose([w for w, _ in found], [w for w, _ in best[11]], rtol=1e-12)
    assert [p for _, p in found] == [p for _, p in best[11]]
