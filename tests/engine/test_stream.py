"""Long inputs: the streamed path (attention a block of query rows at a time) gives the full path's numbers
within 1e-5 wherever both fit: metrics, labels, pooled α, rollout rows, exact windows; for an encoder and
a causal model, with and without padding in a batch, and on the bundled MiniLM."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from helpers import one_line_error, run

from attnviz.base.blocks import equal_edges as pool_edges
from attnviz.data.capture import Capture
from attnviz.engine.stream import Window, stream
from attnviz.metrics import Tokens, head_values, rollout

LONG = " ".join(["The cat sat on the mat. A dog ran in the park!"] * 5)


def pooled_by_hand(alpha: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Independent pooling: rows averaged and key columns summed over each block, with plain loops."""
    P = len(edges) - 1
    out = np.zeros(alpha.shape[:2] + (P, P))
    for a in range(P):
        for b in range(P):
            out[:, :, a, b] = alpha[:, :, edges[a]:edges[a + 1], edges[b]:edges[b + 1]].sum(-1).mean(-1)
    return out


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_streamed_numbers_equal_the_full_path(kind, load_tiny):
    from attnviz.engine.forward import capture_text, encode

    loaded = load_tiny(kind)
    capture = capture_text(LONG, loaded)
    encoded = encode(loaded, LONG)
    T = capture.n_tokens
    rows, cols = np.arange(5, 9), np.arange(0, T, 3)
    result = stream(loaded.model, encoded.inputs, Tokens.of(capture), pool=9, rollout_tokens=[0, T - 1],
                    window=Window(rows, cols, (1,)), block_bytes=3000)  # many small blocks
    full = head_values(capture)
    for name, values in full.items():
        if values.dtype == object:
            assert (values == result.values[name]).all(), name
        else:
            np.testing.assert_allclose(result.values[name], values, atol=1e-5, equal_nan=True, err_msg=name)
    np.testing.assert_allclose(result.pooled, pooled_by_hand(capture.attentions, result.edges), atol=1e-5)
    np.testing.assert_allclose(result.pooled.sum(-1), 1.0, atol=1e-5)
    full_rollout = rollout(capture)
    for token in (0, T - 1):
        np.testing.assert_allclose(result.rollout[token], full_rollout[token], atol=1e-5)
    np.testing.assert_allclose(result.window[0], capture.attentions[1][:, rows][:, :, cols], atol=1e-5)


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_padding_in_a_batch_gives_each_text_its_own_numbers(kind, load_tiny):
    from attnviz.engine.forward import capture_text

    loaded = load_tiny(kind)
    tok = loaded.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    texts = [" ".join(["The cat sat on the mat."] * 6), "The quick brown fox jumps over the lazy dog"]
    inputs = {k: v for k, v in tok(texts, return_tensors="pt", padding=True).items()
              if k in ("input_ids", "attention_mask", "token_type_ids")}
    assert int(inputs["attention_mask"][1].sum()) < inputs["attention_mask"].shape[1]  # the second is padded
    for batch, text in enumerate(texts):
        alone = capture_text(text, loaded)
        result = stream(loaded.model, inputs, Tokens.of(alone), batch=batch, pool=4)
        for name, values in head_values(alone).items():
            if values.dtype != object:
                np.testing.assert_allclose(result.values[name], values, atol=1e-5, equal_nan=True, err_msg=name)


def test_pool_edges_never_exceed_the_pool():
    for T in (1, 7, 512, 513, 4096, 8193):
        edges, block = pool_edges(T, 512)
        assert edges[0] == 0 and edges[-1] == T and len(edges) - 1 <= 512 and (np.diff(edges) <= block).all()


def test_cli_streams_when_asked_or_over_budget_and_says_so(tiny_model_dir, tmp_path):
    model = tiny_model_dir("bert")
    full = json.loads(run("heads", LONG, "-m", model, "--json").stdout)["heads"]
    asked = run("heads", LONG, "-m", model, "--json", "--stream")
    assert asked.exit_code == 0 and "Streamed" in asked.stderr and "--stream" in asked.stderr
    budget = run("heads", LONG, "-m", model, "--json", "--max-memory", "200K")
    assert "over --max-memory" in budget.stderr
    for result in (asked, budget):
        rows = json.loads(result.stdout)["heads"]
        assert [(r["layer"], r["head"], r["label"], r["top_key"]) for r in rows] == \
            [(r["layer"], r["head"], r["label"], r["top_key"]) for r in full]
        worst = max(abs(a[k] - b[k]) for a, b in zip(rows, full) for k in a if isinstance(a[k], float))
        assert worst < 1e-5
    assert "Streamed" not in run("heads", LONG, "-m", model, "--json").stderr  # within budget: the full path


@pytest.mark.slow
def test_a_pooled_capture_is_read_by_every_viewer(tiny_model_dir, tmp_path):
    model = tiny_model_dir("gpt2")
    text = " ".join(["The cat sat on the mat."] * 10)
    path = tmp_path / "long.npz"
    assert run("capture", text, "-m", model, "--stream", "-o", path).exit_code == 0
    capture = Capture.load(path)
    assert capture.pooled and capture.meta["pooled"]["tokens"] == capture.long.n_tokens
    assert len(capture.meta["head_stats"]) == capture.n_layers * capture.n_heads
    plain = json.loads(run("heads", text, "-m", model, "--json").stdout)["heads"]
    stored = json.loads(run("heads", "--from", path, "--json").stdout)["heads"]
    assert [r["label"] for r in stored] == [r["label"] for r in plain]
    assert run("heatmap", "--from", path, "-o", tmp_path / "h.png").exit_code == 0
    assert run("heatmap", "--from", path, "-t", "--head", "0").exit_code == 0
    rolled = json.loads(run("rollout", "--from", path, "--json").stdout)
    assert rolled["token"] == capture.long.n_tokens - 1 and abs(sum(rolled["rollout"]) - 1) < 1e-5
    assert "rollout of token" in one_line_error(run("rollout", "--from", path, "--token", "3"), 2)
    assert run("entropy", "--from", path, "--json").exit_code == 0
    assert run("export", "--from", path, "-o", tmp_path / "e").exit_code == 0
    assert "pooled" in (tmp_path / "e" / "index.html").read_text()
    assert "streamed and pooled" in one_line_error(run("token", "--from", path, "cat"))
    assert "exact window" in one_line_error(run("heatmap", "--from", path, "--rows", "0:4"), 2)


def test_exact_window_streamed_equals_the_full_slice(tiny_model_dir, tmp_path):
    model = tiny_model_dir("bert")
    common = ["heatmap", LONG, "-m", model, "--rows", "10:14", "--cols", "0:20", "--layer", "1", "--head", "0"]
    streamed = run(*common, "--stream", "-t", env={"NO_COLOR": "1"})
    full = run(*common, "-t", env={"NO_COLOR": "1"})
    assert streamed.exit_code == 0 and full.exit_code == 0
    assert streamed.stdout == full.stdout  # the same cells, drawn the same way
    assert run(*common, "--stream", "-o", tmp_path / "w.png").exit_code == 0


@pytest.mark.slow
def test_streamed_minilm_matches(minilm, cat_capture):
    from attnviz.engine.forward import encode

    encoded = encode(minilm, "The cat sat on the mat")
    result = stream(minilm.model, encoded.inputs, Tokens.of(cat_capture), pool=3, rollout_tokens=[0])
    for name, values in head_values(cat_capture).items():
        if values.dtype != object:
            np.testing.assert_allclose(result.values[name], values, atol=1e-5, equal_nan=True, err_msg=name)
    np.testing.assert_allclose(result.rollout[0], rollout(cat_capture)[0], atol=1e-5)


def test_pool_option_and_statistics_only_pass(tiny_model_dir, tmp_path):
    """--pool sets the block size of pictures; heads (statistics only) folds layers in as the forward pass
    reaches them and keeps neither pooled matrices nor rollout rows."""
    model = tiny_model_dir("bert")
    path = tmp_path / "p.npz"
    assert run("capture", LONG, "-m", model, "--stream", "--pool", "8", "-o", path).exit_code == 0
    capture = Capture.load(path)
    assert capture.n_tokens <= 8 and capture.long.block == -(-capture.long.n_tokens // 8)
    assert "mean over" in run("heatmap", "--from", path, "-t", "--head", "0").stdout
    assert one_line_error(run("capture", LONG, "-m", model, "--stream", "--pool", "0", "-o", path), 2)


def test_statistics_only_stream_keeps_no_layer_input(load_tiny, monkeypatch):
    """Without rollout rows each layer is folded in as the forward pass reaches it (attention call, fold,
    attention call, fold): no layer's Q and K are kept for later. With rollout rows, every layer is folded
    after the pass, top to bottom."""
    import attnviz.engine.stream as streaming
    from attnviz.engine.forward import capture_text, encode

    loaded = load_tiny("llama")
    capture = capture_text(LONG, loaded)
    encoded = encode(loaded, LONG)
    events: list[str] = []
    real_output, real_end = streaming.output, streaming._Run.end

    def output(attention, value, block_bytes, on_block=None):
        events.append("call")
        return real_output(attention, value, block_bytes, on_block)

    def end(self):
        events.append(f"fold {self.current}")
        return real_end(self)

    monkeypatch.setattr(streaming, "output", output)
    monkeypatch.setattr(streaming._Run, "end", end)
    result = stream(loaded.model, encoded.inputs, Tokens.of(capture), pool=1)
    assert events == ["call", "fold 0", "call", "fold 1"]  # each layer folded from the blocks that made its output
    events.clear()
    stream(loaded.model, encoded.inputs, Tokens.of(capture), pool=1, rollout_tokens=[0])
    assert events == ["call", "call", "fold 1", "fold 0"]
    for name, values in head_values(capture).items():
        if values.dtype != object:
            np.testing.assert_allclose(result.values[name], values, atol=1e-5, equal_nan=True, err_msg=name)


def streamed_block_sizes(load_tiny, monkeypatch, **options) -> tuple[list[int], int, int]:
    """(the rows of every block the streamed pass computes, T, L) for LONG on the tiny Llama."""
    from attnviz.engine import interface
    from attnviz.engine.forward import capture_text, encode

    loaded = load_tiny("llama")
    capture = capture_text(LONG, loaded)
    encoded = encode(loaded, LONG)
    calls = []
    real = interface.LayerAttention.block

    def block(self, start, stop, buffer):
        calls.append(stop - start)
        return real(self, start, stop, buffer)

    monkeypatch.setattr(interface.LayerAttention, "block", block)
    stream(loaded.model, encoded.inputs, Tokens.of(capture), pool=1, **options)
    return calls, capture.n_tokens, capture.n_layers


def test_each_block_of_alpha_is_computed_once(load_tiny, monkeypatch):
    """Without rollout rows the α rows that make a module's output are the rows the statistics fold: one
    computation per block, not two."""
    from attnviz.engine.forward import capture_text

    T = capture_text(LONG, load_tiny("llama")).n_tokens
    calls, T, L = streamed_block_sizes(load_tiny, monkeypatch, block_bytes=4 * 8 * T * 10)  # 10 rows of 4 heads
    assert sum(calls) == L * T and len(calls) == L * -(-T // 10)


def test_a_block_holds_its_bytes_and_by_default_at_least_min_rows():
    """block_bytes asked for: as many rows as it holds in float64 (at least one). By default BLOCK_BYTES' worth,
    but never fewer than MIN_ROWS: at 32,768 keys × 14 heads 16 MB is 4 rows, and each block re-reads the
    layer's K and V. Never more rows than there are."""
    from attnviz.engine.interface import BLOCK_BYTES, MIN_ROWS, block_rows

    assert block_rows(4 * 8 * 100 * 10, 100, 4, 100) == 10 and block_rows(1, 100, 4, 100) == 1
    assert block_rows(None, 32768, 14, 32768) == MIN_ROWS > BLOCK_BYTES // (14 * 32768 * 8)
    assert block_rows(None, 2048, 14, 2048) == BLOCK_BYTES // (14 * 2048 * 8) > MIN_ROWS
    assert block_rows(None, 5, 14, 32768) == 5 and block_rows(10**9, 7, 2, 7) == 7


def test_default_blocks_are_min_rows_at_long_keys(load_tiny, monkeypatch):
    """Through the streamed pass: with BLOCK_BYTES too small for MIN_ROWS rows, each layer's blocks are
    MIN_ROWS rows (the last one what is left)."""
    from attnviz.engine import interface

    monkeypatch.setattr(interface, "BLOCK_BYTES", 1)
    calls, T, L = streamed_block_sizes(load_tiny, monkeypatch)
    rows = interface.MIN_ROWS
    per_layer = [rows] * (T // rows) + ([T % rows] if T % rows else [])
    assert T > rows and calls == per_layer * L


@pytest.fixture(scope="module")
def pooled(tmp_path_factory, tiny_model_dir):
    path = tmp_path_factory.mktemp("pooled") / "long.npz"
    text = " ".join(["The cat sat on the mat. A dog ran in the park!"] * 4)
    assert run("capture", text, "-m", tiny_model_dir("bert"), "--stream", "--pool", "8", "-o", path).exit_code == 0
    return path


@pytest.mark.parametrize("damage, words", [
    (lambda r: r[0].__setitem__("layer", 99), "layer 99"),
    (lambda r: r[1].pop("entropy"), "no number 'entropy'"),
    (lambda r: r[2].__setitem__("prev", "lots"), "no number 'prev'"),
    (lambda r: r[0].__setitem__("label", "<b>x</b>"), "unknown label"),
    (lambda r: r.pop(), "records"),
    (lambda r: r.__setitem__(1, dict(r[0])), "repeats"),
])
@pytest.mark.parametrize("command", ["entropy", "heads"])
def test_damaged_head_statistics_are_one_line(tmp_path, pooled, damage, words, command):
    capture = Capture.load(pooled)
    records = [dict(r) for r in capture.meta["head_stats"]]
    damage(records)
    path = capture.with_meta(head_stats=records).save(tmp_path / "bad.npz")
    assert words in one_line_error(run(command, "--from", path))


def test_the_intact_pooled_capture_reads(pooled):
    """The untouched pooled capture reads back: its head table is the one its streamed pass stored."""
    from attnviz.data.capture import Capture

    result = run("heads", "--from", pooled, "--json")
    assert result.exit_code == 0, result.output
    stored = Capture.load(pooled).meta["head_stats"]
    assert json.loads(result.stdout)["heads"] == json.loads(json.dumps(stored))


@pytest.mark.parametrize("causal, softcap, masked, sinks", [(True, None, False, False), (False, None, False, False),
                                                            (True, 5.0, False, False), (True, None, True, False),
                                                            (False, None, False, True)])
def test_blocks_in_reused_buffers_equal_the_written_out_formula(causal, softcap, masked, sinks):
    """LayerAttention.block (in place, a causal block over its reachable keys only) against formula's written-out
    softmax (not the fused one); output() against α·V; and each block's α still intact while the next block is
    computed, as the fold beside it reads it. float32 throughout: 1e-6."""
    import torch

    from attnviz.engine.interface import LayerAttention, output
    from attnviz.engine.scratch.formula import attention_weights

    torch.manual_seed(0)
    B, H, T, d = 1, 3, 37, 8
    q, k, v = torch.randn(B, H, T, d), torch.randn(B, H, T, d), torch.randn(B, H, T, d)
    mask = (torch.rand(B, 1, T, T) > 0.3) | torch.eye(T, dtype=torch.bool) if masked else None
    sink = torch.randn(H) if sinks else None
    attention = LayerAttention(q=q, k=k, mask=mask, causal=causal and not masked, scale=0.3, softcap=softcap,
                               sinks=sink)
    written = mask if masked else ((torch.arange(T)[None, :] <= torch.arange(T)[:, None])[None, None] if causal
                                   else None)
    expected = attention_weights(q, k, written, scale=0.3, softcap=softcap, sinks=sink)  # (B, H, T, T)
    seen: list[tuple[int, torch.Tensor]] = []

    def on_block(queries, alpha):
        if seen:  # the block before, as it was handed over: not yet overwritten
            start, before = seen[-1]
            torch.testing.assert_close(before, expected[:, :, start:start + before.shape[2]], atol=1e-6, rtol=0)
        seen.append((int(queries[0]), alpha))
        torch.testing.assert_close(alpha, expected[:, :, queries], atol=1e-6, rtol=0)

    out = output(attention, v, block_bytes=B * H * T * 8 * 5, on_block=on_block)  # 5 rows a block, 8 blocks
    assert len(seen) == 8
    torch.testing.assert_close(out, (expected @ v).transpose(1, 2), atol=1e-5, rtol=0)


def test_the_progress_bar_counts_every_layers_query_rows_a_block_at_a_time(load_tiny, monkeypatch):
    """A long streamed run moves its bar as each block of rows is folded, not once a layer: the engine's steps are
    the blocks' sizes (L × ⌈T/b⌉ steps summing to L·T, with rollout rows kept to after the pass as well); the
    public capture() and sinks() show one bar of L·T query rows that reaches its total."""
    from attnviz.engine.forward import capture_text, encode
    from attnviz.progress import Reporter

    loaded = load_tiny("llama")
    capture = capture_text(LONG, loaded)
    encoded = encode(loaded, LONG)
    T, L = capture.n_tokens, capture.n_layers
    block_bytes = 4 * 8 * T * 10  # 10 rows of 4 heads a block
    for rollout_tokens in ((), (T - 1,)):
        steps: list[int] = []
        stream(loaded.model, encoded.inputs, Tokens.of(capture), pool=1, block_bytes=block_bytes,
               rollout_tokens=rollout_tokens, on_rows=steps.append)
        assert sum(steps) == L * T and len(steps) == L * -(-T // 10), (rollout_tokens, steps)

    class Bars(Reporter):
        def __init__(self):
            self.bars: list[list] = []

        @contextlib.contextmanager
        def progress(self, what, total, unit):
            bar = [what, total, unit, 0]
            self.bars.append(bar)

            def step(n):
                bar[3] += n
            yield step

    import attnviz

    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "1K")
    for call in (lambda r: attnviz.capture(LONG, model=loaded, stream=True, reporter=r),
                 lambda r: attnviz.sinks(LONG, model=loaded, reporter=r)):
        reporter = Bars()
        call(reporter)
        assert ["Streaming", L * T, "query rows", L * T] in reporter.bars, reporter.bars


def test_the_streamed_pass_keeps_no_cache_of_keys_and_values(load_tiny, monkeypatch):
    """A causal LM called without use_cache=False keeps every layer's K and V for later tokens (2·L·T·d_kv
    floats, 0.8 GB at 32,768 tokens on Qwen2.5-Coder-0.5B); the streamed pass asks for none, and its output
    carries none."""
    import functools

    from attnviz.engine.forward import capture_text, encode

    loaded = load_tiny("llama")
    capture = capture_text(LONG, loaded)
    encoded = encode(loaded, LONG)
    seen = []
    real = loaded.model.forward

    @functools.wraps(real)
    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append((kwargs.get("use_cache"), getattr(out, "past_key_values", None)))
        return out

    monkeypatch.setattr(loaded.model, "forward", spy)
    stream(loaded.model, encoded.inputs, Tokens.of(capture), pool=1)
    assert seen == [(False, None)]
