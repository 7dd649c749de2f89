"""Models: load one once for many calls, or hand in your own. Every API function takes `model=` as a name, a
folder, a .gguf file, a Model from load_model(), or a Hugging Face model object with its `tokenizer`.

Importing this module imports neither torch nor transformers; they load with the first model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from attnviz.base.arguments import checked
from attnviz.base.devices import DEVICES, DTYPES  # re-exported
from attnviz.engine.families import FAMILIES, Family
from attnviz.engine.models import LoadedModel, ModelSpec
from attnviz.errors import InputError
from attnviz.progress import Reporter

if TYPE_CHECKING:
    from attnviz.api.session import Run

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["Model", "ModelSpec", "load", "load_model", "resolve_model", "conversion_pending", "model_shape",
           "model_kind", "list_families", "DEVICES", "DTYPES"]


class Model(LoadedModel):
    """A model loaded once for many questions (attnviz.load): its name, the model object (`.model`), its tokenizer,
    device and dtype. `run(text)` runs it on a text once and hands back an attnviz.Run, which every analysis
    asks; every API function also takes a Model as `model=`."""

    @classmethod
    def of(cls, loaded: LoadedModel) -> Model:
        if isinstance(loaded, cls):
            return loaded
        return cls(**{f.name: getattr(loaded, f.name) for f in fields(loaded)})

    def run(self, source: Any, *, words: bool = False, truncate: bool = True, keep: str = "auto",
            reporter: Reporter | None = None) -> Run:
        """Run the model on `source` (a text; or a picture or sound where the model reads one) once, keeping its
        tokens and α and, where they fit the memory budget beside α (`keep` "auto"), the points the analyses
        read: each block's input, its attention's output, the stream after it, its MLP's output, the final
        norm's input and output, and every layer's Q, K, V. `keep` "alpha": α alone (an analysis that needs
        more makes one more pass, counted in `run.passes`). `words`: α between words, as capture(words=True)."""
        from attnviz.api.session import Run

        return Run(self, source, words=words, truncate=truncate, keep=keep, reporter=reporter)


@checked
def load(model: Any = None, *, tokenizer: Any = None, device: str | None = None, dtype: str | None = None) -> Model:
    """Load a model once for many questions: `model` a name (minilm, multilingual, smollm2, …), a folder, a
    .gguf file, a Model, or a Hugging Face model object you hold with its `tokenizer` (borrowed: every analysis
    gives it back as it was). `device` and `dtype` for one loaded here (default "auto" and "float32"); a model
    object keeps its own. The output layer of a decoder is loaded when an analysis first needs it, onto the
    same blocks (never a second copy of the model).

        m = attnviz.load("smollm2")
        run = m.run("The cat sat on the mat")        # one forward pass
        run.heads(), run.sinks(), run.logit_attr()   # no more passes (run.passes == 1)"""
    if isinstance(model, Deferred):
        model = model.load(False)
    if isinstance(model, LoadedModel):
        return Model.of(model)
    if model is None or isinstance(model, (str, os.PathLike)):
        return load_model(model, device=device or "auto", dtype=dtype or "float32")
    from attnviz.engine.models import wrap

    return Model.of(wrap(model, tokenizer))


@checked
def load_model(name: str | os.PathLike | None = None, *, device: str = "auto", dtype: str = "float32",
               revision: str | None = None, trust_remote_code: bool = False, memory_budget: int | None = None,
               lm_head: bool | str = False, reporter: Reporter | None = None) -> Model:
    """Load a model once for many captures: an offline name (minilm, multilingual, smollm2, gemma3,
    qwen2.5-coder-0.5b, …), a Hugging Face id, a local folder or a .gguf file, with eager attention, in eval mode,
    on `device`. `lm_head`: with its language-model head (True), or where it is a decoder ("auto"). `reporter`:
    the phases of a first conversion into the cache (joining, dequantizing, writing) shown as it goes."""
    from attnviz.engine.models import load

    return Model.of(load(None if name is None else os.fspath(name), revision=revision, device=device, dtype=dtype,
                         trust_remote_code=trust_remote_code, memory_budget=memory_budget, lm_head=lm_head,
                         reporter=reporter))


@dataclass(frozen=True)
class Deferred:
    """A model to load when an API function first needs it, once the function has checked its own arguments:
    what the command line hands the API, so that a malformed argument is refused before seconds of loading.
    `load(lm_head)` loads it (with the head the function asks for)."""

    load: Callable[[bool | str], Any]


@checked
def resolve_model(model: Any = None, tokenizer: Any = None, *, device: str = "auto", dtype: str = "float32",
                  lm_head: bool | str = False) -> LoadedModel:
    """`model=` as every API function takes it, as a Model in eval mode: loaded by name (None: the default), or
    a model object the user holds, wrapped. A function that takes `model=` is @borrows: the mode of a model
    handed in is put back when it returns."""
    if isinstance(model, Deferred):
        model = model.load(lm_head)
    if isinstance(model, LoadedModel):
        loaded = model
    elif model is None or isinstance(model, (str, os.PathLike)):
        return load_model(None if model is None else str(model), device=device, dtype=dtype, lm_head=lm_head)
    else:
        from attnviz.engine.models import wrap

        loaded = wrap(model, tokenizer)
    if lm_head and not loaded.seq2seq and _without_head(loaded.model):
        from attnviz.engine.lm_head import attach_head, is_decoder

        if is_decoder(loaded.model):  # a causal LM is measured as one: its head is loaded now, once
            attach_head(loaded)
        elif lm_head is True:
            raise InputError(f"this needs a causal language model with its language-model head; {loaded.name} is "
                             f"not one")
    loaded.model.eval()  # dropout off while attnviz runs it; @borrows puts the caller's mode back
    return loaded


def for_input(model: Any, text: Any) -> Any:
    """The model to use for an input: the one given, else the input's own (a picture: the offline vision model
    dinov2, a sound: whisper), else None (the default text model)."""
    from attnviz.data.modality import of_input

    return of_input(text).default_model if model is None else model


def _without_head(module: Any) -> bool:
    """A transformers model without a language-model head (AutoModel rather than AutoModelForCausalLM)."""
    heads = getattr(module, "get_output_embeddings", None)
    try:
        return heads is None or heads() is None
    except (AttributeError, NotImplementedError, TypeError):
        return True


F = TypeVar("F", bound=Callable[..., Any])


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_HOOK_FLAGS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")
# transformers marks a module whose output-capturing hooks (output_attentions) it installed; the mark goes
# with the hooks, or transformers would not install them again
_INSTALLED_MARK = "_output_capturing_hooks_installed"
_ABSENT = object()


class Borrowed:
    """What a model handed in looks like before attnviz runs it, to give it back as it was: its training
    mode, attention implementation, each parameter's gradient, requires_grad, device and dtype, and the
    hooks on each of its modules (a hook added while attnviz ran it is removed: transformers' own
    output-capturing hooks with their mark, so that it installs them again when asked)."""

    def __init__(self, module: Any):
        self.module = module
        self.training = bool(module.training)
        self.modes = [(m, bool(m.training)) for m in module.modules()]  # each module's own: modes may be mixed
        config = getattr(module, "config", None)
        self.attention = getattr(config, "_attn_implementation", None) if config is not None else None
        self.parameters = list(module.parameters())
        self.grads = [p.grad for p in self.parameters]
        self.requires_grad = [p.requires_grad for p in self.parameters]
        self.places = [(p.device, p.dtype) for p in self.parameters]
        self.hooks = [(m, {name: set(getattr(m, name, {})) for name in _HOOK_TABLES}) for m in module.modules()]
        self.marks = [(m, m.__dict__.get(_INSTALLED_MARK, _ABSENT)) for m in module.modules()]

    def give_back(self) -> None:
        for parameter, grad, requires, (device, dtype) in zip(self.parameters, self.grads, self.requires_grad,
                                                              self.places):
            if parameter.device != device or parameter.dtype != dtype:
                parameter.data = parameter.data.to(device=device, dtype=dtype)
            parameter.grad = grad
            parameter.requires_grad_(requires)
        for submodule, tables in self.hooks:
            for name, kept in tables.items():
                table = getattr(submodule, name, None) or {}
                for key in [k for k in table if k not in kept]:
                    del table[key]
                    for flags in _HOOK_FLAGS:
                        getattr(submodule, flags, {}).pop(key, None)
        for submodule, mark in self.marks:
            if mark is _ABSENT:
                submodule.__dict__.pop(_INSTALLED_MARK, None)
            else:
                submodule.__dict__[_INSTALLED_MARK] = mark
        config = getattr(self.module, "config", None)
        if self.attention is not None and getattr(config, "_attn_implementation", None) != self.attention:
            switch = getattr(self.module, "set_attn_implementation", None)
            try:
                if switch is None:
                    raise AttributeError
                switch(self.attention)
            except (AttributeError, ValueError, TypeError, NotImplementedError, ImportError):
                setattr(config, "_attn_implementation", self.attention)  # noqa: B010 (older transformers)
        for submodule, mode in self.modes:  # not module.train(…), which would set every submodule alike
            submodule.training = mode


def borrows(function: F) -> F:
    """An API function that takes `model=`: a model handed in (a Model or a model object) is given back as it
    was (Borrowed), whatever the function did and however it ended."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        given = kwargs.get("model")
        module = given.model if isinstance(given, LoadedModel) else given
        borrowed = Borrowed(module) if callable(getattr(module, "train", None)) and \
            callable(getattr(module, "parameters", None)) else None
        try:
            return function(*args, **kwargs)
        finally:
            if borrowed is not None:
                borrowed.give_back()

    return wrapper  # type: ignore[return-value]


@checked
def conversion_pending(name: str | os.PathLike | None) -> str | None:
    """The offline model that `name` names, if its one-time conversion into the model cache is still to run
    (the first load takes longer then); else None."""
    from attnviz.engine.models import default_model
    from attnviz.engine.offline.build import pending

    return pending(os.fspath(name) if name is not None else default_model())


@checked
def model_shape(name: str | os.PathLike | None) -> tuple[int, int] | None:
    """(layers, heads) of a model's attention, read from its config.json alone before any weights load, so
    that a selection out of range is refused at once; None where that is not cheap or not certain (a model
    still to convert, a Hub id, an encoder-decoder model, a config that does not say)."""
    from attnviz.engine.models import config_shape

    if conversion_pending(name):
        return None
    return config_shape(None if name is None else os.fspath(name))


def default_model_name() -> str:
    """The model used when none is named: $ATTNVIZ_MODEL, else minilm."""
    from attnviz.engine.models import default_model

    return default_model()


@checked
def model_kind(name: str | os.PathLike | None) -> str | None:
    """What a model is, read from its config.json before any weights load: "encoder", "decoder", "seq2seq",
    "vision" or "speech"; None where that is not cheap or not certain. What lets a command that needs a causal
    language model refuse an encoder before seconds of loading."""
    from attnviz.engine.models import config_kind

    return config_kind(None if name is None else os.fspath(name))


def list_families() -> tuple[Family, ...]:
    """The model families attnviz knows, each declared once with its adapter: name, model types, whether it
    is causal, and what its from-scratch check covers."""
    return tuple(FAMILIES)

