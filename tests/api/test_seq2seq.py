"""Encoder-decoder models: tiny random T5, BART and Marian models built from configs, saved and loaded by
path. All three kinds of attention (encoder, decoder, cross) against the from-scratch formula, generation
against a teacher-forced pass, the format-2 capture, and every viewer on a rectangular cross-attention."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import once, one_line_error, run

from attnviz.data.capture import Capture
from attnviz.data.parts import Parts, load_capture
from attnviz.engine.scratch.adapters import t5_relative_bucket
from attnviz.engine.scratch.verify import scratch_parts
from attnviz.engine.generation import Decoding
from attnviz.engine.models import load
from attnviz.engine.seq2seq import parts_capture

KINDS = ["t5", "bart", "marian"]
SOURCE, TARGET = "The cat sat on the mat", "A dog ran in the park"


@pytest.fixture(scope="module")
def s2s(tiny_seq2seq_dir):
    return once(lambda kind: load(tiny_seq2seq_dir(kind), device="cpu"))


def forward_inputs(parts: Parts) -> dict:
    source = torch.tensor([list(parts.part("encoder").token_ids)])
    return {"input_ids": source, "attention_mask": torch.ones_like(source),
            "decoder_input_ids": torch.tensor([list(parts.part("decoder").token_ids)])}


@pytest.mark.parametrize("kind", KINDS)
def test_three_parts_equal_the_formula(s2s, kind):
    loaded = s2s(kind)
    parts = parts_capture(loaded, SOURCE, target=TARGET)
    S, T = len(parts.part("encoder").tokens), len(parts.part("decoder").tokens)
    assert parts.part("encoder").attentions.shape == (2, 4, S, S)
    assert parts.part("decoder").attentions.shape == (3, 4, T, T)
    assert parts.part("cross").attentions.shape == (3, 4, T, S)
    assert parts.part("decoder").causal and not parts.part("cross").causal
    for name, (scratch, model_alpha) in scratch_parts(loaded, forward_inputs(parts)).items():
        assert np.abs(scratch - model_alpha).max() <= 1e-5, name
        assert np.array_equal(model_alpha, parts.part(name).attentions), name
        assert np.allclose(model_alpha.sum(-1), 1, atol=1e-5)
    decoder = parts.part("decoder").attentions
    assert np.abs(np.triu(decoder, 1)).max() == 0  # causal: nothing above the diagonal
    # teacher forcing: <start> then the target's tokens, the final </s> not read
    tokens = parts.part("decoder").tokens
    assert " ".join(tokens).count("A dog ran") == 1 and tokens[-1] != "</s>" and tokens[0] in ("<start>", "</s>")
    assert parts.part("cross").key_tokens == parts.part("encoder").tokens


def test_t5_relative_buckets_match_the_reference_and_matter(s2s):
    from transformers.models.t5.modeling_t5 import T5Attention

    offsets = torch.arange(-300, 301)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 16)):
            ours = t5_relative_bucket(offsets, bidirectional=bidirectional, buckets=buckets, max_distance=distance)
            theirs = T5Attention._relative_position_bucket(offsets, bidirectional=bidirectional,
                                                           num_buckets=buckets, max_distance=distance)
            assert torch.equal(ours, theirs)
    # the check has power: T5's encoder α without the bias, or with a 1/√d_k T5 does not apply, is far off
    loaded = s2s("t5")
    parts = parts_capture(loaded, SOURCE, target=TARGET)
    module = loaded.model.get_encoder().block[0].layer[0].SelfAttention
    x = torch.nn.functional.embedding(torch.tensor([list(parts.part("encoder").token_ids)]),
                                      loaded.model.shared.weight)
    x = loaded.model.get_encoder().block[0].layer[0].layer_norm(x)
    q = module.q(x).view(1, -1, 4, 8).transpose(1, 2).detach().double()
    k = module.k(x).view(1, -1, 4, 8).transpose(1, 2).detach().double()
    unbiased = torch.softmax(q @ k.transpose(-1, -2), -1)[0].numpy()
    scaled = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1)[0].numpy()
    model_alpha = parts.part("encoder").attentions[0]
    assert np.abs(unbiased - model_alpha).max() > 0.01 and np.abs(scaled - model_alpha).max() > 0.01


@pytest.mark.parametrize("kind", KINDS)
def test_written_rows_equal_a_teacher_forced_pass(s2s, kind):
    """The decoder writes with the KV cache; its decoder and cross rows, kept step by step, equal one
    forward pass over what it wrote (within 1e-5 in float32)."""
    loaded = s2s(kind)
    parts = parts_capture(loaded, SOURCE, decoding=Decoding(max_new_tokens=12))
    decoder = parts.part("decoder")
    T = decoder.n_tokens
    assert decoder.generated.tolist() == [False] + [True] * (T - 1) and T - 1 <= 12
    assert parts.part("cross").generated.tolist() == decoder.generated.tolist()
    with torch.inference_mode():
        out = loaded.model(**forward_inputs(parts), output_attentions=True)
    for name, attentions in (("encoder", out.encoder_attentions), ("decoder", out.decoder_attentions),
                             ("cross", out.cross_attentions)):
        full = np.stack([a[0].numpy() for a in attentions])
        assert np.abs(full - parts.part(name).attentions).max() <= 1e-5, name
    assert parts.meta["target_source"] == "generated" and parts.meta["stopped"] in ("max_new_tokens", "eos")


def test_writing_stops_at_the_end_of_sequence_token(s2s, monkeypatch):
    import attnviz.engine.seq2seq as seq2seq

    loaded = s2s("bart")
    eos = loaded.tokenizer.eos_token_id
    chosen = iter([10, 11, eos])
    monkeypatch.setattr(seq2seq, "choose_token", lambda logits, decoding, generator: next(chosen))
    parts = parts_capture(loaded, SOURCE, decoding=Decoding(max_new_tokens=8))
    assert parts.part("decoder").token_ids[1:].tolist() == [10, 11] and parts.meta["stopped"] == "eos"


# --- the capture format ---------------------------------------------------------------------------------


def test_format_2_round_trip_and_format_1_still_loads(s2s, tmp_path, cat_capture):
    parts = parts_capture(s2s("marian"), SOURCE, target=TARGET)
    back = load_capture(parts.save(tmp_path / "s2s.npz"))
    assert isinstance(back, Parts) and back.names == ["encoder", "decoder", "cross"]
    for name in back.names:
        a, b = parts.part(name), back.part(name)
        assert np.array_equal(a.attentions, b.attentions) and a.tokens == b.tokens and a.key_tokens == b.key_tokens
        assert b.part == name and b.causal == (name == "decoder")
    assert back.meta["source_text"] == SOURCE and back.meta["target_text"] == TARGET
    assert (back.source_text, back.target_text) == (SOURCE, TARGET)  # a text model: no sound, no transcript
    assert back.transcript is None and back.sound is None and back.mel is None
    with pytest.raises(Exception, match="choose one with part"):
        Capture.load(tmp_path / "s2s.npz")
    alone = Capture.load(parts.part("cross").save(tmp_path / "cross.npz"))  # one part: format 2, one part
    assert alone.part == "cross" and alone.keys is not None
    old = load_capture(cat_capture.save(tmp_path / "v1.npz"))
    assert isinstance(old, Capture) and old.part is None


def _tampered(tmp_path, parts: Parts, name: str, **changes) -> str:
    path = parts.save(tmp_path / "good.npz")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    for key, value in changes.items():
        if value is None:
            del arrays[key]
        else:
            arrays[key] = value
    out = tmp_path / f"{name}.npz"
    np.savez(out, **arrays)
    return str(out)


def test_broken_format_2_files_are_one_line(s2s, tmp_path):
    parts = parts_capture(s2s("bart"), SOURCE, target=TARGET)
    meta = json.loads(str(np.load(parts.save(tmp_path / "m.npz"))["meta"]))
    cases = {
        "parts": {"meta": np.array(json.dumps({**meta, "parts": ["encoder", "sideways"]}))},
        "shape": {"cross_attentions": parts.part("cross").attentions[:, :, :, :-1]},
        "side": {"source_special": None},
        "rows": {"decoder_attentions": np.full_like(parts.part("decoder").attentions, 0.5)},
    }
    for name, changes in cases.items():
        path = _tampered(tmp_path, parts, name, **changes)
        one_line_error(run("heatmap", "--from", path, "-t"), 1)


# --- viewers --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s2s_file(tiny_seq2seq_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("s2s") / "s2s.npz"
    result = run("capture", SOURCE, "-m", tiny_seq2seq_dir("t5"), "--target", TARGET, "-o", path)
    assert result.exit_code == 0, result.output
    return path


def test_cross_attention_statistics(s2s_file):
    cross = load_capture(s2s_file).part("cross")
    result = run("heads", "--from", s2s_file, "--json")  # default part: cross
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)["heads"]
    alpha = cross.attentions.astype(np.float64)
    end = np.array([k == "end" for k in cross.keys.special_kind])
    for r in records:
        a = alpha[r["layer"], r["head"]]  # (T, S)
        assert r["entropy"] == pytest.approx(float(-(a * np.log(a)).sum(-1).mean()), abs=1e-9)
        assert r["max_weight"] == pytest.approx(float(a.max(-1).mean()), abs=1e-6)
        assert r["end_mass"] == pytest.approx(float(a[:, end].sum(-1).mean()), abs=1e-6)
        assert r["vertical"] == pytest.approx(float(a.mean(0).max()), abs=1e-6)
        assert r["prev"] is None and r["self"] is None and r["next"] is None and r["mean_distance"] is None
    table = run("heads", "--from", s2s_file, env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert "cross-attention" in table.stdout and "–" in table.stdout
    entropy = json.loads(run("entropy", "--from", s2s_file, "--part", "encoder", "--json").stdout)["heads"]
    enc = load_capture(s2s_file).part("encoder").attentions.astype(np.float64)
    assert entropy[0]["entropy"] == pytest.approx(float(-(enc[0, 0] * np.log(enc[0, 0])).sum(-1).mean()), abs=1e-9)


@pytest.mark.slow
def test_every_viewer_takes_a_part(s2s_file, tmp_path):
    from PIL import Image

    capture = load_capture(s2s_file)
    T, S = capture.part("cross").n_tokens, capture.part("cross").n_keys
    png = tmp_path / "cross.png"
    assert run("heatmap", "--from", s2s_file, "-o", png).exit_code == 0
    width, height = Image.open(png).size
    assert width > height  # 7 source columns × 5 target rows: wider than tall
    terminal = run("heatmap", "--from", s2s_file, "--part", "decoder", "-t", env={"NO_COLOR": "1"})
    assert terminal.exit_code == 0 and "decoder self-attention" in terminal.stdout
    window = run("heatmap", "--from", s2s_file, "--rows", "1-2", "--cols", f"0-{S - 1}", "-t", env={"NO_COLOR": "1"})
    assert window.exit_code == 0, window.output
    assert run("compare", "--from", s2s_file, env={"NO_COLOR": "1"}).exit_code == 0
    assert run("rollout", "--from", s2s_file, "--json").exit_code == 0  # default: the encoder
    assert "cross-attention has none" in one_line_error(run("rollout", "--from", s2s_file, "--part", "cross"), 2)
    assert run("token", "--from", s2s_file, "cat", "--part", "encoder").exit_code == 0
    one_line_error(run("token", "--from", s2s_file, "dog", "--part", "cross"), 2)
    words = run("heatmap", "--from", s2s_file, "--words", "-t", env={"NO_COLOR": "1"})
    assert words.exit_code == 0, words.output
    assert T and S


@pytest.mark.slow
def test_export_writes_every_part(s2s_file, tmp_path):
    result = run("export", "--from", s2s_file, "--out-dir", tmp_path / "all", "--workers", "1")
    assert result.exit_code == 0, result.output
    names = {p.name for p in (tmp_path / "all").iterdir()}
    for part, layers in (("encoder", 2), ("decoder", 3), ("cross", 3)):
        assert f"{part}_grid.png" in names
        assert {f"{part}_layer{n:02d}_head{h:02d}.png" for n in range(layers) for h in range(4)} <= names
    html = (tmp_path / "all" / "index.html").read_text(encoding="utf-8")
    assert all(f'id="{p}"' in html for p in ("encoder", "decoder", "cross"))
    rows = (tmp_path / "all" / "heads.csv").read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("part,layer,head") and len(rows) == 1 + (2 + 3 + 3) * 4
    assert isinstance(load_capture(tmp_path / "all" / "attention.npz"), Parts)
    only = run("export", "--from", s2s_file, "--out-dir", tmp_path / "cross", "--part", "cross")
    assert only.exit_code == 0 and not any(p.name.startswith("encoder") for p in (tmp_path / "cross").iterdir())


@pytest.mark.parametrize("kind", KINDS)
def test_verify_checks_all_three_parts(tiny_seq2seq_dir, kind):
    result = run("verify", SOURCE, "-m", tiny_seq2seq_dir(kind), "--target", TARGET, "--json")
    assert result.exit_code == 0, result.output
    checks = json.loads(result.stdout)["checks"]
    assert set(checks) == {"encoder: model vs scratch", "decoder: model vs scratch", "cross: model vs scratch"}
    assert all(c["max_abs_diff"] <= 1e-5 for c in checks.values())


def test_verify_from_a_saved_capture_catches_a_change(s2s_file, tmp_path, tiny_seq2seq_dir):
    """One row of the saved cross-attention made uniform: verify names that comparison and that layer as the
    failure (exit 3), by the size of the change, and every other check still passes."""
    ok = json.loads(run("verify", "--from", s2s_file, "-m", tiny_seq2seq_dir("t5"), "--json").stdout)
    assert ok["passed"] and all(check["passed"] for check in ok["checks"].values())
    parts = load_capture(s2s_file)
    cross = parts.part("cross")
    alpha = cross.attentions.copy()
    alpha[1, 2, 0] = 1.0 / cross.n_keys  # one row made uniform: still a valid distribution
    changed = Parts({**parts.captures, "cross": replace(cross, attentions=alpha)}).save(tmp_path / "changed.npz")
    result = run("verify", "--from", changed, "-m", tiny_seq2seq_dir("t5"), "--json")
    assert result.exit_code == 3
    checks = json.loads(result.stdout)["checks"]
    failed = {name for name, check in checks.items() if not check["passed"]}
    assert failed == {"cross: saved vs model"}
    worst = max(checks["cross: saved vs model"]["layers"], key=lambda d: d["max_abs"])
    assert worst["layer"] == 1 and worst["max_abs"] == pytest.approx(
        float(np.abs(cross.attentions[1, 2, 0] - alpha[1, 2, 0]).max()), abs=1e-5)


@pytest.mark.slow
def test_single_attention_commands_and_options_are_refused_in_one_line(tiny_seq2seq_dir, tiny_model_dir):
    t5 = tiny_seq2seq_dir("t5")
    for command in ("steps", "positions", "norms", "sinks"):
        assert "encoder-decoder" in one_line_error(run(command, SOURCE, "-m", t5), 1)
    bert = tiny_model_dir("bert")
    one_line_error(run("heatmap", SOURCE, "-m", bert, "--part", "cross", "-t"), 2)
    one_line_error(run("heatmap", SOURCE, "-m", bert, "--target", "x", "-t"), 2)
    one_line_error(run("heatmap", SOURCE, "-m", t5, "--target", "x", "-n", "3", "-t"), 2)


def test_what_applies_to_which_model_is_the_librarys_decision_spelled_as_flags(tiny_seq2seq_dir, tiny_model_dir):
    """The library refuses an argument that does not apply to the model (part, target, max_new_tokens for
    encoder-decoders only; stream for the others); the command line says it in one line with its flags."""
    t5, bert = tiny_seq2seq_dir("t5"), tiny_model_dir("bert")
    cases = [
        (["heatmap", SOURCE, "-m", bert, "--part", "cross", "-t"],
         "{bert} has one kind of attention (self-attention); --part is for "
         "encoder-decoder models (T5, BART, Marian)"),
        (["heads", SOURCE, "-m", bert, "-n", "3"],
         "--target and --max-new-tokens are for encoder-decoder models; {bert} is not one (for a "
         "causal language model, attnviz generate writes text)"),
        (["heatmap", SOURCE, "-m", t5, "--target", "x", "-n", "3", "-t"],
         "give either --target (the decoder reads it) or --max-new-tokens (the decoder writes), "
         "not both"),
        (["export", SOURCE, "-m", t5, "--stream", "--out-dir", "never"],
         "--stream is for long inputs of encoder-only and decoder-only models; an encoder-decoder "
         "model's attention is kept whole (--max-memory bounds it)"),
    ]
    for args, expected in cases:
        line = one_line_error(run(*args, env={"COLUMNS": "400"}), 2)
        assert line.startswith("Error: " + expected.format(bert=bert)), line
    assert not Path("never").exists()
    scaling = run("scaling", SOURCE, "-m", t5, env={"COLUMNS": "200"})
    assert scaling.exit_code == 0 and "T5 does not divide by √d_k" in scaling.stdout


def test_the_decoder_writes_by_default(tiny_seq2seq_dir):
    """Without --target the decoder writes (greedy, -n tokens at most), says so, and its rows are what the library
    writes: the same target tokens and the same cross-attention."""
    import attnviz

    folder = tiny_seq2seq_dir("bart")
    result = run("heatmap", SOURCE, "-m", folder, "-n", "4", "-t", env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert "Decoder input: written by the model" in result.stderr
    printed = json.loads(run("heatmap", SOURCE, "-m", folder, "-n", "4", "--json", "--layer", "0", "--head",
                             "0").stdout)
    written = attnviz.capture(SOURCE, model=folder, max_new_tokens=4).part("cross")
    assert printed["tokens"] == list(written.tokens) and len(written.tokens) <= 4 + 2
    np.testing.assert_allclose(printed["panels"][0]["alpha"], written.attentions[0, 0], atol=1e-6)


def test_words_on_cross_attention(s2s):
    from attnviz.data.words import to_words

    parts = parts_capture(s2s("t5"), SOURCE, target="A dog ran in the park")
    words = to_words(parts.part("cross"))
    assert words.attentions.shape[3] == len(words.keys.tokens) <= parts.part("cross").n_keys
    assert "park" in words.tokens  # "par" + "##k" is one word again
    assert np.allclose(words.attentions.sum(-1), 1, atol=1e-5)


@pytest.mark.slow
def test_export_words_puts_every_part_at_word_level(s2s_file, tmp_path):
    result = run("export", "--from", s2s_file, "--words", "--out-dir", tmp_path / "words", "--workers", "1")
    assert result.exit_code == 0, result.output
    saved = load_capture(tmp_path / "words" / "attention.npz")
    assert isinstance(saved, Parts)
    for name in saved.names:
        part = saved.part(name)
        assert part.meta["level"] == "word"
        assert np.allclose(part.attentions.sum(-1), 1, atol=1e-5)
    assert "park" in saved.part("cross").tokens  # "par" + "##k" pooled into one target word
