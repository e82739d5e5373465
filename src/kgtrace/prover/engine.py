"""The vectorised engine: one SLD resolution step for a batch of states, in fixed shapes.

`VectorEngine.derive` computes, for each of B states, the same derived states in the
same canonical order as `derive` (see that
module for the semantics), as tensors whose shapes depend only on `EngineShapes`:

    states   [B, A, 3]      the current states: A atoms (relation, arg1, arg2), padded with
                            (R + 1, 0, 0); canonical (variables E + 0, E + 1, ... by first occurrence)
    history  [B, H, A, 3]   the states on each path (the current one included); unused slots -1
    excluded [B, 3]         the fact (r, h, t) that is not a fact for this state, or (-1, -1, -1)
 -> derived  [B, S, A, 3]   the first S derived states, in canonical order, padded
    valid    [B, S]         which of them exist
    action   [B, S]         the step: fact id, or N + rule index (N facts)
    log_conf [B, S]         0 for a fact step, log(confidence) for a rule step
    overflow [B, 3]         derived states lost to S, to A (too many atoms), fact candidates lost to F

There is no data-dependent Python control flow and no ``.item()``: a step is a fixed sequence
of tensor operations, so it compiles to one graph (`compiled_derive`, through
`kgtrace.compute.compile.CompiledCall`). Look-ups use precomputed indices:

* facts: two sorted key arrays, ``(r E + h) E + t`` and ``(r E + t) E + h``; a goal's
  matching facts are one contiguous range of one of them (``searchsorted`` of its lowest and
  highest key): exact key when both arguments are bound, ``(r, h, *)`` or ``(r, *, t)`` when
  one is, ``(r, *, *)`` when none is. Up to F candidates are read from the range start.
* rules: CSR by head relation (offsets [R + 2]); up to Rm = the most rules of any head. Each
  rule's body is stored twice, in file order and reversed; a goal whose second argument alone
  is bound takes the reversed one (as the reference does).

Candidates are laid out as [B, F + Rm] (facts, then rules), unified, made canonical, checked
against the history, and compacted to the front in order (cumsum + scatter). Whatever a
fixed shape cannot hold is counted in ``overflow``, never dropped silently; with the default
shapes (`EngineShapes`) only a goal with two free variables can
overflow F, and nothing overflows S.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from kgtrace.prover.logic import EngineShapes, fact_atoms, pad_relation, resolve_shapes
from kgtrace.prover.rules import RuleSet

__all__ = ["Derived", "EngineShapes", "VectorEngine", "atom_codes", "canonicalize", "pad_states", "unpad_states"]

OVERFLOW_KINDS = ("states", "atoms", "facts")
NO_FACT = -1  # excluded = (-1, -1, -1): nothing excluded; history slots filled with -1 never match a state


class Derived(NamedTuple):
    states: Tensor  # [B, S, A, 3]
    valid: Tensor  # [B, S] bool
    action: Tensor  # [B, S] long
    log_confidence: Tensor  # [B, S] float
    overflow: Tensor  # [B, 3] long: states, atoms, facts


class VectorEngine(nn.Module):
    """Fact and rule indices as buffers (``.to(device)`` moves them) and the batched step."""

    def __init__(self, triples: Tensor, rules: RuleSet, num_entities: int, shapes: EngineShapes | None = None):
        super().__init__()
        E, R = num_entities, rules.num_relations
        rules.require_variables()  # SLD resolution unifies variables; constants are rule application's
        self.num_entities, self.num_relations = E, R
        facts = fact_atoms(triples)  # [N, 3] (r, h, t), sorted: row = fact id
        self.num_facts = len(facts)
        r, h, t = facts.unbind(1)
        keys_head = (r * E + h) * E + t  # ascending, since facts are sorted by (r, h, t)
        keys_tail, by_tail = torch.sort((r * E + t) * E + h)
        # One sentinel past every real key, so that ranges are never empty-array edge cases.
        sentinel = torch.tensor([torch.iinfo(torch.long).max])
        self.register_buffer("keys_head", torch.cat([keys_head, sentinel]))
        self.register_buffer("keys_tail", torch.cat([keys_tail, sentinel]))
        self.register_buffer("tail_order", torch.cat([by_tail, torch.zeros(1, dtype=torch.long)]))  # keys_tail -> fact id
        self.register_buffer("fact_args", torch.cat([facts[:, 1:], torch.zeros(1, 2, dtype=torch.long)]))  # [N+1, 2]
        self._build_rules(rules)
        self.shapes = resolve_shapes(shapes or EngineShapes(), facts, rules)
        # A state of A atoms has at most 2A variables; a rule step adds its free ones before renumbering.
        self.num_variables = 2 * self.shapes.max_atoms + rules.max_free
        assert (R + 2) * (E + self.num_variables) ** 2 < 2**62, "atom codes would overflow int64"

    def _build_rules(self, rules: RuleSet) -> None:
        R, pad = rules.num_relations, pad_relation(rules.num_relations)
        order = sorted(range(len(rules)), key=lambda j: rules.rules[j].head)  # stable: file order within a head
        counts = torch.bincount(torch.tensor([rules.rules[j].head for j in order], dtype=torch.long), minlength=R + 2)
        offsets = torch.zeros(R + 3, dtype=torch.long)  # heads 0..R-1, then the answer and pad relations (no rules)
        offsets[1:] = torch.cumsum(counts[: R + 2], 0)
        max_body = rules.max_body
        body = torch.tensor([[pad, 0, 0]], dtype=torch.long).repeat(len(rules) + 1, max_body, 1)  # +1: a dummy row
        reversed_body = body.clone()
        for row, j in enumerate(order):
            atoms = rules.rules[j].body
            body[row, : len(atoms)] = torch.tensor(atoms)
            reversed_body[row, : len(atoms)] = torch.tensor(atoms[::-1])
        self.register_buffer("rule_offsets", offsets)
        self.register_buffer("rule_body", body)  # [NR + 1, Bm, 3] local variables
        self.register_buffer("rule_body_reversed", reversed_body)  # for goals whose second argument alone is bound
        self.register_buffer("rule_length", torch.tensor([len(rules.rules[j].body) for j in order] + [1]))
        self.register_buffer("rule_index", torch.tensor(order + [0], dtype=torch.long))  # row -> index in the file
        confidence = torch.tensor([rules.rules[j].confidence for j in order] + [1.0], dtype=torch.float64)
        self.register_buffer("rule_log_confidence", confidence.log().float())
        self.max_rules = int(counts.max()) if len(rules) else 0
        self.max_body = max_body

    def fact_atom(self, fact_id: int) -> tuple[int, int, int]:
        """The fact (r, h, t) with this id."""
        key = int(self.keys_head[fact_id])
        return key // self.num_entities ** 2, key // self.num_entities % self.num_entities, key % self.num_entities

    # ------------------------------------------------------------------------- the step

    def derive(self, states: Tensor, history: Tensor, excluded: Tensor) -> Derived:
        """One resolution step of every state; see the module docstring for shapes."""
        E, R, A = self.num_entities, self.num_relations, states.shape[1]
        pad = pad_relation(R)
        goal = states[:, 0]  # [B, 3]
        active = goal[:, 0] < R  # a selectable goal: not proved, not only the answer atom
        facts, fact_ok, fact_overflow = self._fact_candidates(goal, active, excluded)
        fact_states = self._apply_facts(states, goal, facts)  # [B, F, A, 3]
        rows, rule_ok = self._rule_rows(goal, active)  # [B, Rm] each
        rule_states, rule_atoms = self._apply_rules(states, goal, rows)  # [B, Rm, A, 3], [B, Rm]
        candidates = torch.cat([fact_states, rule_states], 1)  # [B, C = F + Rm, A, 3]
        candidates = canonicalize(candidates, E, pad, self.num_variables)
        atom_overflow = rule_ok & (rule_atoms > A)
        ok = torch.cat([fact_ok, rule_ok & ~atom_overflow], 1)  # [B, C]
        base = E + self.num_variables
        path = atom_codes(history, base).unsqueeze(1)  # [B, 1, H, A]
        seen = (atom_codes(candidates, base).unsqueeze(2) == path).all(-1).any(-1)  # [B, C]: on the path
        action = torch.cat([facts[2], self.num_facts + self.rule_index[rows]], 1)
        log_conf = torch.cat([torch.zeros_like(fact_ok, dtype=torch.float32), self.rule_log_confidence[rows]], 1)
        return self._compact(candidates, ok & ~seen, action, log_conf, atom_overflow.sum(1), fact_overflow)

    def _fact_candidates(self, goal: Tensor, active: Tensor, excluded: Tensor) -> tuple[tuple[Tensor, Tensor, Tensor],
                                                                                        Tensor, Tensor]:
        """((heads [B, F], tails [B, F], fact ids [B, F]), ok [B, F], lost candidates [B]) of each goal."""
        E, F = self.num_entities, self.shapes.max_facts
        relation, a, b = goal.unbind(1)
        relation = relation.clamp(max=self.num_relations - 1)  # inactive goals: any key, masked below
        a_var, b_var = a >= E, b >= E
        a_key, b_key = a.clamp(max=E - 1), b.clamp(max=E - 1)
        # The key range of each goal in keys_head, or in keys_tail when only the tail is bound.
        by_tail = a_var & ~b_var
        low = torch.where(~a_var & ~b_var, (relation * E + a_key) * E + b_key,
                          torch.where(~a_var, (relation * E + a_key) * E,
                                      torch.where(by_tail, (relation * E + b_key) * E, relation * E * E)))
        width = torch.where(~a_var & ~b_var, 1, torch.where(a_var & b_var, E * E, E))
        start = torch.where(by_tail, torch.searchsorted(self.keys_tail, low),
                            torch.searchsorted(self.keys_head, low))
        stop = torch.where(by_tail, torch.searchsorted(self.keys_tail, low + width),
                           torch.searchsorted(self.keys_head, low + width))
        count = (stop - start) * active
        slot = torch.arange(F, device=goal.device)
        position = (start.unsqueeze(1) + slot).clamp(max=self.num_facts)  # [B, F]; the sentinel row past the end
        fact_id = torch.where(by_tail.unsqueeze(1), self.tail_order[position], position)
        heads, tails = self.fact_args[fact_id].unbind(-1)  # [B, F] each
        ok = slot < count.unsqueeze(1)
        same_variable = (a_var & (a == b)).unsqueeze(1)  # r(V, V) matches only facts r(x, x)
        ok &= ~same_variable | (heads == tails)
        is_excluded = ((relation == excluded[:, 0]).unsqueeze(1) & (heads == excluded[:, 1:2])
                       & (tails == excluded[:, 2:3]))
        ok &= ~is_excluded
        return (heads, tails, fact_id), ok, (count - F).clamp(min=0)

    def _apply_facts(self, states: Tensor, goal: Tensor, facts: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """The remaining goals with the goal's variables bound to each fact: [B, F, A, 3]."""
        E = self.num_entities
        heads, tails, _ = facts
        rest = states[:, 1:].unsqueeze(1)  # [B, 1, A-1, 3]
        a, b = goal[:, 1].view(-1, 1, 1), goal[:, 2].view(-1, 1, 1)  # [B, 1, 1]
        h, t = heads.unsqueeze(-1), tails.unsqueeze(-1)  # [B, F, 1]
        args = rest[..., 1:]  # [B, 1, A-1, 2]

        def bind(arg: Tensor) -> Tensor:  # arg [B, 1, A-1] -> [B, F, A-1]
            return torch.where((arg == a) & (a >= E), h, torch.where((arg == b) & (b >= E), t, arg))

        relation = rest[..., 0].expand(-1, heads.shape[1], -1)  # [B, F, A-1]
        bound = torch.stack([relation, bind(args[..., 0]), bind(args[..., 1])], -1)  # [B, F, A-1, 3]
        padding = self._pad_atoms(bound.shape[:2] + (1,), states.device)
        return torch.cat([bound, padding], 2)

    def _rule_rows(self, goal: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
        """(rows of rule_body [B, Rm], which exist [B, Rm]) for each goal's relation."""
        relation = goal[:, 0].clamp(min=0, max=self.num_relations + 1)
        first = self.rule_offsets[relation]
        count = (self.rule_offsets[relation + 1] - first) * active
        slot = torch.arange(self.max_rules, device=goal.device)
        rows = (first.unsqueeze(1) + slot).clamp(max=len(self.rule_body) - 1)
        return rows, slot < count.unsqueeze(1)

    def _apply_rules(self, states: Tensor, goal: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
        """(states [B, Rm, A, 3], atoms each would have [B, Rm]): the rules' bodies, then the remaining goals."""
        E, pad = self.num_entities, pad_relation(self.num_relations)
        B, A = states.shape[:2]
        reverse = (goal[:, 1] >= E) & (goal[:, 2] < E)  # only the second argument bound: the body reversed
        body = torch.where(reverse.view(B, 1, 1, 1), self.rule_body_reversed[rows], self.rule_body[rows])  # [B, Rm, Bm, 3]
        # The state's variables are E .. E + n - 1 (canonical); the rule's free ones come after.
        args = states[..., 1:]
        is_var = (args >= E) & (states[..., :1] != pad)
        num_vars = torch.where(is_var, args - E + 1, 0).flatten(1).amax(1)  # [B]

        def bind(local: Tensor) -> Tensor:  # local [B, Rm, Bm] -> terms
            a, b = goal[:, 1].view(B, 1, 1), goal[:, 2].view(B, 1, 1)
            return torch.where(local == 0, a, torch.where(local == 1, b, E + num_vars.view(B, 1, 1) + local - 2))

        real = body[..., 0] != pad
        body = torch.stack([body[..., 0], torch.where(real, bind(body[..., 1]), 0),
                            torch.where(real, bind(body[..., 2]), 0)], -1)
        rest = states[:, 1:].unsqueeze(1).expand(-1, rows.shape[1], -1, -1)  # [B, Rm, A-1, 3]
        joined = torch.cat([body, rest], 2)  # [B, Rm, Bm + A - 1, 3]
        length = self.rule_length[rows]  # [B, Rm]
        # Atom p of the new state: body atom p while p < length, then remaining goal p - length.
        position = torch.arange(A, device=states.device).view(1, 1, A)
        source = torch.where(position < length.unsqueeze(-1), position, self.max_body + position - length.unsqueeze(-1))
        source = source.clamp(max=joined.shape[2] - 1)
        new = torch.gather(joined, 2, source.unsqueeze(-1).expand(-1, -1, -1, 3))  # [B, Rm, A, 3]
        num_atoms = (states[..., 0] != pad).sum(1)  # [B]
        return new, length + (num_atoms - 1).unsqueeze(1)

    def _compact(self, candidates: Tensor, keep: Tensor, action: Tensor, log_conf: Tensor, atom_overflow: Tensor,
                 fact_overflow: Tensor) -> Derived:
        """Move the kept candidates to the front, in order; count what does not fit in S."""
        B, C, A = candidates.shape[:3]
        S = self.shapes.max_states
        rank = torch.cumsum(keep.long(), 1) - 1  # [B, C]
        count = keep.sum(1)
        slot = torch.where(keep & (rank < S), rank, S)  # slot S collects everything dropped
        states = self._pad_atoms((B, S + 1, A), candidates.device)
        states = states.scatter(1, slot.view(B, C, 1, 1).expand(-1, -1, A, 3), candidates)[:, :S]
        actions = torch.zeros(B, S + 1, dtype=torch.long, device=candidates.device).scatter(1, slot, action)[:, :S]
        confidences = torch.zeros(B, S + 1, device=candidates.device).scatter(1, slot, log_conf)[:, :S]
        valid = torch.arange(S, device=candidates.device).unsqueeze(0) < count.clamp(max=S).unsqueeze(1)
        overflow = torch.stack([(count - S).clamp(min=0), atom_overflow, fact_overflow], 1)
        return Derived(states, valid, actions * valid, confidences * valid, overflow)

    def _pad_atoms(self, shape: tuple[int, ...], device: torch.device) -> Tensor:
        pad = torch.tensor([pad_relation(self.num_relations), 0, 0], device=device)
        return pad.expand(*shape, 3).clone()


def canonicalize(atoms: Tensor, num_entities: int, pad: int, num_variables: int) -> Tensor:
    """Renumber the variables of states [..., A, 3] as E + 0, E + 1, ... by first occurrence.

    num_variables: a bound on the variable numbers present (they are < E + num_variables).
    A scatter-min finds each variable's first position; a cumulative count of first
    positions, read at a variable's first position, is its new number.
    """
    shape = atoms.shape
    width = 2 * shape[-2]
    args = atoms[..., 1:].reshape(-1, width)  # [n, 2A] in reading order
    real = (atoms[..., 0] != pad).reshape(-1, shape[-2]).repeat_interleave(2, -1)  # [n, 2A]
    is_var = real & (args >= num_entities)
    number = torch.where(is_var, args - num_entities, num_variables)  # [n, 2A]; non-variables -> a spare slot
    position = torch.arange(width, device=atoms.device).expand_as(args)
    first = torch.full((len(args), num_variables + 1), width - 1, dtype=torch.long, device=atoms.device)
    first = first.scatter_reduce(1, number, position, "amin", include_self=True)  # [n, V + 1]
    first_here = torch.gather(first, 1, number)  # [n, 2A]: the first position of the variable at each position
    is_first = is_var & (first_here == position)
    order = torch.cumsum(is_first.long(), 1) - 1  # at a first position: how many variables appeared before, + 0
    renamed = torch.where(is_var, num_entities + torch.gather(order, 1, first_here), args)
    return torch.cat([atoms[..., :1], renamed.view(*shape[:-1], 2)], -1)


def atom_codes(states: Tensor, base: int) -> Tensor:
    """States [..., A, 3] -> one int64 per atom [..., A]: (relation * base + arg1) * base + arg2.

    base > every term (E + the variables); equal codes <=> equal atoms (history slots of -1 map
    to negative codes, which no state has).
    """
    return (states[..., 0] * base + states[..., 1]) * base + states[..., 2]


def pad_states(states: list[tuple[tuple[int, int, int], ...]], max_atoms: int, num_relations: int) -> Tensor:
    """Python states -> LongTensor [n, A, 3] padded with (R + 1, 0, 0); a longer state is a ValueError."""
    pad = (pad_relation(num_relations), 0, 0)
    rows = []
    for state in states:
        if len(state) > max_atoms:
            raise ValueError(f"a state of {len(state)} atoms does not fit max_atoms={max_atoms}")
        rows.append(list(state) + [pad] * (max_atoms - len(state)))
    return torch.tensor(rows, dtype=torch.long).view(len(states), max_atoms, 3)


def unpad_states(states: Tensor, num_relations: int) -> list[tuple[tuple[int, int, int], ...]]:
    """LongTensor [n, A, 3] -> Python states, padding atoms dropped (the inverse of `pad_states`)."""
    pad = pad_relation(num_relations)
    return [tuple(tuple(atom) for atom in rows if atom[0] != pad) for rows in states.tolist()]
