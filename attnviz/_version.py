"""The version of attnviz, in one place. A leaf: nothing here imports attnviz."""

__version__ = "0.1.0"
