"""A prover run folder: what ``kgtrace prove`` writes and ``kgtrace evaluate`` / ``explain`` read.

Layout::

    prover.yaml          the resolved ProverConfig (method bfs or policy, depth, shapes, hybrid, ...)
    rules.txt            the rules the run proves with (copied from --rules, or mined)
    node_dict, rel_dict  the id maps of the dataset
    checkpoints/         (policy) epoch-NNNN.pt and best.pt, as for embedding runs
    metrics.jsonl        (policy) one record per epoch

:func:`load_prover_run` returns a :class:`ProverRun` whose ``model`` fulfils the Scorer
protocol, so the evaluation ranks it as it ranks an embedding run's model.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kgtrace.config import choice_problems, read_yaml, write_yaml
from kgtrace.data.dataset import Dataset, load_dataset
from kgtrace.data.vocab import read_vocab, write_vocab
from kgtrace.errors import ConfigError, KgtraceError
from kgtrace.prover.engine import VectorEngine
from kgtrace.prover.logic import EngineShapes
from kgtrace.prover.rules import RuleSet, read_rules, write_rules

CONFIG_FILE = "prover.yaml"
RULES_FILE = "rules.txt"
METHODS = ("bfs", "policy")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ProverConfig:
    """Everything that determines a prover run."""

    dataset: str = "umls"  # bundled name or dataset folder
    method: str = "bfs"  # bfs: best proof by exhaustive search; policy: a learned policy's proof
    rules: str = ""  # where the rules came from: a file, or "mined"
    mining: dict[str, Any] = field(default_factory=dict)  # the MiningConfig when mined
    depth: int = 3  # bfs: search depth; policy: steps of a rollout
    max_atoms: int = 6  # engine shapes (see kgtrace.prover.logic.EngineShapes)
    max_states: int = 0
    max_facts: int = 0
    compile: bool = False  # run the engine's step through torch.compile
    embedding_run: str = ""  # hybrid: an embedding run over the same ids, whose logit is added
    hybrid_weight: float = 1.0  # hybrid score = embedding logit + weight * prover score
    device: str = "auto"
    threads: int = 0
    seed: int = 0
    # The learned policy (method policy) and its PPO training.
    embedding_dim: int = 64
    entity_embeddings: bool = False  # a learned embedding per entity (else one shared; init_from sets them)
    beam_width: int = 8  # scoring: the policy's most probable partial proofs kept per triple
    init_from: str = ""  # an embedding run whose entity and relation embeddings start the policy's
    epochs: int = 10  # passes over the training triples
    chunk_queries: int = 64  # training queries per rollout batch, each with `corruptions` false ones
    corruptions: int = 4  # K sampled false triples per training query (never a training triple)
    negative_reward: float = 1.0  # proving a false triple is rewarded -negative_reward; a true one +1
    lr: float = 3e-3
    clip: float = 0.2  # PPO's clipping of the probability ratio
    gamma: float = 1.0  # discount
    gae_lambda: float = 0.95
    entropy: float = 0.01  # entropy bonus
    value_coef: float = 0.5
    ppo_epochs: int = 2  # optimisation passes over each batch of episodes
    minibatch: int = 1024  # steps per optimiser step
    checkpoint_every: int = 1
    eval_every: int = 1  # epochs between validations (0: never)
    eval_triples: int = 200  # validation triples ranked (the first N)
    eval_corruptions: int = 20  # against K sampled corruptions each

    def validate(self) -> "ProverConfig":
        problems = choice_problems(self, "method", METHODS) + choice_problems(self, "device", DEVICES)
        for key, low in (("depth", 1), ("max_atoms", 2), ("max_states", 0), ("max_facts", 0), ("threads", 0),
                         ("embedding_dim", 1), ("beam_width", 1), ("epochs", 1), ("chunk_queries", 1), ("corruptions", 0),
                         ("ppo_epochs", 1), ("minibatch", 1), ("checkpoint_every", 1), ("eval_every", 0),
                         ("eval_triples", 1), ("eval_corruptions", 1)):
            if getattr(self, key) < low:
                problems.append(f"{key}={getattr(self, key)}: must be at least {low}")
        for key in ("hybrid_weight", "negative_reward", "entropy", "value_coef"):
            if getattr(self, key) < 0:
                problems.append(f"{key}={getattr(self, key)}: must be 0 or more")
        if not self.lr > 0:
            problems.append(f"lr={self.lr}: must be positive")
        if not 0 < self.clip < 1 or not 0 <= self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            problems.append(f"clip={self.clip}, gamma={self.gamma}, gae_lambda={self.gae_lambda}: clip must be in "
                            "(0, 1), gamma and gae_lambda in [0, 1]")
        if problems:
            raise ConfigError(problems)
        return self

    def shapes(self) -> EngineShapes:
        return EngineShapes(self.max_atoms, self.max_states, self.max_facts, self.depth + 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ProverRun:
    """A prover run: folder, config, dataset (with the run's ids), rules, engine and scorer."""

    path: Path
    config: ProverConfig
    dataset: Dataset
    rules: RuleSet
    engine: VectorEngine
    model: nn.Module  # a Scorer: BfsScorer, a policy scorer, or a HybridScorer around one


def is_prover_run(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def write_prover_run(out: str | Path, config: ProverConfig, dataset: Dataset, rules: RuleSet, *,
                     notes: list[str] | None = None, overwrite: bool = False) -> Path:
    """Create the run folder (refusing to replace anything but a prover run) with its config, rules and id maps.

    notes: one comment per rule for rules.txt (e.g. the mined measures); default: where each rule was read.
    """
    out = Path(out)
    config.validate()
    existing = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if existing and not overwrite:
        raise KgtraceError(f"{out}: folder is not empty ({', '.join(existing[:5])}). "
                           "Fix: pass --overwrite to replace it, or choose another --out")
    if existing:
        if not is_prover_run(out):
            raise KgtraceError(f"{out}: --overwrite only replaces a prover run folder, and this one has no "
                               f"{CONFIG_FILE}. Fix: choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    write_vocab(dataset.entities, out / "node_dict")
    write_vocab(dataset.relations, out / "rel_dict")
    write_rules(out / RULES_FILE, rules.rules, dataset.relations.labels,
                notes if notes is not None else [rule.source for rule in rules.rules],
                header=[f"rules of the prover run {out.name} ({config.rules or 'given in code'})"])
    write_yaml(config.to_dict(), out / CONFIG_FILE)
    return out


def read_config(run_dir: Path) -> ProverConfig:
    values = read_yaml(run_dir / CONFIG_FILE)
    known = {f.name for f in dataclasses.fields(ProverConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError([f"{run_dir / CONFIG_FILE}: {k}: unknown setting" for k in unknown])
    return ProverConfig(**values).validate()


def load_prover_run(run_dir: str | Path, checkpoint: str | Path | None = None,
                    device: torch.device | str = "cpu", *, compile: bool | None = None) -> ProverRun:
    """Reload a prover run; checkpoint (policy runs): None/'best', 'last' or a file.

    compile: run the engine's step through torch.compile (None: as the run's config says).
    """
    from kgtrace.prover.scorer import BfsScorer, HybridScorer
    from kgtrace.prover.search import compiled_deriver

    run_dir = Path(run_dir)
    if not is_prover_run(run_dir):
        raise KgtraceError(f"{run_dir}: not a prover run (no {CONFIG_FILE}). Fix: pass the --out folder of kgtrace prove")
    config = read_config(run_dir)
    dataset = load_dataset(config.dataset, entities=read_vocab(run_dir / "node_dict"),
                           relations=read_vocab(run_dir / "rel_dict"))
    rules = read_rules(run_dir / RULES_FILE, dataset.relations)
    engine = VectorEngine(dataset.train, rules, dataset.num_entities, config.shapes()).to(device)
    derive = compiled_deriver(engine, 1024) if (config.compile if compile is None else compile) else None
    if config.method == "bfs":
        model: nn.Module = BfsScorer(engine, config.depth, derive)
    else:
        from kgtrace.prover.policy import load_policy_scorer

        model = load_policy_scorer(run_dir, config, dataset, engine, derive, checkpoint, device)
    if config.embedding_run:
        model = HybridScorer(model, embedding_model(config.embedding_run, dataset, device), config.hybrid_weight)
    return ProverRun(run_dir, config, dataset, rules, engine, model.eval())


def embedding_model(run_dir: str, dataset: Dataset, device: torch.device | str) -> nn.Module:
    """The best model of an embedding run over the same id maps as ``dataset``."""
    from kgtrace.run import load_run

    run = load_run(run_dir, device=device)
    if (run.dataset.entities.digest(), run.dataset.relations.digest()) != (dataset.entities.digest(),
                                                                           dataset.relations.digest()):
        raise KgtraceError(f"embedding_run={run_dir}: its id maps differ from the prover's dataset, so scores would "
                           "belong to other triples. Fix: use an embedding run trained on the same dataset")
    return run.model
