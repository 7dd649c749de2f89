"""What tokens and heads contribute, on the torch side: ALTI (alti.py), direct logit attribution and
ALTI-Logit (logits.py), value zeroing (zeroing.py)."""
