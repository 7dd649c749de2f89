"""Property-based tests: readable tokens, the capture round trip, metric invariants, display-safe text."""

import math
import unicodedata

import numpy as np
from helpers import make_capture
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attnviz import metrics
from attnviz.data.capture import Capture
from attnviz.base.text import cells, fit, is_valid_unicode, pad, visible
from attnviz.base.tokens import readable_token

valid_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


@given(raw=valid_text, decoded=st.one_of(st.none(), valid_text), special=st.booleans(), subword=st.booleans())
def test_readable_token(raw, decoded, special, subword):
    token = readable_token(raw, decoded, None, special=special, subword=subword)
    if special:
        assert token == raw
        return
    assert token, "a token is never shown as nothing"
    assert token.startswith("##") == subword or token.startswith("##")  # continuation pieces always marked
    if subword:
        assert token.startswith("##") and len(token) > 2
    assert unicodedata.normalize("NFC", token) == token
    assert not any(marker in token for marker in ("Ġ", "▁"))


@st.composite
def captures(draw):
    L, H, T = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 7))
    causal = draw(st.booleans())
    logits = draw(arrays(np.float64, (L, H, T, T), elements=st.floats(-8, 8)))
    if causal:
        logits = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, logits)
    alpha = np.exp(logits - logits.max(-1, keepdims=True))
    alpha = (alpha / alpha.sum(-1, keepdims=True)).astype(np.float32)
    tokens = draw(st.lists(valid_text.filter(bool), min_size=T, max_size=T))
    special = draw(st.lists(st.booleans(), min_size=T, max_size=T))
    kinds = [("start" if i == 0 else "end") if s else "" for i, s in enumerate(special)]
    cap = make_capture(alpha, tokens, causal=causal, special=special, kinds=kinds)
    return cap.with_meta(text=draw(valid_text), dropped_tokens=0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=captures())
def test_capture_save_load_round_trip_is_exact(cap, tmp_path_factory):
    path = cap.save(tmp_path_factory.mktemp("rt") / "c.npz")
    back = Capture.load(path)
    np.testing.assert_array_equal(back.attentions, cap.attentions)
    assert back.tokens == cap.tokens and back.special_kind == cap.special_kind and back.meta == cap.meta
    np.testing.assert_array_equal(back.special, cap.special)
    np.testing.assert_array_equal(back.token_ids, cap.token_ids)


@settings(max_examples=80, deadline=None)
@given(cap=captures())
def test_metric_invariants(cap):
    T = cap.n_tokens
    ent = metrics.entropy(cap)
    assert (ent >= -1e-6).all() and (ent <= math.log(T) + 1e-5).all()
    norm = metrics.normalised_entropy(cap)
    assert (norm >= -1e-6).all() and (norm <= 1 + 1e-5).all()
    for record in metrics.head_records(cap):
        for key in ("max_weight", "prev", "self", "next", "start_mass", "end_mass", "punct_mass", "first_mass",
                    "vertical"):
            assert -1e-6 <= record[key] <= 1 + 1e-5, (key, record[key])
        assert 0 <= record["mean_distance"] <= T - 1 + 1e-5
        assert record["label"] in metrics.LABELS
    rolled = metrics.rollout(cap)
    np.testing.assert_allclose(rolled.sum(-1), 1.0, atol=1e-9)
    assert (rolled >= 0).all()
    if cap.causal:
        assert np.abs(np.triu(rolled, 1)).max() < 1e-12  # rollout of a causal model stays causal


@given(st.text(max_size=40))
def test_visible_leaves_no_control_characters(text):
    shown = visible(text)
    assert is_valid_unicode(shown)
    assert not any(unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") for c in shown)
    assert not any(0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 for c in shown)
    if text.isprintable():
        assert shown == text


@given(st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=30), st.integers(0, 20))
def test_fit_and_pad_measure_cells(text, width):
    assert cells(fit(text, width)) <= width
    assert cells(pad(text, width)) == width or cells(text) == 0 and width == 0


@settings(max_examples=30, deadline=None)
@given(cap=captures())
def test_metrics_by_layer_equal_metrics_on_the_whole_capture(cap):
    for compute in (metrics.entropy, metrics.normalised_entropy, metrics.max_weight, metrics.mean_distance,
                    metrics.block_score, lambda c: metrics.vertical_score(c)[1]):
        np.testing.assert_allclose(metrics.by_layer(compute, cap), compute(cap), rtol=1e-12, equal_nan=True)
