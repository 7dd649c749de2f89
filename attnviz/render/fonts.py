"""Fonts for token labels in any script: matplotlib's font fallback over the installed fonts, then the fonts
that come from the package index (the `cjk` extra: Noto Sans CJK, for Hangul, kana and Han with no system
font), and one warning naming characters that no font can draw."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from attnviz.errors import warn

# matplotlib is imported inside the functions that draw, so that reading a capture and --help never load it.

BASE_FAMILY = "DejaVu Sans"
FONT_HINT = ("install a font that covers them: `pip install --no-deps mplfonts==0.0.11` (attnviz's cjk extra) or, "
             "on Debian/Ubuntu, `apt-get install fonts-noto-cjk` give Chinese, Japanese and Korean; "
             "`fonts-noto-core` most other scripts")
# Font files shipped inside packages from the index: (package, file inside it). Registered with matplotlib's
# font manager by path when a label needs them (in memory: no system change, no cache rebuilt).
PACKAGED_FONTS = (("mplfonts", "fonts/NotoSansCJKsc-Regular.otf"),)
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
    """(family name, file) of every installed font, preferred fallbacks first, one file per family. A file
    matplotlib's cache lists but that is gone (a font removed, a virtual environment deleted) is passed over,
    so that a family still drawn by another file keeps it."""
    from matplotlib import font_manager

    seen: dict[str, str] = {}
    for entry in font_manager.fontManager.ttflist:
        # "Last Resort" draws a placeholder box for every character: that is what we are avoiding
        if (entry.style == "normal" and entry.name not in seen and not entry.name.startswith("Last Resort")
                and os.path.isfile(entry.fname)):
            seen[entry.name] = entry.fname
    rank = lambda item: next((i for i, p in enumerate(_PREFERRED) if item[0].startswith(p)), len(_PREFERRED))
    return tuple(sorted(seen.items(), key=lambda item: (rank(item), item[0])))


_warned: set[frozenset[str]] = set()
_refreshed = False
_packaged_added = False


def packaged_fonts() -> list[str]:
    """The PACKAGED_FONTS files that are installed, found without importing their packages."""
    import importlib.util

    found = []
    for package, inner in PACKAGED_FONTS:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            path = Path(folder) / inner
            if path.is_file():
                found.append(str(path))
                break
    return found


def add_packaged_fonts() -> bool:
    """Register the installed PACKAGED_FONTS with matplotlib, once per process. True when one was added."""
    global _packaged_added
    from matplotlib import font_manager

    if _packaged_added:
        return False
    _packaged_added = True
    manager = font_manager.fontManager
    # entries whose file is gone (a cache written by an older attnviz in a since-deleted environment listed its
    # packaged font) are forgotten in memory: matplotlib would otherwise pick one, find it missing and rebuild
    # its cache from the system alone, dropping the fonts registered here
    present = [entry for entry in manager.ttflist if os.path.isfile(entry.fname)]
    if len(present) < len(manager.ttflist):
        manager.ttflist = present
    known = {entry.fname for entry in manager.ttflist}
    added = False
    for path in packaged_fonts():
        if path in known:
            continue
        try:
            manager.addfont(path)
        except (OSError, RuntimeError, ValueError):  # a damaged font file: skip it
            continue
        added = True
    if added:
        _installed.cache_clear()
    return added


def refresh_if_new_fonts() -> bool:
    """Make matplotlib see fonts installed after its font cache was written (`apt-get install fonts-noto-cjk`
    today, attnviz tomorrow): when the system has font files the cache does not list, the cache is built
    again, once per process. True when it was."""
    global _refreshed
    from matplotlib import font_manager

    if _refreshed:
        return False
    _refreshed = True
    known = {entry.fname for entry in font_manager.fontManager.ttflist}
    try:
        on_disk = set(font_manager.findSystemFonts())
    except (OSError, RuntimeError):  # pragma: no cover - an unreadable font folder
        return False
    new = {path for path in on_disk if path not in known and path.lower().endswith((".ttf", ".otf", ".ttc"))}
    if not new:
        return False
    import matplotlib

    for path in sorted(new):
        try:
            font_manager.fontManager.addfont(path)
        except (OSError, RuntimeError, ValueError):  # a damaged font file: skip it
            continue
    # remember them, so the next run does not look again; the packaged fonts stay out of the cache: they were
    # registered for this process only, from a path inside one environment that may be deleted
    manager = font_manager.fontManager
    whole, packaged = manager.ttflist, set(packaged_fonts())
    manager.ttflist = [entry for entry in whole if entry.fname not in packaged]
    try:
        font_manager.json_dump(manager, Path(matplotlib.get_cachedir()) /
                               f"fontlist-v{font_manager.FontManager.__version__}.json")
    except OSError:  # pragma: no cover - a read-only cache folder
        pass
    finally:
        manager.ttflist = whole
    _installed.cache_clear()
    return True


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
    if missing and add_packaged_fonts():  # the fonts from the package index (the cjk extra)
        return families_for(text)
    if missing and refresh_if_new_fonts():  # a font installed since matplotlib last looked may have them
        return families_for(text)
    if missing:
        chars = frozenset(chr(c) for c in missing)
        if chars not in _warned:
            _warned.add(chars)
            shown = "".join(sorted(chars))[:20]
            warn(f"no installed font has glyphs for {shown!r}; {FONT_HINT}")
    return families
