"""Rule files (both formats, errors with file:line) and rule mining against a brute-force count."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from kgtrace.cli import main
from kgtrace.core.errors import ConfigError
from kgtrace.data.dataset import load_dataset
from kgtrace.data.vocab import Vocab
from kgtrace.prover.logic import Rule
from kgtrace.prover.mining import (
    MiningConfig,
    _bodies_to_count,
    _body_size_lower_bounds,
    _Graph,
    _paths_per_x,
    _row_blocks,
    chain_paths,
    chain_supports,
    mine_rules,
)
from kgtrace.prover.rules import format_rule, parse_rules, read_rules, write_rules

RELATIONS = Vocab(("parent", "grandparent", "child", "biolink:treats"))


def test_both_formats_parse_to_the_same_rule():
    rules = parse_rules([
        "# a comment",
        "0.83  grandparent(X,Y) :- parent(X,Z), parent(Z,Y)",
        "",
        "r7:0.83:parent(A,B) , parent(B,C) -> grandparent(A,C)   # trailing comment",
        "0.5\tchild(Y0,X0) :- parent(X0, Y0)",
        "1 biolink:treats(X,Y) :- biolink:treats(Y,X)",
    ], RELATIONS, source="r.txt")
    first, second, inverse, symmetric = rules.rules
    assert first == Rule(1, ((0, 0, 2), (0, 2, 1)), 0.83, "", "r.txt:2")
    assert (second.head, second.body, second.confidence, second.name, second.source) == (1, first.body, 0.83, "r7",
                                                                                          "r.txt:4")
    assert inverse.body == ((0, 1, 0),) and inverse.head == 2  # child(Y,X) :- parent(X,Y): X of the head is local 0
    assert symmetric.head == 3 and symmetric.body == ((3, 1, 0),)
    assert rules.by_head() == [[], [0, 1], [2], [3]]
    assert rules.max_body == 2 and rules.max_free == 1


def test_every_bad_line_is_reported_at_once_with_file_and_line():
    lines = [
        "0.9  grandparent(X,Y) :- parent(X,Z), parent(Z,Y)",  # fine
        "0.9  grandparnt(X,Y) :- parent(X,Y)",  # unknown relation, with a close label
        "1.5  child(X,Y) :- parent(Y,X)",  # confidence out of range
        "0.5  child(X,Y) :- parent(Y,john)",  # a constant unquoted
        "0.5  child(X,Y) :- parent(X,Z)",  # Y not in the body
        "0.5  child(X,X) :- parent(X,X)",  # repeated head variable
        "0.5  child(X,Y) :- parent(X,Z), parent(Z,W), parent(W,Y)",  # body too long for max_body=2
        "this is not a rule",
        "0.5  child(X,Y) :- parent(X,Y) parent(Y,X)",  # missing comma
    ]
    with pytest.raises(ConfigError) as info:
        parse_rules(lines, RELATIONS, source="bad.rules")
    problems = info.value.problems
    assert [p.split(":")[1] for p in problems] == ["2", "3", "4", "5", "6", "7", "8", "9"]
    assert "grandparnt" in problems[0] and "'grandparent'" in problems[0]
    assert "1.5" in problems[1] and "neither a variable nor a quoted constant" in problems[2]
    assert "variable Y" in problems[3] and "two distinct variables" in problems[4]
    assert "3 atoms" in problems[5] and "fix:" in problems[6]
    # Three body atoms are fine when configured.
    longer = parse_rules(lines[6:7], RELATIONS, max_body=3)
    assert longer.rules[0].body == ((0, 0, 2), (0, 2, 3), (0, 3, 1)) and longer.rules[0].num_free == 2


def test_write_then_read_gives_the_same_rules(tmp_path):
    rules = [Rule(1, ((0, 0, 2), (0, 2, 1)), 0.75), Rule(2, ((0, 1, 0),), 1.0), Rule(0, ((2, 2, 0), (1, 1, 2)), 0.125)]
    path = tmp_path / "rules.txt"
    write_rules(path, rules, RELATIONS.labels, ["support=3", "", "x"], header=["made by a test"])
    text = path.read_text()
    assert text.startswith("# made by a test\n0.750000  grandparent(X,Y) :- parent(X,Z), parent(Z,Y)  # support=3\n")
    back = read_rules(path, RELATIONS)
    assert [(r.head, r.body, r.confidence) for r in back.rules] == [(r.head, r.body, r.confidence) for r in rules]
    assert format_rule(rules[2], RELATIONS.labels) == "0.125000  parent(X,Y) :- child(Z,X), grandparent(Y,Z)"


# ----------------------------------------------------------------------------- mining


def brute_force(triples: list[tuple[int, int, int]], num_relations: int) -> dict:
    """{(head, body atoms): (support, head coverage, std, pca)} by enumerating pairs with Python sets."""
    facts = set(triples)
    entities = sorted({h for h, _, _ in facts} | {t for _, _, t in facts})
    R = num_relations

    def holds(d, x, y):  # directed relation d
        return (x, d, y) in facts if d < R else (y, d - R, x) in facts

    bodies = {}
    for d in range(2 * R):
        atom = (d, 0, 1) if d < R else (d - R, 1, 0)
        bodies[(atom,)] = {(x, y) for x in entities for y in entities if holds(d, x, y)}
    for a, b in itertools.product(range(2 * R), repeat=2):
        atoms = ((a, 0, 2) if a < R else (a - R, 2, 0), (b, 2, 1) if b < R else (b - R, 1, 2))
        bodies[atoms] = {(x, y) for x in entities for y in entities
                         if any(holds(a, x, z) and holds(b, z, y) for z in entities)}
    out = {}
    for atoms, pairs in bodies.items():
        for r in range(R):
            if atoms == ((r, 0, 1),):
                continue
            head = {(h, t) for h, rel, t in facts if rel == r}
            support = len(pairs & head)
            if not support:
                continue
            domain = {x for x, _ in head}
            pca_pairs = {(x, y) for x, y in pairs if x in domain}
            out[(r, atoms)] = (support, support / len(head), support / len(pairs), support / len(pca_pairs))
    return out


def test_hand_computed_measures():
    # parent: a->b, b->c, b->d, e->f; grandparent: a->c, a->d, e->e (noise), a->b (wrong).
    a, b, c, d, e, f = range(6)
    triples = [(a, 0, b), (b, 0, c), (b, 0, d), (e, 0, f), (a, 1, c), (a, 1, d), (e, 1, e), (a, 1, b)]
    mined = mine_rules(torch.tensor(triples), 6, 2, MiningConfig(min_support=1, min_head_coverage=0, min_confidence=0,
                                                                 max_rules_per_head=0))
    by_rule = {(m.rule.head, m.rule.body): m for m in mined}
    chain = by_rule[(1, ((0, 0, 2), (0, 2, 1)))]  # grandparent(X,Y) :- parent(X,Z), parent(Z,Y)
    # Body pairs: (a,c), (a,d); both grandparent facts: support 2 of 4 facts; std 2/2; PCA 2/2.
    assert (chain.support, chain.head_coverage, chain.std_confidence, chain.pca_confidence) == (2, 0.5, 1.0, 1.0)
    implication = by_rule[(1, ((0, 0, 1),))]  # grandparent(X,Y) :- parent(X,Y): only (a,b); 4 parent pairs,
    # of which (a,b) and (e,f) have an x with some grandparent fact: PCA 1/2.
    assert (implication.support, implication.std_confidence, implication.pca_confidence) == (1, 0.25, 0.5)
    assert mined == sorted(mined, key=lambda m: (-m.rule.confidence, -m.support))
    # The written confidence is damped by the offset (default 5): support / (body pairs + 5).
    assert chain.rule.confidence == pytest.approx(2 / (2 + 5)) and implication.rule.confidence == pytest.approx(1 / 9)


def test_mining_equals_brute_force_on_a_random_graph():
    gen = torch.Generator().manual_seed(3)
    triples = torch.unique(torch.stack([torch.randint(0, 9, (70,), generator=gen), torch.randint(0, 3, (70,), generator=gen),
                                        torch.randint(0, 9, (70,), generator=gen)], 1), dim=0)
    expected = brute_force([tuple(t) for t in triples.tolist()], 3)
    config = MiningConfig(min_support=1, min_head_coverage=0, min_confidence=0, max_rules_per_head=0)
    mined = mine_rules(triples, 9, 3, config)
    got = {(m.rule.head, m.rule.body): (m.support, m.head_coverage, m.std_confidence, m.pca_confidence) for m in mined}
    assert got.keys() == expected.keys()
    for key, values in expected.items():
        assert got[key] == pytest.approx(values), key
    # Thresholds and the per-head cap select from the same measures.
    strict = MiningConfig(min_support=2, min_head_coverage=0.1, min_confidence=0.3, min_pca_confidence=0.4,
                          confidence="pca", confidence_offset=0.0, max_rules_per_head=3)
    kept = mine_rules(triples, 9, 3, strict)
    passing = {k for k, (s, hc, std, pca) in expected.items() if s >= 2 and hc >= 0.1 and std >= 0.3 and pca >= 0.4}
    assert kept and {(m.rule.head, m.rule.body) for m in kept} <= passing
    for head in range(3):
        best = sorted((round(-expected[k][3], 9), -expected[k][0]) for k in passing if k[0] == head)[:3]
        assert sorted((round(-m.rule.confidence, 9), -m.support) for m in kept if m.rule.head == head) == best


def test_rules_mine_command(tmp_path, capsys):
    out = tmp_path / "nations.rules"
    assert main(["rules", "mine", "--dataset", "nations", "--out", str(out), "--min-confidence", "0.5",
                 "--confidence-offset", "0", "--max-rules-per-head", "5"]) == 0
    ds = load_dataset("nations")
    rules = read_rules(out, ds.relations)
    assert 0 < len(rules) <= 5 * ds.num_relations
    assert all(rule.confidence >= 0.5 for rule in rules.rules)
    confidences = [rule.confidence for rule in rules.rules]
    assert confidences == sorted(confidences, reverse=True)
    assert main(["rules", "mine", "--dataset", "nations", "--out", str(out)]) == 2  # exists: refused
    assert "--overwrite" in capsys.readouterr().err


def test_chain_paths_are_counted_and_blocks_of_rows_mine_the_same_rules():
    """chain_paths: the two-hop paths x -a-> z -> y per directed relation a, as enumerating them finds."""
    generator = torch.Generator().manual_seed(3)
    triples = torch.stack([torch.randint(0, 9, (40,), generator=generator), torch.randint(0, 3, (40,), generator=generator),
                           torch.randint(0, 9, (40,), generator=generator)], 1)
    graph = _Graph.of(triples, 9, 3)
    edges = list(zip(graph.heads.tolist(), graph.relations.tolist(), graph.tails.tolist()))
    brute = [sum(1 for x, d, z in edges if d == a for x2, _, _ in edges if x2 == z) for a in range(6)]
    assert chain_paths(graph).tolist() == brute
    # The chain products a block of rows at a time: the same rules, supports and confidences as all at once,
    # down to blocks of one row, and with a hub row whose paths alone exceed the limit.
    hub = torch.cat([triples, torch.tensor([[0, 1, leaf] for leaf in range(1, 9)] + [[leaf, 2, 0] for leaf in range(1, 9)])])
    loose = MiningConfig(min_support=1, min_head_coverage=0.0, min_confidence=0.0, max_rules_per_head=0)
    for graph_triples in (triples, hub):
        whole = mine_rules(graph_triples, 9, 3, replace(loose, max_chain_paths=0))
        assert len(whole) > 20
        for limit in (1, 7, 40):
            assert mine_rules(graph_triples, 9, 3, replace(loose, max_chain_paths=limit)) == whole
    hub_graph = _Graph.of(hub, 9, 3)
    per_x = {x: sum(1 for h, d, z in zip(hub_graph.heads.tolist(), hub_graph.relations.tolist(),
                                          hub_graph.tails.tolist()) if d == 1 and h == x
                    for h2 in hub_graph.heads.tolist() if h2 == z) for x in range(9)}
    blocks = _row_blocks(_paths_per_x(hub_graph, 1, hub_graph.directed_columns(torch.arange(6))), 7)
    assert [x for rows in blocks for x in rows] == list(range(9))  # every row once, in order
    assert all(len(rows) == 1 or sum(per_x[x] for x in rows) <= 7 for rows in blocks)
    assert any(len(rows) == 1 and per_x[rows[0]] > 7 for rows in blocks)  # the hub: a block of its own


def _hub_graph(seed: int, entities: int = 12, edges: int = 60) -> torch.Tensor:
    """A random graph with 3 relations and two hubs (entities 0 and 1, in an edge with every other entity)."""
    generator = torch.Generator().manual_seed(seed)
    random = torch.stack([torch.randint(0, entities, (edges,), generator=generator),
                          torch.randint(0, 3, (edges,), generator=generator),
                          torch.randint(0, entities, (edges,), generator=generator)], 1)
    hubs = [[0, 1, leaf] for leaf in range(2, entities)] + [[leaf, 2, 1] for leaf in range(2, entities)] + [[1, 0, 0]]
    return torch.unique(torch.cat([random, torch.tensor(hubs)]), dim=0)


def _chain_pairs_brute(triples: torch.Tensor, R: int) -> dict[tuple[int, int], set]:
    """{(a, b): the pairs (x, y) of D_a D_b}, by enumerating every z."""
    edges = {(h, r, t) for h, r, t in triples.tolist()} | {(t, r + R, h) for h, r, t in triples.tolist()}
    out: dict[tuple[int, int], set] = {}
    for (x, a, z), (z2, b, y) in itertools.product(edges, edges):
        if z == z2:
            out.setdefault((a, b), set()).add((x, y))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_chain_supports_and_body_size_bounds_equal_enumeration(seed):
    """chain_supports (triangles from each fact's smaller end) counts, for every body and head, the facts the body's
    pairs hold, as enumerating the pairs finds, whatever the wedges per block; the size bound never exceeds a size."""
    triples, R = _hub_graph(seed), 3
    graph = _Graph.of(triples, 12, R)
    pairs = _chain_pairs_brute(triples, R)
    facts = {(h, r, t) for h, r, t in triples.tolist()}
    expected = torch.zeros(2 * R, 2 * R, R, dtype=torch.long)
    for (a, b), body in pairs.items():
        for r in range(R):
            expected[a, b, r] = sum((x, r, y) in facts for x, y in body)
    assert expected.sum() > 100
    for limit in (0, 1, 5, 50):
        assert torch.equal(chain_supports(graph, limit), expected), limit
    lower = _body_size_lower_bounds(graph, torch.ones(2 * R, 2 * R, dtype=torch.bool))
    sizes = torch.tensor([[len(pairs.get((a, b), ())) for b in range(2 * R)] for a in range(2 * R)])
    assert (lower <= sizes).all() and (lower > 0).sum() == (sizes > 0).sum()
    assert (lower == sizes).any() and (lower < sizes).any()  # tight for some bodies, not for all


def test_pruned_chain_mining_keeps_every_rule_that_passes():
    """Bodies left uncounted (no head passes support and coverage, or their size bound fails the confidence) hold no
    rule that passes: mining with thresholds keeps exactly the brute-force rules that pass them, on a graph where
    the pruning leaves bodies out."""
    triples = _hub_graph(2, entities=16, edges=30)
    graph = _Graph.of(triples, 16, 3)
    expected = brute_force([tuple(t) for t in triples.tolist()], 3)
    for min_support, coverage, confidence in ((2, 0.0, 0.3), (1, 0.2, 0.0), (3, 0.1, 0.5)):
        config = MiningConfig(min_support=min_support, min_head_coverage=coverage, min_confidence=confidence,
                              max_rules_per_head=0)
        counted = _bodies_to_count(graph, chain_supports(graph, 0), config)
        assert 0 < counted.sum() < 36  # some chain bodies counted, some not
        got = {(m.rule.head, m.rule.body): (m.support, m.head_coverage, m.std_confidence, m.pca_confidence)
               for m in mine_rules(triples, 16, 3, config)}
        passing = {k: v for k, v in expected.items() if v[0] >= min_support and v[1] >= coverage and v[2] >= confidence}
        assert got.keys() == passing.keys() and len(got) > 3
        for key, values in passing.items():
            assert got[key] == pytest.approx(values), key
    # The confidence bound prunes bodies that support and coverage alone would count.
    loose = MiningConfig(min_support=2, min_head_coverage=0.0, min_confidence=0.0)
    strict = replace(loose, min_confidence=0.3)
    supports = chain_supports(graph, 0)
    assert _bodies_to_count(graph, supports, strict).sum() < _bodies_to_count(graph, supports, loose).sum()
