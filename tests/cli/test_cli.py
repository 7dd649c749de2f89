"""The CLI through typer's CliRunner: every command, and every error a user can cause."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from helpers import SENTENCE, make_capture, one_line_error, rendered, run

from attnviz import __version__
from attnviz.data.capture import Capture


def test_version_and_help():
    assert run("--version").stdout.strip() == f"attnviz {__version__}"
    result = run("--help")
    assert result.exit_code == 0 and "heatmap" in result.stdout and "capture" in result.stdout


def test_the_top_level_help_loads_no_command_module_and_nothing_heavy():
    """`attnviz --help` lists every command from attnviz.cli.COMMANDS without importing a command's module
    (nor numpy, matplotlib, torch); running one command imports its module only."""
    import json
    import subprocess
    import sys

    probe = ("import sys, json; sys.argv = ['attnviz'] + {args!r}\nfrom attnviz.cli import main\ntry: main()\n"
             "except SystemExit: pass\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('attnviz.cli.') "
             "or m in ('numpy', 'matplotlib', 'torch', 'transformers'))), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe.format(args=["--help"])], capture_output=True, text=True)
    from attnviz.cli import COMMANDS

    command_modules = {f"attnviz.cli.{module}" for module, _ in COMMANDS.values()}
    assert all(name in done.stdout for name in COMMANDS)
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert "attnviz.cli.group" in loaded and not set(loaded) & (command_modules | {"numpy", "matplotlib", "torch",
                                                                                   "transformers"})
    done = subprocess.run([sys.executable, "-c", probe.format(args=["explain", "entropy"])], capture_output=True,
                          text=True)
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert "entropy" in done.stdout and set(loaded) & command_modules == {"attnviz.cli.stats"}


def test_the_command_table_is_what_the_modules_register():
    """Each name in COMMANDS is registered by the module the table names, and no module registers a command
    the table (and so `attnviz --help`) does not list."""
    import importlib

    import typer.main

    from attnviz.cli import COMMANDS, app

    for module in {module for module, _ in COMMANDS.values()}:
        importlib.import_module(f"attnviz.cli.{module}")
    home = {info.name or typer.main.get_command_name(info.callback.__name__): info.callback.__module__
            for info in app.registered_commands}
    for name, (module, summary) in COMMANDS.items():
        assert home.get(name) == f"attnviz.cli.{module}", name
        assert summary.endswith(".") and len(summary) < 90
    registered = [info.name or typer.main.get_command_name(info.callback.__name__) for info in app.registered_commands]
    assert sorted(registered) == sorted(COMMANDS)


@pytest.fixture(scope="module")
def saved_capture(tmp_path_factory, tiny_model_dir):
    path = tmp_path_factory.mktemp("cap") / "gpt2.npz"
    result = run("capture", SENTENCE, "-m", tiny_model_dir("gpt2"), "-o", path, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert str(path) in result.stdout and "2 layers × 4 heads" in result.stdout
    return path


def test_capture_then_heatmap_from_capture(saved_capture, tmp_path):
    cap = Capture.load(saved_capture)
    assert cap.causal and cap.n_layers == 2
    png = tmp_path / "out" / "l0.png"
    result = run("heatmap", "--from", saved_capture, "--layer", "0", "--head", "2", "-o", png)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_heatmap_default_writes_png_in_cwd(saved_capture, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("heatmap", "--from", saved_capture)
    assert result.exit_code == 0, result.output
    assert (tmp_path / result.stdout.strip()).is_file() and result.stdout.strip().endswith(".png")


def test_heatmap_all_layers_svg_and_pdf(saved_capture, tmp_path):
    """Every layer as a vector file: the SVG holds a panel titled for each layer, the PDF is a PDF."""
    import attnviz

    layers = attnviz.load_capture(saved_capture).n_layers
    for suffix in (".svg", ".pdf"):
        result = run("heatmap", "--from", saved_capture, "--layer", "all", "-o", tmp_path / f"all{suffix}")
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == str(tmp_path / f"all{suffix}")
    svg = (tmp_path / "all.svg").read_text(encoding="utf-8")
    assert svg.startswith("<?xml") and all(f"layer {n}" in svg for n in range(layers))
    assert (tmp_path / "all.pdf").read_bytes()[:5] == b"%PDF-"


def test_heatmap_terminal(saved_capture):
    """The terminal heatmap is attnviz.heatmap's report: a row per token in order, the future marked (causal)."""
    import attnviz

    result = run("heatmap", "--from", saved_capture, "--terminal", "--head", "max")
    assert result.exit_code == 0, result.output
    expected = attnviz.heatmap(attnviz.load_capture(saved_capture), head="max")
    assert result.stdout == rendered(expected)
    tokens = list(expected.capture.tokens)
    rows = [line.split()[1] for line in result.stdout.splitlines() if re.match(r"^\s*\d+ ", line)]
    assert rows == tokens and "·" in result.stdout  # causal: future cells marked


@pytest.mark.slow
def test_heatmap_default_model_terminal_hide_special():
    """--hide-special leaves [CLS] and [SEP] out of the rows: the rows are the sentence's words, in order."""
    result = run("heatmap", SENTENCE, "--terminal", "--hide-special", "--layer", "0", "--head", "3")
    assert result.exit_code == 0, result.output
    rows = [line.split()[1] for line in result.stdout.splitlines() if re.match(r"^\s*\d+ ", line)]
    assert rows == SENTENCE.lower().split()


@pytest.mark.parametrize("args,message,code", [
    (["heatmap", "   "], "empty", 1),
    (["heatmap", "--from", "{cap}", "--layer", "7"], "layer 7 is out of range", 2),
    (["heatmap", "--from", "{cap}", "--layer", "-3"], "0..1", 2),
    (["heatmap", "--from", "{cap}", "--head", "4"], "0..3", 2),
    (["heatmap", "--from", "{cap}", "-o", "x.bmp"], ".bmp", 1),
    (["heatmap", "--from", "{cap}", "-o", "/proc/nope/x.png"], "cannot write", 1),
    (["heatmap", "--from", "{cap}", "--cmap", "nocolormap"], "colormap", 2),
    (["heatmap", "x", "-m", "some-org/not-cached-anywhere"], "work offline", 1),
    (["heatmap", "x", "-m", "{tmp}"], "not a Hugging Face model", 1),
    (["heatmap", "--from", "{bad}"], "not an attnviz capture", 1),
    (["heatmap", "--from", "{missing}"], "not found", 1),
    (["capture", "x", "-o", "x.txt"], ".npz", 1),
])
def test_user_errors_are_one_line(args, message, code, saved_capture, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    fill = dict(cap=saved_capture, tmp=tmp_path, bad=bad, missing=tmp_path / "missing.npz")
    result = run(*[a.format(**fill) for a in args])
    assert message in one_line_error(result, code)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz"]  # nothing half-written


def test_usage_errors_keep_exit_2(saved_capture):
    """Each malformed option is one line, exit 2, naming the option and what it takes."""
    assert "'seven' is not a layer selection" in one_line_error(run("heatmap", "--from", saved_capture, "--layer",
                                                                    "seven"), 2)
    assert "'avg' is not a head selection" in one_line_error(run("heatmap", "--from", saved_capture, "--head",
                                                                 "avg"), 2)
    assert "give the TEXT to look at" in one_line_error(run("heatmap"), 2)  # neither TEXT nor --from
    assert "not both" in one_line_error(run("heatmap", "text", "--from", saved_capture), 2)


def test_truncation_warning_is_one_line(tiny_model_dir, tmp_path):
    long_text = " ".join(["The cat sat on the mat."] * 40)
    result = run("capture", long_text, "-m", tiny_model_dir("gpt2"), "-o", tmp_path / "c.npz")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and "dropped" in warnings[0]
    assert Capture.load(tmp_path / "c.npz").n_tokens == 64
    result = run("capture", long_text, "-m", tiny_model_dir("gpt2"), "-o", tmp_path / "d.npz", "--no-truncate")
    assert "at most 64" in one_line_error(result)
    assert not (tmp_path / "d.npz").exists()


def test_python_dash_m_works(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "attnviz", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == f"attnviz {__version__}"


def test_verify_passes_with_table_and_json(tiny_model_dir):
    result = run("verify", SENTENCE, "-m", tiny_model_dir("llama"))
    assert result.exit_code == 0, result.output
    assert "PASS" in result.stdout and "worst head" in result.stdout
    import json

    result = run("verify", SENTENCE, "-m", tiny_model_dir("gpt2"), "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["passed"] is True and data["tolerance"] == 1e-5
    assert len(data["layers"]) == 2 and data["max_abs_diff"] <= 1e-5


def test_verify_fails_with_distinct_exit_code(tiny_model_dir):
    """Tolerance 0: float32 rounding alone fails it; exit 3, FAIL and by how much, in the table and --json."""
    result = run("verify", SENTENCE, "-m", tiny_model_dir("bert"), "--tolerance", "0")
    assert result.exit_code == 3, result.output
    assert "FAIL means" in result.stdout and "> tolerance 0" in result.stdout
    data = json.loads(run("verify", SENTENCE, "-m", tiny_model_dir("bert"), "--tolerance", "0", "--json").stdout)
    assert not data["passed"] and data["tolerance"] == 0 and 0 < data["max_abs_diff"] < 1e-5


def test_verify_unsupported_architecture_is_one_line(tmp_path):
    import transformers as tf

    tf.AlbertModel(tf.AlbertConfig(vocab_size=30522, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                                   num_hidden_layers=1, embedding_size=8)).save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    from attnviz.engine.models import bundled_model_dir

    AutoTokenizer.from_pretrained(str(bundled_model_dir())).save_pretrained(tmp_path)
    assert "no adapter for 'albert'" in one_line_error(run("verify", SENTENCE, "-m", tmp_path))


@pytest.mark.slow
def test_scaling_table_json_and_plot(tiny_model_dir, tmp_path):
    import json

    result = run("scaling", SENTENCE, "-m", tiny_model_dir("bert"), "-o", tmp_path / "s.png")
    assert result.exit_code == 0, result.output
    assert "std QKᵀ" in result.stdout and "7.9" in result.stdout  # synthetic d_k=64 check ≈ 8
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads(run("scaling", SENTENCE, "-m", tiny_model_dir("bert"), "--json").stdout)
    assert data["d_k"] == 8 and len(data["layers"]) == 2
    assert abs(data["synthetic_d64"]["std_scaled"] - 1.0) < 0.02


@pytest.fixture(scope="module")
def minilm_capture(tmp_path_factory):
    path = tmp_path_factory.mktemp("mini") / "cat.npz"
    assert run("capture", SENTENCE, "-o", path).exit_code == 0
    return path


@pytest.mark.slow
def test_heads_json_filter_sort_top(minilm_capture, tmp_path):
    import json

    from PIL import Image

    drawn = run("heads", "--from", minilm_capture, "--sort", "prev", "-o", tmp_path / "heads.png")
    assert drawn.exit_code == 0 and Image.open(tmp_path / "heads.png").size[0] > 300  # the layers × heads grid

    result = run("heads", "--from", minilm_capture, "--layer", "0", "--sort", "prev", "--desc", "--top", "3", "--json")
    rows = json.loads(result.stdout)["heads"]
    assert result.exit_code == 0 and len(rows) == 3
    assert rows[0]["layer"] == 0 and rows[0]["head"] == 2 and rows[0]["label"] == "previous-token"
    assert rows[0]["prev"] >= rows[1]["prev"] >= rows[2]["prev"]
    result = run("heads", "--from", minilm_capture, "--label", "previous-token", "--csv")
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("layer,head,entropy") and all(line.endswith("previous-token") for line in lines[1:])
    table = run("heads", "--from", minilm_capture, "--layer", "0-1")
    assert table.exit_code == 0 and "previous-token" in table.stdout
    assert run("heads", "--from", minilm_capture, "--sort", "nope").exit_code == 2
    assert "layer 9" in one_line_error(run("heads", "--from", minilm_capture, "--layer", "9"), 2)


@pytest.mark.slow
def test_entropy_table_json_and_png(minilm_capture, tmp_path):
    import json
    import math

    result = run("entropy", "--from", minilm_capture, "-o", tmp_path / "e.png")
    assert result.exit_code == 0 and "mean" in result.stdout and "2.079" in result.stdout
    assert (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"
    rows = json.loads(run("entropy", "--from", minilm_capture, "--json").stdout)["heads"]
    assert len(rows) == 72 and rows[0]["uniform"] == pytest.approx(math.log(8))
    assert min(r["entropy"] for r in rows) >= 0 and max(r["entropy"] for r in rows) <= math.log(8)
    rows = json.loads(run("entropy", "--from", minilm_capture, "--json", "--normalised").stdout)["heads"]
    assert max(r["entropy"] for r in rows) <= 1.0


@pytest.mark.slow
def test_rollout_default_token_bars_and_png(minilm_capture, tmp_path):
    import json

    result = run("rollout", "--from", minilm_capture, "-o", tmp_path / "r.png")
    assert result.exit_code == 0 and "'[CLS]'" in result.stdout and "█" in result.stdout
    data = json.loads(run("rollout", "--from", minilm_capture, "--json", "--token", "cat").stdout)
    assert data["token"] == 2 and sum(data["rollout"]) == pytest.approx(1.0)
    assert "no token" in one_line_error(run("rollout", "--from", minilm_capture, "--token", "dog"), 2)


def test_rollout_causal_default_is_last_token(saved_capture):
    import json

    data = json.loads(run("rollout", "--from", saved_capture, "--json").stdout)
    assert data["token"] == len(data["tokens"]) - 1


@pytest.mark.slow
def test_compare_fits_80_columns(minilm_capture):
    result = run("compare", "--from", minilm_capture, "--layers", "0,3,5")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert all(f"layer {n}" in result.stdout for n in (0, 3, 5)) and "H=" in result.stdout


def test_compare_long_input_stacks_panels(tiny_model_dir, tmp_path):
    long_text = "The quick brown fox jumps over the lazy dog and the cat sat on the mat again"
    path = tmp_path / "long.npz"
    assert run("capture", long_text, "-m", tiny_model_dir("gpt2"), "-o", path).exit_code == 0
    result = run("compare", "--from", path, "--layers", "0,1")
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_compare_two_models_needs_same_tokens(tiny_model_dir):
    same = run("compare", SENTENCE, "--models", f"{tiny_model_dir('bert')},{tiny_model_dir('electra')}")
    assert same.exit_code == 0, same.output
    assert same.stdout.count("layer 0") == 2
    different = run("compare", SENTENCE, "--models", f"{tiny_model_dir('bert')},{tiny_model_dir('gpt2')}")
    assert "tokenise the text differently" in one_line_error(different)


def test_export_command(saved_capture, tmp_path):
    out_dir = tmp_path / "gallery"
    result = run("export", "--from", saved_capture, "--out-dir", out_dir, "--layers", "0-1", "--heads", "0,3",
                 "--workers", "2")
    assert result.exit_code == 0, result.output
    assert "6 images" in result.stdout
    names = {p.name for p in out_dir.iterdir()}
    assert {"layer00_head00.png", "layer01_head03.png", "layer01_mean.png", "grid.png", "index.html"} <= names
    assert "layer00_head01.png" not in names
    again = run("export", "--from", saved_capture, "--out-dir", out_dir)
    assert "--force" in one_line_error(again)
    assert run("export", "--from", saved_capture, "--out-dir", out_dir, "--format", "gif").exit_code == 2
    assert "head 9" in one_line_error(run("export", "--from", saved_capture, "--out-dir", tmp_path / "x",
                                          "--heads", "9"), 2)
    assert not (tmp_path / "x").exists()
    assert "cannot write" in one_line_error(run("export", "--from", saved_capture, "--out-dir", "/proc/attnviz-x"))


def test_heatmap_terminal_with_output_writes_both(saved_capture, tmp_path):
    """-t with -o draws in the terminal and writes the same picture -o alone writes, and says where."""
    from PIL import Image

    both = run("heatmap", "--from", saved_capture, "-t", "-o", tmp_path / "both.png")
    alone = run("heatmap", "--from", saved_capture, "-o", tmp_path / "alone.png")
    terminal = run("heatmap", "--from", saved_capture, "-t")
    assert both.exit_code == alone.exit_code == terminal.exit_code == 0, both.output
    assert both.stdout == terminal.stdout + f"{tmp_path / 'both.png'}\n"
    with Image.open(tmp_path / "both.png") as a, Image.open(tmp_path / "alone.png") as b:
        assert a.size == b.size and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("command", [["heatmap", "-o", "{tmp}/h.png"], ["heads", "--json"], ["entropy"],
                                     ["rollout"], ["compare"], ["export", "--out-dir", "{tmp}/e", "--workers", "1"]])
@pytest.mark.slow
def test_commands_from_a_capture_never_import_torch(command, saved_capture, tmp_path):
    """Re-rendering a saved capture needs neither torch nor transformers: importing either fails here, and the
    command prints what it prints with them."""
    import subprocess
    import sys

    args = [a.format(tmp=tmp_path) for a in command] + ["--from", str(saved_capture)]
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None;"
            f"sys.argv = ['attnviz'] + {args!r}; from attnviz.cli import main; main()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    if command[0] in ("heatmap", "export"):
        import shutil

        shutil.rmtree(tmp_path / "e", ignore_errors=True)
        (tmp_path / "h.png").unlink(missing_ok=True)
    assert result.stdout == run(*args, env={"COLUMNS": "80"}).stdout


def test_unknown_colormap_in_terminal_is_one_line(saved_capture):
    assert "colormap" in one_line_error(run("heatmap", "--from", saved_capture, "-t", "--cmap", "nope"), 2)


@pytest.mark.parametrize("command, args", [
    *(("steps", ["--head", h]) for h in ("mean", "all", "0-2", "0,1")),
    *((c, ["--layer", v]) for c in ("steps", "positions") for v in ("all", "1-2", "0,1"))])
def test_one_layer_and_head_commands_say_so_before_loading(command, args):
    result = run(command, "The cat", *args, "-m", "/no/such/model")  # the model would fail differently
    line = one_line_error(result, 2)
    assert "one index" in line and "no such" not in line


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
    """A command that shows one self-attention offers no encoder-decoder options (and still shows its own)."""
    result = run(command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--model" in result.stdout and "--text-file" in result.stdout
    assert "--target" not in result.stdout and "--max-new-tokens" not in result.stdout


def test_errors_point_the_right_way(tmp_path, monkeypatch):
    cap = make_capture(np.full((1, 1, 3, 3), 1 / 3, np.float32)).save(tmp_path / "c.npz")
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "pictures"
    result = run("heatmap", "--from", cap, "-o", f"{folder}/")
    assert result.exit_code == 0 and (folder / "attnviz_layer0_mean.png").exists()
    result = run("entropy", "--from", cap, "-o", folder)  # an existing folder, no slash
    assert result.exit_code == 0 and (folder / "attnviz_entropy.png").exists()
    assert "no such folder" in one_line_error(run("heatmap", "x", "-m", "./no-such-model"))
    assert "put the text in quotes" in one_line_error(run("heatmap", "The", "cat", "sat"), 2)
    assert 'attnviz heatmap "some text"' in one_line_error(run("some text"), 2)
    assert "not one of" in one_line_error(run("heatmap", "x", "--device", "tpu"), 2)
    assert run("heatmap", "--from", cap, "--dtype", "bf16", "-t").exit_code == 0  # aliases users type


def command_options():
    from attnviz.cli import command_group

    return {name: {p.name: p for p in command.params} for name, command in command_group().commands.items()}


SHARED = ("model", "revision", "device", "dtype", "trust_remote_code", "no_truncate", "text_file", "source", "layer",
          "head", "hide_special", "cmap", "as_json", "as_csv", "scale", "norm", "vmax", "values", "start", "token")


def test_shared_options_have_one_name_type_and_help_everywhere():
    commands = command_options()
    for key in SHARED:
        seen = [(name, params[key]) for name, params in commands.items()
                if key in params and params[key].param_type_name == "option"]
        flags = {(tuple(sorted(p.opts)), tuple(sorted(p.secondary_opts))) for _, p in seen}
        assert len(flags) == 1, (key, flags)
        types = {str(p.type_descriptor.annotation).replace("typing.", "").replace("Optional[", "").rstrip("]")
                 for _, p in seen}
        assert len(types) == 1, (key, types)
        if key not in ("layer", "head", "source", "token"):  # help mentions each command's default
            assert len({p.help for _, p in seen}) == 1, (key, [(n, p.help) for n, p in seen])
    for name, params in commands.items():  # -o is the output everywhere there is one
        for p in params.values():
            if "-o" in p.opts:
                assert "--output" in p.opts or "--out-dir" in p.opts, name
    assert {"layer", "head"} <= set(commands["heads"]) and {"as_json", "as_csv"} <= set(commands["rollout"])
    assert "as_json" in commands["compare"] and "start" in commands["compare"]


def test_help_lists_commands_for_a_newcomer_without_type_placeholders():
    top = run("--help")
    assert top.exit_code == 0
    order = [top.stdout.index(f" {name} ") for name in ("heatmap", "token", "steps", "compare", "export")]
    assert order == sorted(order)
    for name in command_options():
        text = run(name, "--help", env={"COLUMNS": "200"}).stdout
        assert "<bool>" not in text and "<list" not in text and "<str>" not in text, name


def test_an_error_wraps_between_words_in_a_narrow_terminal_and_stays_one_line_in_a_pipe():
    import io

    from rich.console import Console

    from attnviz.cli.output import error_line

    message = "the default model cannot be loaded; try attnviz heatmap --from gen.npz instead, or --model minilm"
    terminal = Console(file=io.StringIO(), width=40, force_terminal=True, color_system=None)
    error_line(message, console=terminal)
    lines = terminal.file.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= 40 for line in lines)
    assert " ".join(line.strip() for line in lines) == "Error: " + message  # every break falls between words
    pipe = Console(file=io.StringIO(), width=40, force_terminal=False, color_system=None)
    error_line(message, console=pipe)
    assert pipe.file.getvalue() == "Error: " + message + "\n"


@pytest.mark.parametrize("command", [["entropy", "-o", "{out}/e.png"], ["contributions", "--token", "cat", "-o",
                                                                       "{out}/c.png"]])
def test_a_reader_that_closes_the_pipe_early_still_gets_the_files(command, tiny_model_dir, tmp_path):
    """`attnviz … -o a.png | head -3`: the picture is written before anything is printed, and a reader who stops
    reading ends the output quietly (exit 0, nothing on stderr), as `align -o a.png | head -3` did not."""
    import subprocess
    import sys

    args = [a.replace("{out}", str(tmp_path)) for a in command]
    process = subprocess.Popen([sys.executable, "-m", "attnviz", args[0], SENTENCE, *args[1:], "-m",
                                tiny_model_dir("bert")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before the command prints a line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0, stderr
    assert stderr == ""
    picture = tmp_path / args[-1].rsplit("/", 1)[1]
    assert picture.read_bytes()[:4] == b"\x89PNG"


def test_a_text_without_its_command_gets_the_whole_text_back_in_the_suggestion():
    line = one_line_error(run("The", "cat", "sat", "--layer", "0"), 2)
    assert 'attnviz heatmap "The cat sat" --layer 0' in line
    assert "Did you mean 'heatmap'" in one_line_error(run("heatmp", "x"), 2)


def test_loading_says_how_to_skip_it(tiny_model_dir, monkeypatch, tmp_path):
    """The seconds of a run are the model's loading (benchmarks/bench_startup.py): while it loads, the spinner
    says that a saved capture (--from) skips it, and --from then loads no model at all."""
    import contextlib

    from attnviz.cli import params

    said = []

    @contextlib.contextmanager
    def status(text):
        said.append(str(text))
        yield

    monkeypatch.setattr(params.err, "status", status)
    assert run("capture", SENTENCE, "-m", tiny_model_dir("bert"), "-o", tmp_path / "c.npz").exit_code == 0
    assert said and "--from a saved capture skips this" in said[0]
    said.clear()
    assert run("heatmap", "--from", tmp_path / "c.npz", "-o", tmp_path / "h.png").exit_code == 0
    assert said == []  # nothing to load


def test_the_loading_line_offers_from_only_where_the_command_takes_it(monkeypatch):
    """faithfulness has no --from: its loading line must not offer one (heads has it and says so)."""
    from attnviz.cli import params

    seen = []
    real = params.loading_line

    def spy():
        seen.append(real())
        return seen[-1]

    monkeypatch.setattr(params, "loading_line", spy)
    run("faithfulness", "The cat sat on the mat", "--methods", "attention,random", "--sanity", "0")
    run("heads", "The cat sat on the mat")
    assert len(seen) == 2 and "--from" not in seen[0] and "--from" in seen[1]
