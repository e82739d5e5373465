"""AMIE-style rule mining with sparse matrix products.

Rules mined (X, Y the head's variables, Z the chain's middle):

* implication ``r(X,Y) :- s(X,Y)`` (s != r) and inverse ``r(X,Y) :- s(Y,X)`` (s == r: symmetry);
* chains ``r(X,Y) :- s(X,Z), t(Z,Y)`` in every direction variant: ``s(X,Z)`` or ``s(Z,X)``,
  then ``t(Z,Y)`` or ``t(Y,Z)``.

Each relation r is an E x E 0/1 matrix A_r; its inverse is A_r^T. With the 2R *directed*
relations D_0 .. D_{2R-1} (D_d = A_d for d < R, A_{d-R}^T after), a length-1 body is one
D_a and a chain body is the boolean product D_a D_b: the pairs (x, y) joined by some z.
For a body B and head r (AMIE's measures, pairs counted once each):

    support(B, r)        = |{(x, y) : B(x, y) and r(x, y)}|
    head coverage        = support / |{(x, y) : r(x, y)}|
    standard confidence  = support / |{(x, y) : B(x, y)}|
    PCA confidence       = support / |{(x, y) : B(x, y) and r(x, y') for some y'}|

The confidence written for a rule is the standard (or PCA) confidence damped by an offset,
``support / (denominator + offset)`` (AnyBURL's default 5): a body seen twice and right twice
is not as sure as one seen a hundred times and right a hundred times. Thresholds apply to
the undamped measures.

Chains are found in two passes, AMIE's pruning between them:

1. **Supports**, for every chain body (a, b) and head r at once, by listing the triangles a fact
   closes: a fact r(x, y) supports the body (a, b) when some z has D_a(x, z) and D_b(z, y). The z are
   taken from the end of the fact with fewer edges (triangle listing's rule: sum over the facts of
   ``min(deg(x), deg(y))`` wedges, 5e8 on a Hetionet-shaped graph, against 1.4e10 two-hop paths),
   and the other leg is looked up among the sorted edge keys (searchsorted); a fact joined to a
   body through several z counts once.
2. **Body sizes** (the confidences' denominators) only for the bodies with some head passing the
   support and head-coverage thresholds, and not for a body whose size is provably too large for
   any of them to pass the standard-confidence threshold: every x with an a-edge to z reaches
   all of z's b-neighbours, so ``|B| >= sum over x of max over its a-edges (x, z) of deg_b(z)``.
   A body with ``support / that bound < min_confidence`` for its best head fails the threshold
   whatever its exact size. The rest are counted exactly one first relation a at a time:
   ``D_a @ [D_b | D_b' | ...]`` over the bodies (a, b) kept, a sparse [E, E] x [E, k E] product
   whose nonzeros are those bodies' pairs. On a graph with hubs their number can still run to
   billions, so the product is taken a block of rows x at a time, each block holding at most
   ``max_chain_paths`` paths; a hub row with more than that alone is done on its own, its middle
   entities z a chunk at a time within the limit, marking the columns it reaches in a dense
   [k E] mask (its distinct pairs are at most k E). Every count sums over the rows x, and a pair
   (x, y) belongs to the block of its x, so the blocks' counts add up to the whole product's exactly.

The measures of the bodies kept come from the same counting as the length-1 bodies': supports by
looking the pairs up among the sorted fact keys, the PCA denominators from a sparse product of the
bodies' per-x pair counts with the [E, R] "x has an r-edge" matrix. The first pass's supports only
decide what the second counts: the rules written are those all-at-once counting would write.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from kgtrace.prover.config import MiningConfig
from kgtrace.prover.logic import Atom, Rule
from kgtrace.prover.rules import RuleSet

__all__ = ["MiningConfig", "MinedRule", "chain_supports", "mine_rules"]

@dataclass(frozen=True)
class MinedRule:
    rule: Rule
    support: int
    head_coverage: float
    std_confidence: float
    pca_confidence: float

    def note(self) -> str:
        return (f"support={self.support} head_coverage={self.head_coverage:.4f} "
                f"std={self.std_confidence:.4f} pca={self.pca_confidence:.4f}")


@dataclass(frozen=True)
class _Graph:
    """The directed relations of a training graph, as sparse matrices and sorted keys."""

    num_entities: int
    num_relations: int
    heads: Tensor  # [2n] x of each directed edge (d, x, y)
    relations: Tensor  # [2n] d in [0, 2R)
    tails: Tensor  # [2n] y
    fact_keys: Tensor  # sorted unique (x * E + y) * R + r of the facts r(x, y)
    head_sizes: Tensor  # [R] facts per relation
    domain: Tensor  # sparse [E, R]: 1 where x has an r-edge r(x, .)

    @classmethod
    def of(cls, triples: Tensor, num_entities: int, num_relations: int) -> "_Graph":
        triples = torch.unique(triples.long().cpu(), dim=0)  # sets: a repeated triple counts once
        h, r, t = triples.unbind(1)
        E, R = num_entities, num_relations
        fact_keys = torch.sort((h * E + t) * R + r).values
        domain_keys = torch.unique(h * R + r)
        domain = _coo(domain_keys // R, domain_keys % R, torch.ones(len(domain_keys)), (E, R))
        return cls(E, R, torch.cat([h, t]), torch.cat([r, r + R]), torch.cat([t, h]), fact_keys,
                   torch.bincount(r, minlength=R), domain)

    def directed(self, d: int, rows: range) -> Tensor:
        """Sparse COO [len(rows), E]: the rows x in ``rows`` of directed relation d."""
        keep = (self.relations == d) & (self.heads >= rows.start) & (self.heads < rows.stop)
        return _coo(self.heads[keep] - rows.start, self.tails[keep], torch.ones(int(keep.sum())),
                    (len(rows), self.num_entities))

    def directed_columns(self, bodies: Tensor) -> "_Right":
        """[D_b0 | D_b1 | ...] for the directed relations ``bodies`` [k]: [E, k E], column j E + y for D_bj(., y)."""
        E = self.num_entities
        column_of = torch.full((2 * self.num_relations,), -1, dtype=torch.long)
        column_of[bodies] = torch.arange(len(bodies))
        keep = column_of[self.relations] >= 0
        matrix = _coo(self.heads[keep], column_of[self.relations[keep]] * E + self.tails[keep],
                      torch.ones(int(keep.sum())), (E, len(bodies) * E))
        rows, col = matrix.indices()  # sorted by row, then column
        return _Right(matrix, torch.searchsorted(rows, torch.arange(E + 1)), col)


@dataclass(frozen=True)
class _Edges:
    """The directed edges (x, d, y) sorted by (x, y, d): keys to look an (x, y) pair's relations up in, and each
    x's edges as one CSR row."""

    keys: Tensor  # [2n] sorted (x E + y) 2R + d
    relations: Tensor  # [2n] d, in key order
    tails: Tensor  # [2n] y, in key order
    crow: Tensor  # [E + 1] x's edges are positions crow[x]:crow[x + 1]

    @classmethod
    def of(cls, graph: _Graph) -> "_Edges":
        E, D = graph.num_entities, 2 * graph.num_relations
        keys, order = torch.sort((graph.heads * E + graph.tails) * D + graph.relations)
        crow = torch.searchsorted(graph.heads[order], torch.arange(E + 1))
        return cls(keys, graph.relations[order], graph.tails[order], crow)

    def degree(self) -> Tensor:
        """[E] directed edges leaving each entity (its edges in either direction)."""
        return self.crow[1:] - self.crow[:-1]


@dataclass(frozen=True)
class _Right:
    """The right factor of every chain product: a COO matrix (torch's CSR x CSR product on CPU keeps about
    20 MB per call, gigabytes over a thousand blocks; COO's does not), and its rows as CSR arrays."""

    matrix: Tensor  # sparse COO [E, 2R E]
    crow: Tensor  # [E + 1] row z's nonzeros are col[crow[z]:crow[z + 1]]
    col: Tensor  # [nnz]


def _coo(rows: Tensor, cols: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():  # torch's notes on sparse invariants and beta CSR support: nothing to act on
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_coo_tensor(torch.stack([rows, cols]), values, size).coalesce()


def _sparse_mm(a: Tensor, b: Tensor) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse.mm(a, b)


@dataclass(frozen=True)
class _Counts:
    """Measures of some bodies against every head: all [num_bodies, R] except body_sizes [num_bodies]."""

    support: Tensor
    body_sizes: Tensor
    pca_sizes: Tensor

    def __add__(self, other: "_Counts") -> "_Counts":
        """The counts of two disjoint sets of rows x, together (every count is a sum over x)."""
        return _Counts(self.support + other.support, self.body_sizes + other.body_sizes,
                       self.pca_sizes + other.pca_sizes)


def _count(graph: _Graph, body: Tensor, x: Tensor, y: Tensor, num_bodies: int) -> _Counts:
    """Counts of distinct body pairs (body [P], x [P], y [P]) against every head relation."""
    E, R = graph.num_entities, graph.num_relations
    pair = x * E + y
    lo = torch.searchsorted(graph.fact_keys, pair * R)
    hi = torch.searchsorted(graph.fact_keys, pair * R + R)
    hits = torch.repeat_interleave(torch.arange(len(pair)), hi - lo)  # one row per (pair, head that holds)
    heads = graph.fact_keys[lo[hits] + _within(hi - lo)] % R
    support = torch.bincount(body[hits] * R + heads, minlength=num_bodies * R).view(num_bodies, R)
    body_sizes = torch.bincount(body, minlength=num_bodies)
    # Pairs per (body, x), times "x has an r-edge": the PCA denominators [num_bodies, R].
    keys, per_x = torch.unique(body * E + x, return_counts=True)
    per_body_x = _coo(keys // E, keys % E, per_x.double(), (num_bodies, E))
    pca_sizes = _sparse_mm(per_body_x, graph.domain.double()).to_dense().round().long()
    return _Counts(support, body_sizes, pca_sizes)


def _body_atoms(directions: tuple[int, ...], num_relations: int) -> tuple[Atom, ...]:
    """Directed relations -> body atoms with local variables X=0, Y=1, Z=2 (chain order X -> Z -> Y)."""
    R = num_relations
    path = [0, 2, 1] if len(directions) == 2 else [0, 1]  # the variables the path passes through
    atoms = []
    for d, (a, b) in zip(directions, zip(path, path[1:])):
        atoms.append((d, a, b) if d < R else (d - R, b, a))
    return tuple(atoms)


def mine_rules(triples: Tensor, num_entities: int, num_relations: int,
               config: MiningConfig | None = None) -> list[MinedRule]:
    """Mine rules from ``triples`` [n, 3] (h, r, t); best first: confidence, support, then body.

    Bodies are numbered: a for the length-1 body D_a, 2R + 2R a + b for the chain D_a D_b.
    """
    config = (config or MiningConfig()).validate()
    graph = _Graph.of(triples, num_entities, num_relations)
    R, E = num_relations, num_entities
    blocks: list[_Block] = []
    for a in range(2 * R):  # length 1: the body is D_a itself
        keep = graph.relations == a
        counts = _count(graph, torch.zeros(int(keep.sum()), dtype=torch.long), graph.heads[keep], graph.tails[keep], 1)
        blocks.append(_select(counts, torch.tensor([a]), graph, config))
    if config.chains:
        counted = _bodies_to_count(graph, chain_supports(graph, config.max_chain_paths), config)  # [2R, 2R]
        for a in range(2 * R):
            seconds = torch.nonzero(counted[a]).squeeze(1)  # [k] the b of the bodies (a, b) kept
            if not len(seconds):
                continue
            right = graph.directed_columns(seconds)
            counts, per_x = None, _paths_per_x(graph, a, right)
            for rows in _row_blocks(per_x, config.max_chain_paths):
                x, column = _chain_pairs(graph, right, a, rows, per_x, config.max_chain_paths)
                part = _count(graph, column // E, x, column % E, len(seconds))
                counts = part if counts is None else counts + part
            blocks.append(_select(counts, 2 * R + 2 * R * a + seconds, graph, config))
    kept = _order(_Block.cat(blocks), config)
    return [_mined(kept, i, R) for i in range(len(kept.head))]


def chain_supports(graph: _Graph, limit: int) -> Tensor:
    """[2R, 2R, R] the support of every chain body D_a D_b against every head r: the facts r(x, y) with some z
    such that D_a(x, z) and D_b(z, y), found from each fact's end with fewer edges, at most ``limit`` wedges (an
    edge from that end) at a time (0: all at once)."""
    R = graph.num_relations
    edges = _Edges.of(graph)
    degree = edges.degree()  # [E]
    n = len(graph.heads) // 2  # the facts: the first half of the directed edges
    from_x = degree[graph.heads[:n]] <= degree[graph.tails[:n]]  # [n] each fact's end to list the z from
    pivot = torch.where(from_x, graph.heads[:n], graph.tails[:n])  # [n]
    wedges = degree[pivot]  # [n] the edges each fact's z are listed from
    support = torch.zeros(4 * R * R * R, dtype=torch.long)  # flat [2R, 2R, R]
    for facts in _row_blocks(wedges, limit):
        facts = torch.arange(facts.start, facts.stop)
        support += _fact_bodies(graph, edges, facts, wedges[facts], from_x, pivot)
    return support.view(2 * R, 2 * R, R)


def _fact_bodies(graph: _Graph, edges: _Edges, facts: Tensor, count: Tensor, from_x: Tensor, pivot: Tensor) -> Tensor:
    """Flat [2R, 2R, R]: how many of ``facts`` [m] (indices of the facts r(x, y), ``count`` [m] wedges each) each
    chain body (a, b) joins."""
    E, R = graph.num_entities, graph.num_relations
    D = 2 * R
    fact = torch.repeat_interleave(facts, count)  # [W] each wedge's fact
    edge = edges.crow[pivot[fact]] + _within(count)  # [W] the pivot's edge: pivot -d-> z
    d, z, side = edges.relations[edge], edges.tails[edge], from_x[fact]
    x, y = graph.heads[fact], graph.tails[fact]
    # From x, the wedge x -a-> z (a = d) closes with the edges z -b-> y; from y, the wedge y -d-> z is z -b-> y
    # with b = d's inverse, and closes with the edges x -a-> z. Those edges are one range of the sorted keys.
    pair = torch.where(side, z * E + y, x * E + z) * D  # [W]
    lo = torch.searchsorted(edges.keys, pair)
    closes = edges.keys[lo.clamp(max=len(edges.keys) - 1)] < pair + D  # [W] some edge has that pair
    fact, d, side, pair, lo = fact[closes], d[closes], side[closes], pair[closes], lo[closes]
    many = torch.searchsorted(edges.keys, pair + D) - lo  # [V] how many relations join that pair
    other = edges.keys[torch.repeat_interleave(lo, many) + _within(many)] % D  # [M] each one
    fact, d, side = (torch.repeat_interleave(t, many) for t in (fact, d, side))
    a = torch.where(side, d, other)
    b = torch.where(side, other, (d + R) % D)
    # A fact joined to a body through several z counts once: distinct (fact, a, b).
    key = torch.unique((fact * D + a) * D + b)
    head = graph.relations[key // (D * D)]
    return torch.bincount(key % (D * D) * R + head, minlength=D * D * R)


def _bodies_to_count(graph: _Graph, support: Tensor, config: MiningConfig) -> Tensor:
    """[2R, 2R] the chain bodies whose sizes are counted: those with a head passing the support and head-coverage
    thresholds, less those whose size's lower bound already fails the standard-confidence one for each such head."""
    coverage = support.double() / graph.head_sizes.double().clamp(min=1)  # [2R, 2R, R] as _select computes it
    passing = (support >= max(config.min_support, 1)) & (coverage >= config.min_head_coverage)
    counted = passing.any(2)  # [2R, 2R]
    if config.min_confidence > 0:
        best = (support * passing).max(2).values.double()  # [2R, 2R] the best head's support
        lower = _body_size_lower_bounds(graph, counted).double()
        # Division rounds monotonically: support / |B| <= best / lower < min_confidence for every head.
        counted &= ~(best / lower.clamp(min=1) < config.min_confidence)
    return counted


def _body_size_lower_bounds(graph: _Graph, bodies: Tensor) -> Tensor:
    """[2R, 2R] for the bodies (a, b) marked in ``bodies`` [2R, 2R]: a lower bound of |D_a D_b|, the sum over the
    rows x of the most b-edges one of x's a-neighbours z has (x reaches them all); 0 for the rest."""
    E, D = graph.num_entities, 2 * graph.num_relations
    degree = torch.zeros(E, D, dtype=torch.int32).index_put_((graph.heads, graph.relations),
                                                           torch.ones(len(graph.heads), dtype=torch.int32),
                                                           accumulate=True)  # [E, 2R] deg_b(z)
    lower = torch.zeros(D, D, dtype=torch.long)
    for a in torch.nonzero(bodies.any(1)).squeeze(1).tolist():
        keep = graph.relations == a
        reach = degree[graph.tails[keep]]  # [|a|, 2R] deg_b(z) of each a-edge's z
        rows = graph.heads[keep].unsqueeze(1).expand(-1, D)
        most = torch.zeros(E, D, dtype=torch.int32).scatter_reduce_(0, rows, reach, "amax")  # [E, 2R]
        lower[a] = most.sum(0, dtype=torch.long)
    return lower * bodies


def _within(counts: Tensor) -> Tensor:
    """[sum(counts)] 0, 1, ..., c - 1 for each c in ``counts``: positions within each of consecutive runs."""
    return torch.arange(int(counts.sum())) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)


def _chain_pairs(graph: "_Graph", right: _Right, a: int, rows: range, per_x: Tensor,
                 limit: int) -> tuple[Tensor, Tensor]:
    """(x, column j E + y) of every nonzero of rows ``rows`` of D_a @ right: a sparse product, or for one hub
    row with more than ``limit`` paths, `_hub_row`."""
    if limit and len(rows) == 1 and int(per_x[rows.start]) > limit:
        column = _hub_row(graph, right, a, rows.start, limit)
        return torch.full_like(column, rows.start), column
    x, column = _sparse_mm(graph.directed(a, rows), right.matrix).coalesce().indices()  # (x, j E + y) via some z
    return x + rows.start, column


def _hub_row(graph: "_Graph", right: _Right, a: int, x: int, limit: int) -> Tensor:
    """The columns (j E + y) row x of D_a @ right reaches, sorted: x's middle entities z a chunk at a time (at
    most ``limit`` paths each), the columns of their rows of ``right`` marked in a dense [k E] mask."""
    middles = torch.unique(graph.tails[(graph.relations == a) & (graph.heads == x)])  # [k] z with a(x, z)
    crow, col = right.crow, right.col
    starts, counts = crow[middles], crow[middles + 1] - crow[middles]  # [k] each z's row of right
    cumulative = torch.cumsum(counts, 0)  # [k]
    mask = torch.zeros(right.matrix.shape[1], dtype=torch.bool)  # [k E]
    begin = 0
    while begin < len(middles):
        before = int(cumulative[begin - 1]) if begin else 0
        end = max(int(torch.searchsorted(cumulative, before + limit, right=True)), begin + 1)
        s, c = starts[begin:end], counts[begin:end]
        # Positions in col of the chunk's rows: each row's start, then 0, 1, ..., count - 1 within it.
        mask[col[torch.repeat_interleave(s, c) + _within(c)]] = True
        begin = end
    return torch.nonzero(mask).squeeze(1)


def chain_paths(graph: "_Graph") -> Tensor:
    """[2R] the two-hop paths x -a-> z -> y starting with each directed relation a: its edges' deg(z) summed."""
    degree = torch.bincount(graph.heads, minlength=graph.num_entities)  # every directed edge leaving z
    return torch.zeros(2 * graph.num_relations, dtype=torch.long).index_add_(0, graph.relations, degree[graph.tails])


def _paths_per_x(graph: "_Graph", a: int, right: _Right) -> Tensor:
    """[E] the two-hop paths x -a-> z -> y of each row x through ``right``: its rows' sizes summed over x's
    a-edges (x, z)."""
    degree = right.crow[1:] - right.crow[:-1]  # [E] the nonzeros of z's row
    keep = graph.relations == a
    return torch.zeros(graph.num_entities, dtype=torch.long).index_add_(0, graph.heads[keep], degree[graph.tails[keep]])


def _row_blocks(per_x: Tensor, limit: int) -> list[range]:
    """Consecutive ranges of rows x whose paths ``per_x`` [E] sum to at most ``limit`` each (0: one block of
    every row); a row with more paths than that is a block of its own."""
    E = len(per_x)
    if not limit:
        return [range(0, E)]
    cumulative = torch.cumsum(per_x, 0)  # [E] paths of rows 0..x
    blocks, start = [], 0
    while start < E:
        before = int(cumulative[start - 1]) if start else 0
        stop = int(torch.searchsorted(cumulative, before + limit, right=True))  # rows up to it stay within limit
        blocks.append(range(start, max(stop, start + 1)))
        start = blocks[-1].stop
    return blocks


@dataclass(frozen=True)
class _Block:
    """Rules passing the thresholds, as columns [n]."""

    body: Tensor  # body number (see mine_rules)
    head: Tensor
    support: Tensor
    coverage: Tensor
    std: Tensor
    pca: Tensor
    confidence: Tensor  # std or pca, as configured

    @staticmethod
    def cat(blocks: list["_Block"]) -> "_Block":
        return _Block(*(torch.cat([getattr(b, f.name) for b in blocks]) for f in fields(_Block)))

    def take(self, index: Tensor) -> "_Block":
        return _Block(*(getattr(self, f.name)[index] for f in fields(_Block)))


def _select(counts: _Counts, bodies: Tensor, graph: _Graph, config: MiningConfig) -> _Block:
    """The (body, head) pairs of one block that pass every threshold; bodies [num_bodies] numbers them."""
    support = counts.support.double()
    std = support / counts.body_sizes.double().clamp(min=1).unsqueeze(1)  # [num_bodies, R]
    pca = support / counts.pca_sizes.double().clamp(min=1)
    coverage = support / graph.head_sizes.double().clamp(min=1).unsqueeze(0)
    keep = ((counts.support >= config.min_support) & (coverage >= config.min_head_coverage)
            & (std >= config.min_confidence) & (pca >= config.min_pca_confidence))
    keep &= bodies.unsqueeze(1) != torch.arange(graph.num_relations)  # r(X,Y) :- r(X,Y) says nothing
    i, head = torch.nonzero(keep, as_tuple=True)
    denominator = counts.body_sizes.double().unsqueeze(1) if config.confidence == "std" else counts.pca_sizes.double()
    confidence = support / (denominator + config.confidence_offset).clamp(min=1e-12)
    return _Block(bodies[i], head, counts.support[i, head], coverage[i, head], std[i, head], pca[i, head],
                  confidence[i, head])


def _order(block: _Block, config: MiningConfig) -> _Block:
    """Sort by confidence, then support (both descending), then body and head; keep each head's best N."""
    order = np.lexsort((block.head.numpy(), block.body.numpy(), -block.support.numpy(), -block.confidence.numpy()))
    block = block.take(torch.from_numpy(order))
    if not config.max_rules_per_head:
        return block
    # The rank of each rule among its head's rules, in the sorted order.
    by_head = torch.from_numpy(np.argsort(block.head.numpy(), kind="stable"))
    heads = block.head[by_head]
    starts = torch.searchsorted(heads, heads)  # first position of each head in the head-sorted order
    rank = torch.empty_like(by_head)
    rank[by_head] = torch.arange(len(by_head)) - starts
    return block.take(torch.nonzero(rank < config.max_rules_per_head).squeeze(1))


def _mined(block: _Block, i: int, num_relations: int) -> MinedRule:
    R, body = num_relations, int(block.body[i])
    directions = (body,) if body < 2 * R else divmod(body - 2 * R, 2 * R)
    rule = Rule(int(block.head[i]), _body_atoms(tuple(directions), R), float(block.confidence[i]))
    return MinedRule(rule, int(block.support[i]), float(block.coverage[i]), float(block.std[i]), float(block.pca[i]))


def rule_set(mined: list[MinedRule], num_relations: int) -> RuleSet:
    """The mined rules as a RuleSet, in the mined order."""
    return RuleSet(tuple(m.rule for m in mined), num_relations)
