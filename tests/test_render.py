import io
import os
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from attnviz.errors import OutputError
from helpers import make_capture
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


def test_terminal_color_cells_use_colormap():
    alpha = np.full((1, 1, 3, 3), 1 / 3, np.float32)
    console = Console(file=io.StringIO(), width=80, color_system="truecolor", force_terminal=True)
    panel = Panel(alpha[0, 0], ("a", "b", "c"), ("a", "b", "c"), None, Scale(0, 1 / 3), ("t",), "t")
    console.print(panel_renderable(panel, color=True))
    assert "\x1b[48;2;" in console.file.getvalue()  # 24-bit background colour


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
