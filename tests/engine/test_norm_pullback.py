"""A norm's pullback in closed form (engine/norm_pullback.py), as discover's long path uses it: each of the three
forms found for the norm it is, and equal to the norm's own autograd in float64 (an independent computation)
at positions other than those it was found at; any other norm, or another dtype, left to the norm's `vjp`."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from attnviz.engine.norm_pullback import Pullback

D = 96


def _norms() -> dict:
    torch.manual_seed(0)
    layer = torch.nn.LayerNorm(D, eps=1e-5)
    rms, gemma = LlamaRMSNorm(D, eps=1e-6), Gemma3RMSNorm(D, eps=1e-6)
    for norm in (layer, rms, gemma):
        with torch.no_grad():
            for p in norm.parameters():
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if norm is not gemma and p.ndim and p is norm.weight else 0))
    return {"layer": layer, "rms": rms, "rms-one-plus": gemma}


def _reference(norm, x: torch.Tensor, cotangents: torch.Tensor) -> torch.Tensor:
    """Each cotangent's pullback by the norm's own autograd, in float64, one backward pass per cotangent."""
    twin = copy.deepcopy(norm).double()
    rows = []
    for cotangent in cotangents.double():
        leaf = x.double().requires_grad_(True)
        rows.append(torch.autograd.grad(twin(leaf), leaf, cotangent)[0])
    return torch.stack(rows)


@pytest.mark.parametrize("form", ["layer", "rms", "rms-one-plus"])
def test_each_norm_is_found_in_closed_form_and_equals_its_own_autograd(form):
    """Found at the first positions; at others, within D · 2⁻²³ of the largest gradient of the float64
    autograd (float32 against float64 over sums of D terms)."""
    norm = _norms()[form]
    torch.manual_seed(1)
    x = torch.randn(40, D) * 3 + 0.7  # a mean far from 0: LayerNorm and RMSNorm differ
    cotangents = torch.randn(5, 40, D)
    pull = Pullback(norm)
    first = pull(x[:8], cotangents[:, :8])
    assert pull.form == form
    later = pull(x[8:], cotangents[:, 8:])
    for got, at in ((first, slice(0, 8)), (later, slice(8, 40))):
        wanted = _reference(norm, x[at], cotangents[:, at])
        assert got.shape == wanted.shape
        bound = D * 2 ** -23 * float(wanted.abs().max())
        assert float((got.double() - wanted).abs().max()) <= bound


class _Scaled(torch.nn.Module):
    """A norm of none of the three forms: x / (mean |x| + ε) · γ."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(D) * 1.3)
        self.eps = 1e-6

    def forward(self, x):
        return self.weight * x / (x.abs().mean(-1, keepdim=True) + self.eps)


def test_a_norm_of_another_form_or_dtype_goes_through_its_own_vjp():
    torch.manual_seed(2)
    x, cotangents = torch.randn(30, D) + 0.3, torch.randn(4, 30, D)
    other = Pullback(_Scaled())
    other(x[:10], cotangents[:, :10])
    assert other.form is None
    got = other(x[10:], cotangents[:, 10:])
    wanted = _reference(_Scaled(), x[10:], cotangents[:, 10:])
    assert float((got.double() - wanted).abs().max()) <= D * 2 ** -23 * float(wanted.abs().max())
    half = Pullback(_norms()["rms"].to(torch.bfloat16))
    half(x[:10].bfloat16(), cotangents[:, :10].bfloat16())
    assert half.form is None


class _Detached(torch.nn.Module):
    """An RMSNorm whose scale takes no gradient: its output is an RMSNorm's, its pullback is not."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, D))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon).detach()
        return self.weight * x * scale


def test_a_norm_whose_output_matches_but_pullback_does_not_is_found_by_its_pullback_even_from_tiny_gradients():
    """The form is judged on cotangents of unit scale, not on the first gradients, which may be too small to
    tell the forms apart (here 1e-9); and calling the norm for it runs no hook on it."""
    torch.manual_seed(3)
    x, cotangents = torch.randn(30, D) + 0.5, torch.randn(4, 30, D)
    norm, called = _Detached(), []
    norm.register_forward_pre_hook(lambda module, args: called.append(1))
    pull = Pullback(norm)
    pull(x[:10], cotangents[:, :10] * 1e-9)
    assert pull.form is None and not called
    got = pull(x[10:], cotangents[:, 10:])
    wanted = _reference(norm, x[10:], cotangents[:, 10:])
    assert float((got.double() - wanted).abs().max()) <= D * 2 ** -23 * float(wanted.abs().max())
    rms = Pullback(_norms()["rms"])
    rms(x[:10], torch.zeros(4, 10, D))
    assert rms.form == "rms"


@pytest.mark.parametrize("form", ["layer", "rms", "rms-one-plus", None])
def test_the_pullback_made_in_place_is_made_in_the_cotangents_own_storage_and_equals_the_reference(form):
    """`in_place=True` (discover's scoring: each receiver's gradient made in its rows of one buffer) returns the
    cotangents' own storage, holding the pullback within D · 2⁻²³ of the float64 autograd's largest gradient: in
    closed form for each of the three norms, copied there from the `vjp` for a norm of none of them (None)."""
    norm = _Scaled() if form is None else _norms()[form]
    torch.manual_seed(4)
    x = torch.randn(40, D) * 3 + 0.7
    buffer = torch.randn(3, 5, 32, D)  # the rows of one larger buffer: a contiguous slice of it
    given = buffer[1].clone()
    pull = Pullback(norm)
    pull(x[:8], torch.randn(5, 8, D))
    assert pull.form == form
    got = pull(x[8:], buffer[1], in_place=True)
    assert got.data_ptr() == buffer[1].data_ptr()
    wanted = _reference(norm, x[8:], given)
    assert float((buffer[1].double() - wanted).abs().max()) <= D * 2 ** -23 * float(wanted.abs().max())
    assert torch.equal(buffer[1], pull(x[8:], given))  # the same arithmetic as the pullback made apart
