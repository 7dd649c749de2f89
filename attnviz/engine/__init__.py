"""The torch side: the only package that imports torch and transformers. Loading a model (models.py), the
one capture entry that chooses the path (capturing.py), the forward pass (forward.py), streaming (stream.py),
generation (generation.py), encoder-decoders (seq2seq.py), the hooks on attention modules (hooks.py),
the from-scratch producer (scratch/), what tokens and heads contribute (attribution/), head removal
(ablation/), activation patching (patching.py), mechanisms (mechanisms/), corpora (corpora/), costs
(costs.py) and the offline models (offline/).
"""
