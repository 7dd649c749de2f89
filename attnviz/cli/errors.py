"""Library errors as one line on stderr and their exit code (1, or 2 for an option that does not fit the
data); warnings one line each; Ctrl-C and SIGTERM a clean exit (130, 143) after cleanup.
"""

from __future__ import annotations

import functools
import signal
import warnings
from collections.abc import Callable

import typer

from attnviz.errors import AttnvizError, AttnvizWarning, spell
from attnviz.cli.output import error_line, flag

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


TERMINATED_EXIT = 143  # 128 + SIGTERM
INTERRUPTED_EXIT = 130  # 128 + SIGINT


# --- errors and signals ------------------------------------------------------------------------------


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so cleanup (temporary files, worker processes) runs."""


_received: dict[str, int | None] = {"signal": None}  # the last SIGINT or SIGTERM of this run


def _on_sigterm(signum, frame) -> None:
    _received["signal"] = signal.SIGTERM
    raise Terminated()


def _on_sigint(signum, frame) -> None:
    _received["signal"] = signal.SIGINT
    raise KeyboardInterrupt


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    template = message.args[0] if isinstance(message, Warning) and message.args else message  # arguments marked
    error_line(spell(str(template), flag), "Warning" if issubclass(category, AttnvizWarning) else category.__name__)


def cli_errors(func: Callable) -> Callable:
    """Turn library errors into one line on stderr and their exit code; warnings into one line each;
    Ctrl-C and SIGTERM into a clean exit (130, 143) after cleanup."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        previous = warnings.showwarning
        warnings.showwarning = _print_warning
        main = _main_thread()
        old_term = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
        old_int = signal.signal(signal.SIGINT, _on_sigint) if main else None
        _received["signal"] = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default", AttnvizWarning)
                # attnviz names missing glyphs once itself; matplotlib would repeat it for every label
                warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
                warnings.filterwarnings("ignore", message=r".*(missing from font|not found\. Falling back)")
                import logging

                logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
                return func(*args, **kwargs)
        except AttnvizError as exc:
            error_line(exc.spelled(flag))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            error_line("interrupted; nothing half-written was left")
            raise typer.Exit(INTERRUPTED_EXIT) from None
        except Terminated:
            error_line("terminated; nothing half-written was left")
            raise typer.Exit(TERMINATED_EXIT) from None
        except Exception:
            # A signal that lands inside a C extension (matplotlib's, numpy's) can surface there as another
            # error (pybind11 reports an interrupted argument conversion as a TypeError): it is still the signal.
            if _received["signal"] == signal.SIGINT:
                error_line("interrupted; nothing half-written was left")
                raise typer.Exit(INTERRUPTED_EXIT) from None
            if _received["signal"] == signal.SIGTERM:
                error_line("terminated; nothing half-written was left")
                raise typer.Exit(TERMINATED_EXIT) from None
            raise
        finally:
            warnings.showwarning = previous
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            if old_int is not None:
                signal.signal(signal.SIGINT, old_int)

    return wrapper


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
