"""Rule application (kgtrace.prover.apply) against the readable per-query reference, on small random graphs."""

import random

import pytest
import torch

from kgtrace.core.errors import ConfigError
from kgtrace.data.vocab import Vocab
from kgtrace.evaluation.evaluate import evaluate
from kgtrace.prover.apply import AGGREGATIONS, RuleScorer, _Aggregate, directed_rules
from kgtrace.prover.apply_reference import aggregate_reference, predictions_reference
from kgtrace.prover.graph import DirectedGraph
from kgtrace.prover.rules import format_rule, parse_rules

E, R = 14, 3
ENTITIES = Vocab(tuple(f"e{i}" for i in range(E)))
RELATIONS = Vocab(("r", "s", "t"))


def random_graph(seed: int) -> torch.Tensor:
    rng = random.Random(seed)
    triples = {(rng.randrange(E), rng.randrange(R), rng.randrange(E)) for _ in range(45)}
    return torch.tensor(sorted(triples))


def random_rules(seed: int) -> list[str]:
    """Cyclic rules of 1 to 3 atoms in random directions, and AnyBURL's acyclic rules with constants (AC1 and AC2,
    the constant on either side of the head), with confidences that tie now and then."""
    rng = random.Random(seed)
    variables = ["X", "A", "B", "C"]
    lines = []
    for _ in range(14):
        length = rng.randint(1, 3)
        chain = variables[:length] + ["Y"]
        body = [f"{rng.choice('rst')}({a},{b})" if rng.random() < 0.5 else f"{rng.choice('rst')}({b},{a})"
                for a, b in zip(chain, chain[1:], strict=False)]
        lines.append(f"{rng.choice([0.5, 0.25, 0.8, rng.random() * 0.9 + 0.05]):.6f}  {rng.choice('rst')}(X,Y) :- "
                     + ", ".join(body))
    for _ in range(10):
        c, d = f'"e{rng.randrange(E)}"', f'"e{rng.randrange(E)}"'
        end = d if rng.random() < 0.5 else "A"  # AC1 or AC2
        atom = f"{rng.choice('rst')}(X,{end})" if rng.random() < 0.5 else f"{rng.choice('rst')}({end},X)"
        head = f"{rng.choice('rst')}(X,{c})" if rng.random() < 0.5 else f"{rng.choice('rst')}({c},X)"
        lines.append(f"{rng.choice([0.5, 0.3, rng.random() * 0.9 + 0.05]):.6f}  {head} :- {atom}")
    return lines


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_vectorised_application_equals_the_reference(seed, aggregation):
    triples = random_graph(seed)
    rules = parse_rules(random_rules(seed), RELATIONS, entities=ENTITIES, max_body=3)
    graph = DirectedGraph.of(triples, E, R)
    scorer = RuleScorer(graph, rules, aggregation, query_chunk=5, cache_bytes=3 * E * 5 * 4)  # small: evicts
    queries = torch.tensor([(a, q) for a in range(E) for q in range(2 * R)])
    scores = scorer.score_t(queries)
    assert scores.dtype == torch.float64 and scores.shape == (len(queries), E)
    predicted = 0
    for row, (anchor, q) in enumerate(queries.tolist()):
        found = predictions_reference(triples, rules, anchor, q)
        confidences = sorted({rule.confidence for rule in rules.rules if rule.head == q % R})
        shape = _Aggregate("maxplus", 1, confidences)
        expected = [aggregate_reference(found.get(e, []), aggregation, shape.level, shape.bits, shape.places)
                    for e in range(E)]
        assert scores[row].tolist() == expected, (anchor, q)
        predicted += len(found)
    assert predicted > 50  # the rules predict something on this graph


def test_maxplus_orders_by_the_best_rule_then_the_next():
    # a: rules 0.9 and 0.1; b: 0.9 alone; c: 0.5, 0.5, 0.5 -> a > b > c (AnyBURL's max+), and max ties a with b.
    total = _Aggregate("maxplus", 3, [0.9, 0.5, 0.1])
    for cells, confidence in (([0, 1], 0.9), ([2], 0.5), ([2], 0.5), ([2], 0.5), ([0], 0.1)):
        total.add(torch.tensor(cells), confidence)
    a, b, c = total.values.tolist()
    assert a > b > c > 0


def test_scores_rank_through_the_filtered_evaluation():
    triples = random_graph(0)
    rules = parse_rules(random_rules(0), RELATIONS, entities=ENTITIES, max_body=3)
    scorer = RuleScorer(DirectedGraph.of(triples, E, R), rules)
    metrics = evaluate(scorer, triples[:10], known=triples)
    assert 0 < metrics.both.realistic.mrr <= 1
    assert torch.equal(scorer.score_hrt(triples[:10]), scorer.score_t(triples[:10, :2])[torch.arange(10), triples[:10, 2]])


def test_rules_with_constants_round_trip_and_the_engines_refuse_them():
    lines = random_rules(3)
    rules = parse_rules(lines, RELATIONS, entities=ENTITIES, max_body=3)
    again = parse_rules([format_rule(r, RELATIONS.labels, entity_labels=ENTITIES.labels) for r in rules.rules],
                        RELATIONS, entities=ENTITIES, max_body=3)
    assert [(r.head, r.head_args, r.body, r.confidence) for r in again.rules] == \
        [(r.head, r.head_args, r.body, r.confidence) for r in rules.rules]
    assert len(directed_rules(rules)) == 2 * len(rules)
    with pytest.raises(ConfigError, match="name an entity"):
        rules.require_variables()
    with pytest.raises(ConfigError, match="needs the dataset's entities"):
        parse_rules(['0.5  r(X,"e1") :- s(X,A)'], RELATIONS)


def test_a_body_that_is_not_a_path_is_refused_by_name():
    rules = parse_rules(["0.5  r(X,Y) :- s(X,Y), t(X,Y)"], RELATIONS, source="rules.txt")
    with pytest.raises(ConfigError, match="rules.txt:1: rule application takes AnyBURL's path rules"):
        directed_rules(rules)
