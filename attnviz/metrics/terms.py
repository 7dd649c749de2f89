"""The glossary behind : every metric, label and term with its definition.
"""

from __future__ import annotations




from collections.abc import Sequence

from attnviz.metrics.labels import LABELS, label_definitions
from attnviz.metrics.registry import METRICS


TERMS: dict[str, str] = {
    "alpha": "α, the attention weights: softmax(Q·Kᵀ/√d_k) with masked keys at −∞. Row i (a query) says how "
             "much token i looks at each key j; every row sums to 1.",
    "label": "the pattern label of a head, after Clark et al. 2019 and Kovaleva et al. 2019: the first of "
             + ", ".join(LABELS) + " whose test passes (see `attnviz explain <label>`).",
    "rollout": "attention rollout (Abnar & Zuidema 2020): per layer Â = rownorm(mean over heads of α + I), the "
               "identity standing for the residual stream, multiplied through the layers. Row i says how much "
               "of each input token reaches position i at the top.",
    "scale": "the colour scale: 0 to the largest weight shown, one scale for every panel of a picture; the "
             "legend and the colorbar give its end.",
    "entropy baseline": "ln T nats: the entropy of uniform attention over T keys. 0 is one-hot.",
    "causal": "decoder models (GPT-2, Llama) attend only to earlier tokens: α is lower-triangular and the "
              "future cells are drawn blank.",
    "special tokens": "[CLS], [SEP], <s>, </s>, … as the tokenizer's own special-token ids say; "
                      "--hide-special leaves them out of pictures (rows are not renormalised).",
    "part": "which attention of an encoder-decoder model (T5, BART, Marian) is shown (--part): encoder (source × "
            "source), decoder (target × target, causal) or cross (target rows × source columns).",
    "cross-attention": "in an encoder-decoder model, each target token's query against the encoder's output for "
                       "every source token: which source words a target word looks at. Rows sum to 1 over the "
                       "source; prev, self, next and dist compare positions of one sentence and are shown as –.",
    "generated": "tokens a causal model wrote (attnviz generate), after the prompt. Row t is what token t "
                 "attends to as it is read back in to choose the next token; pictures draw a line where the "
                 "prompt ends, and --rows generated keeps only those rows.",
    "layer": "one transformer block; layers are numbered from 0 at the input (-1 is the last).",
    "head": "one attention head of a layer: its own Q, K, V projections and its own α.",
    "H": "in compare's panel summaries: the mean row entropy of that matrix, in nats (see entropy). For the panel "
         "'mean' that matrix is the heads' mean α, whose entropy is higher than attnviz entropy's number for the "
         "layer (the mean of each head's own entropy): two quantities, not one. Elsewhere H is the number of heads "
         "per layer, as in L × H.",
    "sp": "in compare's panel summaries: the mean mass on special tokens (see special tokens).",
    "d": "in compare's panel summaries: the mean distance |i − j| in tokens between a query and what it "
         "attends to (see dist).",
    "T": "the number of tokens of the input (a long input streamed into blocks still counts its tokens).",
    "d_k": "the size of one head's query and key vectors (hidden size ÷ heads): 32 for MiniLM and the "
           "multilingual model, 64 for SmolLM2 and BERT-base. The scores are divided by √d_k.",
    "√d_k": "the square root of d_k, the divisor of Q·Kᵀ: it keeps the scores' spread near 1 however large "
            "d_k is (attnviz scaling shows why).",
    "Q·Kᵀ": "the scores: each query vector dotted with each key vector, before scaling and the softmax.",
    "softmax": "softmax(x)_j = exp(x_j) / Σ_k exp(x_k): turns a row of scores into weights that are positive and "
               "sum to 1; masked keys (at −∞) get exactly 0.",
    "Q": "the queries: each token's hidden state times W_Q (plus its bias), one d_k vector per head. q is "
         "one row of Q.",
    "K": "the keys: each token's hidden state times W_K (plus its bias). k is one row of K.",
    "V": "the values: each token's hidden state times W_V (plus its bias); α·V is what the head outputs.",
    "α·V": "the head's output for each query: the weighted sum of the value vectors, weights α (out in steps).",
    "mask": "keys a query may not see get −∞ before the softmax, so weight 0: padding, for causal models "
            "every later token, and in a sliding-window layer every key beyond the window.",
    "sliding window": "a layer that lets query i see only the last w keys (i − j < w; Mistral, Gemma 2/3, "
                      "gpt-oss, Cohere 2 alternate such layers with full ones); ModernBERT's local layers see the "
                      "keys within ±w. The keys beyond are masked: blank in every picture, like a causal "
                      "model's future, and the legend names the window.",
    "soft-capping": "Gemma 2 squashes each scaled score s to c·tanh(s/c) before the mask and softmax (c = "
                    "attn_logit_softcapping, e.g. 50): no score beyond ±c, so no head can put all its weight on "
                    "one key by a huge score. attnviz steps shows the capped scores; verify writes it out.",
    "sink logit": "gpt-oss gives each head one learned logit that joins every row's softmax as an extra key and "
                  "is dropped after: a row's weights over the real keys then sum to less than 1 (the 'kept' "
                  "column). Head statistics use each row's shares of what it kept; pictures show α as it is "
                  "(rows fainter where the sink took more). Not the same as a sink token (see 'sink').",
    "query_pre_attn_scalar": "Gemma scales the scores by 1/√query_pre_attn_scalar instead of 1/√d_k.",
    "QK-norm": "Qwen3, Gemma 3 and OLMo 2 normalise Q and K (RMSNorm) before the scores: per head (Qwen3, Gemma 3) "
               "or over the whole projection (OLMo 2).",
    "entropy_tokens": "in corpus output: the token-weighted mean entropy, over every query row of every text "
                      "(long texts count more), beside entropy, the mean over texts.",
    "tok-w": "in corpus tables: token-weighted, a mean over every query row of every text rather than over texts.",
    "label_share": "in corpus output: the share of texts in which the head got its majority label.",
    "ablation": "removing a head (attnviz ablate): its output α·V, where the output projection W_O receives it, "
                "replaced by 0 (zero ablation) or by its mean over positions (mean ablation); checked against the "
                "same removal made by editing W_O's weights.",
    "KL": "in ablate and importance: KL(p_clean ‖ p_removed) = Σ_v p_clean(v) ln(p_clean(v) / p_removed(v)), in "
          "nats, between the next-token distributions without and with the heads removed; 0 means no change.",
    "effect": "in importance: what removing one head alone changes — a causal LM's mean KL over positions, or "
              "‖ê_removed − ê_clean‖ of an encoder's unit sentence embedding (√(2(1 − cos))). In logit-attr: a "
              "head's direct effect on the target token's logit (see logit attribution); positive pushes the "
              "token up.",
    "gradient": "in importance: Michel et al. 2019's estimate, |∂loss/∂ξ_h| at ξ = 1 for a gate ξ_h on head h's "
                "output (an encoder: ‖∂ê/∂ξ_h‖), the first-order size of removing the head (ξ_h = 0).",
    "detector share": "in detect: the weight on a detector's targets averaged over the rows that have one (what the "
             "induction and duplicate-token labels test).",
    "TL score": "in detect: TransformerLens's head-detector score Σ α⊙P / Σ α over the whole matrix (error measure "
                "'mul', nothing excluded), P the detector's 0/1 pattern.",
    "by norm": "value-weighted norms (Kobayashi et al. 2020): ‖α_ij·f(x_j)‖ instead of α_ij, how much key j "
               "actually moves query i (attnviz norms, sinks).",
    "by α": "measured with the attention weights α themselves (beside 'by norm').",
    "stream": "--stream: a long input's attention computed a block of query rows at a time, so memory grows "
              "with T, not T²; the statistics are exact, pictures show block means.",
    "sink": "a key that takes a large share of many queries' attention whatever they are (often the first "
            "token, [CLS] or [SEP]): attnviz sinks lists them (Xiao et al. 2023, Gu et al. 2024).",
    "sink score": "a key's mean weight over the queries that can see it; above --threshold (0.3) it is a sink.",
    "|Δ|": "the absolute difference between two computations of the same number (the model's α and the "
           "from-scratch α, or a sum and its parts); max and mean over every cell.",
    "lift": "in attnviz token: how much more weight this token puts on a key than the other tokens do on "
            "average in that head. A large weight with a small lift is a vertical stripe, not a link.",
    "stripe": "a head where every token looks at the same key (a vertical stripe in its heatmap); attnviz token "
              "says so rather than calling it a link.",
    "piece": "a token that holds part of a character: byte-level tokenizers split a character of several UTF-8 "
             "bytes, and 나(2/3) is the second of the three tokens 나 is spread over.",
    "[CLS]/BOS": "in corpus layer tables: attention mass on the first special token ([CLS] for BERT, BOS for "
                 "causal models).",
    "[SEP]/EOS": "in corpus layer tables: attention mass on the closing special token ([SEP], EOS).",
    "norm": "the colour scale's mapping (--norm linear, sqrt, log or auto), not value-weighted norms (--norms, "
            "attnviz norms).",
    "mean": "in tables of heads: the mean over the layer's heads; `--head mean` draws that mean matrix.",
    "raw": "in attnviz scaling: the same trained weights and the same Q and K, without the division by √d_k.",
    "scaled": "in attnviz scaling: with the division by √d_k, as the model computes it.",
    "std": "standard deviation: over texts in corpus output; in attnviz scaling, of every score in a layer.",
    "largest |output|": "in attnviz verify --norms: the attention block output's largest |value| in that layer.",
    "relative |Δ|": "in attnviz verify --norms: max |Δ| ÷ max(1, largest |output|), the measure the verdict uses "
                    "(float32 rounding grows with the values; some models' outputs reach the hundreds).",
    "max |Δ| of the output": "in attnviz verify --norms: the largest difference between the attention block's "
                             "output and the sum of its parts α_ij·f(x_j) + b_O.",
    "worst head": "in attnviz verify: the head with the largest |Δ| in that layer.",
    "with positions": "in attnviz positions: the largest |Δ| between α of the shuffled text and α permuted back, "
                      "with the position embeddings as trained (large: the model knows the order).",
    "without positions": "in attnviz positions: the same with the position embeddings zeroed (float rounding: "
                         "self-attention alone sees a set).",
    "check |Δ|": "in attnviz norms: the largest difference between the attention block's output and the sum of "
                 "its parts α_ij·f(x_j) (plus the output bias): the exact check of the decomposition.",
    "sink heads": "in attnviz sinks: how many heads of the layer have a sink (a key whose sink score passes "
                  "--threshold).",
    "sinks (token: heads)": "in attnviz sinks: each sink token and in how many of the layer's heads it is one.",
    "score by α": "in attnviz sinks: the largest sink score in the layer, measured with α (beside 'by norm').",
    "pos": "in attnviz generate --terminal: the position of the new token in prompt + generated text.",
    "attends most to": "in attnviz generate --terminal: the earlier tokens the new token's row of α weighs most, "
                       "with their weights.",
    "itself": "in attnviz generate --terminal: the new token's weight on itself (the diagonal of α).",
    "logit attribution": "direct logit attribution (attnviz logit-attr): a causal model's last residual stream is "
                         "the sum of what the embeddings, each head, each MLP and the biases wrote into it; with "
                         "the final norm's scale frozen at the one it used, the logit of a token splits exactly "
                         "into one part each (TransformerLens's logit_attrs). A head's part is its direct effect: "
                         "what it writes that the unembedding reads as that token, not what later layers make "
                         "of it.",
    "raises": "in attnviz logit-attr: the tokens whose logits the head's output pushes up most (␣ is a space).",
    "lowers": "in attnviz logit-attr: the tokens whose logits the head's output pushes down most.",
    "through": "in attnviz logit-attr: the source tokens the head carries its effect from, α_pj times the effect "
               "of token j's value through the head, largest first (they add up to the head's effect).",
    "contribution": "how much a token contributes to another token's output in a layer, as attnviz contributions "
                    "measures it. ALTI (Ferrando et al. 2022, the default): the attention block's output for "
                    "token i, residual included, is a sum of one vector per input token j; c_ij = max(0, ‖y_i‖₁ − "
                    "‖y_i − T_i(x_j)‖₁), how much closer to the output that part is than nothing. Value zeroing "
                    "(Mohebbi et al. 2023): 1 − cos between token i's layer output with and without token j's "
                    "value vector. Each row is normalised to sum to 1. Unlike α, both count what the value "
                    "carries; ALTI counts the residual too, so a token's own share is large.",
    "ALTI": "Aggregation of Layer-wise Token-to-token Interactions (Ferrando et al. 2022): see contribution; its "
            "rollout multiplies the layers' matrices, as attention rollout does with α.",
    "ALTI-Logit": "in attnviz logit-attr (Ferrando et al. 2023): each head's direct effect on the logit through "
                  "each token it reads, traced back to the input tokens by ALTI's contributions of the layers "
                  "below it; a head's effect is kept whole, spread over the input tokens. In a causal model the "
                  "trace drifts toward the first tokens as layers add up (each token keeps only part of itself "
                  "per layer), so read it beside 'through', the tokens the head reads directly.",
    "logit lens": "in attnviz lens (nostalgebraist 2020): each layer's residual stream read as if it were the last, "
                  "through the model's own final norm and unembedding, so that every layer says what it would "
                  "predict next. Early layers often predict the input token or filler; the answer rises in the "
                  "last third. The last row is the model's own output. It reads the stream the model never reads "
                  "this way, so an early row is a view, not what the layer 'thinks' (a tuned lens, trained per "
                  "layer, reads earlier layers better).",
    "α on special": "in attnviz contributions: the mean share of attention (the mean over the layer's heads) on "
                    "special tokens ([CLS], [SEP], …).",
    "contribution on special": "in attnviz contributions: the mean share of contribution that special tokens have "
                               "in the tokens' outputs.",
    "α on self": "in attnviz contributions: the mean weight a token puts on itself (the diagonal of α, mean over "
                 "heads).",
    "contribution on self": "in attnviz contributions: the mean share a token's own value has in its output.",
    "agreement": "in attnviz contributions: Spearman's ρ between a token's α (mean over heads) and its "
                 "contributions over the keys it sees, averaged over the tokens of the layer; 1 is the same "
                 "order.",
    "rank": "the place in a list ordered by the column it names, 1 first (logit-attr: by |effect|; importance: "
            "by effect). Of the target in logit-attr's title: its place among the model's predictions.",
    "layer.head": "a head named by its layer and its index in the layer: 23.4 is layer 23, head 4.",
    "restored": "in attnviz patch: how much of the clean run's answer a patch brings back, (LD patched − LD "
                "corrupted) / (LD clean − LD corrupted), LD the logit difference of the two answers at the last "
                "position: 0 is the corrupted run, 1 the clean one (below 0 or above 1: further than either).",
    "logit difference": "LD: a causal model's logit of one answer minus its logit of the other at the last "
                        "position (attnviz patch --answers ' Paris',' Rome'); what patching measures, in logits "
                        "(ln of the odds of one answer over the other).",
    "value zeroing": "a contribution method (Mohebbi et al. 2023; attnviz contributions --method value-zeroing): in "
                     "a layer, token j's value vector is zeroed in every head and the layer's output for each token "
                     "i compared with the clean one; 1 − cos of the two, each row divided by its sum, is how much "
                     "i's output depends on j.",
    "faithfulness": "attnviz faithfulness: how well an attribution explains the model's own prediction, measured "
                    "by erasing tokens (deleted from the input, ERASER's way) in the order it ranks them and running "
                    "the model again: comprehensiveness, sufficiency, their AOPC, Kendall's τ with leave-one-out, a "
                    "random baseline to beat and the sanity check.",
    "comprehensiveness": "in attnviz faithfulness (DeYoung et al. 2020): f of the full text minus f without the "
                         "method's top k tokens; high when the tokens it ranks first mattered.",
    "sufficiency": "in attnviz faithfulness (DeYoung et al. 2020): f of the full text minus f with only the "
                   "method's top k tokens (and the special ones); low when they were enough by themselves.",
    "AOPC": "area over the perturbation curve: the mean of comprehensiveness (or sufficiency) over the bins, 1, 5, "
            "10, 20 and 50 % of the tokens that can be erased (⌈fraction · n⌉, at least one).",
    "f": "in attnviz faithfulness, what the explanations explain: a causal LM's probability of the target token at "
         "the last position; an encoder's cosine between the erased text's sentence embedding (the mean over its "
         "tokens) and the full text's.",
    "leave-one-out": "loo: a token's score is f of the full text minus f with that one token deleted; what every "
                     "other method is compared with (Kendall's τ, Jain & Wallace 2019).",
    "Kendall's τ": "τ-b: over all pairs of tokens, the share ordered the same way by two scorings minus the share "
                   "ordered the opposite way, ties adjusted; 1 the same order, −1 reversed, 0 unrelated.",
    "attention flow": "Abnar & Zuidema 2020: the layers' attention as a graph (Â = rownorm(mean over heads of α + "
                      "I), one node per token and layer), each edge's weight a capacity; a token's score is the "
                      "maximum flow from the explained position at the top to it at the input, normalised.",
    "integrated gradients": "Sundararajan et al. 2017, by Captum: the gradient of f along the straight path from a "
                            "baseline (zero embeddings for the erasable tokens) to the input, times the input minus "
                            "the baseline, summed over each token's embedding; the attributions add up to f(x) − "
                            "f(baseline) (completeness), up to the quadrature's error.",
    "gradient × input": "the gradient of f with respect to each token's input embedding, times that embedding, "
                        "summed over its dimensions (Captum's InputXGradient).",
    "random baseline": "in attnviz faithfulness: the erasure curves of random orders of the tokens (20 by default), "
                       "their mean and sd; a method beats random where it is better than their mean by more than "
                       "two sd.",
    "sanity check": "Adebayo et al. 2018's cascading randomisation: the model's blocks are randomised from the top "
                    "one down (weight matrices drawn afresh, on a copy) and the method run again; Spearman's ρ of "
                    "its scores before and after. An explanation that stays the same when the model is destroyed "
                    "does not explain the model.",
    "activation patching": "attnviz patch: run a clean and a corrupted prompt, put one piece of one run (a head's "
                           "output, a layer's attention output or residual stream at a position) into the other, "
                           "and measure how much of the answer comes back (Meng et al. 2022, Wang et al. 2022).",
    "attribution patching": "AtP (Nanda 2023), attnviz patch --method atp: every piece's patch estimated at once "
                            "from one forward and one backward pass of the receiver run, (a donor − a receiver) · "
                            "∂M/∂a, on the same scale as activation patching; exact only where the model is linear "
                            "between the piece and M (--compare measures it against exact patching). atp*: with "
                            "Kramár et al. 2024's QK fix (the residual stream's effect through attention patterns "
                            "computed exactly) and GradDrop (Σ over layers of |the estimate with one block's "
                            "gradient dropped| / (L − 1)).",
    "edge attribution patching": "EAP (Syed et al. 2023), attnviz discover: every edge u → r of the residual "
                                 "graph scored (a_u clean − a_u corrupted) · ∂M/∂x_r, x_r the receiver's own "
                                 "input; EAP-IG (Hanna et al. 2024) averages the gradient over inputs from the "
                                 "corrupted to the clean embeddings.",
    "faithfulness curve": "in attnviz discover: for each share of the edges, the circuit of the top edges run with "
                          "every other edge fed the corrupted run's contribution; (M circuit − M corrupted) / (M "
                          "clean − M corrupted), 1 with every edge, 0 with none; its area over the share of edges "
                          "kept is MIB's measure (Mueller et al. 2025).",
    "alignment": "in attnviz patch --align, for prompts of different lengths: which position of the corrupted "
                 "prompt each position of the clean one is patched with. auto pairs the tokens both share, in "
                 "order, and a changed span by its last token; a position left out is not patched.",
    "massive activation": "in attnviz massive (Sun et al. 2024): an entry of the residual stream (a block's "
                          "output) over 100 in size and about 1,000 times the layer's median |h|. A few, on fixed "
                          "dimensions and tokens (the first, as a rule); the heads' sinks sit on those tokens.",
    "Sink₁^ε": "the model-level sink rate (Gu et al. 2024): the share of heads, over a corpus, whose first token "
               "receives a mean weight above ε (0.3) from the queries that can see it (attnviz sinks --corpus).",
    "retrieval head": "a head that copies from the context (Wu et al. 2024): while the model writes an answer "
                      "found in a needle-in-a-haystack prompt, its most-attended key lies in the needle and holds "
                      "the token just written (attnviz retrieval).",
    "retrieval score": "in attnviz retrieval: per prompt answered correctly, the steps at which a head's "
                       "most-attended key lies in the needle and holds the token just written, over the needle's "
                       "length in tokens; the mean over those prompts.",
    "OV circuit": "what a head writes for each token it attends to, from the weights alone (Elhage et al. 2021): "
                  "W_E·W_V·W_O·W_U on the vocabulary. Its copying score Σλ/Σ|λ| over its eigenvalues is 1 for a "
                  "head that raises the very token it attends to, −1 for one that suppresses it (attnviz "
                  "circuits).",
    "QK circuit": "which token attends to which, from the weights alone: W_E·W_Q·(W_E·W_K)ᵀ on the vocabulary, "
                  "positions left out (attnviz circuits lists each head's strongest pairs).",
    "frame": "a speech model's unit of time: Whisper's encoder turns each 20 ms of sound (two 10-ms columns of "
             "the log-mel spectrogram) into one position; a sound's keys are its frames, 0.00s, 0.02s, …",
    "(silence)": "the padding after a sound (Whisper hears 30 s at a time), folded into one key: attention to it "
                 "is the sum over its frames, from it the mean of their rows; pictures leave it out and say its "
                 "share.",
    "word timings": "when each word was said, from cross-attention (whisper's timing.py): the alignment heads' "
                    "rows renormalised over the sound, standardised over the tokens, median-filtered over 7 "
                    "frames, averaged; dynamic time warping then gives a monotonic path, and a word starts where "
                    "the path reaches its first token (attnviz align).",
    "alignment heads": "the cross-attention heads a Whisper model lists as following the sound in time; word "
                       "timings use them (attnviz align, attnviz detect --audio).",
    "on the path": "in attnviz align and detect --audio: the share of a cross-attention head's weight "
                   "(renormalised over the sound, averaged over the text's rows) within --band frames of the "
                   "word-timing path.",
    "listed": "in attnviz align and detect --audio: ✓ where the model lists the head as an alignment head.",
    "start (s)": "in attnviz align: when the word begins, in seconds from the start of the sound.",
    "end (s)": "in attnviz align: when the word ends (the next word's start, or the end of the transcript).",
    "word": "in attnviz align: a word of the transcript as written, punctuation joined to it.",
    "compr. ↑": "in attnviz faithfulness: comprehensiveness, the AOPC of f_full − f with the method's top tokens "
                "erased; higher is better (the tokens it ranks first mattered). See comprehensiveness.",
    "suff. ↓": "in attnviz faithfulness: sufficiency, the AOPC of f_full − f with only the method's top tokens "
               "kept; lower is better (they were enough). See sufficiency.",
    "τ loo": "in attnviz faithfulness: Kendall's τ-b between the method's scores and leave-one-out's, over the "
             "tokens that can be erased; 1 the same order, 0 unrelated (over a corpus: its mean, headed τ).",
    "sanity ρ": "in attnviz faithfulness (headed ρ over a corpus): Spearman's ρ between the method's scores on the "
                "model and on a copy whose blocks were randomised from the top block down (to block 0 by default, "
                "--sanity 1); near 0 the method explains what the model learned, near 1 it shows something the "
                "randomisation kept (the embeddings, the causal mask). It passes at |ρ| ≤ 0.3. Over a corpus: the "
                "mean over the texts.",
    "beats random": "in attnviz faithfulness (--json's beats_random): on which measure the method is more than two "
                    "sd of the random orders better than their mean: both, comprehensiveness, sufficiency or no. "
                    "Over a corpus (headed beats): the share of texts where it beat random on both.",
    "trust": "in attnviz faithfulness: yes where the method beats random on both measures and passes the sanity "
             "check (|ρ| ≤ 0.3) on this text; else which test failed (random, sanity, both). Over a corpus: yes for "
             "a method of the first group (ranked first, ahead of the rest by a significant lead), better than "
             "random orders in both means and passing the sanity check on average; else why not (behind, no lead, "
             "random, sanity). The verdict line under the table names the methods to trust.",
    "lead": "in attnviz faithfulness --corpus: the mean over the texts of a method's comprehensiveness − "
            "sufficiency minus the next method's; * where a paired sign-flip test over the texts finds it "
            "significant (p < 0.05; exact up to 16 texts, whose smallest possible p is 2/2ⁿ: 6 texts at least).",
    "#": "the rank: 1 is first. In attnviz faithfulness methods tied on both AOPCs (they erased the same tokens) "
         "share a rank, written 1=.",
    "method": "in attnviz faithfulness: the attribution put to the tests (attnviz explain attention, rollout, "
              "attention flow, ALTI, ALTI-Logit, value zeroing, gradient × input, integrated gradients, "
              "leave-one-out).",
    "Δloss": "in attnviz importance: the next-token loss over the text with the head removed minus without it, "
             "in nats (positive: the model predicts worse without it).",
    "top before": "in attnviz ablate: the token the model predicted next at that position before the heads were "
                  "removed; p beside it is its probability.",
    "top after": "in attnviz ablate: the token it predicts next with the heads removed; p beside it is its "
                 "probability.",
    "p": "a probability. In attnviz ablate, beside top before or top after: that token's probability.",
    "p(top before) after": "in attnviz ablate: the probability, with the heads removed, of the token predicted "
                           "before.",
    "max |Δα|": "in attnviz ablate: the largest change of any attention weight in that later layer, α with the heads "
                "removed minus α clean.",
    "mean |Δα|": "in attnviz ablate: the mean absolute change of that later layer's attention weights.",
    "most changed head": "in attnviz ablate: the head of that later layer whose α changed most (by max |Δα|).",
    "copying Σλ/Σ|λ|": "in attnviz circuits: the OV circuit's copying score, the sum of its eigenvalues over the sum "
                       "of their sizes: 1 for a head that raises the token it attends to, −1 for one that lowers it "
                       "(see OV circuit).",
    "λ > 0": "in attnviz circuits: the share of the OV circuit's eigenvalues with a positive real part.",
    "strongest QK pair (query → key)": "in attnviz circuits: the query token and key token whose score the QK "
                                       "circuit makes highest (see QK circuit).",
    "sender": "in attnviz circuits: the earlier head, whose output the receiver reads (see composition).",
    "receiver": "in attnviz circuits: the later head, reading the sender's output through its queries, keys or "
                "values (see composition). In attnviz discover: a node's input, which reads the residual stream "
                "(a head's query, key or value input, an MLP's input, the logits).",
    "from": "in attnviz discover: the edge's sender, a node that writes to the residual stream: input (the "
            "embeddings), aL.H (head H of layer L's output), mL (layer L's MLP).",
    "to": "in attnviz discover: the edge's receiver: aL.H.q, aL.H.k, aL.H.v (head H of layer L's query, key or value "
          "input; under grouped-query attention aL.kvG.k for the key shared by group G), mL (layer L's MLP input) "
          "or logits (the final norm and unembedding).",
    "edges kept": "in attnviz discover: how many of the top edges (by |score|) the circuit keeps; every other edge is "
                  "fed the corrupted run's contribution.",
    "area": "in attnviz discover: the area under the faithfulness curve over the share of edges kept (MIB's "
            "measure): 1 when the first edges already give the clean run.",
    "median |h|": "in attnviz massive: the median size of the entries of the residual stream after that block.",
    "largest |h|": "in attnviz massive: the largest size of any entry of the residual stream after that block.",
    "× median": "in attnviz massive: the largest |h| over the median |h|.",
    "token · dim": "in attnviz massive: the token and the dimension of the residual stream where the largest |h| "
                   "sits.",
    "tokens holding them": "in attnviz massive: the tokens that carry a massive activation in that layer.",
    "special, by α": "in attnviz norms: the share of attention on special tokens, weighing each key by α.",
    "special, by norm": "in attnviz norms: the same share weighing each key by ‖α·f(x)‖ (see by norm): what "
                        "special tokens actually contribute.",
    "token 0, by α": "in attnviz norms: the share of attention on the first token, by α.",
    "token 0, by norm": "in attnviz norms: the same share by ‖α·f(x)‖ (see by norm).",
    "std QKᵀ": "in attnviz scaling: the standard deviation of the raw scores Q·Kᵀ; it grows like √d_k.",
    "std QKᵀ/√d_k": "in attnviz scaling: the standard deviation of the scaled scores: near 1 whatever d_k is.",
    "entropy raw": "in attnviz scaling: the mean row entropy (nats) of softmax(Q·Kᵀ) without the division by √d_k.",
    "entropy scaled": "in attnviz scaling: the mean row entropy (nats) of softmax(Q·Kᵀ/√d_k), the model's own α.",
    "max α raw": "in attnviz scaling: the mean largest weight of a row of softmax(Q·Kᵀ): near 1 when the unscaled "
                 "softmax saturates.",
    "max α scaled": "in attnviz scaling: the mean largest weight of a row of the model's own α.",
    "node names": "in attnviz discover: input (the embeddings), aL.H (head H of layer L), mL (layer L's MLP), "
                  "logits; a receiver adds .q, .k or .v (aL.H.q; aL.kvG.k under grouped-query attention).",
    "composition": "how much a later head reads what an earlier head writes (Elhage et al. 2021): ‖OV_1·R_2‖ / "
                   "(‖OV_1‖ ‖R_2‖), R_2 the later head's QK (Q-composition), QKᵀ (K-) or OV (V-composition); "
                   "0 to 1 (attnviz circuits).",
    "without α": "the long path of patch (exact, atp), logit-attr, retrieval, ablate, discover and faithfulness (a "
                 "text of more than 256 tokens): where L·H·T² weights would not fit "
                 "--max-memory, the model runs on its own memory-efficient attention (PyTorch's SDPA, as "
                 "FlashAttention tiles) and blocks are recomputed in the backward pass as the budget needs "
                 "(activation checkpointing), so memory grows with T; the numbers equal the full path's.",
}
TERM_ALIASES = {"entropy tokens": "entropy_tokens", "token-weighted": "tok-w", "q": "Q", "k": "K", "v": "V",
                "out": "α·V", "qk": "Q·Kᵀ", "sqrt(d_k)": "√d_k", "dk": "d_k", "streamed": "stream",
                "sinks": "sink", "sink_score": "sink score", "alpha·v": "α·V", "pieces": "piece",
                "share": "label_share", "α": "alpha", "qkᵀ": "Q·Kᵀ", "QKᵀ": "Q·Kᵀ", "QKᵀ/√d_k": "scaled",
                "mean |Δ|": "|Δ|", "max |Δ|": "|Δ|", "attends most to (weight)": "attends most to",
                "by α": "by α", "score": "sink score", "window": "sliding window", "sliding": "sliding window",
                "local attention": "sliding window", "alti-logit": "ALTI-Logit", "alti logit": "ALTI-Logit",
                "logit-lens": "logit lens", "logitlens": "logit lens", "long path": "without α",
                "without alpha": "without α", "checkpointing": "without α",
                "patching": "activation patching", "patch": "activation patching",
                "atp": "attribution patching", "atp*": "attribution patching", "graddrop": "attribution patching",
                "qk fix": "attribution patching", "eap": "edge attribution patching",
                "eap-ig": "edge attribution patching", "discover": "edge attribution patching",
                "circuit faithfulness": "faithfulness curve",
                "softcap": "soft-capping", "softcapping": "soft-capping",
                "soft-cap": "soft-capping", "sink logits": "sink logit", "s_aux": "sink logit",
                "qk-norm": "QK-norm", "qk norm": "QK-norm", "massive": "massive activation",
                "massive activations": "massive activation", "sink rate": "Sink₁^ε", "sink₁^ε": "Sink₁^ε",
                "retrieval": "retrieval head", "retrieval heads": "retrieval head", "copying score": "OV circuit",
                "ov": "OV circuit", "ov circuit": "OV circuit", "qk circuit": "QK circuit",
                "q-composition": "composition", "k-composition": "composition", "v-composition": "composition",
                "align": "alignment", "alignment head": "alignment heads", "dtw": "word timings",
                "timing": "word timings", "timings": "word timings", "silence": "(silence)", "frames": "frame",
                "ld": "logit difference", "LD": "logit difference", "logit diff": "logit difference",
                "value-zeroing": "value zeroing", "zeroing": "value zeroing", "vz": "value zeroing",
                "loo": "leave-one-out", "leave one out": "leave-one-out", "kendall": "Kendall's τ",
                "tau": "Kendall's τ", "τ": "Kendall's τ", "flow": "attention flow", "ig": "integrated gradients",
                "integrated-gradients": "integrated gradients", "grad-x-input": "gradient × input",
                "gradient x input": "gradient × input", "random": "random baseline", "sanity": "sanity check",
                "randomisation": "sanity check", "eraser": "faithfulness", "aopc": "AOPC",
                "compr.": "compr. ↑", "compr": "compr. ↑", "suff.": "suff. ↓", "suff": "suff. ↓",
                "tau loo": "τ loo", "ρ": "sanity ρ", "rho": "sanity ρ", "sanity rho": "sanity ρ",
                "ρ rand": "sanity ρ", "beats": "beats random", "beats_random": "beats random",
                "verdict": "trust", "rank": "#", "delta loss": "Δloss", "dloss": "Δloss",
                "m0": "node names", "a0.0": "node names", "nodes": "node names", "node": "node names",
                "input": "node names", "logits": "node names", "receivers": "receiver", "senders": "sender",
                "edge": "edge attribution patching", "edges": "edges kept"}


def glossary() -> list[tuple[str, str, str]]:
    """(term, other name, definition) for every metric, label and term, for `attnviz explain`."""
    rows = [(m.header, m.name if m.name != m.header else "", m.definition) for m in METRICS]
    rows += [(label, "label", text) for label, text in label_definitions().items()]
    rows += [(term, "", text) for term, text in TERMS.items()]
    return rows


def lookup(term: str, more: Sequence[tuple[str, str, str]] = ()) -> list[tuple[str, str, str]]:
    """The glossary rows (and `more` rows: the commands) for a term as a user types it: a column, label or term by
    name (exact case first, then any case), its other name, an alias, or a word in a term's name."""
    import re

    rows = glossary() + list(more)
    wanted = term.strip()
    if re.fullmatch(r"a\d+\.(kv)?\d+(\.[qkv])?|m\d+", wanted):  # a node of attnviz discover: a23.kv1.v, m0
        wanted = "node names"
    key = TERM_ALIASES.get(wanted, TERM_ALIASES.get(wanted.lower(), wanted))
    exact = [r for r in rows if key in (r[0], r[1])]
    if exact:
        return exact
    low = key.lower()
    return [r for r in rows if low in (r[0].lower(), r[1].lower())] or \
        [r for r in rows if r[1] == "" and len(low) > 2 and low in r[0].lower()]


def close_to(term: str, limit: int = 3, more: Sequence[tuple[str, str, str]] = ()) -> list[str]:
    """The names closest in spelling to a term that names nothing (entropi: entropy), for "did you mean"."""
    import difflib

    rows = glossary() + list(more)
    names = {r[0].lower(): r[0] for r in rows} | {r[1].lower(): r[0] for r in rows if r[1] and r[1] != "command"}
    names |= {alias.lower(): target for alias, target in TERM_ALIASES.items()}
    found = difflib.get_close_matches(term.strip().lower(), list(names), n=limit * 3, cutoff=0.75)
    return list(dict.fromkeys(names[f] for f in found))[:limit]


def definitions_markdown() -> str:
    """The docs' metric table (docs/commands.md), from the registry."""
    rows = ["| metric | column | definition |", "|---|---|---|"]
    rows += [f"| `{m.name}` | `{m.header}` | {m.definition.replace('|', chr(92) + '|')} |" for m in METRICS]
    return "\n".join(rows) + "\n"


