"""What tokens and heads contribute: contributions (ALTI, value zeroing) and logit-attr (direct logit attribution,
ALTI-Logit). The torch side of each is attnviz.engine.attribution."""
