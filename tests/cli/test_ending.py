"""How the `attnviz` process ends (attnviz.cli.ending): without Python's teardown once torch is loaded, yet with
the exit handlers run, the streams flushed, other threads waited for and the exit status kept; the ordinary
ending under a tracer, in development mode, for a status that is not a number, for a command that never loaded
torch, and with ATTNVIZ_FULL_EXIT=1.

Each probe runs in its own process: an object whose __del__ writes "teardown" (it runs only in Python's
teardown; not under a trace function, where Python's teardown stays silent, so there the probe notes that
finish handed the ending back to Python) and an exit handler that writes "atexit".
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import run

MARKS = """
import atexit, sys
class Mark:
    def __del__(self):
        sys.stderr.write("teardown\\n")
mark = Mark()
atexit.register(lambda: sys.stderr.write("atexit\\n"))
"""


def probe(body: str, **env: str) -> subprocess.CompletedProcess:
    code = MARKS + textwrap.dedent(body)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout kept in a buffer, as usual
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**base, "NO_COLOR": "1", **env})


def ending(result: subprocess.CompletedProcess) -> tuple[bool, bool]:
    """(the exit handlers ran, Python's teardown ran)."""
    lines = result.stderr.splitlines()
    return "atexit" in lines, "teardown" in lines


@pytest.mark.slow
def test_a_command_that_loaded_torch_ends_without_teardown_and_its_file_is_whole(tmp_path):
    """`attnviz capture` as a process: exit 0, the exit handlers ran, the teardown did not, and the capture it
    wrote is whole (the α of the same capture made in this process, within float32 rounding of a rerun)."""
    from attnviz.data.capture import Capture

    out = tmp_path / "x.npz"
    done = probe(f"""
        sys.argv = ["attnviz", "capture", "The cat sat on the mat", "-o", {str(out)!r}]
        from attnviz.cli import main
        main()
        """)
    assert done.returncode == 0, done.stderr
    assert ending(done) == (True, False) and str(out) in done.stdout
    again = tmp_path / "y.npz"
    assert run("capture", "The cat sat on the mat", "-o", again).exit_code == 0
    a, b = Capture.load(out), Capture.load(again)
    assert a.tokens == b.tokens and np.allclose(a.attentions, b.attentions, rtol=0, atol=1e-6)
    full = probe(f"""
        sys.argv = ["attnviz", "capture", "The cat sat on the mat", "-o", {str(tmp_path / "z.npz")!r}]
        from attnviz.cli import main
        main()
        """, ATTNVIZ_FULL_EXIT="1")
    assert full.returncode == 0 and ending(full) == (True, True)


def test_a_command_that_never_loaded_torch_ends_as_python_does():
    done = probe("""
        sys.argv = ["attnviz", "explain", "entropy"]
        from attnviz.cli import main
        main()
        """)
    assert done.returncode == 0 and "entropy" in done.stdout.lower() and ending(done) == (True, True)


@pytest.mark.parametrize("code, status, env", [(0, 0, {}), (None, 0, {}), (1, 1, {}), (2, 2, {}), (3, 3, {}),
                                               (0, 0, {"ATTNVIZ_FULL_EXIT": "0"}),
                                               (0, 0, {"ATTNVIZ_FULL_EXIT": "false"})])
def test_the_exit_status_is_kept_and_the_streams_flushed(code, status, env):
    done = probe(f"""
        import torch
        print("written before the end", end="")
        sys.stderr.write("said before the end\\n")
        from attnviz.cli.ending import finish
        finish({code!r})
        """, **env)
    assert done.returncode == status and done.stdout == "written before the end"
    assert "said before the end" in done.stderr and ending(done) == (True, False)


@pytest.mark.parametrize("setup, env", [
    ("sys.settrace(lambda *a: None)", {}),  # a debugger or coverage tool
    ("sys.setprofile(lambda *a: None)", {}),  # python -m cProfile
    ("", {"PYTHONDEVMODE": "1"}),
    ("", {"ATTNVIZ_FULL_EXIT": "1"}),
    ("", {"ATTNVIZ_FULL_EXIT": "yes please"}),  # a value not understood: the safe ending
])
def test_the_ordinary_ending_is_kept_where_it_could_matter(setup, env):
    done = probe(f"""
        import torch
        {setup}
        from attnviz.cli.ending import finish
        try:
            finish(4)
        except SystemExit:
            sys.stderr.write("ordinary\\n")  # finish handed the ending back to Python
            raise
        """, **env)
    assert done.returncode == 4 and "ordinary" in done.stderr.splitlines() and ending(done)[0]


def test_an_exit_message_ends_as_python_does():
    done = probe("""
        import torch
        from attnviz.cli.ending import finish
        finish("a message, not a number")
        """)
    assert done.returncode == 1 and "a message, not a number" in done.stderr and ending(done) == (True, True)


def test_other_threads_are_waited_for_and_an_idle_pool_does_not_hold_the_exit(tmp_path):
    """A thread still writing when the command returns finishes its file (Python waits for it, so attnviz
    does); an idle worker pool (the statistics' threads) is shut down by its own exit hook."""
    out = tmp_path / "late.txt"
    done = probe(f"""
        import threading, time, torch
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(2)
        pool.submit(sum, [1, 2]).result()
        def late():
            time.sleep(1.0)
            with open({str(out)!r}, "w") as handle:
                handle.write("whole")
        threading.Thread(target=late).start()
        from attnviz.cli.ending import finish
        finish(0)
        """)
    assert done.returncode == 0 and ending(done) == (True, False)
    assert out.read_text() == "whole"
