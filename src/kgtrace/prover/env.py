"""The proof environment, as pure functions over tensors.

An episode proves one query. Its state (:class:`EnvState`) is the current goal list with its
bookkeeping: the path so far (for the engine's no-revisit check), the fact excluded while
proving it (a training query's own triple), the step count, whether it ended and how, the log
confidence of the rules used, and the derived states of the current state: the actions. An
action is the index of one derived state. Only derived states that can still become proofs
are offered (:func:`feasible`: a state with g goals needs g more steps, the pruning of the
search). The episode succeeds when the chosen state has no goal left; it fails when no
feasible derived state exists or after ``max_steps`` steps.

:func:`env_reset` and :func:`env_step` are pure (new tensors, inputs untouched); an ended
row stays as it is. :func:`rollout` unrolls ``max_steps`` steps in Python (a fixed number, so
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


def beam_search(policy: Policy, derive: Deriver, states: Tensor, excluded: Tensor, *, width: int, max_steps: int,
                num_relations: int) -> Beams:
    """Keep the ``width`` most probable partial proofs of each query for max_steps steps; note the proofs found.

    A beam that reaches a proof leaves the beam (it is recorded): the most probable proof
    found, the most confident one (rule confidences multiplied), and for each first step
    (derived state of the query) the most confident proof through it, aggregated by noisy-or:
    1 - prod(1 - c) (AnyBURL's aggregation over rules: groundings of one rule count once).
    Fixed shapes throughout: [Q W] states per step, a top-k over [Q, W S] candidates.
    """
    Q, A = states.shape[:2]
    W, T, device = width, max_steps, states.device
    beams = states.repeat_interleave(W, 0)  # [Q W, A, 3]
    history = start_history(beams, T + 1)
    banned = excluded.repeat_interleave(W, 0)
    log_prob = torch.full((Q, W), float("-inf"), device=device)
    log_prob[:, 0] = 0.0  # one live beam at the start
    confidence = torch.zeros(Q, W, device=device)  # log confidence of each beam's rules so far
    first = torch.zeros(Q, W, dtype=torch.long, device=device)  # each beam's first step: a slot of the query's
    by_first = None  # [Q, S]: best log confidence of a proof through each first step
    steps = torch.full((Q, W, T), -1, dtype=torch.long, device=device)
    visited = beams.view(Q, W, 1, A, 3).repeat(1, 1, T, 1, 1)
    best = torch.full((Q,), float("-inf"), device=device)
    best_step = torch.full((Q, T), -1, dtype=torch.long, device=device)
    best_states = visited[:, 0].clone()
    best_length = torch.zeros(Q, dtype=torch.long, device=device)
    value = None
    overflow = torch.zeros(Q, 3, dtype=torch.long, device=device)
    rows = torch.arange(Q, device=device)
    for t in range(T):
        taken = torch.full((Q * W,), t, dtype=torch.long, device=device)
        derived = feasible(derive(beams, history, banned), taken, max_steps, num_relations)
        live = (log_prob > float("-inf")).view(-1, 1)  # beams that hold a partial proof
        overflow = overflow + (derived.overflow * live).view(Q, W, 3).sum(1)
        logits, values = policy(beams, derived.states, derived.valid, derived.log_confidence, banned)
        S = logits.shape[1]
        if value is None:
            value = values.view(Q, W)[:, 0]
            by_first = torch.full((Q, S), float("-inf"), device=device)
        candidate = log_prob.view(-1, 1) + torch.log_softmax(logits, 1)  # [Q W, S]
        candidate = candidate.masked_fill(~derived.valid, float("-inf")).view(Q, W * S)
        proved = (_goals(derived.states, num_relations) == 0).view(Q, W * S)
        # The candidates' rule confidences and first steps (at t = 0 the candidate is the first step).
        candidate_confidence = (confidence.view(-1, 1) + derived.log_confidence).view(Q, W * S)
        slots = torch.arange(S, device=device).view(1, 1, S).expand(Q, W, S)
        candidate_first = (slots if t == 0 else first.view(Q, W, 1).expand(Q, W, S)).reshape(Q, W * S)
        found = proved & (candidate > float("-inf"))
        found_confidence = torch.where(found, candidate_confidence, float("-inf"))
        by_first = by_first.scatter_reduce(1, candidate_first, found_confidence, "amax")
        # The most probable proof completed at this step, if better than the best so far.
        proof_score, proof_at = torch.where(proved, candidate, float("-inf")).max(1)
        better = proof_score > best
        beam, slot = proof_at // S, proof_at % S
        action = derived.action.view(Q, W, S)[rows, beam, slot]
        path = steps[rows, beam].clone()
        path[:, t] = action
        trail = visited[rows, beam].clone()
        trail[:, t] = derived.states.view(Q, W, S, A, 3)[rows, beam, slot]
        best = torch.where(better, proof_score, best)
        best_step = torch.where(better.view(Q, 1), path, best_step)
        best_states = torch.where(better.view(Q, 1, 1, 1), trail, best_states)
        best_length = torch.where(better, t + 1, best_length)
        # The next beams: the most probable unfinished candidates.
        top, index = candidate.masked_fill(proved, float("-inf")).topk(W, dim=1)  # [Q, W]
        beam, slot = index // S, index % S
        flat = (rows.view(Q, 1) * W + beam).view(-1)  # [Q W] rows of the previous beams
        chosen = derived.states.view(Q, W, S, A, 3)[rows.view(Q, 1), beam, slot].view(Q * W, A, 3)
        steps = steps.view(Q * W, T)[flat].view(Q, W, T).clone()
        steps[:, :, t] = derived.action.view(Q, W, S)[rows.view(Q, 1), beam, slot]
        visited = visited.view(Q * W, T, A, 3)[flat].view(Q, W, T, A, 3).clone()
        visited[:, :, t] = chosen.view(Q, W, A, 3)
        history = history[flat].clone()
        history[:, t + 1] = chosen
        confidence, first = candidate_confidence.gather(1, index), candidate_first.gather(1, index)
        beams, log_prob = chosen, top
    support = 1.0 - torch.log1p(-by_first.exp()).sum(1).exp()  # exp(-inf) = 0: a first step with no proof adds 0
    return Beams(best > float("-inf"), best, value, best_step, best_states, best_length, overflow,
                 by_first.max(1).values, support)
