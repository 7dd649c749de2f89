
import numpy as np
import pytest
from helpers import SENTENCE, one_line_error, run

from attnviz.engine.forward import capture_text
from attnviz.engine.models import load, resolve_model
from attnviz.errors import AttnvizWarning, InputError, ModelLoadError

pytestmark = pytest.mark.slow


def test_bundled_minilm_cat_sentence(cat_capture):
    cap = cat_capture
    assert cap.attentions.shape == (6, 12, 8, 8)
    assert cap.tokens == ("[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]")
    assert "[PAD]" not in cap.tokens
    np.testing.assert_allclose(cap.attentions.sum(-1), 1.0, atol=1e-5)
    assert cap.special.tolist() == [True] + [False] * 6 + [True]
    assert cap.special_kind[0] == "start" and cap.special_kind[-1] == "end"
    assert not cap.causal
    assert cap.meta["model"] == "sentence-transformers/all-MiniLM-L6-v2" and cap.meta["dtype"] == "float32"


def test_loading_twice_gives_identical_attention(cat_capture):
    again = capture_text(SENTENCE, load("sentence-transformers/all-MiniLM-L6-v2", device="cpu"))
    np.testing.assert_array_equal(again.attentions, cat_capture.attentions)


def test_subwords_are_marked(minilm):
    cap = capture_text("Unbelievably, tokenization works", minilm)
    assert "##ization" in cap.tokens
    i = cap.tokens.index("##ization")
    assert cap.subword[i] and not cap.subword[i - 1]


def test_tiny_gpt2_is_causal_and_readable(load_tiny):
    cap = capture_text(SENTENCE, load_tiny("gpt2"))
    assert cap.causal
    a = cap.attentions  # (2, 4, T, T)
    assert a.shape[:2] == (2, 4)
    np.testing.assert_array_equal(np.triu(a, k=1), 0.0)
    assert not np.allclose(np.tril(a, k=-1), 0.0)
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)
    joined = "".join(t.removeprefix("##") for t in cap.tokens).replace("␣", "")
    assert joined == SENTENCE.replace(" ", "")  # Ġ markers gone, nothing lost
    assert not any("Ġ" in t for t in cap.tokens)


def test_tiny_llama_bos_is_start(load_tiny):
    cap = capture_text(SENTENCE, load_tiny("llama"))
    assert cap.tokens[0] == "<s>" and cap.special_kind[0] == "start" and cap.causal
    assert not any("▁" in t for t in cap.tokens)


def test_truncation_warns_and_no_truncate_refuses(load_tiny):
    gpt2 = load_tiny("gpt2")  # n_positions = 64
    long_text = " ".join(["The cat sat on the mat."] * 40)
    with pytest.warns(AttnvizWarning, match=r"tokens were dropped"):
        cap = capture_text(long_text, gpt2)
    assert cap.n_tokens == 64 and cap.meta["dropped_tokens"] > 0
    with pytest.raises(InputError, match="at most 64"):
        capture_text(long_text, gpt2, truncate=False)


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_empty_text_is_refused(minilm, text):
    with pytest.raises(InputError, match="empty"):
        capture_text(text, minilm)


def test_model_resolution_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ModelLoadError, match="is a file"):
        resolve_model(str(tmp_path / "f.txt"))
    assert resolve_model("minilm")[1] == resolve_model("sentence-transformers/all-MiniLM-L6-v2")[1]


def test_uncached_hub_model_fails_fast_naming_the_default(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="minilm"):
        load("someone/not-a-cached-model", device="cpu")


def test_corrupt_model_folder(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json is not JSON text"):
        load(str(tmp_path), device="cpu")
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')  # settings, but no weights or tokenizer
    with pytest.raises(ModelLoadError, match="could not load"):
        load(str(tmp_path), device="cpu")


def test_env_var_overrides_default(monkeypatch, tiny_model_dir):
    monkeypatch.setenv("ATTNVIZ_MODEL", tiny_model_dir("gpt2"))
    assert resolve_model(None)[0] == tiny_model_dir("gpt2")


def test_bad_device_and_dtype():
    with pytest.raises(InputError, match="device"):
        load("minilm", device="tpu")
    with pytest.raises(InputError, match="dtype"):
        load("minilm", dtype="int8")


def test_a_device_this_machine_cannot_have_is_refused_in_one_line(monkeypatch):
    """cuda without a GPU and mps off macOS: one line naming --device; where the torch build is CPU-only or
    the system is not macOS, before torch is imported (refuse_early); otherwise by torch itself."""
    import importlib.metadata
    import sys

    import torch

    from attnviz.base.devices import refuse_early
    from attnviz.engine.models import pick_device

    if not torch.cuda.is_available():
        assert "cuda" in one_line_error(run("heatmap", "The cat", "--device", "cuda", "-t"))
    if sys.platform != "darwin":
        assert "mps" in one_line_error(run("heatmap", "The cat", "--device", "mps", "-t"))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+cpu")
    with pytest.raises(InputError, match="built for the CPU only"):
        refuse_early("gpu")
    refuse_early("cpu")
    refuse_early("auto")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+cu128")
    refuse_early("cuda")  # a CUDA build: torch decides (pick_device) whether a GPU is there
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no CUDA GPU"):
            pick_device("cuda")


def test_a_bare_encoder_decoder_checkpoint_loads_with_its_head(tmp_path):
    """A T5Model saved without its LM head, with the bundled (BERT) tokenizer, whose vocabulary fits: it
    loads as an encoder-decoder model (T5 ties its head to the embeddings) and all three parts come out."""
    import transformers as tf

    from attnviz.engine.models import bundled_model_dir
    from attnviz.engine.seq2seq import parts_capture

    config = tf.T5Config(vocab_size=30522, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                         decoder_start_token_id=0)
    tf.T5Model(config).save_pretrained(tmp_path)
    tf.AutoTokenizer.from_pretrained(str(bundled_model_dir())).save_pretrained(tmp_path)
    loaded = load(str(tmp_path), device="cpu")
    assert loaded.seq2seq
    parts = parts_capture(loaded, "The cat sat on the mat", target="The dog")
    assert parts.names == ["encoder", "decoder", "cross"]
    assert parts.part("cross").attentions.shape[2:] == (len(parts.part("decoder").tokens),
                                                       len(parts.part("encoder").tokens))
