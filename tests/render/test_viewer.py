"""The interactive viewer: one self-contained HTML file, checked as a file and in a real browser (Debian's
Chromium driven by Playwright). Without Chromium or Playwright the browser tests are skipped with a message
saying what to install; .ci/run installs both."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from helpers import Page, SENTENCE, make_capture, one_line_error, run, write_page

from attnviz.render.viewer import viewer_data, viewer_html
from attnviz.base.text import visible

THRESHOLD = 0.01  # the head view draws a line for α ≥ this


def expected_lines(alpha: np.ndarray, heads, rows=None, cols=None, causal=False) -> tuple[int, int]:
    """How many lines the head view should draw for one layer's α (H, R, C): a range, as weights within the
    16-bit quantisation step of the threshold may fall either way."""
    H, R, C = alpha.shape
    keep = np.zeros((H, R, C), bool)
    keep[list(heads)] = True
    if rows is not None:
        mask = np.zeros(R, bool)
        mask[rows] = True
        keep &= mask[None, :, None]
    if cols is not None:
        mask = np.zeros(C, bool)
        mask[cols] = True
        keep &= mask[None, None, :]
    if causal:
        keep &= ~np.triu(np.ones((R, C), bool), 1)[None]
    return int((keep & (alpha >= THRESHOLD + 1e-4)).sum()), int((keep & (alpha >= THRESHOLD - 1e-4)).sum())


# --- the file --------------------------------------------------------------------------------------------


def test_page_is_one_file_that_fetches_nothing(cat_capture, tmp_path):
    html = write_page(tmp_path, cat_capture).read_text()
    assert not re.search(r"(src|href)\s*=", html)  # no script, style, font or image from anywhere
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert "default-src 'none'" in html  # the browser refuses any fetch, should one be attempted
    assert SENTENCE in html and "all-MiniLM-L6-v2" in html and "attnviz view (test)" in html


@pytest.mark.parametrize("bits", [16, 8])
def test_stored_weights_decode_to_alpha_within_the_stated_precision(cat_capture, bits):
    data = viewer_data(cat_capture, precision=str(bits))
    section = data["sections"][0]
    raw = base64.b64decode(section["alpha"])
    q = np.frombuffer(raw, "<u2" if bits == 16 else np.uint8).astype(np.float64)
    L, H, T = cat_capture.n_layers, cat_capture.n_heads, cat_capture.n_tokens
    scale = np.array(section["scale"])[:, :, None, None]
    decoded = q.reshape(L, H, T, T) / ((1 << bits) - 1) * scale
    error = np.abs(decoded - cat_capture.attentions) / scale
    assert error.max() <= 0.5 / ((1 << bits) - 1) + 1e-7
    assert section["rows"] == list(cat_capture.tokens) and data["bits"] == bits


def test_a_12_by_12_capture_at_128_tokens_fits_in_5_mb():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(12, 12, 128, 128)) * 3
    alpha = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    data = viewer_data(make_capture(alpha), precision="auto")
    page = viewer_html(data)
    assert data["bits"] == 8 and len(page.encode()) <= 5 * 10**6, len(page.encode())
    small = viewer_data(make_capture(alpha[:2, :2]), precision="auto")
    assert small["bits"] == 16  # auto keeps 16 bits while it fits


def test_notes_for_words_pooled_generated_and_causal(tiny_model_dir, tmp_path):
    from attnviz.engine.forward import capture_text
    from attnviz.engine.models import load
    from attnviz.data.words import to_words

    loaded = load(tiny_model_dir("gpt2"), device="cpu")
    capture = capture_text("The cat sat on the mat, happily.", loaded)
    section = viewer_data(capture)["sections"][0]
    assert section["causal"] is True
    words = viewer_data(to_words(capture))["sections"][0]
    assert any("word level" in n for n in words["notes"]) and len(words["rows"]) < len(section["rows"])



def test_generated_tokens_are_marked(tiny_lm_dir):
    from attnviz.engine.generation import Decoding, generate_capture
    from attnviz.engine.models import load

    loaded = load(tiny_lm_dir("gpt2"), device="cpu", lm_head=True)
    capture = generate_capture(loaded, "The cat sat", Decoding(max_new_tokens=4))
    section = viewer_data(capture)["sections"][0]
    first = int(np.argmax(capture.generated))
    assert capture.generated[first:].all() and first > 0
    assert section["rowSplit"] == section["colSplit"] == first


# --- in the browser ------------------------------------------------------------------------------------


@pytest.mark.browser
def test_loads_offline_with_no_errors_and_no_requests(browser, cat_capture, tmp_path):
    page = Page(browser, write_page(tmp_path, cat_capture))
    assert page.js("document.querySelectorAll('#av-left li').length") == cat_capture.n_tokens
    assert page.js("document.getElementById('av-text').textContent") == SENTENCE
    page.close()


@pytest.mark.browser
def test_shift_click_selects_several_tokens_and_sums_their_attention(browser, cat_capture, tmp_path):
    """Shift-click adds tokens to a selection: only their lines stay (hovering elsewhere changes nothing), and the
    readout sums their rows (or columns), each the mean of the heads shown — as numpy sums α; a plain click and
    Escape clear it."""
    page = Page(browser, write_page(tmp_path, cat_capture))
    alpha = cat_capture.attentions[0].astype(np.float64)
    page.page.click("#av-all-heads")
    heads = range(cat_capture.n_heads)
    page.page.click("#av-left li:nth-child(3)", modifiers=["Shift"])
    page.page.click("#av-left li:nth-child(4)", modifiers=["Shift"])
    page.page.hover("#av-right li:nth-child(1)")  # a hover does not move a selection
    low, high = expected_lines(alpha, heads, rows=[2, 3])
    assert low <= page.lines() <= high
    sums = json.loads(page.js("document.getElementById('av-selection').dataset.sums"))
    np.testing.assert_allclose(sums, alpha[:, [2, 3], :].mean(axis=0).sum(axis=0), atol=2e-4)  # 16-bit weights
    shown = page.js("document.getElementById('av-selection').textContent")
    assert shown.startswith(f"what '{cat_capture.tokens[2]}' + '{cat_capture.tokens[3]}' attend to (summed over 2")
    page.page.click("#av-left li:nth-child(4)", modifiers=["Shift"])  # shift-click again: out of the selection
    assert page.js("window.attnvizViewer.state.picked.indices") == [2]
    page.page.click("#av-right li:nth-child(2)", modifiers=["Shift"])  # the other side: a new selection
    assert page.js("window.attnvizViewer.state.picked.side") == "right"
    sums = json.loads(page.js("document.getElementById('av-selection').dataset.sums"))
    np.testing.assert_allclose(sums, alpha[:, :, 1].mean(axis=0), atol=2e-4)
    page.page.keyboard.press("Escape")
    assert page.js("window.attnvizViewer.state.picked.indices") == []
    page.page.click("#av-left li:nth-child(2)", modifiers=["Shift"])
    page.page.click("#av-left li:nth-child(5)")  # a plain click clears
    assert page.js("window.attnvizViewer.state.picked.indices") == []
    page.close()


@pytest.mark.browser
def test_hover_keeps_only_that_tokens_lines(browser, cat_capture, tmp_path):
    page = Page(browser, write_page(tmp_path, cat_capture))
    alpha = cat_capture.attentions[0]  # layer 0 is shown first, its sharpest head alone (all heads: a tangle)
    sharpest = int(np.argmin(-(np.where(alpha > 0, alpha * np.log(np.where(alpha > 0, alpha, 1)), 0)).sum((1, 2))))
    assert page.js("[...window.attnvizViewer.state.heads]") == [sharpest]
    low, high = expected_lines(alpha, [sharpest])
    assert low <= page.lines() <= high
    page.page.click("#av-all-heads")
    heads = range(cat_capture.n_heads)
    low, high = expected_lines(alpha, heads)
    assert low <= page.lines() <= high
    page.page.hover("#av-left li:nth-child(3)")  # query 2: what it attends to
    low2, high2 = expected_lines(alpha, heads, rows=[2])
    assert low2 <= page.lines() <= high2 and high2 < low
    page.page.hover("#av-right li:nth-child(1)")  # key 0: what attends to it
    low3, high3 = expected_lines(alpha, heads, cols=[0])
    assert low3 <= page.lines() <= high3
    # a head turned off takes its lines away
    page.page.mouse.move(1300, 5)
    page.page.click("#av-no-heads")
    assert page.lines() == 0
    page.page.click("#av-head-toggles button[data-head='2']")
    low4, high4 = expected_lines(alpha, [2])
    assert low4 <= page.lines() <= high4 and page.lines() > 0
    page.close()


@pytest.mark.browser
def test_clicking_a_thumbnail_opens_that_layer_and_head(browser, cat_capture, tmp_path):
    page = Page(browser, write_page(tmp_path, cat_capture))
    page.page.click("#av-tab-model")
    assert page.js("document.querySelectorAll('#av-thumbs button').length") == cat_capture.n_layers * \
        cat_capture.n_heads
    page.page.click("#av-thumbs button[data-layer='4'][data-head='7']")
    state = page.js("[window.attnvizViewer.state.view, window.attnvizViewer.state.layer, "
                    "[...window.attnvizViewer.state.heads], document.getElementById('av-layer').value]")
    assert state == ["head", 4, [7], "4"]
    low, high = expected_lines(cat_capture.attentions[4], [7])
    assert low <= page.lines() <= high
    assert page.js("document.getElementById('av-head-view').hidden") is False
    page.close()


@pytest.mark.browser
def test_keyboard_reaches_tokens_and_thumbnails(browser, cat_capture, tmp_path):
    page = Page(browser, write_page(tmp_path, cat_capture))
    focused = None
    for _ in range(60):  # Tab from the top until a query token has the focus
        page.page.keyboard.press("Tab")
        focused = page.js("document.activeElement.dataset.side || document.activeElement.id")
        if focused == "left":
            break
    assert focused == "left"
    first = page.js("Number(document.activeElement.dataset.index)")
    assert first == 0
    start = page.js("[...window.attnvizViewer.state.heads]")
    low, high = expected_lines(cat_capture.attentions[0], start, rows=[0])
    assert low <= page.lines() <= high
    page.page.keyboard.press("ArrowDown")
    assert page.js("Number(document.activeElement.dataset.index)") == 1
    # the focused token is visibly marked
    assert page.js("document.activeElement.classList.contains('active')")
    # the model view by keyboard: a thumbnail, then Enter
    page.page.focus("#av-tab-head")
    page.page.keyboard.press("ArrowRight")
    assert page.js("window.attnvizViewer.state.view") == "model"
    page.page.focus("#av-thumbs button[data-layer='1'][data-head='2']")
    page.page.keyboard.press("Enter")
    assert page.js("[window.attnvizViewer.state.view, window.attnvizViewer.state.layer, "
                   "[...window.attnvizViewer.state.heads]]") == ["head", 1, [2]]
    page.close()


@pytest.mark.browser
def test_matrix_view_shows_the_weight_under_the_pointer(browser, cat_capture, tmp_path):
    page = Page(browser, write_page(tmp_path, cat_capture))
    page.page.click("#av-tab-matrix")
    page.page.select_option("#av-layer", "3")
    page.page.select_option("#av-matrix-head", "5")
    box = page.page.locator("#av-matrix").bounding_box()
    geometry = page.js("[document.getElementById('av-matrix').style.width]")
    assert geometry[0].endswith("px")
    margin, cell = 130, 24  # 8 tokens: the largest cells, with labels
    i, j = 2, 6
    page.page.mouse.move(box["x"] + margin + j * cell + cell / 2, box["y"] + margin + i * cell + cell / 2)
    text = page.js("document.getElementById('av-readout').textContent")
    value = float(re.search(r"α = ([0-9.]+)", text).group(1))
    assert abs(value - float(cat_capture.attentions[3, 5, i, j])) <= 5e-5
    assert f"“{cat_capture.tokens[i]}”" in text and f"“{cat_capture.tokens[j]}”" in text
    # arrow keys move a cursor over the cells and read them out too
    page.page.focus("#av-matrix")
    page.page.keyboard.press("ArrowRight")
    text = page.js("document.getElementById('av-readout').textContent")
    assert "query 0" in text and "key 1" in text
    page.close()


@pytest.mark.browser
def test_the_matrix_view_draws_where_generation_begins(browser, tiny_lm_dir, tmp_path):
    from attnviz.engine.generation import Decoding, generate_capture
    from attnviz.engine.models import load

    capture = generate_capture(load(tiny_lm_dir("gpt2"), device="cpu", lm_head=True), "The cat sat",
                               Decoding(max_new_tokens=4))
    first = int(np.argmax(capture.generated))
    page = Page(browser, write_page(tmp_path, capture))
    page.page.click("#av-tab-matrix")
    # the pixel on the split row, halfway across the keys, is the line's colour (#e8175d), and a row
    # further down is not
    # (one readback of the column from the split row down half a cell)
    line, below = page.js(
        f"(function () {{ var c = document.getElementById('av-matrix'), g = window.attnvizViewer.matrix();"
        f" var r = c.width / c.clientWidth, x = Math.round((g.margin + g.cell * 0.5) * r);"
        f" var y = Math.round((g.margin + {first} * g.cell) * r), h = Math.round(g.cell * 0.5 * r);"
        f" var d = c.getContext('2d').getImageData(x, y, 1, h + 1).data;"
        f" return [Array.from(d.slice(0, 3)), Array.from(d.slice(4 * h, 4 * h + 3))]; }})()")
    assert line == [0xe8, 0x17, 0x5d] and below != line
    assert "a line marks where" in page.js("document.getElementById('av-notes').textContent")
    page.close()


@pytest.mark.browser
def test_causal_models_leave_the_future_blank(browser, tiny_model_dir, tmp_path):
    from attnviz.engine.forward import capture_text
    from attnviz.engine.models import load

    capture = capture_text("The cat sat on the mat", load(tiny_model_dir("gpt2"), device="cpu"))
    page = Page(browser, write_page(tmp_path, capture))
    page.page.hover("#av-left li:nth-child(1)")  # the first token sees only itself
    assert 1 <= page.lines() <= capture.n_heads
    low, high = expected_lines(capture.attentions[0], page.js("[...window.attnvizViewer.state.heads]"), causal=True)
    page.page.mouse.move(1300, 5)
    assert low <= page.lines() <= high
    page.page.click("#av-tab-matrix")
    page.page.focus("#av-matrix")
    page.page.keyboard.press("ArrowRight")
    assert "future" in page.js("document.getElementById('av-readout').textContent")
    page.close()


@pytest.mark.browser
def test_encoder_decoder_parts(browser, tiny_seq2seq_dir, tmp_path):
    from attnviz.engine.models import load
    from attnviz.engine.seq2seq import parts_capture

    loaded = load(tiny_seq2seq_dir("bart"), device="cpu")
    whole = parts_capture(loaded, "The cat sat on the mat", target="Die Katze")
    page = Page(browser, write_page(tmp_path, whole))
    assert page.js("document.getElementById('av-part').options.length") == 3
    names = page.js("[...document.getElementById('av-part').options].map(o => o.textContent)")
    cross = next(n for n, name in enumerate(names) if "ross" in name)
    page.page.select_option("#av-part", str(cross))
    rows = page.js("document.querySelectorAll('#av-left li').length")
    cols = page.js("document.querySelectorAll('#av-right li').length")
    part = whole.part("cross")
    assert (rows, cols) == (part.n_tokens, part.n_keys) and rows != cols
    page.close()


@pytest.mark.browser
def test_hostile_tokens_are_text(browser, tmp_path):
    tokens = ["<img src=x onerror=alert(1)>", "</script><script>alert(2)</script>", "\u202eevil", "\x1b[31mred",
              "' onmouseover='alert(3)"]
    alpha = np.full((1, 2, len(tokens), len(tokens)), 1 / len(tokens))
    capture = make_capture(alpha, tokens).with_meta(text="<b>bold</b> \u202e")
    path = write_page(tmp_path, capture)
    page = Page(browser, path)
    shown = page.js("[...document.querySelectorAll('#av-left li')].map(e => e.textContent)")
    assert shown == [visible(t) for t in tokens]
    assert page.js("document.querySelectorAll('img, b').length") == 0
    for n in range(len(tokens)):
        page.page.hover(f"#av-left li:nth-child({n + 1})")
    page.close()  # no dialog, no error, no request


BREAKERS = ["<!--<script>", "<script>", "</script>", "<!--", "-->", "]]>", "&lt;b&gt;", "a\u2028b\u2029c",
            "</SCRIPT >", "<!-- <script> --> x"]


@pytest.mark.browser
def test_embedded_data_cannot_change_how_the_page_parses(browser, tmp_path):
    """Tokens, text and model name that would end or comment out the data block if only `</` were escaped:
    the JSON holds no `<`, `>` or `&`, and the page shows every string as it is."""
    alpha = np.full((1, 2, len(BREAKERS), len(BREAKERS)), 1 / len(BREAKERS))
    capture = make_capture(alpha, BREAKERS).with_meta(text="<!--<script> text", model="<!--<script>model")
    path = write_page(tmp_path, capture)
    html = path.read_text(encoding="utf-8")
    data = html.split('id="attnviz-data">', 1)[1].split("</script>", 1)[0]
    assert not set("<>&") & set(data)
    page = Page(browser, path)
    shown = page.js("[...document.querySelectorAll('#av-left li')].map(e => e.textContent)")
    assert shown == [visible(t) for t in BREAKERS]
    assert page.js("JSON.parse(document.getElementById('attnviz-data').textContent).text") == "<!--<script> text"
    page.close()


@pytest.mark.browser
def test_export_index_has_a_content_security_policy_and_still_shows_its_images(browser, tmp_path):
    from attnviz.api.gallery import export

    alpha = np.full((1, 2, len(BREAKERS), len(BREAKERS)), 1 / len(BREAKERS))
    capture = make_capture(alpha, BREAKERS).with_meta(text="<!--<script> text")
    target = export(capture, tmp_path / "out", layer=[0], head=[0, 1])
    html = (target / "index.html").read_text(encoding="utf-8")
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    page = Page(browser, target / "index.html", local_files=True)
    assert page.js("[...document.querySelectorAll('#av-left li')].map(e => e.textContent)") == \
        [visible(t) for t in BREAKERS]
    loaded = page.js("[...document.querySelectorAll('figure img')].map(i => i.complete && i.naturalWidth > 0)")
    assert loaded and all(loaded)
    page.close()


@pytest.mark.browser
def test_a_notebook_frame_fits_its_page(browser, cat_capture, tmp_path):
    """The frame a notebook shows takes the height its page posts: no empty band under a short sentence."""
    from attnviz.api.notebook import inline_html
    from attnviz.render.viewer import FRAME_HEIGHT_PX

    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!doctype html><html><body>{inline_html(cat_capture)}<p id='after'>next cell</p>"
                        f"</body></html>", encoding="utf-8")
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(notebook.as_uri())
    page.wait_for_function(f"document.querySelector('iframe').getBoundingClientRect().height != {FRAME_HEIGHT_PX}",
                           timeout=10_000)
    frame_height = page.evaluate("document.querySelector('iframe').getBoundingClientRect().height")
    inner = page.frames[1].evaluate("document.getElementById('attnviz-viewer').getBoundingClientRect().height")
    assert 200 < inner < frame_height <= inner + 40 < FRAME_HEIGHT_PX - 100  # it shrank to fit
    page.frames[1].click("#av-tab-model")  # a taller view: the frame grows with it
    page.wait_for_function(f"document.querySelector('iframe').getBoundingClientRect().height > {frame_height}",
                           timeout=10_000)
    context.close()


@pytest.mark.browser
def test_export_index_has_the_interactive_view(browser, cat_capture, tmp_path):
    from attnviz.api.gallery import export

    target = export(cat_capture, tmp_path / "out", layer=[0, 5], head=[0, 1])
    page = Page(browser, target / "index.html", local_files=True)  # the gallery's own images
    assert page.js("document.getElementById('attnviz-viewer').classList.contains('embedded')")
    page.page.click("#av-tab-model")
    assert page.js("document.querySelectorAll('#av-thumbs button').length") == 6 * 12
    page.close()


def test_export_of_a_capture_too_large_for_a_page_still_works(tmp_path, monkeypatch):
    """The export's gallery goes without the interactive view, saying why, when the capture would pass the
    page's limit (the limit lowered here); the export itself is unchanged: the same images as with the view."""
    import attnviz.render.viewer as viewer
    from attnviz.api.gallery import export

    capture = make_capture(np.full((1, 2, 8, 8), 1 / 8))
    whole = export(capture, tmp_path / "whole", layer=[0], head=[0, 1])
    monkeypatch.setattr(viewer, "MAX_PAGE_BYTES", 100)
    target = export(capture, tmp_path / "out", layer=[0], head=[0, 1])
    html = (target / "index.html").read_text()
    assert "interactive view is left out" in html and "attnviz-data" not in html
    assert "attnviz-data" in (whole / "index.html").read_text()
    images = sorted(p.name for p in whole.iterdir() if p.suffix == ".png")
    assert images == sorted(p.name for p in target.iterdir() if p.suffix == ".png") and len(images) == 4
    assert all((whole / name).read_bytes() == (target / name).read_bytes() for name in images)


def test_view_command(tmp_path, tiny_model_dir):
    out = tmp_path / "cat.html"
    result = run("view", SENTENCE, "-m", tiny_model_dir("bert"), "-o", out)
    assert result.exit_code == 0, result.output
    assert str(out) in result.stdout
    html = out.read_text()
    data = json.loads(re.search(r'id="attnviz-data">(.*?)</script>', html, re.S).group(1))
    assert data["sections"][0]["layers"] == [0, 1] and data["text"] == SENTENCE
    result = run("view", SENTENCE, "-m", tiny_model_dir("bert"), "--layer", "1", "-o", tmp_path / "one.html")
    data = json.loads(re.search(r'id="attnviz-data">(.*?)</script>', (tmp_path / "one.html").read_text(),
                                re.S).group(1))
    assert data["sections"][0]["layers"] == [1]
    one_line_error(run("view", SENTENCE, "-m", tiny_model_dir("bert"), "-o", tmp_path / "x.png"), code=1)
    one_line_error(run("view", SENTENCE, "-m", tiny_model_dir("bert"), "--precision", "12"), code=2)
    capture = tmp_path / "c.npz"
    assert run("capture", SENTENCE, "-m", tiny_model_dir("bert"), "-o", capture).exit_code == 0
    assert run("view", "--from", capture, "-o", tmp_path / "from.html").exit_code == 0


# --- the contributions panel (attnviz contributions --html) ----------------------------------------------


@pytest.fixture(scope="module")
def contributed(tiny_model_dir):
    import attnviz

    return attnviz.contributions(SENTENCE, model=tiny_model_dir("bert"))


def dequantised(section: dict, key: str, scale_key: str, shape) -> np.ndarray:
    """The page's numbers, decoded as its script decodes them: 16-bit steps of each matrix's scale."""
    q = np.frombuffer(base64.b64decode(section[key]), "<u2").astype(np.float64).reshape(shape)
    return q / 65535 * np.asarray(section[scale_key], np.float64)[:, None, None]


def test_the_contributions_panel_holds_every_layer_and_both_rollouts(contributed):
    from attnviz.metrics import rollout

    html = contributed.html(threshold=0.1)
    data = json.loads(re.search(r'id="attnviz-data">(.*?)</script>', html, re.S).group(1))
    section = data["contributions"]
    L, T = contributed.capture.n_layers, contributed.capture.n_tokens
    assert section["method"] == "ALTI" and section["threshold"] == 0.1 and section["layers"] == L
    assert section["token"] == contributed.default_token() and not contributed.capture.special[section["token"]]
    scores = dequantised(section, "scores", "scale", (L, T, T))
    np.testing.assert_allclose(scores, contributed.scores, atol=np.max(section["scale"]) / 65535)
    rollouts = dequantised(section, "rollouts", "rolloutScale", (2, T, T))
    np.testing.assert_allclose(rollouts[0], contributed.rollout(), atol=1e-4)
    np.testing.assert_allclose(rollouts[1], rollout(contributed.alpha), atol=1e-4)
    assert data["sections"][0]["rows"] == [visible(t) for t in contributed.capture.tokens]


@pytest.mark.browser
def test_choosing_a_token_draws_its_strongest_paths_and_both_rollouts(browser, contributed, tmp_path):
    """In a real browser: the panel draws an edge for every contribution at or past the threshold, and the paths
    its script finds into the chosen token are those metrics.strongest_paths finds in the same (stored)
    numbers; the table beside them is that token's row of both rollouts."""
    from attnviz.metrics import strongest_paths

    path = tmp_path / "contributions.html"
    html = contributed.html(threshold=0.1)
    path.write_text(html, encoding="utf-8")
    section = json.loads(re.search(r'id="attnviz-data">(.*?)</script>', html, re.S).group(1))["contributions"]
    L, T = contributed.capture.n_layers, contributed.capture.n_tokens
    scores = dequantised(section, "scores", "scale", (L, T, T))
    page = Page(browser, path)
    assert page.js("document.getElementById('av-tab-contrib').hidden") is False
    page.page.click("#av-tab-contrib")
    assert page.js("window.attnvizViewer.state.cEdges") == int((scores >= 0.1).sum())
    for token in (3, T - 1):
        page.page.click(f"#av-c-tokens button[data-token='{token}']")
        found = page.js("window.attnvizViewer.state.cPaths")
        expected = strongest_paths(scores, token, 5)
        assert [tuple(p) for _, p in found] == [p for _, p in expected]
        np.testing.assert_allclose([w for w, _ in found], [w for w, _ in expected], rtol=1e-12)
        shown = page.js("[...document.querySelectorAll('#av-c-rollout tbody tr')].map(r => [...r.cells].map("
                        "c => c.textContent))")
        assert [row[0] for row in shown] == [visible(t) for t in contributed.capture.tokens]
        np.testing.assert_allclose([float(row[1]) for row in shown], contributed.rollout()[token], atol=6e-4)
        from attnviz.metrics import rollout

        np.testing.assert_allclose([float(row[2]) for row in shown], rollout(contributed.alpha)[token], atol=6e-4)
        assert page.js("document.activeElement.dataset.token") == str(token)  # the keyboard stays where it was
    page.page.fill("#av-c-threshold", "0.3")
    page.page.dispatch_event("#av-c-threshold", "input")
    assert page.js("window.attnvizViewer.state.cEdges") == int((scores >= 0.3).sum())
    page.close()


def test_the_contributions_page_from_the_command_line(tiny_model_dir, tmp_path, monkeypatch):
    folder = tiny_model_dir("bert")
    shown = run("contributions", SENTENCE, "-m", folder, "--html", tmp_path / "c.html", "--token", "cat")
    assert shown.exit_code == 0 and (tmp_path / "c.html").is_file()
    data = json.loads(re.search(r'id="attnviz-data">(.*?)</script>',
                                (tmp_path / "c.html").read_text(encoding="utf-8"), re.S).group(1))
    assert data["sections"][0]["rows"][data["contributions"]["token"]] == "cat"
    assert ".html" in one_line_error(run("contributions", SENTENCE, "-m", folder, "--html", tmp_path / "c.png"))
    from attnviz.api.attribution import contributions as attribution

    monkeypatch.setattr(attribution, "MAX_GRAPH_TOKENS", 4)
    assert "at most 4" in one_line_error(run("contributions", SENTENCE, "-m", folder, "--html", tmp_path / "d.html"))
    assert not (tmp_path / "d.html").exists()


# --- the patching panel (attnviz patch --html) ---------------------------------------------------

@pytest.mark.browser
def test_choosing_a_head_in_the_patching_panel_draws_its_attention_on_both_prompts(browser, tiny_lm_dir, tmp_path):
    """In a real browser: the Patching tab reads each head's score as the result has it; choosing a head (the top
    table, or the map's arrow keys and Enter) names it, and draws its α on both prompts, each as tall as its
    prompt."""
    import attnviz

    result = attnviz.patch("The cat sat on the mat", "The big cat sat on the mat", model=tiny_lm_dir("llama"),
                           answers=(5, 6), align="auto")
    path = tmp_path / "patch.html"
    path.write_text(result.html(), encoding="utf-8")
    page = Page(browser, path)
    assert page.js("document.getElementById('av-tab-patch').hidden") is False
    page.page.click("#av-tab-patch")
    L, H = result.heads.shape
    for n, h in ((0, 0), (L - 1, H - 1)):
        assert page.js(f"window.attnvizViewer.patchValue('heads', {n}, {h})") == pytest.approx(result.heads[n, h],
                                                                                            abs=1e-6)
    rows = page.js("[...document.querySelectorAll('#av-p-top tbody tr')].map(r => r.cells[1].textContent)")
    assert rows == [f"{t['layer']}.{t['head']}" for t in result.top()]
    second = result.top()[1]
    page.page.click(f"#av-p-top button[data-layer='{second['layer']}'][data-head='{second['head']}']")
    assert page.js("document.getElementById('av-p-pattern-title').textContent").startswith(
        f"Head {second['layer']}.{second['head']} ")
    heights = page.js("[document.getElementById('av-p-clean').style.height, "
                      "document.getElementById('av-p-corrupt').style.height].map(parseFloat)")
    assert heights[1] > heights[0]  # the corrupted prompt has more tokens
    page.page.focus("#av-p-heads")
    page.page.keyboard.press("ArrowDown")
    page.page.keyboard.press("Enter")
    assert page.js("window.attnvizViewer.state.pHead") == [second["layer"] + 1 if second["layer"] + 1 < L
                                                           else second["layer"], second["head"]]
    page.close()


# --- a picture's capture: the Picture tab -----------------------------------------------------------------


@pytest.fixture(scope="module")
def picture_capture(tmp_path_factory):
    import io

    import torch
    import transformers as tf
    from PIL import Image

    import attnviz

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("vit") / "vit"
    tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             image_size=56, patch_size=14)).save_pretrained(folder)
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (40, 60, 3)).astype(np.uint8)).save(buffer, format="PNG")
    return attnviz.capture_image(buffer.getvalue(), model=str(folder))


@pytest.mark.browser
def test_the_picture_tab_lays_the_querys_row_over_the_picture(browser, picture_capture, tmp_path):
    """The Picture tab: [CLS]'s row over the patches at first, a hovered patch's row after, the head chosen;
    each the stored α within its 16-bit step."""
    capture = picture_capture
    rows, cols = capture.grid
    page = Page(browser, write_page(tmp_path, capture))
    assert page.js("document.getElementById('av-tab-picture').hidden") is False
    page.page.click("#av-tab-picture")
    page.page.wait_for_function("document.getElementById('av-picture').width > 0")
    expected = capture.attentions[0].mean(0)[0, 1:]
    np.testing.assert_allclose(page.js("window.attnvizViewer.pictureRow()"), expected, atol=2e-5)
    box = page.page.locator("#av-picture").bounding_box()
    cell = box["width"] / cols
    page.page.mouse.move(box["x"] + 2.5 * cell, box["y"] + 1.5 * cell)  # patch (1, 2)
    np.testing.assert_allclose(page.js("window.attnvizViewer.pictureRow()"),
                               capture.attentions[0].mean(0)[1 + cols + 2, 1:], atol=2e-5)
    assert "p(1,2)" in page.js("document.getElementById('av-picture-readout').textContent")
    page.page.select_option("#av-picture-head", "1")
    np.testing.assert_allclose(page.js("window.attnvizViewer.pictureRow()"),
                               capture.attentions[0, 1, 1 + cols + 2, 1:], atol=2e-5)
    page.page.mouse.move(1300, 5)  # off the picture: back to [CLS]
    page.page.keyboard.press("Escape")
    np.testing.assert_allclose(page.js("window.attnvizViewer.pictureRow()"), capture.attentions[0, 1, 0, 1:],
                               atol=2e-5)
    page.close()


def test_a_text_page_has_no_picture_tab(cat_capture):
    data = viewer_data(cat_capture)
    assert data["sections"][0]["picture"] is None and 'id="av-tab-picture"' in viewer_html(data)


@pytest.mark.browser
def test_the_contributions_panel_shows_how_faithful_each_is(browser, tiny_model_dir, tmp_path):
    """--faithfulness: α, its rollout, the contributions and leave-one-out measured on the same text (attnviz
    faithfulness), in the report, --json and the panel's table, row for row the result's own."""
    import attnviz

    folder = tiny_model_dir("bert")
    shown = run("contributions", SENTENCE, "-m", folder, "--faithfulness", "--json", "--html", tmp_path / "f.html")
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)["faithfulness"]
    assert [r["method"] for r in data["methods"]] and {r["method"] for r in data["methods"]} == \
        {"attention", "rollout", "alti", "loo"}
    reference = attnviz.faithfulness(SENTENCE, model=attnviz.load_model(folder, device="cpu"),
                                     methods=["attention", "rollout", "alti", "loo", "random"], sanity=0)
    assert data["methods"] == json.loads(json.dumps(reference.to_rows()))
    page = Page(browser, tmp_path / "f.html")
    page.page.click("#av-tab-contrib")
    rows = page.js("[...document.querySelectorAll('#av-c-faith tbody tr')].map(r => [...r.cells].map("
                   "c => c.textContent))")
    assert [r[0] for r in rows] == [r["method"] for r in data["methods"]]
    np.testing.assert_allclose([float(r[1]) for r in rows], [r["comprehensiveness_aopc"] for r in data["methods"]],
                               atol=5e-4)
    assert page.js("document.getElementById('av-c-faith').hidden") is False
    page.close()
    plain = run("contributions", SENTENCE, "-m", folder, "--html", tmp_path / "g.html")
    assert plain.exit_code == 0 and "compr." not in plain.stdout
    page = Page(browser, tmp_path / "g.html")
    page.page.click("#av-tab-contrib")
    assert page.js("document.getElementById('av-c-faith').hidden") is True
    page.close()
