"""Today's architectures: every family of engine/families.py on a tiny random model with what its attention adds
switched on (sliding windows shorter than the text, soft-capping, QK-norm, sink logits, fused QKV, local and
global layers). Streaming runs the model's attention through attnviz's function in transformers' attention
interface; it must give the family's own eager α, output and statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import TODAYS, one_line_error, run, write_tiny_gguf

TEXT = " ".join(["The cat sat on the mat. A dog ran in the park!"] * 2)  # 25 tokens: windows of 4 matter
STREAMED = ("bert", "roberta", "electra", "distilbert", "gpt2", "llama", "qwen2", *TODAYS)
MODEL_TYPE = {"mistral-window": "mistral", "gemma3": "gemma3_text"}


def model_type(kind: str) -> str:
    return MODEL_TYPE.get(kind, kind)


@pytest.fixture(scope="module")
def full_and_encoded(load_tiny):
    from attnviz.engine.forward import capture_text, encode

    def get(kind):
        loaded = load_tiny(kind)
        return loaded, capture_text(TEXT, loaded), encode(loaded, TEXT)

    return get


@pytest.mark.parametrize("kind", STREAMED)
def test_each_call_computes_what_the_familys_eager_attention_computes(kind, full_and_encoded):
    """Call by call, on the same Q, K, V and the mask transformers builds: attnviz's formula gives the family's
    own eager α within 1e-6 and output within 1e-6 of its largest value (the family's eager function is run
    beside it as the reference)."""
    import sys

    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    from attnviz.engine.interface import layer_attention, output

    loaded, full, encoded = full_and_encoded(kind)
    worst: list[tuple[float, float]] = []

    def both(module, query, key, value, attention_mask, **kwargs):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        reference_out, reference_alpha = eager(module, query, key, value, attention_mask, **kwargs)
        allowed = None if attention_mask is None else attention_mask == 0  # eager's 0 / −inf as a boolean mask
        attention = layer_attention(module, query, key, allowed, kwargs)
        alpha = attention.rows(torch.arange(query.shape[2]))
        ours = output(attention, value, 4096)
        scale = float(reference_out.abs().max())  # the output relative to its size: values here reach tens
        worst.append((float((alpha - reference_alpha).abs().max()), float((ours - reference_out).abs().max()) / scale))
        return reference_out, reference_alpha

    AttentionInterface.register("attnviz_check", both)
    AttentionMaskInterface.register("attnviz_check", eager_mask)
    loaded.model.set_attn_implementation("attnviz_check")
    try:
        with torch.inference_mode():
            loaded.model(**encoded.inputs)
    finally:
        loaded.model.set_attn_implementation("eager")
    assert len(worst) == full.n_layers and max(w for pair in worst for w in pair) < 1e-6, worst


@pytest.mark.parametrize("kind", STREAMED)
def test_streamed_attention_is_the_familys_own(kind, full_and_encoded):
    """Through the interface, end to end: α rows equal the full path's α (the exact window over everything;
    within 1e-5, as each layer's input carries the rounding of the blocks before it), the statistics too, and
    the model's output what eager attention gives (within 1e-5 of its largest value)."""
    import torch

    from attnviz.engine.interface import output, streaming
    from attnviz.engine.stream import Window, stream
    from attnviz.metrics import Tokens, head_values

    loaded, full, encoded = full_and_encoded(kind)
    T = full.n_tokens
    everything = Window(rows=np.arange(T), cols=np.arange(T), layers=tuple(range(full.n_layers)))
    result = stream(loaded.model, encoded.inputs, Tokens.of(full), pool=1, window=everything, block_bytes=4096)
    np.testing.assert_allclose(result.window, full.attentions, atol=1e-5, rtol=0)
    for name, values in head_values(full).items():
        if values.dtype != object:
            np.testing.assert_allclose(result.values[name], values, atol=1e-5, rtol=0, equal_nan=True, err_msg=name)
    with torch.inference_mode():
        eager = loaded.model(**encoded.inputs).last_hidden_state
        with streaming(loaded.model, lambda attention, value: output(attention, value, 4096)):
            streamed = loaded.model(**encoded.inputs).last_hidden_state
    # float32 rounding grows with the values and through the layers' MLPs: 1e-5 of the largest |value| (tiny
    # Qwen2 under transformers 5.24: 1.4e-5 against 3.3, about 36 units in the last place)
    assert float((streamed - eager).abs().max()) < 1e-5 * max(1.0, float(eager.abs().max()))
    assert loaded.model.config._attn_implementation == "eager"  # put back after the run


@pytest.mark.parametrize("kind", ["gemma2", "gpt_oss", "mistral-window"])
def test_a_wrong_formula_is_caught(kind, full_and_encoded, monkeypatch):
    """The comparison can fail: drop what the family adds (soft-capping, sinks, the window) and α moves."""
    from attnviz.engine import interface
    from attnviz.engine.stream import Window, stream
    from attnviz.metrics import Tokens

    loaded, full, encoded = full_and_encoded(kind)
    real = interface.layer_attention

    def without(module, query, key, attention_mask, kwargs):
        attention = real(module, query, key, attention_mask, kwargs)
        attention.softcap, attention.sinks = None, None
        if kind == "mistral-window":
            attention.mask, attention.causal = None, True
        return attention

    monkeypatch.setattr(interface, "layer_attention", without)
    T = full.n_tokens
    result = stream(loaded.model, encoded.inputs, Tokens.of(full), pool=1,
                    window=Window(np.arange(T), np.arange(T), tuple(range(full.n_layers))))
    assert np.abs(result.window - full.attentions).max() > 1e-3


def test_sliding_windows_and_sinks_are_in_the_alpha(full_and_encoded):
    """What the tiny configs switch on is there: keys beyond the window get 0 in sliding layers and not in full
    ones; gpt-oss rows keep less than 1 (the sink logit's share), and a capture says so."""
    from helpers import WINDOW

    _, gemma, _ = full_and_encoded("gemma2")  # layer 0 sliding, layer 1 full
    T = gemma.n_tokens
    i, j = np.tril_indices(T, k=-WINDOW)  # keys at least WINDOW back
    assert gemma.attentions[0][:, i, j].max() == 0 and gemma.attentions[1][:, i, j].max() > 1e-3
    _, oss, _ = full_and_encoded("gpt_oss")
    kept = oss.attentions.sum(axis=-1)
    assert oss.sinks and kept.mean(axis=-1).min() < 0.9 and kept.min() < 0.5 and 0 <= kept.min()
    assert kept.max() <= 1 + 1e-6
    shares = oss.as_distribution()
    np.testing.assert_allclose(shares.attentions.sum(-1), 1.0, atol=1e-5)
    assert not full_and_encoded("llama")[1].sinks


def test_a_sink_capture_is_checked_and_saved(full_and_encoded, tmp_path):
    from dataclasses import replace

    from attnviz.data.capture import Capture
    from attnviz.errors import AttentionCheckError

    _, oss, _ = full_and_encoded("gpt_oss")
    path = oss.save(tmp_path / "oss.npz")
    again = Capture.load(path)
    assert again.sinks and np.array_equal(again.attentions, oss.attentions)
    with pytest.raises(AttentionCheckError, match="do not sum to 1"):  # without the flag, rows must sum to 1
        replace(oss, meta={**oss.meta, "sinks": False}).validate()
    bad = oss.attentions.copy()
    bad[0, 0, 3, :4] = 0.5  # each weight in [0, 1], the row's sum above 1
    with pytest.raises(AttentionCheckError, match="more than 1"):
        replace(oss, attentions=bad).validate()


@pytest.mark.parametrize("kind", ["gemma2", "gpt_oss", "modernbert", "qwen3"])
def test_the_command_line_streams_todays_families(kind, tiny_model_dir):
    """heads --stream gives the numbers heads does, on the families no adapter knows."""
    model = tiny_model_dir(kind)
    full = json.loads(run("heads", TEXT, "-m", model, "--json").stdout)["heads"]
    streamed = run("heads", TEXT, "-m", model, "--json", "--stream")
    assert streamed.exit_code == 0, streamed.output
    rows = json.loads(streamed.stdout)["heads"]
    assert [(r["layer"], r["head"], r["label"]) for r in rows] == [(r["layer"], r["head"], r["label"]) for r in full]
    assert max(abs(a[k] - b[k]) for a, b in zip(rows, full) for k in a if isinstance(a[k], float)) < 1e-5


def test_every_family_is_tested_as_registered():
    """engine/families.py says what works; the tests here build every family it says streams, every family
    that verifies names a registered adapter of its kind (self-attention or encoder-decoder), and every
    registered adapter serves some family."""
    from attnviz.engine.families import FAMILIES
    from attnviz.engine.scratch.adapters import REGISTERED, Adapter, Seq2SeqAdapter

    streams = {t for f in FAMILIES if f.stream for t in f.model_types}
    built = {model_type(kind) for kind in STREAMED}
    assert built <= streams and {f.model_types[0] for f in FAMILIES if f.stream} <= built
    for family in FAMILIES:
        if family.verify:
            base = Seq2SeqAdapter if family.kind == "encoder-decoder" else Adapter
            assert issubclass(REGISTERED[family.adapter], base), family
    assert {f.adapter for f in FAMILIES if f.adapter} == set(REGISTERED)


def test_the_docs_list_the_registered_families():
    from pathlib import Path

    from attnviz.engine.families import markdown_table

    page = Path(__file__).resolve().parents[2].joinpath("docs", "models.md").read_text(encoding="utf-8")
    block = page.split("<!-- families:start -->\n", 1)[1].split("\n<!-- families:end -->", 1)[0]
    assert block == markdown_table(), "docs/models.md's family table is stale: python scripts/make_samples.py --tables"


def test_an_untested_family_is_told_in_one_line(monkeypatch, tiny_model_dir):
    from attnviz.engine.families import support_line

    assert "capture works" in support_line("falcon") and "streaming and verify do not" in support_line("falcon")
    assert support_line("t5").endswith("capture, verify; not stream")
    from attnviz.engine import families

    monkeypatch.setattr(families, "FAMILIES", tuple(f for f in families.FAMILIES if "gemma2" not in f.model_types))
    message = one_line_error(run("heads", TEXT, "-m", tiny_model_dir("gemma2"), "--stream"), 1)
    assert "streaming" in message and "'gemma2' is not among the families attnviz tests" in message


def test_an_extra_the_formula_does_not_know_is_refused(load_tiny):
    """A family that passes something the streamed formula would ignore (an ALiBi bias, say) is refused."""
    import torch

    from attnviz.engine.interface import layer_attention
    from attnviz.errors import UnsupportedArchitectureError

    loaded = load_tiny("llama")
    module = loaded.model.layers[0].self_attn
    q = torch.zeros(1, 4, 3, 8)
    with pytest.raises(UnsupportedArchitectureError, match="alibi"):
        layer_attention(module, q, q[:, :2], None, {"alibi": torch.zeros(1)})
    assert layer_attention(module, q, q[:, :2], None, {"position_ids": torch.zeros(1), "scaling": 0.5}).scale == 0.5


# --- verify: α from the weights, with hand-written adapters ----------------------------------------------


@pytest.mark.parametrize("kind", TODAYS)
def test_verify_recomputes_todays_families_from_the_weights(kind, tiny_model_dir):
    """The adapters write out QK-norm, fused QKV, 1/√query_pre_attn_scalar, soft-capping, sink logits, sliding
    windows, local reach and rotary variants; verify passes within its float32 tolerance (1e-5)."""
    result = run("verify", TEXT, "-m", tiny_model_dir(kind), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] and data["max_abs_diff"] < 1e-5


WRONG = {  # kind -> (adapter class, method, replacement): one written-out step left out
    "gemma2": ("GemmaAdapter", "extras", lambda self, module, config, layer: {}),  # scale and soft-capping
    "gemma3": ("GemmaAdapter", "normed", lambda self, module, q, k, config: (q, k)),  # QK-norm
    "qwen3": ("Qwen3Adapter", "normed", lambda self, module, q, k, config: (q, k)),
    "olmo2": ("LlamaAdapter", "project", None),  # OLMo 2's whole-projection norm
    "smollm3": ("Qwen3Adapter", "rotates", lambda self, config, layer: True),  # rotary everywhere
    "cohere2": ("Cohere2Adapter", "rotates", lambda self, config, layer: True),
    "gpt_oss": ("GptOssAdapter", "extras", lambda self, module, config, layer: {}),  # the sinks
    "mistral-window": ("LlamaAdapter", "window", lambda self, config, layer=0: None),
    "modernbert": ("ModernBertAdapter", "qkv", None),  # the local reach
    "phi3": ("Phi3Adapter", "project", None),  # Q, K, V in the wrong order
}


@pytest.mark.parametrize("kind", TODAYS)
def test_verify_fails_when_a_step_is_left_out(kind, load_tiny, monkeypatch):
    from attnviz.engine.scratch import adapters
    from attnviz.engine.scratch.verify import capture_both
    from attnviz.metrics import differences

    name, method, replacement = WRONG[kind]
    cls = getattr(adapters, name)
    if kind == "olmo2":
        replacement = adapters.LlamaAdapter.project
        monkeypatch.setattr(adapters.Qwen3Adapter, "project", replacement)
    elif kind == "modernbert":
        monkeypatch.setattr(cls, "qkv", adapters.LlamaAdapter.qkv)  # the reach of local layers left out
    elif kind == "phi3":
        real_project = cls.project

        def swapped(self, module, x, d):
            q, k, v = real_project(self, module, x, d)
            return k.repeat_interleave(q.shape[1] // k.shape[1], dim=1), q[:, :k.shape[1]], v

        monkeypatch.setattr(cls, "project", swapped)
    else:
        monkeypatch.setattr(cls, method, replacement)
    from attnviz.errors import AttentionCheckError

    try:
        reported, recomputed = capture_both(load_tiny(kind), TEXT)
    except AttentionCheckError as exc:  # α outside the window the capture declares: refused before comparing
        assert "sliding window" in str(exc) and kind in ("mistral-window", "modernbert")
        return
    assert max(d.max_abs for d in differences(reported, recomputed)) > 1e-3


def test_steps_states_what_the_family_adds(tiny_model_dir):
    """steps shows Gemma 2's scaling and soft-capping, and gpt-oss's sink logit, and still matches the model."""
    short = "The cat sat on the mat. A dog ran in the park!"  # steps prints every number up to 16 tokens
    gemma = run("steps", short, "-m", tiny_model_dir("gemma2"), "--layer", "0", "--head", "1",
                env={"COLUMNS": "150"}, terminal_width=150)
    assert gemma.exit_code == 0, gemma.output
    assert "soft-capped 3·tanh(s/3)" in gemma.stdout and "1/√query_pre_attn_scalar" in gemma.stdout
    oss = run("steps", short, "-m", tiny_model_dir("gpt_oss"), "--layer", "1", "--head", "0", "--token", "5")
    assert oss.exit_code == 0, oss.output
    assert "sink logit" in oss.stdout
    data = json.loads(run("steps", TEXT, "-m", tiny_model_dir("gemma2"), "--json").stdout)
    assert data["max_abs_diff"] < 1e-5


# --- what the mechanisms mean, in every view -------------------------------------------------------------


def test_a_sliding_window_is_drawn_like_the_causal_mask_and_named(full_and_encoded):
    """Gemma 2's layer 0 slides (a window of 4), layer 1 is full: the picture blanks the keys beyond the window
    in layer 0 only, and its title names the window."""
    from helpers import WINDOW

    from attnviz.data.sides import window_mask
    from attnviz.panels import attention_panels

    _, gemma, _ = full_and_encoded("gemma2")
    assert gemma.windows == [WINDOW, 0]
    sliding, full = attention_panels(gemma, [0, 1], [0])
    T = gemma.n_tokens
    assert np.array_equal(sliding.hidden, window_mask(T, WINDOW, True) | gemma.future_mask)
    assert np.array_equal(full.hidden, gemma.future_mask)
    assert any("sliding window 4" in part for part in sliding.title) and not any("window" in p for p in full.title)
    _, modern, _ = full_and_encoded("modernbert")  # an encoder's local layer: ±2 (local_attention 4 / 2)
    assert modern.windows == [0, 2, 0] and not modern.causal
    local = attention_panels(modern, [1], [0])[0]
    assert np.array_equal(local.hidden, window_mask(T, 2, False)) and any("±2" in p for p in local.title)


def test_the_terminal_and_the_page_say_what_is_masked(tiny_model_dir, full_and_encoded):
    from attnviz.render.viewer import viewer_data

    result = run("heatmap", TEXT, "-m", tiny_model_dir("gemma2"), "-t", "--layer", "0", "--head", "0",
                 env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0 and "sliding window 4" in result.stdout
    _, gemma, _ = full_and_encoded("gemma2")
    section = viewer_data(gemma)["sections"][0]
    assert section["windows"] == [4, 0] and any("sliding window of 4" in n for n in section["notes"])
    _, oss, _ = full_and_encoded("gpt_oss")
    assert any("sink logits" in n for n in viewer_data(oss)["sections"][0]["notes"])


def test_a_capture_whose_alpha_leaves_its_window_is_refused(full_and_encoded):
    """A shared file is checked against the windows it declares: a weight beyond one is refused in one line."""
    from dataclasses import replace

    from attnviz.errors import AttentionCheckError

    _, gemma, _ = full_and_encoded("gemma2")
    with pytest.raises(AttentionCheckError, match="outside its sliding window of 2"):
        replace(gemma, meta={**gemma.meta, "windows": [2, 0]}).validate()
    for bad in ([4], [4, -1], [4, True], "4"):
        with pytest.raises(AttentionCheckError, match="windows"):
            replace(gemma, meta={**gemma.meta, "windows": bad}).validate()


def test_the_kept_column_is_shown_for_sink_models_only(tiny_model_dir):
    oss = run("heads", TEXT, "-m", tiny_model_dir("gpt_oss"), "--json")
    records = json.loads(oss.stdout)["heads"]
    assert all(0 < r["kept"] <= 1 for r in records) and min(r["kept"] for r in records) < 0.99
    assert "kept" in run("heads", TEXT, "-m", tiny_model_dir("gpt_oss"), "--csv").stdout.splitlines()[0]
    llama = json.loads(run("heads", TEXT, "-m", tiny_model_dir("llama"), "--json").stdout)["heads"]
    assert "kept" not in llama[0]
    assert "kept" not in run("heads", TEXT, "-m", tiny_model_dir("llama"), "--csv").stdout.splitlines()[0]


def test_kept_is_what_each_row_keeps(full_and_encoded):
    """Independently: 'kept' is the mean row sum of the raw α, and the other statistics are those of the
    rows' shares (entropy recomputed here by hand)."""
    from attnviz.metrics import head_values

    _, oss, _ = full_and_encoded("gpt_oss")
    values = head_values(oss)
    a = oss.attentions.astype(np.float64)
    np.testing.assert_allclose(values["kept"], a.sum(-1).mean(-1), atol=1e-9)
    shares = a / a.sum(-1, keepdims=True)
    entropy = -(np.where(shares > 0, shares * np.log(np.where(shares > 0, shares, 1)), 0)).sum(-1).mean(-1)
    np.testing.assert_allclose(values["entropy"], entropy, atol=1e-9)


def test_an_untested_architecture_gets_one_line_for_each_thing(tmp_path):
    """OPT is in no table here: capture works; --stream and verify each refuse in one line that says what
    works for it."""
    import torch
    import transformers as tf
    from helpers import bpe_tokenizer

    torch.manual_seed(0)
    tokenizer = bpe_tokenizer("bytelevel")
    model = tf.OPTModel(tf.OPTConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                     ffn_dim=64, num_attention_heads=4, word_embed_proj_dim=32,
                                     max_position_embeddings=128, pad_token_id=0))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    captured = run("heads", "The cat sat on the mat", "-m", tmp_path, "--json")
    assert captured.exit_code == 0, captured.output
    assert len(json.loads(captured.stdout)["heads"]) == 8
    streamed = one_line_error(run("heads", "The cat sat on the mat", "-m", tmp_path, "--stream"), 1)
    assert "streaming" in streamed and "'opt' is not among the families attnviz tests: capture works" in streamed
    verified = one_line_error(run("verify", "The cat sat on the mat", "-m", tmp_path), 1)
    assert "no adapter for 'opt'" in verified and "streaming and verify do not" in verified


def test_a_corpus_of_one_text_gives_the_heads_numbers_with_sink_logits(tiny_model_dir, tmp_path):
    """corpus treats sink-logit rows as heads does: statistics of the shares, and 'kept'; for one text its means
    are that text's head table."""
    model = tiny_model_dir("gpt_oss")
    path = tmp_path / "one.txt"
    path.write_text(TEXT + "\n", encoding="utf-8")
    corpus = json.loads(run("corpus", path, "-m", model, "--json").stdout)["heads"]
    heads = json.loads(run("heads", TEXT, "-m", model, "--json").stdout)["heads"]
    for c, h in zip(corpus, heads):
        for key in ("entropy", "kept", "prev", "max_weight"):
            assert abs(c[key] - h[key]) < 1e-5, (key, c, h)
    llama = json.loads(run("corpus", path, "-m", tiny_model_dir("llama"), "--json").stdout)["heads"]
    assert "kept" not in llama[0] and "kept_std" not in llama[0]


def test_statistics_count_the_keys_a_window_leaves(full_and_encoded):
    """In a sliding-window layer a query sees at most w keys (causal) or those within ±w (an encoder's local
    layer): normalised entropy divides by ln of that count, and a key's sink score averages over the queries
    that can see it. Checked by hand on Gemma 2's layer 0 and ModernBERT's layer 1."""
    from attnviz.metrics import Tokens, head_values, sink_scores

    for kind, layer, causal in (("gemma2", 0, True), ("modernbert", 1, False)):
        _, capture, _ = full_and_encoded(kind)
        w = capture.windows[layer]
        a = capture.attentions[layer].astype(np.float64)  # (H, T, T)
        T = capture.n_tokens
        i = np.arange(T)
        if causal:
            n, seen = np.minimum(i + 1, w), np.minimum(T - i, w)
        else:
            n = seen = np.minimum(i, w) + np.minimum(T - 1 - i, w) + 1
        entropy = -(np.where(a > 0, a * np.log(np.where(a > 0, a, 1)), 0)).sum(-1)  # (H, T)
        rows = n > 1
        by_hand = (entropy[:, rows] / np.log(n[rows])).mean(-1)
        np.testing.assert_allclose(head_values(capture)["norm_entropy"][layer], by_hand, atol=1e-9)
        tokens = Tokens.of(capture).at_layer(capture.windows, layer)
        np.testing.assert_allclose(sink_scores(a.mean(axis=1), tokens), a.sum(axis=1) / seen, atol=1e-9)


# --- GGUF files of these families -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen3", "gemma2", "phi3"])
@pytest.mark.slow
def test_gguf_files_of_todays_families_load_verify_and_stream(kind, tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path / "cache"))
    path = write_tiny_gguf(kind, tmp_path / f"tiny-{kind}.gguf")
    verified = run("verify", TEXT, "-m", path, "--json")
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.stdout)["max_abs_diff"] < 1e-5
    full = json.loads(run("heads", TEXT, "-m", path, "--json").stdout)["heads"]
    streamed = json.loads(run("heads", TEXT, "-m", path, "--json", "--stream").stdout)["heads"]
    assert max(abs(a[k] - b[k]) for a, b in zip(streamed, full) for k in a if isinstance(a[k], float)) < 1e-5
    saved = tmp_path / "c.npz"
    assert run("capture", TEXT, "-m", path, "-o", saved).exit_code == 0
    from attnviz.data.capture import Capture

    capture = Capture.load(saved)
    assert capture.meta["model_type"] == kind and capture.causal
    assert capture.windows == ([4, 0] if kind == "gemma2" else None)  # Gemma 2's layers alternate


def test_a_tokenizer_that_fails_on_the_text_is_one_line(tmp_path, monkeypatch):
    """A GGUF Gemma whose tokenizer has no unknown token raises a bare Exception on every text inside
    transformers: one line, no traceback."""
    pytest.importorskip("gguf")
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path / "cache"))
    path = write_tiny_gguf("gemma2", tmp_path / "no-unk.gguf", unknown_token=False)
    assert "tokenizer cannot read this text" in one_line_error(run("heads", TEXT, "-m", path), 1)


def test_a_gguf_file_converts_once_wherever_it_lies(tmp_path, monkeypatch):
    """The cache is keyed by the GGUF file's content: a copy at another path (another name too) loads the
    same converted folder, no second conversion; a captured model_source names the file's own path."""
    import shutil

    pytest.importorskip("gguf")
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path / "cache"))
    path = write_tiny_gguf("qwen3", tmp_path / "tiny.gguf")
    assert run("heads", TEXT, "-m", path, "--json").exit_code == 0
    converted = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith("gguf-"))
    (tmp_path / "elsewhere").mkdir()
    copy = shutil.copy2(path, tmp_path / "elsewhere" / "renamed.gguf")
    done = run("capture", TEXT, "-m", copy, "-o", tmp_path / "c.npz")
    assert done.exit_code == 0 and "Converting" not in done.stderr
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith("gguf-")) == converted
    from attnviz.data.capture import Capture

    assert Capture.load(tmp_path / "c.npz").meta["model_source"] == str(Path(copy).resolve())
