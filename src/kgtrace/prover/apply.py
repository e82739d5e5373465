"""Rule application: a query's candidates ranked by the rules that predict them (AnyBURL's, vectorised).

A query q(a, ?) asks for the tails of r(a, ?) (q = r) or the heads of r(?, a) (q = r + R). Each rule
with head relation r answers it in one of three ways (`directed_rules`), its body read as a path of
directed relations (`kgtrace.prover.graph`) from the head's variable:

* cyclic ``r(X,Y) :- b1(X,A), b2(A,B), b3(B,Y)``: the answers are the ends of the body's path walked from
  a (from Y to X, inverted, for a head query);
* ``r(X,c) :- path(X, d)`` (AnyBURL's AC1; ``path(X, A)`` with a dangling A is AC2), queried from X: the
  answer c, when the path walked from a reaches d (reaches anything);
* the same rule queried from its constant (a head query r(?, c)): when a is c, the answers are every
  entity whose path reaches d (reaches anything), computed once.

An answer is never the anchor itself (AnyBURL's object identity between a head's arguments); the path's
middle entities are free. A candidate no rule predicts scores 0, below every predicted one.

Aggregations (``aggregation``), each over the rules predicting a candidate:

* ``maxplus`` (AnyBURL's max+): by the best rule's confidence, ties broken by the second best, then the
  third, ... over ``places`` rules. The score is an exact lexicographic key: with the query relation's
  distinct confidences numbered 1..L in ascending order (L < 2^bits), a candidate's k-th best rule adds
  ``level * 2^(bits * (places - 1 - k))``; bits * places <= 52, so keys are integers float64 holds exactly
  and compare as the sequences of confidences do.
* ``max``: the best rule's confidence (its ties stay ties); the form a hybrid adds to an embedding's logit.
* ``noisy_or``: ``-sum log(1 - c)``, the evidence of the noisy-or ``1 - prod(1 - c)`` (monotone in it,
  and exact where the noisy-or probability rounds to 1); rules taken as independent.

Rules are applied in descending confidence, so a candidate's k-th firing is its k-th best rule. The
reach of each path prefix is kept (within ``cache_bytes``) for the rules that share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from kgtrace.core.errors import ConfigError
from kgtrace.models.base import inverse_queries
from kgtrace.prover.config import AGGREGATIONS
from kgtrace.prover.graph import DirectedGraph, PathWalker, directed_inverse
from kgtrace.prover.logic import Rule, constant_of
from kgtrace.prover.rules import RuleSet

__all__ = ["AGGREGATIONS", "DirectedRule", "RuleScorer", "directed_rules", "rule_path"]

KEY_BITS = 52  # a maxplus key's bits: integers below 2^53 are exact in float64
MAX_PLACES = 8  # maxplus compares at most this many rules per candidate
MAX_CONFIDENCE = 1.0 - 1e-9  # noisy_or: a rule of confidence 1 would make -log(1 - c) infinite
FLUSH_EVENTS = 1 << 20  # predictions buffered before they are added to the scores


@dataclass(frozen=True)
class DirectedRule:
    """A rule as it answers q(a, ?) (module doc): kind "cyclic", "condition" or "constant"."""

    query: int  # the directed head relation q: r, or r + R for heads of r
    kind: str
    path: tuple[int, ...]  # directed relations walked from the anchor (cyclic, condition) or from the answers (constant)
    end: int | None  # condition, constant: the entity the path ends at; None: anywhere (a dangling variable)
    constant: int | None  # condition: the answer; constant: the anchor it answers for
    confidence: float
    rule: int  # its index in the RuleSet


def rule_path(rule: Rule, num_relations: int) -> tuple[tuple[int, ...], int | None, bool]:
    """The body as a path from the head's variable X (local 0): (directed relations, the entity it ends at or
    None, whether it ends at the head's Y). ConfigError when the body is not such a path."""
    atoms, current, path = list(rule.body), 0, []
    seen = {0}
    while atoms:
        touching = [i for i, (_, a, b) in enumerate(atoms) if current in (a, b)]
        if len(touching) != 1 or current < 0:
            raise ConfigError([f"{rule.source or 'a rule'}: rule application takes AnyBURL's path rules (a body "
                               "that walks from X to Y, or from X to a constant or a free end); fix: drop this rule "
                               "or rank with the SLD engines (kgtrace prove bfs)"])
        relation, a, b = atoms.pop(touching[0])
        path.append(relation if a == current else relation + num_relations)
        current = b if a == current else a
        if current >= 0 and current in seen:
            raise ConfigError([f"{rule.source or 'a rule'}: the body's path returns to a variable it passed; fix: "
                               "drop this rule (rule application takes paths)"])
        seen.add(current)
    cyclic = rule.head_args == (0, 1)
    if cyclic and current != 1:
        raise ConfigError([f"{rule.source or 'a rule'}: the body's path from X does not end at Y; fix: drop this rule"])
    end = constant_of(current) if current < 0 else None
    return tuple(path), end, cyclic


def directed_rules(rules: RuleSet) -> list[DirectedRule]:
    """Each rule's two directed forms (module doc), in rule order."""
    R, found = rules.num_relations, []
    for index, rule in enumerate(rules.rules):
        path, end, cyclic = rule_path(rule, R)
        if cyclic:
            back = tuple(directed_inverse(d, R) for d in reversed(path))
            found += [DirectedRule(rule.head, "cyclic", path, None, None, rule.confidence, index),
                      DirectedRule(rule.head + R, "cyclic", back, None, None, rule.confidence, index)]
            continue
        constant = constant_of(min(rule.head_args))  # the head's other argument is X (local 0)
        from_x = rule.head if rule.head_args[0] == 0 else rule.head + R  # the query anchored at X
        from_c = directed_inverse(from_x, R)
        found += [DirectedRule(from_x, "condition", path, end, constant, rule.confidence, index),
                  DirectedRule(from_c, "constant", path, end, constant, rule.confidence, index)]
    return found


class RuleScorer(nn.Module):
    """Rule application as a Scorer (score_hrt [B], score_t [B, E], score_h [B, E]); see the module doc."""

    proof_line = 0.0  # scores above it are predictions (a candidate no rule predicts scores 0)

    def __init__(self, graph: DirectedGraph, rules: RuleSet, aggregation: str = "maxplus", *,
                 cache_bytes: int = 512 << 20, query_chunk: int = 256):
        super().__init__()
        if aggregation not in AGGREGATIONS:
            raise ConfigError([f"aggregation={aggregation!r}: must be one of {', '.join(AGGREGATIONS)}"])
        self.graph, self.rules, self.aggregation = graph, rules, aggregation
        self.num_entities, self.num_relations = graph.num_entities, graph.num_relations
        self.cache_bytes, self.query_chunk = cache_bytes, query_chunk
        self.by_query: list[list[DirectedRule]] = [[] for _ in range(2 * graph.num_relations)]
        for directed in directed_rules(rules):
            self.by_query[directed.query].append(directed)
        for applied in self.by_query:  # descending confidence; equal ones in rule order
            applied.sort(key=lambda d: (-d.confidence, d.rule))
        self.overflow = torch.zeros(3, dtype=torch.long)  # as the engines report it: nothing is lost here
        self._answers: dict[tuple[tuple[int, ...], int | None], Tensor] = {}  # (path, end): a constant rule's answers

    @torch.no_grad()
    def score_t(self, hr: Tensor) -> Tensor:
        """Scores [B, E] (float64) of every entity as the answer of each (anchor, directed relation) [B, 2]."""
        hr_cpu = hr.long().cpu()
        out = torch.zeros(len(hr_cpu), self.num_entities, dtype=torch.float64)
        for q in torch.unique(hr_cpu[:, 1]).tolist():
            rows = (hr_cpu[:, 1] == q).nonzero().squeeze(1)
            for part in rows.split(self.query_chunk):
                out[part] = self._scores(q, hr_cpu[part, 0])
        return out.to(hr.device)

    def score_h(self, rt: Tensor) -> Tensor:
        return self.score_t(inverse_queries(rt, self.num_relations))

    @torch.no_grad()
    def score_hrt(self, hrt: Tensor) -> Tensor:
        """Scores [B] of triples [B, 3] (h, r, t), as score_t gives them (r >= R: the head query of r - R)."""
        hrt = hrt.long()
        return self.score_t(hrt[:, :2]).gather(1, hrt[:, 2:3].to(torch.long)).squeeze(1)

    def _scores(self, q: int, anchors: Tensor) -> Tensor:
        """[B, E] float64 scores of the queries q(a, ?) for each anchor a of ``anchors`` [B]."""
        B, E = len(anchors), self.num_entities
        applied = self.by_query[q]
        own = anchors + torch.arange(B) * E  # each row's anchor, as a flat cell: never an answer
        total = _Aggregate(self.aggregation, B * E, [d.confidence for d in applied], own)
        walker = PathWalker(self.graph, anchors, self.cache_bytes)
        for directed in applied:
            total.add(self._cells(directed, anchors, walker), directed.confidence)
        return total.result().view(B, E)

    def _cells(self, directed: DirectedRule, anchors: Tensor, walker: PathWalker) -> Tensor:
        """The flat cells (row * E + answer) the rule predicts for these anchors."""
        E = self.num_entities
        if directed.kind == "constant":
            rows = (anchors == directed.constant).nonzero().squeeze(1)
            if not len(rows):
                return rows
            answers = self._sources(directed.path, directed.end)  # [n]
            return (rows.unsqueeze(1) * E + answers.unsqueeze(0)).reshape(-1)  # [rows * n]
        reach = walker.reach(directed.path)  # [E, B]
        if directed.kind == "cyclic":
            answer, row = reach.nonzero().unbind(1)
            return row * E + answer
        ends = reach.any(0) if directed.end is None else reach[directed.end] > 0  # [B]
        return ends.nonzero().squeeze(1) * E + directed.constant

    def _sources(self, path: tuple[int, ...], end: int | None) -> Tensor:
        """The entities whose ``path`` reaches ``end`` (anything), once per (path, end): rules share them."""
        key = (path, end)
        if key not in self._answers:
            self._answers[key] = self.graph.sources(path, end).nonzero().squeeze(1)
        return self._answers[key]


class _Aggregate:
    """A query batch's scores, flat [B * E] float64, from rules fired in descending confidence (module doc).

    Each rule's cells wait in a buffer; a flush adds the buffered rules at once. Within a flush, maxplus
    numbers each cell's events in rule order (a stable sort by cell), so a cell's k-th event is its k-th
    best rule, as when the rules are added one by one.
    """

    def __init__(self, kind: str, cells: int, confidences: list[float], own: Tensor):
        self.kind, self.own = kind, own
        self.values = torch.zeros(cells, dtype=torch.float64)
        self.buffer: list[tuple[Tensor, float]] = []
        self.buffered = 0
        if kind == "maxplus":
            distinct = sorted(set(confidences))
            self.level = {c: i + 1 for i, c in enumerate(distinct)}  # 1..L, ascending
            bits = max(1, len(distinct).bit_length())
            self.places = max(1, min(MAX_PLACES, KEY_BITS // bits))
            # The weight of a cell's k-th best rule per unit of level, 0 past the places compared.
            self.scale = torch.tensor([2.0 ** (bits * (self.places - 1 - k)) for k in range(self.places)] + [0.0],
                                      dtype=torch.float64)
            self.fired = torch.zeros(cells, dtype=torch.int8)  # rules fired per cell so far (capped at places)
            self.fired[own] = self.places  # the anchor is never an answer

    def add(self, cells: Tensor, confidence: float) -> None:
        if len(cells):
            self.buffer.append((cells, confidence))
            self.buffered += len(cells)
            if self.buffered >= FLUSH_EVENTS:
                self._flush()

    def result(self) -> Tensor:
        self._flush()
        if self.kind != "maxplus":
            self.values[self.own] = 0.0
        return self.values

    def _flush(self) -> None:
        if not self.buffer:
            return
        cells = torch.cat([c for c, _ in self.buffer])
        weight = torch.cat([torch.full((len(c),), self._weight(v), dtype=torch.float64) for c, v in self.buffer])
        self.buffer, self.buffered = [], 0
        if self.kind == "max":
            self.values.scatter_reduce_(0, cells, weight, "amax")
        elif self.kind == "noisy_or":
            self.values.index_add_(0, cells, weight)
        else:
            self._add_places(cells, weight)

    def _weight(self, confidence: float) -> float:
        if self.kind == "maxplus":
            return float(self.level[confidence])
        return confidence if self.kind == "max" else -math.log1p(-min(confidence, MAX_CONFIDENCE))

    def _add_places(self, cells: Tensor, level: Tensor) -> None:
        """maxplus: each event adds level x scale[its place], its place = the cell's rules fired before it."""
        order = torch.argsort(cells, stable=True)  # by cell; within a cell, rule order (best first)
        cells, level = cells[order], level[order]
        n = len(cells)
        first = torch.ones(n, dtype=torch.bool)
        first[1:] = cells[1:] != cells[:-1]
        position = torch.arange(n)
        start = torch.where(first, position, 0).cummax(0).values  # where each event's cell begins
        place = (self.fired[cells].long() + position - start).clamp(max=self.places)
        self.values.index_add_(0, cells, level * self.scale[place])  # integers below 2^53: exact in any order
        unique, counts = torch.unique_consecutive(cells, return_counts=True)
        self.fired[unique] = (self.fired[unique].long() + counts).clamp(max=self.places).to(torch.int8)
