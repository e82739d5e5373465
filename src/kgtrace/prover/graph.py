"""The training graph as rule learning and rule application walk it: directed relations as sparse matrices.

A relation r (0 <= r < R) is walked forwards as the *directed relation* r, from a head to its tails,
and backwards as r + R, from a tail to its heads. A path of directed relations d_1 .. d_n from an
entity a reaches the entities y joined to a by some walk a -d_1-> z_1 -d_2-> ... -d_n-> y.

Reach is computed for a batch of B start entities at once as a 0/1 matrix [E, B] (column b: the
entities the b-th start reaches), one sparse product per step: ``reach' = (M_d @ reach > 0)`` where
``M_d[y, x] = 1`` when d(x, y) is a fact. The walk is over relations, not over distinct entities: a
middle entity may repeat (AnyBURL's object identity is kept only between a rule's head arguments, by
the callers).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["DirectedGraph", "PathWalker", "SparseWalker", "directed_inverse", "spans"]


def directed_inverse(d: int, num_relations: int) -> int:
    """The directed relation walking d backwards: r <-> r + R."""
    return d + num_relations if d < num_relations else d - num_relations


@dataclass(frozen=True)
class DirectedGraph:
    """The facts of a split, indexed for walks: per directed relation its matrix, and every fact's key."""

    num_entities: int
    num_relations: int
    steps: tuple[Tensor, ...]  # [2R] sparse COO float32 [E, E]: steps[d][y, x] = 1 when d(x, y)
    keys: Tensor  # [2N] sorted int64 keys (x * 2R + d) * E + y of every directed fact d(x, y)
    offsets: Tensor  # [E + 1] CSR row pointers of `neighbours` by source entity x
    neighbours: Tensor  # [2N, 2] (d, y) of each directed fact d(x, y), grouped by x
    pairs: Tensor  # [2N] sorted int64 keys (x * E + y) * 2R + d: the directed relations joining x to y

    @classmethod
    def of(cls, triples: Tensor, num_entities: int, num_relations: int) -> DirectedGraph:
        """Index ``triples`` [N, 3] (h, r, t) ids; duplicates count once."""
        E, R = num_entities, num_relations
        h, r, t = torch.unique(triples.long().cpu(), dim=0).unbind(1)
        x, d, y = torch.cat([h, t]), torch.cat([r, r + R]), torch.cat([t, h])  # [2N] both directions
        keys = (x * 2 * R + d) * E + y
        keys, order = torch.sort(keys)
        x, d, y = x[order], d[order], y[order]  # grouped by x (the key's leading part)
        offsets = torch.zeros(E + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(torch.bincount(x, minlength=E), 0)
        steps = tuple(_step_matrix(x[d == k], y[d == k], E) for k in range(2 * R))
        pairs = torch.sort((x * E + y) * 2 * R + d).values
        return cls(E, R, steps, keys, offsets, torch.stack([d, y], 1), pairs)

    def joining(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """For each pair, where its joining relations start in ``pairs`` and how many there are."""
        D = 2 * self.num_relations
        key = (x.long() * self.num_entities + y.long()) * D
        low = torch.searchsorted(self.pairs, key)
        return low, torch.searchsorted(self.pairs, key + D) - low

    def has(self, x: Tensor, d: Tensor, y: Tensor) -> Tensor:
        """Whether d(x, y) is a fact, elementwise over equal-shaped LongTensors: a BoolTensor of their shape."""
        keys = (x.long() * 2 * self.num_relations + d.long()) * self.num_entities + y.long()
        at = torch.searchsorted(self.keys, keys.contiguous()).clamp(max=len(self.keys) - 1)
        return self.keys[at] == keys

    def edges(self, x: Tensor, d: Tensor | int) -> tuple[Tensor, Tensor]:
        """Where each x's d-edges start in ``keys``/``neighbours`` and how many there are (their y are
        ``neighbours[low:low + count, 1]``)."""
        first = (x.long() * 2 * self.num_relations + d) * self.num_entities
        low = torch.searchsorted(self.keys, first.contiguous())
        return low, torch.searchsorted(self.keys, (first + self.num_entities).contiguous()) - low

    def has_edge(self, x: Tensor, d: Tensor) -> Tensor:
        """Whether x has some d-edge, elementwise over equal-shaped (or broadcast) LongTensors."""
        E, R = self.num_entities, self.num_relations
        low = (x.long() * 2 * R + d.long()) * E
        at = torch.searchsorted(self.keys, low.contiguous()).clamp(max=len(self.keys) - 1)
        return (self.keys[at] >= low) & (self.keys[at] < low + E)

    def walk(self, reach: Tensor, d: int) -> Tensor:
        """One step along directed relation d: [E, B] 0/1 float32 -> [E, B] 0/1 float32."""
        return (torch.sparse.mm(self.steps[d], reach) > 0).float()

    def reach(self, starts: Tensor, path: tuple[int, ...]) -> Tensor:
        """[E, B] 0/1: the entities each of ``starts`` [B] reaches along ``path``."""
        reach = torch.zeros(self.num_entities, len(starts))
        reach[starts.long(), torch.arange(len(starts))] = 1.0
        for d in path:
            reach = self.walk(reach, d)
        return reach

    def sources(self, path: tuple[int, ...], end: int | None) -> Tensor:
        """[E] bool: the entities from which ``path`` reaches ``end`` (None: reaches anything)."""
        if len(path) == 1:  # one step, read off the keys: the x with d(x, end), or with any d-edge
            return self._one_step_sources(path[0], end)
        back = tuple(directed_inverse(d, self.num_relations) for d in reversed(path))
        start = torch.ones(self.num_entities, 1) if end is None else self.reach(torch.tensor([end]), ())
        for d in back:
            start = self.walk(start, d)
        return start[:, 0] > 0


    def _one_step_sources(self, d: int, end: int | None) -> Tensor:
        E, R = self.num_entities, self.num_relations
        found = torch.zeros(E, dtype=torch.bool)
        if end is None:
            pairs = self.keys // E  # x 2R + d' of each fact
            found[pairs[pairs % (2 * R) == d] // (2 * R)] = True
            return found
        low, count = (int(v) for v in self.edges(torch.tensor(end), directed_inverse(d, R)))  # d(x, end): back(end, x)
        found[self.neighbours[low:low + count, 1]] = True
        return found


class PathWalker:
    """Reach along paths from fixed starts as dense 0/1 matrices [E, B], one sparse product a step, each path
    prefix walked once while it stays in ``cache_bytes``: the plain form `SparseWalker` is tested against."""

    def __init__(self, graph: DirectedGraph, starts: Tensor, cache_bytes: int = 512 << 20):
        self.graph, self.starts, self.cache_bytes = graph, starts, cache_bytes
        self.cache: OrderedDict[tuple[int, ...], Tensor] = OrderedDict()

    def reach(self, path: tuple[int, ...]) -> Tensor:
        """[E, B] 0/1 along ``path`` from each start, from the longest prefix already walked."""
        done = next((k for k in range(len(path), 0, -1) if path[:k] in self.cache), 0)
        if done:
            self.cache.move_to_end(path[:done])
            reach = self.cache[path[:done]]
        else:
            reach = self.graph.reach(self.starts, ())
        size = reach.numel() * reach.element_size()
        for k in range(done, len(path)):
            reach = self.graph.walk(reach, path[k])
            self.cache[path[: k + 1]] = reach
            while len(self.cache) * size > self.cache_bytes and len(self.cache) > 1:
                self.cache.popitem(last=False)
        return reach


class SparseWalker:
    """Reach along paths from fixed starts as pairs (entity, start), each path prefix walked once while it is
    kept (at most ``cache_pairs`` pairs): a step expands each pair along the step's edges (ranges of the sorted
    keys), so its cost follows the paths that exist rather than E x B. Where a step would expand more than
    ``max_expansion`` pairs (a hub), it is taken as a dense product instead."""

    def __init__(self, graph: DirectedGraph, starts: Tensor, cache_pairs: int = 50_000_000,
                 max_expansion: int = 20_000_000):
        self.graph, self.starts = graph, starts
        self.cache_pairs, self.max_expansion = cache_pairs, max_expansion
        self.cache: OrderedDict[tuple[int, ...], tuple[Tensor, Tensor]] = OrderedDict()
        self.cached = 0  # pairs held in the cache: a running total, not a sum over it at every step

    def reach(self, path: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """(entity [n], start column [n]): the distinct pairs reached along ``path``, sorted by column, entity."""
        done = next((k for k in range(len(path), 0, -1) if path[:k] in self.cache), 0)
        if done:
            self.cache.move_to_end(path[:done])
            pairs = self.cache[path[:done]]
        else:
            pairs = (self.starts.long(), torch.arange(len(self.starts)))
        for k in range(done, len(path)):
            pairs = self._step(*pairs, path[k])
            self.cache[path[: k + 1]] = pairs  # a new prefix: the longest cached one was path[:done]
            self.cached += len(pairs[0])
            while self.cached > self.cache_pairs and len(self.cache) > 1:
                self.cached -= len(self.cache.popitem(last=False)[1][0])
        return pairs

    def _step(self, entity: Tensor, column: Tensor, d: int) -> tuple[Tensor, Tensor]:
        E = self.graph.num_entities
        low, count = self.graph.edges(entity, d)
        total = int(count.sum())
        if total > self.max_expansion:  # a hub: one dense product over the starts
            dense = torch.zeros(E, len(self.starts))
            dense[entity, column] = 1.0
            following, column = self.graph.walk(dense, d).nonzero().unbind(1)
        else:
            positions, owner = spans(low, count)
            following = self.graph.neighbours[positions, 1]
            column = column[owner]
        key = torch.unique(column * E + following)  # distinct pairs, sorted by column then entity
        return key % E, key // E


def spans(low: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """The positions low[i] .. low[i] + count[i] - 1 of every span i, in order, and the i of each.

    (A search in the running totals rather than torch.repeat_interleave, whose small calls cost a
    millisecond each when another process keeps the cores busy.)"""
    ends = torch.cumsum(count, 0)
    total = int(ends[-1]) if len(ends) else 0
    position = torch.arange(total)
    owner = torch.searchsorted(ends, position, right=True)
    return low[owner] + position - (ends - count)[owner], owner


def _step_matrix(x: Tensor, y: Tensor, num_entities: int) -> Tensor:
    """Sparse [E, E] with a 1 at (y, x) for each pair."""
    indices = torch.stack([y, x])
    values = torch.ones(len(x))
    # COO, not CSR: torch's CSR product on the CPU costs milliseconds even for a tiny matrix, COO's microseconds,
    # and the two are even on the benchmarks' relations.
    matrix = torch.sparse_coo_tensor(indices, values, (num_entities, num_entities), check_invariants=True)
    return matrix.coalesce()
