"""Rule application (kgtrace.prover.apply) against the readable per-query reference, on small random graphs."""

import itertools
import json
import random
from dataclasses import replace

import pytest
import torch

from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.data.dataset import Dataset
from kgtrace.data.vocab import Vocab
from kgtrace.evaluation.evaluate import evaluate
from kgtrace.prover import apply as apply_module
from kgtrace.prover import learn as learn_module
from kgtrace.prover.apply import Aggregate, RuleScorer, directed_rules
from kgtrace.prover.apply_reference import (aggregate_reference, nr_noisy_or_reference, predictions_reference,
                                           rule_predictions_reference)
from kgtrace.prover.clusters import RuleClusters
from kgtrace.prover.config import AGGREGATIONS, LearnConfig
from kgtrace.prover.graph import DirectedGraph, PathWalker, SparseWalker
from kgtrace.prover.learn import learn_rules
from kgtrace.prover.rule_paths import GraphPaths, PathFinder, explain_paths, triple_paths
from kgtrace.prover.rules import RuleSet, format_rule, parse_rules

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


def random_clusters(num_rules: int, seed: int) -> RuleClusters:
    """Each query relation's rules dealt at random into clusters of two or more (and some left alone)."""
    rng = random.Random(seed)
    groups = {}
    for q in range(2 * R):
        numbers = [n for n in range(num_rules) if rng.random() < 0.6]
        rng.shuffle(numbers)
        groups[q] = tuple(tuple(sorted(numbers[k:k + 3])) for k in range(0, len(numbers) - 2, 3))
    return RuleClusters(num_rules, groups, {q: 0.5 for q in groups}, {}, {})


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_vectorised_application_equals_the_reference(seed, aggregation, monkeypatch):
    if seed == 2:  # the buffered predictions added every few rules, not once at the end
        monkeypatch.setattr(apply_module, "FLUSH_EVENTS", 7)
    triples = random_graph(seed)
    rules = parse_rules(random_rules(seed), RELATIONS, entities=ENTITIES, max_body=3)
    graph = DirectedGraph.of(triples, E, R)
    clusters = random_clusters(len(rules), seed) if aggregation == "nr_noisy_or" else None
    scorer = RuleScorer(graph, rules, aggregation, clusters=clusters, query_chunk=5)
    queries = torch.tensor([(a, q) for a in range(E) for q in range(2 * R)])
    scores = scorer.score_t(queries)
    assert scores.dtype == torch.float64 and scores.shape == (len(queries), E)
    predicted = 0
    for row, (anchor, q) in enumerate(queries.tolist()):
        found = predictions_reference(triples, rules, anchor, q)
        confidences = sorted({rule.confidence for rule in rules.rules if rule.head == q % R})
        levels = {c: i + 1 for i, c in enumerate(confidences)}
        bits = max(1, len(confidences).bit_length())
        places = Aggregate("maxplus", 1, confidences, own=torch.tensor([], dtype=torch.long)).places
        if aggregation == "nr_noisy_or":
            by_rule = rule_predictions_reference(triples, rules, anchor, q)
            cluster_of = {rule: k for k, group in enumerate(clusters.groups.get(q, ())) for rule in group}
            expected = [nr_noisy_or_reference(by_rule.get(e, {}), cluster_of) for e in range(E)]
        else:
            expected = [aggregate_reference(found.get(e, []), aggregation, levels, bits, places)
                        for e in range(E)]
        if aggregation in ("noisy_or", "nr_noisy_or"):  # a sum of logarithms: its order may differ in the last bits
            assert scores[row].tolist() == pytest.approx(expected, rel=1e-12, abs=0), (anchor, q)
        else:
            assert scores[row].tolist() == expected, (anchor, q)
        predicted += len(found)
    assert predicted > 50  # the rules predict something on this graph


def test_maxplus_orders_by_the_best_rule_then_the_next():
    # a: rules 0.9 and 0.1; b: 0.9 alone; c: 0.5, 0.5, 0.5 -> a > b > c (AnyBURL's max+), and max ties a with b.
    for flush_each in (False, True):  # in any order: the weakest rule first, too
        total = Aggregate("maxplus", 4, [0.9, 0.5, 0.1], own=torch.tensor([3]))
        for cells, confidence in (([0], 0.1), ([2], 0.5), ([0, 1, 3], 0.9), ([2], 0.5), ([2], 0.5)):
            total.add(torch.tensor(cells), torch.full((len(cells),), confidence, dtype=torch.float64),
                      torch.zeros(len(cells), dtype=torch.long))
            if flush_each:
                total._compact()
        a, b, c, anchor = total.result().tolist()
        assert a > b > c > 0 and anchor == 0


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


# ----------------------------------------------------------------------------- learning


def brute_force_measures(triples, rule, num_relations):
    """(correct, groundings) of a rule over every anchor, by the readable reference: each answer of the query
    asked from the head's variable X is a grounding; the correct ones are facts."""
    facts = {tuple(t) for t in triples.tolist()}
    single = RuleSet((rule,), num_relations)
    query = rule.head if rule.head_args[0] == 0 else rule.head + num_relations
    correct = groundings = 0
    for anchor in range(E):
        for answer in predictions_reference(triples, single, anchor, query):
            groundings += 1
            h, t = (anchor, answer) if query < num_relations else (answer, anchor)
            correct += (h, rule.head, t) in facts
    return correct, groundings


@pytest.mark.parametrize("seed", [0, 1])
def test_learned_measures_equal_brute_force_counts(seed):
    triples = random_graph(seed)
    config = LearnConfig(rounds=4, paths_per_round=256, confidence_sample=E, min_support=1, min_confidence=0.0,
                         seed=seed)
    learned = learn_rules(triples, E, R, config, log=lambda _: None)
    kinds = {("cyclic" if m.rule.head_args == (0, 1) else "AC1" if m.rule.body[0][2] < 0 or m.rule.body[0][1] < 0
              else "AC2") for m in learned}
    assert kinds == {"cyclic", "AC1", "AC2"} and {len(m.rule.body) for m in learned} == {1, 2, 3}
    for m in learned:
        assert (m.support, m.groundings) == brute_force_measures(triples, m.rule, R), m.rule
        assert m.rule.confidence == pytest.approx(m.support / (m.groundings + config.confidence_offset))
        assert not m.sampled
    confidences = [m.rule.confidence for m in learned]
    assert confidences == sorted(confidences, reverse=True)  # best first


@pytest.mark.parametrize("seed", [0, 1])
def test_paths_met_in_the_middle_are_every_short_cycle_brute_force_finds(seed):
    # One relation at most between two entities, so the middle step of a 3-step path is the only one there is.
    rng = random.Random(seed)
    pairs = {}
    for _ in range(40):
        a, b = rng.sample(range(E), 2)
        if (a, b) not in pairs and (b, a) not in pairs:
            pairs[(a, b)] = rng.randrange(R)
    triples = torch.tensor([(a, r, b) for (a, b), r in sorted(pairs.items())])
    graph = DirectedGraph.of(triples, E, R)
    directed = {(a, r, b) for a, r, b in triples.tolist()} | {(b, r + R, a) for a, r, b in triples.tolist()}
    x, q, y = (torch.tensor(column) for column in zip(*sorted(directed), strict=True))
    found = learn_module._meet(graph, x, q, y, E, 3, torch.Generator().manual_seed(0))
    expected = []
    for xi, qi, yi in directed:
        steps_x = [(d, a) for s, d, a in directed if s == xi and a not in (xi, yi)]
        steps_y = [(d, b) for b, d, t in directed if t == yi and b not in (xi, yi)]
        for d1, a in steps_x:
            for d3, b in steps_y:
                middle = [d for s, d, t in directed if (s, t) == (a, b)]
                if a == b:
                    expected.append(learn_module._cyclic_key(qi, [d1, d3], R))
                elif middle:
                    expected.append(learn_module._cyclic_key(qi, [d1, middle[0], d3], R))
    assert sorted(found) == sorted(expected) and len({len(k) for k in expected}) == 2  # both lengths occur


def test_meeting_in_the_middle_finds_a_rule_random_walks_rarely_close():
    # r(X,Y) :- s(X,A), t(A,Y) holds for 30 facts, but each X has 60 other s-edges and each Y 60 other t-edges: a
    # random first step from either end rarely reaches the A that closes the path.
    facts, n = [], 30
    for i in range(n):
        x, a, y = i, 100 + i, 200 + i
        facts += [(x, 1, a), (a, 2, y), (x, 0, y)] + [(x, 1, 300 + 60 * i + k) for k in range(60)]
        facts += [(2200 + 60 * i + k, 2, y) for k in range(60)]
    triples = torch.tensor(facts)
    config = LearnConfig(rounds=1, paths_per_round=256, max_length=2, acyclic=False, min_support=1)
    rule = ((1, 0, 2), (2, 2, 1))  # s(X,A), t(A,Y)
    walked = learn_rules(triples, 4000, 3, config, log=lambda _: None)
    met = learn_rules(triples, 4000, 3, replace(config, meet_neighbours=64), log=lambda _: None)
    assert rule not in [m.rule.body for m in walked if m.rule.head == 0]
    assert [m.rule.body for m in met if m.rule.head == 0][0] == rule


def test_learning_finds_a_planted_rule_first_and_resumes(tmp_path):
    # grandparent(X,Y) :- parent(X,Z), parent(Z,Y) holds for every chain of a random forest, and nothing else does.
    rng = random.Random(0)
    parent = [(rng.randrange(i), i) for i in range(1, 60)]
    grand = [(a, c) for a, b in parent for b2, c in parent if b == b2]
    triples = torch.tensor([(a, 0, b) for a, b in parent] + [(a, 1, c) for a, c in grand])
    config = LearnConfig(seconds=60, paths_per_round=512, max_length=2, acyclic=False)
    state = tmp_path / "rules.txt.state"
    logged = []
    learned = learn_rules(triples, 60, 2, replace(config, rounds=1), state=state, log=logged.append)
    assert state.is_file() and logged == [logged[0]] and logged[0].startswith("round 1:")
    again = learn_rules(triples, 60, 2, replace(config, rounds=3), state=state, log=logged.append)
    assert [line.split(":")[0] for line in logged] == ["round 1", "round 2", "round 3"]  # continued from round 1
    assert {m.rule for m in learned} <= {m.rule for m in again}
    best = again[0].rule
    assert best.head == 1 and best.body == ((0, 0, 2), (0, 2, 1)) and again[0].support == len(grand)
    with pytest.raises(KgtraceError, match="only --seconds and --rounds may change"):
        learn_rules(triples, 60, 2, replace(config, max_length=3), state=state, log=lambda _: None)


def test_rules_learn_then_prove_apply_then_evaluate(tmp_path, capsys):
    from kgtrace.cli import main
    from kgtrace.prover.run import load_prover_run

    rules = tmp_path / "rules.txt"
    assert main(["rules", "learn", "--dataset", "nations", "--out", str(rules), "--rounds", "1",
                 "--paths-per-round", "512"]) == 0
    assert "rules (" in capsys.readouterr().out and rules.with_name("rules.txt.state").is_file()
    first = rules.read_text().splitlines()
    assert main(["rules", "learn", "--dataset", "nations", "--out", str(rules), "--rounds", "2",
                 "--paths-per-round", "512"]) == 0  # the same command continues: a second round
    assert len(rules.read_text().splitlines()) > len(first)
    assert main(["rules", "learn", "--dataset", "nations", "--out", str(rules), "--rounds", "2", "--seed", "1"]) == 2
    assert "only --seconds and --rounds may change" in capsys.readouterr().err
    run = tmp_path / "run"
    assert main(["prove", "apply", "--dataset", "nations", "--rules", str(rules), "--out", str(run),
                 "--aggregation", "noisy_or"]) == 0
    loaded = load_prover_run(run)
    assert isinstance(loaded.model, RuleScorer) and loaded.engine is None and loaded.rules.has_constants
    h, r, t = (loaded.dataset.entities.labels[loaded.dataset.test[0, 0]],
               loaded.dataset.relations.labels[loaded.dataset.test[0, 1]],
               loaded.dataset.entities.labels[loaded.dataset.test[0, 2]])
    capsys.readouterr()
    assert main(["explain", str(run), "--triple", h, r, t, "--out", str(tmp_path / "why.json")]) == 0
    assert "rule(s) predict it, strongest first" in capsys.readouterr().out
    assert json.loads((tmp_path / "why.json").read_text())["kind"].startswith("paths in the graph")
    out = tmp_path / "m.json"
    assert main(["evaluate", str(run), "--out", str(out), "--device", "cpu"]) == 0
    assert 0.3 < json.loads(out.read_text())["both"]["realistic"]["mrr"] <= 1
    hybrid = ["prove", "apply", "--dataset", "nations", "--rules", str(rules), "--out", str(tmp_path / "h"),
              "--embedding-run", str(run)]
    assert main(hybrid) == 2
    assert "aggregation='maxplus' with embedding_run" in capsys.readouterr().err
    # SAFRAN's aggregation: its clusters learned on validation, kept in the run, read by evaluate.
    safran = tmp_path / "safran"
    assert main(["prove", "apply", "--dataset", "nations", "--rules", str(rules), "--out", str(safran),
                 "--aggregation", "nr_noisy_or"]) == 0
    assert "clusters of redundant rules for" in capsys.readouterr().out
    assert json.loads((safran / "clusters.json").read_text())["num_rules"] == len(load_prover_run(safran).rules)
    assert main(["evaluate", str(safran), "--out", str(out), "--device", "cpu"]) == 0
    assert 0.3 < json.loads(out.read_text())["both"]["realistic"]["mrr"] <= 1
    (safran / "clusters.json").unlink()
    assert main(["evaluate", str(safran), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "clusters.json: missing" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- paths as explanations


def brute_force_paths(triples, rule, h, t):
    """Every grounding of the rule that predicts (h, rule.head, t), as its facts in body order, by trying every
    assignment of entities to the body's variables (the triple itself never a fact)."""
    facts = {tuple(x) for x in triples.tolist()} - {(h, rule.head, t)}
    head = dict(zip(rule.head_args, (h, t), strict=True))
    if any(term < 0 and -1 - term != value for term, value in head.items()):
        return []  # a constant of the head is not the triple's entity there
    free = sorted({v for _, a, b in rule.body for v in (a, b) if v >= 0} - set(head))
    found = []
    for values in itertools.product(range(E), repeat=len(free)):
        value = {**{k: v for k, v in head.items() if k >= 0}, **dict(zip(free, values, strict=True))}
        ground = [(value[a] if a >= 0 else -1 - a, relation, value[b] if b >= 0 else -1 - b)
                  for relation, a, b in rule.body]
        if all(fact in facts for fact in ground):
            found.append(ground)
    return found


@pytest.mark.parametrize("seed", [0, 1])
def test_path_explanations_list_every_grounding_brute_force_finds(seed):
    triples = random_graph(seed)
    ds = Dataset("g", "g", ENTITIES, RELATIONS, triples, triples[:0], triples[:0])
    rules = parse_rules(random_rules(seed), RELATIONS, entities=ENTITIES, max_body=3)
    finder = PathFinder.of(DirectedGraph.of(triples, E, R), rules)
    explained = 0
    for h, r, t in [(h, r, t) for h in range(E) for r in range(R) for t in range(E) if h != t]:
        found = triple_paths(ds, finder, (h, r, t), top=len(rules), per_rule=10 ** 6)
        label = lambda a, b, c: (ENTITIES.labels[a], RELATIONS.labels[b], ENTITIES.labels[c])  # noqa: E731
        wanted = sorted((format_rule(rule, RELATIONS.labels, entity_labels=ENTITIES.labels).split("  ", 1)[1],
                         sorted(sorted(label(*fact) for fact in path) for path in paths))
                        for rule in rules.rules if rule.head == r and (paths := brute_force_paths(triples, rule, h, t)))
        # Each rule's paths as label triples, in any order (the explanation lists a path's facts in path order,
        # brute force in the body's order: compare their sets).
        shown = sorted((rp.rule, sorted(sorted((f.head, f.relation, f.tail) for f in path) for path in rp.groundings))
                       for rp in found.rules)
        assert shown == wanted, (h, r, t)
        confidences = [rp.confidence for rp in found.rules]
        assert confidences == sorted(confidences, reverse=True)
        explained += bool(found.rules)
    assert explained > 30


def test_explain_paths_takes_names_and_prints_paths():
    triples = random_graph(0)
    ds = Dataset("g", "g", ENTITIES, RELATIONS, triples, triples[:0], triples[:0])
    rules = parse_rules(["0.5  r(X,Y) :- s(X,A), t(A,Y)"], RELATIONS, entities=ENTITIES)
    s_facts = [(a, b) for a, rel, b in triples.tolist() if rel == 1]
    t_facts = [(a, b) for a, rel, b in triples.tolist() if rel == 2]
    h, a, t = next((h, a, t) for h, a in s_facts for a2, t in t_facts if a == a2 and h != t)
    found = explain_paths(ds, rules, [(f"e{h}", "r", f"e{t}"), (h, 0, h)], rules_file="g.rules")
    paths, nothing = found
    assert not nothing.rules and found.rules == "g.rules"
    assert GraphPaths.from_dict(json.loads(json.dumps(found.to_dict()))) == found  # the JSON file reads back whole
    assert found.to_df()["triple"].unique().to_list() == [0]  # rows of the triple with paths only
    assert paths.kind.startswith("paths in the graph") and paths.rules[0].rule == "r(X,Y) :- s(X,Z), t(Z,Y)"
    assert f"e{h} -s-> e{a} ; e{a} -t-> e{t}" in "\n".join(paths.lines())
    assert paths.to_df().height == 2 * len(paths.rules[0].groundings)
    assert json.loads(json.dumps(paths.to_dict()))["rules"][0]["groundings"][0][0]["head"] == f"e{h}"


@pytest.mark.parametrize("max_expansion", [0, 10 ** 9])  # every step dense (the hubs' way), or every step sparse
def test_sparse_walks_reach_what_dense_products_reach(max_expansion):
    graph = DirectedGraph.of(random_graph(1), E, R)
    starts = torch.tensor([0, 3, 5, 9, 13])
    dense = PathWalker(graph, starts)
    for cache_pairs in (50_000_000, 12):  # the second evicts prefixes all along
        sparse = SparseWalker(graph, starts, max_expansion=max_expansion, cache_pairs=cache_pairs)
        rng = random.Random(0)
        for _ in range(40):
            path = tuple(rng.randrange(2 * R) for _ in range(rng.randint(1, 3)))
            entity, column = sparse.reach(path)
            expected = dense.reach(path).nonzero()  # [n, 2] (entity, column)
            assert sorted(zip(entity.tolist(), column.tolist(), strict=True)) == sorted(map(tuple, expected.tolist()))
            assert sparse.cached == sum(len(pairs[0]) for pairs in sparse.cache.values())
            assert sparse.cached <= cache_pairs or len(sparse.cache) == 1


class _Keys(torch.nn.Module):
    """Three candidates whose float64 scores float32 would merge: 2^40 + 1, 2^40, 0 for every query."""

    num_entities, num_relations = 3, 1

    def score_t(self, hr):
        return torch.tensor([[2.0 ** 40 + 1, 2.0 ** 40, 0.0]], dtype=torch.float64).expand(len(hr), 3).clone()

    def score_h(self, rt):
        return self.score_t(rt)

    def score_hrt(self, hrt):
        return self.score_t(hrt[:, :2]).gather(1, hrt[:, 2:3].long()).squeeze(1)


@pytest.mark.parametrize("candidates", ["all", "sampled"])
def test_float64_scores_rank_exactly(candidates):
    # maxplus's keys differ in their last places: entity 0 outranks entity 1 by one unit in 2^40 (rank 2, not a tie).
    from kgtrace.evaluation.evaluate import Candidates

    chosen = Candidates(corruptions=2) if candidates == "sampled" else Candidates()
    metrics = evaluate(_Keys(), torch.tensor([[2, 0, 1]]), known=None, sides=("tail",), candidates=chosen)
    assert metrics.sides["tail"].realistic.mrr == 0.5
