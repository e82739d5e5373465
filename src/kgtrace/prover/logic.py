"""Atoms, terms and proof states, shared by both engines.

Encoding (both engines and every tensor of the prover use it):

* A term is an int. Entities are constants ``0 .. E-1`` (the dataset's entity ids); variable
  number ``k`` is the int ``E + k``.
* An atom is ``(relation, arg1, arg2)``: note the order, relation first (a dataset triple
  ``(h, r, t)`` is the atom ``(r, h, t)``). Relations ``0 .. R-1`` are the dataset's.
  Two more relation ids exist only inside the prover: ``R`` is the *answer* atom
  ``ans(X)`` (see below) and ``R + 1`` pads fixed-size tensors.
* A state is the tuple of its goals (atoms), proved left to right. The empty state is a
  proof. A state is kept *canonical*: its variables are renumbered ``E + 0, E + 1, ...`` in
  the order of their first occurrence (goals left to right, arguments left to right), so
  two states equal up to variable names compare equal as tuples and as tensors.
* An open query ``r(h, ?)`` is the state ``(r(h, X), ans(X, X))``: ``ans`` has no facts and
  no rules, so it stays last and is never selected while other goals remain; a state whose
  only goal is ``ans(c, c)`` has proved ``r(h, c)``. (The answer atom repeats its argument so
  that every atom has two.)

Rules are Horn clauses ``r(X, Y) :- b1, ..., bn`` over binary atoms whose head has two
distinct variables, every head variable occurring in the body (range restriction). A rule
stores its body with *local* variables: ``0`` is the head's X, ``1`` its Y, and ``2, 3, ...``
the body-only variables in order of first occurrence.

Rules of AnyBURL's acyclic kinds hold constants: ``r(X, c) :- s(X, Y)`` and ``r(X, c) :- s(X, d)``
(or ``r(c, X)``). A constant entity e is the local term ``-1 - e`` (`constant_term`), in the head's
arguments (``Rule.head_args``, ``(0, 1)`` for a head over X and Y) and in the body. Only rule
application (`kgtrace.prover.apply`) reads such rules; the SLD engines take rules over variables.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from kgtrace.core.errors import ConfigError

Atom = tuple[int, int, int]  # (relation, arg1, arg2)
State = tuple[Atom, ...]

VARIABLE_NAMES = ("X", "Y", "Z", "W", "V", "U", "T", "S", "Q", "P")


def answer_relation(num_relations: int) -> int:
    """The relation id of the answer atom ans(X, X) of open queries."""
    return num_relations


def pad_relation(num_relations: int) -> int:
    """The relation id of padding atoms in fixed-size tensors."""
    return num_relations + 1


@dataclass(frozen=True)
class Rule:
    """``confidence  head(X, Y) :- body``; body atoms are (relation, local var, local var)."""

    head: int  # relation id of the head r(X, Y)
    body: tuple[Atom, ...]  # local variables: 0 = X, 1 = Y, 2.. body-only, numbered by first occurrence
    confidence: float  # in (0, 1]
    name: str = ""  # the prototype format's rule name, else "" (then the file:line names it)
    source: str = ""  # "FILE:LINE" it was read from, or "" for rules built in code
    head_args: tuple[int, int] = (0, 1)  # the head's local terms: X = 0, Y = 1, a constant -1 - entity

    @property
    def num_free(self) -> int:
        """Body-only variables (Z, W, ...)."""
        return max((v for atom in self.body for v in atom[1:]), default=1) - 1

    @property
    def has_constants(self) -> bool:
        """Whether the rule names an entity (AnyBURL's acyclic rules), in its head or body."""
        return any(term < 0 for term in self.head_args) or any(term < 0 for atom in self.body for term in atom[1:])


def constant_term(entity: int) -> int:
    """A rule's local term for the constant ``entity``: negative, apart from the variables 0, 1, 2, ..."""
    return -1 - entity


def constant_of(term: int) -> int:
    """The entity of a negative local term (`constant_term`'s inverse)."""
    return -1 - term


def is_variable(term: int, num_entities: int) -> bool:
    return term >= num_entities


def query_state(triple: tuple[int, int, int]) -> State:
    """The state of a ground query (h, r, t): the single goal r(h, t)."""
    h, r, t = triple
    return ((r, h, t),)


def open_query_state(anchor: int, relation: int, num_entities: int, num_relations: int) -> State:
    """The state of an open query: tails of (anchor, r, ?), or heads of (?, r - R, anchor) for r >= R."""
    answer = num_entities  # the variable X (number 0)
    goal = (relation, anchor, answer) if relation < num_relations else (relation - num_relations, answer, anchor)
    return canonical((goal, (answer_relation(num_relations), answer, answer)), num_entities)


def canonical(state: State, num_entities: int) -> State:
    """Rename the variables of ``state`` to E + 0, E + 1, ... in order of first occurrence."""
    names: dict[int, int] = {}
    out = []
    for relation, a, b in state:
        args = []
        for term in (a, b):
            if is_variable(term, num_entities):
                term = names.setdefault(term, num_entities + len(names))
            args.append(term)
        out.append((relation, args[0], args[1]))
    return tuple(out)


def num_goals(state: State, num_relations: int) -> int:
    """Goals still to prove: the answer atom does not count."""
    return sum(1 for atom in state if atom[0] != answer_relation(num_relations))


def is_proved(state: State, num_relations: int) -> bool:
    """No goal left (the answer atom of an open query may remain)."""
    return num_goals(state, num_relations) == 0


def answer_of(state: State, num_relations: int) -> int | None:
    """The entity a proved open query answered, None for a ground query."""
    for relation, a, _ in state:
        if relation == answer_relation(num_relations):
            return a
    return None


# ----------------------------------------------------------------------------- readable text


def term_text(term: int, entity_labels: tuple[str, ...]) -> str:
    num_entities = len(entity_labels)
    if not is_variable(term, num_entities):
        return entity_labels[term]
    k = term - num_entities
    return VARIABLE_NAMES[k] if k < len(VARIABLE_NAMES) else f"V{k}"


def atom_text(atom: Atom, entity_labels: tuple[str, ...], relation_labels: tuple[str, ...]) -> str:
    relation, a, b = atom
    if relation == answer_relation(len(relation_labels)):
        return f"answer({term_text(a, entity_labels)})"
    return f"{relation_labels[relation]}({term_text(a, entity_labels)}, {term_text(b, entity_labels)})"


def state_text(state: State, entity_labels: tuple[str, ...], relation_labels: tuple[str, ...]) -> str:
    if not state:
        return "(proved)"
    return ", ".join(atom_text(atom, entity_labels, relation_labels) for atom in state)


def fact_atoms(triples: Tensor) -> Tensor:
    """The facts as atoms, sorted and unique: LongTensor [N, 3] of (r, h, t) in (r, h, t) order.

    A fact's id is its row here; both engines name the fact a step used by this id.
    """
    h, r, t = triples.long().cpu().unbind(1)
    return torch.unique(torch.stack([r, h, t], 1), dim=0)  # unique(dim=0) sorts rows lexicographically


@dataclass(frozen=True)
class EngineShapes:
    """Limits of one resolution step: the vectorised engine's fixed shapes.

    0 for max_facts means the largest look-up with a bound argument (every goal with a
    constant then reads all its facts; a goal with two free variables reads the first
    max_facts facts of its relation and counts the rest as overflow); 0 for max_states means
    max_facts + the most rules of any head (nothing is ever lost to it). The reference
    engine applies the same limits when given them, so both count the same overflow.
    """

    max_atoms: int = 8  # A: atoms per state (the answer atom of an open query included)
    max_states: int = 0  # S: derived states kept per state
    max_facts: int = 0  # F: fact candidates read per goal
    max_history: int = 5  # H: states remembered per path (the current one included)

    def __post_init__(self) -> None:
        self.validate()  # a EngineShapes cannot be built invalid

    def validate(self) -> "EngineShapes":
        problems = [f"{key}={getattr(self, key)}: must be at least {low}"
                    for key, low in (("max_atoms", 2), ("max_history", 1), ("max_states", 0), ("max_facts", 0))
                    if getattr(self, key) < low]
        if problems:
            raise ConfigError(problems)
        return self


def resolve_shapes(shapes: EngineShapes, facts: Tensor, rules) -> EngineShapes:
    """Fill max_facts / max_states given as 0 (see EngineShapes) from facts [N, 3] (r, h, t) and a RuleSet."""
    shapes.validate()
    largest = 1
    for columns in ((0, 1), (0, 2)):  # goals r(h, V) and r(V, t)
        if len(facts):
            largest = max(largest, int(torch.unique(facts[:, columns], dim=0, return_counts=True)[1].max()))
    max_facts = shapes.max_facts or largest
    most_rules = max((len(heads) for heads in rules.by_head()), default=0)
    return replace(shapes, max_facts=max_facts, max_states=shapes.max_states or max_facts + most_rules)
