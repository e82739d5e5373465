"""Exact last-layer TracIn for ConvE without per-sample [D x F] gradients.

In eval mode ConvE's query is q = relu(s * (W a + b) + c) with a = fc input [F]
(``_features``), W, b = ``fc``, and s, c the per-feature affine map of bn2 on its running
statistics (s = 1, c = 0 without batch normalisation; output dropout is the identity).
With score = <q, e_t> + b_t and l = softplus(-score), g = dl/dscore = -sigmoid(-score):

    delta = dl/d(W a + b) = g * s * [s * (W a + b) + c > 0] * e_t          [D]
    dl/dW = delta a^T,   dl/db = delta,   dl/d entity_bias = g * onehot(t)

so for two triples <dl/dW, dl/dW'> = <a, a'> <delta, delta'>, the fc.bias term is
<delta, delta'> and the entity_bias term is g g' [t == t']. a depends only on (h, r):
it is computed once per distinct (h, r) pair.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["FAST_PARAMETERS", "fast_available", "conve_factors", "fast_influence", "fast_self_influence"]

FAST_PARAMETERS = frozenset({"fc.weight", "fc.bias", "entity_bias"})


def fast_available(model: nn.Module, names: Sequence[str]) -> bool:
    """True when ``model`` is a ConvE and ``names`` is a non-empty subset of fc.weight, fc.bias, entity_bias."""
    return type(model).__name__ == "ConvE" and bool(names) and set(names) <= FAST_PARAMETERS


@torch.no_grad()
def pair_factors(model: nn.Module, hr: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For distinct (h, r) pairs [U, 2]: fc input a [U, F], query q [U, D] and dq/dz gate [U, D]."""
    a = model._features(hr)  # [U, F]
    z = model.fc(a)  # [U, D], fc output
    if model.bn2 is not None:
        bn = model.bn2
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)  # [D]
        y = bn(z)  # eval: running statistics
    else:
        scale = torch.ones_like(z[0])
        y = z
    gate = (y > 0).to(z.dtype) * scale  # [U, D], d q / d z (diagonal)
    return a, torch.relu(y), gate


@torch.no_grad()
def triple_factors(model: nn.Module, triples: Tensor, q: Tensor, gate: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """delta [n, D] and g [n] of ``triples`` whose (h, r) pair is row ``index`` [n] of q / gate."""
    tails = triples[:, 2]
    e_t = model.entity_embeddings[tails]  # [n, D]
    score = (q[index] * e_t).sum(dim=1) + model.entity_bias[tails]
    g = -torch.sigmoid(-score)  # [n]
    return g.unsqueeze(1) * gate[index] * e_t, g


@torch.no_grad()
def conve_factors(model: nn.Module, triples: Tensor, chunk_size: int = 4096) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(a_unique [U, F], index [n] into a_unique, delta [n, D], g [n]) of ``triples``; eval mode required."""
    if model.training:
        raise RuntimeError("conve_factors needs the model in eval mode")
    hr, index = torch.unique(triples[:, :2], dim=0, return_inverse=True)
    parts = [pair_factors(model, hr[s:s + chunk_size]) for s in range(0, len(hr), chunk_size)]
    a, q, gate = (torch.cat(x) for x in zip(*parts))
    delta, g = triple_factors(model, triples, q, gate, index)
    return a, index, delta, g


def fast_influence(model: nn.Module, test: Tensor, train: Tensor, names: Sequence[str],
                   chunk_size: int = 4096) -> Tensor:
    """One checkpoint's last-layer gradient dot products [n_test, n_train] (no lr).

    The training set's fc inputs are computed once per distinct (h, r) pair, ``chunk_size``
    pairs at a time, and only their products with the test inputs [n_test, U] are kept;
    triples are then scored ``chunk_size`` at a time. Apart from the [n_test, n_train]
    result, memory grows with the distinct pairs, not with the triples.
    """
    if model.training:
        raise RuntimeError("fast_influence needs the model in eval mode")
    names = set(names)
    a_te, i_te, d_te, g_te = conve_factors(model, test)
    a_te = a_te[i_te]  # [n_test, F]
    pairs, index = torch.unique(train[:, :2], dim=0, return_inverse=True)  # [U, 2], [n_train]
    aa = d_te.new_zeros(len(test), len(pairs))  # <a_test, a_pair> [n_test, U]
    q = d_te.new_zeros(len(pairs), d_te.shape[1])
    gate = torch.zeros_like(q)
    for start in range(0, len(pairs), chunk_size):
        a, q[start:start + chunk_size], gate[start:start + chunk_size] = pair_factors(model, pairs[start:start + chunk_size])
        if "fc.weight" in names:
            aa[:, start:start + chunk_size] = a_te @ a.T
    out = d_te.new_zeros(len(test), len(train))
    for start in range(0, len(train), chunk_size):
        chunk, at = train[start:start + chunk_size], index[start:start + chunk_size]
        d_tr, g_tr = triple_factors(model, chunk, q, gate, at)  # [c, D], [c]
        dd = d_te @ d_tr.T  # [n_test, c]
        block = out[:, start:start + len(chunk)]
        if "fc.weight" in names:
            block += aa[:, at] * dd
        if "fc.bias" in names:
            block += dd
        if "entity_bias" in names:
            same = test[:, 2].unsqueeze(1) == chunk[:, 2].unsqueeze(0)  # [n_test, c]
            block += torch.outer(g_te, g_tr) * same
    return out


def fast_self_influence(model: nn.Module, train: Tensor, names: Sequence[str], chunk_size: int = 4096) -> Tensor:
    """One checkpoint's squared last-layer gradient norms [n_train] (no lr)."""
    names = set(names)
    parts = []
    for start in range(0, len(train), chunk_size):
        a, i, d, g = conve_factors(model, train[start:start + chunk_size])
        dd = d.pow(2).sum(dim=1)
        part = torch.zeros_like(dd)
        if "fc.weight" in names:
            part += a.pow(2).sum(dim=1)[i] * dd
        if "fc.bias" in names:
            part += dd
        if "entity_bias" in names:
            part += g.pow(2)
        parts.append(part)
    return torch.cat(parts) if parts else torch.zeros(0)
