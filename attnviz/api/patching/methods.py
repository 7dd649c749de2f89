"""The method families of patching and circuit discovery, as registries (attnviz.base.methods): what --method
takes, each method's title and help, and the part of the work that differs between them. Light to import (the
engine inside the methods): the command line's help lists them."""

from __future__ import annotations

from typing import Any, ClassVar

from attnviz.base.methods import Family, Method

__all__ = ["PATCHING", "DISCOVERY", "Patcher", "Discoverer"]


class Patcher(Method):
    """A way to find what each piece restores. `estimates`: from gradients (one forward and backward pass) rather
    than one patched run per piece; then `estimate(where, inputs, donor, at, metric, L)` gives the change of the
    metric for each kind of piece (heads, attention, residual, head_positions), and `check(loaded, where, T, A)`
    refuses before running what would not fit."""

    estimates: ClassVar[bool] = False
    needs_alpha: ClassVar[bool] = False  # reads α (AtP*'s QK fix): no long path, refused where α does not fit

    def check(self, loaded: Any, where: Any, T: int, A: int) -> None:
        return None

    def estimate(self, where: Any, inputs: dict, donor: Any, at: list[int], metric: Any, L: int) -> dict:
        raise NotImplementedError


PATCHING: Family[type[Patcher]] = Family("method")


@PATCHING.register
class Exact(Patcher):
    name, title, help = "exact", "exact patching", "each piece patched in its own run (batched)"


@PATCHING.register
class AtP(Patcher):
    name, title, help = ("atp", "AtP", "attribution patching (Nanda 2023), every piece's effect estimated at once "
                                       "from one forward and one backward pass, (a_donor − a_receiver) · ∂M/∂a, on "
                                       "the same scale: fast, an estimate")
    estimates = True

    def estimate(self, where, inputs, donor, at, metric, L):
        from attnviz.engine.patching import attributed

        heads_at, residual_at, _ = attributed(where, inputs, donor, at, metric)
        return {"heads": heads_at.sum(1), "attention": heads_at.sum(2), "residual": residual_at,
                "head_positions": heads_at.permute(0, 2, 1)}


@PATCHING.register
class AtPStar(Patcher):
    name, title, help = ("atp*", "AtP*", "Kramár et al. 2024's fixes, the residual stream's effect through attention "
                                         "patterns computed exactly (QK fix) and GradDrop against cancelling paths "
                                         "(L + 1 passes)")
    estimates = True
    needs_alpha = True

    def check(self, loaded, where, T, A):
        from attnviz.engine.memory import check_parts, starred_bytes
        from attnviz.errors import arg

        check_parts(loaded, starred_bytes(where, T, A), f"AtP* on {T} tokens ({A} aligned positions)",
                    f"shorten the prompts, or use {arg('method')} atp (one forward and backward pass)")

    def estimate(self, where, inputs, donor, at, metric, L):
        from attnviz.engine.starred import starred

        return _star(starred(where, inputs, donor, at, metric), L)


def _star(star, L: int) -> dict:
    """AtP*'s change of the metric for each kind of piece: the QK-fixed estimate's sign, GradDrop's magnitude
    Σ_ℓ |c_ℓ| / (L − 1) (Kramár et al. 2024; one of the L terms, the piece's own block dropped, is 0 for a head),
    each piece summed before its magnitude is taken (a head over its positions, a layer over its heads). One
    layer: the QK-fixed estimate alone."""
    import numpy as np

    def combined(fixed, dropped):
        fixed = fixed.numpy()
        if L < 2:
            return fixed
        return np.sign(fixed) * sum(np.abs(d.numpy()) for d in dropped) / (L - 1)

    views = {"heads": lambda h: h.sum(1), "attention": lambda h: h.sum(2),
             "head_positions": lambda h: h.permute(0, 2, 1)}
    out = {name: combined(view(star.heads), [view(h) for h, _ in star.dropped]) for name, view in views.items()}
    out["residual"] = combined(star.residual, [r for _, r in star.dropped])
    return out


class Discoverer(Method):
    """A way to score every edge of the residual graph. `points(steps)`: gradients taken per pair (what memory
    and time grow with); `gradients(steps)`: the engine's function giving them (engine.discovery.score_edges)."""

    uses_steps: ClassVar[bool] = False  # `steps` means something to it (recorded in the result)

    def points(self, steps: int) -> int:
        return 1

    def gradients(self, steps: int) -> Any:
        raise NotImplementedError


DISCOVERY: Family[type[Discoverer]] = Family("method")


@DISCOVERY.register
class EAP(Discoverer):
    name, title, help = "eap", "EAP", "the gradient at the clean run"

    def gradients(self, steps):
        from attnviz.engine.discovery import at_clean

        return at_clean


@DISCOVERY.register
class EAPIG(Discoverer):
    name, title, help = ("eap-ig", "EAP-IG", "averaged over --steps inputs from the corrupted to the clean embeddings "
                                             "(MIB's best)")

    uses_steps = True

    def points(self, steps):
        return steps

    def gradients(self, steps):
        from attnviz.engine.discovery import integrated

        return integrated(steps)
