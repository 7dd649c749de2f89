"""The independent second producer: α and what the teaching commands show, recomputed from a model's own
weights by code that does not call the model's attention (formula, adapters), and the computations built on
it: verify, steps, scaling, positions, norms."""
