"""Influence functions for models too large for the exact Hessian: a block-diagonal Fisher.

influence(z, z') = grad l(z')^T (F + lambda I)^{-1} grad l(z)

with l the triple's loss softplus(-score_hrt) (as TracIn and `.influence` take it), the
gradients at the run's final weights (model in eval mode), and F the empirical Fisher of the
training triples, F = (1/n) sum_j grad l(z_j) grad l(z_j)^T, kept block-diagonal:

* every row of an embedding table (an entity's or relation's vector, [W]) is one W x W block:
  the rows a triple does not read get no gradient from it, so a row's block sums over the
  triples that read it (the d x d blocks of entity rows that a dense Hessian cannot afford);
* every other parameter (ConvE's convolution, fc, batch norm, entity bias) keeps its diagonal.

lambda = ``damping`` x the mean of F's diagonal (scale-free), so that rows no triple reads are
solved with lambda alone. F is positive semi-definite, so F + lambda I always factors (unlike
the Hessian of a non-convex loss). Memory: the blocks (rows x W x W) and one chunk of
per-triple gradients; time: two passes of per-triple gradients over the training set.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from kgtrace.attribution.grads import ScoreHRT
from kgtrace.attribution.params import select_parameters
from kgtrace.attribution.rows import SLOTS, row_gradients, row_tables
from kgtrace.runs.embedding import Run, final_model

__all__ = ["BlockFisher", "fisher_influence"]

# Gradient elements a chunk of triples may hold (vmap's intermediates were measured at ~35x that).
_GRADIENT_ELEMENTS = 1 << 22


class BlockFisher:
    """The damped block-diagonal Fisher of ``model`` over ``train`` (module doc), ready to solve with.

    Gradients come factored (`row_gradients`): the parameters
    that are not tables densely [n, P_dense], and per id space the rows each triple reads
    [n, S, W] (the space's tables side by side, e.g. ConvE's entity vector and entity bias: one
    block per entity covers both).
    """

    def __init__(self, model: nn.Module, train: Tensor, names: Sequence[str], damping: float = 1e-3):
        params = dict(model.named_parameters())
        self.model, self.names, self.wrapper = model, list(names), ScoreHRT(model)
        tables = row_tables(model)
        self.spaces = [space for space in SLOTS if any(tables.get(n) == space for n in self.names)]
        self.rows = {space: max(params[n].shape[0] for n in self.names if tables.get(n) == space)
                     for space in self.spaces}
        width = sum(params[n].numel() for n in self.names if n not in tables) + sum(
            len(SLOTS[s]) * sum(params[n][0].numel() for n in self.names if tables.get(n) == s) for s in self.spaces)
        self.chunk = max(1, _GRADIENT_ELEMENTS // max(width, 1))
        self.diagonal, self.blocks = self._accumulate(train)
        diagonals = [self.diagonal] + [b.diagonal(dim1=1, dim2=2).reshape(-1) for b in self.blocks.values()]
        self.damping = float(damping * torch.cat(diagonals).mean()) + 1e-12

    def gradients(self, triples: Tensor) -> tuple[Tensor, dict[str, tuple[Tensor, Tensor]]]:
        """Dense gradients [n, P_dense] and per space (row ids [n, S], each row's whole gradient [n, S, W]).

        A triple that reads one row in two slots (head = tail) gets the row's gradient, the sum of
        the two, in the first slot and zeros in the second, so that each row counts once.
        """
        dense, *per_space = row_gradients(self.wrapper, triples, self.names)
        rows = {}
        for space, g in zip(self.spaces, per_space):
            ids = triples[:, SLOTS[space]]  # [n, S]
            g = g.double().clone()  # [n, S, W]
            for s in range(1, ids.shape[1]):
                same = (ids[:, s] == ids[:, 0]).unsqueeze(1)  # [n, 1]
                g[:, 0] += torch.where(same, g[:, s], torch.zeros_like(g[:, s]))
                g[:, s] = torch.where(same, torch.zeros_like(g[:, s]), g[:, s])
            rows[space] = (ids, g)
        return dense.double(), rows

    def _accumulate(self, train: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """F's diagonal over the dense parameters [P_dense] and its blocks [rows, W, W] per space, averaged."""
        diagonal, blocks = None, {}
        for chunk in train.split(self.chunk):
            dense, rows = self.gradients(chunk)
            diagonal = (dense ** 2).sum(0) if diagonal is None else diagonal + (dense ** 2).sum(0)
            for space, (ids, g) in rows.items():
                width = g.shape[2]
                if space not in blocks:
                    blocks[space] = torch.zeros(self.rows[space], width, width, dtype=torch.float64)
                outer = torch.einsum("nsw,nsv->nswv", g, g).reshape(-1, width, width)  # [n * S, W, W]
                blocks[space].index_add_(0, ids.reshape(-1), outer)
        n = max(len(train), 1)
        return diagonal / n, {space: b / n for space, b in blocks.items()}

    def solve(self, triples: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """(F + lambda I)^{-1} grad l(z) of each of ``triples`` [N, 3]: dense [N, P_dense] and per space
        the whole table [N, rows, W] (zero-gradient rows stay zero)."""
        dense, rows = self.gradients(triples)
        solved_rows = {}
        for space, (ids, g) in rows.items():
            width = g.shape[2]
            full = torch.zeros(len(triples), self.rows[space], width, dtype=torch.float64)  # [N, rows, W]
            full.scatter_add_(1, ids.unsqueeze(2).expand(-1, -1, width), g)
            factor = torch.linalg.cholesky(self.blocks[space] + self.damping * torch.eye(width, dtype=torch.float64))
            # Each row's block factored once, solved for every test triple: [rows, W, N] -> [N, rows, W]
            solved_rows[space] = torch.cholesky_solve(full.permute(1, 2, 0), factor).permute(2, 0, 1)
        return dense / (self.diagonal + self.damping), solved_rows

    def inner(self, triples: Tensor, solved: tuple[Tensor, dict[str, Tensor]]) -> Tensor:
        """<grad l(z_j), solved_i> [n, N] for ``triples`` z_j and the solved vectors of `solve`."""
        dense, rows = self.gradients(triples)
        out = dense @ solved[0].T  # [n, N]
        for space, (ids, g) in rows.items():
            table = solved[1][space]  # [N, rows, W]
            for s in range(ids.shape[1]):
                out += torch.einsum("nw,Nnw->nN", g[:, s], table[:, ids[:, s]])  # rows read in slot s
        return out


def fisher_influence(run: Run, test: Tensor, params: str | Sequence[str] = "all", damping: float = 1e-3) -> Tensor:
    """Influence [n_test, n_train] (float64) with the block-diagonal Fisher at the final checkpoint (module doc)."""
    model = final_model(run).double()
    fisher = BlockFisher(model, run.dataset.train, select_parameters(model, params), damping)
    solved = fisher.solve(test.long().reshape(-1, 3))
    parts = [fisher.inner(chunk, solved) for chunk in run.dataset.train.split(fisher.chunk)]  # [chunk, N] each
    return torch.cat(parts).T.contiguous().detach()  # [N, n_train]
