"""SAFRAN's non-redundant noisy-or (kgtrace.prover.redundancy, kgtrace.prover.clusters) against brute force; its
command-line path is tested with the others in tests/test_rule_apply.py."""

import pytest
import torch
from test_rule_apply import E, ENTITIES, RELATIONS, R, random_graph, random_rules

from kgtrace.core.errors import ConfigError
from kgtrace.data.answers import AnswerIndex
from kgtrace.prover.apply import RuleScorer
from kgtrace.prover.apply_reference import clusters_reference, nr_noisy_or_reference, rule_predictions_reference
from kgtrace.prover.clusters import ONE_CLUSTER, RuleClusters
from kgtrace.prover.graph import DirectedGraph
from kgtrace.prover.redundancy import (THRESHOLDS, cluster_lookup, components, jaccard_pairs, learn_clusters,
                                       query_predictions)
from kgtrace.prover.rules import parse_rules


def split(seed: int):
    """A random graph's triples: the first two thirds train, the rest validation."""
    triples = random_graph(seed)
    cut = 2 * len(triples) // 3
    return triples[:cut], triples[cut:]


def reference_predictions(train, rules, q: int, anchors: list[int]) -> dict[int, set]:
    """rule -> the (anchor, answer) pairs it predicts for q(anchor, ?), by backtracking (the reference engine)."""
    found: dict[int, set] = {}
    for anchor in anchors:
        for answer, by_rule in rule_predictions_reference(train, rules, anchor, q).items():
            for rule in by_rule:
                found.setdefault(rule, set()).add((anchor, answer))
    return found


def realistic_rank(scores: dict[int, float], answer: int, filtered: set[int]) -> float:
    """1 + (candidates scoring higher) + (others scoring the same) / 2, filtered ones left out."""
    s = scores[answer]
    others = [v for e, v in scores.items() if e != answer and e not in filtered]
    return 1 + sum(v > s for v in others) + sum(v == s for v in others) / 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overlaps_and_clusters_equal_brute_force(seed):
    train, _ = split(seed)
    rules = parse_rules(random_rules(seed), RELATIONS, entities=ENTITIES, max_body=3)
    scorer = RuleScorer(DirectedGraph.of(train, E, R), rules, "max")
    joined = 0
    for q in range(2 * R):
        anchors = torch.arange(E)
        predictions = query_predictions(scorer, q, anchors)
        expected = reference_predictions(train, rules, q, list(range(E)))
        got = {}
        for cell, rule in zip(predictions.cells.tolist(), predictions.rules.tolist(), strict=True):
            got.setdefault(rule, set()).add(divmod(cell, E))
        assert got == {rule: pairs for rule, pairs in expected.items() if pairs}, q
        numbers, i, j, jaccard = jaccard_pairs(predictions.cells, predictions.rules)
        for a, b, value in zip(i.tolist(), j.tolist(), jaccard.tolist(), strict=True):
            first, second = expected[int(numbers[a])], expected[int(numbers[b])]
            assert value == pytest.approx(len(first & second) / len(first | second), abs=1e-15)
        for threshold in (ONE_CLUSTER, 0.0, 0.3, 0.5, 0.99, 1.0):
            lookup = cluster_lookup(numbers, i, j, jaccard, threshold, len(rules))
            groups: dict[int, set] = {}
            for rule, label in zip(lookup.members.tolist(), lookup.labels.tolist(), strict=True):
                groups.setdefault(label, set()).add(rule)
            found = sorted(sorted(g) for g in groups.values() if len(g) > 1)
            assert found == sorted(sorted(g) for g in clusters_reference(expected, threshold)), (q, threshold)
            joined += len(found)
    assert joined > 10  # the graphs have overlapping rules


def test_components_of_a_chain_a_star_and_loners():
    # 0-1-2-3 (a chain, given backwards), 4 alone, 5-6, 7 hub of 8 and 9.
    i, j = torch.tensor([3, 2, 1, 6, 7, 7]), torch.tensor([2, 1, 0, 5, 8, 9])
    assert components(10, i, j).tolist() == [0, 0, 0, 0, 1, 2, 2, 3, 3, 3]
    assert components(3, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)).tolist() == [0, 1, 2]


@pytest.mark.parametrize("seed", [0, 1])
def test_learned_thresholds_maximise_the_brute_force_validation_mrr(seed):
    train, valid = split(seed)
    valid = valid[valid[:, 1] != 2]  # relation t has no validation queries: its two query relations are pooled
    rules = parse_rules(random_rules(seed), RELATIONS, entities=ENTITIES, max_body=3)
    graph = DirectedGraph.of(train, E, R)
    known_triples = torch.cat([train, valid])
    clusters = learn_clusters(graph, rules, valid, AnswerIndex.build(known_triples, R))
    known = {(h, r, t) for h, r, t in known_triples.tolist()}
    checked = 0
    for q, curve in clusters.curves.items():
        r = q % R
        asked = [(h, t) if q < R else (t, h) for h, rel, t in valid.tolist() if rel == r]  # (anchor, answer)
        anchors = sorted({a for a, _ in asked})
        expected = reference_predictions(train, rules, q, anchors)
        for threshold, mrr in curve.items():
            cluster_of = {rule: k for k, g in enumerate(clusters_reference(expected, threshold)) for rule in g}
            reciprocal = []
            for anchor, answer in asked:
                by_entity = rule_predictions_reference(train, rules, anchor, q)
                scores = {e: nr_noisy_or_reference(by_entity.get(e, {}), cluster_of) for e in range(E)}
                scores[anchor] = 0.0
                filtered = {e for e in range(E) if ((anchor, r, e) if q < R else (e, r, anchor)) in known}
                reciprocal.append(1 / realistic_rank(scores, answer, filtered - {answer}))
            assert mrr == pytest.approx(sum(reciprocal) / len(reciprocal), abs=1e-6), (q, threshold)
            checked += 1
        best = max(curve.values())
        assert clusters.thresholds[q] == next(t for t in THRESHOLDS if curve[t] == best)  # the first of equals
    assert checked >= len(THRESHOLDS) * 3
    # A query relation without validation queries takes the threshold best over all of them pooled.
    pooled = {t: sum(curve[t] * clusters.queries[q] for q, curve in clusters.curves.items()) for t in THRESHOLDS}
    best = next(t for t in THRESHOLDS if pooled[t] >= max(pooled.values()) - 1e-9)
    unasked = [q for q in clusters.thresholds if q not in clusters.curves]
    assert unasked and all(clusters.thresholds[q] == best for q in unasked)
    assert set(clusters.thresholds) == {q for q in range(2 * R) if any(r.head == q % R for r in rules.rules)}


def test_threshold_one_is_the_noisy_or_and_one_cluster_ranks_as_max():
    train, valid = split(0)
    rules = parse_rules(random_rules(0), RELATIONS, entities=ENTITIES, max_body=3)
    graph = DirectedGraph.of(train, E, R)
    known = AnswerIndex.build(torch.cat([train, valid]), R)
    queries = torch.tensor([(a, q) for a in range(E) for q in range(2 * R)])
    for threshold, plain in ((1.0, "noisy_or"), (ONE_CLUSTER, "max")):
        clusters = learn_clusters(graph, rules, valid, known, thresholds=(threshold,))
        assert set(clusters.thresholds.values()) == {threshold}
        scores = RuleScorer(graph, rules, "nr_noisy_or", clusters=clusters).score_t(queries)
        expected = RuleScorer(graph, rules, plain).score_t(queries)
        if plain == "max":  # one cluster: -log(1 - the best confidence), monotone in it
            expected = -torch.log1p(-expected)
        torch.testing.assert_close(scores, expected, rtol=1e-12, atol=0)


def test_clusters_round_trip_and_bad_input_is_refused(tmp_path):
    train, valid = split(1)
    rules = parse_rules(random_rules(1), RELATIONS, entities=ENTITIES, max_body=3)
    graph = DirectedGraph.of(train, E, R)
    clusters = learn_clusters(graph, rules, valid, AnswerIndex.build(torch.cat([train, valid]), R))
    path = tmp_path / "clusters.json"
    clusters.write(path)
    assert RuleClusters.read(path, len(rules)) == clusters
    with pytest.raises(Exception, match="clusters of 24 rules, but the run's rule file has 3"):
        RuleClusters.read(path, 3)
    path.write_text("{}")
    with pytest.raises(Exception, match="not a clusters file of kgtrace"):
        RuleClusters.read(path, len(rules))
    with pytest.raises(ConfigError, match="nr_noisy_or needs its clusters"):
        RuleScorer(graph, rules, "nr_noisy_or")
    with pytest.raises(ConfigError, match="threshold 2"):
        learn_clusters(graph, rules, valid, AnswerIndex.build(train, R), thresholds=(2.0,))
