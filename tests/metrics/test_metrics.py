"""Metrics on hand-made α with known answers, and on the real bundled model."""

import math

import numpy as np
import pytest
from helpers import make_capture

from attnviz import metrics


def one_head(alpha, **kwargs):
    alpha = np.asarray(alpha, dtype=np.float32)
    return make_capture(alpha[None, None], **kwargs)


def shifted_identity(T, offset):
    a = np.zeros((T, T), np.float32)
    for i in range(T):
        a[i, min(max(i + offset, 0), T - 1)] = 1.0
    return a


def test_uniform_rows_have_entropy_ln_T():
    T = 6
    cap = one_head(np.full((T, T), 1 / T))
    assert metrics.entropy(cap)[0, 0] == pytest.approx(math.log(T), rel=1e-6)
    assert metrics.normalised_entropy(cap)[0, 0] == pytest.approx(1.0, rel=1e-6)
    assert metrics.max_weight(cap)[0, 0] == pytest.approx(1 / T)
    assert metrics.head_records(cap)[0]["label"] == "broad"


def test_one_hot_previous_token_head():
    cap = one_head(shifted_identity(6, -1))
    stats = metrics.head_records(cap)[0]
    assert stats["label"] == "previous-token"
    assert stats["entropy"] == 0.0 and stats["prev"] == pytest.approx(1.0) and stats["next"] == 0.0
    assert stats["mean_distance"] == pytest.approx(5 / 6)  # row 0 attends to itself


def test_next_token_and_self_heads():
    assert metrics.head_records(one_head(shifted_identity(5, +1)))[0]["label"] == "next-token"
    assert metrics.head_records(one_head(np.eye(5)))[0]["label"] == "self"


def test_all_mass_on_column_zero_is_vertical_and_first_token_mass():
    a = np.zeros((5, 5), np.float32)
    a[:, 0] = 1.0
    cap = one_head(a, tokens=["[CLS]", "a", "b", "c", "[SEP]"], special=[True, False, False, False, True],
                   kinds=["start", "", "", "", "end"])
    stats = metrics.head_records(cap)[0]
    assert stats["label"] == "vertical" and stats["top_key"] == "[CLS]"
    assert stats["start_mass"] == 1.0 and stats["first_mass"] == 1.0 and stats["end_mass"] == 0.0


def test_block_head_needs_two_segments():
    tokens = ["[CLS]", "a", "b", ".", "c", "d", "[SEP]"]
    seg = metrics.segments(one_head(np.eye(7), tokens=tokens))
    assert seg.tolist() == [0, 0, 0, 0, 1, 1, 1]
    a = (seg[:, None] == seg[None, :]).astype(np.float32)
    a /= a.sum(-1, keepdims=True)
    cap = one_head(a, tokens=tokens, special=[True] + [False] * 5 + [True], kinds=["start"] + [""] * 5 + ["end"])
    assert metrics.head_records(cap)[0]["label"] == "block"
    assert np.isnan(metrics.block_score(one_head(np.full((3, 3), 1 / 3)))[0, 0])


def test_punctuation_mass():
    a = np.zeros((4, 4), np.float32)
    a[:, 2] = 1.0
    cap = one_head(a, tokens=["hi", "there", "!", "ok"])
    assert metrics.head_records(cap)[0]["punct_mass"] == 1.0


def test_causal_normalisation_uses_i_plus_one_keys():
    T = 5
    tril = np.tril(np.ones((T, T), np.float32))
    cap = one_head(tril / tril.sum(-1, keepdims=True), causal=True)  # uniform over the allowed keys
    assert metrics.normalised_entropy(cap)[0, 0] == pytest.approx(1.0, rel=1e-6)
    expected = np.mean([math.log(i + 1) for i in range(T)])
    assert metrics.entropy(cap)[0, 0] == pytest.approx(expected, rel=1e-6)


def test_rollout_of_identity_is_identity_and_rows_sum_to_one():
    cap = make_capture(np.broadcast_to(np.eye(4, dtype=np.float32), (3, 2, 4, 4)))
    np.testing.assert_allclose(metrics.rollout(cap), np.eye(4))
    rng = np.random.default_rng(0)
    cap = make_capture(rng.dirichlet(np.ones(5), size=(3, 2, 5)))
    np.testing.assert_allclose(metrics.rollout(cap).sum(-1), 1.0)


def test_rollout_two_layers_by_hand():
    a = np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)  # everyone looks at token 0
    cap = make_capture(np.broadcast_to(a, (2, 1, 2, 2)))
    step = np.array([[1.0, 0.0], [0.5, 0.5]])  # (a + I) row-normalised
    np.testing.assert_allclose(metrics.rollout(cap), step @ step)


def test_metrics_do_not_mutate():
    rng = np.random.default_rng(1)
    cap = make_capture(rng.dirichlet(np.ones(6), size=(2, 3, 6)))
    before = cap.attentions.copy()
    metrics.head_records(cap), metrics.rollout(cap)
    np.testing.assert_array_equal(cap.attentions, before)


@pytest.mark.slow
def test_minilm_layer0_head2_is_previous_token(cat_capture):
    stats = {(s["layer"], s["head"]): s for s in metrics.head_records(cat_capture)}
    assert stats[0, 2]["label"] == "previous-token" and stats[0, 2]["prev"] > 0.99
    labels = [s["label"] for s in stats.values() if s["layer"] == 0]
    assert labels.count("previous-token") == 1


def test_float32_rows_give_the_float64_statistics_of_long_rows():
    """The streamed and corpus paths fold float32 rows: the entropy and the weights in [0, 1] summed in float32,
    distances in float64. On rows of 4,096 keys (peaked and flat, some keys masked) every row statistic stays
    within 1e-6 of the same rows made float64 first, and distances within 1e-9; each weighted sum also matches
    its definition written out."""
    from attnviz.metrics import WEIGHTINGS, Rows, Tokens

    rng = np.random.default_rng(3)
    T, H, b = 4096, 3, 7
    words = ["the", "cat", ".", "sat", "on", "mat", "[SEP]"]
    tokens = Tokens(tuple(words[i % len(words)] for i in range(T)), np.array([i % 7 == 6 for i in range(T)]),
                    np.array(["end" if i % 7 == 6 else "" for i in range(T)]), False,
                    ids=tuple(i % len(words) for i in range(T)))
    logits = rng.normal(size=(H, b, T)) * np.array([0.5, 3.0, 8.0])[:, None, None]
    logits[:, :, rng.random(T) < 0.3] = -np.inf  # masked keys: weight exactly 0
    alpha32 = np.exp(logits - logits.max(-1, keepdims=True)).astype(np.float32)
    alpha32 /= alpha32.sum(-1, keepdims=True)
    alpha64 = alpha32.astype(np.float64)
    queries = np.arange(2000, 2000 + b)
    low, high = Rows(alpha32, queries, tokens), Rows(alpha64, queries, tokens)
    np.testing.assert_allclose(low.entropy, high.entropy, rtol=0, atol=1e-6)
    by_hand = -np.where(alpha64 > 0, alpha64 * np.log(np.where(alpha64 > 0, alpha64, 1)), 0).sum(-1)
    np.testing.assert_allclose(high.entropy, by_hand, rtol=0, atol=1e-9)
    for k, weighting in enumerate(WEIGHTINGS):
        weights = np.broadcast_to(np.asarray(weighting.weights(tokens, queries), np.float64), (b, T))
        want = np.einsum("hbt,bt->hb", alpha64, weights)
        np.testing.assert_allclose(high.weighted[..., k], want, rtol=0, atol=1e-9, err_msg=weighting.name)
        np.testing.assert_allclose(low.weighted[..., k], want, rtol=0, atol=1e-9 if weighting.wide else 1e-6,
                                   err_msg=weighting.name)


def test_row_block_sums_equal_reduceat():
    from attnviz.base.blocks import sum_blocks, sum_row_blocks

    x = np.random.default_rng(0).random((3, 11, 5)).astype(np.float32)
    edges = np.array([0, 2, 3, 9, 11])
    np.testing.assert_allclose(sum_row_blocks(x, edges), sum_blocks(x, edges, 1), rtol=1e-6)
    assert sum_row_blocks(x, edges).dtype == np.float32
    part = np.array([2, 3, 9])  # edges that start past row 0 and end before the last row
    np.testing.assert_allclose(sum_row_blocks(x, part), np.stack([x[:, 2], x[:, 3:9].sum(1)], 1), rtol=1e-6)


def _with_ids(alpha, tokens):
    """A hand-made capture whose token ids say which tokens are the same."""
    from dataclasses import replace

    ids = {token: n for n, token in enumerate(dict.fromkeys(tokens))}
    return replace(make_capture(alpha, tokens), token_ids=np.array([ids[t] for t in tokens]))


def _induction_rows(tokens: list[str]) -> np.ndarray:
    """Each row's weight on the key after the latest earlier occurrence of its token (else on itself). (T, T)"""
    T = len(tokens)
    alpha = np.zeros((T, T), np.float32)
    for i, token in enumerate(tokens):
        earlier = [j for j in range(i) if tokens[j] == token and j + 1 <= i]
        alpha[i, earlier[-1] + 1 if earlier else i] = 1.0
    return alpha


def test_an_induction_label_needs_enough_repeats_and_no_stripe():
    """A head that follows earlier occurrences is labelled induction when the text has at least MIN_REPEATS
    repeated tokens; a stripe on one key (vertical) stays vertical although its few repeated rows look like
    induction; with fewer repeats induct and dup are not tested (NaN) and the note says so."""
    tokens = ["a", "b", "a", "a", "a", "a", "x", "a"]  # 5 tokens occurred before, each an "a"
    stripe = np.full((8, 8), 0.02, np.float32)
    stripe[:, 1] = 0.86  # every row mostly on key 1 ("b"): after the first "a", so every "a" row's target
    cap = _with_ids(np.stack([_induction_rows(tokens), stripe])[None], tokens)
    values = metrics.head_values(cap)
    assert metrics.repeats(cap) == 5 >= metrics.MIN_REPEATS and metrics.repeats_note(cap) == ""
    assert values["induction"][0, 0] == pytest.approx(1.0) and values["induction"][0, 1] >= metrics.REPEAT_MIN
    assert values["vertical"][0, 1] >= metrics.VERTICAL_MIN
    labels = [r["label"] for r in metrics.head_records(cap)]
    assert labels == ["induction", "vertical"]
    few = ["a", "b", "c", "a", "d", "e"]  # one repeat: not enough
    cap = _with_ids(_induction_rows(few)[None, None], few)
    values = metrics.head_values(cap)
    assert metrics.repeats(cap) == 1 and np.isnan(values["induction"]).all() and np.isnan(values["duplicate"]).all()
    assert metrics.head_records(cap)[0]["label"] != "induction" and "induction" not in metrics.head_records(cap)[0]
    assert "not enough repeats to test (1 token of the text occurred before; the tests need 4)" \
        in metrics.repeats_note(cap)
