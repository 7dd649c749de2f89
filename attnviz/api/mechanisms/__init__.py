"""What happens inside a model: massive activations and the sinks they make (massive.py), retrieval heads
(retrieval.py), QK and OV circuits from the weights (circuits.py). The torch side of each is
attnviz.engine.mechanisms."""
