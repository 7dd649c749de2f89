"""For the learner: steps, positions, token, --values, colour scales, unknown words, text input, one CLI
vocabulary, errors that point the right way. Every new quantity is checked against an independent
computation."""

import json
import math

import numpy as np
import pytest

from helpers import one_line_error, run, SENTENCE, make_capture



# --- steps --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_steps_intermediates_follow_the_formula_and_match_the_model(kind, tiny_model_dir):
    result = run("steps", SENTENCE, "-m", tiny_model_dir(kind), "--layer", "1", "--head", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    q, k, v = (np.array(data[x]) for x in ("q", "k", "v"))
    scores, scaled, alpha = np.array(data["scores"]), np.array(data["scaled"]), np.array(data["alpha"])
    allowed = np.array(data["allowed"], bool)
    T, d_k = q.shape
    assert data["d_k"] == d_k and len(data["tokens"]) == T
    np.testing.assert_allclose(scores, q @ k.T, atol=1e-9)
    np.testing.assert_allclose(scaled, scores / math.sqrt(d_k), atol=1e-9)
    logits = np.where(allowed, scaled, -np.inf)  # an independent softmax, in numpy
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(alpha, expected, atol=1e-12)
    np.testing.assert_allclose(np.array(data["out"]), alpha @ v, atol=1e-9)
    np.testing.assert_allclose(alpha, np.array(data["model_alpha"]), atol=1e-5)
    assert data["max_abs_diff"] < 1e-5
    if kind != "bert":  # causal: the mask hides every later key
        assert (allowed == np.tril(np.ones((T, T), bool))).all() and np.abs(np.triu(alpha, 1)).max() == 0


@pytest.mark.slow
def test_steps_terminal_figure_and_one_token(tiny_model_dir, tmp_path):
    result = run("steps", SENTENCE, "-m", tiny_model_dir("bert"), "-o", tmp_path / "s.png", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    for text in ("Q·Kᵀ", "√d_k", "softmax", "α·V", "max |Δ|"):
        assert text in result.stdout
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    result = run("steps", SENTENCE, "-m", tiny_model_dir("bert"), "--token", "cat")
    assert result.exit_code == 0 and "the query 'cat'" in result.stdout and "out(cat) =" in result.stdout
    assert "one index" in one_line_error(run("steps", SENTENCE, "-m", tiny_model_dir("bert"), "--layer", "0-1"), 2)


@pytest.mark.slow
def test_steps_on_minilm_layer0_head2_matches_the_model():
    data = json.loads(run("steps", SENTENCE, "--layer", "0", "--head", "2", "--json").stdout)
    assert data["max_abs_diff"] < 1e-5 and data["d_k"] == 32
    alpha = np.array(data["alpha"])
    assert alpha[2, 1] > 0.99  # "cat" looks at "the": the previous-token head


# --- positions ----------------------------------------------------------------------------------------


def test_positions_without_embeddings_alpha_is_permuted_exactly(tiny_model_dir):
    result = run("positions", "the quick brown fox jumps over the lazy dog", "-m", tiny_model_dir("bert"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert sorted(data["shuffled"]) == sorted(data["words"]) and data["shuffled"] != data["words"]
    permutation = np.array(data["permutation"])
    assert sorted(permutation.tolist()) == list(range(len(data["tokens"])))
    assert data["without_positions"]["max_abs_diff"] < 1e-5
    assert data["with_positions"]["max_abs_diff"] > 1e-2
    assert len(data["with_positions"]["per_layer"]) == 2


def test_positions_independent_check_on_the_shuffled_tokens(load_tiny):
    """The permutation maps the shuffled text's tokens onto the original's, token for token."""
    from attnviz.engine.forward import encode
    from attnviz.engine.fromscratch.positions import positions_experiment

    loaded = load_tiny("bert")
    result = positions_experiment(loaded, "the cat sat on the mat", seed=3)
    shuffled = encode(loaded, " ".join(result.shuffled))
    assert [result.tokens[o] for o in result.permutation] == shuffled.tokens


@pytest.mark.parametrize("kind,message", [("gpt2", "causal"), ("llama", "causal")])
def test_positions_refuses_causal_and_rotary_models(kind, message, tiny_model_dir):
    assert message in one_line_error(run("positions", SENTENCE, "-m", tiny_model_dir(kind)))


# --- token --------------------------------------------------------------------------------------------


def test_a_stripe_head_is_not_taken_for_a_link(tmp_path):
    """In a head where every token looks at "cat" (a vertical stripe), "it" → "cat" says nothing about "it":
    a head where only "it" looks at "cat", with a smaller weight, ranks first, and the stripe is named."""
    tokens = ["[CLS]", "the", "cat", "sat", "because", "it", "was", "tired", "[SEP]"]
    alpha = np.full((1, 2, 9, 9), 1 / 9, np.float32)
    alpha[0, 0, :, :] = 0.1 / 8
    alpha[0, 0, :, 2] = 0.9  # head 0: every query puts 0.9 on "cat"
    alpha[0, 1, 5, :] = 0.4 / 8
    alpha[0, 1, 5, 2] = 0.6  # head 1: only "it" looks at "cat" (0.6)
    path = make_capture(alpha, tokens, special=[True] + [False] * 7 + [True],
                        kinds=["start"] + [""] * 7 + ["end"]).save(tmp_path / "c.npz")
    links = json.loads(run("token", "--from", path, "it", "--json").stdout)["strongest_links"]
    assert (links[0]["head"], links[0]["token"]) == (1, "cat") and not links[0]["stripe"]
    assert all(link["head"] != 0 or link["lift"] < links[0]["lift"] for link in links)
    text = run("token", "--from", path, "it").stdout
    assert "others 0.11" in text


@pytest.mark.slow
def test_token_view_rows_columns_and_links(tmp_path):
    rng = np.random.default_rng(0)
    tokens = ["[CLS]", "the", "cat", "sat", "because", "it", "was", "the", "[SEP]"]
    alpha = rng.dirichlet(np.ones(9), size=(2, 3, 9)).astype(np.float32)
    alpha[1, 2, 5] = 0.0
    alpha[1, 2, 5, 2] = 1.0  # layer 1 head 2: "it" -> "cat"
    path = make_capture(alpha, tokens, special=[True] + [False] * 7 + [True],
                        kinds=["start"] + [""] * 7 + ["end"]).save(tmp_path / "c.npz")
    data = json.loads(run("token", "--from", path, "it", "--json").stdout)
    assert data["token"] == 5
    np.testing.assert_allclose(np.array(data["attends_to"]), alpha[:, :, 5, :], atol=1e-7)
    np.testing.assert_allclose(np.array(data["attended_by"]), alpha[:, :, :, 5], atol=1e-7)
    best = data["strongest_links"][0]
    assert (best["layer"], best["head"], best["token"], best["weight"]) == (1, 2, "cat", pytest.approx(1.0))
    lift = np.full((2, 3, 9), -np.inf)  # brute force: weight minus the other non-special queries' mean weight
    for layer in range(2):
        for head in range(3):
            for key in range(1, 8):
                if key != 5:
                    mean = np.mean([alpha[layer, head, q, key] for q in range(1, 8) if q != 5])
                    lift[layer, head, key] = alpha[layer, head, 5, key] - mean
    assert best["lift"] == pytest.approx(float(lift.max()), abs=1e-6)
    assert best["typical"] == pytest.approx(float(alpha[1, 2, [1, 2, 3, 4, 6, 7], 2].mean()), abs=1e-6)
    assert "occurs 2 times (tokens 1, 7)" in one_line_error(run("token", "--from", path, "the"), 2)
    assert run("token", "--from", path, "the#2", "--json").exit_code == 0
    assert json.loads(run("token", "--from", path, "THE#2", "--json").stdout)["token"] == 7
    assert "no token 'dog'" in one_line_error(run("token", "--from", path, "dog"), 2)
    result = run("token", "--from", path, "5", "-o", tmp_path / "t.png")
    assert result.exit_code == 0 and "layer 1 head 2 → cat 1.00 (others " in result.stdout
    assert (tmp_path / "t.png").exists()


# --- values and scales ---------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["linear", "sqrt", "log"])
def test_scale_unit_matches_matplotlib_norm(norm):
    from attnviz.panels import Scale

    rng = np.random.default_rng(1)
    values = rng.dirichlet(np.ones(20), size=20)
    scale = Scale(0.0, float(values.max()), norm=norm)
    np.testing.assert_allclose(scale.unit(values), np.asarray(scale.mpl_norm()(values)), atol=1e-12)
    assert scale.unit(np.array([0.0, scale.vmax])).tolist() == [0.0, 1.0]


def test_scale_choices_per_head_vmax_and_auto(tmp_path):
    from attnviz.panels import ScaleChoice, attention_panels

    rng = np.random.default_rng(2)
    cap = make_capture(rng.dirichlet(np.ones(6), size=(1, 3, 6)).astype(np.float32))
    per_head = attention_panels(cap, [0], [0, 1, 2], scale=ScaleChoice(kind="per-head"))
    assert [p.scale.vmax for p in per_head] == pytest.approx([float(cap.attentions[0, h].max()) for h in range(3)])
    shared = attention_panels(cap, [0], [0, 1, 2], scale=ScaleChoice(vmax=0.5, norm="log"))
    assert {(p.scale.vmax, p.scale.norm) for p in shared} == {(0.5, "log")}
    assert ScaleChoice().norm_for(8) == "linear" and ScaleChoice().norm_for(200) == "log"
    path = cap.save(tmp_path / "c.npz")
    result = run("heatmap", "--from", path, "-t", "--head", "0", "--values", "--norm", "sqrt", env={"NO_COLOR": "1"})
    assert result.exit_code == 0 and "√ scale" in result.stdout and "hundredths" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("0 "))
    assert f"{int(round(cap.attentions[0, 0, 0, 0] * 100)):02d}" in row
    assert one_line_error(run("heatmap", "--from", path, "--scale", "wide"), 2)
    assert one_line_error(run("heatmap", "--from", path, "--vmax", "-1"), 2)


def test_export_per_head_scale_frames_match_full_figures(tmp_path):
    from attnviz.gallery import HeadImageWriter, export_panels
    from attnviz.panels import ScaleChoice, text_subtitle
    from attnviz.render.png import panel_figure

    rng = np.random.default_rng(3)
    cap = make_capture(rng.dirichlet(np.ones(8) * 0.3, size=(1, 3, 8)).astype(np.float32))
    panels = export_panels(cap, [0], [0, 1, 2], ScaleChoice(kind="per-head"))
    writer = HeadImageWriter(panels, subtitle=text_subtitle(cap))
    for panel in (panels[1], panels[0], panels[2]):  # the colorbar changes with each head's scale
        fast = writer.render(panel)
        figure = panel_figure(panel, subtitle=text_subtitle(cap)).figure
        figure.savefig(tmp_path / "ref.png", dpi=100)
        from PIL import Image

        reference = np.asarray(Image.open(tmp_path / "ref.png").convert("RGB"))
        assert fast.shape == reference.shape
        assert (np.abs(fast.astype(int) - reference).max(-1) > 40).mean() < 0.01


# --- unknown words, text input --------------------------------------------------------------------------


def test_unknown_words_are_labelled_and_warned(load_tiny):
    from attnviz.errors import AttnvizWarning
    from attnviz.engine.forward import encode

    with pytest.warns(AttnvizWarning, match=r"1 of 3 words became \[UNK\] \(🍕\).*multilingual"):
        encoded = encode(load_tiny("bert"), "the 🍕 cat")
    assert "[UNK:🍕]" in encoded.tokens


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


# --- errors that point the right way ------------------------------------------------------------------


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


def test_only_one_warning_for_missing_glyphs(tmp_path):
    from attnviz.render import fonts

    fonts._warned.clear()
    cap = make_capture(np.full((1, 1, 3, 3), 1 / 3, np.float32), ["a", "\U00013000", "b"]).save(tmp_path / "c.npz")
    result = run("heatmap", "--from", cap, "-o", tmp_path / "h.png")
    assert result.exit_code == 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Warning:") and "fonts-noto" in lines[0]


# --- one vocabulary -------------------------------------------------------------------------------------


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


def test_sort_keys_are_the_column_headers(tmp_path):
    cap = make_capture(np.full((1, 2, 3, 3), 1 / 3, np.float32)).save(tmp_path / "c.npz")
    table = run("heads", "--from", cap, env={"COLUMNS": "200"}).stdout
    header = next(line for line in table.splitlines() if "label" in line and "entropy" in line).split()
    for column in header:
        assert run("heads", "--from", cap, "--sort", column, "--json").exit_code == 0, column


# --- pictures: titles and labels -------------------------------------------------------------------


def test_titles_are_never_cut_and_thinned_labels_say_so():
    from attnviz.panels import heatmap_page
    from attnviz.render.png import CHAR_EM, fit_title, page_figure

    long_name = "some-organisation/" + "a-very-long-model-name-" * 4
    cap = make_capture(np.full((1, 1, 3, 3), 1 / 3, np.float32)).with_meta(model=long_name)
    handle = page_figure(heatmap_page(cap, [0], ["mean"]))
    title = handle.title.get_text()
    assert title.replace("\n", " ").replace("- ", "-") .startswith(long_name.split("/")[-1][:20])
    width = handle.figure.get_size_inches()[0]
    longest = max(len(line) for line in title.splitlines())
    assert longest * handle.title.get_fontsize() * CHAR_EM / 72 <= width
    assert fit_title("short", 5.0) == ("short", 11.0)
    T = 256
    big = make_capture(np.full((1, 1, T, T), 1 / T, np.float32))
    notes = [t.get_text() for t in page_figure(heatmap_page(big, [0], [0])).figure.texts]
    assert any("every 2nd token labelled" in n for n in notes) and any("log scale" in n for n in notes)


def test_compare_json_rows_window_and_panels_per_row(tmp_path):
    rng = np.random.default_rng(4)
    T = 12
    cap = make_capture(rng.dirichlet(np.ones(T), size=(4, 2, T)).astype(np.float32)).save(tmp_path / "c.npz")
    data = json.loads(run("compare", "--from", cap, "--layers", "0,3", "--json").stdout)
    assert [p["layer"] for p in data["panels"]] == [0, 3]
    np.testing.assert_allclose(np.array(data["panels"][1]["alpha"]), np.load(cap)["attentions"][3].mean(0),
                               rtol=1e-6)
    text = run("compare", "--from", cap, "--layers", "0-3", "--rows", "2-4", env={"NO_COLOR": "1", "COLUMNS": "80"})
    assert text.exit_code == 0 and "showing queries 2–4" in text.stdout
    rows = [line for line in text.stdout.splitlines() if line.split()[:2] in (["2", "t2"], ["3", "t3"], ["4", "t4"])]
    assert max(len(line) for line in text.stdout.splitlines()) <= 80
    assert len(rows) == 3 * 2  # 3 query rows, in two rows of panels
