"""attnviz from Python: load_model, capture (by name, from a model object, every path), Capture.from_outputs
for the essays' own code, and what a Capture shows in a notebook — run for real by a Jupyter kernel, its
HTML opened in headless Chromium."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from helpers import SENTENCE

import attnviz
from attnviz.errors import AttentionCheckError, AttnvizWarning, CaptureFormatError, InputError, UsageError


@pytest.fixture(scope="module")
def bert(tiny_model_dir):
    from transformers import AutoTokenizer

    folder = tiny_model_dir("bert")
    return folder, AutoTokenizer.from_pretrained(folder)


def test_importing_attnviz_pulls_in_neither_torch_nor_transformers():
    code = "import sys, attnviz; print('torch' in sys.modules, 'transformers' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_a_model_object_gives_the_same_alpha_as_its_name(bert):
    """Loaded with SDPA (transformers' default), it runs with eager attention, with a warning, and gets SDPA
    back after; α is exactly what the same model gives by name."""
    from transformers import AutoModel

    folder, tokenizer = bert
    model = AutoModel.from_pretrained(folder)
    assert model.config._attn_implementation != "eager"
    model.train()
    before = model.config._attn_implementation
    with pytest.warns(AttnvizWarning, match="runs it with 'eager'.*switches it back") as caught:
        by_object = attnviz.capture(SENTENCE, model=model, tokenizer=tokenizer)
    assert {w.filename for w in caught} == {__file__}  # the user's line, not the line of attnviz that noticed
    assert model.training  # its mode is put back
    assert model.config._attn_implementation == before  # and its attention implementation
    by_name = attnviz.capture(SENTENCE, model=folder, device="cpu")
    assert by_object.tokens == by_name.tokens
    np.testing.assert_array_equal(by_object.attentions, by_name.attentions)
    loaded = attnviz.load_model(folder, device="cpu")
    np.testing.assert_array_equal(attnviz.capture(SENTENCE, model=loaded).attentions, by_name.attentions)


def test_the_essays_code_through_from_outputs(bert):
    import torch
    from transformers import AutoModel

    folder, tokenizer = bert
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    inputs = tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        outputs = model(**inputs, output_attentions=True)
    capture = attnviz.from_outputs(outputs, inputs, tokenizer)
    by_name = attnviz.capture(SENTENCE, model=folder, device="cpu")
    np.testing.assert_array_equal(capture.attentions, by_name.attentions)
    assert capture.tokens == by_name.tokens and list(capture.special) == list(by_name.special)
    assert capture.meta["text"] == SENTENCE.lower()  # decoded by the (uncased) tokenizer
    np.testing.assert_allclose(capture.attentions.sum(-1), 1.0, atol=1e-5)


def test_from_outputs_checks_what_it_is_given(bert):
    import torch

    folder, tokenizer = bert
    inputs = tokenizer(SENTENCE, return_tensors="pt")
    T = inputs["input_ids"].shape[1]
    good = [torch.full((1, 2, T, T), 1.0 / T) for _ in range(2)]
    assert attnviz.from_outputs({"attentions": good}, inputs, tokenizer).n_layers == 2
    with pytest.raises(CaptureFormatError, match="output_attentions=True"):
        attnviz.from_outputs({"attentions": None}, inputs, tokenizer)
    with pytest.raises(CaptureFormatError, match="output_attentions=True"):
        attnviz.from_outputs({"attentions": (None, None)}, inputs, tokenizer)
    with pytest.raises(CaptureFormatError, match="shape"):
        attnviz.from_outputs({"attentions": [torch.zeros(1, 2, T, T + 1)]}, inputs, tokenizer)
    with pytest.raises(CaptureFormatError, match="shape"):
        attnviz.from_outputs({"attentions": [good[0], torch.full((1, 3, T, T), 1.0 / T)]}, inputs, tokenizer)
    batch = tokenizer([SENTENCE, "A dog"], return_tensors="pt", padding=True)
    with pytest.raises(CaptureFormatError, match="one text"):
        attnviz.from_outputs({"attentions": good}, batch, tokenizer)
    mask = torch.cat([inputs["attention_mask"][:, :-1], torch.zeros(1, 1, dtype=torch.long)], 1)
    padded = {**inputs, "attention_mask": mask}
    with pytest.raises(CaptureFormatError, match="padded"):
        attnviz.from_outputs({"attentions": good}, padded, tokenizer)
    with pytest.raises(Exception, match="sum to 1"):
        attnviz.from_outputs({"attentions": [torch.full((1, 2, T, T), 0.5)]}, inputs, tokenizer)


def test_from_outputs_refuses_what_is_not_a_forward_pass_in_one_error(bert):
    """Hostile or mistaken arguments end in an AttnvizError that says what to pass, never a bare numpy or
    torch error: strings for attentions, tensors on the meta device, token ids outside the vocabulary, no
    tokenizer, inputs that are not a mapping; a list of texts is not called empty."""
    import torch

    folder, tokenizer = bert
    inputs = tokenizer(SENTENCE, return_tensors="pt")
    T = inputs["input_ids"].shape[1]
    good = [torch.full((1, 2, T, T), 1.0 / T) for _ in range(2)]
    cases = [
        (({"attentions": "weights"}, inputs, tokenizer), CaptureFormatError, "output_attentions=True"),
        (({"attentions": [np.full((1, 2, T, T), "x")]}, inputs, tokenizer), CaptureFormatError, "not numbers"),
        (({"attentions": [torch.empty(1, 2, T, T, device="meta")]}, inputs, tokenizer), CaptureFormatError,
         "'meta' device"),
        (({"attentions": good}, {"input_ids": torch.tensor([[1, 10 ** 9, 2]])}, tokenizer), CaptureFormatError,
         "1000000000, outside the tokenizer's vocabulary"),
        (({"attentions": good}, {"input_ids": torch.tensor([[1, -5, 2]])}, tokenizer), CaptureFormatError,
         "-5, outside"),
        (({"attentions": good}, {"input_ids": torch.tensor([[1.5, 2.0]])}, tokenizer), CaptureFormatError,
         "whole numbers"),
        (({"attentions": good}, inputs, None), InputError, "needs the tokenizer"),
        (({"attentions": good}, [1, 2, 3], tokenizer), InputError, "not a list"),
    ]
    for args, error, words in cases:
        with pytest.raises(error, match=words):
            attnviz.from_outputs(*args)
    with pytest.raises(UsageError, match="one string, not a list; for many texts, attnviz.corpus"):
        attnviz.capture([SENTENCE, "A dog ran"], model=folder, device="cpu")


def test_from_outputs_respects_the_capture_limit(bert, monkeypatch):
    import torch

    folder, tokenizer = bert
    inputs = tokenizer(SENTENCE, return_tensors="pt")
    T = inputs["input_ids"].shape[1]
    monkeypatch.setenv("ATTNVIZ_MAX_CAPTURE_BYTES", "1K")
    with pytest.raises(CaptureFormatError, match="ATTNVIZ_MAX_CAPTURE_BYTES"):
        attnviz.from_outputs({"attentions": [torch.full((1, 4, T, T), 1.0 / T)] * 2}, inputs, tokenizer)


def test_capture_chooses_the_path(tiny_model_dir, load_tiny):
    from attnviz.metrics import head_values
    from attnviz.data.words import to_words

    folder = tiny_model_dir("bert")
    full = attnviz.capture(SENTENCE, model=folder, device="cpu")
    words = attnviz.capture(SENTENCE, model=folder, device="cpu", words=True)
    np.testing.assert_allclose(words.attentions, to_words(full).attentions, atol=1e-6)
    streamed = attnviz.capture(SENTENCE, model=folder, device="cpu", stream=True, keep=attnviz.Keep(pool=4))
    assert streamed.pooled and streamed.input_tokens == full.n_tokens
    stored = {(r["layer"], r["head"]): r for r in streamed.meta["head_stats"]}
    for name, values in head_values(full).items():
        if values.dtype != object and name in stored[(0, 0)]:
            got = np.array([[stored[(n, h)][name] for h in range(full.n_heads)] for n in range(full.n_layers)])
            np.testing.assert_allclose(got, values, atol=1e-5, equal_nan=True, err_msg=name)
    for wrong in ({"part": "cross"}, {"target": "the dog"}, {"max_new_tokens": 3}):  # encoder-decoder arguments
        with pytest.raises(UsageError, match="encoder-decoder") as caught:
            attnviz.capture(SENTENCE, model=folder, device="cpu", **wrong)
        assert caught.value.field == ("part" if "part" in wrong else None)
        assert next(iter(wrong)) in str(caught.value) and "--" not in str(caught.value)
    with pytest.raises(InputError, match="empty"):
        attnviz.capture("   ", model=folder, device="cpu")


def test_capture_of_an_encoder_decoder_model(tiny_seq2seq_dir):
    folder = tiny_seq2seq_dir("t5")
    whole = attnviz.capture("the cat sat", model=folder, device="cpu", target="the dog ran")
    assert isinstance(whole, attnviz.Parts) and set(whole.names) == {"encoder", "decoder", "cross"}
    cross = attnviz.capture("the cat sat", model=folder, device="cpu", target="the dog ran", part="cross")
    np.testing.assert_array_equal(cross.attentions, whole.part("cross").attentions)
    assert "iframe" in whole._repr_html_()
    with pytest.raises(UsageError, match="stream is for long inputs of encoder-only"):  # kept whole, not streamed
        attnviz.capture("the cat sat", model=folder, device="cpu", target="the dog ran", stream=True)
    with pytest.raises(UsageError, match="give either target .* or max_new_tokens"):
        attnviz.capture("the cat sat", model=folder, device="cpu", target="the dog ran", max_new_tokens=3)


def test_what_a_capture_shows(tiny_model_dir, tmp_path):
    from matplotlib.figure import Figure

    from attnviz.metrics import head_records

    capture = attnviz.capture(SENTENCE, model=tiny_model_dir("bert"), device="cpu")
    figure = capture.heatmap(layer=0, head=1)
    assert isinstance(figure, Figure)
    np.testing.assert_allclose(np.asarray(figure.axes[0].images[0].get_array()), capture.attentions[0, 1], atol=1e-6)
    table = capture.heads()
    assert table.to_records() == head_records(capture) and len(table) == capture.n_layers * capture.n_heads
    assert table._repr_html_().count("<tr>") == len(table) + 1
    page = capture.view(tmp_path / "v.html")
    assert "attnviz-data" in page.read_text()
    frame = capture._repr_html_()
    assert frame.startswith('<iframe id="attnviz-view-') and 'sandbox="allow-scripts"' in frame
    # the page is inside the attribute, escaped; what runs in the notebook itself is only the fixed lines that
    # fit the frame to the height its page posts
    outside = frame[frame.index("</iframe>"):]
    assert frame.count("<script") == 1 and outside.startswith("</iframe><script>") and "attnvizHeight" in outside
    assert "Content-Security-Policy" in frame


def test_a_heatmap_drawn_on_axes_of_ones_own(tiny_model_dir):
    """cap.heatmap(ax=…) draws on the caller's axes, as seaborn does, and returns them: the image is α of that
    head, the tick labels are the tokens, a colorbar is added beside it; the other axes stay empty."""
    from matplotlib.figure import Figure

    capture = attnviz.capture(SENTENCE, model=tiny_model_dir("bert"), device="cpu")
    figure = Figure()
    left, right = figure.subplots(1, 2)
    assert capture.heatmap(layer=1, head=0, ax=right) is right
    np.testing.assert_allclose(np.asarray(right.images[0].get_array()), capture.attentions[1, 0], atol=1e-6)
    assert [t.get_text() for t in right.get_xticklabels()] == list(capture.tokens)
    assert [t.get_text() for t in right.get_yticklabels()] == list(capture.tokens)
    assert "layer 1" in right.get_title() and not left.images and len(figure.axes) == 3  # + the colorbar


def _notebook(path):
    import nbformat

    cells = [
        "import torch\nimport attnviz\nfrom transformers import AutoModel, AutoTokenizer\n"
        "from attnviz.engine.models import bundled_model_dir\n%matplotlib inline",
        # the essays' BERT example, as they write it, with the bundled model
        "tokenizer = AutoTokenizer.from_pretrained(str(bundled_model_dir()))\n"
        "model = AutoModel.from_pretrained(str(bundled_model_dir()), attn_implementation='eager')\n"
        "inputs = tokenizer('The cat sat on the mat', return_tensors='pt')\n"
        "with torch.no_grad():\n    outputs = model(**inputs, output_attentions=True)\n"
        "print(len(outputs.attentions), tuple(outputs.attentions[0].shape))",
        "cap = attnviz.from_outputs(outputs, inputs, tokenizer)\ncap",
        "other = attnviz.capture('The cat sat on the mat because it was tired')\nother",
        "other.heads()",
        "other.heatmap(layer=0, head=2)",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(notebook, str(path))
    return notebook


@pytest.mark.kernel
@pytest.mark.browser
def test_a_real_notebook_shows_working_viewers(tmp_path):
    """A Jupyter kernel runs the essays' example (nbclient + ipykernel); the two inline viewers it shows,
    opened in headless Chromium, load with no console error and no request, and do not interfere."""
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from helpers import browser_missing, chromium_path

    notebook = _notebook(tmp_path / "essay.ipynb")
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    assert any("6 (1, 12, 8, 8)" in o.get("text", "") for o in outputs)
    frames = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})
              and o["data"]["text/html"].startswith("<iframe")]  # (each with the lines that fit it)
    tables = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})
              and "attnviz-heads" in o["data"]["text/html"]]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(frames) == 2 and len(tables) == 1 and len(images) == 1
    assert tables[0].count("<tr>") == 6 * 12 + 1

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        browser_missing("browser tests need Playwright for Python: pip install playwright (in the test extra)")
    if chromium_path() is None:
        browser_missing("browser tests need Chromium: apt-get install chromium (or set ATTNVIZ_CHROMIUM)")
    page_path = tmp_path / "outputs.html"
    page_path.write_text("<!doctype html><html><body>" + "".join(frames) + "</body></html>", encoding="utf-8")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        problems, requests = [], []
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: None if r.url in (page_path.as_uri(), "about:srcdoc") else requests.append(r.url))
        page.goto(page_path.as_uri())
        views = [f for f in page.frames if f != page.main_frame]
        assert len(views) == 2
        for frame in views:
            frame.wait_for_selector("html[data-attnviz-ready='1']", state="attached", timeout=15_000)
        first, second = views
        assert first.evaluate("document.querySelectorAll('#av-left li').length") == 8
        assert second.evaluate("document.querySelectorAll('#av-left li').length") == 12
        first.click("#av-tab-model")  # one view's state is its own
        assert first.evaluate("document.querySelectorAll('#av-thumbs button').length") == 6 * 12
        assert second.evaluate("getComputedStyle(document.getElementById('av-thumbs')).display") == "none" or \
            second.evaluate("document.getElementById('av-tab-model').getAttribute('aria-selected')") != "true"
        browser.close()
    assert problems == [] and requests == [], (problems, requests)


@pytest.mark.kernel
def test_figures_show_as_images_in_a_notebook_without_magic(tmp_path):
    """A real Jupyter kernel (nbclient + ipykernel), no %matplotlib: every figure the API returns is shown
    as a PNG in its cell's output, not as `<Figure size …>` text; after %matplotlib inline, once."""
    import base64

    nbclient = pytest.importorskip("nbclient")
    import nbformat

    cells = ["import attnviz\ncap = attnviz.capture('The cat sat on the mat', model='minilm')",
             "cap.heatmap(layer=0, head=2)",
             "attnviz.rollout('The cat sat on the mat').figure()",
             "attnviz.steps('The cat sat on the mat', layer=0, head=2).figure()",
             "%matplotlib inline\ncap.heatmap(layer=1, head=0)"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in notebook.cells[1:]:
        shown = [o for o in cell.outputs if o.get("output_type") in ("execute_result", "display_data")]
        images = [o["data"]["image/png"] for o in shown if "image/png" in o.get("data", {})]
        assert len(images) == 1, (cell.source, [o.get("data", {}).keys() for o in shown])
        assert base64.b64decode(images[0]).startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize("layout", ["each layer three times", "the layers three times over",
                                    "one more than the layers"])
def test_a_model_another_library_rewired_gives_one_tensor_per_layer_or_is_refused(bert, layout):
    """A hook that makes the model return more attention tensors than its config has layers (TransformerLens's
    TransformerBridge returned 18 for MiniLM's 6): the very same tensors repeated are taken once each, with a
    warning, and α equals the plain model's; any other count is one clear error. The hook is the user's: it is
    still there after."""
    from transformers import AutoModel

    folder, tokenizer = bert
    model = AutoModel.from_pretrained(folder, attn_implementation="eager")
    L = model.config.num_hidden_layers

    def rewired(module, args, kwargs, output):
        layers = output.attentions
        output.attentions = {"each layer three times": tuple(t for t in layers for _ in range(3)),
                             "the layers three times over": tuple(layers) * 3,
                             "one more than the layers": (*layers, layers[0].clone())}[layout]
        return output

    handle = model.register_forward_hook(rewired, with_kwargs=True)
    plain = attnviz.capture(SENTENCE, model=folder, device="cpu")
    if layout == "one more than the layers":
        with pytest.raises(AttentionCheckError, match=f"{L + 1} attention tensors for the {L} layers"):
            attnviz.capture(SENTENCE, model=model, tokenizer=tokenizer)
    else:
        with pytest.warns(AttnvizWarning, match=f"{3 * L} attention tensors for its {L} layers"):
            captured = attnviz.capture(SENTENCE, model=model, tokenizer=tokenizer)
        assert captured.n_layers == L
        np.testing.assert_array_equal(captured.attentions, plain.attentions)
    assert list(model._forward_hooks) == [handle.id]


def test_the_float32_tolerance_grows_with_the_largest_score_only():
    """verify's default tolerance: the dtype's, in float32 at least 2⁻²³ × the largest |score|; a given one as is."""
    from attnviz.api.scratch.verify import SCORE_ROUNDING, TOLERANCE, score_tolerance

    assert score_tolerance(None, "float32", 25.8) == TOLERANCE["float32"]  # MiniLM: the default holds
    assert score_tolerance(None, "float32", 1470.0) == pytest.approx(1470.0 * SCORE_ROUNDING)
    assert score_tolerance(None, "float16", 1470.0) == TOLERANCE["float16"]
    assert score_tolerance(1e-7, "float32", 1470.0) == 1e-7 and score_tolerance(None, "float32", None) == 1e-5
