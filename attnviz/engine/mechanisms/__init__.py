"""Mechanisms inside a model, on the torch side: massive activations (massive.py), retrieval heads
(retrieval.py) and QK/OV circuits read from the weights (circuits.py)."""
