"""attnviz.load → Model, Model.run → Run: the analyses of one run read one forward pass, each equal to the top-level
function's result; named hook points read what the model computes; every hook goes through engine/hooks."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

import attnviz
from helpers import model_state, require_real

SENTENCE = "The cat sat on the mat because it was tired, and the dog sat by the door."
READERS = ("heads", "entropy", "rollout", "sinks", "norms", "contributions")  # and logit_attr, for a decoder


def plain(d):
    """to_dict() as JSON data, numpy arrays as lists (the form --json prints)."""
    return json.loads(json.dumps(d, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def counted(module):
    """A user's own forward hook on `module`, counting its calls."""
    calls = [0]

    def count(_module, _args, _output):
        calls[0] += 1

    return module.register_forward_hook(count), calls


def _object(folder: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")
    return model, AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_seven_analyses_of_one_run_make_one_forward_pass(tiny_lm_dir, kind):
    """A model object handed to attnviz.load with the user's hook counting its calls: heads, entropy, rollout,
    sinks, norms, contributions and logit_attr of one run call it once, and each equals the top-level function
    handed the same model object."""
    model, tokenizer = _object(tiny_lm_dir(kind))
    handle, calls = counted(model)
    try:
        m = attnviz.load(model, tokenizer=tokenizer)
        run = m.run(SENTENCE)
        results = {name: getattr(run, name)() for name in (*READERS, "logit_attr")}
        assert calls[0] == 1 and run.passes == 1
        assert set(run.kept) >= {"blocks.0.resid.pre", "blocks.1.attn.out", "ln_final.out"}
        for name, result in results.items():
            alone = getattr(attnviz, name)(SENTENCE, model=model, tokenizer=tokenizer)
            assert plain(result.to_dict()) == plain(alone.to_dict()), name
        assert calls[0] > 1  # the top-level functions each ran it again
    finally:
        handle.remove()


def test_an_encoders_run_is_one_pass_for_six_and_refuses_logit_attribution(tiny_model_dir):
    m = attnviz.load(tiny_model_dir("bert"))
    run = m.run(SENTENCE)
    results = {name: getattr(run, name)() for name in READERS}
    assert run.passes == 1
    for name, result in results.items():
        assert plain(result.to_dict()) == plain(getattr(attnviz, name)(SENTENCE, model=m).to_dict()), name
    with pytest.raises(attnviz.AttnvizError, match="causal language model"):
        run.logit_attr()


def test_a_run_that_keeps_alpha_alone_makes_one_more_pass_for_all_the_rest(tiny_lm_dir):
    m = attnviz.load(tiny_lm_dir("llama"))
    run = m.run(SENTENCE, keep="alpha")
    run.heads(), run.entropy(), run.rollout()
    assert run.passes == 1 and run.kept == ()
    norms = run.norms()
    assert run.passes == 2 and run.kept
    run.sinks(), run.contributions(), run.logit_attr()
    assert run.passes == 2
    assert plain(norms.to_dict()) == plain(attnviz.norms(SENTENCE, model=m).to_dict())


def test_interventions_of_a_run_count_their_own_passes(tiny_lm_dir):
    m = attnviz.load(tiny_lm_dir("gpt2"))
    run = m.run(SENTENCE)
    run.heads()
    assert run.passes == 1
    result = run.faithfulness(methods=["attention", "random"], orders=20, sanity=0, steps=4)
    assert run.passes > 2  # erasure runs the model once per step, at least
    assert result.to_dict()["methods"] == attnviz.faithfulness(SENTENCE, model=m, methods=["attention", "random"],
                                                               orders=20, sanity=0, steps=4).to_dict()["methods"]


def test_a_borrowed_model_is_given_back_after_every_question(tiny_lm_dir):
    model, tokenizer = _object(tiny_lm_dir("llama"))
    model.train()
    model.model.layers[0].eval()
    handle, _ = counted(model)
    try:
        before = model_state(model)
        m = attnviz.load(model, tokenizer=tokenizer)
        run = m.run(SENTENCE)
        for name in (*READERS, "logit_attr"):
            getattr(run, name)()
            assert model_state(model) == before, name
        assert before["attention"] == "sdpa" and before["hooks"] == 1
    finally:
        handle.remove()


def test_a_run_of_a_name_loads_the_output_layer_only_when_logit_attribution_asks(tiny_lm_dir, tmp_path):
    """A decoder saved without its head is loaded without it: the run's pass has no logits, logit_attr gets the
    head then (onto the same blocks) and applies it to the final norm's output; the logit equals the one
    logit_attr reads from a model loaded with its head."""
    m = attnviz.load(tiny_lm_dir("llama"))
    blocks = m.model
    assert blocks.get_output_embeddings() is None
    run = m.run(SENTENCE)
    run.heads()
    result = run.logit_attr()
    assert run.passes == 1
    assert m.model.get_output_embeddings() is not None and m.model.base_model is blocks  # the same blocks
    whole = attnviz.logit_attr(SENTENCE, model=attnviz.load_model(tiny_lm_dir("llama"), lm_head=True))
    assert result.target_id == whole.target_id
    assert abs(result.logit - whole.logit) <= 1e-5 * max(1.0, abs(whole.logit))


def test_a_run_refuses_what_is_not_a_text_analysis_of_words():
    with pytest.raises(attnviz.AttnvizError, match="keep"):
        attnviz.Run(attnviz.load("minilm"), SENTENCE, keep="everything")
    run = attnviz.load("minilm").run(SENTENCE, words=True)
    assert run.heads().to_dict()
    with pytest.raises(attnviz.AttnvizError, match="words"):
        run.norms()


# --- named hook points --------------------------------------------------------------------------------------

def test_named_points_hold_what_the_model_computes(tiny_lm_dir):
    """Each point against an independent computation: resid.pre of block 0 is the token embeddings; resid.mid is
    resid.pre + attn.out (Llama adds the attention output to the stream); resid.pre of block n + 1 is
    resid.mid + mlp.out of block n; ln_final.out is the model's last hidden state."""
    from attnviz.engine.models import load
    from attnviz.engine.forward import encode
    from attnviz.engine.points import every_point, record

    loaded = load(tiny_lm_dir("llama"), device="cpu")
    encoded = encode(loaded, SENTENCE)
    names = every_point(loaded.model)
    recording = record(loaded.model, encoded.inputs, names)
    base = loaded.model
    with torch.inference_mode():
        embedded = base.get_input_embeddings()(encoded.inputs["input_ids"])
        last = base(**encoded.inputs).last_hidden_state
    tol = dict(rtol=0, atol=1e-5)
    torch.testing.assert_close(recording["blocks.0.resid.pre"], embedded, **tol)
    L = len(recording.run.layers)
    for n in range(L):
        torch.testing.assert_close(recording[f"blocks.{n}.resid.mid"],
                                   recording[f"blocks.{n}.resid.pre"] + recording[f"blocks.{n}.attn.out"], **tol)
        if n + 1 < L:
            torch.testing.assert_close(recording[f"blocks.{n + 1}.resid.pre"],
                                       recording[f"blocks.{n}.resid.mid"] + recording[f"blocks.{n}.mlp.out"], **tol)
    torch.testing.assert_close(recording["ln_final.out"], last, **tol)
    with pytest.raises(ValueError, match="no hook point"):
        record(loaded.model, encoded.inputs, ["blocks.9.attn.out"])


def test_hooks_are_removed_however_the_block_ends():
    from attnviz.engine.hooks import Hook, hooked

    layer = torch.nn.Linear(2, 2)

    def fail(module, args, output):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with hooked([Hook(layer, "pre", lambda m, a: None), Hook(layer, "forward", fail)]):
            layer(torch.zeros(1, 2))
    assert not layer._forward_hooks and not layer._forward_pre_hooks
    with pytest.raises(ValueError):  # one that cannot register: those before it are removed
        with hooked([Hook(layer, "pre", lambda m, a: None), Hook(layer, "sideways", lambda *a: None)]):  # type: ignore[arg-type]
            pass
    assert not layer._forward_pre_hooks


REGISTERING = {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
               "register_full_backward_pre_hook", "register_backward_hook", "register_hook"}


def raw_registrations(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in REGISTERING:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_hook_is_registered_outside_engine_hooks():
    root = Path(attnviz.__file__).parent
    outside = [where for where in raw_registrations(root) if not where.startswith("attnviz/engine/hooks.py")]
    assert outside == []
    # the four kinds of module hook, in engine/hooks._register, and a tensor's gradient hook, in on_gradient
    assert len(raw_registrations(root)) == 5


def test_the_check_finds_a_raw_hook(tmp_path):
    package = tmp_path / "attnviz"
    package.mkdir()
    (package / "x.py").write_text("def f(m):\n    return m.register_forward_hook(print)\n", encoding="utf-8")
    assert raw_registrations(package) == ["attnviz/x.py:2"]


@pytest.mark.slow
def test_smollm2_object_seven_analyses_one_pass():
    """The issue's check on the real model: SmolLM2 handed in as a model object with a hook counting its calls."""
    from attnviz.engine import offline

    require_real(offline.SMOLLM2)
    loaded = attnviz.load_model("smollm2", lm_head=True)
    model, tokenizer = loaded.model, loaded.tokenizer
    handle, calls = counted(model)
    try:
        run = attnviz.load(model, tokenizer=tokenizer).run("The capital of France is")
        results = {name: getattr(run, name)() for name in (*READERS, "logit_attr")}
        assert calls[0] == 1 and run.passes == 1
        assert results["logit_attr"].target == " Paris"
        for name, result in results.items():
            alone = getattr(attnviz, name)("The capital of France is", model=model, tokenizer=tokenizer)
            assert plain(result.to_dict()) == plain(alone.to_dict()), name
    finally:
        handle.remove()
