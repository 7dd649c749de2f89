"""A norm's vector-Jacobian product for many cotangents at once, in closed form.

discover's long path pulls each receiver's gradient back through its norm, for every head of a layer at every
position (engine/discovery_lean.py). `torch.func.vmap` over the norm's `vjp` does this for any norm, but its
cost per call is mostly machinery: at 8,192 tokens on SmolLM2, about 3,400 calls of 15 cotangents × 73
positions took 1.8 ms each. The three norms of the families attnviz covers have a closed form, 0.7 ms a call:

    LayerNorm            y = γ ⊙ (x − μ)/σ + β        x̄ = γ ⊙ g:  ∂ = (x̄ − mean(x̄) − x̂ · mean(x̄ ⊙ x̂)) / σ
    RMSNorm              y = γ ⊙ x / r                x̄ = γ ⊙ g:  ∂ = x̄ / r − x · Σ(x̄ ⊙ x) / (D · r³)
    RMSNorm (Gemma)      y = (1 + γ) ⊙ x / r          the same, with 1 + γ

with σ = √(var(x) + ε), r = √(mean(x²) + ε), x̂ = (x − μ)/σ. Which of them a norm is, is not read from its class
name: `Pullback` tries each form against the norm's own output and its own `vjp` (on cotangents of its own) at the
first positions it is given, and keeps the closed form only where both agree within float32's rounding over a
sum of D terms (D · 2⁻²³ of the largest value); anything else (another norm, another dtype) goes on through `vjp`.
"""

from __future__ import annotations

from typing import Any

import torch

from attnviz.engine.scratch.adapters import rms_norm

FORMS = ("layer", "rms", "rms-one-plus")


def epsilon(norm: Any) -> float:
    """A norm's ε, under whichever name its family gives it (1e-5 where it has none)."""
    return next((float(getattr(norm, k)) for k in ("eps", "variance_epsilon", "epsilon") if hasattr(norm, k)), 1e-5)


def _scale(norm: Any, form: str) -> torch.Tensor:
    weight = norm.weight.detach().float()
    return 1 + weight if form == "rms-one-plus" else weight


def forward(norm: Any, form: str, x: torch.Tensor) -> torch.Tensor:
    """The norm of x (…, D) by `form`'s formula, float32."""
    x, eps = x.float(), epsilon(norm)
    if form == "layer":
        centred = x - x.mean(-1, keepdim=True)
        y = _scale(norm, form) * centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
        return y + norm.bias.detach().float() if getattr(norm, "bias", None) is not None else y
    return rms_norm(x, norm.weight.detach(), eps, plus_one=form == "rms-one-plus")


def backward(norm: Any, form: str, x: torch.Tensor, cotangents: torch.Tensor) -> torch.Tensor:
    """∂(Σ cotangent · norm(x))/∂x for each cotangent: x (c, D), cotangents (R, c, D) -> (R, c, D), float32."""
    return backward_(norm, form, x, cotangents.float().clone())


def backward_(norm: Any, form: str, x: torch.Tensor, cotangents: torch.Tensor) -> torch.Tensor:
    """`backward` made in the cotangents' own storage (float32, (R, c, D)), with no temporary of their size."""
    x, eps, D = x.float(), epsilon(norm), x.shape[-1]
    scaled = cotangents.mul_(_scale(norm, form))
    if form == "layer":
        centred = x - x.mean(-1, keepdim=True)
        inverse = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)  # (c, 1)
        normed = centred * inverse
        inner = torch.einsum("rcd,cd->rc", scaled, normed).unsqueeze(-1) / D
        scaled.sub_(scaled.mean(-1, keepdim=True)).addcmul_(normed, inner, value=-1)
        return scaled.mul_(inverse)
    inverse = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    inner = torch.einsum("rcd,cd->rc", scaled, x).unsqueeze(-1)
    return scaled.mul_(inverse).addcmul_(x, inner * (inverse.pow(3) / D), value=-1)


def _close(found: torch.Tensor, wanted: torch.Tensor) -> bool:
    bound = wanted.shape[-1] * torch.finfo(torch.float32).eps * float(wanted.abs().max())
    return bool((found - wanted).abs().max() <= bound)


def by_vjp(norm: Any, x: torch.Tensor, cotangents: torch.Tensor) -> torch.Tensor:
    """The same through the norm's own autograd: one `vjp`, `vmap`ped over the cotangents (any norm)."""
    normed, pullback = torch.func.vjp(norm.forward, x)[:2]
    return torch.func.vmap(pullback)(cotangents.to(normed.dtype))[0]


class Pullback:
    """A norm's pullback, in closed form once its first call has shown one of FORMS to be the norm's own
    (forward and backward), else through `vjp`."""

    def __init__(self, norm: Any) -> None:
        self.norm, self.tried = norm, False
        self.form: str | None = None

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, cotangents: torch.Tensor, *, in_place: bool = False) -> torch.Tensor:
        """The pullback of each cotangent (R, c, D) at x (c, D); `in_place`: made in the cotangents' own storage
        (float32) where the closed form holds (through `vjp`, copied there)."""
        if not self.tried:
            self.tried = True
            self.form = self.identify(x)
        if self.form is None:
            found = by_vjp(self.norm, x, cotangents)
            return cotangents.copy_(found) if in_place else found
        if in_place:
            return backward_(self.norm, self.form, x, cotangents)
        return backward(self.norm, self.form, x, cotangents)

    def identify(self, x: torch.Tensor) -> str | None:
        """The form whose output and pullback are the norm's own at x (its `forward`, no hook called), or None
        (float32 only). The pullbacks are compared on cotangents of unit scale drawn here, not on the caller's,
        which may be too small to tell two forms apart."""
        weight = getattr(self.norm, "weight", None)
        if x.dtype != torch.float32 or not isinstance(weight, torch.Tensor) or weight.shape != x.shape[-1:]:
            return None
        probe = torch.randn((2, *x.shape), generator=torch.Generator().manual_seed(0)).to(x.device)
        wanted, own = by_vjp(self.norm, x, probe), self.norm.forward(x)
        for form in FORMS:
            if form != "layer" and getattr(self.norm, "bias", None) is not None:
                continue
            if _close(forward(self.norm, form, x), own) and _close(backward(self.norm, form, x, probe), wanted):
                return form
        return None
