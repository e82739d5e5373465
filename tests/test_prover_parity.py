"""Both engines agree on Nations, Kinships and UMLS: every test query, a corruption of each, and training
queries with their own triple excluded; the same derived states in the same order at every step of
seeded random trajectories, and the same provability at depths 1 to 4 (shortest proof depth).

The rules are each dataset's mined rules, capped at 6 per head relation so that the reference's
exhaustive search to depth 4 stays within the suite's budget; the engines' default shapes.
The compiled engine is compared with the eager one on a subset of Nations.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch
from mined import mined

from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.candidates import sample_corruptions
from kgtrace.evaluation.sides import side_queries
from kgtrace.prover.engine import VectorEngine, pad_states, unpad_states
from kgtrace.prover.logic import EngineShapes, query_state
from kgtrace.prover.reference import ReferenceEngine, proof_depth
from kgtrace.prover.search import compiled_deriver, eager_deriver, vector_search

DEPTH = 4
SHAPES = EngineShapes(max_atoms=6, max_history=DEPTH + 1)
TRAIN_QUERIES = 150
TEST_QUERIES = 200  # of each dataset's test split (UMLS has 661): the pure-Python reference engine sets the pace
CHUNK = 1024
RULES_PER_HEAD = 6


@functools.cache
def setup(name: str):
    ds, rules = mined(name, RULES_PER_HEAD)
    reference = ReferenceEngine(ds.train, rules, ds.num_entities, SHAPES)
    vector = VectorEngine(ds.train, rules, ds.num_entities, SHAPES)
    return ds, reference, vector, queries(ds)


def queries(ds) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int] | None]]:
    """(triples, excluded fact as an atom or None): test triples, one filtered corruption of each (tail side
    for even rows, head side for odd), and training triples proved without themselves."""
    known = AnswerIndex.build(ds.all_triples(), ds.num_relations)
    test = ds.test[:TEST_QUERIES]
    corrupted = test.clone()
    for side, column, rows in (("tail", 2, slice(0, None, 2)), ("head", 0, slice(1, None, 2))):
        sampled = sample_corruptions(side_queries(test[rows], ds.num_relations, side), known, ds.num_entities,
                                     num_corruptions=1, seed=0)
        corrupted[torch.arange(len(test))[rows][sampled.rows], column] = sampled.entities
    train = ds.train[:TRAIN_QUERIES]
    triples = torch.cat([test, corrupted, train]).tolist()
    excluded = [None] * (2 * len(test)) + [(r, h, t) for h, r, t in train.tolist()]
    return [tuple(t) for t in triples], excluded


def excluded_tensor(excluded: list) -> torch.Tensor:
    return torch.tensor([e if e is not None else (-1, -1, -1) for e in excluded], dtype=torch.long).view(-1, 3)


def vector_steps(vector: VectorEngine, states: list, paths: list, excluded: list):
    """One vectorised step of many states: per state (derived states, actions, log confidences, overflow)."""
    A, H, R = SHAPES.max_atoms, SHAPES.max_history, vector.num_relations
    out = []
    for start in range(0, len(states), CHUNK):
        rows = range(start, min(start + CHUNK, len(states)))
        history = torch.full((len(rows), H, A, 3), -1)
        for k, i in enumerate(rows):
            history[k, : len(paths[i]) + 1] = pad_states(paths[i] + [states[i]], A, R)
        derived = vector.derive(pad_states([states[i] for i in rows], A, R), history,
                                excluded_tensor([excluded[i] for i in rows]))
        for k in range(len(rows)):
            valid = derived.valid[k]
            out.append((unpad_states(derived.states[k][valid], R), derived.action[k][valid].tolist(),
                        derived.log_confidence[k][valid].tolist(), tuple(derived.overflow[k].tolist())))
    return out


@pytest.mark.parametrize("name", ["nations", "kinships", "umls"])
def test_engines_agree_step_by_step_and_on_provability(name):
    ds, reference, vector, (triples, excluded) = setup(name)
    # Seeded random trajectories of DEPTH steps: every step's derived states compared in order.
    states = [query_state(t) for t in triples]
    paths: list[list] = [[] for _ in triples]
    alive, compared, choose = list(range(len(triples))), 0, random.Random(0)
    for _ in range(DEPTH):
        got = vector_steps(vector, [states[i] for i in alive], [paths[i] for i in alive], [excluded[i] for i in alive])
        still = []
        for i, (vector_states, actions, log_conf, overflow) in zip(alive, got):
            expected = reference.derive(states[i], paths[i], excluded[i])
            assert vector_states == [d.state for d in expected.derived], (name, triples[i], states[i])
            assert actions == [d.action(reference.num_facts) for d in expected.derived]
            assert log_conf == pytest.approx([d.log_confidence for d in expected.derived], abs=1e-6)
            assert overflow == expected.overflow
            compared += len(vector_states)
            if vector_states:
                paths[i], states[i] = paths[i] + [states[i]], vector_states[choose.randrange(len(vector_states))]
                if states[i]:
                    still.append(i)
        alive = still
    assert compared > 10 * len(triples)
    # Provability at depths 1..DEPTH: the shortest proof, searched exhaustively by each engine.
    expected = [proof_depth(reference, query_state(t), DEPTH, e) for t, e in zip(triples, excluded)]
    result = vector_search(vector, eager_deriver(vector), pad_states([query_state(t) for t in triples], SHAPES.max_atoms,
                                                                       ds.num_relations),
                           DEPTH, excluded_tensor(excluded), first_only=True, chunk=CHUNK)
    assert result.depth.tolist() == [-1 if d is None else d for d in expected]
    for depth in range(1, DEPTH + 1):
        assert ((result.depth >= 0) & (result.depth <= depth)).tolist() == [d is not None and d <= depth
                                                                            for d in expected]
    depths = set(result.depth.tolist())
    assert -1 in depths and len(depths) >= 3  # unprovable queries and proofs of several lengths: the test can fail


def test_compiled_engine_equals_eager_on_a_subset():
    ds, reference, vector, (triples, excluded) = setup("nations")
    subset = list(range(0, len(triples), 5))[:100]
    starts = pad_states([query_state(triples[i]) for i in subset], SHAPES.max_atoms, ds.num_relations)
    banned = excluded_tensor([excluded[i] for i in subset])
    compiled = compiled_deriver(vector, 64)
    eager = eager_deriver(vector)
    history = torch.full((len(subset), SHAPES.max_history, SHAPES.max_atoms, 3), -1)
    history[:, 0] = starts
    for got, want in zip(compiled(starts, history, banned), eager(starts, history, banned)):
        assert torch.equal(got, want)
    for first_only in (True, False):
        got = vector_search(vector, compiled, starts, DEPTH, banned, first_only=first_only, chunk=256)
        want = vector_search(vector, eager, starts, DEPTH, banned, first_only=first_only, chunk=256)
        assert torch.equal(got.depth, want.depth) and torch.equal(got.log_confidence, want.log_confidence)
        assert torch.equal(got.overflow, want.overflow)
    stats = compiled.call.stats
    assert stats.compilations == 1 and stats.recompilations == 0 and stats.graph_breaks == 0
