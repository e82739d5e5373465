"""Per-triple loss gradients in factored form, and their inner products.

TracIn needs <grad l(z), grad l(z')> for many pairs of triples. Materialising a gradient over
every parameter is what makes naive TracIn slow (ConvE's fc layer alone has 2M weights). A
`Factors` holds the same gradients of n triples in three kinds of blocks:

* ``dense`` [n, P]: small parameters (biases, batch norm, the convolution), materialised;
* ``rows``: per id space ("entity", "relation"), the embedding rows a triple's gradient
  touches, as ids [n, S] and row gradients [n, S, W] (S slots: for entities the head and the
  tail). A table's gradient is zero outside these rows, so two triples' gradients meet only
  where their ids are equal; the tables of one space (ConvE's entity embeddings and entity
  bias) are concatenated along W because they share the ids;
* ``outer``: a linear layer whose weight gradient is the outer product delta a^T, kept as
  its output gradient delta [n, D] and its input a, in one or more `Part` s (each a
  slice of the input's columns, one row per distinct value [U, F_p] with ``index`` [n] into
  them: ConvE's fc input has parts that depend on the head alone, on the pair, on the
  relation alone); <delta a^T, delta' a'^T> = <a, a'> <delta, delta'>, and <a, a'> is the
  sum over parts. With ``bias`` the layer's bias, whose gradient is delta itself, rides along as
  an input column of ones: the pair's product is (<a, a'> + 1) <delta, delta'>, one product of
  the deltas for both.

Then

    <g, g'> = <dense, dense'>
              + sum over spaces, slots s of g, slots s' of g': [id_s == id'_s'] <G_s, G'_s'>
              + sum over layers (<a, a'> + [bias]) <delta, delta'>

which is exact: the slot sum also covers a triple whose head equals its tail (both slots hit
the same row, and the row's gradient is their sum).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["Factors", "Outer", "Part", "dot", "self_dot"]

#: Share of (x, y) pairs meeting on a row (among the y that meet some x) above which `dot`
#: multiplies their row gradients in one masked matmul instead of gathering the pairs that meet.
#: Break-even measured on one CPU thread ([100, 200] against [4096, 200] row gradients, all y):
#: 2.5 ms either way at a share of 1%; at 10% 3.1 ms against 52 ms, at 0.1% 2.5 ms against 0.9 ms.
DENSE_ROWS = 0.01


@dataclass
class Part:
    """Some columns of a linear layer's input: their distinct values and each triple's row."""

    a: Tensor  # [U, F_p] distinct values
    index: Tensor  # LongTensor [n], row of ``a`` for each triple
    columns: Tensor | None = None  # LongTensor [F_p], the part's positions among the input's columns; None: all


@dataclass
class Outer:
    """A linear layer's per-triple weight gradients delta_j a_j^T, a_j the union of its parts' rows; with ``bias``
    also its bias gradients delta_j, as if a_j ended in a 1."""

    delta: Tensor  # [n, D] gradient of the loss at the layer's output
    parts: list[Part]  # disjoint column sets covering the layer's input
    bias: bool = False  # the layer's bias is among the parameters

    @classmethod
    def whole(cls, a: Tensor, index: Tensor, delta: Tensor, bias: bool = False) -> "Outer":
        """The gradients of a layer whose input is one part: distinct inputs a [U, F], index [n]."""
        return cls(delta, [Part(a, index)], bias)

    def gram(self, other: "Outer") -> Tensor:
        """<a_i, a'_j> (+ 1 with the bias) [n, n'] float32, part by part: the same columns in the same order, or one
        side whole."""
        assert self.bias == other.bias, "a layer's bias on one side only: factors from different parameter sets"
        out = None
        for px, py in zip(*_aligned(self.parts, other.parts), strict=True):
            assert px.a.shape[1] == py.a.shape[1], "parts of different widths: factors from different factorisers"
            # index_select, not aa[i][:, j]: advanced indexing along columns is ~4x slower on CPU.
            aa = (px.a @ py.a.T).float().index_select(0, px.index).index_select(1, py.index)  # [n, n']
            out = aa if out is None else out.add_(aa)
        return out.add_(1.0) if self.bias else out

    def input_norms(self) -> Tensor:
        """|a_j|^2 (+ 1 with the bias) [n] float32."""
        norms = sum(p.a.float().pow(2).sum(1).index_select(0, p.index) for p in self.parts)
        return norms + 1.0 if self.bias else norms


def _aligned(x: list[Part], y: list[Part]) -> tuple[list[Part], list[Part]]:
    """Parts cut alike: a whole input (one part, columns None) facing parts is cut into their columns."""
    if len(x) == len(y):
        return x, y
    if len(x) == 1 and x[0].columns is None:
        return [Part(x[0].a[:, p.columns], x[0].index, p.columns) for p in y], y
    if len(y) == 1 and y[0].columns is None:
        return x, [Part(y[0].a[:, p.columns], y[0].index, p.columns) for p in x]
    raise AssertionError("linear-layer inputs cut differently: factors from different factorisers")


@dataclass
class Factors:
    """Gradients of n triples' losses over one parameter set, factored (see the module doc)."""

    n: int
    dense: Tensor | None = None  # [n, P]
    rows: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)  # space -> (ids [n, S], grads [n, S, W])
    outer: list[Outer] = field(default_factory=list)

    def to(self, dtype: torch.dtype) -> "Factors":
        """The same factors in ``dtype`` (ids and indices stay integer)."""
        return Factors(
            self.n,
            None if self.dense is None else self.dense.to(dtype),
            {space: (ids, grads.to(dtype)) for space, (ids, grads) in self.rows.items()},
            [Outer(o.delta.to(dtype), [Part(p.a.to(dtype), p.index, p.columns) for p in o.parts], o.bias)
             for o in self.outer],
        )


def dot(x: Factors, y: Factors) -> Tensor:
    """Gradient inner products <g_i, g'_j>, [x.n, y.n] float32.

    Both must come from the same parameter set and factoriser (same blocks in the same order).
    """
    out = _zeros(x, (x.n, y.n))
    if x.dense is not None:
        out += (x.dense @ y.dense.T).float()
    for space, (ids_x, g_x) in x.rows.items():
        ids_y, g_y = y.rows[space]
        for s in range(ids_x.shape[1]):
            for s2 in range(ids_y.shape[1]):
                _add_row_products(out, ids_x[:, s], g_x[:, s], ids_y[:, s2], g_y[:, s2])
    for ox, oy in zip(x.outer, y.outer, strict=True):
        out += ox.gram(oy).mul_((ox.delta @ oy.delta.T).float())
    return out


def _add_row_products(out: Tensor, ids_x: Tensor, g_x: Tensor, ids_y: Tensor, g_y: Tensor) -> None:
    """out[i, j] += <g_x[i], g_y[j]> where ids_x[i] == ids_y[j]; ids [n] / [m], row gradients [n, W] / [m, W].

    Only the pairs that share a row contribute, and only the columns j whose row is among x's are
    looked at (a sorted membership test: with few test triples most of a chunk's j meet none). Where
    the pairs are few they are gathered; where they are many (small graphs, many test triples) one
    matmul over those columns, masked, is cheaper: it computes every product, but at matmul speed
    (`DENSE_ROWS`).
    """
    columns = torch.nonzero(torch.isin(ids_y, ids_x)).squeeze(1)  # [k] the j that meet some i
    if not len(columns):
        return
    same = ids_x.unsqueeze(1) == ids_y.index_select(0, columns).unsqueeze(0)  # [n, k]
    g_y = g_y.index_select(0, columns)  # [k, W]
    if int(same.sum()) > DENSE_ROWS * same.numel():
        out.index_add_(1, columns, (g_x @ g_y.T).float().mul_(same))
    else:
        i, j = torch.nonzero(same, as_tuple=True)
        out.index_put_((i, columns.index_select(0, j)), (g_x.index_select(0, i) * g_y.index_select(0, j)).sum(-1).float(),
                       accumulate=True)


def self_dot(x: Factors) -> Tensor:
    """Squared gradient norms <g_i, g_i>, [x.n] float32."""
    out = _zeros(x, (x.n,))
    if x.dense is not None:
        out += x.dense.float().pow(2).sum(1)
    for ids, grads in x.rows.values():
        for s in range(ids.shape[1]):
            for s2 in range(ids.shape[1]):
                same = (ids[:, s] == ids[:, s2]).float()  # [n]; always 1 when s == s2
                out += same * (grads[:, s].float() * grads[:, s2].float()).sum(-1)
    for o in x.outer:
        out += o.input_norms() * o.delta.float().pow(2).sum(1)
    return out


def _zeros(x: Factors, shape: tuple[int, ...]) -> Tensor:
    tensors = [x.dense] + [g for _, g in x.rows.values()] + [o.delta for o in x.outer]
    device = next((t.device for t in tensors if t is not None), torch.device("cpu"))
    return torch.zeros(shape, dtype=torch.float32, device=device)
