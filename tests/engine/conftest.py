"""Fixtures of the long path's tests (test_lean_*.py)."""

from __future__ import annotations

import pytest

import attnviz
from helpers import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A loaded tiny model of a kind, made once per module: causal ones with 1,200 positions and their head (a
    decoder saved without its head gets a random one at each load, so it is loaded once), BERT as it is."""
    made: dict[str, object] = {}

    def get(kind: str):
        if kind not in made:
            causal = kind != "bert"
            folder = build_tiny_model(kind, tmp_path_factory.mktemp(kind) / kind, positions=1200 if causal else None,
                                      lm=kind in ("gpt2", "llama"))
            made[kind] = attnviz.load_model(str(folder), lm_head=causal)
        return made[kind]
    return get
