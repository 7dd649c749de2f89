"""Every argument of every API function and command is checked before any model loads: a malformed one is one
clear line naming it (a usage error, exit 2 on the command line), never seconds of loading first, a NaN, an
IndexError or a picture of nothing. The model named here does not exist, so a function that loaded before
checking would say that instead."""

from __future__ import annotations

import pytest
from helpers import one_line_error, run

import attnviz
from attnviz.errors import AttnvizError

MISSING = "/nonexistent/attnviz-model"  # loading it fails: an argument checked first is refused before
TEXT = "the cat sat on the mat"

# (function, positional arguments, keyword arguments (or what makes them), the argument the refusal names)
API = [
    ("capture", (TEXT,), lambda: {"stream": True, "keep": attnviz.Keep(pool=0)}, "pool"),
    ("capture", (TEXT,), {"max_new_tokens": 0}, "max_new_tokens"),
    ("steps", (TEXT,), {"token": ""}, "token"),
    ("positions", (TEXT,), {"seed": -1}, "seed"),
    ("scaling", (TEXT,), {"dk": [0]}, "dk"),
    ("sinks", (TEXT,), {"threshold": 1.5}, "threshold"),
    ("sinks", (TEXT,), {"threshold": float("inf")}, "threshold"),
    ("sink_rate", ([TEXT],), {"epsilon": -0.1}, "epsilon"),
    ("contributions", (TEXT,), {"method": "bogus"}, "method"),
    ("contributions", (TEXT,), {"threshold": -1.0}, "threshold"),
    ("logit_attr", (TEXT,), {"top": 0}, "top"),
    ("ablate", (TEXT,), {"heads": "x.y"}, "heads"),
    ("ablate", (TEXT,), {"heads": "0.1", "mode": "bogus"}, "mode"),
    ("importance", (TEXT,), {"mode": "bogus"}, "mode"),
    ("importance", (TEXT,), {"top": 0}, "top"),
    ("detect", (), {"length": 0}, "length"),
    ("detect", (), {"length": -5}, "length"),
    ("detect", (), {"sequences": 0}, "sequences"),
    ("detect", (), {"draws": -1}, "draws"),
    ("patch", (TEXT, TEXT), {"direction": "sideways"}, "direction"),
    ("patch", (TEXT, TEXT), {"answers": ("a", "a")}, "answers"),
    ("patch", (TEXT, TEXT), {"top": 0}, "top"),
    ("circuits", (), {"tokens": 0}, "tokens"),
    ("circuits", (), {"pairs": 0}, "pairs"),
    ("retrieval", (), {"depths": [float("nan")]}, "depths"),
    ("retrieval", (), {"depths": [1.5]}, "depths"),
    ("retrieval", (), {"lengths": [10]}, "lengths"),
    ("faithfulness", (TEXT,), {"methods": ["bogus"]}, "methods"),
    ("faithfulness", ([TEXT],), {"engine": "bogus"}, "engine"),
    ("faithfulness", (TEXT,), {"engine": "ray"}, "engine"),
    ("faithfulness", ([TEXT],), {"workers": 0}, "workers"),
    ("faithfulness", ([],), {}, "text"),
    ("faithfulness", (TEXT,), {"orders": 1}, "orders"),
    ("faithfulness", (TEXT,), {"steps": 0}, "steps"),
    ("faithfulness", (TEXT,), {"sanity": -1}, "sanity"),
    ("faithfulness", (TEXT,), {"seed": -1}, "seed"),
    ("faithfulness", (TEXT,), {"target": ""}, "target"),
    ("massive", (TEXT,), {"reference": []}, "reference"),
    ("massive", (TEXT,), {"ratio": 0.5}, "ratio"),
    ("massive", (TEXT,), {"intervene": "bogus"}, "intervene"),
    ("align", ("x.wav",), {"heads": "x.y"}, "heads"),
    ("align", ("x.wav",), {"heads": ""}, "heads"),
    ("align", ("x.wav",), {"band": -1}, "band"),
    ("generate", (TEXT,), {"max_new_tokens": 0}, "max_new_tokens"),
    ("generate", (TEXT,), {"top": 0}, "top"),
    ("cost", (), {"lengths": [0]}, "lengths"),
    ("cost", (), {"repeats": 0}, "repeats"),
    ("heatmap", (TEXT,), {"scale": "bogus"}, "scale"),
    ("heatmap", (TEXT,), {"layer": "x"}, "layer"),
    ("heads", (TEXT,), {"sort": "bogus"}, "sort"),
    ("heads", (TEXT,), {"top": 3}, "top"),
    ("entropy", (TEXT,), {"rows": "x"}, "rows"),
    ("verify", (TEXT,), {"tolerance": -1.0}, "tolerance"),
    ("norms", (TEXT,), {"layer": "x"}, "layer"),
]


@pytest.mark.parametrize("function, args, kwargs, name", API, ids=[f"{c[0]}-{c[3]}-{n}" for n, c in enumerate(API)])
def test_every_api_argument_is_checked_before_the_model_loads(function, args, kwargs, name):
    with pytest.raises(AttnvizError) as caught:
        getattr(attnviz, function)(*args, model=MISSING, **(kwargs() if callable(kwargs) else kwargs))
    error = caught.value
    assert "nonexistent" not in str(error), f"{function} loaded the model before checking {name}: {error}"
    assert error.exit_code == 2 and error.field == name and "\n" not in str(error), (type(error), str(error))


# (the command line after the command, the flag the refusal names)
CLI = [
    (["heatmap", TEXT, "--scale", "bogus"], "--scale"),
    (["heatmap", TEXT, "--stream", "--pool", "0"], "--pool"),
    (["sinks", TEXT, "--threshold", "1.5"], "--threshold"),
    (["contributions", TEXT, "--threshold", "-1"], "--threshold"),
    (["ablate", TEXT, "--heads", "x.y"], "--heads"),
    (["importance", TEXT, "--top", "0"], "--top"),
    (["detect", "--length", "0"], "--length"),
    (["detect", "--sequences", "0"], "--sequences"),
    (["retrieval", "--depths", "nan"], "--depths"),
    (["retrieval", "--depths", "0.5,2"], "--depths"),
    (["massive", TEXT, "--ratio", "0.5"], "--ratio"),
    (["faithfulness", TEXT, "--methods", "attention,bogus"], "--methods"),
    (["faithfulness", TEXT, "--engine", "ray"], "--engine"),
    (["faithfulness", TEXT, "--engine", "spark"], "--engine"),
    (["faithfulness", TEXT, "--orders", "1"], "--orders"),
    (["faithfulness", TEXT, "--steps", "0"], "--steps"),
    (["align", "--audio", "x.wav", "--heads", "x.y"], "--heads"),
    (["align", "--audio", "x.wav", "--heads", ""], "--heads"),
    (["patch", TEXT, TEXT, "--answers", "a,a"], "--answers"),
    (["generate", TEXT, "-n", "0"], "--max-new-tokens"),
    (["cost", "--lengths", "0"], "--lengths"),
    (["heads", TEXT, "--top", "3"], "--top"),
    (["positions", TEXT, "--seed", "-1"], "--seed"),
]


@pytest.mark.parametrize("line, flag", CLI, ids=[f"{c[0][0]}-{c[1]}-{n}" for n, c in enumerate(CLI)])
def test_every_option_is_checked_before_the_model_loads(line, flag):
    error = one_line_error(run(*line, "-m", MISSING), 2)
    assert "nonexistent" not in error and flag in error
