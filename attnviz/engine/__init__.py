"""The torch side: the only package that imports torch and transformers. Loading a model (loading.py), the
one capture entry that chooses the path (entry.py), the forward pass (forward.py), streaming (stream.py),
generation (generate.py), encoder-decoders (seq2seq.py), the hooks on attention modules (hooks.py),
the from-scratch producer (fromscratch/), head removal (ablation/) and the offline models (offline/).
"""
