"""The general TracIn path: per-sample gradients with torch.func, chunked over triples.

For one checkpoint (the model's current weights), per-triple gradients of
l(z) = softplus(-score_hrt(z)) over the selected parameters are computed with
``vmap(grad(...))`` over ``functional_call``, flattened to [n, P], and reduced to dot
products chunk by chunk: memory holds the test gradients [n_test, P] plus one chunk of
training gradients [chunk_size, P] at a time. The model must be in eval mode (callers
ensure it): each vmapped sample is a batch of one, so BatchNorm uses running statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

__all__ = ["per_sample_gradients", "general_influence", "general_self_influence"]


def per_sample_gradients(model: nn.Module, triples: Tensor, names: Sequence[str]) -> Tensor:
    """Flattened per-triple gradients [n, P] over the parameters ``names`` (model's dtype)."""
    wrapper = _ScoreHRT(model)
    all_params = dict(model.named_parameters())
    params = {f"model.{n}": all_params[n].detach() for n in names}

    def loss(p: dict[str, Tensor], triple: Tensor) -> Tensor:
        score = functional_call(wrapper, p, (triple.unsqueeze(0),), strict=False)
        return F.softplus(-score).sum()

    grads = vmap(grad(loss), in_dims=(None, 0), randomness="error")(params, triples)
    return torch.cat([grads[f"model.{n}"].reshape(len(triples), -1) for n in names], dim=1)


class _ScoreHRT(nn.Module):
    """Wraps a model so that functional_call's forward is ``score_hrt``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, hrt: Tensor) -> Tensor:
        return self.model.score_hrt(hrt)


def general_influence(model: nn.Module, test: Tensor, train: Tensor, names: Sequence[str],
                      chunk_size: int = 256) -> Tensor:
    """One checkpoint's <grad l(test_i), grad l(train_j)>, [n_test, n_train] (no lr)."""
    g_test = per_sample_gradients(model, test, names)
    out = g_test.new_empty(len(test), len(train))
    for start in range(0, len(train), chunk_size):
        chunk = train[start:start + chunk_size]
        out[:, start:start + len(chunk)] = g_test @ per_sample_gradients(model, chunk, names).T
    return out


def general_self_influence(model: nn.Module, train: Tensor, names: Sequence[str], chunk_size: int = 256) -> Tensor:
    """One checkpoint's |grad l(train_j)|^2, [n_train] (no lr)."""
    parts = [per_sample_gradients(model, train[s:s + chunk_size], names).pow(2).sum(dim=1)
             for s in range(0, len(train), chunk_size)]
    return torch.cat(parts) if parts else torch.zeros(0)
