"""A causal model is measured as one by what it is, never by whether its output layer was loaded: a decoder loaded
without its head (attnviz.load_model's default, or a user's AutoModel object) gets the head the first time an
analysis needs next-token logits, around the very same blocks (no second copy), and gives the numbers the model
loaded with its head gives; where the head cannot be known, the analysis refuses in one line."""

from __future__ import annotations

import pytest
import torch

import attnviz
from attnviz.errors import InputError

TEXT = "the cat sat on the"


@pytest.fixture(scope="module")
def untied_llama(tmp_path_factory):
    """A tiny Llama with its head not tied to the embeddings, saved with it (so lm_head.weight is on disk)."""
    import transformers as tf
    from helpers import bpe_tokenizer

    torch.manual_seed(1)
    tokenizer = bpe_tokenizer("metaspace")
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=len(tokenizer), num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        hidden_size=32, intermediate_size=64, initializer_range=0.3, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, max_position_embeddings=128))
    folder = tmp_path_factory.mktemp("untied") / "llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def probabilities(result) -> tuple:
    return result.causal, round(result.f_full, 12), result.quantity


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_decoder_loaded_without_its_head_is_measured_as_a_causal_lm(kind, tiny_lm_dir):
    """load_model's default leaves the head out; faithfulness then measures p(next token), as with the head loaded
    (was: the cosine of the sentence embedding, causal False), and patch takes answers (was: "is an encoder")."""
    folder = tiny_lm_dir(kind)
    bare = attnviz.load_model(folder, device="cpu")
    with_head = attnviz.load_model(folder, device="cpu", lm_head=True)
    blocks = bare.model
    assert bare.model.get_output_embeddings() is None  # loaded without it
    got = attnviz.faithfulness(TEXT, model=bare, methods=["attention"], sanity=0)
    want = attnviz.faithfulness(TEXT, model=with_head, methods=["attention"], sanity=0)
    assert got.causal and probabilities(got) == probabilities(want) and got.quantity.startswith("p(")
    # the head came around the same blocks: no second copy of them, and it stays for the next call
    inner = getattr(bare.model, bare.model.base_model_prefix)
    assert inner is blocks and sum(p.numel() for p in bare.model.parameters()) == \
        sum(p.numel() for p in with_head.model.parameters())
    head = bare.model.get_output_embeddings().weight
    if kind == "gpt2":  # tied: the embeddings themselves
        assert head is blocks.get_input_embeddings().weight
    else:  # the tiny Llama's head is its own, read from its folder
        assert torch.equal(head, with_head.model.get_output_embeddings().weight)
    tokenizer = with_head.tokenizer
    answers = [text for text in (tokenizer.decode([i]) for i in range(5, 120))
               if text.strip() and len(tokenizer.encode(text, add_special_tokens=False)) == 1][:2]
    patched = attnviz.patch(TEXT, "the dog sat on the", model=bare, answers=answers).to_dict()
    again = attnviz.patch(TEXT, "the dog sat on the", model=with_head, answers=answers).to_dict()
    assert (patched["clean_logit_diff"], patched["heads"]) == (again["clean_logit_diff"], again["heads"])


def test_an_untied_head_is_read_from_the_models_own_files(untied_llama):
    """A head not tied to the embeddings: its weights come from the folder's safetensors, and the logits equal
    the model loaded with its head exactly."""
    bare = attnviz.load_model(untied_llama, device="cpu")
    with_head = attnviz.load_model(untied_llama, device="cpu", lm_head=True)
    got = attnviz.faithfulness(TEXT, model=bare, methods=["attention"], sanity=0)
    want = attnviz.faithfulness(TEXT, model=with_head, methods=["attention"], sanity=0)
    assert probabilities(got) == probabilities(want)
    head = bare.model.get_output_embeddings().weight
    assert head is not bare.model.get_input_embeddings().weight
    assert torch.equal(head, with_head.model.get_output_embeddings().weight)


def test_a_users_bare_decoder_object_gets_its_tied_head_and_is_given_back(tiny_lm_dir):
    """The user's own AutoModel object of a decoder with tied embeddings (GPT-2): measured as a causal LM; the
    object itself is not changed (still headless, same mode)."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    folder = tiny_lm_dir("gpt2")
    model = AutoModel.from_pretrained(folder, attn_implementation="eager")
    model.train()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    got = attnviz.faithfulness(TEXT, model=model, tokenizer=tokenizer, methods=["attention"], sanity=0)
    full = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    want = attnviz.faithfulness(TEXT, model=full, tokenizer=tokenizer, methods=["attention"], sanity=0)
    assert probabilities(got) == probabilities(want) and got.causal
    assert model.training and model.get_output_embeddings() is None


def test_a_users_bare_decoder_whose_head_cannot_be_known_is_refused(untied_llama):
    """Untied and handed in without its head: no number is made up; one line says what to hand in."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(untied_llama, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(untied_llama)
    with pytest.raises(InputError, match="without its output layer.*with its head"):
        attnviz.faithfulness(TEXT, model=model, tokenizer=tokenizer, methods=["attention"], sanity=0)


def test_the_engine_never_reads_a_headless_decoder_as_an_encoder(tiny_model_dir):
    """is_causal_lm: a decoder without its head is an error, not False (which measured it as an encoder)."""
    from attnviz.engine.ablation import is_causal_lm
    from attnviz.engine.models import load

    assert is_causal_lm(load(tiny_model_dir("bert"), device="cpu").model) is False
    with pytest.raises(InputError, match="without its output layer"):
        is_causal_lm(load(tiny_model_dir("llama"), device="cpu").model)
