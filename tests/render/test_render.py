from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import make_capture, one_line_error, run
from rich.console import Console

from attnviz.errors import OutputError
from attnviz.panels import Panel, Scale, attention_panels, heatmap_page
from attnviz.render.png import heatmap, heatmap_figure, page_figure, save_figure
from attnviz.render.terminal import SHADES, panel_renderable


def heatmap_renderable(cap, layer, head, **kwargs):
    """A capture's (layer, head) through the Panel builder into the terminal renderer."""
    hide = kwargs.pop("hide_special", False)
    return panel_renderable(attention_panels(cap, [layer], [head], hide_special=hide)[0], **kwargs)

TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]


def random_alpha(L=3, H=2, T=8, seed=0):
    return np.random.default_rng(seed).dirichlet(np.ones(T), size=(L, H, T)).astype(np.float32)


def test_heatmap_takes_and_returns_ax_with_labels_and_data():
    from matplotlib.figure import Figure

    alpha = random_alpha()[0, 0]
    ax = Figure().add_subplot()
    assert heatmap(alpha, TOKENS, TOKENS, ax=ax) is ax
    assert [t.get_text() for t in ax.get_xticklabels()] == TOKENS
    assert [t.get_text() for t in ax.get_yticklabels()] == TOKENS
    np.testing.assert_array_equal(ax.images[0].get_array(), alpha)


def test_capture_figure_shows_chosen_slice_title_and_colorbar():
    alpha = random_alpha()
    cap = make_capture(alpha, TOKENS)
    handle = heatmap_figure(cap, layer=1, head=0)
    ax = handle.axes[0]
    np.testing.assert_array_equal(ax.images[0].get_array(), alpha[1, 0])
    assert [t.get_text() for t in ax.get_xticklabels()] == TOKENS
    assert "layer 1" in handle.title.get_text() and "head 0" in handle.title.get_text()
    assert len(handle.figure.axes) == 2 and handle.colorbar_axes in handle.figure.axes  # matrix + colorbar
    mean = heatmap_figure(cap, layer=-1, head="mean")
    np.testing.assert_allclose(mean.axes[0].images[0].get_array(), alpha[2].mean(0), rtol=1e-6)
    assert "mean of 2 heads" in mean.title.get_text()


def test_hide_special_drops_rows_and_columns():
    alpha = random_alpha()
    cap = make_capture(alpha, TOKENS, special=[True] + [False] * 6 + [True])
    handle = heatmap_figure(cap, 0, 1, hide_special=True)
    ax = handle.axes[0]
    assert "special tokens hidden" in handle.title.get_text()
    assert [t.get_text() for t in ax.get_xticklabels()] == TOKENS[1:-1]
    np.testing.assert_array_equal(ax.images[0].get_array(), alpha[0, 1][1:-1, 1:-1])


def test_causal_capture_masks_upper_triangle():
    tril = np.tril(np.ones((5, 5), np.float32))
    cap = make_capture(np.broadcast_to(tril / tril.sum(-1, keepdims=True), (1, 1, 5, 5)), causal=True)
    shown = heatmap_figure(cap, 0, 0).images[0].get_array()
    assert np.ma.getmaskarray(shown)[0, 1] and not np.ma.getmaskarray(shown)[1, 0]


def test_all_layers_one_panel_each_shared_scale():
    alpha = random_alpha(L=4)
    cap = make_capture(alpha, TOKENS)
    handle = page_figure(heatmap_page(cap, range(4), ["mean"], all_layers=True))
    fig = handle.figure
    panels = handle.axes
    assert [ax.get_title() for ax in panels] == [f"layer {n}" for n in range(4)]
    for n, ax in enumerate(panels):
        np.testing.assert_allclose(ax.images[0].get_array(), alpha[n].mean(0), rtol=1e-6)
    assert {ax.images[0].get_clim() for ax in panels} == {(0.0, float(alpha.mean(1).max()))}
    assert len(fig.axes) == 5  # 4 panels + one colorbar


def test_long_input_thins_or_shrinks_labels_but_keeps_order():
    T = 128
    cap = make_capture(random_alpha(L=1, H=1, T=T), [f"w{i}" for i in range(T)])
    fig = heatmap_figure(cap, 0, 0).figure
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "w0" and len(labels) >= T // 2
    width, height = fig.get_size_inches()
    assert width <= 20 and height <= 20
    assert min(t.get_fontsize() for t in fig.axes[0].get_yticklabels()) >= 5


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_save_figure_formats(tmp_path, suffix, magic):
    fig = heatmap_figure(make_capture(random_alpha(), TOKENS), 0, 0)
    path = save_figure(fig, tmp_path / "deep" / f"h{suffix}")
    assert path.read_bytes().startswith(magic)
    assert sorted(p.name for p in path.parent.iterdir()) == [f"h{suffix}"]


def test_save_figure_unknown_suffix(tmp_path):
    with pytest.raises(OutputError, match=".bmp"):
        save_figure(heatmap_figure(make_capture(random_alpha(), TOKENS), 0, 0), tmp_path / "h.bmp")
    assert list(tmp_path.iterdir()) == []


def test_hangul_renders_with_real_glyphs_not_boxes(tmp_path, recwarn):
    """The seed example: with a CJK font installed (CI installs fonts-noto-cjk) no glyph is missing."""
    from attnviz.render.fonts import families_for

    families = families_for("나는 사과를 먹었다")
    if len(families) < 2 and not os.environ.get("ATTNVIZ_REQUIRE_CJK_FONT"):
        pytest.skip("no CJK font installed: apt-get install fonts-noto-cjk (CI installs it and requires it)")
    assert len(families) >= 2, "no installed font covers Hangul: install fonts-noto-cjk"
    assert not [w for w in recwarn if "glyph" in str(w.message)]
    cap = make_capture(random_alpha(T=5), ["[CLS]", "나는", "사과를", "먹었다", "[SEP]"])
    save_figure(heatmap_figure(cap, 0, 0), tmp_path / "ko.png")
    assert not [w for w in recwarn if "Glyph" in str(w.message) or "glyph" in str(w.message)]


@pytest.mark.parametrize("stale", [False, True], ids=["clean-cache", "stale-cache"])
def test_cjk_labels_draw_with_the_packaged_font_and_no_system_font(tmp_path, monkeypatch, recwarn, stale):
    """With no CJK font on the system (every one hidden from matplotlib), Korean, Japanese and Chinese labels
    are drawn with the font from the package index (the cjk extra), registered by path in memory: no glyph
    missing, matplotlib's cache file left alone. stale: the cache also lists the same family at a file that
    is gone (what an older attnviz wrote from an environment since deleted); it is passed over, not drawn from
    and not a reason to rebuild the cache."""
    import dataclasses
    import warnings

    from matplotlib import font_manager

    from attnviz.render import fonts

    if not fonts.packaged_fonts():
        if os.environ.get("ATTNVIZ_REQUIRE_CJK_FONT"):
            pytest.fail("ATTNVIZ_REQUIRE_CJK_FONT is set but the cjk extra (mplfonts) is not installed")
        pytest.skip("the cjk extra is not installed: pip install --no-deps mplfonts==0.0.11 (setup.sh does)")
    text = "나는 사과를 먹었다 ひらがな カタカナ 漢字 中文"
    system_cjk = {e.fname for e in font_manager.fontManager.ttflist
                  if any(ord(c) in fonts._charmap(e.fname) for c in "나ひ")}
    kept = [e for e in font_manager.fontManager.ttflist if e.fname not in system_cjk]
    if stale:
        gone = dataclasses.replace(kept[0], name="Noto Sans CJK SC", fname=str(tmp_path / "gone.otf"))
        kept.insert(0, gone)
    monkeypatch.setattr(font_manager.fontManager, "ttflist", kept)
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *a, **k: [])  # nothing new on the system
    monkeypatch.setattr(font_manager, "json_dump", lambda *a, **k: pytest.fail("the font cache was rewritten"))
    monkeypatch.setattr(fonts, "_refreshed", False)
    monkeypatch.setattr(fonts, "_packaged_added", False)
    fonts._installed.cache_clear()
    fonts._warned.clear()
    try:
        assert fonts.families_for("나") == [fonts.BASE_FAMILY, "Noto Sans CJK SC"]
        families = fonts.families_for(text)
        cap = make_capture(random_alpha(T=6), ["나는", "사과를", "ひらがな", "カタカナ", "漢字", "中文"])
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            save_figure(heatmap_figure(cap, 0, 0), tmp_path / "cjk.png")
    finally:
        fonts._installed.cache_clear()
    assert families == [fonts.BASE_FAMILY, "Noto Sans CJK SC"]
    assert not [w for w in recwarn if "lyph" in str(w.message)], [str(w.message) for w in recwarn]


def test_the_rebuilt_font_cache_leaves_out_the_packaged_fonts(monkeypatch):
    """When a system font installed since matplotlib's cache was written is found, the cache is written again
    with it, but without the packaged fonts: those are this environment's files, registered for this process
    (a cache naming them outlives a deleted environment). They stay registered in memory."""
    from matplotlib import font_manager

    from attnviz.render import fonts

    packaged = fonts.packaged_fonts()
    system = [e.fname for e in font_manager.fontManager.ttflist if e.fname not in packaged]
    if not packaged:
        if os.environ.get("ATTNVIZ_REQUIRE_CJK_FONT"):
            pytest.fail("ATTNVIZ_REQUIRE_CJK_FONT is set but the cjk extra (mplfonts) is not installed")
        pytest.skip("the cjk extra is not installed: pip install --no-deps mplfonts==0.0.11 (setup.sh does)")
    new = system[-1]  # a system font the cache has not seen yet
    monkeypatch.setattr(font_manager.fontManager, "ttflist",
                        [e for e in font_manager.fontManager.ttflist if e.fname not in (*packaged, new)])
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *a, **k: [new])
    dumped: list[list[str]] = []
    monkeypatch.setattr(font_manager, "json_dump", lambda data, path: dumped.append([e.fname for e in data.ttflist]))
    monkeypatch.setattr(fonts, "_refreshed", False)
    monkeypatch.setattr(fonts, "_packaged_added", False)
    fonts._installed.cache_clear()
    try:
        assert fonts.add_packaged_fonts()
        assert fonts.refresh_if_new_fonts()
        in_memory = [e.fname for e in font_manager.fontManager.ttflist]
    finally:
        fonts._installed.cache_clear()
    assert len(dumped) == 1 and new in dumped[0]
    assert not set(packaged) & set(dumped[0]), "the packaged fonts were written into matplotlib's cache"
    assert set(packaged) <= set(in_memory) and new in in_memory


def test_missing_glyphs_warn_once_naming_a_package():
    from attnviz.errors import AttnvizWarning
    from attnviz.render import fonts
    from attnviz.render.fonts import families_for

    fonts._warned.clear()  # another test may have drawn the same character
    with pytest.warns(AttnvizWarning, match="fonts-noto") as record:
        families_for("\U00013000 hieroglyph")  # Egyptian hieroglyphs: neither DejaVu nor Noto CJK has them
        families_for("\U00013000 again")
    assert len([w for w in record if "\U00013000" in str(w.message)]) == 1


def render_text(renderable, width=80):
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def test_terminal_heatmap_shows_tokens_and_shades():
    alpha = np.zeros((1, 1, 8, 8), np.float32)
    alpha[0, 0, np.arange(8), np.arange(8)] = 1.0  # identity: full shade on the diagonal only
    text = render_text(heatmap_renderable(make_capture(alpha, TOKENS), 0, 0, color=False))
    for token in ("the", "cat", "mat", "[SEP]"):
        assert token in text
    rows = [line for line in text.splitlines() if line[:2].strip().isdigit()]
    assert len(rows) == 8
    assert rows[2].count(SHADES[-1]) == 3 and rows[2].index(SHADES[-1]) > rows[1].index(SHADES[-1])


def test_terminal_narrow_width_shows_a_window_and_says_so():
    T = 60
    cap = make_capture(random_alpha(L=1, H=1, T=T), [f"tok{i}" for i in range(T)])
    text = render_text(heatmap_renderable(cap, 0, 0, color=False, width=40), width=40)
    assert "showing keys 0–" in text
    assert max(len(line) for line in text.splitlines()[:-3]) <= 40
    text = render_text(heatmap_renderable(cap, 0, 0, color=False, width=10), width=10)  # absurdly narrow
    assert "tok0" in text or "to…" in text or "t…" in text


@pytest.mark.parametrize("cmap", ["viridis", "magma"])
def test_terminal_color_cells_use_colormap(cmap):
    """Each cell's 24-bit background is the colormap's colour of its value on the panel's scale, row by row,
    as matplotlib gives it (bytes)."""
    import re

    import matplotlib

    matrix = np.array([[0.0, 0.5, 1.0], [1.0, 0.25, 0.0], [0.75, 0.75, 0.125]], np.float32)
    console = Console(file=io.StringIO(), width=80, color_system="truecolor", force_terminal=True)
    panel = Panel(matrix, ("a", "b", "c"), ("a", "b", "c"), None, Scale(0, 1), ("t",), "t")
    console.print(panel_renderable(panel, color=True, cmap=cmap, legend=False))
    drawn = [tuple(map(int, m)) for m in re.findall(r"\x1b\[[0-9;]*48;2;(\d+);(\d+);(\d+)", console.file.getvalue())]
    expected = [tuple(int(v) for v in c[:3]) for c in matplotlib.colormaps[cmap](matrix.ravel(), bytes=True)]
    assert drawn == expected


def test_renderers_and_capture_do_not_import_torch():
    code = ("import sys, attnviz.data.capture, attnviz.render.png, attnviz.render.terminal, attnviz.cli;"
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_label_layout_thins_only_past_184_tokens():
    from attnviz.render.png import LabelLayout

    assert LabelLayout.for_tokens(128).step == 1 and LabelLayout.for_tokens(184).step == 1
    assert LabelLayout.for_tokens(256).step == 2 and LabelLayout.for_tokens(256).fontsize == 5.0
    assert LabelLayout.for_tokens(8).fontsize == 11.0


HANGUL = ["[CLS]", "나는", "사과를", "먹었다", "고양이", "[SEP]"]


def matrix_rows(text):
    return [line for line in text.splitlines() if line[:2].strip().isdigit()]


@pytest.mark.parametrize("tokens", [HANGUL, ["[CLS]", "我", "喜欢", "猫", "😀", "[SEP]"]])
def test_terminal_rows_align_by_display_cells(tokens):
    """Every matrix row, and every line of the vertical key labels, has the same width in terminal cells,
    whatever the script (a Hangul syllable or a Chinese character takes two cells)."""
    from rich.cells import cell_len

    T = len(tokens)
    cap = make_capture(random_alpha(L=1, H=1, T=T), tokens)
    text = render_text(heatmap_renderable(cap, 0, 0, color=False))
    lines = text.splitlines()
    rows = matrix_rows(text)
    assert len(rows) == T and len({cell_len(line) for line in rows}) == 1
    header = lines[1:lines.index(rows[0])]  # the vertical key labels, one glyph per key per line
    assert header and {cell_len(line) for line in header} == {cell_len(rows[0])}
    # the first glyph of key 1 sits over key 1's cells: the same offset as the label column plus one cell
    label_width = cell_len(rows[0]) - 3 * T
    assert header[0][:1] == " " and cell_len(header[0][: header[0].index(tokens[1][0])]) == label_width + 3


def test_compare_with_hangul_keeps_panels_aligned():
    from rich.cells import cell_len

    from attnviz.render.terminal import panels_side_by_side

    cap = make_capture(random_alpha(L=2, H=1, T=len(HANGUL)), HANGUL)
    text = render_text(panels_side_by_side(attention_panels(cap, [0, 1], [0]), width=80, color=False))
    rows = [line for line in text.splitlines() if line[:1].isdigit()]
    assert len(rows) == len(HANGUL) and len({cell_len(r) for r in rows}) == 1
    assert all(cell_len(line) <= 80 for line in text.splitlines())


def test_text_on_cells_follows_luminance_for_any_colormap():
    from attnviz.render.colors import rgb, text_on

    assert text_on(rgb("viridis", 1.0)) and not text_on(rgb("viridis", 0.0))  # yellow: dark text; purple: white
    assert text_on(rgb("Greys", 0.0)) and not text_on(rgb("Greys", 1.0))  # white: dark text; black: white
    assert text_on(rgb("magma", 1.0)) and not text_on(rgb("magma", 0.0))


def test_values_written_in_cells_pick_black_or_white_from_the_cell():
    from matplotlib.colors import to_rgb

    alpha = np.zeros((1, 1, 4, 4), np.float32)
    alpha[0, 0, :, 0] = 1.0
    panel = attention_panels(make_capture(alpha), [0], [0])[0]
    from dataclasses import replace

    for cmap in ("viridis", "Greys"):
        handle = page_figure(heatmap_page(make_capture(alpha), [0], [0]), cmap=cmap)
        del handle
        from attnviz.render.png import panel_figure

        ax = panel_figure(replace(panel, values=True), cmap=cmap).axes[0]
        texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t for t in ax.texts}
        assert texts[0, 0].get_text() == "1.00" and texts[0, 1].get_text() == "0.00"  # one format per picture
        hot, cold = to_rgb(texts[0, 0].get_color()), to_rgb(texts[0, 1].get_color())
        if cmap == "viridis":  # yellow 1.0 -> dark text, purple 0.0 -> white
            assert sum(hot) < 1.0 and sum(cold) == 3.0
        else:  # Greys: black 1.0 -> white text, white 0.0 -> dark
            assert sum(hot) == 3.0 and sum(cold) < 1.0


def test_one_number_format_per_picture():
    from attnviz.render.png import value_format

    write = value_format(np.array([0.0, 1.41, 2.3]))
    assert [write(v) for v in (0.0, 1.41, 2.3)] == ["0.00", "1.41", "2.30"]
    write = value_format(np.array([0.0, 0.25]))
    assert [write(v) for v in (0.0, 0.25)] == [".00", ".25"]
    assert value_format(np.array([3.0, 42.0]))(3.0) == "3.0"


def test_a_truncated_text_says_so_in_its_figures(tiny_model_dir, load_tiny):
    from attnviz.engine.forward import capture_text
    from attnviz.panels import text_subtitle

    with pytest.warns(Warning):
        capture = capture_text(" ".join(["the cat sat"] * 200), load_tiny("bert"))
    assert capture.meta["dropped_tokens"] > 0
    assert text_subtitle(capture).startswith(f"cut to the model's {capture.n_tokens} tokens, the last "
                                             f"{capture.meta['dropped_tokens']} dropped")


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


def test_only_one_warning_for_missing_glyphs(tmp_path):
    from attnviz.render import fonts

    fonts._warned.clear()
    cap = make_capture(np.full((1, 1, 3, 3), 1 / 3, np.float32), ["a", "\U00013000", "b"]).save(tmp_path / "c.npz")
    result = run("heatmap", "--from", cap, "-o", tmp_path / "h.png")
    assert result.exit_code == 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Warning:") and "fonts-noto" in lines[0]


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


def test_a_panel_of_few_tokens_and_many_dimensions_labels_every_token():
    """steps' Q panel of a 6-token text on a head of 64 dimensions: every token is labelled in a readable size;
    the 64 dimension columns are labelled every few (one layout for the rows, one for the columns)."""
    from attnviz.panels.page import Page
    from attnviz.render.png import mixed_figure

    rng = np.random.default_rng(0)
    tokens = ("<s>", "The", "Ġcat", "Ġsat", "Ġon", "Ġmat")
    dims = tuple(str(d) for d in range(64))
    wide = Panel(rng.normal(size=(6, 64)).astype(np.float32), tokens, dims, None, Scale(-2, 2), ("Q",), "q", "Q")
    square = Panel(rng.dirichlet(np.ones(6), size=6).astype(np.float32), tokens, tokens, None, Scale(0, 1),
                   ("α",), "a", "α")
    figure = mixed_figure(Page((wide, square, wide), "steps"))
    q, alpha = figure.axes[0], figure.axes[1]
    assert [t.get_text() for t in q.get_yticklabels()] == list(tokens)
    assert min(t.get_fontsize() for t in q.get_yticklabels()) >= 7
    shown = [t.get_text() for t in q.get_xticklabels()]
    assert shown[0] == "0" and 4 <= len(shown) < 64  # every few dimensions
    assert [t.get_text() for t in alpha.get_xticklabels()] == list(tokens)


# --- what a figure's header holds: never cut off, never on the panels ------------------------------------------

LONG_NOTE = ("the padding to 30 s (not drawn) takes 41% of a row on average · a row is the step that wrote its "
             "token (the row of <|notimestamps|> writes the first word) · 1500 frames of 20 ms; each panel to its "
             "own largest weight · 고양이가 매트 위에 앉았다 and more words so that the line must wrap twice")


def texts_inside(figure) -> list:
    """Draw the figure; assert every text of it (title, input text, small print, labels) lies inside it.
    Returns the header's texts' extents (pixels)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = getattr(figure, "figure", figure)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    header = [t for t in [fig._suptitle, *fig.texts] if t is not None and t.get_text()]
    for text in header:
        box = text.get_window_extent(renderer)
        assert box.x0 >= -1 and box.x1 <= width + 1 and box.y0 >= -1 and box.y1 <= height + 1, text.get_text()[:60]
    return [t.get_window_extent(renderer) for t in header]


def sample_panel(R: int = 5, C: int = 7, **extra):
    from attnviz.panels import Panel, Scale

    rng = np.random.default_rng(R * C)
    return Panel(matrix=rng.random((R, C)).astype(np.float32), rows=tuple(f"r{i}" for i in range(R)),
                 cols=tuple(f"c{j}" for j in range(C)), hidden=None, scale=Scale(0.0, 1.0), title=("a panel",),
                 name="p", **extra)


@pytest.mark.parametrize("layout", ["page", "sound", "mixed"])
def test_the_small_print_wraps_and_is_never_cut_off(layout, recwarn):
    """A note longer than the figure is wide wraps, at the size it is drawn (8 pt), inside the figure: the
    Whisper figure's note ended in '(not dra' when it was shrunk for a size it was not drawn at. Hangul in a
    note is drawn in a font that has it."""
    from attnviz.render.fonts import families_for

    from attnviz.panels import Page
    from attnviz.render.png import mixed_figure, page_figure
    from attnviz.render.sound import sound_figure

    panel = sample_panel(4, 40)
    page = Page(panels=(panel,), title="a title", notes=(LONG_NOTE,), subtitle="“고양이가 매트 위에 앉았다”",
                spectrogram=np.random.default_rng(0).random((20, 80)).astype(np.float32), frame_seconds=0.02)
    draw = {"page": page_figure, "sound": sound_figure, "mixed": mixed_figure}[layout]
    figure = draw(page)
    texts_inside(figure)
    notes = [t for t in figure.figure.texts if "padding" in t.get_text()]
    assert len(notes) == 1 and notes[0].get_fontsize() == 8.0 and notes[0].get_text().count("\n") >= 1
    words = notes[0].get_text().replace("\n", " ").split()
    assert words[:len(LONG_NOTE.split())] == LONG_NOTE.split()  # every word, in order
    if len(families_for("고양이")) >= 2:  # a CJK font is installed (CI requires one)
        assert not [w for w in recwarn if "Glyph" in str(w.message)]


def test_a_mixed_figure_keeps_its_header_above_the_panels_and_leaves_no_slot_empty():
    """Title, input text and notes sit above every panel (not pressed on them); three panels asked for two to a
    row take one row of three; an extra plot fills the slot after the panels."""
    from attnviz.panels import Page
    from attnviz.render.png import bars, mixed_figure

    page = Page(panels=tuple(sample_panel(6, 6 + k) for k in range(3)), title="a title " * 12,
                notes=(LONG_NOTE, "and a second note"), subtitle="“the cat sat on the mat”")
    figure = mixed_figure(page, ncols=2)
    header = texts_inside(figure)
    lowest = min(box.y0 for box in header)
    renderer = figure.figure.canvas.get_renderer()
    shown = [ax for ax in figure.figure.get_axes() if ax.get_visible()]
    assert all(ax.get_tightbbox(renderer).y1 <= lowest + 1 for ax in shown)
    assert len(figure.axes) == 3 and len({round(ax.get_position().y0, 3) for ax in figure.axes}) == 1  # one row
    drawn = []
    with_extra = mixed_figure(Page(panels=page.panels, title="t"), ncols=2,
                              extra=lambda ax: drawn.append(bars(ax, ["a", "b"], [1.0, -2.0])))
    visible = [ax for ax in with_extra.figure.get_axes() if ax.get_visible() and ax.get_label() != "<colorbar>"]
    assert drawn and len(visible) == 4 and not [ax for ax in with_extra.figure.get_axes() if not ax.get_visible()]


def test_hangul_column_labels_stand_upright():
    """A column label with Hangul (or kana, or Han) is written one character under another, upright; Latin labels
    turn on their side as before."""
    from attnviz.panels import Page
    from attnviz.render.png import page_figure

    panel = sample_panel(3, 3)
    labels = ("[CLS]", "고양이", "##가")
    from dataclasses import replace

    figure = page_figure(Page(panels=(replace(panel, cols=labels),), title="t"))
    ticks = figure.axes[0].get_xticklabels()
    assert [t.get_text() for t in ticks] == ["[CLS]", "고\n양\n이", "#\n#\n가"]
    assert [t.get_rotation() for t in ticks] == [90.0, 0.0, 0.0]
    texts_inside(figure)


def test_a_dollar_sign_in_a_text_or_token_is_drawn_as_it_is(tmp_path):
    """Tokens "$\\frac$" and "$x^2$": matplotlib's mathtext would fail to parse the first (a traceback) and set
    the second in italics; every figure draws them as plain text, in a PNG, an SVG and the per-head images of an
    export, and leaves the caller's rcParams as they were."""
    import matplotlib
    from matplotlib.text import Text

    from attnviz.render.heads import HeadImageWriter

    cap = make_capture(random_alpha(T=4), ["costs", "$\\frac$", "and", "$x^2$"])
    for suffix in (".png", ".svg"):
        fig = heatmap_figure(cap, layer=0, head=0)
        save_figure(fig, tmp_path / f"dollar{suffix}")
        drawn = [t for t in fig.figure.findobj(Text) if "$" in t.get_text()]
        assert len(drawn) >= 4 and not any(t.get_parse_math() for t in drawn)
    writer = HeadImageWriter(attention_panels(cap, [0], [0, 1]))
    writer.write(attention_panels(cap, [0], [0])[0], tmp_path / "head.png")
    assert (tmp_path / "head.png").stat().st_size > 0
    assert matplotlib.rcParams["text.parse_math"] is True


LOG_LABEL = r"−?(\d+(\.\d+)?×)?\d+[⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]*"


def log_tick_labels(fig) -> list[str]:
    """The labels of every log axis of a figure (colour bars included), read back after a draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    labels = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                labels += [t.get_text() for t in axis.get_ticklabels(which="both") if t.get_text()]
    return labels


def test_log_axes_read_as_numbers_with_superscripts_and_tokens_stay_literal(tiny_lm_dir):
    """Every figure that draws a log axis or a log colour bar — a long heatmap (over 64 tokens the scale is
    logarithmic), discover's curve, cost and massive — labels its ticks "10⁻⁴", never the mathtext source
    "$\\mathdefault{10^{-4}}$" that drawing text as it is would print; a "$" in a token is still drawn as it is."""
    import re

    import attnviz
    from attnviz.engine.costs import CostRow
    from attnviz.render.charts import cost_figure

    tokens = [f"${i}$" if i % 7 == 0 else f"t{i}" for i in range(80)]
    page = heatmap_figure(make_capture(random_alpha(T=80), tokens), layer=0, head=0).figure
    rows = [CostRow(T, 0.01 * T, 1000 * T * T, 0.02 * T, 4000 * T, 4 * T * T) for T in (64, 256, 1024, 4096)]
    lm = tiny_lm_dir("gpt2")
    figures = {"heatmap": page, "cost": cost_figure(rows, "cost"),
               "massive": attnviz.massive("the cat sat on the mat and the dog", model=lm, minimum=0.01,
                                          ratio=1.5).figure(),
               "discover": attnviz.discover("the cat sat on the", "the dog sat on the", answers=(" mat", " cat"),
                                            model=lm, method="eap").figure()}
    for name, fig in figures.items():
        labels = log_tick_labels(fig)
        assert labels, name  # the walk found the log axes
        bad = [t for t in labels if not re.fullmatch(LOG_LABEL, t)]
        assert not bad, (name, bad[:4])
    drawn = [t.get_text() for t in page.axes[0].get_xticklabels() + page.axes[0].get_yticklabels()]
    assert "$0$" in drawn or "$7$" in drawn


def test_the_log_label_check_can_fail():
    """The regular expression above refuses what the broken figures printed."""
    import re

    from attnviz.render.figure import plain_math

    assert not re.fullmatch(LOG_LABEL, "$\\mathdefault{10^{-4}}$")
    assert [plain_math(s) for s in ("$\\mathdefault{10^{-4}}$", "$\\mathdefault{2\\times10^{3}}$",
                                    "$\\mathdefault{2^{5}}$", "$\\mathdefault{-10^{2}}$", "$x$ costs $3")] == \
        ["10⁻⁴", "2×10³", "2⁵", "−10²", "$x$ costs $3"]
