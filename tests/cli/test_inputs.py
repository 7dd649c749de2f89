"""What a command reads: TEXT, - (standard input, read once) or --text-file on every command; files that
are not regular files refused at once; what a command says of its input (T, counts) matches the input on
the full, streamed and word-level paths."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from helpers import SENTENCE, one_line_error, run, run_bounded


@pytest.fixture
def fifo(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this system")
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


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
    done = run_bounded(*filled, *model, timeout=120)  # a command that blocks fails here instead of hanging
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and ("FIFO" in lines[0] or "device" in lines[0]) and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.npz").exists()


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
    """`-` reads the text from standard input: the command's --json is the same as with the text as TEXT."""
    model = ("-m", tiny_model_dir("bert"))

    def printed(text: str, stdin: str | None, where: str) -> dict:
        filled = [text if a == "-" else a.format(tmp=tmp_path / where) for a in args]
        result = run(*filled, *model, "--json", input=stdin)
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        return {k: v for k, v in data.items() if k != "folder"} if isinstance(data, dict) else data

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert printed("-", SENTENCE + "\n", "a") == printed(SENTENCE, None, "b")


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
    data = json.loads(run("entropy", text, "-m", tiny_model_dir("bert"), "--stream", "--json").stdout)["heads"]
    assert data[0]["uniform"] == pytest.approx(np.log(T))
    result = run("entropy", text, "-m", tiny_model_dir("bert"), "--stream", "-o", tmp_path / "e.png",
                 env={"NO_COLOR": "1"})
    assert f"T = {T}" in result.stdout and "T = 1 " not in result.stdout


def test_text_from_stdin_and_from_a_file(tiny_model_dir, tmp_path):
    model = tiny_model_dir("gpt2")
    piped = run("heads", "-", "-m", model, "--json", input="The cat sat on the mat\n")
    typed = run("heads", SENTENCE, "-m", model, "--json")
    assert piped.exit_code == 0 and json.loads(piped.stdout) == json.loads(typed.stdout)
    path = tmp_path / "text.txt"
    path.write_text("The cat sat on the mat\n", encoding="utf-8")
    from_file = run("heads", "--text-file", path, "-m", model, "--json")
    assert from_file.exit_code == 0 and json.loads(from_file.stdout) == json.loads(typed.stdout)
    path.write_bytes(b"caf\xe9")
    assert "not UTF-8" in one_line_error(run("heads", "--text-file", path, "-m", model))
    assert "either TEXT or --text-file" in one_line_error(run("heads", "x", "--text-file", path, "-m", model), 2)


@pytest.mark.parametrize("kind", ["bert", "distilbert", "gpt2", "llama", "qwen3", "gemma2"])
def test_the_config_gives_the_shape_the_capture_has(kind, tiny_model_dir, load_tiny):
    """attnviz.model_shape reads (layers, heads) from config.json alone: the shape of the model's α."""
    import attnviz
    from attnviz.engine.forward import capture_text

    capture = capture_text(SENTENCE, load_tiny(kind))
    assert attnviz.model_shape(tiny_model_dir(kind)) == (capture.n_layers, capture.n_heads)


def test_a_selection_out_of_range_is_refused_before_the_weights_load(tiny_model_dir, tiny_seq2seq_dir, monkeypatch):
    """--layer and --head are checked against the config before any weights load (one line, exit 2); where
    the config cannot say cheaply (an encoder-decoder model, a Hub id), nothing is decided early."""
    import attnviz
    from attnviz.engine import models

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(models, "load", no_weights)
    bert = tiny_model_dir("bert")
    layers, heads = attnviz.model_shape(bert)
    for args, words in ((["heatmap", SENTENCE, "--layer", str(layers), "-t"], f"there are {layers} layers"),
                        (["steps", SENTENCE, "--head", str(heads)], f"there are {heads} heads"),
                        (["heads", SENTENCE, "--layer", f"0-{layers}"], f"there are {layers} layers"),
                        (["view", SENTENCE, "--layer", "-99", "-o", "never.html"], f"there are {layers} layers")):
        assert words in one_line_error(run(*args, "-m", bert), 2), args
    assert attnviz.model_shape(tiny_seq2seq_dir("t5")) is None
    assert attnviz.model_shape("someone/not-here") is None


@pytest.mark.parametrize("args", [["--language", "ko"], ["--task", "translate"], ["--language", "ko", "--task",
                                                                                     "translate"]])
def test_a_speech_option_on_text_a_picture_or_a_capture_is_a_usage_error(args, tmp_path):
    """`heads 'The cat' --language ko --task translate` exited 0, the options read and dropped: an option that does
    not apply to the input is a usage error (exit 2, before any model loads), as --image-size without --image is."""
    from helpers import one_line_error, photo, run

    picture = tmp_path / "p.png"
    picture.write_bytes(photo())
    for source in (["The cat sat on the mat"], ["--image", picture], ["--from", tmp_path / "none.npz"]):
        line = one_line_error(run("heads", *source, *args, "-m", "/nonexistent"), 2)
        assert args[0] in line and "--audio" in line


CORPUS = ["The cat sat on the mat.", "A dog ran in the park!", "Attention is all you need.", "Birds sing."]


@pytest.mark.parametrize("args", [
    ["faithfulness", "--corpus", "{file}", "--methods", "attention", "--sanity", "0", "--orders", "20", "--json"],
    ["importance", "--corpus", "{file}", "--json"],
    ["sinks", "--corpus", "{file}", "--json"],
    ["ablate", SENTENCE, "--heads", "0", "--layer", "0", "--mode", "mean", "--mean-over", "{file}", "--json"],
    ["massive", SENTENCE, "--intervene", "--reference", "{file}", "--ratio", "1.5", "--minimum", "0", "--json"],
    ["corpus", "{file}", "--json"],
])
def test_every_command_reading_texts_reads_json_lines_on_standard_input(args, tmp_path, tiny_model_dir):
    """JSON lines on standard input (`--corpus -`) are read as JSON lines, as a .jsonl file is: the result
    equals the one for the same texts one per line in a .txt file (it measured each line's raw JSON before);
    plain lines on standard input stay plain, a .txt file of JSON objects stays text, and TEXT and the texts
    cannot both come from standard input."""
    model = ["-m", tiny_model_dir("gpt2" if args[0] in ("faithfulness", "massive") else "bert")]
    plain = tmp_path / "texts.txt"
    plain.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    lines = "\n".join(json.dumps({"text": t, "id": n}) for n, t in enumerate(CORPUS)) + "\n"

    def answer(file, **kwargs):
        done = run(*[a.format(file=file) for a in args], *model, **kwargs)
        assert done.exit_code == 0, (done.output, done.stderr)
        data = json.loads(done.stdout)
        data.get("summary", {}).pop("sources", None)  # corpus: the file's name, or "standard input"
        return data.pop("source", None), data

    _, expected = answer(plain)
    assert answer("-", input=lines)[1] == expected
    _, blank_first = answer("-", input="\n" + lines)  # the first line that holds text decides
    if "summary" in expected:  # corpus counts the blank line
        counted = {"lines": len(CORPUS) + 1, "bad_lines": 1, "bad_reasons": {"empty": 1}}
        assert {key: blank_first["summary"].pop(key) for key in counted} == counted
        blank_first["summary"].update({key: expected["summary"][key] for key in counted})
    assert blank_first == expected
    assert answer("-", input=plain.read_text())[1] == expected
    as_text = tmp_path / "objects.txt"
    as_text.write_text(lines, encoding="utf-8")
    assert answer(as_text)[1] != expected
    if "{file}" in args[1:] and SENTENCE in args:
        stdin_twice = [("-" if a == SENTENCE else a.format(file="-")) for a in args]
        assert "standard input" in one_line_error(run(*stdin_twice, *model, input=lines), 2)
