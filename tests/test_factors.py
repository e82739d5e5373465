"""Factored gradient inner products against the same gradients written out densely, by hand."""

import pytest
import torch

from kgtrace.attribution import factors
from kgtrace.attribution.factors import Factors, Outer, Part, dot, self_dot


def dense(f: Factors, num_ids: int) -> torch.Tensor:
    """Write factors out as full gradient vectors [n, P]: dense | entity table [num_ids, W] | outer D x F (| bias D)."""
    parts = [f.dense]
    ids, grads = f.rows["entity"]
    table = torch.zeros(f.n, num_ids, grads.shape[2], dtype=torch.float64)
    for j in range(f.n):
        for s in range(ids.shape[1]):
            table[j, ids[j, s]] += grads[j, s]  # a row hit by two slots gets their sum
    parts.append(table.reshape(f.n, -1))
    for o in f.outer:
        width = sum(p.a.shape[1] for p in o.parts)
        a = torch.zeros(f.n, width, dtype=torch.float64)
        for p in o.parts:
            a[:, torch.arange(width) if p.columns is None else p.columns] = p.a[p.index]
        parts.append(torch.einsum("nd,nf->ndf", o.delta, a).reshape(f.n, -1))
        if o.bias:
            parts.append(o.delta)  # the bias's gradient is the layer's output gradient
    return torch.cat(parts, dim=1)


def random_factors(ids, seed):
    """Dense, entity-row and two linear blocks: one with a whole input [5], one whose input [7] comes in
    two interleaved parts, one row per head id and one per triple, with its bias."""
    g = torch.Generator().manual_seed(seed)
    n = len(ids)
    heads = torch.tensor([i for i, _ in ids])
    a = torch.randn(3, 5, generator=g, dtype=torch.float64)
    split = Outer(torch.randn(n, 2, generator=g, dtype=torch.float64),
                  [Part(torch.randn(7, 3, generator=g, dtype=torch.float64), heads, torch.tensor([0, 3, 5])),
                   Part(torch.randn(n, 4, generator=g, dtype=torch.float64), torch.arange(n), torch.tensor([1, 2, 4, 6]))],
                  bias=True)
    return Factors(n, torch.randn(n, 2, generator=g, dtype=torch.float64),
                   {"entity": (torch.tensor(ids), torch.randn(n, 2, 4, generator=g, dtype=torch.float64))},
                   [Outer.whole(a, torch.tensor([j % 3 for j in range(n)]), torch.randn(n, 6, generator=g, dtype=torch.float64)),
                    split])


@pytest.mark.parametrize("dense_rows", [0.0, 1.0])  # row products: always one masked matmul, always gathered
def test_dot_equals_dense_products_with_shared_rows_and_self_loops(monkeypatch, dense_rows):
    monkeypatch.setattr(factors, "DENSE_ROWS", dense_rows)
    # (head, tail) ids: shared heads, a shared tail, a head equal to another's tail, and self-loops.
    x = random_factors([[0, 1], [2, 2], [1, 3]], seed=0)
    y = random_factors([[0, 4], [1, 0], [3, 3], [5, 6]], seed=1)
    expected = dense(x, 7) @ dense(y, 7).T
    torch.testing.assert_close(dot(x, y).double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(self_dot(x).double(), (dense(x, 7) ** 2).sum(1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(self_dot(y).double(), dot(y, y).diagonal().double(), rtol=1e-6, atol=1e-6)
    assert expected[1, 2] != 0 and dot(x, y)[0, 3] != 0  # rows met, and dense/outer blocks count without them
