"""Known answers of (anchor, relation) queries, as a compressed sparse row index.

Both directions live in one index: the tail query (h, r, ?) has key (h, r) and
the head query (?, r, t) is the tail query of the inverse relation, key (t, r + R).
Training (KvsAll positives) and filtered evaluation both read this index, so the
two always agree on what "known" means.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def reciprocal_queries(triples: Tensor, num_relations: int) -> tuple[Tensor, Tensor]:
    """Both directions of each triple as (query, answer) pairs.

    triples: LongTensor [n, 3] (h, r, t). Returns queries [2n, 2] (anchor, relation)
    with relation in [0, 2R), and answers [2n]: tail queries first, then head queries.
    """
    h, r, t = triples.unbind(1)
    anchors = torch.cat([h, t])  # [2n]
    relations = torch.cat([r, r + num_relations])  # [2n]
    answers = torch.cat([t, h])  # [2n]
    return torch.stack([anchors, relations], dim=1), answers


def answering(known: Tensor, triples: Tensor, num_relations: int, device: torch.device | str | None = None) -> Tensor:
    """The rows of ``known`` [N, 3] that answer a query of ``triples`` [n, 3]: those with a triple's head
    and relation (its tail query) or its relation and tail (its head query), returned on the CPU.

    Filtered ranks of ``triples`` read only these, so an index of them ranks ``triples`` exactly as an
    index of all of ``known`` does, and costs memory in the queries' answers rather than in N (a few
    explained triples of a 16M-edge graph need thousands of rows, not all of them). device: where to
    search (a GPU's: N keys looked up at once; default the CPU).
    """
    device = torch.device("cpu") if device is None else torch.device(device)
    known, triples = known.long().to(device), triples.long().to(device)
    tail_queries = triples[:, 0] * num_relations + triples[:, 1]  # [n] (head, relation) keys
    head_queries = triples[:, 2] * num_relations + triples[:, 1]  # [n] (tail, relation) keys
    keep = (member(known[:, 0] * num_relations + known[:, 1], tail_queries)
            | member(known[:, 2] * num_relations + known[:, 1], head_queries))  # [N]
    return known[keep].cpu()


def member(values: Tensor, targets: Tensor) -> Tensor:
    """[N] bool: whether each of ``values`` [N] is among ``targets`` [m], by binary search in the sorted targets.

    torch.isin's answer, in O(N log m) where isin sorts all N + m values (2.4x faster for 2M values and 10k
    targets on a CPU).
    """
    targets = torch.unique(targets)  # [m'] sorted
    if not len(targets):
        return torch.zeros_like(values, dtype=torch.bool)
    at = torch.searchsorted(targets, values).clamp(max=len(targets) - 1)  # [N]
    return targets[at] == values


@dataclass(frozen=True)
class AnswerIndex:
    """CSR index: sorted unique query keys -> sorted answer entities.

    keys: LongTensor [Q], key = anchor * 2R + relation, sorted ascending.
    offsets: LongTensor [Q + 1]; the answers of keys[i] are answers[offsets[i]:offsets[i+1]].
    answers: LongTensor [P], sorted within each query.
    """

    num_relations: int
    keys: Tensor
    offsets: Tensor
    answers: Tensor

    @classmethod
    def build(cls, triples: Tensor, num_relations: int) -> "AnswerIndex":
        """Index the known answers of both directions of ``triples`` [n, 3]."""
        queries, answers = reciprocal_queries(triples.long().cpu(), num_relations)
        keys = queries[:, 0] * (2 * num_relations) + queries[:, 1]  # [2n]
        # Sort by (key, answer) so duplicates are adjacent and answers sorted per key.
        num_answers_bound = int(answers.max()) + 1 if answers.numel() else 1
        pair = torch.unique(keys * num_answers_bound + answers)  # sorted, duplicates gone
        keys, answers = pair // num_answers_bound, pair % num_answers_bound
        unique_keys, counts = torch.unique_consecutive(keys, return_counts=True)
        offsets = torch.zeros(len(unique_keys) + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(counts, 0)
        return cls(num_relations, unique_keys, offsets, answers)

    @property
    def num_queries(self) -> int:
        return len(self.keys)

    def queries(self) -> Tensor:
        """All indexed queries as LongTensor [Q, 2] (anchor, relation in [0, 2R))."""
        width = 2 * self.num_relations
        return torch.stack([self.keys // width, self.keys % width], dim=1)

    def key(self, queries: Tensor) -> Tensor:
        """[B, 2] (anchor, relation) -> keys [B]."""
        return queries[:, 0] * (2 * self.num_relations) + queries[:, 1]

    def positions(self, queries: Tensor) -> tuple[Tensor, Tensor]:
        """Position of each query in ``keys`` and whether it is indexed at all.

        queries: [B, 2] on CPU. Returns (pos [B], found [B] bool); pos is only
        meaningful where found.
        """
        keys = self.key(queries)
        pos = torch.searchsorted(self.keys, keys).clamp(max=max(self.num_queries - 1, 0))
        found = self.keys[pos] == keys if self.num_queries else torch.zeros_like(keys, dtype=torch.bool)
        return pos, found

    def pairs_at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Sparse (row, answer) pairs for the queries at index ``positions`` [B].

        Returns rows [P'] in 0..B-1 and answers [P'], the known answers of row i
        for each i: the sparse label matrix of a batch, never built densely.
        """
        starts, stops = self.offsets[positions], self.offsets[positions + 1]
        counts = stops - starts
        rows = torch.repeat_interleave(torch.arange(len(positions)), counts)  # [P']
        # Index of each pair inside its query's slice: 0, 1, ..., count-1 per row.
        within = torch.arange(int(counts.sum())) - torch.repeat_interleave(
            torch.cumsum(counts, 0) - counts, counts
        )
        return rows, self.answers[starts[rows] + within]

    def lookup(self, queries: Tensor) -> tuple[Tensor, Tensor]:
        """Known (row, answer) pairs of arbitrary queries [B, 2]; unknown queries have none."""
        pos, found = self.positions(queries)
        rows, answers = self.pairs_at(pos[found])
        return torch.nonzero(found).squeeze(1)[rows], answers
