"""The general TracIn path: per-sample gradients with torch.func, for any scorer.

For one checkpoint (the model's current weights), per-triple gradients of
l(z) = softplus(-score_hrt(z)) over the selected parameters are computed with
``vmap(grad(...))`` over ``functional_call`` and flattened to [n, P]: a `Factors`
with only a dense block. The caller bounds n (memory is n x P, and vmap's intermediates
are measured at ~35x that on CPU). The model must be in eval mode (callers ensure it):
each vmapped sample is a batch of one, so BatchNorm uses running statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from kgtrace.attribution.factors import Factors

__all__ = ["ScoreHRT", "dense_factors", "per_sample_gradients", "wrapped_gradients"]


class ScoreHRT(nn.Module):
    """functional_call target whose forward is the wrapped model's ``score_hrt``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, hrt: Tensor) -> Tensor:
        return self.model.score_hrt(hrt)


def per_sample_gradients(model: nn.Module, triples: Tensor, names: Sequence[str], of: str = "loss") -> Tensor:
    """Flattened per-triple gradients [n, P] over the parameters ``names`` (model's dtype).

    of: "loss" (softplus(-score), the module doc's l) or "score" (score_hrt itself, as TRAK takes it).
    """
    return wrapped_gradients(ScoreHRT(model), triples, names, of)


def wrapped_gradients(wrapper: ScoreHRT, triples: Tensor, names: Sequence[str], of: str = "loss") -> Tensor:
    """`per_sample_gradients` of ``wrapper.model``; the wrapper is built by the caller
    (outside a compiled region, where building a module is not allowed)."""
    all_params = dict(wrapper.model.named_parameters())
    params = {f"model.{n}": all_params[n].detach() for n in names}

    def loss(p: dict[str, Tensor], triple: Tensor) -> Tensor:
        score = functional_call(wrapper, p, (triple.unsqueeze(0),), strict=False)
        return (score if of == "score" else F.softplus(-score)).sum()

    with torch.enable_grad():
        grads = vmap(grad(loss), in_dims=(None, 0), randomness="error")(params, triples)
    return torch.cat([grads[f"model.{n}"].reshape(len(triples), -1) for n in names], dim=1)


def dense_factors(model: nn.Module, triples: Tensor, names: Sequence[str]) -> Factors:
    """The per-sample gradients as `Factors` with one dense block."""
    return Factors(len(triples), per_sample_gradients(model, triples, names))
