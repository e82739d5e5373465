"""A prover run's explanation of a triple: its proof, step by step, with the rules and facts used."""

from __future__ import annotations

import math

from torch import Tensor

from kgtrace.core.errors import ConfigError
from kgtrace.prover.logic import Atom, atom_text, query_state, state_text
from kgtrace.prover.policy import policy_proof
from kgtrace.prover.proofs import Proofs, ProofStep, TripleProof
from kgtrace.prover.reference import FACT, Derivation, Proof, ReferenceEngine, best_proofs, search
from kgtrace.prover.rules import format_rule
from kgtrace.prover.run import ProverRun

__all__ = ["explain_proofs", "find_proof"]


def find_proof(run: ProverRun, triple: tuple[int, int, int]) -> Proof | None:
    """The proof the run scores a triple by: the best proof within depth (bfs), or the policy's (policy)."""
    if run.config.method == "policy":
        return policy_proof(run, triple)
    if run.config.method == "apply":
        raise ConfigError(["a rule application run (kgtrace prove apply) ranks by the rules that predict a triple, "
                           "not by a proof; fix: explain a kgtrace prove bfs run over the same rules"])
    engine = ReferenceEngine(run.dataset.train, run.rules, run.dataset.num_entities, run.config.shapes())
    return best_proofs(search(engine, query_state(triple), run.config.depth)).get(None)


def explain_proofs(run: ProverRun, triples: Tensor) -> Proofs:
    """Each triple [n, 3]'s proof by the run: labels, whether and how it is proved, the steps in order."""
    return Proofs(tuple(_triple_proof(run, (h, r, t)) for h, r, t in triples.tolist()))


def _triple_proof(run: ProverRun, triple: tuple[int, int, int]) -> TripleProof:
    ds = run.dataset
    entities = ds.entities.labels
    proof = find_proof(run, triple)
    steps, state = [], query_state(triple)
    for step in proof.steps if proof else ():
        steps.append(_step(run, step, state[0]))
        state = step.state
    h, r, t = triple
    return TripleProof(entities[h], ds.relations.labels[r], entities[t], ds.entity_name(entities[h]),
                       ds.entity_name(entities[t]), proof is not None, run.config.method, run.config.depth,
                       math.exp(proof.log_confidence) if proof else 0.0, tuple(steps))


def _step(run: ProverRun, step: Derivation, goal: Atom) -> ProofStep:
    """A proof step in labels: the goal it resolved, the fact or rule it used, the goals it left."""
    entities, relations = run.dataset.entities.labels, run.dataset.relations.labels
    after = state_text(step.state, entities, relations)
    if step.kind == FACT:
        fact = atom_text(run.engine.fact_atom(step.index), entities, relations)
        return ProofStep(atom_text(goal, entities, relations), step.kind, fact, None, None, after)
    rule = run.rules.rules[step.index]
    return ProofStep(atom_text(goal, entities, relations), step.kind, None, format_rule(rule, relations), rule.source,
                     after)
