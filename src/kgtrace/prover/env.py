"""The proof environment, as pure functions over tensors.

An episode proves one query. Its state (`EnvState`) is the current goal list with its
bookkeeping: the path so far (for the engine's no-revisit check), the fact excluded while
proving it (a training query's own triple), the step count, whether it ended and how, the log
confidence of the rules used, and the derived states of the current state: the actions. An
action is the index of one derived state. Only derived states that can still become proofs
are offered (`feasible`: a state with g goals needs g more steps, the pruning of the
search). The episode succeeds when the chosen state has no goal left; it fails when no
feasible derived state exists or after ``max_steps`` steps.

`env_reset` and `env_step` are pure (new tensors, inputs untouched); an ended
row stays as it is. `rollout` unrolls ``max_steps`` steps in Python (a fixed number, so
``torch.compile`` sees one straight-line graph), choosing actions with a policy and the
Gumbel-max trick on noise given as an input, so that sampling needs no generator inside the
graph: the same noise gives the same episode, compiled or eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from kgtrace.prover.engine import Derived
from kgtrace.prover.search import Deriver, start_history

__all__ = ["EnvState", "Trajectory", "env_reset", "env_step", "rollout"]


class EnvState(NamedTuple):
    states: Tensor  # [N, A, 3] current goals
    history: Tensor  # [N, H, A, 3] the path, the current state last; -1 after it
    excluded: Tensor  # [N, 3] (r, h, t) that is not a fact for this episode, or -1s
    steps: Tensor  # [N] long: steps taken
    done: Tensor  # [N] bool: ended
    success: Tensor  # [N] bool: ended with a proof
    log_confidence: Tensor  # [N] sum of the log confidences of the rules used
    derived: Derived  # the actions: derived states of ``states``


def feasible(derived: Derived, steps: Tensor, max_steps: int, num_relations: int) -> Derived:
    """Only derived states that can still become proofs: g goals need g more steps (the search's pruning).

    steps [N]: steps taken before the action; after it max_steps - steps - 1 remain.
    """
    remaining = (max_steps - steps - 1).view(-1, 1)
    return derived._replace(valid=derived.valid & (_goals(derived.states, num_relations) <= remaining))


def env_reset(derive: Deriver, states: Tensor, excluded: Tensor, max_steps: int, num_relations: int) -> EnvState:
    """Episodes starting at canonical states [N, A, 3]; an episode with no feasible derived state has failed."""
    history = start_history(states, max_steps + 1)
    zeros = torch.zeros(len(states), dtype=torch.long, device=states.device)
    derived = feasible(derive(states, history, excluded), zeros, max_steps, num_relations)
    done = ~derived.valid.any(1)
    return EnvState(states, history, excluded, zeros, done, torch.zeros_like(done),
                    torch.zeros(len(states), device=states.device), derived)


def env_step(derive: Deriver, env: EnvState, action: Tensor, max_steps: int, num_relations: int) -> EnvState:
    """Take ``action`` [N] (an index of a valid derived state) in every running episode."""
    rows = torch.arange(len(action), device=action.device)
    running = ~env.done
    chosen = env.derived.states[rows, action]  # [N, A, 3]
    states = torch.where(running.view(-1, 1, 1), chosen, env.states)
    steps = env.steps + running.long()
    slot = steps.clamp(max=env.history.shape[1] - 1).view(-1, 1, 1, 1).expand(-1, 1, *states.shape[1:])
    history = env.history.scatter(1, slot, states.unsqueeze(1))  # the new state joins the path
    history = torch.where(running.view(-1, 1, 1, 1), history, env.history)
    proved = running & (_goals(states, num_relations) == 0)
    log_confidence = env.log_confidence + torch.where(running, env.derived.log_confidence[rows, action], 0.0)
    derived = feasible(derive(states, history, env.excluded), steps, max_steps, num_relations)
    stuck = running & ~proved & (~derived.valid.any(1) | (steps >= max_steps))
    return EnvState(states, history, env.excluded, steps, env.done | proved | stuck, env.success | proved,
                    log_confidence, derived)


def _goals(states: Tensor, num_relations: int) -> Tensor:
    return (states[..., 0] < num_relations).sum(-1)  # answer (R) and padding (R + 1) atoms are not goals


class Trajectory(NamedTuple):
    """What a rollout saw and did, per step t < T = max_steps (rows that had ended are masked)."""

    states: Tensor  # [N, T, A, 3] the state acted in
    derived: Tensor  # [N, T, S, A, 3] its derived states
    valid: Tensor  # [N, T, S]
    rule_log_confidence: Tensor  # [N, T, S] log confidence of each derived state's step (0 for facts)
    action: Tensor  # [N, T] the index of the chosen derived state
    step: Tensor  # [N, T] the engine's id of that step: fact id, or N + rule index
    log_prob: Tensor  # [N, T] of the action under the policy that chose it
    value: Tensor  # [N, T] the policy's value of the state
    acted: Tensor  # [N, T] bool: the episode was running at step t
    success: Tensor  # [N]
    steps: Tensor  # [N]
    log_confidence: Tensor  # [N]
    overflow: Tensor  # [N, 3] what the engine's shapes lost in the episode's steps: states, atoms, facts


Policy = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
"""(states [N, A, 3], derived [N, S, A, 3], valid [N, S], step log confidences [N, S], excluded facts [N, 3])
-> (masked logits [N, S], value [N])."""


def rollout(policy: Policy, derive: Deriver, states: Tensor, excluded: Tensor, noise: Tensor, *, max_steps: int,
            num_relations: int) -> Trajectory:
    """Run every episode for max_steps steps (ended ones idle): actions argmax(logits + noise).

    noise [N, max_steps, S]: Gumbel noise for sampling, zeros for the greedy policy.
    """
    env = env_reset(derive, states, excluded, max_steps, num_relations)
    overflow = env.derived.overflow
    seen: dict[str, list[Tensor]] = {k: [] for k in Trajectory._fields[:9]}
    for t in range(max_steps):
        logits, value = policy(env.states, env.derived.states, env.derived.valid, env.derived.log_confidence,
                               env.excluded)
        action = torch.argmax(logits + noise[:, t], dim=1)
        log_prob = torch.log_softmax(logits, dim=1).gather(1, action.unsqueeze(1)).squeeze(1)
        step = env.derived.action.gather(1, action.unsqueeze(1)).squeeze(1)
        for key, x in zip(seen, (env.states, env.derived.states, env.derived.valid, env.derived.log_confidence, action,
                                 step, log_prob, value, ~env.done)):
            seen[key].append(x)
        running = ~env.done
        env = env_step(derive, env, action, max_steps, num_relations)
        overflow = overflow + env.derived.overflow * running.unsqueeze(1)  # steps of running episodes only
    stacked = {k: torch.stack(v, 1) for k, v in seen.items()}
    return Trajectory(**stacked, success=env.success, steps=env.steps, log_confidence=env.log_confidence,
                      overflow=overflow)


class Beams(NamedTuple):
    """The result of a beam search per query [Q]: its most probable proof, if any, and what all found proofs say."""

    success: Tensor  # [Q] bool
    log_prob: Tensor  # [Q] log probability of the most probable proof found (-inf: none)
    value: Tensor  # [Q] the policy's value of the start state
    step: Tensor  # [Q, T] the engine's step ids of the most probable proof (-1 after its end)
    states: Tensor  # [Q, T, A, 3] the states it went through
    length: Tensor  # [Q] its steps
    overflow: Tensor  # [Q, 3] what the engine's shapes lost in all of the query's beams: states, atoms, facts
    log_confidence: Tensor  # [Q] the most confident proof found: sum of its rules' log confidences (-inf: none)
    support: Tensor  # [Q] noisy-or over the first steps of the found proofs of the best confidence through each


class _Frontier(NamedTuple):
    """The ``W`` partial proofs a beam search keeps per query (rows [Q W]: query-major)."""

    states: Tensor  # [Q W, A, 3] their current goals
    history: Tensor  # [Q W, T + 1, A, 3] their paths (for the engine's no-revisit check)
    log_prob: Tensor  # [Q, W] under the policy; -inf: an empty beam
    confidence: Tensor  # [Q, W] sum of the log confidences of their rules
    first: Tensor  # [Q, W] long: their first step, a slot of the query's derived states
    steps: Tensor  # [Q, W, T] the engine's step ids so far (-1 after)
    visited: Tensor  # [Q, W, T, A, 3] the states they went through


class _Candidates(NamedTuple):
    """Every derived state of every beam, as a one-step extension of it (columns [W S]: beam-major)."""

    log_prob: Tensor  # [Q, W S] -inf: invalid, or from an empty beam
    proved: Tensor  # [Q, W S] bool: no goal left
    confidence: Tensor  # [Q, W S]
    first: Tensor  # [Q, W S] long
    action: Tensor  # [Q, W, S] the engine's step ids
    states: Tensor  # [Q, W, S, A, 3]


class _Found(NamedTuple):
    """What the proofs completed so far say, per query."""

    log_prob: Tensor  # [Q] the most probable one's (-inf: none)
    step: Tensor  # [Q, T] its step ids
    states: Tensor  # [Q, T, A, 3] its states
    length: Tensor  # [Q]
    by_first: Tensor  # [Q, S] the best log confidence through each first step (-inf: none)


def beam_search(policy: Policy, derive: Deriver, states: Tensor, excluded: Tensor, *, width: int, max_steps: int,
                num_relations: int) -> Beams:
    """Keep the ``width`` most probable partial proofs of each query for max_steps steps; note the proofs found.

    A beam that reaches a proof leaves the beam (it is recorded): the most probable proof
    found, the most confident one (rule confidences multiplied), and for each first step
    (derived state of the query) the most confident proof through it, aggregated by noisy-or:
    1 - prod(1 - c) (AnyBURL's aggregation over rules: groundings of one rule count once).
    Fixed shapes throughout: [Q W] states per step, a top-k over [Q, W S] candidates.
    """
    Q, W = len(states), width
    frontier = _start_frontier(states, W, max_steps)
    banned = excluded.repeat_interleave(W, 0)  # [Q W, 3]
    overflow = torch.zeros(Q, 3, dtype=torch.long, device=states.device)
    for t in range(max_steps):
        taken = torch.full((Q * W,), t, dtype=torch.long, device=states.device)
        derived = feasible(derive(frontier.states, frontier.history, banned), taken, max_steps, num_relations)
        live = (frontier.log_prob > float("-inf")).view(-1, 1)  # beams that hold a partial proof
        overflow = overflow + (derived.overflow * live).view(Q, W, 3).sum(1)
        logits, values = policy(frontier.states, derived.states, derived.valid, derived.log_confidence, banned)
        if t == 0:  # the start state's value; the number of derived states S is known from here on
            value = values.view(Q, W)[:, 0]
            found = _nothing_found(frontier, logits.shape[1])
        candidates = _candidates(frontier, derived, logits, t, num_relations)
        found = _record(found, frontier, candidates, t)
        frontier = _advance(frontier, candidates, t)
    support = 1.0 - torch.log1p(-found.by_first.exp()).sum(1).exp()  # exp(-inf) = 0: a first step with no proof adds 0
    return Beams(found.log_prob > float("-inf"), found.log_prob, value, found.step, found.states, found.length,
                 overflow, found.by_first.max(1).values, support)


def _start_frontier(states: Tensor, width: int, max_steps: int) -> _Frontier:
    """Each query's start state in ``width`` beams, only the first of them live."""
    Q, A, W, T = states.shape[0], states.shape[1], width, max_steps
    beams = states.repeat_interleave(W, 0)  # [Q W, A, 3]
    log_prob = torch.full((Q, W), float("-inf"), device=states.device)
    log_prob[:, 0] = 0.0
    steps = torch.full((Q, W, T), -1, dtype=torch.long, device=states.device)
    visited = beams.view(Q, W, 1, A, 3).repeat(1, 1, T, 1, 1)  # [Q, W, T, A, 3]
    return _Frontier(beams, start_history(beams, T + 1), log_prob, torch.zeros(Q, W, device=states.device),
                     torch.zeros(Q, W, dtype=torch.long, device=states.device), steps, visited)


def _nothing_found(frontier: _Frontier, num_slots: int) -> _Found:
    Q, device = frontier.log_prob.shape[0], frontier.states.device
    return _Found(torch.full((Q,), float("-inf"), device=device), torch.full_like(frontier.steps[:, 0], -1),
                  frontier.visited[:, 0].clone(), torch.zeros(Q, dtype=torch.long, device=device),
                  torch.full((Q, num_slots), float("-inf"), device=device))


def _candidates(frontier: _Frontier, derived: Derived, logits: Tensor, t: int, num_relations: int) -> _Candidates:
    """The one-step extensions of every beam at step ``t``, scored by the policy."""
    Q, W = frontier.log_prob.shape
    S, A = logits.shape[1], frontier.states.shape[1]
    log_prob = frontier.log_prob.view(-1, 1) + torch.log_softmax(logits, 1)  # [Q W, S]
    log_prob = log_prob.masked_fill(~derived.valid, float("-inf")).view(Q, W * S)
    proved = (_goals(derived.states, num_relations) == 0).view(Q, W * S)
    confidence = (frontier.confidence.view(-1, 1) + derived.log_confidence).view(Q, W * S)
    # At t = 0 every beam is the query itself, so a candidate's first step is its own slot.
    slots = torch.arange(S, device=logits.device).view(1, 1, S).expand(Q, W, S)
    first = (slots if t == 0 else frontier.first.view(Q, W, 1).expand(Q, W, S)).reshape(Q, W * S)
    return _Candidates(log_prob, proved, confidence, first, derived.action.view(Q, W, S),
                       derived.states.view(Q, W, S, A, 3))


def _record(found: _Found, frontier: _Frontier, c: _Candidates, t: int) -> _Found:
    """Add the proofs completed at step ``t``: the best confidence per first step, and the most probable proof."""
    Q, S = c.action.shape[0], c.action.shape[2]
    rows = torch.arange(Q, device=c.log_prob.device)
    completed = c.proved & (c.log_prob > float("-inf"))
    by_first = found.by_first.scatter_reduce(1, c.first, torch.where(completed, c.confidence, float("-inf")), "amax")
    log_prob, at = torch.where(c.proved, c.log_prob, float("-inf")).max(1)  # [Q] the most probable one
    better = log_prob > found.log_prob
    beam, slot = at // S, at % S
    path = frontier.steps[rows, beam].clone()  # [Q, T]
    path[:, t] = c.action[rows, beam, slot]
    trail = frontier.visited[rows, beam].clone()  # [Q, T, A, 3]
    trail[:, t] = c.states[rows, beam, slot]
    return _Found(torch.where(better, log_prob, found.log_prob), torch.where(better.view(Q, 1), path, found.step),
                  torch.where(better.view(Q, 1, 1, 1), trail, found.states),
                  torch.where(better, t + 1, found.length), by_first)


def _advance(frontier: _Frontier, c: _Candidates, t: int) -> _Frontier:
    """The next beams: each query's ``W`` most probable unfinished candidates."""
    Q, W, S = c.action.shape
    A, T = frontier.states.shape[1], frontier.steps.shape[2]
    rows = torch.arange(Q, device=c.log_prob.device).view(Q, 1)
    top, index = c.log_prob.masked_fill(c.proved, float("-inf")).topk(W, dim=1)  # [Q, W]
    beam, slot = index // S, index % S
    flat = (rows * W + beam).view(-1)  # [Q W] rows of the previous beams
    chosen = c.states[rows, beam, slot].view(Q * W, A, 3)
    steps = frontier.steps.view(Q * W, T)[flat].view(Q, W, T).clone()
    steps[:, :, t] = c.action[rows, beam, slot]
    visited = frontier.visited.view(Q * W, T, A, 3)[flat].view(Q, W, T, A, 3).clone()
    visited[:, :, t] = chosen.view(Q, W, A, 3)
    history = frontier.history[flat].clone()  # [Q W, T + 1, A, 3]
    history[:, t + 1] = chosen
    return _Frontier(chosen, history, top, c.confidence.gather(1, index), c.first.gather(1, index), steps, visited)
