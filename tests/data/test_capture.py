import json

import numpy as np
import pytest
from helpers import make_capture

from attnviz.data.capture import Capture
from attnviz.errors import AttentionCheckError, CaptureFormatError, OutputError, SelectionError


def uniform(L=2, H=3, T=4):
    return np.full((L, H, T, T), 1.0 / T, dtype=np.float32)


def test_shape_properties_and_indexing():
    cap = make_capture(uniform())
    assert (cap.n_layers, cap.n_heads, cap.n_tokens) == (2, 3, 4)
    assert cap[1].shape == (3, 4, 4) and cap[1, 2].shape == (4, 4)
    assert "layers=2" in repr(cap)


def test_head_matrix_mean_max_and_ranges():
    a = np.random.default_rng(0).dirichlet(np.ones(5), size=(2, 3, 5)).astype(np.float32)
    cap = make_capture(a)
    np.testing.assert_allclose(cap.head_matrix(-1, "mean"), a[1].mean(0), rtol=1e-6)
    np.testing.assert_array_equal(cap.head_matrix(0, "max"), a[0].max(0))
    np.testing.assert_array_equal(cap.head_matrix(0, -1), a[0, 2])
    with pytest.raises(SelectionError, match=r"0\.\.1"):
        cap.head_matrix(2, 0)
    with pytest.raises(SelectionError, match=r"0\.\.2"):
        cap.head_matrix(0, 3)


def test_validate_rejects_bad_rows_nan_shape_and_causal_leak():
    bad = uniform()
    bad[0, 0, 0, 0] += 0.1
    with pytest.raises(AttentionCheckError, match="sum to 1"):
        make_capture(bad).validate()
    nan = uniform()
    nan[1, 1, 1, 1] = np.nan
    with pytest.raises(AttentionCheckError, match="NaN"):
        make_capture(nan).validate()
    with pytest.raises(AttentionCheckError, match="causal"):
        make_capture(uniform(), causal=True).validate()
    tril = np.tril(np.ones((4, 4), np.float32))
    make_capture(np.broadcast_to(tril / tril.sum(-1, keepdims=True), (1, 1, 4, 4)), causal=True).validate()
    with pytest.raises(AttentionCheckError, match="tokens"):
        make_capture(uniform(), tokens=["a", "b", "c"]).validate()


def test_capture_is_read_only():
    cap = make_capture(uniform())
    with pytest.raises(ValueError):
        cap.attentions[0, 0, 0, 0] = 1.0


def test_save_load_round_trip_exact(tmp_path):
    a = np.random.default_rng(1).dirichlet(np.ones(6), size=(3, 2, 6)).astype(np.float32)
    cap = make_capture(a, tokens=["[CLS]", "나는", "##x", "cat", "Ġ", "[SEP]"],
                       special=[True, False, False, False, False, True],
                       kinds=["start", "", "", "", "", "end"]).with_meta(text="나는 cat")
    path = cap.save(tmp_path / "sub" / "c.npz")
    back = Capture.load(path)
    np.testing.assert_array_equal(back.attentions, cap.attentions)
    assert back.attentions.dtype == np.float32
    assert back.tokens == cap.tokens and back.special_kind == cap.special_kind
    np.testing.assert_array_equal(back.special, cap.special)
    assert back.meta == cap.meta
    with np.load(path, allow_pickle=False) as npz:  # the public format: plain arrays + JSON
        assert {"attentions", "tokens", "meta"} <= set(npz.files)
        assert json.loads(str(npz["meta"]))["format_version"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["c.npz"]  # no temp file left


def test_load_rejects_corrupt_foreign_and_pickled(tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CaptureFormatError):
        Capture.load(garbage)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.zeros(3))
    with pytest.raises(CaptureFormatError, match="missing"):
        Capture.load(foreign)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, **{k: np.array([object()], dtype=object) for k in
                         ("attentions", "tokens", "token_ids", "special", "special_kind", "subword", "meta")})
    with pytest.raises(CaptureFormatError, match="pickled"):
        Capture.load(pickled)
    with pytest.raises(CaptureFormatError, match="not found"):
        Capture.load(tmp_path / "nope.npz")


def test_load_rejects_tampered_values(tmp_path):
    cap = make_capture(uniform())
    path = cap.save(tmp_path / "c.npz")
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["attentions"] = arrays["attentions"] * 2
    np.savez(tmp_path / "t.npz", **arrays)
    with pytest.raises(CaptureFormatError, match="sum to 1"):
        Capture.load(tmp_path / "t.npz")
    truncated = tmp_path / "cut.npz"
    truncated.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CaptureFormatError):
        Capture.load(truncated)


def test_save_refuses_other_suffix_and_unwritable_dir(tmp_path):
    cap = make_capture(uniform())
    with pytest.raises(OutputError, match="npz"):
        cap.save(tmp_path / "c.json")
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    with pytest.raises(OutputError, match="cannot write"):
        cap.save(blocker / "c.npz")
    with pytest.raises(OutputError, match="cannot write"):
        cap.save("/proc/attnviz-test/c.npz")  # unwritable even for root
