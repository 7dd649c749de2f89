"""The export's index.html: a static gallery that works offline (no scripts, fonts or styles from elsewhere)."""

from __future__ import annotations

from html import escape
from typing import Sequence

from attnviz import __version__
from attnviz.capture import Capture

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5rem;color:#222;background:#fafafa}
h1{font-size:1.3rem;margin:0 0 .3rem} h2{font-size:1.1rem;margin:1.5rem 0 .5rem}
.text{font-size:1.2rem;background:#fff;border-left:4px solid #3b528b;padding:.4rem .8rem;margin:.5rem 0}
.meta{color:#555;font-size:.9rem} .tokens code{background:#eee;padding:0 .25rem;margin:0 .1rem;border-radius:3px}
.grid img{max-width:100%;border:1px solid #ddd;background:#fff}
.heads{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:.8rem}
figure{margin:0;background:#fff;border:1px solid #ddd;padding:.4rem} figure img{width:100%}
figcaption{font-size:.78rem;color:#333} .label{font-weight:600}
"""


def _figure(src: str, caption: str, fmt: str) -> str:
    visual = (f'<a href="{src}"><img src="{src}" loading="lazy" alt="{escape(src)}"></a>' if fmt != "pdf"
              else f'<a href="{src}">{escape(src)}</a>')
    return f"<figure>{visual}<figcaption>{caption}</figcaption></figure>"


def _stats_caption(s: dict) -> str:
    return (f'head {s["head"]} · <span class="label">{escape(s["label"])}</span><br>'
            f'H {s["entropy"]:.2f} nats · max α {s["max_weight"]:.2f} · dist {s["mean_distance"]:.1f}<br>'
            f'prev {s["prev"]:.2f} · self {s["self"]:.2f} · next {s["next"]:.2f} · '
            f'top key {escape(s["vertical_token"])}')


def gallery_html(capture: Capture, layers: Sequence[int], heads: Sequence[int], stats: list[dict], fmt: str,
                 grid_name: str) -> str:
    from attnviz.export import head_filename

    by_head = {(s["layer"], s["head"]): s for s in stats}
    text = capture.meta.get("text") or " ".join(capture.tokens)
    tokens = " ".join(f"<code>{escape(t)}</code>" for t in capture.tokens)
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>attnviz · {escape(text[:80])}</title><style>{STYLE}</style></head><body>",
        "<header><h1>attnviz export</h1>", f'<p class="text">{escape(text)}</p>',
        f'<p class="meta">model <b>{escape(capture.model)}</b> · {capture.n_layers} layers × {capture.n_heads} heads'
        f' · T = {capture.n_tokens} tokens{" · causal" if capture.causal else ""} · '
        f'{escape(str(capture.meta.get("dtype", "")))} · made by attnviz {__version__}</p>',
        f'<p class="meta tokens">{tokens}</p>',
        '<p class="meta">Data: <a href="attention.npz">attention.npz</a> (the capture) · '
        '<a href="heads.csv">heads.csv</a> · <a href="heads.json">heads.json</a> (head statistics; '
        'definitions in the attnviz README)</p></header>',
        f'<section class="grid"><h2>Every head</h2>{_figure(grid_name, "rows: layers · columns: heads", fmt)}</section>',
    ]
    for layer in layers:
        figures = [_figure(head_filename(layer, head, fmt), _stats_caption(by_head[layer, head]), fmt)
                   for head in heads if (layer, head) in by_head]
        figures.append(_figure(head_filename(layer, "mean", fmt), f"mean of {capture.n_heads} heads", fmt))
        parts.append(f'<section id="layer-{layer}"><h2>Layer {layer}</h2><div class="heads">{"".join(figures)}'
                     f"</div></section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
