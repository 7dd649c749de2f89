"""The interactive viewer's page for a 12-layer × 12-head capture at T = 128 (random peaked attention, fixed
seed): its size, and the time from opening it in headless Chromium (offline) to interactive (the viewer's
ready flag set: data decoded, the head view drawn), median of 5 opens. Goals: at most 5 MB, within 1 s.

    python benchmarks/bench_view.py [--tokens 128] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--real", action="store_true", help="the bundled MiniLM (6 × 12) on a 138-token text "
                                                            "instead of random attention")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from attnviz.data.capture import Capture
    from attnviz.render.viewer import viewer_data, viewer_html

    T = args.tokens
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(12, 12, T, T)) * 3
    alpha = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
    capture = Capture(attentions=alpha, tokens=[f"w{i}" for i in range(T)], token_ids=list(range(T)),
                      special=[False] * T, special_kind=[""] * T, subword=[False] * T,
                      meta={"model": "random 12 × 12", "causal": False, "text": "synthetic"})
    if args.real:
        from attnviz.engine.forward import capture_text
        from attnviz.engine.models import load

        capture = capture_text(" ".join(["The quick brown fox jumps over the lazy dog while the cat sat on the "
                                         "mat."] * 8), load(None, device="cpu"))
    start = time.perf_counter()
    page_text = viewer_html(viewer_data(capture, command="bench_view"))
    written = time.perf_counter() - start
    path = Path(tempfile.mkdtemp()) / "view.html"
    path.write_text(page_text, encoding="utf-8")
    size = path.stat().st_size
    times, ready_at, empty_times = [], [], []
    empty = path.with_name("empty.html")
    empty.write_text("<!doctype html><title>empty</title><script>requestAnimationFrame(() => setTimeout(() => "
                     "document.documentElement.dataset.attnvizPainted = '1', 0))</script>")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        for _ in range(5):  # the same measurement of an empty page: what opening any file costs here
            context = browser.new_context(offline=True)
            page = context.new_page()
            start = time.perf_counter()
            page.goto(empty.as_uri())
            page.wait_for_selector("html[data-attnviz-painted='1']", state="attached")
            empty_times.append(time.perf_counter() - start)
            context.close()
        for _ in range(5):
            context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            start = time.perf_counter()
            page.goto(path.as_uri())
            page.wait_for_selector("html[data-attnviz-painted='1']", state="attached")
            times.append(time.perf_counter() - start)
            page.wait_for_timeout(1500)
            ready_at.append(page.evaluate("[window.attnvizViewer.readyAt, window.attnvizViewer.paintedAt, "
                                          "window.attnvizViewer.drawnAt, window.attnvizViewer.drawnLines()]"))
            context.close()
        browser.close()
    print(f"{capture.model}: {capture.n_layers} layers × {capture.n_heads} heads, T = {capture.n_tokens}: "
          f"page {size / 1e6:.2f} MB ({size / 2**20:.2f} MiB), "
          f"written in {written:.2f} s")
    print(f"open → interactive (Playwright: goto until the first frame with the head view is painted): median "
          f"{statistics.median(times):.3f} s (runs: {', '.join(f'{t:.3f}' for t in times)})")
    print(f"  the same for an empty page (opening any file here): median {statistics.median(empty_times):.3f} s")
    print(f"  head view of layer 0, every head: {ready_at[0][3]} lines (α ≥ 0.01), drawn 1,500 a frame")
    for n, what in enumerate(("script done (data decoded, views wired)", "first frame painted",
                              "every line drawn")):
        print(f"  the page's own clock, {what}: median {statistics.median(r[n] for r in ready_at) / 1000:.3f} s")
    print(f"goals: ≤ 5 MB {'met' if size <= 5e6 else 'NOT met'}; ≤ 1 s "
          f"{'met' if statistics.median(times) <= 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
