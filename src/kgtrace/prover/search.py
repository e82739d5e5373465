"""Breadth-first proof search with the vectorised engine, level by level.

The same search as `kgtrace.prover.reference.search` (same pruning: a state with g
goals after k of d steps is expanded only while g <= d - k), run on tensors: each level's
frontier of states, with each state's path (its history) and the query it belongs to, is
derived in chunks through a `Deriver` (the eager step or the compiled one), and the
derived states that may still lead to a proof within d steps form the next frontier.
Python loops over levels and chunks only; the step itself is the engine's fixed-shape one.

Results per query: the depth of its shortest proof, the log confidence of its best proof
(sum of its rules' log confidences), and for open queries the best per answer entity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from kgtrace.compute.compile import CompiledCall
from kgtrace.core.errors import ConfigError
from kgtrace.prover.engine import NO_FACT, Derived, VectorEngine
from kgtrace.prover.logic import answer_relation, pad_relation

__all__ = ["Deriver", "SearchResult", "compiled_deriver", "eager_deriver", "vector_search"]

Deriver = Callable[[Tensor, Tensor, Tensor], Derived]
"""(states [n, A, 3], history [n, H, A, 3], excluded [n, 3]) -> Derived, for any n."""


def eager_deriver(engine: VectorEngine) -> Deriver:
    return engine.derive


def compiled_deriver(engine: VectorEngine, batch_size: int, *, mode: str | None = None) -> Deriver:
    """The engine's step compiled once for ``batch_size`` states (static buffers; any n is split and padded)."""
    A, H = engine.shapes.max_atoms, engine.shapes.max_history
    device = engine.keys_head.device
    example = {"states": torch.zeros(1, A, 3, dtype=torch.long, device=device),
               "history": torch.zeros(1, H, A, 3, dtype=torch.long, device=device),
               "excluded": torch.zeros(1, 3, dtype=torch.long, device=device)}
    call = CompiledCall("prover_derive", _derive, batch_size, example, mode=mode)

    def derive(states: Tensor, history: Tensor, excluded: Tensor) -> Derived:
        return Derived(*call(engine, states=states, history=history, excluded=excluded))

    derive.call = call  # the CompiledCall, for its statistics
    return derive


def _derive(engine: VectorEngine, states: Tensor, history: Tensor, excluded: Tensor, valid: Tensor) -> tuple:
    # Padded rows (valid False) repeat the last real row: their results are sliced off by CompiledCall.
    return tuple(engine.derive(states, history, excluded))


@dataclass(frozen=True)
class SearchResult:
    """Per query [Q]: shortest proof depth (-1: none), best log confidence (-inf: none), overflow [Q, 3]."""

    depth: Tensor
    log_confidence: Tensor
    overflow: Tensor  # summed over the query's expansions: states, atoms, facts
    answers: Tensor | None  # open queries: best log confidence per answer entity [Q, E] (-inf: none)
    expanded: int  # states expanded in all


@dataclass(frozen=True)
class _Frontier:
    states: Tensor  # [n, A, 3]
    history: Tensor  # [n, H, A, 3]: the path, the state itself last; -1 after it
    query: Tensor  # [n] the query each state belongs to
    log_confidence: Tensor  # [n]


def start_history(states: Tensor, max_history: int) -> Tensor:
    """The history of start states [n, A, 3]: the state itself, then unused slots (-1)."""
    history = torch.full((len(states), max_history) + states.shape[1:], NO_FACT, dtype=torch.long,
                         device=states.device)
    history[:, 0] = states
    return history


def vector_search(engine: VectorEngine, derive: Deriver, starts: Tensor, depth: int, excluded: Tensor | None = None,
                  *, first_only: bool = False, open_queries: bool = False, chunk: int = 2048) -> SearchResult:
    """Search proofs of ``starts`` [Q, A, 3] (canonical states) within ``depth`` steps.

    excluded [Q, 3]: per query, the fact (r, h, t) that is not a fact (-1 rows: none).
    first_only: stop each query at its first level with a proof (provability only).
    open_queries: collect each proof's answer entity (states with the answer atom).
    """
    E, R = engine.num_entities, engine.num_relations
    H = engine.shapes.max_history
    if depth + 1 > H:
        raise ConfigError([f"depth={depth}: paths of {depth + 1} states need max_history >= {depth + 1} "
                           f"(it is {H}); fix: raise max_history or lower the depth"])
    device = starts.device
    Q = len(starts)
    excluded = torch.full((Q, 3), NO_FACT, dtype=torch.long, device=device) if excluded is None else excluded
    result_depth = torch.full((Q,), -1, dtype=torch.long, device=device)
    best = torch.full((Q,), float("-inf"), device=device)
    answers = torch.full((Q, E), float("-inf"), device=device) if open_queries else None
    overflow = torch.zeros(Q, 3, dtype=torch.long, device=device)
    frontier = _Frontier(starts, start_history(starts, H), torch.arange(Q, device=device),
                         torch.zeros(Q, device=device))
    expanded = 0
    for level in range(depth + 1):
        proved = _goals(frontier.states, R) == 0
        _record(frontier, proved, level, result_depth, best, answers, R)
        if level == depth:
            break
        keep = ~proved & (_goals(frontier.states, R) <= depth - level)
        if first_only:
            keep &= result_depth[frontier.query] < 0
        frontier = _take(frontier, keep)
        expanded += len(frontier.query)
        frontier = _expand(frontier, derive, excluded, level, overflow, chunk, depth - level - 1, R)
    return SearchResult(result_depth, best, overflow, answers, expanded)


def _goals(states: Tensor, num_relations: int) -> Tensor:
    """Goals per state [n]: atoms other than padding and the answer atom."""
    relation = states[..., 0]
    return ((relation != pad_relation(num_relations)) & (relation != answer_relation(num_relations))).sum(-1)


def _record(frontier: _Frontier, proved: Tensor, level: int, result_depth: Tensor, best: Tensor,
            answers: Tensor | None, num_relations: int) -> None:
    """Note the proofs among the frontier's states (in place)."""
    query, log_conf = frontier.query[proved], frontier.log_confidence[proved]
    first = result_depth[query] < 0
    result_depth[query[first]] = level
    best.scatter_reduce_(0, query, log_conf, "amax")
    if answers is not None:
        answer_atom = frontier.states[proved][:, 0]  # [p, 3]: a proved open query holds only ans(c, c)
        is_answer = answer_atom[:, 0] == answer_relation(num_relations)
        flat = answers.view(-1)
        flat.scatter_reduce_(0, query[is_answer] * answers.shape[1] + answer_atom[is_answer, 1],
                             log_conf[is_answer], "amax")


def _take(frontier: _Frontier, keep: Tensor) -> _Frontier:
    return _Frontier(frontier.states[keep], frontier.history[keep], frontier.query[keep],
                     frontier.log_confidence[keep])


def _expand(frontier: _Frontier, derive: Deriver, excluded: Tensor, level: int, overflow: Tensor,
            chunk: int, max_goals: int, num_relations: int) -> _Frontier:
    """Derive every frontier state (in chunks) and gather the derived states as the next frontier.

    Only derived states with at most ``max_goals`` goals (the steps left) are gathered: the next
    level would drop the others unexamined, and after the last step only proofs are left to note.
    """
    parts = []
    for start in range(0, len(frontier.query), chunk):
        part = _Frontier(*(x[start : start + chunk] for x in (frontier.states, frontier.history, frontier.query,
                                                                frontier.log_confidence)))
        out = derive(part.states, part.history, excluded[part.query])
        overflow.index_add_(0, part.query, out.overflow)
        promising = out.valid & (_goals(out.states, num_relations) <= max_goals)  # [n, S]
        row, slot = torch.nonzero(promising, as_tuple=True)  # in order: state by state, derived in canonical order
        states = out.states[row, slot]  # [m, A, 3]
        history = part.history[row].clone()  # [m, H, A, 3]
        history[:, level + 1] = states
        parts.append(_Frontier(states, history, part.query[row],
                               part.log_confidence[row] + out.log_confidence[row, slot]))
    if not parts:
        return frontier
    return _Frontier(*(torch.cat([getattr(p, name) for p in parts]) for name in
                       ("states", "history", "query", "log_confidence")))
