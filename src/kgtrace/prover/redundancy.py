"""SAFRAN's clusters of redundant rules, learned on validation triples (the ``nr_noisy_or`` aggregation).

For each directed query relation q (r: tails of r, r + R: heads of r):

1. Anchors: those of q's validation queries (a, q) (the anchors of q's training facts when it has none),
   at most ``max_anchors`` of them (a seeded sample).
2. Overlap: every prediction of q's rules for these anchors (`RuleScorer.predictions`, the anchor's own cell
   dropped), and for each two rules the Jaccard index of the (anchor, answer) pairs they predict,
   ``|P_i & P_j| / |P_i | P_j|``. SAFRAN estimates it by MinHash over each rule's predictions on the whole
   training graph; here it is exact, over the queries the threshold is chosen on.
3. Clusters for each threshold t of ``thresholds``: the connected components of the rules joined where
   J > t (SAFRAN's Graph::searchDFS; one threshold for every pair of rule kinds, as its grid strategy);
   ``ONE_CLUSTER`` (-1) puts every rule in one cluster, the max aggregation. t = 1 joins none: the plain
   noisy-or.
4. Choice: the validation queries of q ranked by nr_noisy_or with each threshold's clusters (filtered,
   realistic ties, the evaluation's `count_ranks`); the threshold of the highest MRR, the first of equals in
   the order of ``thresholds``. SAFRAN chooses per relation and side by validation MRR as well. A q without
   validation queries takes the threshold of the highest MRR over every validation query pooled.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from kgtrace.core.errors import ConfigError
from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.ranks import count_ranks
from kgtrace.prover.apply import Aggregate, RuleScorer
from kgtrace.prover.clusters import ONE_CLUSTER, ClusterLookup, RuleClusters
from kgtrace.prover.graph import DirectedGraph
from kgtrace.prover.rules import RuleSet

__all__ = ["THRESHOLDS", "QueryPredictions", "cluster_lookup", "clustered_scores", "components", "jaccard_pairs",
           "learn_clusters", "query_predictions"]

THRESHOLDS = (ONE_CLUSTER, *(round(0.05 * i, 2) for i in range(21)))  # one cluster, then J > 0, .05, ..., 1
MEMORY_BUDGET = 1 << 30  # bytes of [B, E] scores a ranking of validation queries holds at once


@dataclass(frozen=True)
class QueryPredictions:
    """The predictions of one query relation's rules for its anchors, by (anchor row, answer) cell."""

    anchors: Tensor  # [A] sorted entity ids
    cells: Tensor  # [n] sorted: row * E + answer (row: the anchor's place in ``anchors``), never the anchor
    confidence: Tensor  # [n] float64
    rules: Tensor  # [n] rule numbers


def query_predictions(scorer: RuleScorer, q: int, anchors: Tensor) -> QueryPredictions:
    """Every (cell, rule) prediction of q's rules for ``anchors`` [A] (sorted), each once."""
    E = scorer.num_entities
    parts = list(scorer.predictions(q, anchors))
    cells = torch.cat([torch.zeros(0, dtype=torch.long), *(c for c, _, _ in parts)])
    confidence = torch.cat([torch.zeros(0, dtype=torch.float64), *(c for _, c, _ in parts)])
    rules = torch.cat([torch.zeros(0, dtype=torch.long), *(r for _, _, r in parts)])
    keep = cells % E != anchors[cells // E]  # an answer is never the anchor itself
    cells, confidence, rules = cells[keep], confidence[keep], rules[keep]
    key = cells * len(scorer.rules) + rules  # a (cell, rule) pair once, sorted by cell
    key, first = _unique_first(key)
    return QueryPredictions(anchors, cells[first], confidence[first], rules[first])


def _unique_first(values: Tensor) -> tuple[Tensor, Tensor]:
    """Sorted distinct values and the position of one occurrence of each."""
    unique, at = torch.unique(values, return_inverse=True)
    first = torch.zeros(len(unique), dtype=torch.long).scatter_(0, at, torch.arange(len(values)))
    return unique, first


def jaccard_pairs(cells: Tensor, rules: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The rules that predict something, and the Jaccard index of each pair of them whose predictions overlap.

    cells, rules: [n] distinct (cell, rule) predictions. Returns (rule numbers [m] sorted, i [p], j [p] with
    i < j as places in the rule numbers, J [p] float64 > 0): |P_i & P_j| / (|P_i| + |P_j| - |P_i & P_j|), the
    shared counts read off the product of the [m, cells] incidence matrix with its transpose.
    """
    numbers, local = torch.unique(rules, return_inverse=True)
    _, column = torch.unique(cells, return_inverse=True)
    m = len(numbers)
    if not m:
        empty = torch.zeros(0, dtype=torch.long)
        return numbers, empty, empty, torch.zeros(0, dtype=torch.float64)
    size = torch.bincount(local, minlength=m).double()  # |P_i|
    incidence = torch.sparse_coo_tensor(torch.stack([local, column]), torch.ones(len(local), dtype=torch.float64),
                                        (m, int(column.max()) + 1), check_invariants=False)
    with warnings.catch_warnings():  # torch routes the product through its CSR kernels, which it calls beta
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        shared = torch.sparse.mm(incidence, incidence.t()).coalesce()  # [m, m]: |P_i & P_j|
    (i, j), both = shared.indices(), shared.values()
    upper = i < j
    i, j, both = i[upper], j[upper], both[upper]
    return numbers, i, j, both / (size[i] + size[j] - both)


def components(n: int, i: Tensor, j: Tensor) -> Tensor:
    """Connected components of n nodes joined by the edges (i, j) [p]: each node's component, 0 .. k - 1, numbered
    in the order of their smallest nodes (minimum-label propagation with pointer jumping)."""
    label = torch.arange(n)
    while True:
        low = label.clone()
        low.scatter_reduce_(0, i, label[j], "amin")
        low.scatter_reduce_(0, j, label[i], "amin")
        low = low[low]  # a node takes its label's label: halves the distance to the smallest
        if torch.equal(low, label):
            return torch.unique(label, return_inverse=True)[1]
        label = low


def cluster_lookup(numbers: Tensor, i: Tensor, j: Tensor, jaccard: Tensor, threshold: float,
                   num_rules: int) -> ClusterLookup:
    """The clusters of the rules ``numbers`` [m] at ``threshold`` (module doc, step 3)."""
    if threshold == ONE_CLUSTER:
        return ClusterLookup(numbers, torch.zeros(len(numbers), dtype=torch.long), 1, num_rules)
    joined = jaccard > threshold
    labels = components(len(numbers), i[joined], j[joined])
    return ClusterLookup(numbers, labels, int(labels.max()) + 1 if len(labels) else 0, num_rules)


def clustered_scores(predictions: QueryPredictions, clusters: ClusterLookup, low: int, high: int,
                     num_entities: int) -> Tensor:
    """[high - low, E] float64 nr_noisy_or scores of the queries (a, q) for the anchors a of rows low .. high - 1
    of ``predictions``, from their precomputed predictions (a contiguous slice: cells are sorted by row)."""
    E, p = num_entities, predictions
    first, last = torch.searchsorted(p.cells, torch.tensor([low * E, high * E])).tolist()
    own = p.anchors[low:high] + torch.arange(high - low) * E  # each row's anchor: never an answer
    total = Aggregate("nr_noisy_or", (high - low) * E, [], own, clusters)
    total.add(p.cells[first:last] - low * E, p.confidence[first:last], p.rules[first:last])
    return total.result().view(high - low, E)


def learn_clusters(graph: DirectedGraph, rules: RuleSet, valid: Tensor, known: AnswerIndex, *,
                   thresholds: tuple[float, ...] = THRESHOLDS, max_anchors: int = 1000, seed: int = 0,
                   log: Callable[[str], None] | None = None) -> RuleClusters:
    """SAFRAN's clusters of ``rules`` for every query relation (module doc), chosen on ``valid`` [n, 3] triples
    (both sides), filtered by ``known`` (train + valid)."""
    problems = [f"threshold {t}: must be {ONE_CLUSTER:g} (one cluster) or in [0, 1]" for t in thresholds
                if t != ONE_CLUSTER and not 0.0 <= t <= 1.0]
    if not thresholds:
        problems.append("thresholds: give at least one")
    if max_anchors < 1:
        problems.append(f"max_anchors={max_anchors}: must be at least 1")
    if problems:
        raise ConfigError(problems)
    E, R = graph.num_entities, graph.num_relations
    scorer = RuleScorer(graph, rules, "max")  # its predictions only
    queries = _validation_queries(valid.long().cpu(), R)
    generator = torch.Generator().manual_seed(seed)
    pending: dict[int, tuple[Tensor, Tensor, Tensor, Tensor]] = {}  # q without validation queries: its overlaps
    curves, counts, pooled = {}, {}, torch.zeros(len(thresholds), dtype=torch.float64)
    groups, chosen = {}, {}
    start = time.monotonic()
    for q in range(2 * R):
        if not scorer.confidences[q]:
            continue
        asked, answers = queries.get(q, (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)))
        anchors = _anchors(graph, q, asked, max_anchors, generator)
        predictions = query_predictions(scorer, q, anchors)
        overlap = jaccard_pairs(predictions.cells, predictions.rules)
        keep = torch.isin(asked, anchors)  # the validation queries of the anchors drawn
        asked, answers = asked[keep], answers[keep]
        counts[q] = len(asked)
        if not len(asked):
            pending[q] = overlap
            continue
        reciprocal = _threshold_curve(predictions, overlap, thresholds, asked, answers, q, known, E, len(rules))
        curves[q] = dict(zip(thresholds, reciprocal.mean(1).tolist(), strict=True))
        pooled += reciprocal.sum(1)
        chosen[q] = max(thresholds, key=curves[q].get)  # max(): the first of equals
        groups[q] = _clusters_of(scorer, q, overlap, chosen[q])
    best_pooled = thresholds[int(torch.argmax(pooled))]  # argmax: the first of equals
    for q, overlap in pending.items():
        chosen[q] = best_pooled
        groups[q] = _clusters_of(scorer, q, overlap, best_pooled)
    if log:
        log(f"clusters of redundant rules for {len(chosen)} query relations in {time.monotonic() - start:.1f} s "
            f"(pooled threshold {best_pooled:g})")
    return RuleClusters(len(rules), groups, chosen, curves, counts)


def _clusters_of(scorer: RuleScorer, q: int, overlap: tuple[Tensor, Tensor, Tensor, Tensor],
                 threshold: float) -> tuple[tuple[int, ...], ...]:
    """q's clusters of two or more rules at ``threshold``; one cluster holds every rule of q, those that predicted
    nothing on the anchors too."""
    if threshold == ONE_CLUSTER:
        return (tuple(scorer.rule_numbers(q)),)
    return _groups(cluster_lookup(*overlap, threshold, len(scorer.rules)))


def _validation_queries(valid: Tensor, num_relations: int) -> dict[int, tuple[Tensor, Tensor]]:
    """q -> (anchors [Q] ascending, answers [Q]) of the validation triples' tail (q = r) and head (q = r + R)
    queries."""
    h, r, t = valid.unbind(1)
    anchor, q, answer = torch.cat([h, t]), torch.cat([r, r + num_relations]), torch.cat([t, h])
    order = torch.argsort(anchor, stable=True)  # by anchor: a chunk of anchors serves a run of queries
    anchor, q, answer = anchor[order], q[order], answer[order]
    return {int(k): (anchor[q == k], answer[q == k]) for k in torch.unique(q)}


def _anchors(graph: DirectedGraph, q: int, asked: Tensor, max_anchors: int, generator: torch.Generator) -> Tensor:
    """The anchors whose predictions measure overlap: the validation queries' (else the training facts'), at most
    ``max_anchors``, sorted."""
    E, D = graph.num_entities, 2 * graph.num_relations
    if len(asked):
        anchors = torch.unique(asked)
    else:
        x, d = graph.keys // (D * E), (graph.keys // E) % D  # keys: (x * 2R + d) * E + y
        anchors = torch.unique(x[d == q])
    if len(anchors) > max_anchors:
        anchors = torch.sort(anchors[torch.randperm(len(anchors), generator=generator)[:max_anchors]]).values
    return anchors


def _threshold_curve(predictions: QueryPredictions, overlap: tuple[Tensor, Tensor, Tensor, Tensor],
                     thresholds: tuple[float, ...], asked: Tensor, answers: Tensor, q: int, known: AnswerIndex,
                     num_entities: int, num_rules: int) -> Tensor:
    """Filtered reciprocal ranks (realistic ties, the evaluation's `count_ranks`) [T, Q] of the queries (asked, q)
    -> answers (sorted by anchor) under each threshold's clusters; thresholds that give the same clusters are
    ranked once. Scores are formed for a chunk of anchors at a time, and each query takes its anchor's row."""
    filter_rows, filter_cols = known.lookup(torch.stack([asked, torch.full_like(asked, q)], 1))  # [P], rows ascending
    place = torch.searchsorted(predictions.anchors, asked)  # [Q] ascending: each query's anchor row
    chunk = max(1, MEMORY_BUDGET // (num_entities * 8))  # anchors whose [B, E] float64 scores fit the budget
    ranked: dict[tuple[int, bytes], Tensor] = {}
    rows = []
    for threshold in thresholds:
        clusters = cluster_lookup(*overlap, threshold, num_rules)
        same = (clusters.clusters, clusters.labels.numpy().tobytes())
        if same not in ranked:
            parts = []
            for low in range(0, len(predictions.anchors), chunk):
                high = min(low + chunk, len(predictions.anchors))
                first, last = torch.searchsorted(place, torch.tensor([low, high])).tolist()  # its queries
                keep = (filter_rows >= first) & (filter_rows < last)
                scores = clustered_scores(predictions, clusters, low, high, num_entities)[place[first:last] - low]
                counts = count_ranks(scores, answers[first:last], filter_rows[keep] - first, filter_cols[keep])
                parts.append(1.0 / counts.rank("realistic"))
            ranked[same] = torch.cat(parts)
        rows.append(ranked[same])
    return torch.stack(rows)


def _groups(clusters: ClusterLookup) -> tuple[tuple[int, ...], ...]:
    """The clusters of two or more rules, as rule numbers, in the order of their smallest rule."""
    found: dict[int, list[int]] = {}
    for rule, label in zip(clusters.members.tolist(), clusters.labels.tolist(), strict=True):
        found.setdefault(label, []).append(rule)
    return tuple(tuple(group) for group in found.values() if len(group) > 1)
