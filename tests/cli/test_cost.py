"""attnviz cost: the two paths measured at growing T. The numbers are measurements (never asserted on); what is
checked is what was measured: the lengths, exactly T tokens, the α size, the budget, and the memory meter."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import one_line_error, run


def test_the_memory_meter_sees_an_allocation():
    from attnviz.engine.costs import PeakMemory, _status

    if _status("VmHWM") is None:
        pytest.skip("no /proc/self/status here")
    with PeakMemory("cpu") as meter:
        block = np.ones(64 << 17)  # 64 MiB of float64, touched
        block[::512] = 2.0
        del block
    assert meter.peak is not None and meter.peak >= 60 << 20
    with PeakMemory("cpu") as small:
        pass
    assert small.peak is not None and small.peak < 60 << 20  # the mark was reset, not carried over


@pytest.mark.parametrize("T", [5, 17, 64])
def test_an_input_of_exactly_t_tokens(T, load_tiny):
    from attnviz.engine.costs import input_of

    encoded, _ = input_of(load_tiny("gpt2"), T)
    assert encoded.inputs["input_ids"].shape == (1, T)
    assert len(encoded.tokens) == len(encoded.token_ids) == len(encoded.special) == T


@pytest.mark.slow
def test_cost_on_the_command_line(tiny_model_dir, tmp_path):
    model = tiny_model_dir("bert")
    out = tmp_path / "cost.png"
    result = run("cost", "-m", model, "--lengths", "16,8", "--json", "-o", out)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["T"] for r in data["rows"]] == [8, 16]
    for r in data["rows"]:
        assert r["alpha_bytes"] == 2 * 4 * r["T"] ** 2 * 4  # layers · heads · T² · 4 bytes
        assert r["full_seconds"] > 0 and r["stream_seconds"] > 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = run("cost", "-m", model, "--lengths", "8")
    assert table.exit_code == 0 and "streamed s" in table.stdout


def test_the_full_path_is_not_run_over_the_budget(tiny_model_dir):
    result = run("cost", "-m", tiny_model_dir("bert"), "--lengths", "32", "--max-memory", "1K", "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["rows"][0]
    assert row["full_seconds"] is None and "over the budget" in row["full_note"]
    assert row["stream_seconds"] > 0


@pytest.mark.parametrize("args, words", [(["--lengths", "8,x"], "not a list of lengths"),
                                         (["--lengths", "1"], "at least 2"),
                                         (["--lengths", "100000"], "at most")])
def test_cost_refuses_in_one_line(args, words, tiny_model_dir):
    assert words in one_line_error(run("cost", "-m", tiny_model_dir("bert"), *args), 2)


def test_cost_refuses_an_encoder_decoder(tiny_seq2seq_dir):
    assert "encoder-decoder" in one_line_error(run("cost", "-m", tiny_seq2seq_dir("t5"), "--lengths", "8"), 1)


@pytest.mark.slow
def test_cost_max_length_and_repeats(tiny_model_dir):
    result = run("cost", "-m", tiny_model_dir("gpt2"), "--max-length", "16", "--repeats", "2", "--json")
    assert result.exit_code == 0, result.output
    assert [r["T"] for r in json.loads(result.stdout)["rows"]] == [16]
    result = run("cost", "-m", tiny_model_dir("gpt2"), "--max-length", "128", "--json")
    assert [r["T"] for r in json.loads(result.stdout)["rows"]] == [64]  # the tiny GPT-2 has 64 positions


def test_the_figure_marks_the_lengths_where_the_full_path_was_not_run():
    """A length the full path was refused at (over the memory budget) is marked on both panels at that T,
    and the legend says what the mark means; lengths it ran at are not marked."""
    from attnviz.engine.costs import CostRow
    from attnviz.render.charts import cost_figure

    rows = [CostRow(16, 0.01, 2_000_000, 0.02, 1_000_000, 1024), CostRow(32, 0.04, 8_000_000, 0.03, 1_500_000, 4096),
            CostRow(64, None, None, 0.05, 2_000_000, 16384, "over the budget")]
    figure = cost_figure(rows, "cost")
    for ax in figure.axes[:2]:
        marks = [c for c in ax.collections if "not run" in str(c.get_label())]
        assert len(marks) == 1 and marks[0].get_offsets()[:, 0].tolist() == [64]
        assert any("not run" in t.get_text() for t in ax.get_legend().get_texts())
    clean = cost_figure(rows[:2], "cost")
    assert not [c for ax in clean.axes for c in ax.collections if "not run" in str(c.get_label())]
