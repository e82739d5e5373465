"""Rule application written to be read, one query at a time: the reference `kgtrace.prover.apply` agrees with.

For a query q(a, ?) (q < R: tails of r(a, ?); q >= R: heads of r(?, a), r = q - R), each rule with
head relation r is grounded by backtracking over its body atoms with the facts, its head's query
argument bound to a: the answers are the values the head's other argument takes (a constant: that
constant, when the body has a grounding at all). An answer is never a itself. Then each candidate's
confidences, best first, are aggregated as the module doc of `kgtrace.prover.apply` says.
"""

from __future__ import annotations

import math
from collections import defaultdict

from torch import Tensor

from kgtrace.prover.logic import Rule, constant_of
from kgtrace.prover.rules import RuleSet

__all__ = ["aggregate_reference", "clusters_reference", "nr_noisy_or_reference", "predictions_reference",
           "rule_predictions_reference"]


def predictions_reference(triples: Tensor, rules: RuleSet, anchor: int, query: int) -> dict[int, list[float]]:
    """Each answer of q(anchor, ?) and the confidences of the rules predicting it, best first."""
    found = rule_predictions_reference(triples, rules, anchor, query)
    return {entity: sorted(by_rule.values(), reverse=True) for entity, by_rule in found.items()}


def rule_predictions_reference(triples: Tensor, rules: RuleSet, anchor: int, query: int) -> dict[int, dict[int, float]]:
    """Each answer of q(anchor, ?) and the rules predicting it: {rule number: confidence}."""
    R = rules.num_relations
    out: dict[tuple[int, int], set[int]] = defaultdict(set)  # (relation, x) -> {y}
    into: dict[tuple[int, int], set[int]] = defaultdict(set)  # (relation, y) -> {x}
    for h, r, t in triples.tolist():
        out[(r, h)].add(t)
        into[(r, t)].add(h)
    relation, tails = (query, True) if query < R else (query - R, False)
    found: dict[int, dict[int, float]] = defaultdict(dict)
    for number, rule in enumerate(rules.rules):
        if rule.head != relation:
            continue
        asked, answer = rule.head_args if tails else rule.head_args[::-1]
        for entity in _answers(rule, asked, answer, anchor, out, into):
            if entity != anchor:
                found[entity][number] = rule.confidence
    return dict(found)


def _answers(rule: Rule, asked: int, answer: int, anchor: int, out, into) -> set[int]:
    """The values of the head's ``answer`` term over the body's groundings with the ``asked`` term = anchor."""
    if asked < 0 and constant_of(asked) != anchor:
        return set()
    binding = {} if asked < 0 else {asked: anchor}
    values: set[int] = set()
    for grounding in _groundings(list(rule.body), binding, out, into):
        values.add(constant_of(answer) if answer < 0 else grounding[answer])
    return values


def _groundings(atoms, binding: dict[int, int], out, into):
    """Every binding of the atoms' variables that makes each atom a fact (constants are negative terms)."""
    if not atoms:
        yield binding
        return
    value = lambda term: constant_of(term) if term < 0 else binding.get(term)  # noqa: E731
    # An atom with a bound argument first: the walk a path rule describes.
    k = next((i for i, (_, a, b) in enumerate(atoms) if value(a) is not None or value(b) is not None), 0)
    relation, a, b = atoms[k]
    rest = atoms[:k] + atoms[k + 1:]
    x, y = value(a), value(b)
    if x is not None:
        pairs = [(x, t) for t in out[(relation, x)] if y is None or t == y]
    elif y is not None:
        pairs = [(h, y) for h in into[(relation, y)]]
    else:
        pairs = [(h, t) for (r, h), tails in list(out.items()) if r == relation for t in tails]
    for h, t in pairs:
        if a >= 0 and b >= 0 and a == b and h != t:
            continue
        bound = dict(binding)
        for term, entity in ((a, h), (b, t)):
            if term >= 0:
                bound[term] = entity
        yield from _groundings(rest, bound, out, into)


def aggregate_reference(confidences: list[float], aggregation: str, levels: dict[float, int] | None = None,
                        bits: int = 0, places: int = 0) -> float:
    """A candidate's score from its rules' confidences (best first): maxplus's key from the query relation's
    confidence ``levels`` (1..L ascending), ``bits`` and ``places``; the best; or the noisy-or's evidence."""
    if aggregation == "max":
        return max(confidences, default=0.0)
    if aggregation == "noisy_or":
        return -sum(math.log1p(-min(c, 1.0 - 1e-9)) for c in confidences)
    key = 0
    for k, confidence in enumerate(confidences[:places]):
        key += levels[confidence] << (bits * (places - 1 - k))
    return float(key)


def nr_noisy_or_reference(by_rule: dict[int, float], cluster_of: dict[int, int]) -> float:
    """SAFRAN's non-redundant noisy-or evidence of a candidate predicted by ``by_rule`` {rule: confidence}: the
    best confidence of each cluster (``cluster_of``: rule -> cluster; a rule not in it is alone), summed as
    -log(1 - c)."""
    best: dict[tuple[str, int], float] = {}
    for rule, confidence in by_rule.items():
        key = ("cluster", cluster_of[rule]) if rule in cluster_of else ("alone", rule)
        best[key] = max(best.get(key, 0.0), confidence)
    return -sum(math.log1p(-min(c, 1.0 - 1e-9)) for c in best.values())


def clusters_reference(predicted: dict[int, set], threshold: float) -> list[set[int]]:
    """The clusters of the rules of ``predicted`` {rule: the (anchor, answer) pairs it predicts}: rules joined
    where the Jaccard index of their pairs exceeds ``threshold`` (-1: all one cluster), then joined transitively
    (union-find); the clusters of two or more rules."""
    numbers = sorted(rule for rule, pairs in predicted.items() if pairs)
    parent = {rule: rule for rule in numbers}

    def root(rule: int) -> int:
        while parent[rule] != rule:
            rule = parent[rule]
        return rule

    for a in numbers:
        for b in numbers:
            shared = len(predicted[a] & predicted[b])
            if a < b and (threshold < 0 or shared and shared / len(predicted[a] | predicted[b]) > threshold):
                parent[root(b)] = root(a)
    found: dict[int, set[int]] = defaultdict(set)
    for rule in numbers:
        found[root(rule)].add(rule)
    return [group for group in found.values() if len(group) > 1]
