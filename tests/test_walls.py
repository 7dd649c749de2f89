"""Untrusted input, round three, and the walls a newcomer hit: files that are not regular files, numbers in
state files, a pooled capture's statistics, token and seed arguments, environment variables, --force across
commands, standard input read once, what streamed runs say about T, unknown words at word level, help at 80
columns, and a glossary entry for every header the commands print."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import SENTENCE, make_capture, one_line_error, run

from attnviz.data.capture import Capture

TEXTS = ["The cat sat on the mat.", "A dog ran in the park!", "Attention is all you need."]


@pytest.fixture
def fifo(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this system")
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def run_bounded(*args, timeout=60, **kwargs):
    """attnviz in a fresh process with a time limit: a command that blocks fails the test instead of hanging."""
    return subprocess.run([sys.executable, "-m", "attnviz", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


# --- files that are not regular files never hang -------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["heatmap", "--text-file", "{fifo}", "-t"],
    ["corpus", "{fifo}"],
    ["corpus", "/dev/zero"],
    ["corpus", "merge", "{fifo}", "{fifo}", "-o", "{out}"],
    ["heatmap", "--from", "{fifo}", "-t"],
    ["capture", "--text-file", "/dev/zero", "-o", "{out}.npz"],
])
@pytest.mark.slow
def test_a_fifo_or_device_is_refused_at_once(args, fifo, tmp_path, tiny_model_dir):
    filled = [a.format(fifo=fifo, out=tmp_path / "out") for a in args]
    model = [] if "--from" in filled or "merge" in filled else ["-m", tiny_model_dir("bert")]
    start = time.monotonic()
    done = run_bounded(*filled, *model, timeout=120)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and ("FIFO" in lines[0] or "device" in lines[0]) and "Traceback" not in done.stderr
    assert time.monotonic() - start < 100
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.npz").exists()


@pytest.mark.slow
def test_sigterm_ends_an_endless_line_with_partial_statistics(tiny_model_dir, tmp_path):
    """`cat /dev/zero | attnviz corpus -` is one endless line: the reader skips it a block at a time, and
    SIGTERM stops it there, with attnviz's line, the partial statistics and exit 143."""
    process = subprocess.Popen([sys.executable, "-m", "attnviz", "corpus", "-", "-m", tiny_model_dir("bert"),
                                "-o", str(tmp_path / "out")], stdin=open("/dev/zero", "rb"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)  # the model loads, then the reader is inside the endless line
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert "terminated" in err and "partial" in err and "Traceback" not in err
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["partial"] is True and stats["texts"] == 0


# --- numbers in a state file are data --------------------------------------------------------------------


@pytest.fixture(scope="module")
def shard(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("shard")
    (folder / "t.txt").write_text("\n".join(TEXTS) + "\n")
    assert run("corpus", folder / "t.txt", "-m", tiny_model_dir("bert"), "-o", folder / "a").exit_code == 0
    return folder / "a"


def forged(tmp_path, shard, change, name="forged"):
    data = json.loads((shard / "stats.json").read_text())
    data["runs"] = ["another run"]
    change(data)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "stats.json").write_text(json.dumps(data) if isinstance(data, dict) else data)
    return folder


@pytest.mark.parametrize("change, words", [
    (lambda d: d["moments"]["texts"]["entropy"]["count"][0].__setitem__(0, 1e308), "out of range"),
    (lambda d: d["moments"]["texts"]["entropy"]["mean"][0].__setitem__(0, 1e300), "out of range"),
    (lambda d: d.__setitem__("texts", 10 ** 400), "'texts'"),
    (lambda d: d.__setitem__("tokens", -1), "'tokens'"),
    (lambda d: d["label_counts"][0][0].__setitem__(0, 2 ** 60), "label_counts"),
    (lambda d: d.__setitem__("bad", {"x": True}), "'bad'"),
    (lambda d: d.update(layers=4096, heads=4096), "over the limit"),
])
@pytest.mark.slow
def test_numbers_out_of_range_are_refused_in_one_line(tmp_path, shard, change, words):
    folder = forged(tmp_path, shard, change)
    line = one_line_error(run("corpus", "merge", shard, folder, "-o", tmp_path / "m"))
    assert words in line
    assert not (tmp_path / "m").exists()


def test_a_state_of_empty_lists_is_refused_before_it_is_parsed(tmp_path, shard, monkeypatch):
    """Memory stays bounded: a file of many JSON containers is refused by counting, not by parsing (the
    limit is lowered here so the file can stay small)."""
    import attnviz.corpora.state as corpus

    monkeypatch.setattr(corpus, "MAX_STATE_CONTAINERS", 1000)
    folder = tmp_path / "lists"
    folder.mkdir()
    (folder / "stats.json").write_text("[" + ",".join(["[]"] * 5000) + "]")
    with pytest.raises(Exception, match="JSON lists and objects"):
        corpus.load_state(folder)
    (folder / "stats.json").write_bytes(b" " * (corpus.MAX_STATE_BYTES + 1))
    with pytest.raises(Exception, match="larger than"):
        corpus.load_state(folder)


def test_merging_many_large_shards_stays_finite(tmp_path, shard):
    from attnviz.corpora import load_state, merge_states

    def big(d):
        for per in d["moments"].values():
            for entry in per.values():
                entry["count"] = [[2.0 ** 52] * len(row) for row in entry["count"]]
    states = [load_state(forged(tmp_path, shard, big, f"s{n}")) for n in range(3)]
    for n, state in enumerate(states):
        state.runs = [f"run {n}"]
    merged = merge_states(states)
    for per in merged.moments.values():
        for m in per.values():
            assert np.isfinite(m.count).all() and np.isfinite(m.mean).all() and np.isfinite(m.m2).all()


# --- a pooled capture's head statistics ------------------------------------------------------------------------


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
    result = run("heads", "--from", pooled, "--json")
    assert result.exit_code == 0, result.output


# --- token and seed arguments -----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["the#²", "the#١", "cat#³#2", "#", "the#", "\u00b2"])
def test_unusual_token_arguments_are_usage_errors(tmp_path, spec):
    tokens = ["[CLS]", "the", "cat", "the", "[SEP]"]
    alpha = np.full((1, 2, 5, 5), 0.2, np.float32)
    path = make_capture(alpha, tokens, special=[True, False, False, False, True],
                        kinds=["start", "", "", "", "end"]).save(tmp_path / "c.npz")
    one_line_error(run("token", "--from", path, spec), 2)


def test_token_number_in_ascii_digits_still_works(tmp_path):
    tokens = ["[CLS]", "the", "cat", "the", "[SEP]"]
    alpha = np.full((1, 2, 5, 5), 0.2, np.float32)
    path = make_capture(alpha, tokens, special=[True, False, False, False, True],
                        kinds=["start", "", "", "", "end"]).save(tmp_path / "c.npz")
    assert json.loads(run("token", "--from", path, "the#2", "--json").stdout)["token"] == 3


@pytest.mark.parametrize("seed", [str(2 ** 64), str(10 ** 40), "-1", "1.5", "x"])
def test_a_seed_out_of_range_is_a_usage_error(tiny_lm_dir, seed):
    line = one_line_error(run("generate", "the cat", "-m", tiny_lm_dir("gpt2"), "--sample", "--seed", seed), 2)
    assert "--seed" in line


def test_the_largest_seed_works(tiny_lm_dir):
    assert run("generate", "the cat", "-m", tiny_lm_dir("gpt2"), "--sample", "--seed", str(2 ** 64 - 1), "-n",
               "2").exit_code == 0


# --- environment variables ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ATTNVIZ_MAX_CAPTURE_BYTES", "ATTNVIZ_MEMORY_BUDGET", "ATTNVIZ_MAX_MODEL_BYTES"])
@pytest.mark.parametrize("value", ["abc", "1e99", "-1", "0", "nan", "inf", "12Q"])
def test_a_bad_size_in_the_environment_is_one_line_naming_it(name, value, tmp_path):
    from attnviz.sizes import size_from_env

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


# --- --force replaces only what the same command wrote --------------------------------------------------------


@pytest.mark.slow
def test_force_never_replaces_another_commands_folder(tmp_path, shard, cat_capture, tiny_model_dir):
    import shutil

    stats = tmp_path / "stats"
    shutil.copytree(shard, stats)
    before = {p.name: p.read_bytes() for p in stats.iterdir()}
    capture = cat_capture.save(tmp_path / "c.npz")
    line = one_line_error(run("export", "--from", capture, "--out-dir", stats, "--layers", "0", "--heads", "0",
                              "--force"))
    assert "corpus statistics" in line and "not an attnviz export" in line
    assert {p.name: p.read_bytes() for p in stats.iterdir()} == before
    exported = tmp_path / "exported"
    assert run("export", "--from", capture, "--out-dir", exported, "--layers", "0", "--heads", "0").exit_code == 0
    (tmp_path / "t.txt").write_text("The cat sat.\n")
    line = one_line_error(run("corpus", tmp_path / "t.txt", "-m", tiny_model_dir("bert"), "-o", exported,
                              "--force"))
    assert "export" in line
    # the same command still replaces its own folder
    assert run("export", "--from", capture, "--out-dir", exported, "--layers", "0", "--heads", "1",
               "--force").exit_code == 0
    assert run("corpus", tmp_path / "t.txt", "-m", tiny_model_dir("bert"), "-o", stats, "--force").exit_code == 0


def test_an_old_manifest_without_its_command_is_told_apart_by_its_files(tmp_path, shard, cat_capture):
    import shutil

    stats = tmp_path / "stats"
    shutil.copytree(shard, stats)
    manifest = json.loads((stats / "attnviz-export.json").read_text())
    manifest.pop("folder")
    (stats / "attnviz-export.json").write_text(json.dumps(manifest))
    line = one_line_error(run("export", "--from", cat_capture.save(tmp_path / "c.npz"), "--out-dir", stats,
                              "--layers", "0", "--heads", "0", "--force"))
    assert "corpus statistics" in line


# --- standard input, read once, on every command ----------------------------------------------------------------

STDIN_COMMANDS = [
    ["heatmap", "-", "-t"], ["heatmap", "-", "-o", "{tmp}/h.png"], ["capture", "-", "-o", "{tmp}/c.npz"],
    ["export", "-", "--out-dir", "{tmp}/e", "--layers", "0", "--heads", "0"], ["view", "-", "-o", "{tmp}/v.html"],
    ["heads", "-"], ["entropy", "-"], ["compare", "-", "--layers", "0,1"], ["rollout", "-"], ["token", "-", "cat"],
    ["steps", "-"], ["positions", "-"], ["norms", "-"], ["sinks", "-"], ["verify", "-"], ["scaling", "-"],
    ["heads", "-", "--words"], ["heads", "-", "--stream"],
]


@pytest.mark.parametrize("args", STDIN_COMMANDS, ids=lambda a: " ".join(a[:3]))
@pytest.mark.slow
def test_every_command_reads_standard_input(args, tmp_path, tiny_model_dir):
    filled = [a.format(tmp=tmp_path) for a in args]
    result = run(*filled, "-m", tiny_model_dir("bert"), input=SENTENCE + "\n")
    assert result.exit_code == 0, result.output
    assert "empty" not in result.stderr


def test_generate_reads_standard_input(tiny_lm_dir):
    result = run("generate", "-", "-m", tiny_lm_dir("gpt2"), "-n", "3", "--json", input="the cat\n")
    assert result.exit_code == 0 and json.loads(result.stdout)["prompt"] == "the cat"


@pytest.mark.parametrize("how", ["text", "stdin", "file"])
@pytest.mark.parametrize("path", ["full", "stream", "words"])
@pytest.mark.slow
def test_what_heads_says_of_its_input_matches_the_input(how, path, tmp_path, load_tiny, tiny_model_dir):
    """T printed = the tokens of the input, on the full, streamed and word-level paths, from each source."""
    from attnviz.engine.forward import encode

    text = "The cat sat on the mat. A dog ran in the park!"
    T = len(encode(load_tiny("bert"), text).token_ids)
    (tmp_path / "t.txt").write_text(text)
    source = {"text": [text], "stdin": ["-"], "file": ["--text-file", tmp_path / "t.txt"]}[how]
    extra = {"full": [], "stream": ["--stream", "--pool", "4"], "words": ["--words"]}[path]
    result = run("heads", *source, *extra, "-m", tiny_model_dir("bert"), input=text if how == "stdin" else None,
                 env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    words = len(re.findall(r"\w+|[.!]", text)) + 2
    shown = int(re.search(r"T = (\d+)", result.stdout).group(1))
    assert shown == (words if path == "words" else T)


def test_streamed_entropy_uses_the_inputs_T(tmp_path, tiny_model_dir, load_tiny):
    from attnviz.engine.forward import encode

    text = "The cat sat on the mat. A dog ran in the park!"
    T = len(encode(load_tiny("bert"), text).token_ids)
    data = json.loads(run("entropy", text, "-m", tiny_model_dir("bert"), "--stream", "--json").stdout)
    assert data[0]["uniform"] == pytest.approx(np.log(T))
    result = run("entropy", text, "-m", tiny_model_dir("bert"), "--stream", "-o", tmp_path / "e.png",
                 env={"NO_COLOR": "1"})
    assert f"T = {T}" in result.stdout and "T = 1 " not in result.stdout


# --- words the model cannot read, at word level -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [[], ["--stream"]])
def test_unknown_words_are_marked_at_word_level_too(tiny_model_dir, stream):
    data = json.loads(run("heads", "나는 사과를 🍕 먹었다", "-m", tiny_model_dir("bert"), "--words", "--json",
                          *stream).stdout)
    result = run("heatmap", "나는 사과를 🍕 먹었다", "-m", tiny_model_dir("bert"), "--words", "-t", *stream,
                 env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0 and data
    assert "[UNK:🍕]" in result.stdout and "[UNK:먹었다]" in result.stdout


def test_partly_unknown_words_say_which_part():
    from attnviz.words import to_words

    alpha = np.full((1, 1, 4, 4), 0.25, np.float32)
    capture = make_capture(alpha, ["[CLS]", "ab", "##[UNK:🍕]", "[SEP]"], special=[True, False, False, True],
                           kinds=["start", "", "", "end"])
    capture = Capture(**{**capture.__dict__, "subword": np.array([False, False, True, False]),
                         "token_ids": np.array([0, 5, 9, 1])}).with_meta(unk_token_id=9, text="ab🍕")
    words = to_words(capture)
    assert words.tokens[1].endswith("[UNK:🍕]") and words.tokens[1].startswith("ab")


# --- steps: one layer and one head, said before any model loads ------------------------------------------------


@pytest.mark.parametrize("command, args", [
    *(("steps", ["--head", h]) for h in ("mean", "all", "0-2", "0,1")),
    *((c, ["--layer", v]) for c in ("steps", "positions") for v in ("all", "1-2", "0,1"))])
def test_one_layer_and_head_commands_say_so_before_loading(command, args):
    result = run(command, "The cat", *args, "-m", "/no/such/model")  # the model would fail differently
    line = one_line_error(result, 2)
    assert "one index" in line and "no such" not in line


# --- help at 80 columns ------------------------------------------------------------------------------------------


def commands() -> list[str]:
    from attnviz.cli import command_group

    return sorted(command_group().commands)


@pytest.mark.parametrize("command", commands())
def test_help_is_readable_at_80_columns(command):
    result = run(command, "--help", env={"COLUMNS": "80", "NO_COLOR": "1"}, terminal_width=80)
    assert result.exit_code == 0
    text = result.stdout.replace("FILE…", "").replace("DIR…", "")
    assert not re.search(r"[^\s(]…", text), f"{command}: a word cut short: " + \
        next(line for line in text.splitlines() if re.search(r"[^\s(]…", line))
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize("command", ["steps", "positions", "norms", "sinks", "scaling"])
def test_single_attention_commands_list_no_encoder_decoder_options(command):
    result = run(command, "--help", env={"COLUMNS": "200"})
    assert "--target" not in result.stdout and "--max-new-tokens" not in result.stdout


# --- every header any command prints is explainable ----------------------------------------------------------


def header_cells(output: str) -> list[str]:
    """The column headers of every table in a command's plain output: the line above a rule of ─, cut at runs
    of two or more spaces."""
    lines = output.splitlines()
    cells = []
    for above, line in zip(lines, lines[1:]):
        if re.fullmatch(r"\s*─{3,}[─\s]*", line):
            cells += [c.strip() for c in re.split(r"\s{2,}", above) if c.strip()]
    return cells


def explainable(cell: str, tokens: set[str]) -> bool:
    from attnviz.metrics import lookup

    if re.fullmatch(r"-?\d+", cell) or cell in tokens or lookup(cell):
        return True
    vector = re.fullmatch(r"(‖)?(q|k|v|out)(‖)?(\[\d+\])?", cell)
    if vector:
        return bool(lookup(vector.group(2)))
    parts = [p.strip() for p in cell.split(",")]
    if len(parts) > 1:
        return all(explainable(p, tokens) or re.fullmatch(r"token \d+", p) for p in parts)
    words = cell.split()
    return len(words) > 1 and all(explainable(w, tokens) for w in words)


@pytest.fixture(scope="module")
def every_output(tmp_path_factory, tiny_model_dir, tiny_lm_dir):
    folder = tmp_path_factory.mktemp("outputs")
    (folder / "t.txt").write_text("\n".join(TEXTS) + "\n")
    bert, lm = tiny_model_dir("bert"), tiny_lm_dir("gpt2")
    it = "The cat sat on the mat because it was tired"
    runs = [["heads", it, "-m", bert], ["entropy", it, "-m", bert], ["sinks", it, "-m", bert],
            ["norms", it, "-m", bert], ["verify", it, "-m", bert], ["scaling", it, "-m", bert],
            ["positions", it, "-m", bert], ["steps", it, "-m", bert], ["token", it, "it", "-m", bert],
            ["corpus", folder / "t.txt", "-m", bert], ["generate", "the cat", "-m", lm, "-n", "3", "--terminal"],
            ["heads", it, "-m", bert, "--words"], ["rollout", it, "-m", bert], ["compare", it, "-m", bert]]
    outputs = []
    for args in runs:
        result = run(*args, env={"NO_COLOR": "1", "COLUMNS": "250"})
        assert result.exit_code == 0, (args, result.output)
        outputs.append((args[0], result.stdout))
    return outputs


@pytest.mark.slow
def test_every_table_header_has_an_explanation(every_output):
    tokens = {"[CLS]", "[SEP]"} | {w.lower() for w in "The cat sat on the mat because it was tired".split()}
    missing = {(command, cell) for command, output in every_output for cell in header_cells(output)
               if not explainable(cell, tokens)}
    assert not missing, "; ".join(f"{c}: {h}" for c, h in sorted(missing))
    assert sum(len(header_cells(o)) for _, o in every_output) > 60  # the walk found the tables


def test_legend_abbreviations_have_explanations(every_output):
    from attnviz.metrics import lookup

    compare = next(o for c, o in every_output if c == "compare")
    legend = next(line for line in compare.splitlines() if line.startswith("H:"))
    for abbreviation in re.findall(r"(?:^|· )(\S+):", legend):
        assert lookup(abbreviation), abbreviation


@pytest.mark.parametrize("term", ["H", "d_k", "softmax", "entropy_tokens", "tok-w", "label_share", "by norm",
                                  "stream", "lift", "stripe", "√d_k", "T"])
def test_the_terms_a_newcomer_looked_for(term):
    result = run("explain", term)
    assert result.exit_code == 0 and term.split()[0] in result.stdout


def test_the_glossary_walk_can_fail():
    assert not explainable("no-such-header", set())


# --- what a student looked for ----------------------------------------------------------------------------------


def test_one_number_format_per_picture():
    from attnviz.render.png import value_format

    write = value_format(np.array([0.0, 1.41, 2.3]))
    assert [write(v) for v in (0.0, 1.41, 2.3)] == ["0.00", "1.41", "2.30"]
    write = value_format(np.array([0.0, 0.25]))
    assert [write(v) for v in (0.0, 0.25)] == [".00", ".25"]
    assert value_format(np.array([3.0, 42.0]))(3.0) == "3.0"


def test_entropy_layers_and_the_american_spelling(tiny_model_dir):
    data = json.loads(run("entropy", SENTENCE, "-m", tiny_model_dir("bert"), "--layer", "1", "--json").stdout)
    assert {r["layer"] for r in data} == {1}
    full = json.loads(run("entropy", SENTENCE, "-m", tiny_model_dir("bert"), "--json", "--normalized").stdout)
    same = json.loads(run("entropy", SENTENCE, "-m", tiny_model_dir("bert"), "--json", "--normalised").stdout)
    assert full == same and {r["uniform"] for r in full} == {1.0}


def test_sinks_draws_a_picture(tiny_model_dir, tmp_path):
    result = run("sinks", SENTENCE, "-m", tiny_model_dir("bert"), "-o", tmp_path / "s.png")
    assert result.exit_code == 0 and (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_and_token_write_csv(tiny_model_dir):
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(run("compare", SENTENCE, "-m", tiny_model_dir("bert"), "--layers",
                                               "0,1", "--csv").stdout)))
    panels = json.loads(run("compare", SENTENCE, "-m", tiny_model_dir("bert"), "--layers", "0,1", "--json").stdout)
    assert [int(r["layer"]) for r in rows] == [p["layer"] for p in panels["panels"]]
    assert float(rows[0]["entropy"]) == pytest.approx(panels["panels"][0]["entropy"])
    data = json.loads(run("token", SENTENCE, "cat", "-m", tiny_model_dir("bert"), "--json").stdout)
    rows = list(csv.DictReader(io.StringIO(run("token", SENTENCE, "cat", "-m", tiny_model_dir("bert"),
                                               "--csv").stdout)))
    T = len(data["tokens"])
    assert len(rows) == len(data["layers"]) * 4 * T
    row = rows[T + 3]  # layer 0, head 1, other token 3
    assert float(row["attends_to"]) == pytest.approx(data["attends_to"][0][1][3], abs=1e-6)
    assert float(row["attended_by"]) == pytest.approx(data["attended_by"][0][1][3], abs=1e-6)


@pytest.mark.slow
def test_scaling_at_the_chosen_d_k(tiny_model_dir):
    data = json.loads(run("scaling", SENTENCE, "-m", tiny_model_dir("bert"), "--dk", "16,64,256", "--json").stdout)
    rows = {r["d_k"]: r for r in data["synthetic_dk"]}
    assert set(rows) == {data["d_k"], 16, 64, 256}
    for d, r in rows.items():
        assert r["std_raw"] == pytest.approx(np.sqrt(d), rel=0.05) and r["std_scaled"] == pytest.approx(1, rel=0.05)
    assert rows[256]["entropy_raw"] < rows[16]["entropy_raw"] < rows[16]["entropy_scaled"]
    for bad in ("0", "5000", "a,b", ",".join(["8"] * 9)):
        assert "--dk" in one_line_error(run("scaling", SENTENCE, "-m", tiny_model_dir("bert"), "--dk", bad), 2)


@pytest.mark.slow
def test_positions_shows_the_position_embeddings_similarity(tiny_model_dir, load_tiny, tmp_path):
    data = json.loads(run("positions", SENTENCE, "-m", tiny_model_dir("bert"), "--json").stdout)
    similarity = np.array(data["position_similarity"])
    table = load_tiny("bert").model.embeddings.position_embeddings.weight.detach().double().numpy()
    n = len(similarity)
    by_hand = np.array([[table[i] @ table[j] / np.linalg.norm(table[i]) / np.linalg.norm(table[j])
                         for j in range(n)] for i in range(n)])
    np.testing.assert_allclose(similarity, by_hand, atol=1e-6)
    assert n == min(64, len(table))
    assert run("positions", SENTENCE, "-m", tiny_model_dir("bert"), "-o", tmp_path / "p.png").exit_code == 0


def test_the_export_grid_names_each_heads_pattern(cat_capture, tmp_path):
    from attnviz.gallery import export_panels
    from attnviz.metrics import head_records
    from attnviz.render.png import grid_figure

    panels = [p for p in export_panels(cat_capture, [0, 1], [0, 1, 2]) if p.head != "mean"]
    labels = {(r["layer"], r["head"]): r["label"] for r in head_records(cat_capture)}
    grid = grid_figure(cat_capture, panels, [0, 1], [0, 1, 2], labels=labels)
    drawn = [t.get_text() for t in grid.axes.texts]
    assert drawn == [labels[layer, head][:16] for layer in (0, 1) for head in (0, 1, 2)]
    assert grid.tiles is not None and grid.tiles.sum() == 6 * panels[0].matrix.size * (64 // 8) ** 2


def test_a_truncated_text_says_so_in_its_figures(tiny_model_dir, load_tiny):
    from attnviz.engine.forward import capture_text
    from attnviz.panels import text_subtitle

    with pytest.warns(Warning):
        capture = capture_text(" ".join(["the cat sat"] * 200), load_tiny("bert"))
    assert capture.meta["dropped_tokens"] > 0
    assert text_subtitle(capture).startswith(f"cut to the model's {capture.n_tokens} tokens, the last "
                                             f"{capture.meta['dropped_tokens']} dropped")
