"""What a head does, tested by removing it: ablate (named heads), importance (every head alone, ranked), detect
(previous-token, duplicate-token and induction heads, then the causal test). The torch side of each is
attnviz.engine.ablation (removing, ranking, detectors)."""
