"""Models: load one once for many calls, or hand in your own. Every API function takes `model=` as a name, a
folder, a .gguf file, a Model from load_model(), or a Hugging Face model object with its `tokenizer`.

Importing this module imports neither torch nor transformers; they load with the first model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
import os
from collections.abc import Callable
from typing import Any, TypeVar

from attnviz.base.arguments import checked
from attnviz.base.devices import DEVICES, DTYPES  # re-exported
from attnviz.engine.families import FAMILIES, Family
from attnviz.engine.models import LoadedModel, ModelSpec
from attnviz.errors import InputError

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["ModelSpec", "resolve_model", "conversion_pending", "model_shape", "model_kind", "list_families",
           "DEVICES", "DTYPES"]


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
        from attnviz.engine.models import load

        return load(None if model is None else str(model), device=device, dtype=dtype, lm_head=lm_head)
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

