"""faithfulness's methods: a registry (FAITHFULNESS), each attribution a class that scores the tokens for one
prediction; integrated gradients' baseline token, and f of every erased text run once (attnviz.faithfulness).
Light to import (numpy inside the functions): the command line's help lists the registry."""

from __future__ import annotations

from typing import Any, ClassVar

from attnviz.base.methods import Family, Method
from attnviz.errors import UnsupportedArchitectureError
from attnviz.progress import Reporter

__all__ = ["FAITHFULNESS", "Attribution", "baseline_token", "distinct_f", "method_scores"]


def baseline_token(tokenizer, rows: int | None = None) -> int | None:
    """Integrated gradients' baseline token: the padding token, else the unknown-word one, else the end of
    text (None: no such token; the zero vector then) — one the model's embedding has a row for (`rows`: how
    many it has; a tokenizer may know more tokens than the model)."""
    for name in ("pad_token_id", "unk_token_id", "eos_token_id"):
        found = getattr(tokenizer, name, None)
        if isinstance(found, int) and 0 <= found < min(len(tokenizer), rows if rows is not None else len(tokenizer)):
            return found
    return None


def distinct_f(explained, subsets: list, reporter: Reporter) -> Any:
    """f of every subset (index arrays), each distinct one run once (bins of one size, and methods agreeing on
    their top tokens, erase the same ones), in batches of similar lengths (less padding). (len(subsets),)"""
    import numpy as np

    keys = [tuple(int(p) for p in subset) for subset in subsets]
    distinct = sorted(set(keys), key=len)
    with reporter.progress("Erasing tokens and running the model again", len(distinct), "texts") as step:
        found = explained.f([np.array(k, np.int64) for k in distinct], on_batch=step)
    value = dict(zip(distinct, found))
    return np.array([value[k] for k in keys])


class Attribution(Method):
    """A method faithfulness measures: scores(explained, inputs, erasable, steps) -> (scores (T,), completeness
    or None). `causal_only`: for causal language models alone; `scored`: False for the random baseline, which
    orders tokens at random instead of scoring them."""

    causal_only: ClassVar[bool] = False
    scored: ClassVar[bool] = True
    long: ClassVar[str] = ""  # why it does not run on a long text (the long path, without α); "" where it does
    long_default: ClassVar[bool] = True  # on a long text, run when no methods are named

    def scores(self, explained: Any, inputs: dict, erasable: Any, steps: int) -> tuple[Any, tuple[float, float] | None]:
        raise NotImplementedError


FAITHFULNESS: Family[type[Attribution]] = Family("methods")


@FAITHFULNESS.register
class Attention(Attribution):
    name, title, help = "attention", "attention", "α of the last layer, the mean over heads, of the explained rows"

    def scores(self, explained, inputs, erasable, steps):
        if explained.alpha is None:  # the long path: the explained rows alone, made in the explained pass
            if explained.last_rows is None:
                raise UnsupportedArchitectureError("this family adds a positional bias to its attention scores, "
                                                   "which the long path does not recompute")
            return explained.last_rows, None
        return explained.alpha[-1].astype("float64").mean(0)[explained.rows()].mean(0), None


def _rolled(layers, T: int):
    import numpy as np

    total = np.eye(T)
    for layer in layers:
        total = layer @ total
    return total


@FAITHFULNESS.register
class Rollout(Attribution):
    name, title, help = "rollout", "attention rollout", "α with the residual, multiplied through the layers"
    long = "multiplies every layer's α"

    def scores(self, explained, inputs, erasable, steps):
        from attnviz.metrics.faithfulness import residual_attention

        return _rolled(residual_attention(explained.alpha), explained.T)[explained.rows()].mean(0), None


@FAITHFULNESS.register
class Flow(Attribution):
    name, title, help = "flow", "attention flow", "the max-flow through the layers' α with the residual"
    long = "runs a max-flow through every layer's α"

    def scores(self, explained, inputs, erasable, steps):
        import numpy as np

        from attnviz.engine.attribution.faithfulness import FLOW_ROWS
        from attnviz.metrics.faithfulness import attention_flow, residual_attention

        rows = explained.rows()
        spread = rows if len(rows) <= FLOW_ROWS else \
            rows[np.unique(np.linspace(0, len(rows) - 1, FLOW_ROWS).round().astype(int))]
        return attention_flow(residual_attention(explained.alpha), spread), None


class _Contributions(Attribution):
    layers: ClassVar[str]  # the engine function (attnviz.engine.attribution.faithfulness) giving (L, T, T)

    def scores(self, explained, inputs, erasable, steps):
        import attnviz.engine.attribution.faithfulness as engine

        layers = getattr(engine, self.layers)(explained.model, inputs)
        return _rolled(layers, explained.T)[explained.rows()].mean(0), None


@FAITHFULNESS.register
class Alti(_Contributions):
    name, title, help = "alti", "ALTI", "each block's output split into one part per token, rolled out"
    long = "splits every block's output by token, through α"
    layers = "alti_layers"


@FAITHFULNESS.register
class AltiLogit(Attribution):
    name, title, help = "alti-logit", "ALTI-Logit", "the heads' direct effects on the logit, traced back by ALTI"
    long = "traces the heads back through every layer's α"
    causal_only = True

    def scores(self, explained, inputs, erasable, steps):
        from attnviz.engine.attribution.faithfulness import alti_logit_scores

        found = alti_logit_scores(explained.model, inputs, explained.target)
        if found is None:
            raise UnsupportedArchitectureError("ALTI does not split this family's blocks")
        return found, None


@FAITHFULNESS.register
class ValueZeroing(_Contributions):
    name, title, help = "value-zeroing", "value zeroing", "each token's value vectors zeroed, the change measured"
    long = "reruns every layer's attention once per token, with α"
    layers = "zeroing_layers"


class _Gradients(Attribution):
    def scores(self, explained, inputs, erasable, steps):
        import importlib.util

        from attnviz.engine.attribution.faithfulness import gradient_scores

        if importlib.util.find_spec("captum") is None:
            raise UnsupportedArchitectureError(f"{self.name} needs Captum: pip install \"attnviz[trust]\"")
        attributed, summed, gap = gradient_scores(explained, self.name, erasable, steps=steps,
                                                  baseline_id=explained.baseline_id)
        return attributed, (None if summed is None or gap is None else (summed, gap))


@FAITHFULNESS.register
class GradXInput(_Gradients):
    name, title, help = "grad-x-input", "gradient × input", "the gradient of f times each token's embedding"


@FAITHFULNESS.register
class IntegratedGradients(_Gradients):
    name, title, help = ("integrated-gradients", "integrated gradients",
                         "gradients along the path from a baseline token (--steps points)")
    long_default = False  # --steps passes forward and backward: on a long text, asked for by name


@FAITHFULNESS.register
class LeaveOneOut(Attribution):
    name, title, help = "loo", "leave-one-out", "f without each token, one run per token"
    long = "runs the text once per token"

    def scores(self, explained, inputs, erasable, steps):
        import numpy as np

        from attnviz.metrics.faithfulness import without

        values = np.zeros(explained.T)
        values[erasable] = explained.f_full - explained.f([without(explained.T, np.array([i])) for i in erasable])
        return values, None


@FAITHFULNESS.register
class Random(Attribution):
    name, title, help = "random", "random orders", "tokens erased in random orders: the baseline to beat"
    scored = False


def method_scores(name: str, explained, inputs: dict, erasable,
                  steps: int) -> tuple[Any, tuple[float, float] | None]:
    """One method's scores (T,) for the model `explained` holds; for integrated gradients also completeness."""
    return FAITHFULNESS.get(name)().scores(explained, inputs, erasable, steps)
