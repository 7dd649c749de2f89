"""The analyses registered last: compare and export of a run; generate, align, corpus and serve of a model and
another input. Each equals its top-level function, its old keywords still work with a DeprecationWarning, and its
command line is made from its options."""

from __future__ import annotations

import json
import warnings

import pytest

import attnviz
from attnviz.base.records import to_json
from attnviz.errors import UsageError
from helpers import one_line_error, run

TEXT = "the cat sat on the mat"


def _plain(result) -> dict:
    return json.loads(to_json(result.to_dict()))


def _gallery(result) -> dict:
    shown = result.to_dict()
    shown.pop("folder")
    return shown


def test_run_compare_and_export_are_the_functions(tiny_model_dir, tmp_path):
    m = attnviz.load(tiny_model_dir("bert"))
    one, other = m.run(TEXT), attnviz.load(tiny_model_dir("bert")).run(TEXT)  # another model (here a copy)
    assert _plain(one.compare(layer="0-1")) == _plain(attnviz.compare([TEXT], model=m, layer="0-1"))
    both = _plain(one.compare(other, head=1))
    assert both == _plain(attnviz.compare([one.capture, other.capture], head=1))
    assert len(both["panels"]) == 2 * len(_plain(one.compare(head=1))["panels"])
    assert one.passes == 1 and other.passes == 1  # compare reads the runs' α
    written = one.export(tmp_path / "run", layer="0", head="0-1", workers=1)
    expected = attnviz.export(TEXT, tmp_path / "top", model=m, layer="0", head="0-1", workers=1)
    assert _gallery(written) == _gallery(expected) and written.images == 3  # two heads and the layer's mean
    assert (tmp_path / "run" / "heads.json").read_bytes() == (tmp_path / "top" / "heads.json").read_bytes()


def test_export_and_generate_take_their_old_keywords_with_a_warning(tiny_model_dir, tiny_lm_dir, tmp_path):
    capture = attnviz.capture(TEXT, model=tiny_model_dir("bert"))
    new = attnviz.export(capture, tmp_path / "new", layer=[0], head=[1], format="svg", workers=1)
    said = r"export\(folder=…, layers=…, heads=…, fmt=…\) is now export\(out_dir=…, layer=…, head=…, format=…\)"
    with pytest.warns(DeprecationWarning, match=said):
        old = attnviz.export(capture, folder=tmp_path / "old", layers=[0], heads=[1], fmt="svg", workers=1)
    assert _gallery(old) == _gallery(new) and sorted(p.name for p in (tmp_path / "old").iterdir()) == \
        sorted(p.name for p in (tmp_path / "new").iterdir())
    with pytest.raises(TypeError, match="fmt is the old name of format"):
        attnviz.export(capture, tmp_path / "both", fmt="png", format="svg")
    assert not (tmp_path / "both").exists()
    folder = tiny_lm_dir("gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        saved = attnviz.generate("the cat", model=folder, max_new_tokens=2, output=tmp_path / "a.npz")
    with pytest.warns(DeprecationWarning, match=r"generate\(save=…\) is now generate\(output=…\)"):
        again = attnviz.generate("the cat", model=folder, max_new_tokens=2, save=tmp_path / "b.npz")
    assert saved.saved.endswith("a.npz") and again.saved.endswith("b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_generate_takes_the_flags_as_keywords(tiny_lm_dir):
    """sample, temperature, top_p and seed: the command line's words, the same text as one Decoding of them."""
    folder = tiny_lm_dir("llama")
    keywords = attnviz.generate("the cat", model=folder, max_new_tokens=4, sample=True, temperature=0.7, top_p=0.9,
                                seed=5).to_dict()
    decoding = attnviz.Decoding(max_new_tokens=4, sample=True, temperature=0.7, top_p=0.9, seed=5)
    assert keywords == attnviz.generate("the cat", model=folder, decoding=decoding).to_dict()
    printed = run("generate", "the cat", "-m", folder, "-n", "4", "--sample", "--temperature", "0.7", "--top-p",
                  "0.9", "--seed", "5", "--json")
    assert json.loads(printed.stdout) == json.loads(to_json(keywords))
    m = attnviz.load(folder)
    assert m.generate("the cat", 4, sample=True, temperature=0.7, top_p=0.9, seed=5).to_dict() == keywords
    with pytest.raises(UsageError, match="temperature and top_p choose how to sample: add sample"):
        attnviz.generate("the cat", model=folder, temperature=0.5)
    with pytest.raises(UsageError, match="give decoding or sample"):
        attnviz.generate("the cat", model=folder, decoding=decoding, seed=3)


def test_model_corpus_is_the_function(tiny_model_dir):
    m = attnviz.load(tiny_model_dir("bert"))
    texts = ["the cat sat", "a dog ran far away", ""]
    assert m.corpus(texts, batch_size=2, top=3).to_dict() == attnviz.corpus(texts, model=m, batch_size=2,
                                                                              top=3).to_dict()


def test_corpus_and_export_flags_are_their_fields(tiny_model_dir, tmp_path):
    """--format and -b kept their spellings (the fields are format and batch_size); an unknown format is a usage
    error naming the choices."""
    texts = tmp_path / "t.txt"
    texts.write_text("the cat sat\na dog ran\n", encoding="utf-8")
    folder = tiny_model_dir("bert")
    printed = run("corpus", str(texts), "-m", folder, "-b", "1", "--format", "text", "--json")
    assert printed.exit_code == 0, printed.output
    expected = attnviz.corpus(files=[str(texts)], model=folder, batch_size=1, format="txt")
    assert json.loads(printed.stdout) == json.loads(to_json(expected.to_dict()))
    line = one_line_error(run("export", TEXT, "-m", folder, "-o", str(tmp_path / "e"), "--format", "gif"), 2)
    assert "--format" in line and "png" in line and not (tmp_path / "e").exists()


def test_model_serve_hands_its_options_to_the_server(tiny_model_dir, monkeypatch):
    """Model.serve(): the options as the command line's (defaults, token checked before a port is bound); a
    request running at the stop does not end a Python caller's process."""
    import attnviz.serve.run as serving

    seen = {}

    def fake(model, sock, host, **kwargs):
        seen.update(model=model, host=host, port=sock.getsockname()[1], **kwargs)

    monkeypatch.setattr(serving, "serve_forever", fake)
    m = attnviz.load(tiny_model_dir("bert"))
    m.serve(port=0, max_tokens=64)
    assert seen["model"] is m and seen["host"] == "127.0.0.1" and seen["port"] > 0
    assert (seen["max_chars"], seen["max_tokens"], seen["max_waiting"], seen["token"]) == (2000, 64, 16, None)
    assert seen["whole_process"] is False
    seen.clear()
    with pytest.raises(UsageError, match="token"):
        m.serve(port=0, token="short")
    assert not seen


@pytest.mark.parametrize("command", [["export", TEXT], ["corpus", "-"]])
def test_a_file_where_a_folder_goes_is_a_usage_error(command, tmp_path):
    """--out-dir of export and corpus: an existing file is refused by the option itself (exit 2), before anything
    runs, and left as it was."""
    target = tmp_path / "a-file"
    target.write_text("mine", encoding="utf-8")
    line = one_line_error(run(*command, "-o", str(target), input="the cat\n"), 2)
    assert "is a file" in line and target.read_text(encoding="utf-8") == "mine"
