"""attnviz.base.parallel: a fold cut over the cores gives what one thread gives; errors come back; the cap holds."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from attnviz.base.parallel import run_all, runs, start_all, threads


@pytest.mark.parametrize("n,parts", [(0, 2), (1, 2), (5, 2), (7, 3), (85, 2), (3, 8)])
def test_runs_cover_every_position_once_in_order(n, parts):
    cuts = runs(n, parts)
    assert len(cuts) <= max(1, parts)
    covered = [i for a, b in cuts for i in range(a, b)]
    assert covered == list(range(n))
    assert all(b > a for a, b in cuts)
    if cuts:
        lengths = [b - a for a, b in cuts]
        assert max(lengths) - min(lengths) <= 1


def test_threads_follow_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert threads() >= 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads() >= 1


def test_run_all_runs_every_task_and_raises_the_first_error_after_all(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    done, names = [], set()

    def task(k):
        def go():
            names.add(threading.current_thread().name)
            done.append(k)
            if k in (3, 5):
                raise ValueError(f"task {k}")
        return go

    with pytest.raises(ValueError, match="task 3"):
        run_all([task(k) for k in range(8)])
    assert sorted(done) == list(range(8))  # every task ran, the failing ones too


def test_start_all_returns_while_its_tasks_run_and_wait_raises_their_error(monkeypatch):
    """The streamed path folds a block while torch computes the next: start_all must not wait for its tasks."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    release, finished = threading.Event(), []

    def slow(k):
        def go():
            assert release.wait(10)
            finished.append(k)
            if k == 1:
                raise RuntimeError("task 1")
        return go

    started = start_all([slow(0), slow(1)])
    assert finished == []  # both are still waiting for the event: start_all came back first
    release.set()
    with pytest.raises(RuntimeError, match="task 1"):
        started.wait()
    assert sorted(finished) == [0, 1]
    started.wait()  # waited once: nothing left, nothing raised again


def test_one_task_or_one_thread_runs_at_once_and_keeps_its_error(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    done = []

    def fail():
        done.append(1)
        raise ValueError("boom")

    started = start_all([fail, lambda: done.append(2)])
    assert done == [1, 2]  # ran in this thread before start_all returned
    with pytest.raises(ValueError, match="boom"):
        started.wait()


def test_torch_runs_on_one_thread_beside_the_fold_and_gets_its_threads_back(monkeypatch):
    import torch

    from attnviz.engine.stream import torch_beside_fold

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch_beside_fold("cpu"):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(KeyError):
            with torch_beside_fold(torch.device("cpu")):
                raise KeyError("an error inside the layer")
        assert torch.get_num_threads() == 2  # restored on the way out of an error too
        with torch_beside_fold("meta"):  # not the CPU: torch's threads are left alone
            assert torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # no fold threads: nothing to make room for
        with torch_beside_fold("cpu"):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_one_thread_and_two_give_the_same_numbers(kind, load_tiny, monkeypatch):
    """The streamed path (rows of a block cut over threads) and a corpus batch (texts cut over threads) give
    the same values with OMP_NUM_THREADS=1 and 2, to 1e-12."""
    import attnviz.corpora.texts as corpus
    from attnviz.corpora import Line
    from attnviz.engine.corpora.run import BatchRunner
    from attnviz.engine.forward import capture_text, encode
    from attnviz.engine.stream import stream
    from attnviz.metrics import Tokens

    loaded = load_tiny(kind)
    text = " ".join(["The cat sat on the mat. A dog ran in the park!"] * 4)
    capture, encoded = capture_text(text, loaded), encode(loaded, text)
    texts = ["The cat sat on the mat.", "Dogs bark", "A much longer sentence, with commas, runs on and on.", "Hi"]
    monkeypatch.setattr(corpus, "ROWS_BYTES", 1)  # each text (and layer) its own task
    got = []
    for n in ("1", "2"):
        monkeypatch.setenv("OMP_NUM_THREADS", n)
        streamed = stream(loaded.model, encoded.inputs, Tokens.of(capture), pool=5, block_bytes=4000)
        runner = BatchRunner(loaded, batch_size=8)
        ready, _ = runner.prepare([Line("t", k + 1, t) for k, t in enumerate(texts)])
        got.append((streamed, runner.run(ready)))
    (s1, b1), (s2, b2) = got
    for name, values in s1.values.items():
        if values.dtype != object:
            np.testing.assert_allclose(s2.values[name], values, atol=1e-12, equal_nan=True, err_msg=name)
    np.testing.assert_allclose(s2.pooled, s1.pooled, atol=1e-7)
    for name in b1.values:
        np.testing.assert_allclose(b2.values[name], b1.values[name], atol=1e-12, equal_nan=True, err_msg=name)
    assert np.array_equal(b1.labels, b2.labels)
