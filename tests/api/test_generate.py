"""attnviz generate: attention kept step by step while a causal LM writes, on tiny random GPT-2 and Llama
(RoPE, grouped-query attention) models. Their text is gibberish; the tests check structure and the exact
check: the rows assembled from the KV-cache steps equal one forward pass over the final sequence."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_capture, once, one_line_error, run

from attnviz.data.capture import Capture
from attnviz.engine.generation import Decoding, generate_capture
from attnviz.engine.models import load
from attnviz.errors import AttnvizWarning

PROMPT = "the quick brown fox"  # both tiny models write 24 tokens after it without an end-of-sequence
KINDS = ["gpt2", "llama"]


@pytest.fixture(scope="module")
def lm(tiny_lm_dir):
    return once(lambda kind: load(tiny_lm_dir(kind), device="cpu", lm_head=True))


def one_pass(model, token_ids) -> np.ndarray:
    """α of one eager forward pass over the whole sequence, float64. (L, H, T, T)"""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(token_ids)]), output_attentions=True)
    return np.stack([a[0].double().numpy() for a in out.attentions])


@pytest.mark.parametrize("kind", KINDS)
def test_assembled_rows_equal_one_forward_pass(lm, kind):
    """float32: the cached steps and the full pass round differently; 1e-5 is the stated tolerance."""
    loaded = lm(kind)
    capture = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=24))
    P = capture.prompt_length
    T = capture.n_tokens
    assert capture.generated.tolist() == [False] * P + [True] * (T - P)
    assert T - P == 24, capture.meta["stopped"]
    assert capture.attentions.shape == (2, 4, T, T) and len(capture.tokens) == T == len(capture.token_ids)
    capture.validate(atol=1e-5)  # rows sum to 1, nothing above the diagonal
    full = one_pass(loaded.model, capture.token_ids)
    assert np.abs(full - capture.attentions).max() <= 1e-5
    # the check has power: the row before each generated row differs from it by far more than the tolerance
    assert np.abs(full[:, :, P:, :] - full[:, :, P - 1:-1, :]).max() > 0.05


@pytest.mark.parametrize("kind, tolerance", [("gpt2", 1e-7), ("llama", 1e-6)])
def test_assembly_is_exact_in_float64(tiny_lm_dir, kind, tolerance):
    """In float64 the KV-cache rows (positions, RoPE, shared K/V heads) are the full pass's rows: GPT-2 up to
    storing them as float32 (|Δ| ≤ 6e-8 for values in [0, 1]); Llama's eager attention takes its softmax
    in float32 even in a float64 model, so a row summed over more masked keys differs by a few float32
    ulps (measured 3e-7)."""
    loaded = load(tiny_lm_dir(kind), device="cpu", lm_head=True)
    loaded.model.double()
    capture = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=16))
    full = one_pass(loaded.model, capture.token_ids)
    assert np.abs(full - capture.attentions).max() <= tolerance


def test_greedy_is_the_argmax_of_a_full_pass(lm):
    """Each generated token is the most likely next token of the sequence before it (independent of the
    cache)."""
    loaded = lm("gpt2")
    capture = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=6))
    ids = [int(i) for i in capture.token_ids]
    P = capture.prompt_length
    for t in range(P, len(ids)):
        with torch.inference_mode():
            logits = loaded.model(input_ids=torch.tensor([ids[:t]])).logits[0, -1]
        assert int(logits.argmax()) == ids[t]


def test_sampling_is_seeded_and_top_p_near_zero_is_greedy(lm):
    loaded = lm("llama")
    greedy = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=8))
    a = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=8, sample=True, seed=3, temperature=1.5))
    b = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=8, sample=True, seed=3, temperature=1.5))
    nucleus = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=8, sample=True, top_p=1e-9, seed=5))
    assert a.token_ids.tolist() == b.token_ids.tolist()
    assert nucleus.token_ids.tolist() == greedy.token_ids.tolist()
    seeds = {tuple(generate_capture(loaded, PROMPT, Decoding(max_new_tokens=8, sample=True, seed=s,
                                                             temperature=3.0)).token_ids.tolist())
             for s in range(4)}
    assert len(seeds) > 1  # a flat distribution sampled with different seeds does not repeat itself
    assert a.meta["decoding"].startswith("sampled") and greedy.meta["decoding"] == "greedy"


def test_stops_at_the_end_of_sequence_token(lm, monkeypatch):
    import attnviz.engine.generation as gen

    loaded = lm("gpt2")
    eos = loaded.tokenizer.eos_token_id
    chosen = iter([11, 12, eos, 13])
    monkeypatch.setattr(gen, "choose_token", lambda logits, decoding, generator: next(chosen))
    capture = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=10))
    assert capture.token_ids[capture.prompt_length:].tolist() == [11, 12]  # the EOS itself is not appended
    assert capture.meta["stopped"] == "eos"


def test_stops_at_the_models_maximum_positions_with_a_warning(lm):
    loaded = lm("gpt2")  # n_positions 64
    with pytest.warns(AttnvizWarning, match="at most 64 positions"):
        capture = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=200))
    assert capture.n_tokens == 64 and capture.meta["stopped"] == "max_positions"


def test_save_and_load_keep_the_flags_and_old_captures_load_as_all_prompt(lm, tmp_path, cat_capture):
    capture = generate_capture(lm("gpt2"), PROMPT, Decoding(max_new_tokens=5))
    back = Capture.load(capture.save(tmp_path / "gen.npz"))
    assert back.generated.tolist() == capture.generated.tolist()
    assert back.meta["prompt"] == PROMPT and back.meta["generated_text"] == capture.meta["generated_text"]
    assert back.meta["text"] == PROMPT + capture.meta["generated_text"]
    old = Capture.load(cat_capture.save(tmp_path / "old.npz"))
    assert old.generated is None and old.prompt_length == old.n_tokens
    assert old.named_positions()["generated"] == []


def test_generated_flags_must_follow_the_prompt(tmp_path):
    alpha = np.tril(np.ones((1, 1, 4, 4), np.float32))
    alpha /= alpha.sum(-1, keepdims=True)
    from dataclasses import replace

    bad = replace(make_capture(alpha, causal=True), generated=np.array([False, True, False, True]))
    path = tmp_path / "bad.npz"
    bad.save(path)
    one_line_error(run("heatmap", "--from", path, "-t"), 1)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_each_new_token_has_its_span_of_the_text(lm, kind):
    """Every written token has a span of the written text: the spans start where the prompt ends, follow one
    another without a gap and end with the text, and each holds the token as it is labelled."""
    capture = generate_capture(lm(kind), PROMPT, Decoding(max_new_tokens=10))
    text = capture.meta["text"]
    written = range(capture.prompt_length, capture.n_tokens)
    spans = [(int(capture.offsets[t][0]), int(capture.offsets[t][1])) for t in written]
    assert len(spans) == 10 and spans[0][0] == len(PROMPT) and spans[-1][1] == len(text)
    assert all(b == next_a for (_, b), (next_a, _) in zip(spans, spans[1:]))
    for t, (a, b) in zip(written, spans):
        assert text[a:b].strip() == capture.tokens[t].removeprefix("##"), (t, text[a:b], capture.tokens[t])


# --- the command line ---------------------------------------------------------------------------------


def test_generate_command_json_steps_match_the_saved_rows(tiny_lm_dir, tmp_path):
    path = tmp_path / "gen.npz"
    result = run("generate", PROMPT, "-m", tiny_lm_dir("gpt2"), "-n", "6", "-o", path, "--json", "--top", "2")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    capture = Capture.load(path)
    P = capture.prompt_length
    assert data["generated"] == capture.generated.tolist() and len(data["steps"]) == capture.n_tokens - P == 6
    mean = capture.attentions[-1].astype(np.float64).mean(0)  # the last layer, mean over heads
    for step in data["steps"]:
        t = step["position"]
        order = np.argsort(-mean[t, :t], kind="stable")[:2]
        assert [link["position"] for link in step["top"]] == order.tolist()
        assert step["top"][0]["weight"] == pytest.approx(mean[t, order[0]], abs=1e-6)
        assert step["self"] == pytest.approx(mean[t, t], abs=1e-6)
    assert data["prompt"] + data["generated_text"] == capture.meta["text"]


def test_generate_prints_the_text_and_the_per_step_view(tiny_lm_dir):
    result = run("generate", PROMPT, "-m", tiny_lm_dir("llama"), "-n", "4", "--terminal", "--head", "1",
                 env={"NO_COLOR": "1", "COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(PROMPT)
    assert "layer 1 · head 1" in result.stdout and "attends most to" in result.stdout
    assert "4 new tokens (greedy)" in result.stderr


def test_encoder_models_are_refused_in_one_line():
    line = one_line_error(run("generate", "The cat"), 1)
    assert "needs a causal language model" in line


def test_sampling_options_need_sample(tiny_lm_dir):
    one_line_error(run("generate", "The cat", "-m", tiny_lm_dir("gpt2"), "--temperature", "0.7"), 2)
    one_line_error(run("generate", "The cat", "-m", tiny_lm_dir("gpt2"), "--sample", "--top-p", "1.5"), 2)


def test_a_bare_model_gets_its_head(tiny_model_dir):
    """A checkpoint saved without its LM head (AutoModel) is loaded with one; untied (Llama) it is random,
    and the user is told so; tied to the embeddings (GPT-2) it is the model's own."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(tiny_model_dir("gpt2"), device="cpu", lm_head=True)
    assert not [w for w in caught if issubclass(w.category, AttnvizWarning)]
    import torch

    torch.manual_seed(0)  # the random head is drawn from the global generator: the same head whatever ran before
    with pytest.warns(AttnvizWarning, match="without its language-model head"):
        loaded = load(tiny_model_dir("llama"), device="cpu", lm_head=True)
    written = generate_capture(loaded, PROMPT, Decoding(max_new_tokens=3))
    assert written.generated.sum() == 3 and written.meta["stopped"] == "max_new_tokens"


# --- viewers ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen_file(tiny_lm_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / "gen.npz"
    result = run("generate", PROMPT, "-m", tiny_lm_dir("gpt2"), "-n", "7", "-o", path)
    assert result.exit_code == 0, result.output
    return path


def test_panels_mark_where_the_prompt_ends(gen_file):
    from attnviz.panels import attention_panels, window_panels

    capture = Capture.load(gen_file)
    P = capture.prompt_length
    panel = attention_panels(capture, [0], ["mean"])[0]
    assert (panel.row_split, panel.col_split) == (P, P)
    window = window_panels(capture, [0], ["mean"], capture.named_positions()["generated"], None)[0]
    assert window.row_split is None and window.col_split == P and window.matrix.shape[0] == capture.n_tokens - P
    assert np.array_equal(window.matrix, capture.head_matrix(0, "mean")[P:])
    plain = attention_panels(make_capture(np.full((1, 1, 3, 3), 1 / 3, np.float32)), [0], [0])[0]
    assert plain.row_split is None and plain.col_split is None


def test_the_line_is_drawn_in_images_and_the_terminal(gen_file):
    from attnviz.api.gallery import HeadImageWriter, export_panels
    from attnviz.panels import heatmap_page
    from attnviz.render.png import page_figure

    capture = Capture.load(gen_file)
    page = heatmap_page(capture, [0], ["mean"])
    ax = page_figure(page).axes[0]
    lines = [line.get_xydata() for line in ax.get_lines()]
    assert len(lines) == 2 and {lines[0][0][1], lines[1][0][0]} == {capture.prompt_length - 0.5}
    panel = export_panels(capture, [0], [0])[0]
    writer = HeadImageWriter([panel])
    image = writer.render(panel)
    inside = image[writer.rows, writer.cols]
    at = int(writer.col_starts[capture.prompt_length])
    assert (inside[:, at] == 255).all() and (inside[:, at - 2] == 0).all()  # white, outlined in black
    result = run("heatmap", "--from", gen_file, "-t", "--layer", "0", env={"NO_COLOR": "1", "COLUMNS": "120"})
    assert result.exit_code == 0 and "generated below" in result.stdout and "│" in result.stdout


def test_rows_generated_on_heatmap_heads_entropy_compare(gen_file, tmp_path):
    capture = Capture.load(gen_file)
    P, T = capture.prompt_length, capture.n_tokens
    assert run("heatmap", "--from", gen_file, "--rows", "generated", "-o", tmp_path / "g.png").exit_code == 0
    result = run("entropy", "--from", gen_file, "--rows", "generated", "--json")
    assert result.exit_code == 0, result.output
    got = {(r["layer"], r["head"]): r["entropy"] for r in json.loads(result.stdout)["heads"]}
    alpha = capture.attentions.astype(np.float64)[:, :, P:]  # (L, H, T-P, T): by hand
    expected = -(np.where(alpha > 0, alpha * np.log(np.where(alpha > 0, alpha, 1)), 0)).sum(-1).mean(-1)
    for (layer, head), value in got.items():
        assert value == pytest.approx(expected[layer, head], abs=1e-9)
    heads = json.loads(run("heads", "--from", gen_file, "--rows", "prompt", "--json").stdout)["heads"]
    prompt = capture.attentions.astype(np.float64)[:, :, :P]
    assert heads[0]["max_weight"] == pytest.approx(prompt[0, 0].max(-1).mean(), abs=1e-6)
    compare = run("compare", "--from", gen_file, "--rows", "generated", env={"NO_COLOR": "1", "COLUMNS": "160"})
    assert compare.exit_code == 0 and f"showing queries {P}–{T - 1}" in compare.stdout
    one_line_error(run("heads", "--from", gen_file, "--rows", "mean"), 2)


def test_rows_generated_on_a_capture_without_generation_is_one_line(tmp_path, cat_capture):
    path = cat_capture.save(tmp_path / "cat.npz")
    line = one_line_error(run("heatmap", "--from", path, "--rows", "generated", "-t"), 2)
    assert "no generated tokens" in line


def test_verify_from_a_generated_capture(gen_file, tmp_path, tiny_lm_dir):
    result = run("verify", "--from", gen_file, "-m", tiny_lm_dir("gpt2"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] and data["saved_vs_model"]["max_abs_diff"] <= 1e-5
    assert data["model_vs_scratch"]["max_abs_diff"] <= 1e-5
    # a changed row (still a valid distribution) is caught: exit 3
    capture = Capture.load(gen_file)
    alpha = capture.attentions.copy()
    t = capture.n_tokens - 1
    alpha[0, 0, t, : t + 1] = 1.0 / (t + 1)
    from dataclasses import replace

    changed = replace(capture, attentions=alpha).save(tmp_path / "changed.npz")
    assert run("verify", "--from", changed, "-m", tiny_lm_dir("gpt2")).exit_code == 3
    line = one_line_error(run("verify", "--from", gen_file, "-m", "minilm"), 1)
    assert "give the model that made it" in line


def test_words_keep_the_generated_flags(lm):
    from attnviz.data.words import to_words

    capture = generate_capture(lm("llama"), PROMPT, Decoding(max_new_tokens=8))
    words = to_words(capture)
    P = capture.prompt_length
    assert words.generated is not None and words.generated.sum() >= 1
    first = words.prompt_length
    assert not words.generated[:first].any() and words.generated[first:].all()
    # the prompt's words are exactly the prompt's tokens grouped: pooled rows of the prompt sum to 1
    assert np.allclose(words.attentions.sum(-1), 1, atol=1e-5)
    assert first <= P


@pytest.mark.parametrize("seed", [str(2 ** 64), str(10 ** 40), "-1", "1.5", "x"])
def test_a_seed_out_of_range_is_a_usage_error(tiny_lm_dir, seed):
    line = one_line_error(run("generate", "the cat", "-m", tiny_lm_dir("gpt2"), "--sample", "--seed", seed), 2)
    assert "--seed" in line


def test_the_largest_seed_works(tiny_lm_dir):
    """The largest seed is taken, and the seed makes the sampled text: the same twice, and what the library
    writes with it."""
    import attnviz

    folder = tiny_lm_dir("gpt2")
    seed = 2 ** 64 - 1
    args = ("generate", "the cat", "-m", folder, "--sample", "--seed", str(seed), "-n", "2", "--json")
    first, second = (json.loads(run(*args).stdout) for _ in range(2))
    expected = attnviz.generate("the cat", model=folder, decoding=Decoding(max_new_tokens=2, sample=True, seed=seed))
    assert first == second
    assert first["generated_text"] == expected.text and len(first["steps"]) == expected.new_tokens


def test_a_capture_finds_its_model_from_another_folder(tiny_lm_dir, tmp_path, monkeypatch):
    """A model named by a relative path is recorded by its absolute path (meta "model_source"), so `verify
    --from` with no --model loads it again from any working folder; the shown name stays as typed."""
    import os

    from attnviz.data.parts import load_capture

    model = Path(tiny_lm_dir("gpt2"))
    monkeypatch.chdir(model.parent)
    assert run("generate", PROMPT, "-m", model.name, "-n", "3", "-o", tmp_path / "g.npz").exit_code == 0
    saved = load_capture(tmp_path / "g.npz")
    assert saved.model == model.name and saved.meta["model_source"] == str(model.resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert not os.path.exists(model.name)  # the name as typed means nothing here
    verify = run("verify", "--from", tmp_path / "g.npz", "--json")
    assert verify.exit_code == 0, verify.output
    assert json.loads(verify.stdout)["passed"] and f"Model: {model.resolve()}" in verify.stderr


def test_each_window_has_its_own_default_name_and_a_replacement_is_said(gen_file, tmp_path, monkeypatch):
    """--rows generated and --rows prompt of one capture write two files, named by their rows and columns as
    commands.md spells them; drawing the same window again says it replaced the file."""
    import re

    capture = Capture.load(gen_file)
    P, T, L = capture.prompt_length, capture.n_tokens, capture.n_layers
    monkeypatch.chdir(tmp_path)
    first = run("heatmap", "--from", gen_file, "--rows", "generated")
    second = run("heatmap", "--from", gen_file, "--rows", "prompt")
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert names == sorted([f"attnviz_layer{L - 1}_mean_rows{P}-{T - 1}_cols0-{T - 1}.png",
                            f"attnviz_layer{L - 1}_mean_rows0-{P - 1}_cols0-{T - 1}.png"])
    assert first.stdout.strip() == names[1] and "replacing" not in first.stdout + second.stdout
    again = run("heatmap", "--from", gen_file, "--rows", "prompt", "--cols", f"0-{T - 1}")
    assert again.stdout.strip() == f"{names[0]} (replacing the file of that name)"
    picked = run("heatmap", "--from", gen_file, "--rows", "0,2,4", "--cols", "1", "--layer", "0", "--head", "1")
    assert picked.stdout.strip() == "attnviz_layer0_head1_rows0+2+4_cols1.png"
    documented = re.findall(r"`(attnviz_layer\w+_rows[\w+-]+_cols[\w-]+\.png)`",
                            (Path(__file__).parents[2] / "docs" / "commands.md").read_text(encoding="utf-8"))
    assert documented and all(re.fullmatch(r"attnviz_layer\d+_(mean|max|head\d+)_rows[\d+-]+_cols[\d-]+\.png", n)
                              for n in documented)


def test_generated_text_keeps_its_lines_in_a_file_and_shows_them_in_a_terminal(tiny_lm_dir, monkeypatch, tmp_path):
    """To a file or a pipe, what the model wrote keeps its line breaks and tabs (other controls still shown as
    ␛); in a terminal every control is shown (␊). Without -o a note says the attention is not kept."""
    from dataclasses import replace

    from helpers import rendered

    import attnviz

    real = attnviz.generate

    def writes_lines(*args, **kwargs):
        result = real(*args, **kwargs)
        meta = {**result.capture.meta, "generated_text": " one\n\ttwo\x1b[31m"}
        return replace(result, capture=replace(result.capture, meta=meta))

    monkeypatch.setattr(attnviz, "generate", writes_lines)
    printed = run("generate", PROMPT, "-m", tiny_lm_dir("gpt2"), "-n", "3")
    assert printed.exit_code == 0, printed.output
    assert printed.stdout.startswith(f"{PROMPT} one\n\ttwo␛[31m\n")  # CliRunner's stdout is no terminal
    assert "--output gen.npz keeps it" in printed.stderr and "gen.npz" not in printed.stdout
    result = writes_lines(PROMPT, model=tiny_lm_dir("gpt2"), max_new_tokens=3)
    assert rendered(result, tty=True).startswith(f"{PROMPT} one␊␉two␛[31m")
    saved = run("generate", PROMPT, "-m", tiny_lm_dir("gpt2"), "-n", "3", "-o", tmp_path / "g.npz")
    assert saved.exit_code == 0 and "not kept" not in saved.stderr and (tmp_path / "g.npz").is_file()
