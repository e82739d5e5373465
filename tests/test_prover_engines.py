"""The reference engine on hand-computed cases; the vectorised engine equal to it there and on overflow."""

from __future__ import annotations

import math

import pytest
import torch

from kgtrace.data.vocab import Vocab
from kgtrace.prover.engine import VectorEngine, pad_states, unpad_states
from kgtrace.prover.logic import EngineShapes, open_query_state
from kgtrace.prover.reference import FACT, RULE, ReferenceEngine, best_proofs, proof_depth, search
from kgtrace.prover.rules import parse_rules
from kgtrace.prover.search import eager_deriver, vector_search

ANN, BOB, CAT, DAN = range(4)
E, R = 4, 3  # relations: parent 0, grandparent 1, knows 2; the answer atom is relation 3
V0, V1, V2 = E, E + 1, E + 2  # variables
PARENT, GRANDPARENT, KNOWS, ANSWER = 0, 1, 2, 3
TRIPLES = torch.tensor([[ANN, PARENT, BOB], [BOB, PARENT, CAT], [BOB, PARENT, DAN], [ANN, KNOWS, CAT],
                        [CAT, KNOWS, CAT]])
# Fact ids follow (relation, head, tail) order: 0 parent(ann,bob), 1 parent(bob,cat), 2 parent(bob,dan),
# 3 knows(ann,cat), 4 knows(cat,cat).
RULES = parse_rules(["0.9  grandparent(X,Y) :- parent(X,Z), parent(Z,Y)",
                     "0.5  grandparent(X,Y) :- knows(X,Y)",
                     "0.8  knows(X,Y) :- knows(Y,X)"], Vocab(("parent", "grandparent", "knows")))
NUM_FACTS = 5


@pytest.fixture(scope="module")
def engines():
    return ReferenceEngine(TRIPLES, RULES, E), VectorEngine(TRIPLES, RULES, E, EngineShapes(max_atoms=4))


def vector_derive(engine: VectorEngine, state, path=(), excluded=None):
    """The vectorised step on one state: (states, actions, log confidences, overflow) as Python values."""
    A, H = engine.shapes.max_atoms, engine.shapes.max_history
    states = pad_states([state], A, R)
    history = torch.full((1, H, A, 3), -1)
    history[0, : len(path) + 1] = pad_states(list(path) + [state], A, R)
    out = engine.derive(states, history, torch.tensor([excluded or (-1, -1, -1)]))
    valid = out.valid[0]
    return (unpad_states(out.states[0][valid], R), out.action[0][valid].tolist(),
            out.log_confidence[0][valid].tolist(), tuple(out.overflow[0].tolist()))


def both(engines, state, path=(), excluded=None):
    """The reference's derivations, after checking that the vectorised engine derives the same."""
    reference, vector = engines
    found = reference.derive(state, path, excluded)
    states, actions, log_conf, overflow = vector_derive(vector, state, path, excluded)
    assert states == [d.state for d in found.derived]
    assert actions == [d.action(NUM_FACTS) for d in found.derived]
    assert log_conf == pytest.approx([d.log_confidence for d in found.derived])
    assert overflow == found.overflow
    return found.derived


def test_rule_steps_come_after_fact_steps_in_rule_order(engines):
    derived = both(engines, ((GRANDPARENT, ANN, CAT),))
    assert [(d.state, d.kind, d.index) for d in derived] == [
        (((PARENT, ANN, V0), (PARENT, V0, CAT)), RULE, 0),  # Z renamed apart, then numbered V0
        (((KNOWS, ANN, CAT),), RULE, 1),
    ]
    assert derived[0].log_confidence == pytest.approx(math.log(0.9))


def test_facts_bind_variables_and_proofs_are_empty_states(engines):
    assert [(d.state, d.kind, d.index) for d in both(engines, ((PARENT, ANN, V0), (PARENT, V0, CAT)))] == [
        (((PARENT, BOB, CAT),), FACT, 0)]
    assert [(d.state, d.index) for d in both(engines, ((PARENT, BOB, V0),))] == [((), 1), ((), 2)]
    assert [(d.state, d.kind) for d in both(engines, ((KNOWS, ANN, CAT),))] == [((), FACT), (((KNOWS, CAT, ANN),), RULE)]


def test_rule_variables_are_renamed_apart_and_states_canonical(engines):
    derived = both(engines, ((GRANDPARENT, V0, V1), (KNOWS, V1, V0)))
    assert [d.state for d in derived] == [
        ((PARENT, V0, V1), (PARENT, V1, V2), (KNOWS, V2, V0)),  # X=V0, Z fresh -> V1, Y=V1 -> V2
        ((KNOWS, V0, V1), (KNOWS, V1, V0)),
    ]


def test_a_repeated_variable_matches_only_reflexive_facts(engines):
    # knows(V, V): only knows(cat, cat); the symmetric rule gives knows(V, V) back, which is on the path.
    assert [(d.state, d.index) for d in both(engines, ((KNOWS, V0, V0),))] == [((), 4)]


def test_no_state_is_revisited_on_a_path(engines):
    start = ((GRANDPARENT, ANN, CAT),)
    middle = ((KNOWS, ANN, CAT),)
    assert both(engines, ((KNOWS, CAT, ANN),), path=(start, middle)) == []  # knows(ann, cat) again: dropped
    assert [d.state for d in both(engines, ((KNOWS, CAT, ANN),))] == [middle]  # without that path it is derived


def test_the_query_triple_is_not_a_fact_while_proving_it(engines):
    reference, _ = engines
    query = ((KNOWS, ANN, CAT),)
    assert [d.kind for d in both(engines, query, excluded=(KNOWS, ANN, CAT))] == [RULE]
    assert proof_depth(reference, query, 4) == 1
    # Excluded at every depth: knows(ann,cat) <- knows(cat,ann) <- knows(ann,cat) is cut by the path, so unprovable.
    assert proof_depth(reference, query, 4, excluded=(KNOWS, ANN, CAT)) is None


def test_search_depths_best_proofs_and_open_queries(engines):
    reference, vector = engines
    query = ((GRANDPARENT, ANN, CAT),)
    assert proof_depth(reference, query, 1) is None
    assert proof_depth(reference, query, 4) == 2  # via knows(ann, cat): rule, fact
    proofs = search(reference, query, 4)
    best = best_proofs(proofs)[None]
    assert best.depth == 3 and best.log_confidence == pytest.approx(math.log(0.9))  # the chain beats 0.5
    assert [(d.kind, d.index) for d in best.steps] == [(RULE, 0), (FACT, 0), (FACT, 1)]
    start = open_query_state(ANN, GRANDPARENT, E, R)
    assert start == ((GRANDPARENT, ANN, V0), (ANSWER, V0, V0))
    answers = {a: round(math.exp(p.log_confidence), 6) for a, p in best_proofs(search(reference, start, 4)).items()}
    assert answers == {CAT: 0.9, DAN: 0.9}
    result = vector_search(vector, eager_deriver(vector), pad_states([query, start], 4, R), 4, open_queries=True)
    assert result.depth.tolist() == [2, 2]  # the open query's shortest proof: knows(ann, cat) answers cat
    assert torch.exp(result.log_confidence).tolist() == pytest.approx([0.9, 0.9])
    assert torch.exp(result.answers[1]).tolist() == pytest.approx([0.0, 0.0, 0.9, 0.9])  # exp(-inf) = 0: no proof


@pytest.mark.parametrize("shapes, state, expected", [
    (EngineShapes(max_atoms=4, max_states=1), ((GRANDPARENT, ANN, CAT),), (1, 0, 0)),  # two derived, room for one
    # The chain rule's two body atoms and the remaining goal do not fit in two atoms; knows(ann, cat) does.
    (EngineShapes(max_atoms=2), ((GRANDPARENT, ANN, CAT), (KNOWS, ANN, CAT)), (0, 1, 0)),
])
def test_overflow_is_counted_the_same_by_both_engines(shapes, state, expected):
    reference, vector = ReferenceEngine(TRIPLES, RULES, E, shapes), VectorEngine(TRIPLES, RULES, E, shapes)
    assert reference.derive(state).overflow == expected
    assert vector_derive(vector, state)[3] == expected


def test_a_goal_with_two_free_variables_reads_at_most_max_facts():
    shapes = EngineShapes(max_atoms=4, max_facts=2)
    reference, vector = ReferenceEngine(TRIPLES, RULES, E, shapes), VectorEngine(TRIPLES, RULES, E, shapes)
    state = ((PARENT, V0, V1),)  # three parent facts, two are read
    found = reference.derive(state)
    assert [d.index for d in found.derived] == [0, 1] and found.overflow == (0, 0, 1)
    assert vector_derive(vector, state) == ([(), ()], [0, 1], [0.0, 0.0], (0, 0, 1))
