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

Chains are computed one first relation a at a time: ``D_a @ [D_0 | D_1 | ... | D_{2R-1}]``,
a sparse [E, E] x [E, 2R E] product whose nonzeros are every body (a, b)'s pairs. Their number
is at most the two-hop paths that start with a, ``sum over a's edges (x, z) of deg(z)``, which
on a graph with hubs runs to billions (a Hetionet-shaped graph: 3.6e9 for one relation, 1.4e10
in all). So the product is taken a block of rows x at a time, each block holding at most
``max_chain_paths`` paths; a hub row with more than that alone is done on its own, its middle
entities z a chunk at a time within the limit, marking the columns it reaches in a dense [2R E]
mask (its distinct pairs are at most 2R E). Every count below sums over the rows x, and a pair
(x, y) belongs to the block of its x, so the blocks' counts add up to the whole product's exactly.
Supports come from looking the pairs up among the sorted fact keys (searchsorted); the PCA
denominators from a second sparse product of the bodies' per-x pair counts with the [E, R]
"x has an r-edge" matrix.
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

__all__ = ["MiningConfig", "MinedRule", "mine_rules"]

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

    def all_directed(self) -> "_Right":
        """[D_0 | D_1 | ... ], [E, 2R E], column d * E + y."""
        E = self.num_entities
        matrix = _coo(self.heads, self.relations * E + self.tails, torch.ones(len(self.heads)),
                      (E, 2 * self.num_relations * E))
        rows, col = matrix.indices()  # sorted by row, then column
        return _Right(matrix, torch.searchsorted(rows, torch.arange(E + 1)), col)


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
    within = torch.arange(len(hits)) - torch.repeat_interleave(torch.cumsum(hi - lo, 0) - (hi - lo), hi - lo)
    heads = graph.fact_keys[lo[hits] + within] % R
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
        right = graph.all_directed()
        for a in range(2 * R):
            counts, per_x = None, _paths_per_x(graph, a)
            for rows in _row_blocks(per_x, config.max_chain_paths):
                x, column = _chain_pairs(graph, right, a, rows, per_x, config.max_chain_paths)
                part = _count(graph, column // E, x, column % E, 2 * R)
                counts = part if counts is None else counts + part
            blocks.append(_select(counts, 2 * R + 2 * R * a + torch.arange(2 * R), graph, config))
    kept = _order(_Block.cat(blocks), config)
    return [_mined(kept, i, R) for i in range(len(kept.head))]


def _chain_pairs(graph: "_Graph", right: _Right, a: int, rows: range, per_x: Tensor,
                 limit: int) -> tuple[Tensor, Tensor]:
    """(x, column b E + y) of every nonzero of rows ``rows`` of D_a @ right: a sparse product, or for one hub
    row with more than ``limit`` paths, :func:`_hub_row`."""
    if limit and len(rows) == 1 and int(per_x[rows.start]) > limit:
        column = _hub_row(graph, right, a, rows.start, limit)
        return torch.full_like(column, rows.start), column
    x, column = _sparse_mm(graph.directed(a, rows), right.matrix).coalesce().indices()  # (x, b E + y) via some z
    return x + rows.start, column


def _hub_row(graph: "_Graph", right: _Right, a: int, x: int, limit: int) -> Tensor:
    """The columns (b E + y) row x of D_a @ right reaches, sorted: x's middle entities z a chunk at a time (at
    most ``limit`` paths each), the columns of their rows of ``right`` marked in a dense [2R E] mask."""
    middles = torch.unique(graph.tails[(graph.relations == a) & (graph.heads == x)])  # [k] z with a(x, z)
    crow, col = right.crow, right.col
    starts, counts = crow[middles], crow[middles + 1] - crow[middles]  # [k] each z's row of right
    cumulative = torch.cumsum(counts, 0)  # [k]
    mask = torch.zeros(right.matrix.shape[1], dtype=torch.bool)  # [2R E]
    begin = 0
    while begin < len(middles):
        before = int(cumulative[begin - 1]) if begin else 0
        end = max(int(torch.searchsorted(cumulative, before + limit, right=True)), begin + 1)
        s, c = starts[begin:end], counts[begin:end]
        # Positions in col of the chunk's rows: each row's start, then 0, 1, ..., count - 1 within it.
        within = torch.arange(int(c.sum())) - torch.repeat_interleave(torch.cumsum(c, 0) - c, c)
        mask[col[torch.repeat_interleave(s, c) + within]] = True
        begin = end
    return torch.nonzero(mask).squeeze(1)


def chain_paths(graph: "_Graph") -> Tensor:
    """[2R] the two-hop paths x -a-> z -> y starting with each directed relation a: its edges' deg(z) summed."""
    degree = torch.bincount(graph.heads, minlength=graph.num_entities)  # every directed edge leaving z
    return torch.zeros(2 * graph.num_relations, dtype=torch.long).index_add_(0, graph.relations, degree[graph.tails])


def _paths_per_x(graph: "_Graph", a: int) -> Tensor:
    """[E] the two-hop paths x -a-> z -> y of each row x: deg(z) summed over x's a-edges."""
    E = graph.num_entities
    degree = torch.bincount(graph.heads, minlength=E)  # every directed edge leaving z
    keep = graph.relations == a
    return torch.zeros(E, dtype=torch.long).index_add_(0, graph.heads[keep], degree[graph.tails[keep]])


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
