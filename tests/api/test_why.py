"""attnviz why: a head's score split into query-side × key-side parts — the terms add up to the score, with
--versus to log α − log α' of the model's own α, the parts to HF's hidden states, and one term recomputed by hand
(Llama's formula: RMSNorm frozen, W_Q and W_K, rotary positions from transformers' own functions)."""

from __future__ import annotations

import json
import math

import numpy as np

import pytest
import torch

import attnviz
from attnviz.base.records import to_json
from helpers import one_line_error, run

TEXT = "the cat sat on the mat and the cat sat"


def model_alpha(m) -> np.ndarray:
    """The model's own α of TEXT, (L, H, T, T) float64: what the log ratios are checked against."""
    encoded = m.tokenizer(TEXT, return_tensors="pt")
    with torch.inference_mode():
        return torch.stack(m.model(**encoded, output_attentions=True).attentions)[:, 0].double().numpy()


@pytest.mark.parametrize("kind", ["llama", "gpt2", "bert", "roberta"])
def test_the_terms_add_up_to_the_score_and_versus_to_the_log_ratio(kind, tiny_lm_dir, tiny_model_dir):
    folder = tiny_lm_dir(kind) if kind in ("llama", "gpt2") else tiny_model_dir(kind)
    m = attnviz.load_model(folder, lm_head=kind in ("llama", "gpt2"))
    alpha = model_alpha(m)
    L, H = m.shape
    T = alpha.shape[-1]
    for layer in range(L):
        for head in range(H):
            result = attnviz.why(TEXT, model=m, layer=layer, head=head, query=T - 1, key=2, versus=5)
            assert result.diff <= attnviz.WHY_TOLERANCE * max(1.0, abs(result.score))
            ratio = math.log(alpha[layer, head, T - 1, 2]) - math.log(alpha[layer, head, T - 1, 5])
            assert abs(result.sum - ratio) <= 1e-4 * max(1.0, abs(ratio)), (layer, head)
            assert abs(result.alphas[0] - alpha[layer, head, T - 1, 2]) <= 1e-5
            parts = set(result.query_names)
            assert {f"{n}.{h}" for n in range(layer) for h in range(H)} <= parts
            expected = {"gpt2": {"tokens", "positions"}, "llama": {"embed"}}.get(kind, {"tokens", "positions",
                                                                                        "segments"})
            assert expected <= parts
    js = result.to_dict()
    assert json.loads(json.dumps(js)) == js and js["versus"] == 5 and len(js["terms"]) == 10
    assert attnviz.why(TEXT, model=m).query == (T - 1 if kind in ("llama", "gpt2") else T - 2)  # [SEP] left out
    values = [abs(t["value"]) for t in js["terms"]]
    assert values == sorted(values, reverse=True)
    assert abs(sum(js["query_side"].values()) - result.sum) <= 1e-9 * max(1.0, abs(result.sum))


@pytest.fixture(scope="module")
def todays(tmp_path_factory):
    from helpers import build_tiny_model

    made: dict[str, str] = {}

    def get(kind: str) -> str:
        if kind not in made:
            made[kind] = str(build_tiny_model(kind, tmp_path_factory.mktemp(kind) / kind))
        return made[kind]
    return get


@pytest.mark.parametrize("kind", ["gemma2", "gemma3", "qwen3", "phi3", "mistral-window", "cohere2", "smollm3"])
def test_todays_families_split_exactly_and_gemma2_before_its_cap(kind, todays):
    """Every head of today's families (sliding windows, QK-norm, grouped heads, Gemma 2's soft-cap): the terms add
    up to the score; with --versus, the score after the cap (the score itself without one) is log α − log α' of
    the model's own α, the two keys inside every window."""
    m = attnviz.load_model(todays(kind))
    alpha = model_alpha(m)
    L, H = m.shape
    T = alpha.shape[-1]
    for layer in range(L):
        for head in range(H):
            result = attnviz.why(TEXT, model=m, layer=layer, head=head, query=T - 1, key=T - 2, versus=T - 3)
            assert result.diff <= attnviz.WHY_TOLERANCE * max(1.0, abs(result.score)), (layer, head)
            ratio = math.log(alpha[layer, head, T - 1, T - 2]) - math.log(alpha[layer, head, T - 1, T - 3])
            assert abs(result.capped - ratio) <= 1e-4 * max(1.0, abs(ratio)), (layer, head)
    assert (result.softcap is not None) == (kind == "gemma2")
    said = " ".join(str(line) for line in result.report())
    assert ("split before the soft-cap" in said) == (kind == "gemma2")
    if kind == "gemma2":
        assert abs(result.capped - result.sum) > 1e-3  # the cap changes the difference: it is not the sum


def test_families_not_split_are_refused_in_one_line(todays):
    for kind, words in (("olmo2", "norms its whole Q and K"), ("gpt_oss", "yarn")):
        assert words in one_line_error(run("why", TEXT, "-m", todays(kind)), 1)


def test_one_term_recomputed_by_hand(tiny_lm_dir):
    """Llama, layer 1: the (embed, embed) term is W_Q·(γ ⊙ e_I / rms(x_I)) rotated at I, dotted with the same at
    J for K, over √d (the embeddings are HF's hidden_states[0], the stream HF's hidden_states[1])."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    m = attnviz.load_model(tiny_lm_dir("llama"), lm_head=True)
    encoded = m.tokenizer(TEXT, return_tensors="pt")
    T = encoded["input_ids"].shape[1]
    q_at, k_at, layer, head = T - 1, 3, 1, 0
    result = attnviz.why(TEXT, model=m, layer=layer, head=head, query=q_at, key=k_at)
    llama = m.model.model
    with torch.inference_mode():
        out = m.model(**encoded, output_hidden_states=True)
        x = out.hidden_states[layer][0].double()  # (T, D) entering `layer`
        e = out.hidden_states[0][0].double()  # the embeddings
        block = llama.layers[layer]
        norm = block.input_layernorm
        rms = torch.sqrt((x * x).mean(-1) + norm.variance_epsilon)  # (T,)
        attn = block.self_attn
        d = attn.head_dim
        kv = head // (attn.config.num_attention_heads // attn.config.num_key_value_heads)
        wq = attn.q_proj.weight.double()[head * d:(head + 1) * d]
        wk = attn.k_proj.weight.double()[kv * d:(kv + 1) * d]
        q = wq @ (norm.weight.double() * e[q_at] / rms[q_at])
        k = wk @ (norm.weight.double() * e[k_at] / rms[k_at])
        cos, sin = llama.rotary_emb(out.hidden_states[0], torch.arange(T)[None])
        q_rot, _ = apply_rotary_pos_emb(q[None, None, None].float(), q[None, None, None].float(), cos[:, q_at:q_at + 1],
                                        sin[:, q_at:q_at + 1])
        _, k_rot = apply_rotary_pos_emb(k[None, None, None].float(), k[None, None, None].float(), cos[:, k_at:k_at + 1],
                                        sin[:, k_at:k_at + 1])
        by_hand = float(q_rot.double().flatten() @ k_rot.double().flatten()) / math.sqrt(d)
    term = result.terms[result.query_names.index("embed"), result.key_names.index("embed")]
    assert abs(term - by_hand) <= 1e-5 * max(1.0, abs(by_hand))
    assert {"0.0", "0.1", "mlp 0"} <= set(result.query_names)
    assert not any(n.startswith("bias") for n in result.query_names)  # Llama has no biases here: none listed


def test_the_run_reads_its_pass_and_each_input_path_gives_the_json(tiny_lm_dir, tmp_path):
    folder = tiny_lm_dir("llama")
    m = attnviz.load(folder)
    r = m.run(TEXT)
    r.heads()
    on_run = r.why(layer=1, head=1)
    assert r.passes == 1
    expected = json.loads(to_json(attnviz.why(TEXT, model=folder, layer=1, head=1).to_dict()))
    assert json.loads(to_json(on_run.to_dict())) == expected
    assert "the first token (a sink) left out" in on_run.default_key and expected["key"] != 0
    file = tmp_path / "t.txt"
    file.write_text(TEXT, encoding="utf-8")
    for args, stdin in (([TEXT], None), (["-"], TEXT), (["--text-file", file], None)):
        printed = run("why", *args, "-m", folder, "-l", "1", "-H", "1", "--json", input=stdin)
        assert printed.exit_code == 0, printed.output
        assert json.loads(printed.stdout) == expected
    drawn = run("why", TEXT, "-m", folder, "-l", "1", "-H", "1", "--key", "cat#1", "-o", tmp_path / "w.png")
    assert drawn.exit_code == 0 and "Σ terms" in drawn.stdout and (tmp_path / "w.png").read_bytes()[:4] == b"\x89PNG"


def test_refusals_are_one_line(tiny_model_dir, tiny_lm_dir):
    folder = tiny_lm_dir("llama")
    assert "comes after" in one_line_error(run("why", TEXT, "-m", folder, "--query", "2", "--key", "5"), 1)
    assert "layer 9 is out of range" in one_line_error(run("why", TEXT, "-m", folder, "-l", "9"), 2)
    assert "no token 'dog'" in one_line_error(run("why", TEXT, "-m", folder, "--key", "dog"), 2)
    assert "--top" in one_line_error(run("why", TEXT, "-m", folder, "--top", "0"), 2)
    line = one_line_error(run("why", TEXT, "-m", tiny_model_dir("distilbert")), 1)
    assert "not DistilBertModel's" in line


def test_a_key_side_built_by_hand_to_read_one_head_names_that_head(tiny_lm_dir):
    """Layer 1 head 0's keys read only the first 4 dimensions of the stream, and only head 0.1 writes there (the
    embeddings, the MLP and the other heads of layer 0 write nothing there): 0.1 is the whole key side."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_lm_dir("llama")
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    layers = model.model.layers
    d = layers[0].self_attn.head_dim
    with torch.no_grad():
        model.model.embed_tokens.weight[:, :4] = 0.0
        layers[0].mlp.down_proj.weight.zero_()
        o = layers[0].self_attn.o_proj.weight  # (D, H·d): column block h is head h's slice of W_O
        o[:4] = 0.0
        o[:4, d:2 * d] = torch.randn(4, d) * 2.0  # head 0.1 alone writes into dimensions 0..3
        layers[1].self_attn.k_proj.weight[:, 4:] = 0.0  # the keys of layer 1 read dimensions 0..3 only
    result = attnviz.why(TEXT, model=model, tokenizer=tokenizer, layer=1, head=0, query=8, key=3)
    key_side = result.side("key")
    assert key_side[0][0] == "0.1" and abs(key_side[0][1] - result.sum) <= 1e-6 * max(1.0, abs(result.sum))
    assert all(abs(v) <= 1e-9 for name, v in key_side[1:])
    assert result.diff <= attnviz.WHY_TOLERANCE * max(1.0, abs(result.score))


@pytest.mark.slow
def test_the_guides_case_on_smollm2():
    """docs/guide/why.md: head 17.4 attends from the last 'the' to 'mat' rather than 'park'; its key side's top
    part is 16.0, a previous-token head; and of every earlier head, 16.0 is the one whose output 17.4's keys read
    most by the weights alone (circuits' K-composition). The lens there: ' Paris' rank 2 after block 28, the top
    token after the last block."""
    from attnviz.engine import offline
    from helpers import require_real

    require_real(offline.SMOLLM2)
    m = attnviz.load("smollm2")
    text = "The cat sat on the mat. The dog ran to the park. The cat sat on the"
    r = m.run(text)
    result = r.why(layer=17, head=4, key="mat", versus="park")
    assert result.diff <= attnviz.WHY_TOLERANCE * max(1.0, abs(result.score))
    top, value = result.side("key")[0]
    assert top == "16.0" and result.labels.get("16.0") == "previous-token" and value > 3.0
    composition = m.circuits(tokens=200).composition["k"][:, :, 17, 4]  # (sender layer, head) -> 17.4's keys
    assert np.unravel_index(np.nanargmax(composition), composition.shape) == (16, 0)
    lens = m.run("The capital of France is").lens(target=" Paris")
    assert list(lens.target_rank[-2:, 0]) == [2, 0] and lens.target_p[-1, 0] > 0.5


@pytest.mark.parametrize("name", [pytest.param("gemma3", marks=pytest.mark.slow),
                                  pytest.param("qwen2.5-coder-0.5b", marks=pytest.mark.slow), "minilm",
                                  pytest.param("multilingual", marks=pytest.mark.slow)])
def test_real_models_split_exactly(name):
    """Gemma 3 (QK-norm frozen at its own scale, the norms after attention and MLP), Qwen2.5-Coder 0.5B (biases on
    Q and K), MiniLM and the multilingual XLM-R model (post-norm: every part carried through each block's two
    LayerNorms; the embeddings split into tokens, positions, segments): Σ terms = s − s' = log α − log α' of the
    model's own α, in a middle and the last layer."""
    from attnviz.engine import offline
    from helpers import require_real

    require_real({"gemma3": offline.GEMMA3, "qwen2.5-coder-0.5b": offline.QWEN_CODER_05, "minilm": offline.MINILM,
                  "multilingual": offline.MULTILINGUAL}[name])
    m = attnviz.load(name)
    r = m.run("The cat sat on the mat. The cat sat on the")
    alpha = r.capture.attentions.astype(np.float64)
    T = alpha.shape[-1]
    query = T - 1 if m.causal else T - 2  # an encoder's last token is [SEP]
    for layer, head in ((m.shape[0] // 2, 1), (m.shape[0] - 1, 0)):
        result = r.why(layer=layer, head=head, query=query, key=3, versus=2)
        expected = math.log(alpha[layer, head, query, 3]) - math.log(alpha[layer, head, query, 2])
        assert abs(result.sum - expected) <= 1e-3 * max(1.0, abs(expected)), (layer, head, result.sum, expected)
        assert result.diff <= attnviz.WHY_TOLERANCE * max(1.0, abs(result.score))
    assert r.passes == 1
