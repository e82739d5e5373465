"""The slow, obviously-correct TracInCP: one autograd call per triple. For tests only.

influence[i, j] = sum_c lr_c * <grad l(theta_c, test_i), grad l(theta_c, train_j)>, with
l(z) = softplus(-score_hrt(z)) (BCE-with-logits against label 1), the model in eval mode,
gradients over the selected parameters, computed in float64 by default.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["reference_influence", "triple_gradient"]


def triple_gradient(model: nn.Module, triple: Tensor, names: Sequence[str]) -> Tensor:
    """Flattened gradient [P] of softplus(-score_hrt(triple)) over the parameters ``names``.

    Uses the model in whatever mode it is in (callers set eval mode); a batch of one.
    """
    params = dict(model.named_parameters())
    loss = F.softplus(-model.score_hrt(triple.view(1, 3))).sum()
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    return torch.cat([(torch.zeros_like(params[n]) if g is None else g).reshape(-1) for n, g in zip(names, grads)])


def reference_influence(
    model: nn.Module,
    checkpoints: Iterable[tuple[Mapping[str, Tensor], float]],
    test: Tensor,
    train: Tensor,
    names: Sequence[str],
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """TracInCP influence [n_test, n_train] (``dtype``) by per-triple autograd.

    checkpoints: (model state dict, lr) pairs. ``model`` is copied, never changed.
    """
    work = copy.deepcopy(model).to(dtype)
    total = torch.zeros(len(test), len(train), dtype=dtype)
    for state, lr in checkpoints:
        work.load_state_dict(state)
        work.to(dtype)
        work.eval()
        g_test = torch.stack([triple_gradient(work, z, names) for z in test])
        for j, z in enumerate(train):  # one training gradient at a time: memory [n_test + 1, P]
            total[:, j] += lr * (g_test @ triple_gradient(work, z, names))
    return total
