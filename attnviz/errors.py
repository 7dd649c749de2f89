"""Errors a user can cause. The CLI prints their message as one line and exits 1."""


class AttnvizError(Exception):
    """Base class: the message says what went wrong and what to do."""


class InputError(AttnvizError):
    """Bad text or an input that cannot be processed (empty, too long with --no-truncate)."""


class SelectionError(AttnvizError):
    """A layer, head or token index out of range, or an unparsable selection."""


class ModelLoadError(AttnvizError):
    """The model could not be found, downloaded or loaded."""


class AttentionCheckError(AttnvizError):
    """The model returned attention weights that fail the sanity checks."""


class CaptureFormatError(AttnvizError):
    """A capture file that is corrupt, foreign or of an unknown version."""


class OutputError(AttnvizError):
    """An output path that cannot be written (permission, unknown suffix, existing folder)."""


class UnsupportedArchitectureError(AttnvizError):
    """The from-scratch path has no adapter for this architecture."""


class AttnvizWarning(UserWarning):
    """Something the user should know (truncation, missing glyphs); shown as one line on stderr."""
