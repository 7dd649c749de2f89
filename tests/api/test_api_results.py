"""The API's typed results: each command's --json is its function's to_dict(), byte for byte, on the same input
(TEXT, standard input, --text-file); a model handed in comes back in its own mode; errors name the API's
arguments, and the command line spells them as flags."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from helpers import model_state as _state, run

import attnviz
from attnviz.base.records import to_json

SENTENCE = "the cat sat on the mat"


@pytest.fixture(scope="module")
def bert(tiny_model_dir):
    return tiny_model_dir("bert")


@pytest.fixture(scope="module")
def bert_model(bert):
    return attnviz.load_model(bert, device="cpu")


def cli_json(*args, **kwargs) -> str:
    result = run(*args, "--json", **kwargs)
    assert result.exit_code == 0, result.output
    return result.stdout


# (command, its arguments after TEXT, the API call on the same model)
CASES = {
    "verify": ([], lambda m: attnviz.verify(SENTENCE, model=m)),
    "verify_norms": (["--norms"], lambda m: attnviz.verify(SENTENCE, model=m, norms=True)),
    "steps": (["--layer", "1", "--head", "-1", "--token", "cat"],
              lambda m: attnviz.steps(SENTENCE, model=m, layer=1, head=-1, token="cat")),
    "positions": (["--seed", "3"], lambda m: attnviz.positions(SENTENCE, model=m, seed=3)),
    "scaling": (["--dk", "16,32"], lambda m: attnviz.scaling(SENTENCE, model=m, dk=[16, 32])),
    "norms": ([], lambda m: attnviz.norms(SENTENCE, model=m)),
    "sinks": (["--threshold", "0.1"], lambda m: attnviz.sinks(SENTENCE, model=m, threshold=0.1)),
    "rollout": (["--token", "mat"], lambda m: attnviz.rollout(SENTENCE, model=m, token="mat")),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_the_command_prints_its_functions_to_dict(name, bert, bert_model):
    args, call = CASES[name]
    command = name.split("_")[0]
    printed = cli_json(command, SENTENCE, *args, "-m", bert, "--device", "cpu")
    assert to_json(call(bert_model).to_dict()) + "\n" == printed


@pytest.mark.parametrize("source", ["stdin", "file"])
def test_the_same_result_from_standard_input_and_a_text_file(source, bert, bert_model, tmp_path):
    expected = to_json(attnviz.norms(SENTENCE, model=bert_model).to_dict()) + "\n"
    if source == "stdin":
        printed = cli_json("norms", "-", "-m", bert, "--device", "cpu", input=SENTENCE + "\n")
    else:
        (tmp_path / "t.txt").write_text(SENTENCE + "\n", encoding="utf-8")
        printed = cli_json("norms", "--text-file", tmp_path / "t.txt", "-m", bert, "--device", "cpu")
    assert printed == expected


def test_verify_of_a_saved_capture_names_it(bert, bert_model, tmp_path):
    path = attnviz.capture(SENTENCE, model=bert_model).save(tmp_path / "c.npz")
    printed = cli_json("verify", "--from", path, "-m", bert, "--device", "cpu")
    result = attnviz.verify(capture=path, model=bert_model)
    assert result.kind == "capture" and result.source == str(path) and result.passed
    assert to_json(result.to_dict()) + "\n" == printed
    assert set(result.to_dict()) >= {"saved_vs_model", "model_vs_scratch"}


@pytest.mark.slow
def test_generate_and_cost(tiny_lm_dir):
    folder = tiny_lm_dir("gpt2")
    model = attnviz.load_model(folder, device="cpu", lm_head=True)
    printed = cli_json("generate", "the cat", "-m", folder, "--device", "cpu", "-n", "5", "--layer", "0")
    generation = attnviz.generate("the cat", model=model, max_new_tokens=5)
    assert to_json(generation.to_dict(layer=0)) + "\n" == printed
    assert int(generation.capture.generated.sum()) == len(generation.to_dict(layer=0)["steps"]) <= 5
    cost = attnviz.cost(model=model, lengths=[8, 16])
    assert [r["T"] for r in cost.to_dict()["rows"]] == [8, 16]
    assert all(r["alpha_bytes"] == 4 * model.shape[0] * model.shape[1] * r["T"] ** 2 for r in cost.records())


def test_corpus_over_texts_is_the_commands_statistics(bert, bert_model, tmp_path):
    texts = [SENTENCE, "a dog ran home", "the mat was red"]
    (tmp_path / "c.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    printed = json.loads(cli_json("corpus", tmp_path / "c.txt", "-m", bert, "--device", "cpu"))
    state = attnviz.corpus(texts, model=bert_model)  # the same batches as the command: the same float32 sums
    assert state.texts == 3 == printed["summary"]["texts"]
    assert json.loads(to_json(state.records())) == printed["heads"]


def test_a_model_handed_in_comes_back_in_its_own_mode(bert):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(bert, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(bert)
    model.train()
    for call in (lambda: attnviz.verify(SENTENCE, model=model, tokenizer=tokenizer),
                 lambda: attnviz.steps(SENTENCE, model=model, tokenizer=tokenizer),
                 lambda: attnviz.sinks(SENTENCE, model=model, tokenizer=tokenizer)):
        result = call()
        assert model.training
        assert to_json(result.to_dict())  # ran in eval mode: dropout would break verify's 1e-5
    assert attnviz.verify(SENTENCE, model=model, tokenizer=tokenizer).passed
    model.eval()
    attnviz.norms(SENTENCE, model=model, tokenizer=tokenizer)
    assert not model.training


def test_errors_name_the_argument_and_the_command_line_spells_the_flag(bert, bert_model):
    with pytest.raises(attnviz.AttnvizError) as caught:
        attnviz.steps(SENTENCE, model=bert_model, layer=9)
    assert caught.value.field == "layer" and str(caught.value).startswith("layer 9 is out of range: there are 2")
    from attnviz.cli.output import flag
    from attnviz.errors import SelectionError
    from attnviz.base.selection import Selection

    with pytest.raises(SelectionError) as caught:
        Selection.parse("5-2", "layer", field="layers")
    assert str(caught.value) == "layers: the range 5-2 is reversed; write 2-5"
    assert caught.value.spelled(flag) == "--layers: the range 5-2 is reversed; write 2-5"
    streamed = run("heads", SENTENCE, "-m", bert, "--device", "cpu", "--stream")  # its note names the flag
    assert streamed.exit_code == 0 and "(--stream)" in streamed.stderr and "\ue000" not in streamed.stderr
    with pytest.raises(attnviz.AttnvizError) as caught:
        attnviz.sinks(SENTENCE, model=bert_model, threshold=2.0)
    assert caught.value.field == "threshold" and "threshold" in str(caught.value)


def test_each_result_against_an_independent_computation(bert_model):
    """The numbers of each result, recomputed here from the model's own α (one forward pass, eager attention)
    by their definitions: what to_dict() says must be what the quantity is (float32 α: 1e-6)."""
    import math

    import numpy as np

    capture = attnviz.capture(SENTENCE, model=bert_model)
    alpha = capture.attentions.astype(np.float64)  # (L, H, T, T)
    L, H, T, _ = alpha.shape
    tokens = list(capture.tokens)

    steps = attnviz.steps(SENTENCE, model=bert_model, layer=1, head=-1, token="cat").to_dict()
    np.testing.assert_allclose(steps["alpha"], alpha[1, H - 1], atol=1e-6)
    np.testing.assert_allclose(np.asarray(steps["out"]), np.asarray(steps["alpha"]) @ np.asarray(steps["v"]),
                               atol=1e-9)
    assert steps["tokens"] == tokens and steps["token"] == tokens.index("cat") and steps["head"] == H - 1
    assert steps["sqrt_d_k"] == math.sqrt(steps["d_k"]) and steps["d_k"] * H == bert_model.model.config.hidden_size

    verified = attnviz.verify(SENTENCE, model=bert_model).to_dict()
    assert [d["layer"] for d in verified["layers"]] == list(range(L)) and verified["tokens"] == tokens
    assert verified["max_abs_diff"] == max(d["max_abs"] for d in verified["layers"]) <= 1e-5

    scaling = attnviz.scaling(SENTENCE, model=bert_model).to_dict()
    assert scaling["T"] == T and scaling["ln_T"] == math.log(T) and scaling["d_k"] == steps["d_k"]

    norms = attnviz.norms(SENTENCE, model=bert_model).to_dict()
    special = capture.special
    for n, record in enumerate(norms):
        assert record["layer"] == n
        assert abs(record["alpha_on_first"] - alpha[n, ..., 0].mean()) < 1e-6
        assert abs(record["alpha_on_special"] - alpha[n][..., special].sum(-1).mean()) < 1e-6

    sinks = attnviz.sinks(SENTENCE, model=bert_model, threshold=0.0).to_dict()
    assert len(sinks["sinks"]) == L * H  # a threshold of 0: every head's strongest key
    for record in sinks["sinks"]:  # an encoder: every query sees every key, so the score is the column mean
        column = alpha[record["layer"], record["head"]].mean(axis=0)
        assert record["key"] == int(column.argmax()) and abs(record["sink_score"] - column.max()) < 1e-6
        assert record["token"] == tokens[record["key"]]

    rolled = attnviz.rollout(capture, token="mat").to_dict()
    reach = np.eye(T)
    for n in range(L):  # Abnar & Zuidema: rownorm(mean_h α + I), multiplied up through the layers
        step = alpha[n].mean(axis=0) + np.eye(T)
        reach = (step / step.sum(-1, keepdims=True)) @ reach
    assert rolled["token"] == tokens.index("mat")
    np.testing.assert_allclose(rolled["rollout"], reach[tokens.index("mat")], atol=1e-6)
    assert abs(sum(rolled["rollout"]) - 1) < 1e-9

    positions = attnviz.positions(SENTENCE, model=bert_model, seed=3).to_dict()
    assert sorted(positions["permutation"]) == list(range(len(positions["permutation"])))
    assert sorted(positions["shuffled"]) == sorted(positions["words"]) == sorted(SENTENCE.split())
    assert len(positions["with_positions"]["per_layer"]) == L
    assert positions["without_positions"]["max_abs_diff"] < 1e-5 < positions["with_positions"]["max_abs_diff"]


def test_a_warning_names_the_argument_in_python_and_the_flag_on_the_command_line(bert, bert_model):
    """The unknown-words warning says which model reads them: model='multilingual' to a notebook,
    --model multilingual on the command line; no private mark leaks into either."""
    import warnings

    from transformers import AutoTokenizer

    text = "The cat 먹었다 ✂ here"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attnviz.capture(text, model=bert_model, tokenizer=AutoTokenizer.from_pretrained(bert))
    said = [str(w.message) for w in caught if issubclass(w.category, attnviz.AttnvizWarning)]
    assert any("model='multilingual' reads them" in s for s in said), said
    assert not any("\ue000" in s or "--model" in s for s in said)
    done = run("heads", text, "-m", bert, "--device", "cpu")
    assert done.exit_code == 0 and "--model multilingual reads them" in done.stderr and "\ue000" not in done.stderr




BORROWERS = {  # every API function that takes model=, called on a small text
    "capture": lambda m, t: attnviz.capture(SENTENCE, model=m, tokenizer=t),
    "capture streamed": lambda m, t: attnviz.capture(SENTENCE, model=m, tokenizer=t, stream=True),
    "importance": lambda m, t: attnviz.importance(SENTENCE, model=m, tokenizer=t),
    "ablate": lambda m, t: attnviz.ablate(SENTENCE, heads=[(0, 0)], model=m, tokenizer=t),
    "detect": lambda m, t: attnviz.detect(model=m, tokenizer=t, length=8, sequences=2),
    "verify": lambda m, t: attnviz.verify(SENTENCE, model=m, tokenizer=t),
    "norms": lambda m, t: attnviz.norms(SENTENCE, model=m, tokenizer=t),
    "sinks": lambda m, t: attnviz.sinks(SENTENCE, model=m, tokenizer=t),
    "steps": lambda m, t: attnviz.steps(SENTENCE, model=m, tokenizer=t),
    "positions (refused: causal)": lambda m, t: attnviz.positions(SENTENCE, model=m, tokenizer=t),
    "scaling": lambda m, t: attnviz.scaling(SENTENCE, model=m, tokenizer=t),
    "generate": lambda m, t: attnviz.generate(SENTENCE, model=m, tokenizer=t, max_new_tokens=2),
    "corpus": lambda m, t: attnviz.corpus([SENTENCE, "A dog ran"], model=m, tokenizer=t),
    "logit_attr": lambda m, t: attnviz.logit_attr(SENTENCE, model=m, tokenizer=t),
    "contributions": lambda m, t: attnviz.contributions(SENTENCE, model=m, tokenizer=t),
    "patch": lambda m, t: attnviz.patch(SENTENCE, SENTENCE.replace("cat", "dog"), model=m, tokenizer=t,
                                        answers=(5, 7)),
    "patch aligned": lambda m, t: attnviz.patch(SENTENCE, SENTENCE.replace("cat", "big dog"), model=m,
                                                tokenizer=t, answers=(5, 7), align="auto"),
    "path_patch": lambda m, t: attnviz.path_patch(SENTENCE, SENTENCE.replace("cat", "dog"), senders="0.1",
                                                  receivers="1.0", model=m, tokenizer=t, answers=(5, 7)),
    "massive": lambda m, t: attnviz.massive(SENTENCE, model=m, tokenizer=t, ratio=2.0, minimum=0.0,
                                            intervene=True, reference=["A dog ran"]),
    "sink_rate": lambda m, t: attnviz.sink_rate([SENTENCE, "A dog ran"], model=m, tokenizer=t),
    "retrieval (refused: a haystack past 64 positions)": lambda m, t: attnviz.retrieval(
        model=m, tokenizer=t, lengths=[60], depths=[0.5], remove=2, draws=1),
    "capture_audio (refused: not a speech model)": lambda m, t: attnviz.capture_audio(
        np.zeros(16_000, np.float32), model=m, tokenizer=t),
    "faithfulness": lambda m, t: attnviz.faithfulness(SENTENCE, model=m, tokenizer=t,
                                                      methods=["attention", "loo", "random"], sanity=1),
    "faithfulness (refused: its arguments)": lambda m, t: attnviz.faithfulness(123, model=m, tokenizer=t),
    "discover": lambda m, t: attnviz.discover(SENTENCE, SENTENCE.replace("cat", "dog"),
                                              answers=[t.decode([5]), t.decode([7])], model=m, tokenizer=t,
                                              method="eap"),
}


@pytest.fixture
def users_model(tiny_lm_dir):
    """A GPT-2 as a user might hold it: SDPA attention, training mode, a frozen embedding, and a hook of the
    user's own on the second block that raises when armed (an exception in the middle of attnviz's run)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_lm_dir("gpt2")
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.transformer.wte.weight.requires_grad_(False)  # the user's own choice
    armed: dict = {"on": False}  # an exception type to raise from the hook, or False

    def hook(module, args, output):
        if armed["on"]:
            raise armed["on"]("the user's hook fails midway")

    mine = model.transformer.h[1].register_forward_hook(hook)
    model.train()
    model.transformer.h[0].eval()  # modes mixed, as a user fine-tuning part of a model has them
    yield model, tokenizer, armed
    mine.remove()


@pytest.mark.parametrize("function", BORROWERS)
def test_a_borrowed_model_comes_back_as_it_was(users_model, function):
    """Every API function that takes a model object gives it back as it was, when it succeeds and when an
    exception stops it midway: importance's gradient pass leaves no .grad, a capture leaves no hook, the SDPA
    model gets SDPA back, a frozen parameter stays frozen, training mode stays, the user's hook stays."""
    model, tokenizer, armed = users_model
    before = _state(model)
    assert before["attention"] == "sdpa" and before["hooks"] == 1 and before["training"]
    assert not all(before["modes"]) and any(before["modes"])  # block 0 in eval, the rest training
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            BORROWERS[function](model, tokenizer)
        except attnviz.AttnvizError:
            assert "refused" in function  # positions is for encoders: refused after the model was resolved
        assert _state(model) == before
        for stop in (RuntimeError, KeyboardInterrupt):  # an error midway; Ctrl-C midway
            armed["on"] = stop
            with pytest.raises((stop, attnviz.AttnvizError)):
                BORROWERS[function](model, tokenizer)
            armed["on"] = False
            assert _state(model) == before, stop
    assert _state(model) == before


def test_circuits_read_a_borrowed_model_without_changing_it(users_model):
    """circuits reads weights and runs nothing: the model comes back as it was, and its weights unchanged."""
    import torch

    model, tokenizer, _ = users_model
    before, weights = _state(model), [p.detach().clone() for p in model.parameters()]
    attnviz.circuits(model=model, tokenizer=tokenizer, tokens=20)
    assert _state(model) == before
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


def test_a_borrowed_model_answers_its_own_calls_afterwards(users_model):
    model, tokenizer, _ = users_model
    attnviz.capture(SENTENCE, model=model, tokenizer=tokenizer)
    model.set_attn_implementation("eager")  # the user's own next call still gets its attention weights
    out = model(**tokenizer(SENTENCE, return_tensors="pt"), output_attentions=True)
    assert len(out.attentions) == model.config.n_layer and all(a is not None for a in out.attentions)
