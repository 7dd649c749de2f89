"""How the `attnviz` process ends. Once torch and transformers are loaded, Python's own teardown (freeing every
module, torch's and sympy's objects one by one) takes about 0.9 s on a 2-core machine, longer than a forward pass
of MiniLM: a fifth of what `attnviz capture` took with it. By then attnviz has written and closed its files,
so the process ends as Python's does, less that teardown: the exit handlers run (Ray's shutdown, logging's, a
coverage tool's), the standard streams are flushed, then os._exit with the command's exit status.

The ordinary ending is kept whenever it could matter: a command that never loaded torch (its teardown is
cheap), a tracer or profiler attached (`python -m cProfile`, a debugger: they write after the program returns),
or Python's development mode, or an exit status that is not a number. `ATTNVIZ_FULL_EXIT=1` (any value but
0, false, no, off) keeps it always. Other threads are waited for first, as Python waits for them (idle worker
pools are shut down by their own exit hooks).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

FULL_EXIT_ENV = "ATTNVIZ_FULL_EXIT"
HEAVY = ("torch", "transformers")  # what makes Python's teardown slow


def quick_exit_allowed(code: object) -> bool:
    """Whether the process may end without Python's teardown (see the module's docstring)."""
    if os.environ.get(FULL_EXIT_ENV, "").strip().lower() not in ("", "0", "false", "no", "off"):
        return False  # any other value asks for the ordinary ending (the safe one)
    if not (code is None or (isinstance(code, int) and not isinstance(code, bool))):
        return False
    if not any(sys.modules.get(name) is not None for name in HEAVY):
        return False
    return sys.gettrace() is None and sys.getprofile() is None and not sys.flags.dev_mode


def finish(code: object) -> None:
    """End the process with `code` (what sys.exit was given): without Python's teardown where that is safe,
    else as Python ends it."""
    if not quick_exit_allowed(code):
        raise SystemExit(code)
    # what Python does first at exit, in its order: wait for other threads (after the hooks that stop idle
    # worker pools), then run the exit handlers (their errors are printed by atexit itself)
    wait_for_threads = getattr(threading, "_shutdown", None)
    if wait_for_threads is None:  # pragma: no cover - every CPython from 3.8 to 3.14 has it
        raise SystemExit(code)
    wait_for_threads()
    atexit._run_exitfuncs()
    status = int(code or 0)  # type: ignore[call-overload]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # the reader left (`attnviz … --json | head`): what was written stays
            pass
        except (OSError, ValueError, AttributeError):  # a closed or replaced stream: Python would say 120
            status = status or 120
    os._exit(status)
