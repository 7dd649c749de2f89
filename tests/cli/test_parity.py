"""One result, one output: every command's --json is exactly its API function's to_dict() (the same function of the
same name, called with the same arguments), its --csv the result's rows, its table the result's report, and the
live app answers the same to_dict(). A command missing from the table below fails the first test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import espeak, rendered, require_real, run

import attnviz
from attnviz.base.records import to_csv, to_json
from attnviz.cli import COMMANDS

SENTENCE = "the cat sat on the mat"
PROMPT = "the cat sat on"
CORRUPT = "the dog sat on"


@pytest.fixture(scope="module")
def models(tiny_model_dir, tiny_lm_dir, tmp_path_factory):
    """name -> (folder, the model loaded once): a tiny BERT (an encoder), a tiny Llama (a causal LM) and the same
    Llama taking 2,048 positions (rotary: no table to grow), for haystacks."""
    from helpers import build_tiny_model

    bert, llama = tiny_model_dir("bert"), tiny_lm_dir("llama")
    long = build_tiny_model("llama", tmp_path_factory.mktemp("long") / "llama", lm=True, init=0.3)
    config = json.loads((long / "config.json").read_text(encoding="utf-8"))
    (long / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}), encoding="utf-8")
    return {"bert": (bert, attnviz.load_model(bert, device="cpu")),
            "llama": (llama, attnviz.load_model(llama, device="cpu", lm_head="auto")),
            "long": (str(long), attnviz.load_model(str(long), device="cpu", lm_head="auto"))}


@pytest.fixture(scope="module")
def saved(models, tmp_path_factory) -> str:
    """A capture on disk (--from): nothing runs."""
    return str(attnviz.capture(SENTENCE, model=models["bert"][1]).save(tmp_path_factory.mktemp("saved") / "c.npz"))


def corpus_file(tmp: Path) -> Path:
    path = tmp / "corpus.txt"
    path.write_text(f"{SENTENCE}\na dog ran home\n\nthe mat was red\n", encoding="utf-8")
    return path


# command -> (model, the command line after the command, the API call on (loaded model, tmp folder)). Each
# command's own arguments, spelled both ways.
CASES = {
    "heatmap": ("bert", [SENTENCE, "--layer", "0", "--head", "1"],
                lambda m, t: attnviz.heatmap(SENTENCE, model=m, layer=0, head=1)),
    "token": ("bert", [SENTENCE, "cat", "--layer", "1"], lambda m, t: attnviz.token(SENTENCE, "cat", model=m, layer=1)),
    "steps": ("bert", [SENTENCE, "--layer", "1", "--head", "2", "--token", "mat"],
              lambda m, t: attnviz.steps(SENTENCE, model=m, layer=1, head=2, token="mat")),
    "positions": ("bert", [SENTENCE, "--seed", "2"], lambda m, t: attnviz.positions(SENTENCE, model=m, seed=2)),
    "compare": ("bert", [SENTENCE, "--layers", "0,1", "--head", "2"],
                lambda m, t: attnviz.compare([SENTENCE], model=m, layer="0,1", head=2)),
    "heads": ("bert", [SENTENCE, "--sort", "entropy", "--top", "3"],
              lambda m, t: attnviz.heads(SENTENCE, model=m, sort="entropy", top=3)),
    "entropy": ("bert", [SENTENCE, "--normalised"], lambda m, t: attnviz.entropy(SENTENCE, model=m, normalised=True)),
    "rollout": ("bert", [SENTENCE, "--token", "cat"], lambda m, t: attnviz.rollout(SENTENCE, model=m, token="cat")),
    "norms": ("bert", [SENTENCE], lambda m, t: attnviz.norms(SENTENCE, model=m)),
    "sinks": ("bert", [SENTENCE, "--threshold", "0.2"], lambda m, t: attnviz.sinks(SENTENCE, model=m, threshold=0.2)),
    "contributions": ("bert", [SENTENCE, "--token", "sat"],
                      lambda m, t: attnviz.contributions(SENTENCE, model=m, token="sat")),
    "logit-attr": ("llama", [PROMPT, "--top", "4"], lambda m, t: attnviz.logit_attr(PROMPT, model=m, top=4)),
    "why": ("llama", [PROMPT, "-l", "1", "-H", "1", "--top", "5"],
            lambda m, t: attnviz.why(PROMPT, model=m, layer=1, head=1, top=5)),
    "lens": ("llama", [PROMPT, "--positions", "1-3", "--top", "2", "--target", "mat"],
             lambda m, t: attnviz.lens(PROMPT, model=m, positions="1-3", top=2, target="mat")),
    "faithfulness": ("llama", [PROMPT, "--methods", "attention,flow,loo,random", "--sanity", "1", "--seed", "3"],
                     lambda m, t: attnviz.faithfulness(PROMPT, model=m, methods=["attention", "flow", "loo", "random"],
                                                       sanity=1, seed=3)),
    "ablate": ("llama", [PROMPT, "--heads", "1.0,0.2", "--at", "-1"],
               lambda m, t: attnviz.ablate(PROMPT, heads="1.0,0.2", model=m, at=-1)),
    "importance": ("bert", [SENTENCE], lambda m, t: attnviz.importance(SENTENCE, model=m)),
    "detect": ("llama", ["--length", "6", "--sequences", "1", "--draws", "1"],
               lambda m, t: attnviz.detect(model=m, length=6, sequences=1, draws=1)),
    "patch": ("llama", [PROMPT, CORRUPT, "--positions", "--compare"],
              lambda m, t: attnviz.patch(PROMPT, CORRUPT, model=m, positions=True, compare=True)),
    "discover": ("llama", [PROMPT, CORRUPT, "--answers", "mat,on", "--steps", "2", "--top", "4"],
                 lambda m, t: attnviz.discover(PROMPT, CORRUPT, answers=("mat", "on"), model=m, steps=2, top=4)),
    "circuits": ("llama", ["--tokens", "20", "--listed", "2"], lambda m, t: attnviz.circuits(model=m, tokens=20,
                                                                                               listed=2)),
    "retrieval": ("long", ["--lengths", "60", "--depths", "0.5", "--remove", "1", "--draws", "1"],
                  lambda m, t: attnviz.retrieval(model=m, lengths=[60], depths=[0.5], remove=1, draws=1)),
    "massive": ("llama", [PROMPT, "--ratio", "2", "--minimum", "0"],
                lambda m, t: attnviz.massive(PROMPT, model=m, ratio=2, minimum=0)),
    "explain": (None, ["entropy"], lambda m, t: attnviz.explain("entropy")),
    "verify": ("bert", [SENTENCE], lambda m, t: attnviz.verify(SENTENCE, model=m)),
    "scaling": ("bert", [SENTENCE, "--dk", "8"], lambda m, t: attnviz.scaling(SENTENCE, model=m, dk=[8])),
    "capture": ("bert", [SENTENCE, "-o", "{tmp}/c.npz"], lambda m, t: attnviz.capture(SENTENCE, model=m)),
    "generate": ("llama", [PROMPT, "-n", "3", "--layer", "1", "--top", "2"],
                 lambda m, t: attnviz.generate(PROMPT, model=m, max_new_tokens=3, layer=1, top=2)),
    "export": ("bert", [SENTENCE, "-o", "{tmp}/export", "--layers", "0", "--heads", "0-1", "--workers", "1"],
               lambda m, t: attnviz.export(SENTENCE, t / "export2", model=m, layer="0", head="0-1")),
    "view": ("bert", [SENTENCE, "-o", "{tmp}/v.html"], lambda m, t: attnviz.view(SENTENCE, model=m)),
    "corpus": ("bert", ["{tmp}/corpus.txt"], lambda m, t: attnviz.corpus(files=[t / "corpus.txt"], model=m)),
    "cost": ("bert", ["--lengths", "8,16"], lambda m, t: attnviz.cost(model=m, lengths=[8, 16])),
}
SOUND_COMMANDS = ("align",)  # a sound: the real Whisper, below
NOT_RESULTS = ("serve",)  # a server, not a result: its answers are checked below


def comparable(name: str, data):
    """What must be equal: everything, but for a measurement's timings and a folder's own name."""
    if name == "cost":
        return [{k: v for k, v in row.items() if k not in ("full_seconds", "stream_seconds", "full_bytes",
                                                          "stream_bytes")} for row in data["rows"]]
    if name == "export":
        return {k: v for k, v in data.items() if k != "folder"}
    return data


def test_every_command_is_checked():
    assert set(COMMANDS) == set(CASES) | set(SOUND_COMMANDS) | set(NOT_RESULTS)
    for name in CASES:
        assert callable(getattr(attnviz, name.replace("-", "_"))), name  # the function of the same name


@pytest.mark.parametrize("name", sorted(CASES))
def test_json_is_the_functions_to_dict(name, models, tmp_path):
    model, args, call = CASES[name]
    corpus_file(tmp_path)
    folder = [] if model is None else ["-m", models[model][0], "--device", "cpu"]
    line = [a.replace("{tmp}", str(tmp_path)) for a in args]
    printed = run(name, *line, *folder, "--json")
    assert printed.exit_code == 0, printed.output
    result = call(None if model is None else models[model][1], tmp_path)
    assert result.command == name
    expected = json.loads(to_json(result.to_dict()))
    assert comparable(name, json.loads(printed.stdout)) == comparable(name, expected)


@pytest.mark.parametrize("name", ["heads", "entropy", "rollout", "norms", "contributions", "logit-attr",
                                  "faithfulness", "patch", "discover",
                                  "importance", "token", "compare", "explain", "massive", "circuits", "corpus"])
def test_csv_is_the_results_rows(name, models, tmp_path):
    model, args, call = CASES[name]
    corpus_file(tmp_path)
    folder = [] if model is None else ["-m", models[model][0], "--device", "cpu"]
    printed = run(name, *[a.replace("{tmp}", str(tmp_path)) for a in args], *folder, "--csv")
    assert printed.exit_code == 0, printed.output
    result = call(None if model is None else models[model][1], tmp_path)
    rows = result.to_rows()
    assert rows and printed.stdout == to_csv(rows, result.csv_columns())


@pytest.mark.parametrize("name", ["heads", "verify", "sinks", "ablate", "patch", "explain"])
def test_the_table_is_the_results_report(name, models, tmp_path):
    """What the terminal shows is the result's report, rendered: the same text through the same Console."""
    model, args, call = CASES[name]
    folder = [] if model is None else ["-m", models[model][0], "--device", "cpu"]
    printed = run(name, *args, *folder, env={"COLUMNS": "100"})
    assert printed.exit_code == 0, printed.output
    result = call(None if model is None else models[model][1], tmp_path)
    assert printed.stdout == rendered(result, width=100)


NO_FIGURE = ("explain", "capture", "export", "view", "corpus", "generate", "verify")  # tables, files, pages
FIGURES = sorted(name for name in CASES if name not in NO_FIGURE)


@pytest.mark.parametrize("name", FIGURES)
def test_every_results_figure_is_a_figure(name, models, tmp_path):
    """What figure() gives a user saves, sizes and titles as a matplotlib Figure does (or is one)."""
    import io

    model, _, call = CASES[name]
    corpus_file(tmp_path)
    result = call(models[model][1], tmp_path)
    figure = result.figure()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=30)
    assert buffer.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = figure.get_size_inches()
    assert width > 1 and height > 1
    assert figure.get_axes() and all(hasattr(ax, "imshow") for ax in figure.get_axes())
    drawn_into(result)


def drawn_into(result) -> None:
    """figure(ax=ax) draws the result's main picture on the caller's Axes (seaborn's way) and returns them: the
    caller's figure holds only that Axes and, at most, its colorbar."""
    from matplotlib.figure import Figure

    canvas = Figure()
    ax = canvas.add_subplot()
    assert result.figure(ax=ax) is ax
    assert ax.images or ax.lines or ax.collections or ax.patches
    assert len(canvas.axes) <= 2 and ax.get_title()


# α itself and the views that hand out α's own matrices (every panel of a heatmap, a token's rows of every layer):
# numpy arrays, written from their own memory a row at a time (base.records.write_json), never as Python lists
STREAMED_ARRAYS = ("capture", "heatmap", "token", "compare")


@pytest.mark.parametrize("name", sorted(set(CASES) - set(STREAMED_ARRAYS)))
def test_to_dict_is_plain_json(name, models, tmp_path):
    """json.dumps(result.to_dict()) works as it is (no numpy inside) and is what --json prints."""
    import math

    model, _, call = CASES[name]
    corpus_file(tmp_path)
    data = call(None if model is None else models[model][1], tmp_path).to_dict()

    def numpy_inside(value) -> bool:
        if isinstance(value, dict):
            return any(numpy_inside(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return any(numpy_inside(v) for v in value)
        return type(value).__module__ == "numpy" or (isinstance(value, float) and not math.isfinite(value))

    assert not numpy_inside(data)
    assert json.loads(json.dumps(data, allow_nan=False)) == json.loads(to_json(data))


def test_every_result_with_a_picture_is_in_the_figure_check():
    import typing

    for name in CASES:
        result_type = typing.get_type_hints(getattr(attnviz, name.replace("-", "_"))).get("return")
        if result_type is not None and hasattr(result_type, "figure"):
            assert name in FIGURES, name


def test_a_saved_capture_runs_through_the_same_functions(saved):
    for name, call in (("heads", lambda s: attnviz.heads(s)), ("entropy", lambda s: attnviz.entropy(s)),
                       ("rollout", lambda s: attnviz.rollout(s)), ("heatmap", lambda s: attnviz.heatmap(s))):
        printed = run(name, "--from", saved, "--json")
        assert printed.exit_code == 0, printed.output
        assert json.loads(printed.stdout) == json.loads(to_json(call(attnviz.load_capture(saved)).to_dict())), name


@pytest.mark.slow
def test_align_and_detect_of_a_sound_are_their_functions_to_dict(tmp_path):
    require_real(__import__("attnviz.engine.offline", fromlist=["WHISPER"]).WHISPER)
    path = espeak(tmp_path, "The cat sat on the mat.")
    parts = attnviz.capture(attnviz.sound(path))
    saved = parts.save(tmp_path / "s.npz")
    printed = run("align", "--from", saved, "--json", "--top", "3")
    assert json.loads(printed.stdout) == json.loads(to_json(attnviz.align(parts, top=3).to_dict()))
    assert attnviz.load("whisper").align(parts, top=3).to_dict() == attnviz.align(parts, top=3).to_dict()
    attnviz.align(parts).figure().savefig(tmp_path / "a.png")  # the sound layout's figure saves as a Figure does
    drawn_into(attnviz.align(parts))
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    printed = run("detect", "--audio", path, "--json")
    assert json.loads(printed.stdout) == json.loads(to_json(attnviz.detect(attnviz.sound(path)).to_dict()))


def test_the_live_app_answers_the_same_to_dict(models):
    """serve's answers are the functions' to_dict(): ablate, steps and the head table."""
    from fastapi.testclient import TestClient

    from attnviz.serve.app import make_app

    folder, model = models["llama"]
    client = TestClient(make_app(model))
    answer = client.post("/api/ablate", json={"text": PROMPT, "heads": "1.0", "mode": "zero"})
    assert answer.status_code == 200
    assert answer.json() == json.loads(to_json(attnviz.ablate(PROMPT, heads="1.0", model=model).to_dict()))
    answer = client.post("/api/steps", json={"text": PROMPT, "layer": 1, "head": 0})
    assert answer.json() == json.loads(to_json(attnviz.steps(PROMPT, model=model, layer=1, head=0).to_dict()))
    answer = client.post("/api/capture", json={"text": PROMPT})
    assert answer.json()["head_table"] == json.loads(to_json(attnviz.heads(PROMPT, model=model).to_records()))
