"""The reference engine: SLD resolution written to be read, one state at a time.

A resolution step on a state (see `kgtrace.prover.logic` for the encoding):

1. Select the first goal G. The answer atom of an open query is never selected (it has no
   facts and no rules), so a state holding only it, or nothing, is a proof and derives nothing.
2. Facts: for every fact f (the training triples, minus the excluded one) that unifies with G,
   the remaining goals under the unifier make a derived state.
3. Rules: for every rule whose head relation is G's, in rule-file order, the rule's variables
   are renamed apart (fresh variables after the state's), its head is unified with G, and its
   body followed by the remaining goals, under the unifier, makes a derived state. The body is
   taken in file order, except when only G's second argument is bound: then in reverse order,
   so that a chain r(X,Y) :- s(X,Z), t(Z,Y) asked as r(V, c) continues with t(Z, c), a goal
   with a constant, instead of s(V, Z), which would enumerate all of s.
4. Every derived state is made canonical (variables renumbered by first occurrence), and a
   derived state equal to a state on the path that led here (the current one included) is
   dropped: no state is revisited on a path.

The canonical order of the derived states: first the fact steps, facts in ascending
(relation, head, tail) order (their ids, `fact_atoms`), then the
rule steps in rule order. The vectorised engine produces exactly this list.

Limits. Given `EngineShapes`, the reference applies the
vectorised engine's limits the same way and reports the same overflow counts: a goal reads at
most max_facts candidate facts (the first of its look-up range: the exact fact, or the facts
r(h, *), r(*, t) or r(*, *), ascending); a rule step whose state would exceed max_atoms is
dropped; after the path check, derived states past max_states are dropped. Without limits
nothing is ever dropped.

Search (`search`) is breadth-first to a depth limit d (resolution steps): a state that
still has g goals after k steps needs at least g more steps, so it is expanded only while
g <= d - k. That prunes nothing a proof within d needs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor

from kgtrace.prover.logic import (
    Atom,
    EngineShapes,
    State,
    answer_of,
    canonical,
    fact_atoms,
    is_proved,
    is_variable,
    num_goals,
    resolve_shapes,
)
from kgtrace.prover.rules import RuleSet

FACT, RULE = "fact", "rule"


@dataclass(frozen=True)
class Derivation:
    """A derived state and the step that made it."""

    state: State
    kind: str  # FACT or RULE
    index: int  # the fact's id or the rule's index
    log_confidence: float  # 0 for a fact, log(confidence) for a rule

    def action(self, num_facts: int) -> int:
        """The step as one id, as the vectorised engine reports it: fact id, or num_facts + rule index."""
        return self.index if self.kind == FACT else num_facts + self.index


class Derivations(NamedTuple):
    derived: list[Derivation]  # in canonical order
    overflow: tuple[int, int, int]  # lost to max_states, to max_atoms, fact candidates lost to max_facts


@dataclass(frozen=True)
class Proof:
    """A path from a query to a proved state."""

    steps: tuple[Derivation, ...]
    log_confidence: float  # sum of the rules' log confidences
    answer: int | None  # the entity an open query was answered with; None for a ground query

    @property
    def depth(self) -> int:
        return len(self.steps)


class ReferenceEngine:
    """SLD resolution over facts (training triples [n, 3] as (h, r, t)) and rules; limits: see the module docstring."""

    def __init__(self, triples: Tensor, rules: RuleSet, num_entities: int, limits: EngineShapes | None = None):
        self.num_entities = num_entities
        self.num_relations = rules.num_relations
        self.rules = rules.rules
        rules.require_variables()  # SLD resolution unifies variables; constants are rule application's
        facts = fact_atoms(triples)
        self.limits = resolve_shapes(limits, facts, rules) if limits is not None else None
        self.facts: list[Atom] = [tuple(atom) for atom in facts.tolist()]
        self.num_facts = len(self.facts)
        # Fact ids by what a goal may have bound; every list ascends in fact id.
        self.by_relation: dict[int, list[int]] = {}
        self.by_head: dict[tuple[int, int], list[int]] = {}
        self.by_tail: dict[tuple[int, int], list[int]] = {}
        self.fact_id: dict[Atom, int] = {}
        for i, (r, h, t) in enumerate(self.facts):
            self.by_relation.setdefault(r, []).append(i)
            self.by_head.setdefault((r, h), []).append(i)
            self.by_tail.setdefault((r, t), []).append(i)
            self.fact_id[(r, h, t)] = i
        self.rules_by_head = rules.by_head()

    # ------------------------------------------------------------------------- one step

    def derive(self, state: State, path: Iterable[State] = (), excluded: Atom | None = None) -> Derivations:
        """The derived states of ``state`` in canonical order; ``path``: the states already visited."""
        if not state or state[0][0] >= self.num_relations:  # proved, or only the answer atom is left
            return Derivations([], (0, 0, 0))
        goal, rest = state[0], state[1:]
        candidates = self._candidate_facts(goal)
        lost_facts = max(0, len(candidates) - self.limits.max_facts) if self.limits else 0
        derived = []
        for i in candidates[: len(candidates) - lost_facts]:
            if self.facts[i] == excluded:
                continue
            unifier = unify(goal, self.facts[i], {}, self.num_entities)
            if unifier is not None:
                derived.append(Derivation(self._canonical(substitute(rest, unifier, self.num_entities)), FACT, i, 0.0))
        lost_atoms = 0
        first_free = 1 + max((term for atom in state for term in atom[1:] if is_variable(term, self.num_entities)),
                             default=self.num_entities - 1)  # rule variables are renamed to start here
        reverse = is_variable(goal[1], self.num_entities) and not is_variable(goal[2], self.num_entities)
        for j in self.rules_by_head[goal[0]]:
            head, body = self._renamed_apart(j, first_free)
            body = body[::-1] if reverse else body
            unifier = unify(goal, head, {}, self.num_entities)
            if unifier is None:
                continue
            new = substitute(body + rest, unifier, self.num_entities)
            if self.limits and len(new) > self.limits.max_atoms:
                lost_atoms += 1
                continue
            derived.append(Derivation(self._canonical(new), RULE, j, math.log(self.rules[j].confidence)))
        visited = set(path) | {state}
        derived = [d for d in derived if d.state not in visited]
        lost_states = max(0, len(derived) - self.limits.max_states) if self.limits else 0
        return Derivations(derived[: len(derived) - lost_states], (lost_states, lost_atoms, lost_facts))

    def _candidate_facts(self, goal: Atom) -> list[int]:
        """Ids of the facts that may unify with ``goal`` (unify decides), ascending."""
        r, a, b = goal
        a_var, b_var = is_variable(a, self.num_entities), is_variable(b, self.num_entities)
        if not a_var and not b_var:
            found = self.fact_id.get(goal)
            return [] if found is None else [found]
        if not a_var:
            return self.by_head.get((r, a), [])
        if not b_var:
            return self.by_tail.get((r, b), [])
        return self.by_relation.get(r, [])

    def _renamed_apart(self, j: int, first_free: int) -> tuple[Atom, tuple[Atom, ...]]:
        """Rule j's head and body with its local variable k renamed to the variable first_free + k."""
        rule = self.rules[j]
        head = (rule.head, first_free, first_free + 1)  # local variables 0 (X) and 1 (Y)
        body = tuple((relation, first_free + a, first_free + b) for relation, a, b in rule.body)
        return head, body

    def _canonical(self, state: State) -> State:
        return canonical(state, self.num_entities)


# ----------------------------------------------------------------------------- unification


def walk(term: int, unifier: dict[int, int]) -> int:
    """Follow variable bindings to the term a variable stands for."""
    while term in unifier:
        term = unifier[term]
    return term


def unify(x: Atom, y: Atom, unifier: dict[int, int], num_entities: int) -> dict[int, int] | None:
    """The most general unifier extending ``unifier`` that makes atoms x and y equal, or None."""
    if x[0] != y[0]:
        return None
    unifier = dict(unifier)
    for s, t in zip(x[1:], y[1:]):
        s, t = walk(s, unifier), walk(t, unifier)
        if s == t:
            continue
        if is_variable(s, num_entities):
            unifier[s] = t
        elif is_variable(t, num_entities):
            unifier[t] = s
        else:
            return None  # two different constants
    return unifier


def substitute(atoms: tuple[Atom, ...], unifier: dict[int, int], num_entities: int) -> State:
    return tuple((r, walk(a, unifier), walk(b, unifier)) for r, a, b in atoms)


# ----------------------------------------------------------------------------- search


@dataclass(frozen=True)
class _Node:
    state: State
    path: tuple[State, ...]  # the states before this one
    steps: tuple[Derivation, ...]
    log_confidence: float


def search(engine: ReferenceEngine, start: State, depth: int, excluded: Atom | None = None, *,
           first_only: bool = False) -> list[Proof]:
    """Every proof of ``start`` within ``depth`` steps, breadth first (shortest first).

    first_only: stop after the first level that holds a proof (its proofs are returned).
    """
    R = engine.num_relations
    frontier, proofs = [_Node(start, (), (), 0.0)], []
    for level in range(depth + 1):
        next_frontier = []
        for node in frontier:
            if is_proved(node.state, R):
                proofs.append(Proof(node.steps, node.log_confidence, answer_of(node.state, R)))
            elif level < depth and num_goals(node.state, R) <= depth - level:
                for d in engine.derive(node.state, node.path, excluded).derived:
                    next_frontier.append(_Node(d.state, node.path + (node.state,), node.steps + (d,),
                                               node.log_confidence + d.log_confidence))
        if first_only and proofs:
            break
        frontier = next_frontier
    return proofs


def proof_depth(engine: ReferenceEngine, start: State, depth: int, excluded: Atom | None = None) -> int | None:
    """The fewest steps that prove ``start`` (at most ``depth``), or None."""
    proofs = search(engine, start, depth, excluded, first_only=True)
    return proofs[0].depth if proofs else None


def best_proofs(proofs: list[Proof]) -> dict[int | None, Proof]:
    """The most confident proof per answer (the first found among equals: the shortest)."""
    best: dict[int | None, Proof] = {}
    for proof in proofs:
        if proof.answer not in best or proof.log_confidence > best[proof.answer].log_confidence:
            best[proof.answer] = proof
    return best
