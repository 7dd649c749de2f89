"""Convert every installed offline model into attnviz's cache once, two at a time, before the tests run: the tests of
each model then load it at once instead of converting it (or waiting for another test worker to), and a second run
finds them all converted (a check of sizes and times, under a second). A model not installed is left out; one that
cannot be converted is said in one line and left to its tests to report.

    python scripts/prepare_models.py          # what scripts/test.sh runs first
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed


def convert(alias: str) -> tuple[str, float, str]:
    """Convert one offline model (by its first alias) into the cache: (alias, seconds, "" or why it failed)."""
    import warnings

    from attnviz.engine import offline
    from attnviz.engine.offline.build import folder_for

    start = time.perf_counter()
    model = offline.find(alias)
    assert model is not None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            folder_for(model)
    except Exception as exc:  # one line; the model's own tests say the rest
        return alias, time.perf_counter() - start, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return alias, time.perf_counter() - start, ""


def main() -> int:
    from attnviz.engine import offline
    from attnviz.engine.offline.build import pending

    waiting = [m.aliases[0] for m in offline.MODELS if pending(m.aliases[0])]  # installed and not yet converted
    if not waiting:
        return 0
    print(f"prepare: converting {len(waiting)} offline model(s) into attnviz's cache, once: {', '.join(waiting)}",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    largest_first = sorted(waiting, key=lambda a: -sum(
        path.stat().st_size for path in _sources(a)))  # the longest conversions start first
    with ProcessPoolExecutor(max_workers=2) as pool:
        for done in as_completed([pool.submit(convert, alias) for alias in largest_first]):
            alias, seconds, failed = done.result()
            print(f"prepare: {alias} {'not converted: ' + failed if failed else f'converted in {seconds:.0f} s'}",
                  file=sys.stderr, flush=True)
    print(f"prepare: done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return 0


def _sources(alias: str) -> list:
    from attnviz.engine import offline

    model = offline.find(alias)
    try:
        return offline.sources(model) if model is not None else []
    except Exception:  # sized as nothing: its conversion says what is wrong
        return []


if __name__ == "__main__":
    sys.exit(main())
