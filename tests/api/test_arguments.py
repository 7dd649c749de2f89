"""Every public function checks its arguments: a value of the wrong type, shape or range is an AttnvizError
that names the argument, never a TypeError, ValueError, AttributeError or OverflowError from deep inside
numpy or torch. Hypothesis draws the values."""

from __future__ import annotations

import inspect
import math
import numbers
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnviz
from attnviz.base.arguments import checked
from attnviz.errors import AttnvizError, InputError, UsageError

ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.binary(max_size=4), st.lists(st.integers(-3, 3), max_size=3),
    st.lists(st.text(max_size=3), max_size=3), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.just(object()), st.just(np.array([1, 2])), st.just(np.float32("nan")), st.just(Path("x")),
    st.tuples(st.integers(), st.integers()))


# --- the checker on its own, against a second statement of each rule ------------------------------------


class Thing:
    pass


@checked
def sample(flag: bool = False, count: int = 0, share: float = 0.5, name: str = "", maybe: int | None = None,
           mode: Literal["zero", "mean"] = "zero", sizes: Sequence[int] | None = None, thing: Thing | None = None,
           path: str | os.PathLike = ".", free=None) -> str:
    return "ran"


def fits(parameter: str, value) -> bool:
    """Each annotation of `sample`, said again by hand."""
    def integer(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))

    return {
        "flag": lambda v: isinstance(v, (bool, np.bool_)),
        "count": integer,
        "share": lambda v: isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v),
        "name": lambda v: isinstance(v, str),
        "maybe": lambda v: v is None or integer(v),
        "mode": lambda v: isinstance(v, str) and v in ("zero", "mean"),
        "sizes": lambda v: v is None or isinstance(v, (list, tuple)) and all(integer(i) for i in v),
        "thing": lambda v: v is None or isinstance(v, Thing),
        "path": lambda v: isinstance(v, (str, os.PathLike)),
        "free": lambda v: True,
    }[parameter](value)


@given(parameter=st.sampled_from([p for p in inspect.signature(sample).parameters]), value=ANYTHING)
@settings(max_examples=400, deadline=None)
def test_the_checker_refuses_exactly_what_the_annotation_excludes(parameter, value):
    if fits(parameter, value):
        assert sample(**{parameter: value}) == "ran"
    else:
        with pytest.raises(UsageError) as caught:
            sample(**{parameter: value})
        message = str(caught.value)
        assert message.startswith(f"{parameter} takes ") and "; got " in message and "\n" not in message


def test_a_call_of_the_wrong_shape_is_pythons_own_type_error():
    with pytest.raises(TypeError):
        sample(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
    with pytest.raises(TypeError):
        sample(colour="red")


# --- the real functions -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_lm(tiny_model_dir):
    return attnviz.load_model(tiny_model_dir("gpt2"), lm_head=True)


@pytest.fixture(scope="module")
def small_capture(small_lm):
    return attnviz.capture("The cat sat on the mat", model=small_lm)


TEXT = "The cat sat on the mat"
CALLS = {  # function -> (how it is called with everything right, the keyword arguments to spoil)
    "capture": (lambda m, c, **kw: attnviz.capture(TEXT, model=m, **kw),
                ["words", "stream", "keep", "part", "target", "max_new_tokens", "truncate", "device", "dtype"]),
    "heads": (lambda m, c, **kw: attnviz.heads(c, **kw), []),
    "rollout": (lambda m, c, **kw: attnviz.rollout(c, **kw), ["token"]),
    "sinks": (lambda m, c, **kw: attnviz.sinks(TEXT, model=m, **kw), ["threshold", "truncate", "reporter"]),
    "norms": (lambda m, c, **kw: attnviz.norms(TEXT, model=m, **kw), ["truncate", "reporter"]),
    "steps": (lambda m, c, **kw: attnviz.steps(TEXT, model=m, **kw), ["layer", "head"]),
    "verify": (lambda m, c, **kw: attnviz.verify(TEXT, model=m, **kw), ["norms", "reporter"]),
    "scaling": (lambda m, c, **kw: attnviz.scaling(TEXT, model=m, **kw), ["dk"]),
    "generate": (lambda m, c, **kw: attnviz.generate(TEXT, model=m, **kw),
                 ["max_new_tokens", "decoding", "sample", "temperature", "top_p", "seed"]),
    "logit_attr": (lambda m, c, **kw: attnviz.logit_attr(TEXT, model=m, **kw),
                          ["target", "position", "top"]),
    "contributions": (lambda m, c, **kw: attnviz.contributions(TEXT, model=m, **kw), ["method", "truncate"]),
    "corpus": (lambda m, c, **kw: attnviz.corpus(["a cat", "a dog"], model=m, **kw),
               ["batch_size", "max_length", "words"]),
    "ablate": (lambda m, c, **kw: attnviz.ablate(TEXT, model=m, **{"heads": [(0, 0)], **kw}), ["heads", "mode"]),
    "view": (lambda m, c, **kw: attnviz.view(c, kw.pop("path"), **kw), ["layers"]),
    "export": (lambda m, c, **kw: attnviz.export(c, kw.pop("path").with_suffix(""), force=True, **kw),
               ["layer", "head", "format", "dpi", "cmap", "workers"]),
}


@pytest.mark.parametrize("function", CALLS)
def test_every_function_answers_any_value_with_its_own_error(function, small_lm, small_capture, tmp_path):
    call, spoiled = CALLS[function]

    @given(parameter=st.sampled_from(spoiled or ["_none"]), value=ANYTHING)
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    def property(parameter, value):
        kwargs = {} if parameter == "_none" else {parameter: value}
        if function in ("view", "export"):
            kwargs["path"] = tmp_path / "page.html"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                call(small_lm, small_capture, **kwargs)
            except AttnvizError as exc:
                assert "\n" not in str(exc).strip()
                if parameter != "_none" and " takes " in str(exc) and "; got " in str(exc):
                    assert str(exc).startswith(f"{parameter} takes ")  # names what was wrong

    property()


def test_generate_gives_a_model_loaded_without_its_head_its_head(tiny_model_dir):
    """A decoder loaded without its head writes as the one loaded with it (GPT-2 ties its head to the embeddings:
    the head comes from them); an encoder is still refused."""
    bare = attnviz.load_model(tiny_model_dir("gpt2"))
    with_head = attnviz.load_model(tiny_model_dir("gpt2"), lm_head=True)
    written = attnviz.generate("The cat", model=bare, max_new_tokens=4).to_dict()
    assert written["generated_text"] == attnviz.generate("The cat", model=with_head,
                                                         max_new_tokens=4).to_dict()["generated_text"]
    with pytest.raises(InputError, match="causal language model"):
        attnviz.generate("The cat", model=attnviz.load_model(tiny_model_dir("bert")))


def test_a_model_folder_may_be_given_as_a_path(tiny_model_dir):
    from pathlib import Path

    folder = Path(tiny_model_dir("bert"))
    assert attnviz.model_shape(folder) == attnviz.model_shape(str(folder)) == (2, 4)
    assert attnviz.conversion_pending(folder) is None
    assert attnviz.load_model(folder).name == str(folder)


@pytest.mark.parametrize("call", [
    lambda seed: attnviz.faithfulness("the cat sat on the mat", model="/nonexistent", seed=seed, sanity=1),
    lambda seed: attnviz.retrieval(model="/nonexistent", seed=seed),
    lambda seed: attnviz.detect(model="/nonexistent", seed=seed),
    lambda seed: attnviz.positions("the cat sat on the mat", model="/nonexistent", seed=seed),
], ids=["faithfulness", "retrieval", "detect", "positions"])
@pytest.mark.parametrize("seed", [2**64, 2**32, -1])
def test_every_seed_takes_the_command_lines_range_before_a_model_loads(call, seed):
    """faithfulness(seed=2**64, sanity=1) failed deep in numpy ("Overflow when unpacking long long"): every API
    seed takes the --seed range, 0 to 2**32 − 1, refused naming it before anything loads."""
    from attnviz.errors import UsageError

    with pytest.raises(UsageError, match="seed takes a whole number from 0 to 4,294,967,295"):
        call(seed)
