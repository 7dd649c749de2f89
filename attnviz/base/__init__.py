"""The bottom layer: pure-Python pieces every other layer uses and that import nothing of attnviz above them —
argument checks, safe files and bounded .npz reading, JSON/CSV records, the one selection type, sizes, plain
text for people, token labels, block pooling, devices, the views registry and a fold cut over the cores."""
