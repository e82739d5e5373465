"""Exact factored per-triple gradients of ConvE, for any subset of its parameters.

In eval mode (batch norm on running statistics, dropouts the identity) ConvE scores a triple as

    a = maps(h, r)                    fc input [F]: conv, bn1, relu of the bn0'd image of (e_h, w_r)
    z = W a + b                       fc output [D]
    y = bn2(z) = gamma * z_hat + beta,  z_hat = (z - mu) / sqrt(var + eps)
    score = <relu(y), e_t> + b_t

With l = softplus(-score) and g = dl/dscore = -sigmoid(-score), going backwards:

    dl/de_t = g relu(y),  dl/db_t = g
    dl/dy = g e_t [y > 0]                           -> bn2.bias; bn2.weight: dl/dy * z_hat
    delta = dl/dz = dl/dy * gamma / sqrt(var + eps)  -> fc.bias; fc.weight = delta a^T (kept factored)
    dl/da = W^T delta                               -> through maps: conv, bn0, bn1, e_h and w_r

Everything up to ``delta`` is closed form and costs O(D) per triple once each distinct (h, r)
pair's a and z are known (computed once per pair: a depends only on (h, r)). The parameters
before fc (the "upstream" ones: conv, bn0, bn1 and the head and relation rows) need
dl/da = W^T delta per triple, [n, F], and one vector-Jacobian product of ``maps`` per
triple (torch.func ``vmap(grad)`` on a surrogate <maps(h, r), dl/da>). Only when such a
parameter is selected is that cost paid.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from kgtrace.attribution.factors import Factors, Outer

__all__ = ["UPSTREAM", "conve_factors", "unique_pairs"]

#: Parameters before fc whose gradients need a backward pass through the convolution.
UPSTREAM = ("bn0.weight", "bn0.bias", "conv.weight", "conv.bias", "bn1.weight", "bn1.bias")
#: Parameters after fc whose gradients are closed form, in the order their blocks are concatenated.
DOWNSTREAM = ("fc.bias", "bn2.weight", "bn2.bias")


def unique_pairs(hr: Tensor, num_relation_ids: int) -> tuple[Tensor, Tensor]:
    """Distinct (head, relation) rows [U, 2] of ``hr`` [n, 2] and each row's index [n] into them."""
    # One integer key per pair: a 1-D unique is ~40x faster than unique(dim=0) on CPU.
    keys, index = torch.unique(hr[:, 0] * num_relation_ids + hr[:, 1], return_inverse=True)
    return torch.stack([keys // num_relation_ids, keys % num_relation_ids], dim=1), index


@torch.no_grad()
def conve_factors(model: nn.Module, triples: Tensor, names: Sequence[str], upstream_chunk: int = 512) -> Factors:
    """Factored gradients of softplus(-score) of ``triples`` [n, 3] over the parameters ``names``.

    ``model`` must be a ConvE in eval mode.
    """
    if model.training:
        raise RuntimeError("conve_factors needs the model in eval mode")
    selected = set(names)
    pairs, index = unique_pairs(triples[:, :2], model.relation_embeddings.shape[0])
    a = model._features(pairs)  # [U, F]
    z = model.fc(a)  # [U, D]
    z_hat, y, dy_dz = _bn2(model, z)
    q = torch.relu(y)  # [U, D]
    tails = triples[:, 2]
    e_t = model.entity_embeddings[tails]  # [n, D]
    g = -torch.sigmoid(-(torch.linalg.vecdot(q[index], e_t) + model.entity_bias[tails]))  # [n]
    dl_dy = g.unsqueeze(1) * e_t * (y[index] > 0)  # [n, D]
    delta = dl_dy * dy_dz  # [n, D]
    blocks = {"fc.bias": delta, "bn2.bias": dl_dy}
    if "bn2.weight" in selected:
        blocks["bn2.weight"] = dl_dy * z_hat[index]
    head_rows = rel_rows = None
    if selected & {*UPSTREAM, "entity_embeddings", "relation_embeddings"}:
        up, head_rows, rel_rows = _upstream(model, triples, delta, selected, upstream_chunk)
        blocks.update(up)
    dense = [blocks[name].reshape(len(triples), -1) for name in UPSTREAM + DOWNSTREAM if name in selected]
    rows = {}
    entity = _entity_slots(triples, selected, g, q[index], head_rows)
    if entity is not None:
        rows["entity"] = entity
    if "relation_embeddings" in selected:
        rows["relation"] = (triples[:, 1:2], rel_rows.unsqueeze(1))  # [n, 1], [n, 1, D]
    outer = [Outer(a, index, delta)] if "fc.weight" in selected else []
    return Factors(len(triples), torch.cat(dense, dim=1) if dense else None, rows, outer)


def _bn2(model: nn.Module, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """bn2 on running statistics: z_hat [U, D], y [U, D] and dy/dz [D] (ones, z and ones without bn2)."""
    bn = model.bn2
    if bn is None:
        ones = torch.ones_like(z[0])
        return z, z, ones
    inv = torch.rsqrt(bn.running_var + bn.eps)  # [D]
    z_hat = (z - bn.running_mean) * inv
    return z_hat, z_hat * bn.weight + bn.bias, bn.weight * inv


def _entity_slots(triples: Tensor, selected: set[str], g: Tensor, q: Tensor,
                  head_rows: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """Entity-space ids and row gradients: slots (head, tail) with [embedding | bias] columns.

    The head's embedding row gets dl/de_h (through the convolution); the tail's gets g q
    and its bias g. With only entity_bias selected, the tail is the only slot.
    """
    emb, bias = "entity_embeddings" in selected, "entity_bias" in selected
    if not (emb or bias):
        return None
    g = g.unsqueeze(1)  # [n, 1]
    if not emb:
        return triples[:, 2:3], g.unsqueeze(1)  # [n, 1], [n, 1, 1]
    head = head_rows if not bias else torch.cat([head_rows, torch.zeros_like(g)], dim=1)  # [n, W]
    tail = g * q if not bias else torch.cat([g * q, g], dim=1)  # [n, W]
    return triples[:, [0, 2]], torch.stack([head, tail], dim=1)  # [n, 2], [n, 2, W]


class _Maps(nn.Module):
    """functional_call target: (head vectors [B, D], relation vectors [B, D]) -> fc input [B, F]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, h: Tensor, r: Tensor) -> Tensor:
        return self.model._maps(self.model._stack(h, r))


def _upstream(model: nn.Module, triples: Tensor, delta: Tensor, selected: set[str],
              chunk: int) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Per-triple gradients of the selected upstream parameters, and of the head and relation rows [n, D].

    dl/da = W^T delta [c, F] is formed ``chunk`` triples at a time; the gradient of the
    surrogate <maps(e_h, w_r), dl/da> equals the loss's (it is the same vector-Jacobian product).
    """
    wrapper = _Maps(model)
    params = {f"model.{n}": p.detach() for n, p in model.named_parameters() if n in UPSTREAM and n in selected}

    def surrogate(p: dict[str, Tensor], h: Tensor, r: Tensor, dl_da: Tensor) -> Tensor:
        a = functional_call(wrapper, p, (h.unsqueeze(0), r.unsqueeze(0)))  # [1, F]
        return torch.linalg.vecdot(a[0], dl_da)

    per_sample = vmap(grad(surrogate, argnums=(0, 1, 2)), in_dims=(None, 0, 0, 0))
    parts = []
    with torch.enable_grad():
        for start in range(0, len(triples), chunk):
            t = triples[start:start + chunk]
            dl_da = delta[start:start + chunk] @ model.fc.weight  # [c, F]
            h = model.entity_embeddings[t[:, 0]]
            r = model.relation_embeddings[t[:, 1]]
            parts.append(per_sample(params, h, r, dl_da))
    grads = {name[len("model."):]: torch.cat([p[0][name] for p in parts]) for name in params}
    return grads, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
