"""Every input is untrusted: hand-made hostile captures, control sequences and markup in strings, hostile
option values. Each must end in one line on stderr and its exit code, never a traceback, never control
sequences on the terminal, never memory beyond the documented limits."""

from __future__ import annotations

import json
import math
import re
import os
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from helpers import SENTENCE, make_capture, one_line_error, run

from attnviz.data.capture import Capture
from attnviz.errors import CaptureFormatError


def good_arrays(T=4, L=1, H=2):
    cap = make_capture(np.full((L, H, T, T), 1.0 / T, np.float32), special=[True] + [False] * (T - 2) + [True],
                       kinds=["start"] + [""] * (T - 2) + ["end"])
    return {
        "attentions": cap.attentions, "tokens": np.array(cap.tokens), "token_ids": cap.token_ids,
        "special": cap.special, "special_kind": np.array(cap.special_kind), "subword": cap.subword,
        "meta": np.array(json.dumps({"model": "hand-made", "causal": False, "format_version": 1})),
    }


def write_npz(path, arrays):
    np.savez(path, **arrays)
    return path


def npy_member(zf, name, header_dict, payload_chunks):
    """Write an .npy member with a hand-made header and a payload streamed in chunks."""
    header = repr(header_dict).encode("latin1")
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    with zf.open(name, "w", force_zip64=True) as fh:
        fh.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header)
        for chunk in payload_chunks:
            fh.write(chunk)


# --- 2. hostile capture files: bounded memory, one line -------------------------------------------------


def test_zip_bomb_is_refused_from_its_header(tmp_path, monkeypatch):
    """A small file whose α inflates to 64 MiB of zeros, with the limit at 1 MiB: refused before reading."""
    monkeypatch.setenv("ATTNVIZ_MAX_CAPTURE_BYTES", str(1 << 20))
    path = tmp_path / "bomb.npz"
    arrays = good_arrays()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        npy_member(zf, "attentions.npy", {"descr": "<f4", "fortran_order": False, "shape": (1, 1, 4096, 4096)},
                   (bytes(1 << 20) for _ in range(64)))
        for key, value in arrays.items():
            if key != "attentions":
                with zf.open(f"{key}.npy", "w") as fh:
                    np.lib.format.write_array(fh, value)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(CaptureFormatError, match="over the limit"):
        Capture.load(path)
    assert "over the limit" in one_line_error(run("heatmap", "--from", path, "-t"))


def test_header_claiming_a_huge_shape_is_refused_without_allocating(tmp_path):
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as zf:
        npy_member(zf, "attentions.npy", {"descr": "<f4", "fortran_order": False,
                                          "shape": (1000, 1000, 1000, 1000)}, [b"\0" * 64])
        for key, value in good_arrays().items():
            if key != "attentions":
                with zf.open(f"{key}.npy", "w") as fh:
                    np.lib.format.write_array(fh, value)
    assert "4,000,000,000,000 bytes" in one_line_error(run("heads", "--from", path))


def test_member_that_inflates_past_its_header_costs_only_the_header(tmp_path):
    """The header says 64 bytes; the zip data inflates to 32 MiB. Only 64 bytes are read (and the rows
    of zeros then fail the sum-to-1 check)."""
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        npy_member(zf, "attentions.npy", {"descr": "<f4", "fortran_order": False, "shape": (1, 1, 4, 4)},
                   (bytes(1 << 20) for _ in range(32)))
        for key, value in good_arrays().items():
            if key != "attentions":
                with zf.open(f"{key}.npy", "w") as fh:
                    np.lib.format.write_array(fh, value)
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(CaptureFormatError):
        Capture.load(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, f"reading took {peak:,} bytes"


def tampered(tmp_path, name, **changes):
    arrays = good_arrays()
    for key, value in changes.items():
        if key.startswith("meta_"):
            meta = json.loads(str(arrays["meta"]))
            meta[key[5:]] = value
            arrays["meta"] = np.array(json.dumps(meta))
        else:
            arrays[key] = value
    return write_npz(tmp_path / f"{name}.npz", arrays)


@pytest.mark.parametrize("name,changes,message", [
    ("ids_as_strings", {"token_ids": np.array(["1", "2", "3", "4"])}, "token_ids has dtype"),
    ("special_2d", {"special": np.zeros((4, 1), bool)}, "special has 2 dimensions"),
    ("lone_surrogate", {"tokens": np.array(["a", "\ud800", "c", "d"])}, "not valid Unicode"),
    ("text_is_a_number", {"meta_text": 5}, "'text' is a int"),
    ("causal_is_a_string", {"meta_causal": "yes"}, "'causal' is a str"),
    ("meta_is_a_list", {"meta": np.array("[1, 2]")}, "not a JSON object"),
    ("deeply_nested", {"meta": np.array("[" * 100_000 + "]" * 100_000)}, "nested too deeply"),
    ("huge_meta", {"meta": np.array(json.dumps({"format_version": 1, "text": "x" * 2_000_000}))}, "over the limit"),
    ("unknown_kind", {"special_kind": np.array(["start", "", "", "evil"])}, "special_kind holds 'evil'"),
    ("short_tokens", {"tokens": np.array(["a", "b"])}, "must line up"),
    ("float_tokens", {"tokens": np.zeros(4)}, "tokens has dtype"),
    ("long_token", {"tokens": np.array(["a", "b", "c", "x" * 5000])}, "characters, over the limit"),
    ("complex_alpha", {"attentions": np.zeros((1, 2, 4, 4), np.complex64)}, "attentions has dtype"),
    ("nested_meta_value", {"meta_model": {"a": [1]}}, "'model' is a dict"),
])
def test_wrong_types_and_shapes_are_refused_at_load(tmp_path, name, changes, message):
    path = tampered(tmp_path, name, **changes)
    with pytest.raises(CaptureFormatError, match=message):
        Capture.load(path)
    assert message.split("'")[0].split(" ")[0] in one_line_error(run("heads", "--from", path))


@pytest.mark.slow
def test_zip_with_a_huge_directory_is_refused(tmp_path):
    path = tmp_path / "many.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for key, value in good_arrays().items():
            with zf.open(f"{key}.npy", "w") as fh:
                np.lib.format.write_array(fh, value)
        for n in range(30_000):
            zf.writestr(f"padding/{n:08d}-{'x' * 20}", b"")
    with pytest.raises(CaptureFormatError, match="directory is too large"):
        Capture.load(path)


def test_all_special_capture_with_hide_special_is_one_line(tmp_path):
    cap = make_capture(np.full((1, 1, 2, 2), 0.5, np.float32), ["[CLS]", "[SEP]"], special=[True, True],
                       kinds=["start", "end"])
    path = cap.save(tmp_path / "special.npz")
    assert "--hide-special" in one_line_error(run("heatmap", "--from", path, "-t", "--hide-special"), 2)
    assert "--hide-special" in one_line_error(run("heatmap", "--from", path, "--hide-special", "-o",
                                                  tmp_path / "x.png"), 2)
    assert not (tmp_path / "x.png").exists()


# --- 1. nothing a user did not type reaches the terminal as control sequences -------------------------

HOSTILE_TOKENS = ["[CLS]", "\x1b]52;c;cHduZWQ=\x07", "\x1b[2J", "\x9b31m", "[/x]", "[bold red]", "\u202egnp.exe",
                  "[SEP]"]


@pytest.fixture
def hostile_capture(tmp_path):
    T = len(HOSTILE_TOKENS)
    rng = np.random.default_rng(0)
    cap = make_capture(rng.dirichlet(np.ones(T), size=(2, 2, T)).astype(np.float32), HOSTILE_TOKENS,
                       special=[True] + [False] * (T - 2) + [True], kinds=["start"] + [""] * (T - 2) + ["end"])
    cap = cap.with_meta(model="\x1b]8;;http://evil.example\x07org/[bold]model\x1b]8;;\x07", text="\x1b[31mred")
    return cap.save(tmp_path / "hostile.npz")


@pytest.mark.parametrize("command", [["heatmap", "-t"], ["heads"], ["compare", "--layers", "0,1"], ["rollout"],
                                     ["entropy"], ["heads", "--csv"], ["heads", "--json"], ["rollout", "--json"]])
@pytest.mark.parametrize("color", [False, True])
def test_no_control_sequences_or_markup_reach_the_terminal(command, color, hostile_capture):
    env = {"FORCE_COLOR": "1", "COLUMNS": "200"} if color else {"NO_COLOR": "1", "COLUMNS": "200"}
    result = run(*command, "--from", hostile_capture, env=env)
    assert result.exit_code == 0, result.output
    shown = result.stdout
    # Rich's own colours are CSI ... m; nothing else may appear: no OSC, no clear-screen, no C1 CSI, no BEL
    for sequence in ("\x1b]", "\x1b[2J", "\x9b", "\x07", "\u202e"):
        assert sequence not in shown, (sequence, command)
    if not color:
        assert "\x1b" not in shown
    if "--json" not in command and "--csv" not in command and command[0] in ("heatmap", "heads", "rollout"):
        assert "␛" in shown or "\\x9b" in shown or "\\u202e" in shown  # made visible, not dropped


def test_markup_in_tokens_and_paths_is_printed_as_text(hostile_capture, tmp_path):
    result = run("rollout", "--from", hostile_capture, "--token", "[/x]")
    assert result.exit_code == 0 and "[/x]" in result.stdout
    target = tmp_path / "[bold]o.png"
    result = run("heatmap", "--from", hostile_capture, "-o", target)
    assert result.exit_code == 0 and result.stdout.strip() == str(target) and target.exists()
    assert "[/x]" in one_line_error(run("heatmap", "--from", hostile_capture, "--cmap", "[/x]"), 2)


def test_csv_cells_that_a_spreadsheet_would_run_are_escaped(tmp_path):
    tokens = ["=HYPERLINK(\"x\")", "+1", "-2", "@SUM(A1)", "ok"]
    a = np.zeros((1, 1, 5, 5), np.float32)
    a[:, :, :, 0] = 1.0  # every head's top key is token 0
    path = make_capture(a, tokens).save(tmp_path / "f.npz")
    lines = run("heads", "--from", path, "--csv").stdout.splitlines()
    header = lines[0].split(",")
    cell = lines[1].split(",")[header.index("top_key")]
    assert cell.startswith("\"'=") or cell.startswith("'=")
    rows = json.loads(run("heads", "--from", path, "--json").stdout)["heads"]
    assert rows[0]["top_key"] == tokens[0]  # JSON keeps the data exactly
    csv_rollout = run("rollout", "--from", path, "--csv").stdout
    assert "'+1" in csv_rollout and "'@SUM(A1)" in csv_rollout and "'-2" in csv_rollout


def test_json_is_strict_and_utf8_safe():
    from attnviz.base.records import to_json

    text = to_json({"a": float("nan"), "b": [float("inf"), 1.5], "c": "caf\udce9", "d": np.float32(0.5)})
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert data["a"] is None and data["b"] == [None, 1.5] and data["d"] == 0.5
    assert data["c"].startswith("caf\ufffd") and "\udce9" not in data["c"]
    text.encode("utf-8")
    escaped = to_json({"t": "\x1b[2J\x9b\u202e"})  # control characters escaped, the value kept exactly
    assert "\x1b" not in escaped and "\x9b" not in escaped and "\u202e" not in escaped
    assert json.loads(escaped) == {"t": "\x1b[2J\x9b\u202e"}


# --- 4. options and model folders ------------------------------------------------------------------


STREAMED = """
import resource, sys
import numpy as np
from attnviz.base.records import to_json, write_json

alpha = np.random.default_rng(0).random((6, 12, 512, 512), dtype=np.float32)  # α of 512 tokens, 75 MB
alpha[0, 0, 0, 0] = np.nan
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sink = open("/dev/null", "w")
if sys.argv[1] == "old":  # what the command did before
    sink.write(to_json({"tokens": ["a"] * 512, "attentions": alpha}))
else:
    write_json({"tokens": ["a"] * 512, "attentions": alpha}, sink)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.slow
def test_a_large_json_output_is_streamed_in_bounded_memory():
    """`capture --json` of 512 tokens peaked at 3.8 GB for a 75 MB α (nested Python lists, then one indented
    string): the writer streams arrays a row at a time, to the same text. Its growth here stays under 64 MiB
    over the array itself; to_json's, held to the same rule, would pass it by gigabytes."""
    import subprocess
    import sys

    grown = int(subprocess.run([sys.executable, "-c", STREAMED, "new"], capture_output=True, text=True,
                               check=True, timeout=600).stdout)
    assert grown < 64 << 20, grown


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.text(), st.none(),
                              st.booleans(),
                              st.lists(st.floats(width=32), min_size=1, max_size=6).map(
                                  lambda v: np.array(v, dtype=np.float32))),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children,
                                                                                       max_size=4),
                    max_leaves=20))
def test_the_streamed_json_is_the_same_text(value):
    import io

    from attnviz.base.records import to_json, write_json

    written = io.StringIO()
    write_json(value, written)
    assert written.getvalue() == to_json(value)


def test_hostile_option_values_are_usage_errors(tmp_path, hostile_capture):
    assert "out of range" in one_line_error(run("heads", "--from", hostile_capture, "--layer", "0-100000000"), 2)
    assert "not a layer" in one_line_error(run("heads", "--from", hostile_capture, "--layer", "0-1e30"), 2)
    assert one_line_error(run("verify", SENTENCE, "--tolerance", "nan"), 2)
    assert one_line_error(run("verify", SENTENCE, "--tolerance", "-1"), 2)
    assert "not one of" in one_line_error(run("verify", SENTENCE, "--device", "tpu"), 2)
    assert "not one of" in one_line_error(run("verify", SENTENCE, "--dtype", "int8"), 2)


def test_workers_are_capped_by_jobs_and_cores(hostile_capture, tmp_path):
    import os

    from attnviz.api.gallery import worker_count

    assert worker_count(1000, 5) == min(5, os.cpu_count() or 1)
    assert worker_count(1000, 1) == 1
    result = run("export", "--from", hostile_capture, "--out-dir", tmp_path / "e", "--workers", "1000")
    assert result.exit_code == 0, result.output


def test_special_ness_follows_the_ids_whatever_the_text(load_tiny):
    from attnviz.engine.forward import capture_text, encode

    loaded = load_tiny("bert")
    encoded = encode(loaded, "the [SEP] cat")
    tokens = dict(zip(encoded.tokens, encoded.special))
    assert tokens["[SEP]"] is True and tokens["cat"] is False
    assert sum(encoded.special) == 3  # [CLS], the typed [SEP], the closing [SEP]
    from attnviz.errors import InputError

    with pytest.raises(InputError, match="no tokens besides special"):
        capture_text("[CLS] [SEP] [PAD]", loaded)


def test_model_folder_without_tokenizer_is_refused(tmp_path):
    import transformers as tf

    tf.BertModel(tf.BertConfig(vocab_size=100, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                               num_hidden_layers=1)).save_pretrained(tmp_path)
    assert "no usable tokenizer" in one_line_error(run("heatmap", "x", "-m", tmp_path, "-t"))


def test_memory_budget_is_checked_before_running(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "1K")
    streamed = run("heatmap", SENTENCE, "-m", tiny_model_dir("gpt2"), "-t")  # over budget: streamed instead
    assert streamed.exit_code == 0 and "Streamed" in streamed.stderr and "over --max-memory" in streamed.stderr
    message = one_line_error(run("verify", SENTENCE, "-m", tiny_model_dir("gpt2")))  # cannot stream: refused
    assert "--max-memory" in message
    assert "(4 × 2 layers + 4 for the model's temporaries) × 4 heads × 6² weights" in message
    assert "6.8 KiB" in message  # (4·2 + 4)·4·6²·4 = 6,912 bytes: the formula shown gives the figure shown
    assert "--max-memory" in one_line_error(run("verify", SENTENCE, "-m", tiny_model_dir("gpt2"), "--max-memory", "2K"))
    assert one_line_error(run("verify", SENTENCE, "--max-memory", "lots"), 2)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "lots")
    assert "not a size" in one_line_error(run("heatmap", SENTENCE, "-m", tiny_model_dir("gpt2"), "-t"))


def test_undecodable_text_is_one_line(tiny_model_dir):
    assert "UTF-8" in one_line_error(run("heatmap", "caf\udce9", "-m", tiny_model_dir("gpt2"), "-t"))


def test_control_characters_typed_into_a_byte_level_model_are_shown_visibly(tiny_model_dir):
    """ESC and BEL typed into the text reach the terminal as the symbols ␛ and ␇, at their tokens' rows,
    never as control characters."""
    import attnviz

    folder = tiny_model_dir("gpt2")
    text = "the\x1b[2Jcat\x07"
    result = run("heatmap", text, "-m", folder, "-t", env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    tokens = attnviz.capture(text, model=folder).tokens
    rows = [line.split(maxsplit=1)[1][:12] for line in result.stdout.splitlines() if re.match(r"^\s*\d+ ", line)]
    assert len(rows) == len(tokens)
    escaped = [n for n, token in enumerate(tokens) if "\x1b" in token or "\x07" in token]
    assert escaped and all("␛" in rows[n] or "␇" in rows[n] for n in escaped)


def test_capture_too_large_to_read_back_is_not_written(tmp_path, monkeypatch):
    from attnviz.errors import OutputError

    monkeypatch.setenv("ATTNVIZ_MAX_CAPTURE_BYTES", "100")
    with pytest.raises(OutputError, match="ATTNVIZ_MAX_CAPTURE_BYTES"):
        make_capture(np.full((1, 1, 8, 8), 1 / 8, np.float32)).save(tmp_path / "big.npz")
    assert not list(tmp_path.iterdir())
    assert math.isfinite(1.0)


@pytest.mark.parametrize("name", ["ATTNVIZ_MAX_CAPTURE_BYTES", "ATTNVIZ_MEMORY_BUDGET", "ATTNVIZ_MAX_MODEL_BYTES"])
@pytest.mark.parametrize("value", ["abc", "1e99", "-1", "0", "nan", "inf", "12Q"])
def test_a_bad_size_in_the_environment_is_one_line_naming_it(name, value, tmp_path):
    from attnviz.base.sizes import size_from_env

    os.environ[name] = value
    try:
        with pytest.raises(Exception, match=name):
            size_from_env(name, 1)
    finally:
        del os.environ[name]


def test_a_bad_capture_limit_stops_the_command(tmp_path, cat_capture):
    path = cat_capture.save(tmp_path / "c.npz")
    for value in ("abc", "1e99", "-1"):
        line = one_line_error(run("heatmap", "--from", path, "-t", env={"ATTNVIZ_MAX_CAPTURE_BYTES": value}))
        assert "ATTNVIZ_MAX_CAPTURE_BYTES" in line
    assert run("heatmap", "--from", path, "-t", env={"ATTNVIZ_MAX_CAPTURE_BYTES": "2G"}).exit_code == 0
