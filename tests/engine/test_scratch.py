"""The from-scratch path: the textbook core, and every adapter against the eager model."""

import math

import numpy as np
import pytest
import torch
from helpers import SENTENCE

from attnviz.engine.forward import encode
from attnviz.engine.scratch.adapters import adapter_for, rotary_cos_sin
from attnviz.engine.scratch.formula import attention_mask, scaled_dot_product_attention
from attnviz.engine.scratch.scaling import scaling_rows, synthetic_scaling
from attnviz.engine.scratch.verify import capture_both, recompute, scratch_attentions
from attnviz.engine.models import load
from attnviz.errors import UnsupportedArchitectureError
from attnviz.metrics import differences

FAMILIES = ["bert", "roberta", "electra", "distilbert", "gpt2", "llama", "mistral", "qwen2"]
TEXT = SENTENCE + ", and the dog ran in the park!"


def test_core_rows_sum_to_one_and_hand_example():
    # 4 tokens, d_k = 8: token 0's query matches key 2 strongly
    q = torch.zeros(4, 8)
    k = torch.zeros(4, 8)
    q[0, 0] = 2.0
    k[2, 0] = 2.0 * math.sqrt(8)  # q0·k2 = 4√8, scaled: 4
    v = torch.eye(4, 8)
    out, alpha = scaled_dot_product_attention(q, k, v)
    expected_row0 = torch.tensor([1.0, 1.0, math.e ** 4, 1.0]) / (3 + math.e ** 4)
    torch.testing.assert_close(alpha[0], expected_row0)
    torch.testing.assert_close(alpha[1], torch.full((4,), 0.25))  # zero query: uniform
    torch.testing.assert_close(out[0], expected_row0 @ v)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(4))


@pytest.mark.parametrize("causal", [False, True])
def test_core_matches_torch_sdpa(causal):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.tril(torch.ones(7, 7, dtype=torch.bool)) if causal else None
    out, alpha = scaled_dot_product_attention(q, k, v, mask)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, expected)
    if causal:
        assert torch.all(alpha.triu(1) == 0)


def test_core_fully_masked_row_gives_zeros_not_nan():
    q, k, v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    out, alpha = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(alpha).all() and torch.isfinite(out).all()
    assert torch.all(alpha[1] == 0) and torch.all(out[1] == 0)
    torch.testing.assert_close(alpha[[0, 2]].sum(-1), torch.ones(2))
    bias = torch.zeros(3, 3)
    bias[2] = float("-inf")  # a bias that hides every key of row 2, no mask
    _, alpha = scaled_dot_product_attention(q, k, v, bias=bias)
    assert torch.isfinite(alpha).all() and torch.all(alpha[2] == 0)
    torch.testing.assert_close(alpha[:2], torch.softmax(q[:2] @ k.T / 2.0, dim=-1))


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_the_fused_softmax_equals_the_written_out_formula(softcap):
    """The streamed path's fused softmax (torch's kernel) gives the written-out exp / sum's weights to 1e-6,
    a row with every key masked 0 in both, with a mask and a bias; verify keeps the written-out one."""
    from attnviz.engine.scratch.formula import attention_weights

    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 6, 8, generator=gen), torch.randn(2, 3, 9, 8, generator=gen)
    mask = torch.rand(2, 1, 6, 9, generator=gen) > 0.3
    mask[0, 0, 2] = False  # a row that sees nothing
    bias = torch.randn(3, 6, 9, generator=gen)
    for kwargs in ({}, {"mask": mask}, {"bias": bias}, {"mask": mask, "bias": bias}):
        written = attention_weights(q, k, scale=0.3, softcap=softcap, **kwargs)
        fused = attention_weights(q, k, scale=0.3, softcap=softcap, fused=True, **kwargs)
        assert torch.isfinite(fused).all()
        torch.testing.assert_close(fused, written, atol=1e-6, rtol=0)
    assert torch.all(attention_weights(q, k, mask=mask, fused=True)[0, :, 2] == 0)


def test_rotary_matches_the_formula():
    cos, sin = rotary_cos_sin(torch.arange(5), head_dim=4, theta=100.0)
    # pair 0 rotates at 1 rad per position, pair 1 at 1/100^(2/4) = 0.1 rad
    torch.testing.assert_close(cos[3], torch.tensor([math.cos(3), math.cos(0.3), math.cos(3), math.cos(0.3)],
                                                    dtype=torch.float64))
    torch.testing.assert_close(sin[2, 1], torch.tensor(math.sin(0.2), dtype=torch.float64))


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_matches_eager_model(family, load_tiny):
    loaded = load_tiny(family)
    reported, recomputed = capture_both(loaded, TEXT)
    assert recomputed.meta["source"] == "scratch"
    assert reported.attentions.max(axis=-1).mean() > 0.5  # peaked: a wrong detail would show
    worst = max(d.max_abs for d in differences(reported, recomputed))
    assert worst <= 1e-5, f"{family}: max |Δα| = {worst:.2e}"


@pytest.mark.slow
def test_bundled_minilm_matches(minilm):
    reported, recomputed = capture_both(minilm, SENTENCE)
    assert max(d.max_abs for d in differences(reported, recomputed)) <= 1e-5


def test_a_wrong_rotary_base_is_caught(load_tiny, monkeypatch):
    """The comparison can fail: recompute Llama with a different RoPE theta and the difference is large."""
    loaded = load_tiny("llama")
    monkeypatch.setitem(loaded.model.config.rope_parameters, "rope_theta", 17.0)
    reported, recomputed = capture_both(loaded, TEXT)
    assert max(d.max_abs for d in differences(reported, recomputed)) > 1e-2


def test_gpt2_causal_mask_is_needed(load_tiny, monkeypatch):
    from attnviz.engine.scratch import adapters as scratch

    loaded = load_tiny("gpt2")
    monkeypatch.setattr(scratch.GPT2Adapter, "causal", False)
    encoded = encode(loaded, TEXT)
    recomputed, reported, _ = scratch_attentions(loaded.model, encoded.inputs)
    assert np.abs(recomputed - reported).max() > 1e-2


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_padding_is_honoured(family, load_tiny):
    """A padded batch gives, for the real tokens, the same α as the text alone."""
    loaded = load_tiny(family)
    tok = loaded.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    texts = ["The cat sat", TEXT]
    batch = tok(texts, return_tensors="pt", padding=True)
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if family != "bert":
        inputs.pop("token_type_ids", None)
    alone = tok(texts[0], return_tensors="pt")
    alone = {k: v for k, v in alone.items() if k in inputs}
    batch_scratch, batch_model, _ = scratch_attentions(loaded.model, inputs)  # (L, 2, H, T, T)
    alone_scratch, _, _ = scratch_attentions(loaded.model, alone)  # (L, 1, H, n, n)
    n = alone["input_ids"].shape[1]
    assert batch["attention_mask"][0].sum() == n and tok.padding_side == "right"
    np.testing.assert_allclose(batch_scratch[:, 0, :, :n, :n], alone_scratch[:, 0], atol=1e-5)
    np.testing.assert_allclose(batch_scratch[:, 0, :, :n, n:], 0.0)  # nothing on padding
    np.testing.assert_allclose(batch_scratch[:, 0, :, :n], batch_model[:, 0, :, :n], atol=1e-5)


def test_unsupported_architecture_lists_supported(load_tiny):
    import transformers as tf

    model = tf.AlbertModel(tf.AlbertConfig(vocab_size=50, hidden_size=16, num_attention_heads=2,
                                           intermediate_size=32, num_hidden_layers=1, embedding_size=8))
    with pytest.raises(UnsupportedArchitectureError, match="no adapter for .albert.*capture works"):
        recompute(model, {"input_ids": torch.tensor([[1, 2, 3]])})
    from attnviz.engine.families import family_of

    assert all(family_of(kind).verify for kind in FAMILIES)  # the families recomputed above say verify works
    assert type(adapter_for(load_tiny("llama").model)).__name__ == family_of("llama").adapter


def test_attention_mask_shapes():
    mask = attention_mask(torch.tensor([[1, 1, 0]]), causal=True)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert attention_mask(torch.ones(1, 4), causal=True, window=2)[0, 0, 3].tolist() == [False, False, True, True]


def test_synthetic_scaling_is_sqrt_dk():
    raw, scaled = synthetic_scaling(64)
    assert abs(raw - 8.0) < 0.1 and abs(scaled - 1.0) < 0.02


@pytest.mark.slow
def test_scaling_on_real_weights(minilm):
    rows, T, d_k = scaling_rows(minilm, SENTENCE)
    assert (T, d_k, len(rows)) == (8, 32, 6)
    for r in rows:
        assert r.std_raw == pytest.approx(r.std_scaled * math.sqrt(d_k), rel=1e-4)
        assert r.entropy_raw < r.entropy_scaled <= math.log(T)  # unscaled softmax is sharper
        assert r.max_raw > r.max_scaled


def test_position_information_breaks_permutation_equivariance(tiny_model_dir):
    """Self-attention alone sees a set: with position embeddings zeroed, permuting the input permutes α
    the same way. With positions, it does not."""
    loaded = load(tiny_model_dir("bert"), device="cpu")
    model = loaded.model
    ids = loaded.tokenizer(TEXT, return_tensors="pt")["input_ids"]
    perm = torch.randperm(ids.shape[1], generator=torch.Generator().manual_seed(3))

    def alpha(input_ids):
        with torch.inference_mode():
            out = model(input_ids=input_ids, output_attentions=True)
        return torch.stack(out.attentions)[:, 0].numpy()  # (L, H, T, T)

    with_positions = alpha(ids[:, perm])
    assert np.abs(with_positions - alpha(ids)[..., perm, :][..., perm]).max() > 1e-2
    saved = model.embeddings.position_embeddings.weight.detach().clone()
    try:
        with torch.no_grad():
            model.embeddings.position_embeddings.weight.zero_()
        base = alpha(ids)
        np.testing.assert_allclose(alpha(ids[:, perm]), base[..., perm, :][..., perm], atol=1e-5)
    finally:
        with torch.no_grad():
            model.embeddings.position_embeddings.weight.copy_(saved)


@pytest.mark.parametrize("flags", [{"scale_attn_by_inverse_layer_idx": True}, {"scale_attn_weights": False},
                                   {"reorder_and_upcast_attn": True}])
def test_gpt2_variants(flags, tiny_model_dir):
    """GPT-2's optional scalings are applied by the adapter, not ignored."""
    import transformers as tf

    base = load(tiny_model_dir("gpt2"), device="cpu")
    config = tf.GPT2Config.from_dict({**base.model.config.to_dict(), **flags})
    config._attn_implementation = "eager"
    model = tf.GPT2Model(config)
    model.load_state_dict(base.model.state_dict())
    model.eval()
    encoded = encode(base, TEXT)
    recomputed, reported, _ = scratch_attentions(model, encoded.inputs)
    assert np.abs(recomputed - reported).max() <= 1e-5


def test_a_model_without_eager_attention_is_a_clear_error(load_tiny):
    import transformers as tf

    from attnviz.errors import AttentionCheckError

    config = tf.BertConfig.from_dict(load_tiny("bert").model.config.to_dict())
    config._attn_implementation = "sdpa"  # what transformers 5 picks by default: no weights come back
    model = tf.BertModel(config).eval()
    with pytest.raises(AttentionCheckError, match="eager"):
        scratch_attentions(model, {"input_ids": torch.tensor([[101, 1996, 4937, 102]])})
