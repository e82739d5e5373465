"""Running top-k over a stream of column chunks, independent of how the stream is chunked."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["RunningTopK", "TopK", "top_k_results"]

#: Candidates per kept value above which a merge first narrows them to the contenders (RunningTopK._contenders).
PREFILTER = 4


@dataclass
class TopK:
    """The most influential training triples for one test triple.

    proponents: train indices (into ``run.dataset.train``) with the largest influences,
    descending; opponents: those with the smallest (most negative), ascending. Ties go to the
    lower index. ``*_parts`` split each influence into the checkpoints' lr-weighted terms, in
    the order of ``TracIn.checkpoints`` (they sum to the influence).
    """

    test: Tensor  # [3] (head, relation, tail)
    proponents: Tensor  # LongTensor [k], indices into run.dataset.train
    proponent_influence: Tensor  # [k], descending
    proponent_parts: Tensor  # [k, C]
    opponents: Tensor  # LongTensor [k]
    opponent_influence: Tensor  # [k], ascending
    opponent_parts: Tensor  # [k, C]


class RunningTopK:
    """The k largest (or smallest) totals per row seen so far, with their columns and per-checkpoint parts.

    Ties are broken towards the lower column, so the result is the same whatever the chunking
    or the order in which chunks arrive.
    """

    def __init__(self, rows: int, k: int, parts: int, largest: bool, device: torch.device | str = "cpu"):
        self.k, self.largest = k, largest
        self.values = torch.empty(rows, 0, dtype=torch.float64, device=device)  # [n, <=k]
        self.columns = torch.empty(rows, 0, dtype=torch.long, device=device)  # [n, <=k]
        self.parts = torch.empty(rows, 0, parts, dtype=torch.float32, device=device)  # [n, <=k, C]

    def update(self, parts: Tensor, columns: Tensor) -> None:
        """Merge a chunk: parts [C, n, c] (summed over C in float64) of the columns [c]."""
        n = parts.shape[1]
        values = torch.cat([self.values, parts.double().sum(0)], dim=1)  # [n, k + c]
        cols = torch.cat([self.columns, columns.unsqueeze(0).expand(n, -1)], dim=1)  # [n, k + c]
        per = torch.cat([self.parts, parts.permute(1, 2, 0)], dim=1)  # [n, k + c, C]
        self._select(values, cols, per)

    def merge(self, states: list[dict[str, Tensor]]) -> None:
        """Merge other running top-k's of the same rows over disjoint columns (another process's, see `state`).

        The result is the top-k over all their columns, as if one stream had seen them all:
        the same values, and ties again broken towards the lower column.
        """
        device = self.values.device
        values = torch.cat([self.values, *(s["values"].to(device) for s in states)], dim=1)  # [n, m]
        cols = torch.cat([self.columns, *(s["columns"].to(device) for s in states)], dim=1)  # [n, m]
        per = torch.cat([self.parts, *(s["parts"].to(device) for s in states)], dim=1)  # [n, m, C]
        self._select(values, cols, per)

    def _select(self, values: Tensor, cols: Tensor, per: Tensor) -> None:
        """Keep the k best of candidates values [n, m] at columns [n, m] with parts [n, m, C]."""
        if values.shape[1] > PREFILTER * self.k:
            values, cols, per = self._contenders(values, cols, per)
        by_column = torch.argsort(cols, dim=1, stable=True)
        values, cols = values.gather(1, by_column), cols.gather(1, by_column)
        best = torch.argsort(values, dim=1, descending=self.largest, stable=True)[:, : self.k]  # [n, k]
        per = per.gather(1, by_column.unsqueeze(2).expand_as(per))
        self.values, self.columns = values.gather(1, best), cols.gather(1, best)
        self.parts = per.gather(1, best.unsqueeze(2).expand(-1, -1, per.shape[2]))

    def _contenders(self, values: Tensor, cols: Tensor, per: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The candidates [n, w] at least as good as each row's k-th best (ties to it included, so the
        tie-break by column is unchanged), padded per row with others that cannot make the k best.

        A chunk of 4,096 columns otherwise costs two full sorts per row (a fifth of ``explain``'s time).
        """
        kth = values.topk(self.k, dim=1, largest=self.largest).values[:, -1:]  # [n, 1]
        keep = values >= kth if self.largest else values <= kth  # [n, m], at least k a row
        width = int(keep.sum(1).max())
        chosen = keep.to(torch.uint8).topk(width, dim=1).indices  # [n, w]: every kept column, then filler
        return (values.gather(1, chosen), cols.gather(1, chosen),
                per.gather(1, chosen.unsqueeze(2).expand(-1, -1, per.shape[2])))

    def state(self) -> dict[str, Tensor]:
        return {"values": self.values, "columns": self.columns, "parts": self.parts}

    def load(self, state: dict[str, Tensor]) -> None:
        self.values, self.columns, self.parts = state["values"], state["columns"], state["parts"]


def top_k_results(test: Tensor, train_indices: Tensor, best: RunningTopK, worst: RunningTopK) -> list[TopK]:
    """One `TopK` per test triple; columns of the running top-k are positions in ``train_indices``."""
    train_indices = train_indices.cpu()
    return [TopK(test[i].cpu(), train_indices[best.columns[i].cpu()], best.values[i].float().cpu(), best.parts[i].cpu(),
                 train_indices[worst.columns[i].cpu()], worst.values[i].float().cpu(), worst.parts[i].cpu())
            for i in range(len(test))]
