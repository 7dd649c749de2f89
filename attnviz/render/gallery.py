"""The export's index.html: a static gallery that works offline (no scripts, fonts or styles from
elsewhere). It consumes the export's Panels (file names, titles) and the head records; the captions and
the glossary come from the metric registry."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from collections.abc import Sequence

from attnviz import metrics
from attnviz._version import __version__
from attnviz.data.capture import Capture
from attnviz.panels import head_label, Panel, PART_TITLES, short_model
from attnviz.base.text import visible
from attnviz.render.viewer import CSP_WITH_IMAGES

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5rem;color:#222;background:#fafafa}
h1{font-size:1.3rem;margin:0 0 .3rem} h2{font-size:1.1rem;margin:1.5rem 0 .5rem}
.text{font-size:1.2rem;background:#fff;border-left:4px solid #3b528b;padding:.4rem .8rem;margin:.5rem 0}
.meta{color:#555;font-size:.9rem} .tokens code{background:#eee;padding:0 .25rem;margin:0 .1rem;border-radius:3px}
.grid img{max-width:100%;border:1px solid #ddd;background:#fff}
.heads{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:.8rem}
figure{margin:0;background:#fff;border:1px solid #ddd;padding:.4rem} figure img{width:100%}
figcaption{font-size:.78rem;color:#333} .label{font-weight:600}
figcaption dl{display:grid;grid-template-columns:auto auto auto auto;gap:0 .5rem;margin:.2rem 0 0}
figcaption dt{color:#666} figcaption dd{margin:0;font-variant-numeric:tabular-nums}
.part{font-size:1.25rem;border-top:2px solid #3b528b;padding-top:.6rem}
.glossary dt{font-family:monospace;font-weight:600} .glossary dd{margin:0 0 .4rem 1rem}
"""


def _text(value: str) -> str:
    """Data as HTML text: control characters made visible, then escaped."""
    return escape(visible(str(value)))


def _figure(src: str, caption: str, fmt: str) -> str:
    src = escape(src)
    visual = (f'<a href="{src}"><img src="{src}" loading="lazy" alt="{src}"></a>' if fmt != "pdf"
              else f'<a href="{src}">{src}</a>')
    return f"<figure>{visual}<figcaption>{caption}</figcaption></figure>"


def stats_caption(record: dict) -> str:
    """A head's caption: its label, then every registered metric with its column header."""
    items = "".join(f'<dt title="{escape(m.definition)}">{escape(m.header)}</dt>'
                    f'<dd>{_text(m.format(record[m.name]))}</dd>' for m in metrics.METRICS if m.name in record)
    return f'head {record["head"]} · <span class="label">{_text(record["label"])}</span><dl>{items}</dl>'


def glossary() -> str:
    rows = "".join(f"<dt>{escape(m.header)}</dt><dd>{escape(m.definition)}</dd>" for m in metrics.METRICS)
    labels = escape(", ".join(metrics.LABELS))
    return (f'<section class="glossary"><h2>What the numbers mean</h2><dl>{rows}</dl>'
            f'<p class="meta">Labels ({labels}) follow Clark et al. 2019 and Kovaleva et al. 2019: the first '
            f'that applies wins; <code>attnviz explain</code> gives the thresholds.</p></section>')


@dataclass(frozen=True)
class Section:
    """One capture's part of the gallery: an ordinary model's only one, or one part of an encoder-decoder
    model (part: "encoder", "decoder", "cross")."""

    capture: Capture
    panels: Sequence[Panel]
    records: Sequence[dict]
    grid_name: str
    part: str | None = None


def _tokens(tokens: Sequence[str]) -> str:
    return " ".join(f"<code>{_text(t)}</code>" for t in tokens[:2000]) + (" …" if len(tokens) > 2000 else "")


def gallery_html(sections: Sequence[Section], fmt: str, viewer: tuple[str, str, str] | str | None = None) -> str:
    """The gallery page: text, model and tokens on top, then for each section (one, or per part of an
    encoder-decoder model) the grid and per layer each head's image with its statistics and the layer's
    head mean. `viewer`: the interactive view's (style, body, script) to put on top, or why there is none."""

    first = sections[0].capture
    parted = first.part is not None
    if parted:
        text = f"{first.meta.get('source_text', '')} → {first.meta.get('target_text', '')}"
        source = next((s.capture.key_tokens for s in sections if s.part in ("encoder", "cross")), ())
        target = next((s.capture.tokens for s in sections if s.part in ("decoder", "cross")), ())
        token_lines = [f'<p class="meta tokens">source: {_tokens(source)}</p>' if source else "",
                       f'<p class="meta tokens">target: {_tokens(target)}</p>' if target else ""]
        size = " · ".join(f"{PART_TITLES[s.part or '']}: {s.capture.n_layers} layers × {s.capture.n_heads} heads"
                          for s in sections)
    else:
        text = str(first.meta.get("text") or " ".join(first.tokens))
        all_tokens = first.long.tokens if first.long is not None else first.tokens
        token_lines = [f'<p class="meta tokens">{_tokens(all_tokens)}</p>']
        size = f"{first.n_layers} layers × {first.n_heads} heads · " + (
            f"T = {first.n_tokens} tokens" if first.long is None else
            f"{first.long.n_tokens} tokens, pictures pooled into {first.n_tokens} blocks of {first.long.block} "
            f"(statistics exact)") + (" · causal" if first.causal else "")
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP_WITH_IMAGES}">',
        f"<title>attnviz · {_text(text[:80])}</title>",
        f"<style>{STYLE}{viewer[0] if isinstance(viewer, tuple) else ''}</style></head><body>",
        "<header><h1>attnviz export</h1>", f'<p class="text">{_text(text)}</p>',
        f'<p class="meta">model <b>{_text(first.model)}</b> · {size} · '
        f'{_text(first.meta.get("dtype", ""))} · made by attnviz {__version__}</p>',
        *token_lines,
        '<p class="meta">Data: <a href="attention.npz">attention.npz</a> (the capture) · '
        '<a href="heads.csv">heads.csv</a> · <a href="heads.json">heads.json</a> (head statistics, '
        'defined below)</p>',
    ]
    if parted:
        links = " · ".join(f'<a href="#{s.part}">{_text(PART_TITLES[s.part or ""])}</a>' for s in sections)
        parts.append(f'<p class="meta">Parts: {links}</p>')
    parts.append("</header>")
    if isinstance(viewer, str):  # why there is no interactive view
        parts.append(f'<p class="meta">{_text(viewer)}</p>')
    elif viewer is not None:  # the interactive view (its own header would repeat the one above)
        parts.append('<section id="interactive"><h2>Interactive view</h2>'
                     + viewer[1].replace('class="av"', 'class="av embedded"', 1) + "</section>")
        parts.append(viewer[2])
    for section in sections:
        parts.extend(_section(section, fmt, parted))
    parts.append(glossary())
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _section(section: Section, fmt: str, parted: bool) -> list[str]:
    capture = section.capture
    anchor = f"{section.part}-" if section.part else ""
    out = []
    if parted:
        out.append(f'<section id="{section.part}"><h2 class="part">{_text(PART_TITLES[section.part or ""])}</h2>'
                   f'<p class="meta">{capture.n_layers} layers × {capture.n_heads} heads · rows '
                   f'{capture.n_tokens} {"target" if section.part != "encoder" else "source"} tokens × columns '
                   f'{capture.n_keys} {"source" if section.part != "decoder" else "target"} tokens</p></section>')
    by_head = {(r["layer"], r["head"]): r for r in section.records}
    caption = f"{_text(short_model(capture.model))} · rows: layers · columns: heads"
    out.append(f'<section class="grid"><h2>Every head</h2>{_figure(section.grid_name, caption, fmt)}</section>')
    for layer in dict.fromkeys(p.layer for p in section.panels):
        figures = []
        for panel in (p for p in section.panels if p.layer == layer):
            name = f"{panel.name}.{fmt}"
            record = by_head.get((layer, panel.head))
            caption = (stats_caption(record) if record is not None
                       else _text(head_label(panel.head if panel.head is not None else "mean", capture.n_heads)))
            figures.append(_figure(name, caption, fmt))
        out.append(f'<section id="{anchor}layer-{layer}"><h2>Layer {layer}</h2><div class="heads">{"".join(figures)}'
                   f"</div></section>")
    return out
