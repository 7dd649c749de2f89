"""What a head does, tested by taking it away (head ablation).

Head h of layer l adds z_h · W_O^h to its attention block's output, where z_h (T, d) is the head's α·V and
W_O^h the head's slice of the output projection's input columns. Removing the head replaces z_h, where the
output projection receives it, by 0 (zero ablation) or by its mean over positions (mean ablation: over the
text's tokens, or over the texts of a corpus file), with a forward pre-hook on the output projection: the same
seam for every family with an adapter (engine/scratch/adapters.py names each family's W_O).

    clean run (each W_O's input recorded: the means) -> the run with the heads removed (α kept)
        -> causal LM: next-token distributions (KL per position, top token before and after)
           encoder: the sentence embedding (mean over tokens, as sentence-transformers pools it) and each
           token's final hidden state
        -> Δα of every later layer

`importance` removes every head alone, batched: one forward pass grows its batch layer by layer (at layer l
it appends one copy of the clean hidden state per head of l, each with that head removed), so the layers
below l run once instead of once per head, and the copies run together. Beside it the gradient estimate of
Michel et al. 2019: a gate ξ_h on each head's z_h, |∂loss/∂ξ_h| at ξ = 1 (a causal LM's next-token loss), or
for an encoder ‖∂ê/∂ξ_h‖, the first-order size of the normalised embedding's change (its exact Jacobian).

The second mechanism the tests hold the hook to: `weights_removed` edits the output projection's weights (the
head's columns zeroed; for mean ablation W_O^h·m_h moved into the bias).

One job a module: seam (where heads are removed), runs (one text through the model), removing (ablate),
ranking (importance), detectors (detect).
"""

from __future__ import annotations

from attnviz.engine.ablation.seam import (ATTENTION_BYTES, copies_that_fit, Edit, editing, every_head, MODES,
                                          OUTPUT_BYTES, recording, removal, Site, site, weights_removed)
from attnviz.engine.ablation.runs import alpha_of, embedding, head_means, is_causal_lm, outputs_of, run_model
from attnviz.engine.ablation.removing import ablate, AblationRun, kl_rows, next_token_loss
from attnviz.engine.ablation.ranking import gradient_scores, ImportanceRun, importance, JACOBIAN_BATCH, removal_outputs
from attnviz.engine.ablation.detectors import (Causal, causal_test, DetectionRun, detection, repeat_loss, Repeated,
                                               repeated_sequence)

__all__ = [
    "ablate", "AblationRun", "alpha_of", "ATTENTION_BYTES", "Causal", "causal_test", "copies_that_fit", "DetectionRun",
    "detection", "Edit", "editing", "embedding", "every_head", "gradient_scores", "head_means", "ImportanceRun",
    "importance", "is_causal_lm", "JACOBIAN_BATCH", "kl_rows", "MODES", "next_token_loss", "OUTPUT_BYTES",
    "outputs_of", "recording", "removal", "removal_outputs", "repeat_loss", "Repeated", "repeated_sequence",
    "run_model", "Site", "site", "weights_removed",
]
