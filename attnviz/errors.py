"""Errors a user can cause. The CLI prints their message as one line and exits with `exit_code`:
1 for what went wrong with an input or output, 2 for a malformed or out-of-range option (a usage error)."""


class AttnvizError(Exception):
    """Base class: the message says what went wrong and what to do."""

    exit_code = 1


class InputError(AttnvizError):
    """Bad text or an input that cannot be processed (empty, too long with --no-truncate, over a limit)."""


class UsageError(AttnvizError):
    """An option value that is malformed or does not fit the data (exit code 2, like any usage error)."""

    exit_code = 2

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option  # "--layer", when known


class SelectionError(UsageError):
    """A layer, head or token selection that is malformed, empty, reversed or out of range."""


class ColormapError(UsageError):
    """A colormap name matplotlib does not know."""


class ModelLoadError(AttnvizError):
    """The model could not be found, downloaded or loaded."""


class AttentionCheckError(AttnvizError):
    """The model returned attention weights that fail the sanity checks."""


class CaptureFormatError(AttnvizError):
    """A capture file that is corrupt, foreign, over the size limits or of an unknown version."""


class CaptureMismatchError(AttnvizError):
    """Two captures that cannot be compared (different shapes or tokens)."""


class OutputError(AttnvizError):
    """An output path that cannot be written (permission, unknown suffix, existing folder, full disk)."""


class UnsupportedArchitectureError(AttnvizError):
    """The from-scratch path has no adapter for this architecture."""


class AttnvizWarning(UserWarning):
    """Something the user should know (truncation, missing glyphs); shown as one line on stderr."""
