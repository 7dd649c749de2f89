"""The interactive viewer: one self-contained HTML file (script, styles and data inline; nothing is fetched)
with a head view (query and key tokens in two columns, a line per weight, one colour per head), a model
view (every layer × head as a thumbnail) and a matrix view (the heatmap, exact weight on hover); beside them,
for `attnviz contributions`, the contribution graph (choose a token: its strongest incoming paths, and how
much of each input token reaches it by contribution and by α's rollout). It consumes Captures (one, or the
parts of an encoder-decoder model); the page's script draws everything.

α is stored quantised per layer and head: each matrix divided by its largest value and rounded to 16 bits
(or 8 when 16 would pass the size budget), base64. The page states the precision it was written with.
"""

from __future__ import annotations

import html

import base64
import json
import shlex
import sys
from collections.abc import Sequence
from html import escape
from importlib import resources

import numpy as np

from attnviz._version import __version__
from attnviz.data.capture import Capture
from attnviz.data.parts import Parts
from attnviz.errors import InputError, arg
from attnviz.panels import PART_TITLES, generated_split, short_model
from attnviz.base.text import repair_unicode, visible

PRECISIONS = ("auto", "16", "8")
AUTO_16_BIT_BYTES = 4 << 20  # auto: 16 bits per weight while the weights take at most this (base64), else 8
MAX_PAGE_BYTES = 64 << 20  # a page larger than this is refused (choose fewer layers)
MAX_TOKEN_CHARS = 80  # a token's label in the page


def _asset(name: str) -> str:
    return resources.files("attnviz.render").joinpath(name).read_text(encoding="utf-8")


def _label(token: str) -> str:
    text = visible(repair_unicode(str(token)))
    return text if len(text) <= MAX_TOKEN_CHARS else text[:MAX_TOKEN_CHARS - 1] + "…"


def _quantise(alpha: np.ndarray, bits: int) -> tuple[str, list[list[float]]]:
    """α (L, H, R, C) -> base64 of little-endian unsigned integers, and each matrix's scale (its maximum)."""
    top = (1 << bits) - 1
    scale = alpha.max(axis=(2, 3)).astype(np.float64)  # (L, H)
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    q = np.rint(np.clip(alpha / scale[:, :, None, None], 0.0, 1.0) * top)
    q = q.astype("<u2" if bits == 16 else np.uint8)
    return base64.b64encode(q.tobytes()).decode("ascii"), scale.tolist()


def _bits(cells: int, precision: str) -> int:
    if precision == "8":
        return 8
    if precision == "16":
        return 16
    return 16 if cells * 2 * 4 / 3 <= AUTO_16_BIT_BYTES else 8


def section_data(capture: Capture, name: str, bits: int, layers: Sequence[int]) -> dict:
    alpha = np.asarray(capture.attentions[list(layers)], np.float32)
    payload, scale = _quantise(alpha, bits)
    future = capture.future_mask
    notes = []
    if capture.long is not None:
        notes.append(f"a long input of {capture.long.n_tokens} tokens, pooled into blocks of {capture.long.block}: "
                     f"each cell is the mean weight of a block of queries on a block of keys")
    if capture.meta.get("level") == "word":
        notes.append("word level: to a word, the sum over its pieces; from a word, their mean")
    if capture.quantity != "alpha":
        notes.append(f"values: {capture.quantity}")
    windows = capture.windows
    shown_windows = [int(windows[n]) for n in layers] if windows else None
    if shown_windows and any(shown_windows):
        sliding = [str(n) for n, w in zip(layers, shown_windows) if w]
        reach = max(shown_windows)
        notes.append(f"layers {', '.join(sliding)}: " + (f"a sliding window of {reach} (keys {reach} or more back "
                     f"are blank)" if capture.causal else f"local attention ±{reach} (keys further away are blank)"))
    token_windows = capture.meta.get("windows") if capture.pooled and capture.long is not None else None
    block_windows = None
    if token_windows and any(token_windows[n] for n in layers if n < len(token_windows)):
        sliding = [str(n) for n in layers if n < len(token_windows) and token_windows[n]]
        notes.append(f"layers {', '.join(sliding)}: a sliding window of {max(token_windows)} tokens (blocks of keys "
                     f"wholly beyond it are blank)")
        block_windows = [int(token_windows[n]) if n < len(token_windows) else 0 for n in layers]
    if capture.sinks:
        kept = float(alpha.sum(-1).mean())
        notes.append(f"sink logits: each head's sink takes part of every row (rows keep {kept:.2f} of their weight "
                     f"on average)")
    split = generated_split(capture)
    picture = None
    if capture.grid is not None and capture.image is not None:  # a vision capture: its picture, as a PNG
        import io

        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(capture.image).save(buffer, format="PNG")
        picture = {"png": base64.b64encode(buffer.getvalue()).decode("ascii"), "grid": list(capture.grid),
                   "start": capture.grid_start, "patch": int(capture.meta.get("image_patch", 14))}
    return {
        "name": name, "title": PART_TITLES.get(name, "self-attention"),
        "layers": [int(n) for n in layers], "heads": int(capture.n_heads),
        "rows": [_label(t) for t in capture.tokens], "cols": [_label(t) for t in capture.key_tokens],
        "rowSpecial": [bool(s) for s in capture.special], "colSpecial": [bool(s) for s in capture.key_special],
        "causal": future is not None, "windows": shown_windows, "rowSplit": split,
        "colSplit": split if capture.square else None,
        "rowAxis": "target" if name in ("decoder", "cross") else "query", "colAxis":
            "source" if name in ("encoder", "cross") else "key",
        "notes": notes, "bits": bits, "scale": scale, "alpha": payload, "picture": picture,
        "frames": capture.frames or None,  # a speech model's part over the sound: its frames with sound
        "blockWindows": block_windows,  # a pooled capture's windows in tokens, and its blocks' first tokens
        "edges": [int(e) for e in capture.long.edges] if block_windows is not None and capture.long else None,
    }


def contribution_section(scores: np.ndarray, rollout: np.ndarray, alpha_rollout: np.ndarray, method: str,
                         threshold: float, token: int) -> dict:
    """The contributions panel's data: each layer's contributions (L, T, T), rows summing to 1, quantised to 16
    bits per layer like α; the contribution rollout and α's rollout (T, T) each, side by side; the method's
    name, the first threshold for edges and the token chosen first (the page works out the strongest paths
    into any token it is asked for, exactly as metrics.strongest_paths does)."""
    L, T, _ = scores.shape
    payload, scale = _quantise(np.asarray(scores, np.float32)[:, None], 16)
    rolled, rolled_scale = _quantise(np.stack([rollout, alpha_rollout]).astype(np.float32)[:, None], 16)
    return {"method": method, "layers": int(L), "tokens": int(T), "threshold": float(threshold),
            "token": int(token), "scale": [row[0] for row in scale], "scores": payload,
            "rolloutScale": [row[0] for row in rolled_scale], "rollouts": rolled}


def patch_section(patching) -> dict:
    """The patching panel's data (an attnviz.Patching): each head's restored share (L, H), the attention output
    and residual stream by layer and aligned position (L, A), each head by position where it was patched so,
    the aligned pairs and their labels, the top heads, the metric and the scale's edge (the static picture's)."""
    def flat(values) -> list[float]:
        finite = np.nan_to_num(np.asarray(values, np.float64), posinf=1e9, neginf=-1e9)
        return [round(float(v), 6) for v in finite.ravel()]

    L, H = patching.heads.shape
    values = [patching.heads, patching.attention, patching.residual]
    edge = max(1.0, max(float(np.abs(np.nan_to_num(v)).max()) for v in values))
    return {"L": int(L), "H": int(H), "A": len(patching.pairs), "heads": flat(patching.heads),
            "attention": flat(patching.attention), "residual": flat(patching.residual),
            "headPositions": None if patching.head_positions is None else flat(patching.head_positions),
            "pairs": [[int(i), int(k)] for i, k in patching.pairs], "labels": [_label(t) for t in patching.labels()],
            "top": patching.top(), "edge": edge, "direction": patching.direction,
            "metric": visible(patching.metric) + (f" of {_label(patching.answer)!r} against {_label(patching.other)!r}"
                                                  if patching.answer or patching.other else ""),
            "cleanDiff": float(patching.clean_diff), "corruptDiff": float(patching.corrupt_diff)}


def viewer_data(whole: Capture | Parts | Sequence[tuple[str, Capture]], *, layers: Sequence[int] | None = None,
                precision: str = "auto", command: str | None = None, contributions: dict | None = None,
                patching: dict | None = None) -> dict:
    """Everything the page shows, as plain JSON-able data; `contributions` (contribution_section), the
    contributions panel beside the views of α; `patching` (patch_section), the patching panel. `whole` may
    also be captures with their titles ((title, Capture), …: two prompts), one part each."""
    titles: dict[str, str] = {}
    if isinstance(whole, (list, tuple)):
        captures = [(f"prompt{n}", capture) for n, (_, capture) in enumerate(whole)]
        titles = {f"prompt{n}": title for n, (title, _) in enumerate(whole)}
        meta = whole[0][1].meta
        text = " / ".join(str(c.meta.get("text", "")) for _, c in whole)
        model = whole[0][1].model
    elif isinstance(whole, Parts):
        captures = [(name, whole.part(name)) for name in whole.names]
        meta = whole.meta
        text = f"{meta.get('source_text', '')} → {meta.get('target_text', '')}"
        model = whole.model
    else:
        assert isinstance(whole, Capture)
        captures = [("", whole)]
        meta = whole.meta
        text = str(meta.get("text") or " ".join(whole.tokens))
        model = whole.model
    cells = 0
    chosen = {}
    for name, capture in captures:
        chosen[name] = (list(layers) if layers is not None and (not name or name in titles)
                        else list(range(capture.n_layers)))
        cells += len(chosen[name]) * capture.n_heads * capture.n_tokens * capture.n_keys
    bits = _bits(cells, precision)
    if cells * bits / 8 * 4 / 3 > MAX_PAGE_BYTES:
        raise InputError(f"the page would hold {cells:,} weights, more than {MAX_PAGE_BYTES >> 20} MiB; choose fewer "
                         f"layers ({arg('layers')}), or pool the input ({arg('stream')}, {arg('pool', '128')})")
    return {
        "text": visible(repair_unicode(text)), "model": visible(repair_unicode(model)),
        "shortModel": visible(repair_unicode(short_model(model))),
        "version": __version__, "command": visible(repair_unicode(command or made_by())),
        "dtype": visible(str(meta.get("dtype", ""))), "bits": bits,
        "sections": [_titled(section_data(capture, name, bits, chosen[name]), titles.get(name))
                     for name, capture in captures],
        "contributions": contributions, "patching": patching,
        "sound": sound_section(whole, [name for name, _ in captures]) if isinstance(whole, Parts) else None,
    }


def sound_section(parts: Parts, names: list[str]) -> dict | None:
    """A capture of sound: the sound as a WAV the page plays (16-bit, 16 kHz), its log-mel spectrogram as a
    PNG (magma, low bins at the bottom), the frames with sound, and which section is the cross-attention (the
    page highlights the frames of the step that wrote the chosen token)."""
    if "cross" not in parts.captures or parts.part("cross").mel is None:
        return None
    import io

    from matplotlib import colormaps
    from PIL import Image

    from attnviz.data.sound import wav_bytes

    cross = parts.part("cross")
    assert cross.sound is not None and cross.mel is not None
    mel = cross.mel[::-1]  # low frequencies at the bottom
    low, high = float(mel.min()), float(mel.max())
    rgb = (colormaps["magma"]((mel - low) / max(high - low, 1e-9))[..., :3] * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return {"wav": base64.b64encode(wav_bytes(cross.sound)).decode("ascii"),
            "mel": base64.b64encode(buffer.getvalue()).decode("ascii"), "frames": cross.frames,
            "frameSeconds": cross.frame_seconds, "seconds": float(cross.meta.get("audio_seconds", 0.0)),
            "cross": names.index("cross"), "first": max(int(parts.meta.get("prompt_tokens", 1)) - 1, 0),
            "name": visible(str(parts.meta.get("audio_name", ""))),
            "last": "(next)" if parts.meta.get("stopped") == "max_new_tokens" else "(end)"}


def _titled(section: dict, title: str | None) -> dict:
    if title is not None:
        section["title"] = visible(title)
    return section


def made_by() -> str:
    """The command line that is running, as a user would type it."""
    return "attnviz " + shlex.join(sys.argv[1:])


_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; media-src data:; img-src data:")
CSP_WITH_IMAGES = CSP + " 'self'"  # the export's index: the view, and the gallery's own image files


def _json_for_script(data: dict) -> str:
    """JSON that cannot change how the page parses: no `<`, `>` or `&` at all (so neither `</script>` nor
    `<!--` can appear), every character past ASCII escaped (U+2028 and U+2029 included); the same value for
    JSON.parse."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.translate(_SCRIPT_SAFE)


def viewer_fragment(data: dict) -> tuple[str, str, str]:
    """(style, body, script) of the viewer, to stand alone or to sit at the top of the export's gallery."""
    body = _asset("viewer.html")
    script = (f'<script type="application/json" id="attnviz-data">{_json_for_script(data)}</script>\n'
              f"<script>{_asset('viewer.js')}</script>")
    return _asset("viewer.css"), body, script


def viewer_html(data: dict) -> str:
    """The whole page."""
    style, body, script = viewer_fragment(data)
    title = escape(f"attnviz · {data['shortModel']} · {data['text'][:80]}")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
            f"<title>{title}</title>\n<style>{style}</style></head>\n<body>\n{body}\n{script}\n</body></html>\n")


# --- in a notebook: the page as a sandboxed frame that fits its height ----------------------------------

FRAME_HEIGHT_PX = 760  # the frame's height until the page inside says how tall it is (at most FRAME_MAX_PX)
FRAME_MAX_PX = 2000

# Beside the frame: resize it to the height its page posts (a number, from that frame's window only).
_FIT = ("<script>(function () {{ var f = document.getElementById('{id}'); if (!f) return;"
        " window.addEventListener('message', function (e) {{ if (e.source !== f.contentWindow || !e.data) return;"
        " var h = Number(e.data.attnvizHeight); if (h > 0 && h < {max}) f.style.height = Math.round(h) + 'px'; }});"
        " }})();</script>")


def framed(page: str) -> str:
    """A whole page (the viewer's) as a sandboxed frame that fits its height (inline_html)."""
    import uuid

    frame = f"attnviz-view-{uuid.uuid4().hex[:12]}"
    return (f'<iframe id="{frame}" class="attnviz-view" srcdoc="{html.escape(page, quote=True)}" '
            f'sandbox="allow-scripts" style="width: 100%; height: {FRAME_HEIGHT_PX}px; border: 0" '
            f'title="attnviz view"></iframe>' + _FIT.format(id=frame, max=FRAME_MAX_PX))
