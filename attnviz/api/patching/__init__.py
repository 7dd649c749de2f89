"""Which heads carry the difference between two prompts: activation patching (activation.py) and path patching
(paths.py). The torch side is attnviz.engine.patching."""
