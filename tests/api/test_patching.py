"""Activation patching (attnviz patch, attnviz.patch): a piece of one run put into the other, each check
against an independent computation: a run patched into itself, every piece patched at once, the patched
head's own input to W_O, and the loop of one pass per patch."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from helpers import build_tiny_model, one_line_error, require_real, run

import attnviz
from attnviz.errors import InputError
from attnviz.engine import offline

CLEAN, CORRUPT = "The cat sat on the mat", "The dog sat on the mat"
FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "olmo2", "cohere2", "smollm3",
            "gpt_oss", "bert", "distilbert")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made: dict = {}

    def folder(kind: str):
        if kind not in made:
            made[kind] = str(build_tiny_model(kind, tmp_path_factory.mktemp(kind) / kind, lm=kind in ("gpt2", "llama"),
                                              init=0.3))
        return made[kind]

    return folder


def prepared(folder):
    from attnviz.engine.ablation import site
    from attnviz.engine.forward import encode
    from attnviz.engine.models import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load(folder, device="cpu", lm_head="auto")
    return loaded, site(loaded.model), encode(loaded, CLEAN), encode(loaded, corrupt_for(loaded))


def w_o_input(where, layer: int, call):
    """What layer `layer`'s output projection receives while `call()` runs, split into heads (B, T, H, d): a hook
    of the test's own."""
    seen: dict = {}

    def keep(module, args, output):
        seen["z"] = args[0].detach().reshape(*args[0].shape[:-1], where.heads, -1)

    hook = where.projections[layer].register_forward_hook(keep)
    try:
        call()
    finally:
        hook.remove()
    return seen["z"]


def corrupt_for(loaded) -> str:
    """CLEAN with its animal changed (or to "mat", in a tiny vocabulary), as many tokens for this tokenizer."""
    from attnviz.engine.forward import encode

    length = len(encode(loaded, CLEAN).tokens)
    for animal in ("dog", "cow", "hat", "rat", "bat", "pig", "mat"):
        text = CLEAN.replace("cat", animal)
        if len(encode(loaded, text).tokens) == length:
            return text
    raise AssertionError("no corrupted prompt of the clean one's length")


def answers_of(loaded) -> tuple[str, str] | None:
    """Two tokens of the model's vocabulary whose text is one token again (None for an encoder)."""
    from attnviz.engine.ablation import is_causal_lm

    if not is_causal_lm(loaded.model):
        return None
    found = []
    for i in range(5, len(loaded.tokenizer)):
        text = loaded.tokenizer.decode([i])
        single = loaded.tokenizer.encode(text, add_special_tokens=False) == [i]
        if text and "," not in text and "'" not in text and single:
            found.append(text)
        if len(found) == 2:
            return found[0], found[1]
    raise AssertionError("no two single-token texts")


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_run_patched_into_itself_changes_nothing(kind, folders):
    """Every head, attention output and residual position of the clean run put into the clean run: the logits
    stay the clean run's (float32 through the same layers: 1e-5 of their size)."""
    from attnviz.engine.patching import donor_run, every_patch, run_patches

    loaded, where, clean, _ = prepared(folders(kind))
    donor = donor_run(where, clean.inputs)
    T = len(clean.tokens)
    for what in ("head", "attention", "residual"):
        logits = run_patches(where, clean.inputs, donor, every_patch(what, where.layers, where.heads, T))
        scale = float(donor.reading.abs().max())
        assert float((logits - donor.reading).abs().max()) <= 1e-5 * max(1.0, scale)


@pytest.mark.parametrize("kind", FAMILIES)
def test_every_head_and_mlp_patched_gives_the_donors_run(kind, folders):
    """Every head's z and every MLP's output of every layer from the donor: at the last position, whose token
    both prompts share, the logits are the donor's own; the API reports it as 1 denoising and 0 noising."""
    from attnviz.engine.patching import all_patched_logits, donor_run

    loaded, where, clean, corrupt = prepared(folders(kind))
    donor = donor_run(where, clean.inputs)
    reading = all_patched_logits(where, corrupt.inputs, donor)
    if answers_of(loaded) is None:  # an encoder: every position whose token is shared (the pooled one is not)
        T = len(clean.tokens)
        shared = [i for i, (a, b) in enumerate(zip(clean.tokens, corrupt.tokens)) if a == b]
        D = reading.shape[0] // (T + 1)
        reading, wanted = reading[D:].view(T, D)[shared], donor.reading[D:].view(T, D)[shared]
    else:
        wanted = donor.reading
    assert float((reading - wanted).abs().max()) <= 1e-5 * max(1.0, float(wanted.abs().max()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for direction, target in (("denoise", 1.0), ("noise", 0.0)):
            result = attnviz.patch(CLEAN, corrupt_for(loaded), model=loaded, answers=answers_of(loaded),
                                   direction=direction)
            assert result.passed and result.all_patched == pytest.approx(target, abs=1e-4)
            assert result.heads.shape == (where.layers, where.heads)
            assert result.residual.shape == (where.layers, len(result.tokens))


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_the_residual_stream_patched_below_the_first_layer_is_the_clean_run(kind, folders):
    """Patching the residual stream entering layer 0 at the one position where the prompts differ makes the
    corrupted run the clean one: restored 1 there, and 0 at every position where the tokens are the same (a
    causal LM's logit difference; an encoder's sentence embedding, by its cosine with the clean run's)."""
    loaded, *_ = prepared(folders(kind))
    result = attnviz.patch(CLEAN, CORRUPT, model=loaded, answers=answers_of(loaded))
    (where,) = result.differs  # "cat" / "dog" (after the tokenizer's start token)
    assert result.residual[0, where] == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(np.delete(result.residual[0], where), 0.0, atol=1e-5)


def test_a_patched_head_receives_the_donors_output_exactly(folders):
    """What W_O receives in a patched copy, recorded by a hook of the test's own: the patched head's slice is the
    donor's (at every position, or at the one position), every other slice the receiver's."""
    import torch

    from attnviz.engine.ablation import recording
    from attnviz.engine.patching import Patch, donor_run, patched_logits

    loaded, where, clean, corrupt = prepared(folders("gpt2"))
    donor = donor_run(where, clean.inputs)
    with recording(where) as receiver_z, torch.inference_mode():
        loaded.model(**corrupt.inputs)
    layer, head = 1, 2
    z = w_o_input(where, layer, lambda: patched_logits(where, corrupt.inputs, donor, [
        Patch("head", layer, head), Patch("head", layer, head, 1)]))  # (3, T, H, d): the receiver, the head at
    # every position, the head at position 1
    others = [h for h in range(where.heads) if h != head]
    # what is copied is the donor's, bit for bit; the rest is the receiver's (a batch of 3 rounds its products
    # in other orders than a batch of 1: float32, 1e-6)
    assert torch.equal(z[1, :, head], donor.z[layer][0, :, head])
    assert torch.equal(z[2, 1, head], donor.z[layer][0, 1, head])
    torch.testing.assert_close(z[0], receiver_z[layer][0], atol=1e-6, rtol=0)
    torch.testing.assert_close(z[1][:, others], receiver_z[layer][0][:, others], atol=1e-6, rtol=0)
    torch.testing.assert_close(z[2, 0, head], receiver_z[layer][0, 0, head], atol=1e-6, rtol=0)
    assert float((donor.z[layer][0, :, head] - receiver_z[layer][0, :, head]).abs().max()) > 1e-3  # it moved


@pytest.mark.parametrize("kind", ["gpt2", "qwen3"])
def test_the_batched_patches_equal_one_pass_per_patch(kind, folders):
    from attnviz.engine.patching import donor_run, every_patch, run_patches

    loaded, where, clean, corrupt = prepared(folders(kind))
    donor = donor_run(where, clean.inputs)
    T = len(clean.tokens)
    for what, positions in (("head", True), ("attention", False), ("residual", False)):
        patches = every_patch(what, where.layers, where.heads, T, positions=positions)
        batched = run_patches(where, corrupt.inputs, donor, patches)
        loop = run_patches(where, corrupt.inputs, donor, patches, batched=False)
        assert float((batched - loop).abs().max()) <= 1e-5 * max(1.0, float(loop.abs().max()))


def test_what_patch_refuses_in_one_line(folders, tiny_model_dir):
    folder = folders("gpt2")
    assert "as many tokens" in one_line_error(run("patch", CLEAN, "The dog sat on the big soft mat", "-m", folder))
    assert "encoder" in one_line_error(run("patch", CLEAN, CORRUPT, "-m", tiny_model_dir("bert"), "--answers", "a,b"))
    assert "same logit difference" in one_line_error(run("patch", CLEAN, CLEAN, "-m", folder, "--answers", "a,b"))
    assert "--answers" in one_line_error(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", "a"), 2)
    with pytest.raises(attnviz.AttnvizError, match="direction"):
        attnviz.patch(CLEAN, CORRUPT, model=folder, direction="sideways")
    with pytest.raises(attnviz.AttnvizError, match="two different tokens"):
        attnviz.patch(CLEAN, CORRUPT, model=folder, answers=("a", "a"))


def test_patch_from_the_command_line(folders, tmp_path):
    folder = folders("llama")
    loaded, *_ = prepared(folder)
    a, b = answers_of(loaded)
    pair = f"'{a}','{b}'"
    path = tmp_path / "clean.txt"
    path.write_text(CLEAN, encoding="utf-8")
    given = json.loads(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--json").stdout)
    piped = json.loads(run("patch", "-", CORRUPT, "-m", folder, "--answers", pair, "--json", input=CLEAN).stdout)
    filed = json.loads(run("patch", "--text-file", path, CORRUPT, "-m", folder, "--answers", pair, "--json").stdout)
    assert given == piped == filed and given["passed"] and (given["answer"], given["other"]) == (a, b)
    T = len(given["tokens"])
    assert len(given["heads"]) == 2 and len(given["heads"][0]) == 4 and len(given["residual"][0]) == T
    assert sum(a != b for a, b in zip(given["tokens"], given["corrupt_tokens"])) == 1 and "head_positions" not in given
    with_positions = json.loads(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--positions",
                                    "--json").stdout)
    assert np.array(with_positions["head_positions"]).shape == (2, 4, T)
    noised = json.loads(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--noise", "--json").stdout)
    assert noised["direction"] == "noise" and noised["all_patched"] == pytest.approx(0.0, abs=1e-4)
    csv = run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--csv").stdout.splitlines()
    assert csv[0] == "layer,head,score" and len(csv) == 1 + 2 * 4
    shown = run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "-o", tmp_path / "p.png",
                env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and "PASS" in shown.stdout and (tmp_path / "p.png").is_file()
    assert "layer.head" in shown.stdout and "restored" in shown.stdout


def test_the_picture_is_three_panels_on_one_scale_and_the_top_heads_on_both_prompts(folders):
    """Heads, attention outputs and residual streams on one scale centred on 0; then per top head (by |restored|)
    its α on each prompt, as attnviz.capture gives it, and their difference."""
    loaded, *_ = prepared(folders("gpt2"))
    result = attnviz.patch(CLEAN, CORRUPT, model=loaded, answers=answers_of(loaded))
    figure = result.figure()
    drawn = [ax for ax in figure.axes if ax.images]
    assert len(drawn) == 3 + 3 * len(result.patterns) and len(result.patterns) == 3
    limits = {tuple(ax.images[0].get_clim()) for ax in drawn[:3]}
    assert len(limits) == 1 and next(iter(limits))[0] == -next(iter(limits))[1]
    np.testing.assert_allclose(np.asarray(drawn[0].images[0].get_array()), result.heads, atol=1e-6)
    top = result.top(3)
    assert [(n, h) for n, h, _, _ in result.patterns] == [(t["layer"], t["head"]) for t in top]
    clean_alpha = attnviz.capture(CLEAN, model=loaded).attentions
    corrupt_alpha = attnviz.capture(CORRUPT, model=loaded).attentions
    for k, (n, h, on_clean, on_corrupt) in enumerate(result.patterns):
        np.testing.assert_allclose(on_clean, clean_alpha[n, h], atol=1e-6)
        np.testing.assert_allclose(on_corrupt, corrupt_alpha[n, h], atol=1e-6)
        shown = np.ma.getdata(drawn[5 + 3 * k].images[0].get_array())
        np.testing.assert_allclose(np.tril(shown), np.tril(on_clean - on_corrupt), atol=1e-6)


def test_smollm2_carries_the_country_through_one_head():
    """The real model: "The capital of France is" / "… Italy is", ' Paris' against ' Rome'. Head 23.4 alone,
    patched from the clean run, brings back most of the answer; the difference moves from "France" to the last
    position in the residual stream at layer 24; everything patched gives the clean run."""
    require_real(offline.SMOLLM2)
    result = attnviz.patch("The capital of France is", "The capital of Italy is", model="smollm2",
                           answers=(" Paris", " Rome"))
    assert result.passed and result.top(1)[0]["layer"] == 23 and result.top(1)[0]["head"] == 4
    assert result.heads[23, 4] > 0.8
    assert result.residual[23, 3] > 0.9 and result.residual[24, 4] > 0.9 and result.residual[23, 4] < 0.1


# --- path patching ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3"])
def test_path_patching_with_no_receivers_changes_nothing(kind, folders):
    """Senders patched, every other head frozen, but no receiver reads them: the corrupted run's answer (0), and
    a donor that is the receiver run itself gives the receiver's own logits."""
    from attnviz.engine.scratch.adapters import adapter_for
    from attnviz.engine.patching import donor_run
    from attnviz.engine.paths import path_patched_logits, path_recording

    loaded, where, clean, corrupt = prepared(folders(kind))
    result = attnviz.path_patch(CLEAN, CORRUPT, senders="0.1", receivers=(), model=loaded, answers=answers_of(loaded))
    assert result.score == pytest.approx(0.0, abs=1e-6) and result.by_receiver == ()
    base = getattr(loaded.model, "base_model", loaded.model)
    attention = adapter_for(base).modules(base)
    receiver = donor_run(where, corrupt.inputs)
    recorded = path_recording(where, attention, corrupt.inputs, receiver, receiver, [(0, 1)], [(1, 0), (1, 2)], "qkv")
    logits = path_patched_logits(where, corrupt.inputs, recorded, [(1, 0), (1, 2)])
    assert float((logits - receiver.reading).abs().max()) <= 1e-5 * max(1.0, float(receiver.reading.abs().max()))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_path_patching_moves_the_answer_only_through_the_receivers(kind, folders):
    """Through one receiver's query, key or value the path changes the answer by some amount; each input alone
    and all three together are measured; receivers not after the senders, and unknown inputs, are refused."""
    loaded, *_ = prepared(folders(kind))
    answers = answers_of(loaded)
    scores = {to: attnviz.path_patch(CLEAN, CORRUPT, senders="0.all", receivers="1.all", to=to, model=loaded,
                                     answers=answers) for to in ("q", "k", "v", "qkv")}
    assert all(len(r.by_receiver) == 4 for r in scores.values())
    assert any(abs(r.score) > 1e-4 for r in scores.values())  # the path carries something
    with pytest.raises(attnviz.AttnvizError, match="layers after the senders"):
        attnviz.path_patch(CLEAN, CORRUPT, senders="1.0", receivers="1.1", model=loaded, answers=answers)
    with pytest.raises(attnviz.AttnvizError, match="q, k and v"):
        attnviz.path_patch(CLEAN, CORRUPT, senders="0.0", receivers="1.1", to="x", model=loaded, answers=answers)


def test_path_patching_from_the_command_line(folders):
    folder = folders("gpt2")
    loaded, *_ = prepared(folder)
    a, b = answers_of(loaded)
    pair = f"'{a}','{b}'"
    data = json.loads(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--from-heads", "0.1",
                          "--receivers", "1.0,1.3", "--to", "v", "--json").stdout)
    assert data["senders"] == [[0, 1]] and [r["head"] for r in data["by_receiver"]] == [0, 3] and data["to"] == "v"
    shown = run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--from-heads", "0.1", "--receivers", "1.0",
                env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and "path patching" in shown.stdout and "1.0" in shown.stdout
    assert "--senders" in one_line_error(run("patch", CLEAN, CORRUPT, "-m", folder, "--receivers", "1.0"), 2)


# --- prompts of different lengths: an alignment -------------------------------------------------------------

LONGER = "The big cat sat on the mat"  # CLEAN with a word more: more tokens for every tokenizer here


def test_align_tokens_pairs_the_shared_tokens_and_a_changed_span_by_its_last():
    from attnviz.api.patching.prompts import align_tokens

    clean = ["The", "E", "iffel", "Tower", "is", "in"]
    assert align_tokens(clean, ["The", "Vatican", "is", "in"]) == ((0, 0), (3, 1), (4, 2), (5, 3))
    assert align_tokens(clean, ["The", "Col", "osse", "um", "is", "in"]) == tuple((i, i) for i in range(6))
    assert align_tokens(["a", "b", "c"], ["a", "x", "b", "c"]) == ((0, 0), (1, 2), (2, 3))  # an insertion: left out
    assert align_tokens(clean, ["The", "Vatican", "is", "in"], "0:0,3-5:1-3") == ((0, 0), (3, 1), (4, 2), (5, 3))
    assert align_tokens(clean, clean, [(1, 1), (5, 5)]) == ((1, 1), (5, 5))


@pytest.mark.parametrize("spec, message", [
    ("0:0,9:1", "out of range"), ("1:1,0:0", "increase"), ("0-2:0-1", "as many positions"), ("0:0:1", "pairs"),
    ("x:0", "whole number"), ("2-1:2-1", "goes up"), ("", "pairs CLEAN:CORRUPT"), ([(0, "a")], "pairs")])
def test_align_tokens_refuses_a_malformed_alignment(spec, message):
    from attnviz.api.patching.prompts import align_tokens

    with pytest.raises(attnviz.AttnvizError, match=message) as raised:
        align_tokens(["a", "b", "c"], ["a", "b"], spec)
    assert raised.value.exit_code == 2


def test_an_aligned_patch_moves_the_donors_own_positions_exactly(folders):
    """Prompts of different lengths: what W_O receives in a patched copy, recorded by the test's own hook, is at
    each aligned position the donor's z at its partner position, bit for bit, and elsewhere the receiver's."""
    import torch

    from attnviz.api.patching.prompts import align_tokens
    from attnviz.engine.forward import encode
    from attnviz.engine.patching import aligned, donor_run, Patch, patched_logits

    loaded, where, clean, _ = prepared(folders("llama"))
    longer = encode(loaded, LONGER)
    pairs = align_tokens(list(clean.tokens), list(longer.tokens))
    assert len(longer.tokens) > len(clean.tokens) and len(pairs) == len(clean.tokens)
    donor, receiver = donor_run(where, clean.inputs), donor_run(where, longer.inputs)
    moved = aligned(donor, receiver, [(k, i) for i, k in pairs])
    layer, head = 1, 2
    z = w_o_input(where, layer, lambda: patched_logits(where, longer.inputs, moved, [Patch("head", layer, head)]))[1]
    # (T', H, d): the patched copy
    for i, k in pairs:
        assert torch.equal(z[k, head], donor.z[layer][0, i, head])
    inserted = sorted(set(range(len(longer.tokens))) - {k for _, k in pairs})
    assert inserted
    torch.testing.assert_close(z[inserted, head], receiver.z[layer][0, inserted, head], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind, check", [("llama", True), ("qwen3", True), ("gpt2", False)])
def test_prompts_of_different_lengths_patched_through_an_alignment(kind, check, folders):
    """--align auto: the shared tokens patched pair by pair. With rotary positions every head and MLP patched at
    the aligned positions gives the donor's logits at the last position (denoising 1, noising 0, 1e-4); GPT-2's
    table of absolute positions puts the last token at another index, so the check does not apply. Without an
    alignment the prompts are refused; the identity alignment given explicitly is the plain patch."""
    loaded, *_ = prepared(folders(kind))
    answers = answers_of(loaded)
    for direction, target in (("denoise", 1.0), ("noise", 0.0)):
        result = attnviz.patch(CLEAN, LONGER, model=loaded, answers=answers, align="auto", direction=direction,
                               positions=True)
        T = len(result.tokens)
        assert len(result.corrupt_tokens) > T and len(result.alignment) == T
        assert result.attention.shape == result.residual.shape == (loaded.model.config.num_hidden_layers, T)
        assert result.head_positions.shape[-1] == T and result.differs == ()
        if check:
            assert result.passed and result.all_patched == pytest.approx(target, abs=1e-4)
        else:
            assert result.all_patched is None and result.passed
    with pytest.raises(attnviz.AttnvizError, match="align"):
        attnviz.patch(CLEAN, LONGER, model=loaded, answers=answers)
    plain = attnviz.patch(CLEAN, CORRUPT, model=loaded, answers=answers)
    explicit = attnviz.patch(CLEAN, CORRUPT, model=loaded, answers=answers,
                             align=",".join(f"{i}:{i}" for i in range(len(plain.tokens))))
    np.testing.assert_array_equal(explicit.heads, plain.heads)
    np.testing.assert_array_equal(explicit.residual, plain.residual)
    assert explicit.alignment == () and explicit.pairs == plain.pairs
    path = attnviz.path_patch(CLEAN, LONGER, senders="0.1", receivers=(), model=loaded, answers=answers, align="auto")
    assert path.score == pytest.approx(0.0, abs=1e-6) and len(path.alignment) == T


def test_an_alignment_from_the_command_line(folders, tmp_path):
    folder = folders("llama")
    loaded, *_ = prepared(folder)
    a, b = answers_of(loaded)
    pair = f"'{a}','{b}'"
    data = json.loads(run("patch", CLEAN, LONGER, "-m", folder, "--answers", pair, "--align", "auto", "--json").stdout)
    T = len(data["tokens"])
    T2 = len(data["corrupt_tokens"])
    assert len(data["alignment"]) == T == len(data["residual"][0]) and T2 > T
    assert data["passed"] and data["all_patched"] == pytest.approx(1.0, abs=1e-4)
    explicit = json.loads(run("patch", CLEAN, LONGER, "-m", folder, "--answers", pair, "--json", "--align",
                              ",".join(f"{i}:{k}" for i, k in data["alignment"])).stdout)
    assert explicit["heads"] == data["heads"]
    shown = run("patch", CLEAN, LONGER, "-m", folder, "--answers", pair, "--align", "auto",
                env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and f"Aligned {T} position(s) of {T} and {T2}" in shown.stdout
    assert "--align" in one_line_error(run("patch", CLEAN, LONGER, "-m", folder, "--answers", pair))
    assert "out of range" in one_line_error(run("patch", CLEAN, LONGER, "-m", folder, "--answers", pair, "--align",
                                                "0:0,40:41"), 2)
    assert "--align" in one_line_error(run("patch", CLEAN, LONGER, "-m", folder, "--answers", pair, "--align",
                                           "zero"), 2)


# --- the interactive page ----------------------------------------------------------------------------------------


def test_the_patching_page_holds_both_prompts_and_every_score(folders, tmp_path):
    """`patch --html`: the page's two parts are the two prompts' α (as attnviz.capture gives them), and its
    patching panel holds each head's, attention output's and residual stream's score as the result has them."""
    import re

    folder = folders("llama")
    loaded, *_ = prepared(folder)
    a, b = answers_of(loaded)
    result = attnviz.patch(CLEAN, LONGER, model=loaded, answers=(a, b), align="auto", positions=True)
    data = json.loads(re.search(r'id="attnviz-data">(.*?)</script>', result.html(), re.S).group(1))
    section = data["patching"]
    L, H = result.heads.shape
    np.testing.assert_allclose(np.reshape(section["heads"], (L, H)), result.heads, atol=1e-6)
    np.testing.assert_allclose(np.reshape(section["residual"], (L, -1)), result.residual, atol=1e-6)
    np.testing.assert_allclose(np.reshape(section["headPositions"], (L, H, -1)), result.head_positions, atol=1e-6)
    assert section["pairs"] == [list(p) for p in result.pairs] and section["labels"] == list(result.labels())
    assert [s["title"] for s in data["sections"]] == ["the clean prompt", "the corrupted prompt"]
    assert data["sections"][1]["rows"] == [visible_token(t) for t in result.corrupt_tokens]
    shown = run("patch", CLEAN, LONGER, "-m", folder, "--answers", f"'{a}','{b}'", "--align", "auto", "--html",
                tmp_path / "p.html")
    assert shown.exit_code == 0 and (tmp_path / "p.html").read_text(encoding="utf-8").count("av-tab-patch") >= 2
    assert ".html" in one_line_error(run("patch", CLEAN, CORRUPT, "-m", folder, "--html", tmp_path / "p.png"))
    assert "--html" in one_line_error(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", f"'{a}','{b}'",
                                          "--from-heads", "0.1", "--html", tmp_path / "q.html"), 2)
    assert not (tmp_path / "q.html").exists()


def visible_token(token: str) -> str:
    from attnviz.base.text import visible

    return visible(token)



def spellings(loaded, logits) -> tuple[str, str]:
    """A word both with and without its leading space one token each: (the spelling that scores lower at the
    last position, the one that scores higher)."""
    for i in range(5, len(loaded.tokenizer)):
        text = loaded.tokenizer.decode([i])
        if not text.startswith(" ") or not text[1:].isalpha():
            continue
        bare = loaded.tokenizer.encode(text[1:], add_special_tokens=False)
        if loaded.tokenizer.encode(text, add_special_tokens=False) == [i] and len(bare) == 1 and bare[0] != i:
            return (text, text[1:]) if logits[i] < logits[bare[0]] else (text[1:], text)
    raise AssertionError("no word spelled both ways")


def test_an_answer_that_is_not_the_likeliest_spelling_is_said(folders):
    """--answers 'Paris' where ' Paris' scores higher: a warning names the other spelling, the logits of both,
    and the user's line (not attnviz's); the likelier spelling itself runs quietly."""
    from attnviz.engine.patching import donor_run

    loaded, where, clean, corrupt = prepared(folders("gpt2"))
    logits = donor_run(where, clean.inputs).reading.double().cpu().numpy()
    worse, better = spellings(loaded, logits)
    other = next(t for t in answers_of(loaded) if t.strip() != worse.strip())
    with pytest.warns(attnviz.AttnvizWarning, match=f"{better!r} scores higher") as caught:
        attnviz.patch(CLEAN, CORRUPT, model=loaded, answers=(worse, other))
    assert [w.filename for w in caught if worse in str(w.message)] == [__file__]
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        attnviz.patch(CLEAN, CORRUPT, model=loaded, answers=(better, other))
    assert not [w for w in quiet if better.strip() in str(w.message) and "scores higher" in str(w.message)]
    printed = run("patch", CLEAN, CORRUPT, "-m", folders("gpt2"), "--answers", f"'{worse}','{other}'")
    assert printed.exit_code == 0 and f"--answers {worse!r} is not how" in printed.stderr


def test_a_logit_attr_target_that_is_not_the_likeliest_spelling_is_said(folders):
    from attnviz.engine.patching import donor_run

    loaded, where, clean, _ = prepared(folders("gpt2"))
    logits = donor_run(where, clean.inputs).reading.double().cpu().numpy()
    worse, better = spellings(loaded, logits)
    with pytest.warns(attnviz.AttnvizWarning, match=f"target {worse!r} is not how") as caught:
        attnviz.logit_attr(CLEAN, model=loaded, target=worse)
    assert caught[0].filename == __file__


# --- attribution patching (AtP): every piece's effect from one forward and one backward pass -----------------


def _double(folder):
    """The tiny model in float64, so that a tolerance of 1e-9 is the arithmetic's, not float32's."""
    loaded, where, clean, corrupt = prepared(folder)
    loaded.model.double()
    return loaded, where, clean, corrupt


def _linear_in_the_last_layer(loaded, kind):
    """The model made linear in its last layer's heads: that layer's MLP writes 0 and the final norm is gone, so
    the logits are W_U (x + W_O z + b)."""
    import torch

    model = loaded.model
    if kind == "gpt2":
        last = model.transformer.h[-1].mlp.c_proj
        model.transformer.ln_f = torch.nn.Identity()
    else:
        last = model.model.layers[-1].mlp.down_proj
        model.model.norm = torch.nn.Identity()
    with torch.no_grad():
        last.weight.zero_()
        if last.bias is not None:
            last.bias.zero_()


def metric_of(loaded, clean, clean_run):
    """patch's metric for the tiny model: the logit difference of answers_of(), or an encoder's cosine with the
    clean run's sentence embedding."""
    from attnviz.api.patching.prompts import Metric

    answers = answers_of(loaded)
    if answers is None:
        T = len(clean.tokens)
        return Metric(reference=clean_run.reading[:clean_run.reading.shape[0] // (T + 1)])
    ids = [loaded.tokenizer.encode(a, add_special_tokens=False)[0] for a in answers]
    return Metric(answers=(ids[0], ids[1]))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_atp_equals_exact_patching_where_the_model_is_linear_in_the_piece(kind, folders):
    """With the last layer's MLP writing 0 and no final norm, the logit difference is linear in the last layer's
    heads: AtP's estimate of each of them (and of that layer's attention output at each position) equals the
    exact patch to float64 rounding. Below, where the model is not linear, the two differ (the check can fail)."""
    loaded, where, clean, corrupt = _double(folders(kind))
    _linear_in_the_last_layer(loaded, kind)
    answers = answers_of(loaded)
    exact = attnviz.patch(CLEAN, corrupt_for(loaded), model=loaded, answers=answers)
    atp = attnviz.patch(CLEAN, corrupt_for(loaded), model=loaded, answers=answers, method="atp")
    assert atp.method == "atp" and exact.method == "exact"
    np.testing.assert_allclose(atp.heads[-1], exact.heads[-1], rtol=0, atol=1e-9)
    np.testing.assert_allclose(atp.attention[-1], exact.attention[-1], rtol=0, atol=1e-9)
    assert float(np.abs(atp.heads[0] - exact.heads[0]).max()) > 1e-3  # the first layer is not linear


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_atp_per_head_is_the_derivative_along_the_patch(kind, folders):
    """AtP of a head is the directional derivative of the metric along (z_donor − z_receiver): central finite
    differences of the patched run, C(ε) = (M(z + εΔ) − M(z − εΔ)) / 2ε in float64, extrapolated (Richardson:
    (4 C(ε/2) − C(ε)) / 3, truncation of order ε⁴, rounding of M over ε) agree with AtP for every head, and for
    the residual stream entering the last layer at every position. No autograd on the finite-difference side.
    GPT-2 and BERT run wholly in float64: ε = 1e-4, within 1e-7 of the metric's scale (rounding 1e-16 / ε).
    (Llama's eager attention takes its softmax in float32 whatever the model's dtype, whose rounding over ε
    swamps such a check; the test above holds Llama's AtP to exact patching instead.) C(1e-4) alone misses by
    ~2e-4 on these random weights: the ε² term."""
    import torch

    from attnviz.engine.ablation.seam import editing
    from attnviz.engine.ablation.runs import run_model
    from attnviz.engine.patching import attributed, donor_run, read

    loaded, where, clean, corrupt = _double(folders(kind))
    clean_run, corrupt_run = donor_run(where, clean.inputs), donor_run(where, corrupt.inputs)
    metric = metric_of(loaded, clean, clean_run)
    T = len(corrupt.tokens)
    heads, residual, value = attributed(where, corrupt.inputs, clean_run, range(T), metric.tensor)
    scale = max(1.0, abs(value))
    eps, tolerance = 1e-4, 1e-7

    def derivative(change) -> float:
        def central(step):
            return (measured(*change(step)) - measured(*change(-step))) / (2 * step)
        return (4 * central(eps / 2) - central(eps)) / 3

    def measured(edit=None, block_edit=None) -> float:
        handles = [] if block_edit is None else [where.blocks[-1].register_forward_pre_hook(block_edit,
                                                                                            with_kwargs=True)]
        try:
            with editing(where, edit or (lambda layer, z: z)), torch.inference_mode():
                return float(metric(read(where.model, run_model(where.model, corrupt.inputs))[0]))
        finally:
            for handle in handles:
                handle.remove()

    assert measured() == pytest.approx(value, abs=1e-12)
    for layer in range(where.layers):
        for head in range(where.heads):
            def moved(step, layer=layer, head=head):
                def edit(n, z):
                    if n != layer:
                        return z
                    z = z.clone()
                    z[0, :, head] += step * (clean_run.z[n][0, :, head] - corrupt_run.z[n][0, :, head])
                    return z
                return edit
            slope = derivative(lambda step: (moved(step), None))
            assert float(heads[layer, :, head].sum()) == pytest.approx(slope, abs=tolerance * scale), (layer, head)
    last = where.layers - 1
    for position in range(T):
        def shifted(step, position=position):
            def hook(module, args, kwargs):
                hidden = (args[0] if args else kwargs["hidden_states"]).clone()
                hidden[0, position] += step * (clean_run.hidden[last][0, position]
                                               - corrupt_run.hidden[last][0, position])
                return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})
            return hook
        slope = derivative(lambda step: (None, shifted(step)))
        assert float(residual[last, position]) == pytest.approx(slope, abs=tolerance * scale), position


def test_atp_touches_no_gradient_of_the_borrowed_model(folders):
    """AtP takes its gradients with autograd.grad: a model whose parameters require gradients gets back no .grad
    and its requires_grad flags as they were."""
    loaded, where, clean, corrupt = prepared(folders("llama"))
    for p in loaded.model.parameters():
        p.requires_grad_(True)
    attnviz.patch(CLEAN, corrupt_for(loaded), model=loaded, answers=answers_of(loaded), method="atp")
    assert all(p.grad is None and p.requires_grad for p in loaded.model.parameters())


def test_atp_and_compare_from_the_command_line(folders, tmp_path):
    """--method atp keeps the JSON's shape and says its method; --compare adds both grids, Pearson's r (equal to
    NumPy's over the two grids) and the heads where they differ most; -o draws them; TEXT, - and --text-file
    agree; a wrong --method is one line, exit 2."""
    folder = folders("llama")
    loaded, *_ = prepared(folder)
    a, b = answers_of(loaded)
    pair = f"'{a}','{b}'"
    path = tmp_path / "clean.txt"
    path.write_text(CLEAN, encoding="utf-8")
    given = json.loads(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--method", "atp",
                           "--json").stdout)
    piped = json.loads(run("patch", "-", CORRUPT, "-m", folder, "--answers", pair, "--method", "atp", "--json",
                           input=CLEAN).stdout)
    filed = json.loads(run("patch", "--text-file", path, CORRUPT, "-m", folder, "--answers", pair, "--method",
                           "atp", "--json").stdout)
    assert given == piped == filed and given["method"] == "atp" and "compare" not in given
    exact = json.loads(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--json").stdout)
    assert np.array(given["heads"]).shape == np.array(exact["heads"]).shape
    assert np.array(given["residual"]).shape == np.array(exact["residual"]).shape
    both = json.loads(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--method", "atp", "--compare",
                          "--json").stdout)["compare"]
    np.testing.assert_allclose(both["exact"], exact["heads"], atol=1e-12)
    np.testing.assert_allclose(both["estimate"], given["heads"], atol=1e-12)
    r = np.corrcoef(np.ravel(both["exact"]), np.ravel(both["estimate"]))[0, 1]
    assert both["pearson_r"] == pytest.approx(r, abs=1e-12) and both["method"] == "atp"
    gaps = [abs(d["exact"] - d["estimate"]) for d in both["disagree"]]
    assert gaps == sorted(gaps, reverse=True) and gaps[0] == pytest.approx(
        float(np.abs(np.array(both["exact"]) - np.array(both["estimate"])).max()))
    csv = run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--compare", "--csv").stdout.splitlines()
    assert csv[0] == "layer,head,score,exact,estimate" and len(csv) == 1 + 2 * 4
    shown = run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", pair, "--compare", "-o", tmp_path / "c.png",
                env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and "Pearson r" in shown.stdout and (tmp_path / "c.png").is_file()
    bad = run("patch", CLEAN, CORRUPT, "-m", folder, "--method", "fast")
    assert "--method" in one_line_error(bad, 2)
    path_atp = run("patch", CLEAN, CORRUPT, "-m", folder, "--from-heads", "0.1", "--receivers", "1.0", "--method",
                   "atp")
    assert "exact" in one_line_error(path_atp, 2)


def test_atp_finds_the_heads_exact_patching_finds_on_smollm2():
    """SmolLM2, "The capital of France is" against "… Italy is", ' Paris' against ' Rome': AtP's heads follow
    exact patching's (Pearson r over the 270 heads above 0.5) and its strongest head is among exact patching's
    five strongest. The measured figures are in docs/guide/patching.md."""
    require_real(offline.SMOLLM2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = attnviz.patch("The capital of France is", "The capital of Italy is", model="smollm2",
                               answers=(" Paris", " Rome"), method="atp", compare=True)
    assert result.comparison is not None and result.comparison.r is not None and result.comparison.r > 0.5
    exact = result.comparison.exact
    strongest = np.argsort(-np.abs(exact), axis=None)[:5]
    assert int(np.argmax(np.abs(result.heads))) in set(int(i) for i in strongest)


# --- AtP* (Kramár et al. 2024): the QK fix and GradDrop ------------------------------------------------------


def _starred(kind, folders, double=False):
    from attnviz.engine.patching import donor_run
    from attnviz.engine.starred import starred

    loaded, where, clean, corrupt = _double(folders(kind)) if double else prepared(folders(kind))
    clean_run = donor_run(where, clean.inputs)
    metric = metric_of(loaded, clean, clean_run)
    T = len(corrupt.tokens)
    return loaded, where, clean, corrupt, clean_run, metric, starred(where, corrupt.inputs, clean_run, range(T),
                                                                     metric.tensor)


def _alpha_with(where, inputs, layer, position, donor_hidden):
    """Layer `layer`'s α in a full forward pass whose residual stream entering that layer has `position` taken
    from the donor (a pre-hook of the test's own; output_attentions reads α)."""
    import torch

    from attnviz.engine.ablation.runs import run_model

    def hook(module, args, kwargs):
        hidden = (args[0] if args else kwargs["hidden_states"]).clone()
        hidden[0, position] = donor_hidden[0, position].to(hidden.dtype)
        return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})

    handle = where.blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.inference_mode():
            return run_model(where.model, inputs, attentions=True).attentions[layer][0]
    finally:
        handle.remove()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3", "bert"])
def test_the_qk_fix_reads_the_pattern_a_full_forward_pass_gives(kind, folders):
    """The QK fix's α of each layer with the residual stream at one position from the donor equals that layer's
    α in a full forward pass so patched (1e-5: float32, one batch against one run), at every layer and position."""
    loaded, where, clean, corrupt, clean_run, metric, star = _starred(kind, folders)
    T = len(corrupt.tokens)
    for layer in range(where.layers):
        for position in range(T):
            full = _alpha_with(where, corrupt.inputs, layer, position, clean_run.hidden[layer])
            assert float((star.exact_alpha(layer, [position])[0] - full).abs().max()) <= 1e-5, (layer, position)
    assert any(float((star.exact_alpha(n, range(T)) - star.alpha[n]).abs().max()) > 1e-3 for n in range(where.layers))


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_the_qk_fix_takes_out_the_linearised_pattern_change_and_puts_in_the_exact_one(kind, folders):
    """In float64: the linearised term at (layer, position) is the derivative of ⟨∂M/∂α, α(x + εΔ)⟩ along the
    patch (a central difference of full forward passes, extrapolated; within 1e-7 of its scale), and AtP*'s
    residual stream is AtP's minus it plus ⟨∂M/∂α, α(patched) − α⟩ (1e-9)."""
    import torch

    from attnviz.engine.patching import attributed, donor_run

    loaded, where, clean, corrupt, clean_run, metric, star = _starred(kind, folders, double=True)
    T = len(corrupt.tokens)
    _, residual, _ = attributed(where, corrupt.inputs, clean_run, range(T), metric.tensor)
    corrupt_hidden = donor_run(where, corrupt.inputs).hidden
    eps = 1e-4
    for layer in range(where.layers):
        g = star.alpha_grad[layer][0].double()
        scale = max(1.0, float(star.linearised[layer].abs().max()))
        for position in range(T):
            def phi(step, layer=layer, position=position, g=g):
                shifted = corrupt_hidden[layer] + step * (clean_run.hidden[layer] - corrupt_hidden[layer])
                return float((_alpha_with(where, corrupt.inputs, layer, position, shifted).double() * g).sum())

            def central(step):
                return (phi(step) - phi(-step)) / (2 * step)

            slope = (4 * central(eps / 2) - central(eps)) / 3
            assert float(star.linearised[layer, position]) == pytest.approx(slope, abs=1e-7 * scale), (layer, position)
            exact = float(((star.exact_alpha(layer, [position])[0].double() - star.alpha[layer][0].double()) * g).sum())
            wanted = float(residual[layer, position]) - float(star.linearised[layer, position]) + exact
            assert float(star.residual[layer, position]) == pytest.approx(wanted, abs=1e-9 * scale)
    assert torch.is_tensor(star.residual)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_graddrop_cuts_one_block_at_a_time(kind, folders):
    """GradDrop's estimate with block ℓ's gradient dropped: for a head of a later block, or the residual stream
    entering a later block, it is AtP*'s own (nothing of theirs runs through block ℓ; 1e-6 of the scale); for a
    head of block ℓ itself it is 0 (its output reaches M only through the block). The picture's value is the
    QK-fixed sign times Σ_ℓ |c_ℓ| / (L − 1), the head summed over its positions first."""
    import torch

    from attnviz.api.patching.methods import _star

    loaded, where, clean, corrupt, clean_run, metric, star = _starred(kind, folders)
    L = where.layers
    scale = max(1.0, float(star.heads.abs().max()), float(star.residual.abs().max()))
    for drop, (heads, residual) in enumerate(star.dropped):
        assert float(heads[drop].abs().max()) == 0.0
        for mine, theirs in ((heads, star.heads), (residual, star.residual)):
            later = (mine[drop + 1:] - theirs[drop + 1:]).abs()
            assert (float(later.max()) if later.numel() else 0.0) <= 1e-6 * scale
    assert any(float((h[:d] - star.heads[:d]).abs().max()) > 1e-4 for d, (h, _) in enumerate(star.dropped) if d)
    combined = _star(star, L)["heads"]
    wanted = torch.sign(star.heads.sum(1)) * sum(h.sum(1).abs() for h, _ in star.dropped) / (L - 1)
    np.testing.assert_allclose(combined, wanted.numpy(), atol=1e-12)


def test_atp_star_s_memory_check_counts_what_it_holds_and_grows_with_the_square(folders):
    """AtP*'s check counts its parts (GradDrop's kept ∂M/∂α, two runs' graphs, the patterns, the QK fix's working
    block), not α's copies alone (the check said ~116 MB where two 161-token prompts on SmolLM2 grew past 4.5
    GB: every layer's re-run α for every aligned position, the cube of the length): a budget a byte under the
    estimate refuses before anything runs, naming the parts; the estimate runs. The estimate grows with T², not
    T³ (the patched α is made a block of positions at a time, never kept)."""
    from attnviz.engine.memory import attention_bytes
    from attnviz.engine.memory import starred_bytes

    loaded, where, clean, corrupt = prepared(folders("llama"))
    T = len(clean.tokens)
    need = sum(starred_bytes(where, T, T).values())
    assert need > 4 * attention_bytes(loaded, T, 4.0)
    answers = answers_of(loaded)
    loaded.memory_budget = need - 1
    with pytest.raises(InputError, match=rf"AtP\* on {T} tokens \({T} aligned positions\) would need about "
                                         r".*\(gradients .* graphs .* qk fix"):
        attnviz.patch(CLEAN, CORRUPT, model=loaded, answers=answers, method="atp*")
    loaded.memory_budget = need
    assert attnviz.patch(CLEAN, CORRUPT, model=loaded, answers=answers, method="atp*").method == "atp*"
    big = [sum(starred_bytes(where, n, n).values()) - 4 * min(64 << 20, n * where.heads * n * n * 4)
           for n in (2000, 4000)]
    assert big[1] / big[0] < 4.5  # T² (with T·D terms), where the kept re-run α grew as T³


def test_atp_star_from_the_command_line(folders):
    """--method atp* keeps patch's JSON shape, says its method, and compares with exact patching."""
    folder = folders("llama")
    loaded, *_ = prepared(folder)
    a, b = answers_of(loaded)
    given = json.loads(run("patch", CLEAN, CORRUPT, "-m", folder, "--answers", f"'{a}','{b}'", "--method", "atp*",
                           "--compare", "--positions", "--json").stdout)
    assert given["method"] == "atp*" and given["compare"]["method"] == "atp*"
    assert np.array(given["head_positions"]).shape == (2, 4, len(given["tokens"]))
    np.testing.assert_allclose(given["compare"]["estimate"], given["heads"], atol=1e-12)
