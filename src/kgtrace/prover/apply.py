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
* ``nr_noisy_or`` (SAFRAN's non-redundant noisy-or): the same evidence over clusters of redundant rules
  (`kgtrace.prover.clusters`), each cluster counting once with its best rule: ``-sum over clusters of
  log(1 - max c)``.

A query relation's one-step rules from the anchor (AnyBURL's AC1 and AC2) are tested for a batch of
anchors at once; the others walk their paths one rule at a time, in path order, so that the reach of a
path prefix serves every rule that shares it (`SparseWalker`: pairs of entity and anchor, expanded along
the facts, so a walk costs what its paths hold rather than E x B). The aggregations do not
depend on the order in which predictions arrive.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from kgtrace.core.errors import ConfigError
from kgtrace.models.base import inverse_queries
from kgtrace.prover.clusters import ClusterLookup, RuleClusters
from kgtrace.prover.config import AGGREGATIONS
from kgtrace.prover.graph import DirectedGraph, SparseWalker, directed_inverse
from kgtrace.prover.logic import Rule, constant_of
from kgtrace.prover.rules import RuleSet

__all__ = ["AGGREGATIONS", "DirectedRule", "Predictions", "RuleScorer", "directed_rules", "rule_path"]

Predictions = tuple[Tensor, Tensor, Tensor]  # flat cells (row * E + answer) [n], confidences [n] float64, rules [n]

KEY_BITS = 52  # a maxplus key's bits: integers below 2^53 are exact in float64
MAX_PLACES = 8  # maxplus compares at most this many rules per candidate
MAX_CONFIDENCE = 1.0 - 1e-9  # noisy_or: a rule of confidence 1 would make -log(1 - c) infinite
FLUSH_EVENTS = 1 << 20  # maxplus, nr_noisy_or: predictions buffered (at least) before each cell's best are kept


def evidence(confidence: Tensor) -> Tensor:
    """-log(1 - c): a rule's share of the noisy-or's evidence (confidence 1 clamped to MAX_CONFIDENCE)."""
    return -torch.log1p(-confidence.clamp(max=MAX_CONFIDENCE))


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


@dataclass(frozen=True)
class _OneStep:
    """A query relation's one-step condition rules as arrays (AnyBURL's AC1 and AC2 from the anchor), applied to a
    batch of anchors at once."""

    relation: Tensor  # [n] the directed relation d of the step
    end: Tensor  # [n] the entity it must reach; -1: any
    answer: Tensor  # [n] the constant each predicts
    confidence: Tensor  # [n] float64
    rule: Tensor  # [n] its index in the RuleSet

    @classmethod
    def of(cls, rules: list[DirectedRule]) -> _OneStep:
        return cls(torch.tensor([d.path[0] for d in rules], dtype=torch.long),
                   torch.tensor([-1 if d.end is None else d.end for d in rules], dtype=torch.long),
                   torch.tensor([d.constant for d in rules], dtype=torch.long),
                   torch.tensor([d.confidence for d in rules], dtype=torch.float64),
                   torch.tensor([d.rule for d in rules], dtype=torch.long))

    def cells(self, graph: DirectedGraph, anchors: Tensor) -> Predictions:
        """The flat cells (row * E + answer) these rules predict for ``anchors`` [B], each one's confidence and rule."""
        x, d, end = anchors.unsqueeze(1), self.relation.unsqueeze(0), self.end.unsqueeze(0)  # [B, 1], [1, n]
        holds = torch.where(end >= 0, graph.has(x, d, end.clamp(min=0)), graph.has_edge(x, d))  # [B, n]
        row, rule = holds.nonzero().unbind(1)
        return row * graph.num_entities + self.answer[rule], self.confidence[rule], self.rule[rule]


class RuleScorer(nn.Module):
    """Rule application as a Scorer (score_hrt [B], score_t [B, E], score_h [B, E]); see the module doc."""

    proof_line = 0.0  # scores above it are predictions (a candidate no rule predicts scores 0)

    def __init__(self, graph: DirectedGraph, rules: RuleSet, aggregation: str = "maxplus", *,
                 clusters: RuleClusters | None = None, query_chunk: int = 1024):
        """clusters: the clusters of redundant rules the ``nr_noisy_or`` aggregation counts once (only then)."""
        super().__init__()
        if aggregation not in AGGREGATIONS:
            raise ConfigError([f"aggregation={aggregation!r}: must be one of {', '.join(AGGREGATIONS)}"])
        if (aggregation == "nr_noisy_or") != (clusters is not None):
            raise ConfigError([f"aggregation={aggregation!r} with clusters={'given' if clusters else 'None'}: "
                               "nr_noisy_or needs its clusters of rules (kgtrace.prover.redundancy.learn_clusters), "
                               "and only it takes them"])
        if clusters is not None and clusters.num_rules != len(rules):
            raise ConfigError([f"clusters of {clusters.num_rules} rules for a rule set of {len(rules)}: learn them "
                               "for these rules"])
        self.graph, self.rules, self.aggregation = graph, rules, aggregation
        self.clusters = [clusters.lookup(q) if clusters else None for q in range(2 * graph.num_relations)]
        self.num_entities, self.num_relations = graph.num_entities, graph.num_relations
        self.query_chunk = query_chunk
        by_query: list[list[DirectedRule]] = [[] for _ in range(2 * graph.num_relations)]
        for directed in directed_rules(rules):
            by_query[directed.query].append(directed)
        self.confidences = [[d.confidence for d in applied] for applied in by_query]
        one_step = [[d for d in applied if d.kind == "condition" and len(d.path) == 1] for applied in by_query]
        self.one_step = [_OneStep.of(found) if found else None for found in one_step]
        # The rest, one at a time: path prefixes shared by rules in path order.
        self.walked = [sorted((d for d in applied if not (d.kind == "condition" and len(d.path) == 1)),
                              key=lambda d: (d.path, d.rule)) for applied in by_query]
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
        own = anchors + torch.arange(B) * E  # each row's anchor, as a flat cell: never an answer
        total = Aggregate(self.aggregation, B * E, self.confidences[q], own, self.clusters[q])
        for predicted in self.predictions(q, anchors):
            total.add(*predicted)
        return total.result().view(B, E)

    def rule_numbers(self, q: int) -> list[int]:
        """The numbers of the rules that answer q, ascending."""
        one_step = self.one_step[q].rule.tolist() if self.one_step[q] is not None else []
        return sorted({d.rule for d in self.walked[q]} | set(one_step))

    def predictions(self, q: int, anchors: Tensor) -> Iterator[Predictions]:
        """Every prediction of q's rules for the queries q(a, ?), a in ``anchors`` [B], a batch of them at a time:
        flat cells (row * E + answer, the anchor's own cell included), confidences and rule numbers."""
        if self.one_step[q] is not None:
            yield self.one_step[q].cells(self.graph, anchors)
        walker = SparseWalker(self.graph, anchors)
        for directed in self.walked[q]:
            cells = self._cells(directed, anchors, walker)
            yield (cells, torch.full((len(cells),), directed.confidence, dtype=torch.float64),
                   torch.full((len(cells),), directed.rule, dtype=torch.long))

    def _cells(self, directed: DirectedRule, anchors: Tensor, walker: SparseWalker) -> Tensor:
        """The flat cells (row * E + answer) the rule predicts for these anchors."""
        E = self.num_entities
        if directed.kind == "constant":
            rows = (anchors == directed.constant).nonzero().squeeze(1)
            if not len(rows):
                return rows
            answers = self._sources(directed.path, directed.end)  # [n]
            return (rows.unsqueeze(1) * E + answers.unsqueeze(0)).reshape(-1)  # [rows * n]
        answer, row = walker.reach(directed.path)  # the pairs (entity, anchor's row) the path joins
        if directed.kind == "cyclic":
            return row * E + answer
        rows = torch.unique(row if directed.end is None else row[answer == directed.end])
        return rows * E + directed.constant

    def _sources(self, path: tuple[int, ...], end: int | None) -> Tensor:
        """The entities whose ``path`` reaches ``end`` (anything), once per (path, end): rules share them."""
        key = (path, end)
        if key not in self._answers:
            self._answers[key] = self.graph.sources(path, end).nonzero().squeeze(1)
        return self._answers[key]


class Aggregate:
    """A query batch's scores, flat [B * E] float64, from the rules' predictions added in any order (module doc).

    max and noisy_or add into the scores at once. maxplus keeps each cell's ``places`` best levels: predictions
    wait in a buffer, and a compaction sorts the kept and the waiting ones by (cell, level, best first) and keeps
    each cell's first ``places``; the result adds ``level * scale[k]`` over each cell's k-th best. nr_noisy_or
    keeps the best confidence of each (cell, cluster), compacted the same way, and adds their evidence.
    """

    def __init__(self, kind: str, cells: int, confidences: list[float], own: Tensor,
                 clusters: ClusterLookup | None = None):
        self.kind, self.own, self.clusters = kind, own, clusters
        self.values = torch.zeros(cells, dtype=torch.float64)
        self.best: tuple[Tensor, Tensor] = (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64))
        self.buffer: list[tuple[Tensor, Tensor]] = []
        self.buffered = 0
        if kind == "maxplus":
            self.distinct = torch.tensor(sorted(set(confidences)), dtype=torch.float64)  # level i + 1: the i-th
            bits = max(1, len(self.distinct).bit_length())
            self.places = max(1, min(MAX_PLACES, KEY_BITS // bits))
            # The weight of a cell's k-th best rule per unit of level.
            self.scale = torch.tensor([2.0 ** (bits * (self.places - 1 - k)) for k in range(self.places)],
                                      dtype=torch.float64)
            empty = torch.zeros(0, dtype=torch.long)
            self.kept: tuple[Tensor, Tensor, Tensor] = (empty, empty, empty)  # cells, levels, places (ranks)

    def add(self, cells: Tensor, confidence: Tensor, rules: Tensor) -> None:
        """Predictions: flat cells [n], each one's rule confidence [n] (float64) and rule number [n]."""
        if not len(cells):
            return
        if self.kind == "max":
            self.values.scatter_reduce_(0, cells, confidence, "amax")
        elif self.kind == "noisy_or":
            self.values.index_add_(0, cells, evidence(confidence))
        elif self.kind == "nr_noisy_or":
            self.buffer.append((cells * self.clusters.ids + self.clusters.of(rules), confidence))  # (cell, cluster)
            self.buffered += len(cells)
            if self.buffered >= max(FLUSH_EVENTS, len(self.best[0])):
                self._keep_best()
        else:
            self.buffer.append((cells, torch.searchsorted(self.distinct, confidence) + 1))  # exact: the same floats
            self.buffered += len(cells)
            if self.buffered >= max(FLUSH_EVENTS, len(self.kept[0])):  # the kept ones sorted again: amortised
                self._compact()

    def result(self) -> Tensor:
        if self.kind == "maxplus":
            self._compact()
            cells, levels, places = self.kept
            self.values.index_add_(0, cells, levels.double() * self.scale[places])  # integers < 2^53: exact
        elif self.kind == "nr_noisy_or":
            self._keep_best()
            keys, best = self.best
            self.values.index_add_(0, keys // self.clusters.ids, evidence(best))
        self.values[self.own] = 0.0
        return self.values

    def _keep_best(self) -> None:
        """nr_noisy_or: each (cell, cluster)'s best confidence among the kept and the waiting predictions."""
        keys = torch.cat([self.best[0], *(k for k, _ in self.buffer)])
        confidence = torch.cat([self.best[1], *(c for _, c in self.buffer)])
        self.buffer, self.buffered = [], 0
        unique, at = torch.unique(keys, return_inverse=True)
        best = torch.zeros(len(unique), dtype=torch.float64).scatter_reduce_(0, at, confidence, "amax")
        self.best = (unique, best)

    def _compact(self) -> None:
        kept_cells, kept_levels, _ = self.kept
        cells = torch.cat([kept_cells, *(c for c, _ in self.buffer)])
        levels = torch.cat([kept_levels, *(v for _, v in self.buffer)])
        self.buffer, self.buffered = [], 0
        top = len(self.distinct) + 1
        order = torch.argsort(cells * top + (top - levels))  # by cell, then its best levels first
        cells, levels = cells[order], levels[order]
        first = torch.ones(len(cells), dtype=torch.bool)
        first[1:] = cells[1:] != cells[:-1]
        position = torch.arange(len(cells))
        place = position - torch.where(first, position, 0).cummax(0).values  # rank within the cell
        keep = place < self.places
        self.kept = (cells[keep], levels[keep], place[keep])
