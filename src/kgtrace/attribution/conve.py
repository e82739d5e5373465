"""Exact factored per-triple gradients of ConvE, for any subset of its parameters.

In eval mode (batch norm on running statistics, dropouts the identity) ConvE scores a triple as

    a = maps(h, r)                    fc input [F]: conv, bn1, relu of the bn0'd image of (e_h, w_r)
    z = W a + b                       fc output [D]
    y = bn2(z) = gamma * z_hat + beta,  z_hat = (z - mu) / sqrt(var + eps)
    score = <relu(y), e_t> + b_t

With l = softplus(-score) and g = dl/dscore = -sigmoid(-score), going backwards:

    dl/de_t = g relu(y),  dl/db_t = g
    dl/dy = g e_t [y > 0]                           -> bn2.bias; bn2.weight: dl/dy * z_hat
    delta = dl/dz = dl/dy * gamma / sqrt(var + eps)  -> fc.bias; fc.weight = delta a^T (both kept factored)
    dl/da = W^T delta                               -> through maps: conv, bn0, bn1, e_h and w_r

Everything up to ``delta`` is closed form and costs O(D) per triple once each distinct (h, r)
pair's a and z are known (computed once per pair: a depends only on (h, r); in bands of which
two depend on h alone and on r alone: `.conve_bands`). The parameters before fc (the
"upstream" ones: conv, bn0, bn1 and the head and relation rows) need dl/da = W^T delta per
triple, [n, F], pulled back through the convolution block (`.conve_block`, by hand), band
by band, each through the image rows its band sees; only when such a parameter is selected is
that cost paid. Against test triples,
`conve_influence` takes those terms band by band, each in the cheaper mode
(`band_plan`): reverse (that pull-back, per training triple) or forward (one
Jacobian-vector product per test triple and distinct value of the band).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from kgtrace.attribution.conve_bands import KEYS, Band, BandFn, band_pass, band_values, bands, every_relation_band
from kgtrace.attribution.conve_block import block_jvp, block_vjp, conv_block, relu_gate
from kgtrace.attribution.factors import Factors, Outer, Part, dot
from kgtrace.compute.matmul import linear

__all__ = ["UPSTREAM", "band_plan", "conve_factors", "conve_influence", "needs_upstream", "pair_pass", "unique_pairs"]

#: Distinct pairs per block of forward-mode JVPs: their [pairs, F] tangents (~5 MB) stay in cache
#: for the fc product (measured 1.5x faster than one pass over all pairs on a CPU).
PAIR_BLOCK = 128
#: Most rows (test triples x relation ids) of the relation band's forward products kept for a pass (200 MB at D = 200).
RELATION_PRODUCTS = 1 << 18
#: Test triples from which forward-mode products meet a chunk's triples grouped by band value
#: (one [n_g, D] x [D, n_test] product per group) rather than one gather of [n, D] per test triple.
#: One CPU thread, 4,096 triples, D = 200, 162 values: 3.5 ms against 4.0 ms grouped for one test
#: triple, 6.9 against 3.9 for two, 26 against 4.5 for eight.
GROUPED_FROM = 2
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

    index: Tensor  # [n] each triple's distinct (head, relation) pair
    bands: list[Band]  # fc input in bands: per distinct head, pair, relation
    z_hat: Tensor  # [U, D] bn2-normalised fc output
    q: Tensor  # [n, D] query vector relu(y) of each triple's pair
    g: Tensor  # [n] dl/dscore
    dl_dy: Tensor  # [n, D]
    delta: Tensor  # [n, D] dl/dz, z = fc output


def pair_pass(model: nn.Module, pairs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per distinct (head, relation) pair [U, 2]: fc input a [U, F], bn2-normalised z_hat [U, D] and y [U, D].

    The whole fc input per pair, through the model's own layers: the reference that the bands
    (`band_pass`, which the factors use) are tested against.
    """
    a = model._features(pairs)  # [U, F]
    z_hat, y = _bn2(model, model.fc(a))  # [U, D], [U, D]
    return a, z_hat, y


def _forward(model: nn.Module, triples: Tensor, band_fn: BandFn = band_values) -> _Pass:
    """The eval-mode pass, fc's input in bands (`.conve_bands`): per distinct head, pair and relation."""
    if model.training:
        raise RuntimeError("ConvE factored gradients need the model in eval mode")
    pairs, index = unique_pairs(triples[:, :2], model.relation_embeddings.shape[0])
    fc_bands, z = band_pass(model, pairs, band_fn)  # per band [U_b, F_b], [U, D]
    z_hat, y = _bn2(model, z)  # [U, D], [U, D]
    dy_dz = _bn2_slope(model, y)  # [D]
    q = torch.relu(y).index_select(0, index)  # [n, D]
    tails = triples[:, 2]
    # index_select, not table[tails]: on a CPU advanced indexing gathers rows ~6x slower (a sixth of a pass over a
    # 1.1M-entity graph's training triples).
    e_t = model.entity_embeddings.index_select(0, tails)  # [n, D]
    g = -torch.sigmoid(-(torch.linalg.vecdot(q, e_t) + model.entity_bias.index_select(0, tails)))  # [n]
    dl_dy = g.unsqueeze(1) * e_t * relu_gate(q)  # [n, D], relu's derivative (q > 0 iff y > 0)
    return _Pass(index, fc_bands, z_hat, q, g, dl_dy, dl_dy * dy_dz)


@torch.no_grad()
def conve_factors(model: nn.Module, triples: Tensor, names: Sequence[str], upstream_chunk: int = 512,
                  band_fn: BandFn = band_values) -> Factors:
    """Factored gradients of softplus(-score) of ``triples`` [n, 3] over the parameters ``names``.

    ``model`` must be a ConvE in eval mode. fc's input is computed in bands (`.conve_bands`)
    by band_fn (`band_values` or its compiled form); per-triple upstream
    gradients are pulled back band by band, each through the image rows its band sees.
    """
    fw = _forward(model, triples, band_fn)
    return _assemble(model, triples, fw, names, upstream_chunk, fw.bands)


def _assemble(model: nn.Module, triples: Tensor, fw: _Pass, names: Sequence[str], upstream_chunk: int,
              reverse: list[Band]) -> Factors:
    """The factors of ``triples``; their upstream blocks and head and relation rows from the ``reverse`` bands' part of
    fc's input (all of it: the whole gradients), none with no such band (forward mode adds those terms)."""
    selected = set(names) if reverse else set(names) - {*UPSTREAM, "relation_embeddings"}
    blocks = {"fc.bias": fw.delta, "bn2.bias": fw.dl_dy}
    if "bn2.weight" in selected:
        blocks["bn2.weight"] = fw.dl_dy * fw.z_hat.index_select(0, fw.index)
    head_rows = rel_rows = None
    if reverse and selected & {*UPSTREAM, "entity_embeddings", "relation_embeddings"}:
        up, head_rows, rel_rows = _upstream(model, fw, upstream_chunk, reverse)
        blocks.update(up)
    dense = [blocks[name].reshape(len(triples), -1) for name in _dense_names(names) if name in selected]
    rows = {}
    entity = _entity_slots(triples, selected, fw.g, fw.q, head_rows, bool(reverse))
    if entity is not None:
        rows["entity"] = entity
    if "relation_embeddings" in selected:
        rows["relation"] = (triples[:, 1:2], rel_rows.unsqueeze(1))  # [n, 1], [n, 1, D]
    outer = []
    if "fc.weight" in selected:  # fc's input per triple: each band's rows through the triple's pair
        outer.append(Outer(fw.delta, [Part(b.a, b.index.index_select(0, fw.index), b.columns) for b in fw.bands],
                           bias=_fc_bias_in_outer(names)))
    return Factors(len(triples), torch.cat(dense, dim=1) if dense else None, rows, outer)


def _fc_bias_in_outer(names: Sequence[str]) -> bool:
    """Whether fc.bias rides in fc's outer factor (with fc.weight: its gradient is delta, the outer factor's own, so
    one product of the deltas serves both) instead of the dense block."""
    return {"fc.weight", "fc.bias"} <= set(names)


def _dense_names(names: Sequence[str]) -> tuple[str, ...]:
    """The selected parameters of the dense block, in its order (`_fc_bias_in_outer`)."""
    folded = {"fc.bias"} if _fc_bias_in_outer(names) else set()
    return tuple(name for name in UPSTREAM + DOWNSTREAM if name in names and name not in folded)


def needs_upstream(names: Sequence[str]) -> bool:
    """Whether ``names`` includes a parameter whose per-triple gradient needs a backward pass through the conv."""
    return bool(set(names) & {*UPSTREAM, "entity_embeddings", "relation_embeddings"})


def band_plan(model: nn.Module, names: Sequence[str], n_test: int, triples: Tensor, n_train: int) -> frozenset[str] | None:
    """The bands of fc's input (`bands`) whose upstream terms `conve_influence` takes in
    forward mode for this chunk of ``triples``; None without upstream parameters (the factors alone serve).

    Per band, reverse mode costs a [D] x [D, F_b] product per training triple, forward mode one per
    test triple and distinct value of the band in the chunk (head, pair). The relation band's
    forward products are computed once per pass for every relation id and kept, so they are set
    against the pass's ``n_train`` triples (and not kept past `RELATION_PRODUCTS` rows).
    """
    if not needs_upstream(names):
        return None
    pairs, _ = unique_pairs(triples[:, :2], model.relation_embeddings.shape[0])
    distinct = {"pair": len(pairs), "head": len(pairs[:, 0].unique())}
    forward = set()
    for key, _ in bands(model):
        if key == "relation":  # kept over the pass: against all its triples, within the memory bound
            rows = n_test * model.relation_embeddings.shape[0]
            pays = rows < n_train and rows <= RELATION_PRODUCTS
        else:
            pays = n_test * distinct[key] < len(triples)
        if pays:
            forward.add(key)
    return frozenset(forward)


@torch.no_grad()
def conve_influence(model: nn.Module, test: Factors, triples: Tensor, names: Sequence[str], forward: frozenset[str],
                    memo: dict[str, Tensor], band_fn: BandFn = band_values, upstream_chunk: int = 512) -> Tensor:
    """<grad l(test_i), grad l(triple_j)> [n_test, n] from the test triples' full factors, band by band.

    The downstream terms are the ordinary factored products. The upstream terms are sums over
    the bands of fc's input (`.conve_bands`), each taken in the mode `band_plan` chose:

    * reverse: the band's part of each training triple's upstream gradients, J_b^T W_b^T delta_j,
      pulled back through the band's rows of the image (`_upstream`), in the factors;
    * forward: <u_i, J_b^T W_b^T delta_j> = <W_b (J_b u_i), delta_j>, one Jacobian-vector product
      of the band's fc input along the test gradient u_i (its upstream parameters, and its entity
      and relation rows where the band's head or relation is one of them) per test triple and
      distinct value of the band (band_fn: `band_values` or its compiled form).
      The relation band's are made for every relation id once and kept in ``memo`` (one dict per
      checkpoint model and test set, for one pass over the training triples).
    """
    fw = _forward(model, triples, band_fn)
    reverse = [band for band in fw.bands if band.key not in forward]
    train = _assemble(model, triples, fw, names, upstream_chunk, reverse)
    out = dot(test if reverse else _downstream_part(model, test, names), train)
    for band in fw.bands:
        if band.key not in forward:
            continue
        if band.key == "relation":
            if "relation" not in memo:  # side-by-side chunks may both make it: the same values
                memo["relation"] = _band_products(model, test, names, every_relation_band(model, band_fn))
            _add_products(out, memo["relation"], triples[:, 1], fw.delta)
        else:
            _add_products(out, _band_products(model, test, names, band), band.index.index_select(0, fw.index), fw.delta)
    return out


def _band_products(model: nn.Module, test: Factors, names: Sequence[str], band: Band) -> Tensor:
    """W_b (J_b u_i) [n_test, U_b, D]: the band's part of fc's output along each test gradient u_i, per distinct value."""
    u_params = _param_tangents(model, test, names)
    block = conv_block(model, band.ids, band.a, band.image_rows(model))
    u_head, u_rel = _row_tangents(model, test, names, band)  # [n_test, U_b, D] each
    weight_t = band.weight(model).T  # [F_b, D]
    out = []
    for i in range(test.n):
        tangent = {n: v[i] for n, v in u_params.items()}
        out.append(torch.cat([block_jvp(model, block.part(s, s + PAIR_BLOCK), tangent, u_head[i, s:s + PAIR_BLOCK],
                                        u_rel[i, s:s + PAIR_BLOCK]) @ weight_t
                              for s in range(0, len(band.ids), PAIR_BLOCK)]))  # [U_b, D], per block (in cache)
    return torch.stack(out)


def _add_products(out: Tensor, products: Tensor, index: Tensor, delta: Tensor) -> None:
    """out[i, j] += <products[i, index_j], delta_j>: products [n_test, U_b, D] per band value, index [n], delta [n, D].

    Few test triples: a gather of [n, D] per test triple. More (from `GROUPED_FROM`): the
    triples grouped by value, one [n_g, D] x [D, n_test] product per group, and no [n_test, n, D] gather.
    """
    if len(products) < GROUPED_FROM:
        for i in range(len(products)):
            out[i] += torch.linalg.vecdot(products[i].index_select(0, index), delta)
        return
    order = torch.argsort(index, stable=True)
    values, counts = torch.unique_consecutive(index.index_select(0, order), return_counts=True)
    grouped = delta.index_select(0, order)  # [n, D], each value's triples together
    sums = torch.empty(len(index), len(products), dtype=out.dtype, device=out.device)  # [n, n_test] in that order
    start = 0
    for value, count in zip(values.tolist(), counts.tolist()):
        sums[start:start + count] = grouped[start:start + count] @ products[:, value].T
        start += count
    out += sums.index_select(0, torch.argsort(order)).T


def _dense_columns(model: nn.Module, names: Sequence[str]) -> dict[str, slice]:
    """Where each selected dense parameter sits in the dense block of `conve_factors`."""
    params, columns, at = dict(model.named_parameters()), {}, 0
    for name in _dense_names(names):
        columns[name] = slice(at, at + params[name].numel())
        at += params[name].numel()
    return columns


def _downstream_part(model: nn.Module, test: Factors, names: Sequence[str]) -> Factors:
    """The blocks of full test factors that meet the factors `_assemble` makes with no band in reverse mode
    (no upstream blocks, no relation rows, the tail's entity slot only)."""
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


def _upstream(model: nn.Module, fw: _Pass, chunk: int, reverse: list[Band]) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Per-triple gradients of the upstream parameters, and of the head and relation rows [n, D], from ``reverse``' part
    of fc's input (all bands: the whole gradients; else a part that forward mode completes).

    dl/da_b = W_b^T delta [c, F_b] is formed ``chunk`` triples at a time and pulled back through
    the band's rows of the image by hand (`block_vjp`).
    """
    total = None
    for band in reverse:
        block = conv_block(model, band.ids, band.a, band.image_rows(model))
        index = band.index.index_select(0, fw.index)  # [n] each triple's row of the band
        weight_t = band.weight(model).T.contiguous()  # [F_b, D]: dl/da_b = delta W_b as linear(delta, W_b^T)
        parts = [block_vjp(model, block, index[s:s + chunk], linear(fw.delta[s:s + chunk], weight_t))
                 for s in range(0, max(len(index), 1), chunk)]  # one part even for no triples
        grads = {name: torch.cat([p[0][name] for p in parts]) for name in parts[0][0]}
        found = grads, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
        total = found if total is None else _added(total, found)
    return total


def _added(x: tuple[dict[str, Tensor], Tensor, Tensor],
           y: tuple[dict[str, Tensor], Tensor, Tensor]) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Two bands' parts of `_upstream`'s gradients, summed (into x's tensors)."""
    for name, grad in y[0].items():
        x[0][name] += grad
    return x[0], x[1].add_(y[1]), x[2].add_(y[2])
