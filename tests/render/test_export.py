"""The export folder: names, counts, sizes, pixels, atomicity, the offline gallery. Never its speed."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from helpers import make_capture

from attnviz.data.capture import Capture
from attnviz.errors import OutputError
from attnviz.api.gallery import MANIFEST, HeadImageWriter, export, export_panels, render_panels
from attnviz.panels import attention_panels, head_filename, text_subtitle
from attnviz.render.encode import encode_png
from attnviz.render.png import heatmap_figure

TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]


def read_png(path):
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def one_hot_capture(L=2, H=3, T=8, hot=None):
    """Uniform heads, except head (0, 1) where every query attends only to key `hot[i]`."""
    alpha = np.full((L, H, T, T), 1.0 / T, np.float32)
    hot = hot if hot is not None else [(i + 3) % T for i in range(T)]
    alpha[0, 1] = 0.0
    alpha[0, 1, np.arange(T), hot] = 1.0
    return make_capture(alpha, TOKENS[:T] if T == 8 else None, special=[True] + [False] * (T - 2) + [True],
                        kinds=["start"] + [""] * (T - 2) + ["end"]), hot


def test_encode_png_round_trips():
    rgb = np.random.default_rng(0).integers(0, 255, (17, 23, 3), dtype=np.uint8)
    from io import BytesIO

    from PIL import Image

    back = np.asarray(Image.open(BytesIO(encode_png(rgb))))
    np.testing.assert_array_equal(back, rgb)


def test_export_folder_contents(tmp_path):
    cap, _ = one_hot_capture()
    target = export(cap, tmp_path / "out", layer=[0, 1], head=[0, 1, 2])
    names = sorted(p.name for p in target.iterdir())
    heads = [head_filename(layer, head, "png") for layer in (0, 1) for head in (0, 1, 2)]
    means = ["layer00_mean.png", "layer01_mean.png"]
    assert names == sorted(heads + means + ["attention.npz", "grid.png", "heads.csv", "heads.json", "index.html",
                                            MANIFEST])
    assert heads[0] == "layer00_head00.png"
    sizes = {read_png(target / name).shape for name in heads + means}
    reference = heatmap_figure(cap, 0, 0)
    w, h = reference.figure.get_size_inches() * 100
    assert sizes == {(round(h), round(w), 3)}  # same size as `attnviz heatmap` draws at 100 dpi
    stats = json.loads((target / "heads.json").read_text())
    assert [(s["layer"], s["head"]) for s in stats] == [(layer, head) for layer in (0, 1) for head in (0, 1, 2)]
    one_hot = stats[1]
    assert one_hot["max_weight"] == pytest.approx(1.0) and one_hot["entropy"] == pytest.approx(0.0, abs=1e-6)
    assert (target / "heads.csv").read_text().splitlines()[0].startswith("layer,head,entropy")
    np.testing.assert_array_equal(Capture.load(target / "attention.npz").attentions, cap.attentions)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_one_hot_head_hottest_cells_land_where_they_should(tmp_path):
    cap, hot = one_hot_capture()
    target = export(cap, tmp_path / "out", layer=[0], head=[1])
    image = read_png(target / "layer00_head01.png").astype(int)
    fig = heatmap_figure(cap, 0, 1).figure
    fig.set_dpi(100)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    box = fig.axes[0].get_window_extent()
    height = image.shape[0]
    T = cap.n_tokens
    cell_w, cell_h = box.width / T, box.height / T
    yellow = np.array([253, 231, 37])  # viridis at 1.0
    purple = np.array([68, 1, 84])  # viridis at 0.0
    for i in range(T):
        y = int(height - box.y1 + (i + 0.5) * cell_h)
        for j in range(T):
            x = int(box.x0 + (j + 0.5) * cell_w)
            expected = yellow if j == hot[i] else purple
            assert np.abs(image[y, x] - expected).max() <= 2, (i, j, image[y, x])


def test_fast_writer_matches_the_full_figure(tmp_path):
    """Swapping α into the drawn layout gives the picture a fresh figure gives (cell edges may move 1 px)."""
    cap, _ = one_hot_capture()
    panels = attention_panels(cap, [0, 1], [0, 1, 2], vmax=1.0)
    writer = HeadImageWriter(panels, subtitle=text_subtitle(cap))
    fast = writer.render(panels[1])
    fig = heatmap_figure(cap, 0, 1, vmax=1.0).figure
    fig.savefig(tmp_path / "ref.png", dpi=100)
    reference = read_png(tmp_path / "ref.png")
    assert fast.shape == reference.shape
    differs = np.abs(fast.astype(int) - reference).max(axis=-1) > 40
    assert differs.mean() < 0.01
    assert "layer 0 · head 1" in panels[1].title_text


def test_causal_upper_triangle_is_blank(tmp_path):
    T = 6
    tril = np.tril(np.ones((T, T), np.float32))
    cap = make_capture(np.broadcast_to(tril / tril.sum(-1, keepdims=True), (1, 1, T, T)), causal=True)
    panels = attention_panels(cap, [0], [0], vmax=1.0)
    writer = HeadImageWriter(panels)
    frame = writer.render(panels[0])
    rows, cols = writer.rows, writer.cols
    top_right = frame[rows.start + 3, cols.stop - 3]
    assert tuple(top_right) == (242, 242, 242)  # the "bad" colour of masked cells


def test_workers_give_identical_files(tmp_path):
    rng = np.random.default_rng(0)
    cap = make_capture(rng.dirichlet(np.ones(8), size=(2, 4, 8)), TOKENS)
    panels = export_panels(cap, [0, 1], [0, 1, 2, 3])
    assert [p.name for p in panels[:5]] == ["layer00_head00", "layer00_head01", "layer00_head02", "layer00_head03",
                                             "layer00_mean"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    render_panels(panels, tmp_path / "a", workers=1)
    render_panels(panels, tmp_path / "b", workers=2)
    for panel in panels:
        name = f"{panel.name}.png"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_refuses_non_empty_folder_unless_forced(tmp_path):
    cap, _ = one_hot_capture()
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(OutputError, match="pass force to replace") as refused:  # the library's argument
        export(cap, target, layer=[0], head=[0])
    from attnviz.cli.output import flag

    assert "pass --force to replace" in refused.value.spelled(flag)  # the command line's flag
    assert (target / "keep.txt").exists()
    with pytest.raises(OutputError, match="not an attnviz export"):  # --force never deletes the user's folder
        export(cap, target, layer=[0], head=[0], force=True)
    assert (target / "keep.txt").exists()
    (target / "keep.txt").unlink()
    export(cap, target, layer=[0], head=[0])  # empty folder: fine
    (target / "extra.txt").write_text("the user's own file, put into an earlier export")
    with pytest.raises(OutputError, match="extra.txt"):  # not in the manifest: never deleted
        export(cap, target, layer=[1], head=[1], force=True)
    assert (target / "extra.txt").exists() and (target / "layer00_head00.png").exists()
    (target / "extra.txt").unlink()
    export(cap, target, layer=[1], head=[1], force=True)  # exactly an earlier export: replaced
    assert (target / "layer01_head01.png").exists() and not (target / "layer00_head00.png").exists()
    (target / "index.html").write_text("edited by the user")
    with pytest.raises(OutputError, match="changed"):  # a file the export wrote, since edited: kept
        export(cap, target, layer=[0], head=[0], force=True)
    assert (target / "index.html").read_text() == "edited by the user"


def test_error_midway_leaves_nothing(tmp_path, monkeypatch):
    from attnviz.base import files as export_module  # where the folder machinery lives

    cap, _ = one_hot_capture()

    def broken(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_module, "write_manifest", broken)
    with pytest.raises(KeyboardInterrupt):
        export(cap, tmp_path / "out", layer=[0, 1], head=[0, 1])
    assert list(tmp_path.iterdir()) == []


def test_svg_and_pdf_formats(tmp_path):
    cap, _ = one_hot_capture()
    for fmt, magic in (("svg", b"<?xml"), ("pdf", b"%PDF")):
        target = export(cap, tmp_path / fmt, layer=[1], head=[2], format=fmt)
        assert (target / f"layer01_head02.{fmt}").read_bytes().startswith(magic)
        assert (target / f"grid.{fmt}").exists()


def test_gallery_is_offline_and_lists_everything(tmp_path):
    cap, _ = one_hot_capture()
    cap = cap.with_meta(text="The <cat> sat & stayed")
    target = export(cap, tmp_path / "out", layer=[0, 1], head=[0, 2])
    html = (target / "index.html").read_text()
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing fetched from elsewhere
    assert not re.search(r"<script[^>]*\bsrc\s*=", html) and "@import" not in html and "<link" not in html
    assert html.count("<script") == 2  # the interactive view: its data and its script, both inline
    assert "The &lt;cat&gt; sat &amp; stayed" in html
    for name in ("grid.png", "layer00_head00.png", "layer01_head02.png", "layer01_mean.png", "heads.csv",
                 "attention.npz"):
        assert f'"{name}"' in html and (target / name).exists()
    assert "layer00_head01.png" not in html  # not exported, not linked


def test_grid_png_is_standard_and_shows_each_head_in_place(tmp_path):
    """The grid's mosaic is pasted into the drawn figure pixel for pixel: Pillow reads the file, and the
    centre of the tile of (layer 0, head 1) has the colour of that head's weight there."""
    from matplotlib import colormaps

    cap, hot = one_hot_capture()
    target = export(cap, tmp_path / "out", layer=[0, 1], head=[0, 1, 2])
    from attnviz.metrics import head_records
    from attnviz.render.grid import grid_figure

    panels = [p for p in export_panels(cap, [0, 1], [0, 1, 2]) if p.head != "mean"]
    labels = {(r["layer"], r["head"]): r["label"] for r in head_records(cap)}
    grid = grid_figure(cap, panels, [0, 1], [0, 1, 2], labels=labels)
    image = read_png(target / "grid.png")
    assert image.shape[:2] == tuple(round(v * 100) for v in grid.figure.get_size_inches()[::-1])
    mosaic = grid.mosaic
    from attnviz.render.encode import figure_rgb

    figure_rgb(grid.figure, 100)  # lay out at the export's dpi to learn where the axes are
    box = grid.axes.get_window_extent()
    top, left = int(round(image.shape[0] - box.y1)), int(round(box.x0))
    T, scale = cap.n_tokens, max(1, -(-64 // cap.n_tokens))
    side = T * scale
    region = image[top:top + mosaic.shape[0], left:left + mosaic.shape[1]]
    np.testing.assert_array_equal(region[grid.tiles], mosaic[grid.tiles])  # every head's pixels, exactly
    assert (region[~grid.tiles] != 255).any()  # and the labels drawn in the gaps
    tile_x = left + (side + 4) * 1  # head 1
    row, col = 0, hot[0]
    colour = image[top + row * scale + scale // 2, tile_x + col * scale + scale // 2]
    expected = np.array(colormaps["viridis"](1.0, bytes=True)[:3])
    assert np.abs(colour.astype(int) - expected).max() <= 1


@pytest.mark.parametrize("norm", ["linear", "sqrt", "log"])
@pytest.mark.slow
def test_every_norm_exports_and_a_long_input_defaults_to_log(tmp_path, norm):
    from attnviz.panels import ScaleChoice

    T = 70  # past 64 tokens --norm auto is log
    rng = np.random.default_rng(5)
    cap = make_capture(rng.dirichlet(np.full(T, 0.3), size=(1, 2, T)).astype(np.float32))
    target = export(cap, tmp_path / norm, layer=[0], head=[0, 1], scale=ScaleChoice(norm=norm))
    assert read_png(target / "grid.png").shape[2] == 3 and read_png(target / "layer00_head01.png").shape[2] == 3
    assert export_panels(cap, [0], [0])[0].scale.norm == "log"  # the default for a long input


def test_the_export_grid_names_each_heads_pattern(cat_capture, tmp_path):
    from attnviz.api.gallery import export_panels
    from attnviz.metrics import head_records
    from attnviz.render.grid import grid_figure

    panels = [p for p in export_panels(cat_capture, [0, 1], [0, 1, 2]) if p.head != "mean"]
    labels = {(r["layer"], r["head"]): r["label"] for r in head_records(cat_capture)}
    grid = grid_figure(cat_capture, panels, [0, 1], [0, 1, 2], labels=labels)
    drawn = [t.get_text() for t in grid.axes.texts]
    assert drawn == [labels[layer, head][:16] for layer in (0, 1) for head in (0, 1, 2)]
    assert grid.tiles is not None and grid.tiles.sum() == 6 * panels[0].matrix.size * (64 // 8) ** 2


def test_export_per_head_scale_frames_match_full_figures(tmp_path):
    from attnviz.api.gallery import HeadImageWriter, export_panels
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
