"""Fonts for token labels in any script: matplotlib's font fallback over the installed fonts,
and one warning naming characters that no installed font can draw."""

from __future__ import annotations

import functools
import warnings

from attnviz.errors import AttnvizWarning

BASE_FAMILY = "DejaVu Sans"
FONT_HINT = ("install a font that covers them; on Debian/Ubuntu `apt-get install fonts-noto-cjk` "
             "gives Chinese, Japanese and Korean, `fonts-noto-core` most other scripts")
_PREFERRED = ("Noto Sans CJK", "Noto Sans", "Noto Serif CJK", "Nanum", "WenQuanYi", "Droid Sans Fallback")


@functools.cache
def _charmap(path: str) -> frozenset[int]:
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError):  # unreadable font file
        return frozenset()


@functools.lru_cache(maxsize=1)
def _installed() -> tuple[tuple[str, str], ...]:
    """(family name, file) of every installed font, preferred fallbacks first, one file per family."""
    from matplotlib import font_manager

    seen: dict[str, str] = {}
    for entry in font_manager.fontManager.ttflist:
        # "Last Resort" draws a placeholder box for every character: that is what we are avoiding
        if entry.style == "normal" and entry.name not in seen and not entry.name.startswith("Last Resort"):
            seen[entry.name] = entry.fname
    rank = lambda item: next((i for i, p in enumerate(_PREFERRED) if item[0].startswith(p)), len(_PREFERRED))
    return tuple(sorted(seen.items(), key=lambda item: (rank(item), item[0])))


_warned: set[frozenset[str]] = set()


def families_for(text: str) -> list[str]:
    """Font families (for rcParams["font.family"]) that together draw every character of `text`.
    Warns once per set of characters no installed font has."""
    from matplotlib import font_manager

    needed = {ord(c) for c in text if not c.isspace() and c.isprintable()}
    families = [BASE_FAMILY]
    missing = needed - _charmap(font_manager.findfont(BASE_FAMILY))
    for name, path in _installed() if missing else ():
        covered = missing & _charmap(path)
        if covered:
            families.append(name)
            missing -= covered
        if not missing:
            break
    if missing:
        chars = frozenset(chr(c) for c in missing)
        if chars not in _warned:
            _warned.add(chars)
            shown = "".join(sorted(chars))[:20]
            warnings.warn(f"no installed font has glyphs for {shown!r}; {FONT_HINT}", AttnvizWarning, stacklevel=3)
    return families
