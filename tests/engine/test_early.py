"""α without the work after the last attention (engine/early.py), as the corpus runs it: the weights equal the full
pass's exactly on every family (padding and masks included), the corpus statistics equal, the model's hooks are
gone afterwards, and a model that does not say where its weights come from runs the full pass."""

from __future__ import annotations

import pytest
from helpers import TEXTS, TODAYS, build_tiny_model

from attnviz.engine.early import attention_modules, stopped_attentions

FAMILIES = ("bert", "roberta", "distilbert", "electra", "gpt2", "llama", "mistral", "qwen2", *TODAYS)


def loaded(kind, folder):
    from attnviz.engine.models import load

    return load(str(build_tiny_model(kind, folder / kind)), device="cpu")


def batch(model, tokenizer):
    """Three texts of different lengths, right-padded, as the corpus batches them."""
    import torch

    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    T = max(map(len, ids))
    inputs = {"input_ids": torch.tensor([i + [0] * (T - len(i)) for i in ids]),  # masked: any id in the vocabulary
              "attention_mask": torch.tensor([[1] * len(i) + [0] * (T - len(i)) for i in ids])}
    return inputs


@pytest.mark.parametrize("kind", FAMILIES)
def test_the_weights_equal_the_full_pass_exactly(kind, tmp_path):
    import torch

    model = loaded(kind, tmp_path)
    inputs = batch(model.model, model.tokenizer)
    before = sum(len(m._forward_hooks) for m in model.model.modules())
    stopped = stopped_attentions(model.model, inputs)
    assert sum(len(m._forward_hooks) for m in model.model.modules()) == before  # every hook of its own removed
    with torch.inference_mode():
        full = model.model(**inputs, output_attentions=True).attentions
    if stopped is None:  # this family does not say where its weights come from: the full pass is run
        assert attention_modules(model.model) is None
        return
    assert len(stopped) == len(full) == model.model.config.num_hidden_layers
    for mine, theirs in zip(stopped, full):
        assert torch.equal(mine, theirs)
    assert all(torch.equal(a, b) for a, b in zip(stopped_attentions(model.model, inputs), full))  # and again


def test_the_corpus_statistics_are_the_same_either_way(tmp_path):
    from attnviz.corpora import Line
    from attnviz.engine.corpora.run import BatchRunner, run_local

    model = loaded("bert", tmp_path)
    lines = [Line("t", n, text, None) for n, text in enumerate(TEXTS * 5)]
    results = []
    for early in (True, False):
        runner = BatchRunner(model, batch_size=4)
        runner.stop_early = early
        state = runner.new_state()
        assert run_local(runner, lines, state)
        results.append(state.to_json())
    for found in results:
        found.pop("runs")  # a random id per run
    assert results[0] == results[1] and results[0]["texts"] == 15


def test_a_model_that_does_not_say_where_its_weights_come_from_runs_the_full_pass(tmp_path):
    model = loaded("bert", tmp_path)
    inputs = batch(model.model, model.tokenizer)
    model.model._can_record_outputs = {}  # an instance attribute: the class keeps its own
    assert attention_modules(model.model) is None and stopped_attentions(model.model, inputs) is None
