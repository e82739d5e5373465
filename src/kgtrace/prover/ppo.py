"""Training the proof policy with PPO: ``kgtrace prove train``.

Each iteration takes ``chunk_queries`` training triples (shuffled once per epoch) and, for
each, ``corruptions`` false triples (its head or tail replaced by a random entity, never a
training triple), and runs one episode per triple with actions sampled from the policy
(`kgtrace.prover.env.rollout`, a fixed batch of chunk_queries x (1 + K) episodes; a
training triple is proved without itself as a fact). The only reward is at the end: +1 for
proving a true triple, -negative_reward for proving a false one, 0 otherwise. Advantages are
GAE(gamma, lambda) on the value head; the loss is PPO's clipped surrogate, plus value_coef x
the value error, minus entropy x the policy's entropy, over ``ppo_epochs`` passes of
``minibatch`` steps. With ``link_weight > 0`` every step also adds link_weight x the link head's
loss over the iteration's training triples (`kgtrace.prover.link`, NTP-lambda's ComplEx on
the policy's own embeddings), after ``link_epochs`` passes of that loss alone when the run starts.

Every ``eval_every`` epochs the policy ranks the first ``eval_triples`` validation triples
against ``eval_corruptions`` sampled corruptions (filtered by train + valid); the best is kept
as ``checkpoints/best.pt``. A checkpoint holds the policy, optimizer, both random generators and
the counters, so a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from kgtrace.compute.compile import logged_compilation
from kgtrace.compute.system import bar_disable, threads_problems
from kgtrace.core.checkpoint import check_digests, latest_checkpoint, load_checkpoint, save_checkpoint
from kgtrace.core.config import write_yaml
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.io import append_line
from kgtrace.core.layout import RunLayout
from kgtrace.core.owned import folder_lock
from kgtrace.data.answers import AnswerIndex
from kgtrace.data.dataset import Dataset
from kgtrace.data.pinned import load_pinned_dataset
from kgtrace.evaluation.evaluate import Candidates, evaluate
from kgtrace.models.base import Scorer
from kgtrace.prover.engine import NO_FACT, VectorEngine, pad_states
from kgtrace.prover.env import Trajectory, rollout
from kgtrace.prover.link import LinkHead, link_loss, warm_up
from kgtrace.prover.logic import query_state
from kgtrace.prover.policy import PolicyScorer, ProofPolicy, compiled_rollout, init_from_run
from kgtrace.prover.rules import RuleSet, read_rules
from kgtrace.prover.run import CONFIG_FILE, RULES_FILE, ProverConfig, read_config, write_prover_run
from kgtrace.prover.scorer import HybridScorer
from kgtrace.prover.search import eager_deriver
from kgtrace.training.loop import remove_stale_run_temporaries, truncate_metrics

__all__ = ["resume_policy", "train_policy"]

#: What training a policy writes into its run folder.

@dataclass
class PolicyState:
    policy: ProofPolicy
    optimizer: torch.optim.Optimizer
    sampler: torch.Generator  # query order, corruptions, action noise, minibatches
    epoch: int = 0
    step: int = 0  # iterations done
    best_mrr: float = -1.0
    best_epoch: int = 0


@dataclass(frozen=True)
class PolicyResult:
    run_dir: Path
    epochs_completed: int
    best_epoch: int
    best_valid_mrr: float


def train_policy(config: ProverConfig, dataset: Dataset, rules: RuleSet, out: str | Path, *,
                 notes: list[str] | None = None, overwrite: bool = False, progress: bool = True,
                 log=print) -> PolicyResult:
    """Write a policy prover run into ``out`` and train it (see the module docstring)."""
    config = replace(config, method="policy").validate()
    out = write_prover_run(out, config, dataset, rules, notes=notes, overwrite=overwrite)
    with folder_lock(out, "prover run folder"):
        RunLayout(out).checkpoints.mkdir(exist_ok=True)
        rules = read_rules(out / RULES_FILE, dataset.relations)  # as written (confidences to 6 digits), as resumes read them
        engine = VectorEngine(dataset.train, rules, dataset.num_entities, config.shapes())
        state = new_state(config, dataset, engine)
        start(state, config, dataset, log)
        with logged_compilation(RunLayout(out).compile_stats, config.compile, log):
            return fit(state, config, dataset, engine, out, progress, log)


def resume_policy(out: str | Path, *, epochs: int | None = None, progress: bool = True, log=print) -> PolicyResult:
    """Continue a policy run from its latest checkpoint; only ``epochs`` may change."""
    out = Path(out)
    config = read_config(out)
    if config.method != "policy":
        raise KgtraceError(f"{out}: a {config.method} run has nothing to train. Fix: pass a kgtrace prove train run")
    config = replace(config, epochs=epochs or config.epochs).validate()
    with folder_lock(out, "prover run folder"):
        return resume_locked(out, config, progress, log)


def resume_locked(out: Path, config: ProverConfig, progress: bool, log) -> PolicyResult:
    dataset = load_pinned_dataset(out, config.dataset)
    rules = read_rules(out / RULES_FILE, dataset.relations)
    engine = VectorEngine(dataset.train, rules, dataset.num_entities, config.shapes())
    state = new_state(config, dataset, engine)
    remove_stale_run_temporaries(out, log, RunLayout(out).prover_files())
    path = latest_checkpoint(RunLayout(out).checkpoints)
    if path is not None:
        saved = load_checkpoint(path)
        check_digests(saved, dataset.entities.digest(), dataset.relations.digest(), path)
        restore_state(state, saved)
        log(f"resuming {out} from {path.name} (epoch {state.epoch})")
    else:  # killed before its first checkpoint: start afresh, as train_policy does
        start(state, config, dataset, log)
    write_yaml(config.to_dict(), out / CONFIG_FILE)
    with logged_compilation(RunLayout(out).compile_stats, config.compile, log):
        return fit(state, config, dataset, engine, out, progress, log)


def new_state(config: ProverConfig, dataset: Dataset, engine: VectorEngine) -> PolicyState:
    problems = threads_problems(config.threads)
    if problems:
        raise ConfigError(problems)
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    policy = ProofPolicy(dataset.num_entities, dataset.num_relations, engine.num_variables, config.embedding_dim,
                         engine.keys_head, config.entity_embeddings)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    return PolicyState(policy, optimizer, torch.Generator().manual_seed(config.seed + 1))


def start(state: PolicyState, config: ProverConfig, dataset: Dataset, log) -> None:
    """A new run's first steps: embeddings from ``init_from`` (or the link head's rows drawn at std ``link_init``),
    then ``link_epochs`` passes of the link head alone."""
    if config.init_from:
        log(init_from_run(state.policy, config.init_from, dataset))
    elif config.link_weight and config.link_init:
        LinkHead(state.policy).reset(config.link_init, state.sampler)
    if config.link_epochs:
        losses = warm_up(LinkHead(state.policy), dataset.train, epochs=config.link_epochs, lr=config.link_lr,
                         n3=config.link_n3, generator=state.sampler)
        log(f"link head: {config.link_epochs} passes alone, loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def state_dict(state: PolicyState, config: ProverConfig, dataset: Dataset) -> dict:
    return {"policy_state": state.policy.state_dict(), "optimizer_state": state.optimizer.state_dict(),
            "epoch": state.epoch, "step": state.step, "lr": config.lr, "config": config.to_dict(),
            "entity_digest": dataset.entities.digest(), "relation_digest": dataset.relations.digest(),
            "rng": {"torch": torch.get_rng_state(), "sampler": state.sampler.get_state()},
            "early_stopping": {"best_mrr": state.best_mrr, "best_epoch": state.best_epoch}}


def restore_state(state: PolicyState, saved: dict) -> None:
    state.policy.load_state_dict(saved["policy_state"])
    state.optimizer.load_state_dict(saved["optimizer_state"])
    state.epoch, state.step = int(saved["epoch"]), int(saved["step"])
    state.best_mrr = float(saved["early_stopping"]["best_mrr"])
    state.best_epoch = int(saved["early_stopping"]["best_epoch"])
    torch.set_rng_state(saved["rng"]["torch"])
    state.sampler.set_state(saved["rng"]["sampler"])


# ----------------------------------------------------------------------------- the loop


def fit(state: PolicyState, config: ProverConfig, dataset: Dataset, engine: VectorEngine, out: Path, progress: bool,
        log) -> PolicyResult:
    keys = _triple_keys(dataset.train, dataset.num_entities, dataset.num_relations)
    known_valid = AnswerIndex.build(dataset.known_triples("valid"), dataset.num_relations)
    collect = _collector(state.policy, engine, config)
    # Built once: with config.compile its beam search compiles on the first validation only (it reads the
    # policy's current weights at every call).
    scorer: Scorer = PolicyScorer(state.policy, engine, config.depth, width=config.beam_width,
                                  proof_score=config.proof_score, compile=config.compile)
    if config.link_weight:  # validated as the run will be ranked: link logit + hybrid_weight x proof part
        scorer = HybridScorer(scorer, LinkHead(state.policy), config.hybrid_weight)
    truncate_metrics(out, state.epoch)  # a torn last line (a kill during its append) is dropped
    while state.epoch < config.epochs:
        started = time.perf_counter()
        order = torch.randperm(len(dataset.train), generator=state.sampler)
        totals: dict[str, float] = {}
        chunks = order.split(config.chunk_queries)
        for chunk in tqdm(chunks, desc=f"epoch {state.epoch + 1}/{config.epochs}", leave=False, disable=bar_disable(progress)):
            for key, value in iteration(state, config, dataset, engine, collect, keys, dataset.train[chunk]).items():
                totals[key] = totals.get(key, 0.0) + (value if key == "overflow" else value / len(chunks))
            state.step += 1
        state.epoch += 1
        record = {"epoch": state.epoch, "step": state.step, **totals, "seconds": time.perf_counter() - started}
        if config.eval_every and (state.epoch % config.eval_every == 0 or state.epoch == config.epochs):
            record.update(_validate(state, config, dataset, scorer, known_valid))
            if record["valid_improved"]:
                save_checkpoint(state_dict(state, config, dataset), RunLayout(out).best_checkpoint)
        append_line(RunLayout(out).metrics, json.dumps(record))
        if state.epoch % config.checkpoint_every == 0 or state.epoch == config.epochs:
            save_checkpoint(state_dict(state, config, dataset), RunLayout(out).epoch_checkpoint(state.epoch))
        log(_format(record))
    return PolicyResult(out, state.epoch, state.best_epoch, state.best_mrr)


def _collector(policy: ProofPolicy, engine: VectorEngine, config: ProverConfig):
    """(states, excluded, noise) -> Trajectory for a fixed batch of chunk_queries x (1 + K) episodes."""
    batch = config.chunk_queries * (1 + config.corruptions)
    if config.compile:
        call = compiled_rollout(policy, engine, config.depth, batch)
        return lambda states, excluded, noise: Trajectory(*call(policy, engine, states=states, excluded=excluded,
                                                                 noise=noise))
    derive = eager_deriver(engine)
    return lambda states, excluded, noise: rollout(policy, derive, states, excluded, noise, max_steps=config.depth,
                                                   num_relations=engine.num_relations)


def iteration(state: PolicyState, config: ProverConfig, dataset: Dataset, engine: VectorEngine, collect,
              keys: Tensor, true: Tensor) -> dict[str, float]:
    """Episodes for ``true`` [Q, 3] and their corruptions, then PPO on them; returns statistics."""
    E, R = dataset.num_entities, dataset.num_relations
    false = corrupt(true, config.corruptions, E, R, keys, state.sampler)  # [Q K, 3]
    triples = torch.cat([true, false])
    is_true = torch.arange(len(triples)) < len(true)
    excluded = torch.full((len(triples), 3), NO_FACT, dtype=torch.long)
    excluded[: len(true)] = true[:, [1, 0, 2]]  # a training triple is proved without itself: the atom (r, h, t)
    states = pad_states([query_state(t) for t in triples.tolist()], config.max_atoms, R)
    uniform = torch.rand(len(triples), config.depth, engine.shapes.max_states, generator=state.sampler)
    noise = -torch.log(-torch.log(uniform.clamp(1e-12, 1 - 1e-7)))  # Gumbel: argmax(logits + noise) samples
    with torch.no_grad():
        trajectory = collect(states, excluded, noise)
    reward = torch.where(trajectory.success, torch.where(is_true, 1.0, -config.negative_reward), 0.0)
    loss, link = ppo_update(state, config, trajectory, reward, excluded, true)
    stats = {"loss": loss, "reward": float(reward.mean()), "overflow": float(trajectory.overflow.sum()),
             "proved_true": float(trajectory.success[is_true].float().mean()),
             "proved_false": float(trajectory.success[~is_true].float().mean()) if config.corruptions else 0.0}
    return {**stats, "link_loss": link} if config.link_weight else stats


def corrupt(true: Tensor, k: int, num_entities: int, num_relations: int, keys: Tensor,
            generator: torch.Generator, rounds: int = 20) -> Tensor:
    """K false triples per triple [Q, 3]: head or tail replaced at random, resampled while a training triple.

    A rejected draw tries the other side next, so a query whose every tail is known still
    gets corrupted heads. Draws that stay training triples after ``rounds`` are left out:
    the result has at most Q K rows, never a training triple.
    """
    triples = true.repeat_interleave(k, 0)  # [Q K, 3]
    column = torch.where(torch.rand(len(triples), generator=generator) < 0.5, 0, 2)
    original = triples.clone()
    pending = torch.ones(len(triples), dtype=torch.bool)
    for _ in range(rounds):
        rows = torch.nonzero(pending).squeeze(1)
        if len(rows) == 0:
            break
        triples[rows] = original[rows]
        triples[rows, column[rows]] = torch.randint(num_entities, (len(rows),), generator=generator)
        pending[rows] = _is_known(triples[rows], keys, num_entities, num_relations)
        column[rows] = 2 - column[rows]  # the other side on the next try
    return triples[~pending]


def _triple_keys(triples: Tensor, num_entities: int, num_relations: int) -> Tensor:
    h, r, t = triples.long().unbind(1)
    return torch.unique((h * num_relations + r) * num_entities + t)  # sorted


def _is_known(triples: Tensor, keys: Tensor, num_entities: int, num_relations: int) -> Tensor:
    h, r, t = triples.unbind(1)
    key = (h * num_relations + r) * num_entities + t
    position = torch.searchsorted(keys, key).clamp(max=len(keys) - 1)
    return keys[position] == key


def advantages(trajectory: Trajectory, reward: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE over the acted steps; the final reward comes at an episode's last step. (advantage, return) [N, T]."""
    acted, value = trajectory.acted.float(), trajectory.value
    N, T = acted.shape
    rewards = torch.zeros(N, T)
    last = (trajectory.steps - 1).clamp(min=0)
    rewards[torch.arange(N), last] = reward * (trajectory.steps > 0)
    advantage = torch.zeros(N, T)
    following = torch.zeros(N)  # advantage of step t + 1
    for t in reversed(range(T)):
        next_value = value[:, t + 1] * acted[:, t + 1] if t + 1 < T else torch.zeros(N)
        next_acted = acted[:, t + 1] if t + 1 < T else torch.zeros(N)
        delta = rewards[:, t] + gamma * next_value - value[:, t]
        following = (delta + gamma * lam * next_acted * following) * acted[:, t]
        advantage[:, t] = following
    return advantage, advantage + value


def ppo_update(state: PolicyState, config: ProverConfig, trajectory: Trajectory, reward: Tensor,
               excluded: Tensor, true: Tensor) -> tuple[float, float]:
    """PPO's clipped objective over the acted steps, plus link_weight x the link head's loss on the true
    triples [Q, 3] at every step; returns the mean total loss and the link head's. excluded [N, 3]: each episode's."""
    advantage, returns = advantages(trajectory, reward, config.gamma, config.gae_lambda)
    row, t = torch.nonzero(trajectory.acted, as_tuple=True)
    if len(row) == 0:
        return 0.0, 0.0
    adv = advantage[row, t]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8) if len(adv) > 1 else adv
    samples = (trajectory.states[row, t], trajectory.derived[row, t], trajectory.valid[row, t],
               trajectory.rule_log_confidence[row, t], trajectory.action[row, t], trajectory.log_prob[row, t], adv,
               returns[row, t], excluded[row])
    head = LinkHead(state.policy) if config.link_weight else None
    total, link_total, count = 0.0, 0.0, 0
    state.policy.train()
    for _ in range(config.ppo_epochs):
        for index in torch.randperm(len(row), generator=state.sampler).split(config.minibatch):
            states, derived, valid, confidence, action, old_log_prob, adv, ret, banned = (x[index] for x in samples)
            logits, value = state.policy(states, derived, valid, confidence, banned)
            log_probs = torch.log_softmax(logits, 1)
            ratio = (log_probs.gather(1, action.unsqueeze(1)).squeeze(1) - old_log_prob).exp()
            surrogate = torch.min(ratio * adv, ratio.clamp(1 - config.clip, 1 + config.clip) * adv)
            entropy = -(log_probs.exp() * log_probs).sum(1)
            loss = -surrogate.mean() + config.value_coef * (value - ret).pow(2).mean() - config.entropy * entropy.mean()
            if head is not None:
                link = link_loss(head, true, config.link_n3)
                loss = loss + config.link_weight * link
                link_total += float(link.detach())
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(state.policy.parameters(), 1.0)
            state.optimizer.step()
            total, count = total + float(loss.detach()), count + 1
    state.policy.eval()
    return total / max(count, 1), link_total / max(count, 1)


def _validate(state: PolicyState, config: ProverConfig, dataset: Dataset, scorer: Scorer,
              known: AnswerIndex) -> dict:
    metrics = evaluate(scorer, dataset.valid[: config.eval_triples], known=known,
                       candidates=Candidates(config.eval_corruptions, seed=config.seed)).both.realistic
    improved = metrics.mrr > state.best_mrr
    if improved:
        state.best_mrr, state.best_epoch = metrics.mrr, state.epoch
    return {"valid_mrr": metrics.mrr, "valid_hits_at_1": metrics.hits_at[1], "valid_improved": improved}


def _format(record: dict) -> str:
    text = (f"epoch {record['epoch']:>3}  loss {record.get('loss', 0):.4f}  reward {record.get('reward', 0):+.3f}  "
            f"proved true {record.get('proved_true', 0):.3f} false {record.get('proved_false', 0):.3f}  "
            f"overflow {record.get('overflow', 0):.0f}  {record['seconds']:.1f}s")
    if "link_loss" in record:
        text += f"  link loss {record['link_loss']:.4f}"
    if "valid_mrr" in record:
        text += f"  valid MRR {record['valid_mrr']:.4f}" + ("  (best)" if record["valid_improved"] else "")
    return text
