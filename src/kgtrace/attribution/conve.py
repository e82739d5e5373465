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
pair's a and z are known (computed once per pair: a depends only on (h, r); without upstream
parameters, in bands of which two depend on h alone and on r alone: :mod:`.conve_bands`). The parameters
before fc (the "upstream" ones: conv, bn0, bn1 and the head and relation rows) need
dl/da = W^T delta per triple, [n, F], pulled back through the convolution block
(:mod:`.conve_block`, by hand); only when such a parameter is selected is that cost paid.
With few test triples, :func:`conve_forward_influence` takes those terms in forward mode
instead, one Jacobian-vector product per (test triple, distinct pair).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from kgtrace.attribution.conve_bands import KEYS, Band, BandFn, band_pass, band_values, bands, whole_band
from kgtrace.attribution.conve_block import block_jvp, block_vjp, conv_block, relu_gate
from kgtrace.attribution.factors import Factors, Outer, Part, dot
from kgtrace.matmul import linear

__all__ = ["UPSTREAM", "conve_factors", "conve_forward_influence", "forward_mode_pays", "needs_upstream", "pair_pass",
           "unique_pairs"]

#: (model, pairs [U, 2]) -> (a [U, F], z_hat [U, D], y [U, D]): :func:`pair_pass` or its compiled form.
PairsFn = Callable[[nn.Module, Tensor], tuple[Tensor, Tensor, Tensor]]
#: Distinct pairs per block of forward-mode JVPs: their [pairs, F] tangents (~5 MB) stay in cache
#: for the fc product (measured 1.5x faster than one pass over all pairs on a CPU).
PAIR_BLOCK = 128
#: Parameters before fc whose gradients need a backward pass through the convolution.
UPSTREAM = ("bn0.weight", "bn0.bias", "conv.weight", "conv.bias", "bn1.weight", "bn1.bias")
#: Parameters after fc whose gradients are closed form, in the order their blocks are concatenated.
DOWNSTREAM = ("fc.bias", "bn2.weight", "bn2.bias")


def unique_pairs(hr: Tensor, num_relation_ids: int) -> tuple[Tensor, Tensor]:
    """Distinct (head, relation) rows [U, 2] of ``hr`` [n, 2] and each row's index [n] into them."""
    # One integer key per pair: a 1-D unique is ~40x faster than unique(dim=0) on CPU.
    keys, index = torch.unique(hr[:, 0] * num_relation_ids + hr[:, 1], return_inverse=True)
    return torch.stack([keys // num_relation_ids, keys % num_relation_ids], dim=1), index


@dataclass
class _Pass:
    """One eval-mode pass over triples: per distinct pair and per triple, what the gradients are made of."""

    pairs: Tensor  # [U, 2] distinct (head, relation)
    index: Tensor  # [n] each triple's pair
    bands: list[Band]  # fc input: one whole band [U, F], or bands per distinct head, pair, relation
    z_hat: Tensor  # [U, D] bn2-normalised fc output
    q: Tensor  # [n, D] query vector relu(y) of each triple's pair
    g: Tensor  # [n] dl/dscore
    dl_dy: Tensor  # [n, D]
    delta: Tensor  # [n, D] dl/dz, z = fc output


def pair_pass(model: nn.Module, pairs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per distinct (head, relation) pair [U, 2]: fc input a [U, F], bn2-normalised z_hat [U, D] and y [U, D].

    The costly part of the factors with upstream parameters (the convolution and fc; without
    them, :func:`~.conve_bands.band_values` per band), compiled under ``TracIn(compile=True)``
    (:mod:`.compiled`).
    """
    a = model._features(pairs)  # [U, F]
    z_hat, y = _bn2(model, model.fc(a))  # [U, D], [U, D]
    return a, z_hat, y


def _forward(model: nn.Module, triples: Tensor, pairs_fn: PairsFn = pair_pass, band_fn: BandFn = band_values,
             banded: bool = False) -> _Pass:
    """banded: compute fc's input in bands (:mod:`.conve_bands`), whose head and relation bands cost per
    distinct head and relation; else one whole band per pair, which per-triple upstream gradients need."""
    if model.training:
        raise RuntimeError("ConvE factored gradients need the model in eval mode")
    pairs, index = unique_pairs(triples[:, :2], model.relation_embeddings.shape[0])
    if banded:
        fc_bands, z = band_pass(model, pairs, band_fn)  # per band [U_b, F_b], [U, D]
        z_hat, y = _bn2(model, z)  # [U, D], [U, D]
    else:
        a, z_hat, y = pairs_fn(model, pairs)  # [U, F], [U, D], [U, D]
        fc_bands = [whole_band(model, pairs, a)]
    dy_dz = _bn2_slope(model, y)  # [D]
    q = torch.relu(y).index_select(0, index)  # [n, D]
    tails = triples[:, 2]
    # index_select, not table[tails]: on a CPU advanced indexing gathers rows ~6x slower (a sixth of a pass over a
    # 1.1M-entity graph's training triples).
    e_t = model.entity_embeddings.index_select(0, tails)  # [n, D]
    g = -torch.sigmoid(-(torch.linalg.vecdot(q, e_t) + model.entity_bias.index_select(0, tails)))  # [n]
    dl_dy = g.unsqueeze(1) * e_t * relu_gate(q)  # [n, D], relu's derivative (q > 0 iff y > 0)
    return _Pass(pairs, index, fc_bands, z_hat, q, g, dl_dy, dl_dy * dy_dz)


@torch.no_grad()
def conve_factors(model: nn.Module, triples: Tensor, names: Sequence[str], upstream_chunk: int = 512,
                  head_slot: bool = True, pairs_fn: PairsFn = pair_pass, band_fn: BandFn = band_values) -> Factors:
    """Factored gradients of softplus(-score) of ``triples`` [n, 3] over the parameters ``names``.

    ``model`` must be a ConvE in eval mode. head_slot=False leaves out everything that needs
    a backward pass through the convolution (upstream parameters, head and relation rows):
    :func:`conve_forward_influence` adds those terms another way. Without upstream parameters
    fc's input is computed in bands (:mod:`.conve_bands`) by band_fn (:func:`~.conve_bands.band_values`
    or its compiled form); with them, whole, per distinct pair by pairs_fn (:func:`pair_pass` or its
    compiled form): per-triple upstream gradients are pulled back through the whole image.
    """
    fw = _forward(model, triples, pairs_fn, band_fn, banded=not needs_upstream(names))
    return _assemble(model, triples, fw, names, upstream_chunk, head_slot)


def _assemble(model: nn.Module, triples: Tensor, fw: _Pass, names: Sequence[str], upstream_chunk: int,
              head_slot: bool) -> Factors:
    selected = set(names) if head_slot else set(names) - {*UPSTREAM, "relation_embeddings"}
    blocks = {"fc.bias": fw.delta, "bn2.bias": fw.dl_dy}
    if "bn2.weight" in selected:
        blocks["bn2.weight"] = fw.dl_dy * fw.z_hat.index_select(0, fw.index)
    head_rows = rel_rows = None
    if head_slot and selected & {*UPSTREAM, "entity_embeddings", "relation_embeddings"}:
        up, head_rows, rel_rows = _upstream(model, fw, upstream_chunk)
        blocks.update(up)
    dense = [blocks[name].reshape(len(triples), -1) for name in UPSTREAM + DOWNSTREAM if name in selected]
    rows = {}
    entity = _entity_slots(triples, selected, fw.g, fw.q, head_rows, head_slot)
    if entity is not None:
        rows["entity"] = entity
    if "relation_embeddings" in selected:
        rows["relation"] = (triples[:, 1:2], rel_rows.unsqueeze(1))  # [n, 1], [n, 1, D]
    outer = []
    if "fc.weight" in selected:  # fc's input per triple: each band's rows through the triple's pair
        outer.append(Outer(fw.delta, [Part(b.a, b.index.index_select(0, fw.index), b.columns) for b in fw.bands]))
    return Factors(len(triples), torch.cat(dense, dim=1) if dense else None, rows, outer)


def needs_upstream(names: Sequence[str]) -> bool:
    """Whether ``names`` includes a parameter whose per-triple gradient needs a backward pass through the conv."""
    return bool(set(names) & {*UPSTREAM, "entity_embeddings", "relation_embeddings"})


def forward_mode_pays(model: nn.Module, names: Sequence[str], n_test: int, triples: Tensor) -> bool:
    """True when :func:`conve_forward_influence` is cheaper than per-triple upstream gradients.

    Per-triple (reverse) costs one [D] x [D, F] product per training triple; forward mode one
    per (test triple, distinct value of each band: :func:`~.conve_bands.bands`) over the band's columns.
    """
    if not needs_upstream(names):
        return False
    pairs, _ = unique_pairs(triples[:, :2], model.relation_embeddings.shape[0])
    spans = bands(model)
    distinct = {"pair": len(pairs), "head": len(pairs[:, 0].unique()), "relation": len(pairs[:, 1].unique())}
    forward = n_test * sum(distinct[key] * len(rows) for key, rows in spans)  # in units of D x (C x Wc) products
    return forward < len(triples) * sum(len(rows) for _, rows in spans)


@torch.no_grad()
def conve_forward_influence(model: nn.Module, test: Factors, test_triples: Tensor, triples: Tensor,
                            names: Sequence[str], band_fn: BandFn = band_values) -> Tensor:
    """<grad l(test_i), grad l(triple_j)> [n_test, n] from the test triples' full factors, in forward mode.

    The upstream terms <u_i, J_p^T W^T delta_j> are computed as <W (J_p u_i), delta_j>: one
    Jacobian-vector product of the pair's fc input along the test gradient u_i (its upstream
    parameters, and its entity and relation rows where the pair's head or relation is one of
    them) per test triple and distinct value of each band of fc's input (per distinct head,
    pair and relation, :mod:`.conve_bands`; band_fn: :func:`~.conve_bands.band_values` or its
    compiled form), instead of a backward pass per training triple. The remaining terms are the
    ordinary factored products with the training triples' downstream factors.
    """
    fw = _forward(model, triples, band_fn=band_fn, banded=True)
    train = _assemble(model, triples, fw, names, 0, head_slot=False)
    out = dot(_downstream_part(model, test, names), train)
    u_params = _param_tangents(model, test, names)
    for band in fw.bands:
        block = conv_block(model, band.ids, band.a, band.image_rows(model))
        u_head, u_rel = _row_tangents(model, test, names, band)  # [n_test, U_b, D] each
        weight = band.weight(model)  # [D, F_b]
        index = band.index.index_select(0, fw.index)  # [n] each triple's row of the band
        for i in range(len(test_triples)):  # few test triples: that is when forward mode pays
            tangent = {n: v[i] for n, v in u_params.items()}
            w_da = torch.cat([block_jvp(model, block.part(s, s + PAIR_BLOCK), tangent, u_head[i, s:s + PAIR_BLOCK],
                                        u_rel[i, s:s + PAIR_BLOCK]) @ weight.T
                              for s in range(0, len(band.ids), PAIR_BLOCK)])  # [U_b, D], per block (in cache)
            out[i] += torch.linalg.vecdot(w_da.index_select(0, index), fw.delta)
    return out


def _dense_columns(model: nn.Module, names: Sequence[str]) -> dict[str, slice]:
    """Where each selected dense parameter sits in the dense block of :func:`conve_factors`."""
    params, columns, at = dict(model.named_parameters()), {}, 0
    for name in UPSTREAM + DOWNSTREAM:
        if name in names:
            columns[name] = slice(at, at + params[name].numel())
            at += params[name].numel()
    return columns


def _downstream_part(model: nn.Module, test: Factors, names: Sequence[str]) -> Factors:
    """The blocks of full test factors that meet ``conve_factors(..., head_slot=False)`` blocks."""
    columns = _dense_columns(model, names)
    keep = [columns[n] for n in DOWNSTREAM if n in columns]
    dense = torch.cat([test.dense[:, c] for c in keep], dim=1) if keep else None
    rows = {space: v for space, v in test.rows.items() if space == "entity"}
    return Factors(test.n, dense, rows, test.outer)


def _param_tangents(model: nn.Module, test: Factors, names: Sequence[str]) -> dict[str, Tensor]:
    """The test gradients' upstream parameter parts as tangents {name: [n_test, *shape]}."""
    params = dict(model.named_parameters())
    columns = _dense_columns(model, names)
    return {name: test.dense[:, columns[name]].reshape(test.n, *params[name].shape) for name in UPSTREAM
            if name in columns}


def _row_tangents(model: nn.Module, test: Factors, names: Sequence[str], band: Band) -> tuple[Tensor, Tensor]:
    """The test gradients' head-row [n_test, U_b, D] and relation-row [n_test, U_b, D] directions for each
    of the band's distinct values: zero where its head or relation is not among the test triple's rows,
    or is not what the band sees (a head band's relation id is a placeholder)."""
    ids, dim = band.ids, model.entity_embeddings.shape[1]
    u_head = torch.zeros(test.n, len(ids), dim, dtype=model.entity_embeddings.dtype, device=ids.device)
    u_rel = torch.zeros_like(u_head)
    if "entity_embeddings" in names and KEYS[band.key] != 1:
        rows, grads = test.rows["entity"]  # [n, 2], [n, 2, W]: slots (head, tail), embedding columns first
        for slot in range(rows.shape[1]):
            hit = (ids[:, 0].unsqueeze(0) == rows[:, slot].unsqueeze(1)).to(u_head.dtype)  # [n, U_b]
            u_head += hit.unsqueeze(2) * grads[:, slot, :dim].unsqueeze(1)
    if "relation_embeddings" in names and KEYS[band.key] != 0:
        rows, grads = test.rows["relation"]  # [n, 1], [n, 1, D]
        hit = (ids[:, 1].unsqueeze(0) == rows[:, 0].unsqueeze(1)).to(u_rel.dtype)  # [n, U_b]
        u_rel += hit.unsqueeze(2) * grads[:, 0].unsqueeze(1)
    return u_head, u_rel


def _bn2(model: nn.Module, z: Tensor) -> tuple[Tensor, Tensor]:
    """bn2 on running statistics: z_hat [U, D] and y [U, D] (z and z without bn2)."""
    bn = model.bn2
    if bn is None:
        return z, z
    inv = torch.rsqrt(bn.running_var + bn.eps)  # [D]
    z_hat = (z - bn.running_mean) * inv
    return z_hat, z_hat * bn.weight + bn.bias


def _bn2_slope(model: nn.Module, y: Tensor) -> Tensor:
    """dy/dz [D] of bn2 on running statistics (ones like a row of y [U, D] without bn2)."""
    bn = model.bn2
    if bn is None:
        return torch.ones_like(y[0])
    return bn.weight * torch.rsqrt(bn.running_var + bn.eps)


def _entity_slots(triples: Tensor, selected: set[str], g: Tensor, q: Tensor, head_rows: Tensor | None,
                  head_slot: bool = True) -> tuple[Tensor, Tensor] | None:
    """Entity-space ids and row gradients: slots (head, tail) with [embedding | bias] columns.

    The head's embedding row gets dl/de_h (through the convolution); the tail's gets g q
    and its bias g. With only entity_bias selected, or head_slot=False, the tail is the only slot.
    """
    emb, bias = "entity_embeddings" in selected, "entity_bias" in selected
    if not (emb or bias):
        return None
    g = g.unsqueeze(1)  # [n, 1]
    tail = torch.cat([g * q] * emb + [g] * bias, dim=1)  # [n, W]
    if not (emb and head_slot):
        return triples[:, 2:3], tail.unsqueeze(1)  # [n, 1], [n, 1, W]
    head = torch.cat([head_rows] + [torch.zeros_like(g)] * bias, dim=1)  # [n, W]
    return triples[:, [0, 2]], torch.stack([head, tail], dim=1)  # [n, 2], [n, 2, W]


def _upstream(model: nn.Module, fw: _Pass, chunk: int) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Per-triple gradients of the upstream parameters, and of the head and relation rows [n, D].

    dl/da = W^T delta [c, F] is formed ``chunk`` triples at a time and pulled back through
    the convolution block by hand (:func:`~.conve_block.block_vjp`).
    """
    (band,) = fw.bands  # per-triple gradients are pulled back through the whole image
    block = conv_block(model, fw.pairs, band.a)
    weight_t = model.fc.weight.T.contiguous()  # [F, D]: dl/da = delta W as linear(delta, W^T)
    parts = [block_vjp(model, block, fw.index[s:s + chunk], linear(fw.delta[s:s + chunk], weight_t))
             for s in range(0, max(len(fw.index), 1), chunk)]  # one part even for no triples
    grads = {name: torch.cat([p[0][name] for p in parts]) for name in parts[0][0]}
    return grads, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
