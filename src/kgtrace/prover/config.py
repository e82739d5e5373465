"""The prover's settings as frozen dataclasses that validate themselves (no torch: the CLI reads their defaults)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kgtrace.core.config import choice_problems
from kgtrace.core.errors import ConfigError
from kgtrace.prover.logic import EngineShapes

__all__ = ["HYBRID_WEIGHTS", "MAX_WEIGHT", "LearnConfig", "MiningConfig", "ProverConfig"]

CONFIDENCES = ("std", "pca")
METHODS = ("bfs", "policy", "apply")
AGGREGATIONS = ("maxplus", "max", "noisy_or", "nr_noisy_or")  # rule application's (kgtrace.prover.apply)
PROOF_SCORES = ("confidence", "noisy_or", "probability")
DEVICES = ("auto", "cpu", "cuda")
HYBRID_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)  # the grid kgtrace prove weigh chooses from
MAX_WEIGHT = 2.0 ** 20  # where the default grid stops doubling while its largest weight ranks best


def max_body(method: str) -> int:
    """Body atoms a rule may have: AnyBURL's paths of up to 3 for rule application, 2 for the SLD engines' shapes."""
    return 3 if method == "apply" else 2


@dataclass(frozen=True)
class MiningConfig:
    """Thresholds of ``kgtrace rules mine``; a rule is kept when it passes all of them."""

    min_support: int = 2  # distinct (x, y) pairs the rule predicts correctly
    min_head_coverage: float = 0.01  # support / facts of the head relation (AMIE's default)
    min_confidence: float = 0.1  # standard confidence
    min_pca_confidence: float = 0.0
    confidence: str = "std"  # the measure written as the rule's confidence: std or pca
    confidence_offset: float = 5.0  # written confidence = support / (denominator + offset): AnyBURL's damping of rare bodies
    max_rules_per_head: int = 50  # keep each head relation's best N rules (0: all); bounds the engines' branching
    chains: bool = True  # also mine length-2 chains (else implications and inverses only)
    # Two-hop paths enumerated at once while mining chains (about 100 bytes each while counted): the supports
    # are counted a block of facts at a time, the chain products a block of rows at a time, each block within
    # this many paths (0: all at once).
    max_chain_paths: int = 10_000_000

    def __post_init__(self) -> None:
        self.validate()  # a MiningConfig cannot be built invalid

    def validate(self) -> "MiningConfig":
        problems = []
        if self.min_support < 1:
            problems.append(f"min_support={self.min_support}: must be at least 1")
        for key in ("min_head_coverage", "min_confidence", "min_pca_confidence"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                problems.append(f"{key}={getattr(self, key)}: must be in [0, 1]")
        if self.confidence not in CONFIDENCES:
            problems.append(f"confidence={self.confidence!r}: must be one of {', '.join(CONFIDENCES)}")
        if self.confidence_offset < 0:
            problems.append(f"confidence_offset={self.confidence_offset}: must be 0 or more")
        if self.max_chain_paths < 0:
            problems.append(f"max_chain_paths={self.max_chain_paths}: must be 0 (no limit) or more")
        if self.max_rules_per_head < 0:
            problems.append(f"max_rules_per_head={self.max_rules_per_head}: must be 0 (all) or more")
        if problems:
            raise ConfigError(problems)
        return self


@dataclass(frozen=True)
class LearnConfig:
    """``kgtrace rules learn``: AnyBURL's path rules, learned from sampled paths until the time is up."""

    seconds: float = 300.0  # the time budget (a resumed run counts the time already spent)
    rounds: int = 0  # learn for this many rounds, whatever the time (0: for `seconds`); reproducible
    max_length: int = 3  # cyclic rules have 1 to max_length body atoms
    acyclic: bool = True  # also rules with constants: r(X,c) :- s(X,d) and r(X,c) :- s(X,A), either side
    paths_per_round: int = 4096  # training facts sampled per round, a path of each length walked from each
    # Cyclic paths of 2 and 3 steps also met in the middle: up to this many steps from each sampled fact's x and
    # into its y, every pair of them tried (0: only the random walks closed at y).
    meet_neighbours: int = 0
    confidence_sample: int = 100  # start entities whose body groundings estimate a cyclic rule's confidence
    min_support: int = 2  # correct predictions (in the sample) a rule needs
    min_confidence: float = 0.001
    confidence_offset: float = 5.0  # confidence = correct / (groundings + offset): AnyBURL's unseen negatives
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()  # a LearnConfig cannot be built invalid

    def validate(self) -> "LearnConfig":
        problems = [f"{key}={getattr(self, key)}: must be at least {low}"
                    for key, low in (("max_length", 1), ("paths_per_round", 1), ("confidence_sample", 1),
                                     ("min_support", 1), ("rounds", 0), ("meet_neighbours", 0))
                    if getattr(self, key) < low]
        if not self.seconds > 0:
            problems.append(f"seconds={self.seconds}: must be a positive number of seconds")
        if not 0.0 <= self.min_confidence <= 1.0:
            problems.append(f"min_confidence={self.min_confidence}: must be in [0, 1]")
        if not self.confidence_offset >= 0:
            problems.append(f"confidence_offset={self.confidence_offset}: must be 0 or more")
        if problems:
            raise ConfigError(problems)
        return self


@dataclass(frozen=True)
class ProverConfig:
    """Everything that determines a prover run."""

    dataset: str = "umls"  # bundled name or dataset folder
    method: str = "bfs"  # bfs: best proof by exhaustive search; policy: a learned policy's proof; apply: rule application
    aggregation: str = "maxplus"  # apply: how the rules predicting a candidate combine (maxplus, max, noisy_or,
    # nr_noisy_or: SAFRAN's, over the clusters of redundant rules kept in the run's clusters.json)
    rules: str = ""  # where the rules came from: a file, or "mined"
    mining: dict[str, Any] = field(default_factory=dict)  # the MiningConfig when mined
    depth: int = 3  # bfs: search depth; policy: steps of a rollout
    max_atoms: int = 6  # engine shapes (see kgtrace.prover.logic.EngineShapes)
    max_states: int = 0
    max_facts: int = 0
    compile: bool = False  # run the engine's step, the rollout and the beam search through torch.compile
    embedding_run: str = ""  # hybrid: an embedding run over the same ids, whose logit is added
    hybrid_weight: float = 1.0  # hybrid score = embedding logit + weight * proof score (0 when unproved)
    device: str = "auto"
    threads: int = 0
    seed: int = 0
    # The learned policy (method policy) and its PPO training.
    embedding_dim: int = 64
    entity_embeddings: bool = False  # a learned embedding per entity (else one shared; init_from sets them)
    beam_width: int = 8  # scoring: the policy's most probable partial proofs kept per triple
    proof_score: str = "confidence"  # a proved triple's tie-break: best proof's confidence (max+), noisy_or, probability
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
    # NTP-lambda's link head (kgtrace.prover.link): ComplEx on the policy's own entity and relation embeddings.
    link_weight: float = 0.0  # > 0: its loss, times this, joins PPO's; a triple scores its logit + hybrid_weight x proof
    link_epochs: int = 0  # passes of the head's loss alone before PPO starts
    link_lr: float = 0.1  # Adagrad learning rate of those passes (Lacroix et al. 2018's ComplEx-N3 recipe)
    link_init: float = 1e-3  # std the head's entity and relation rows start from (0, or init_from: as they were)
    link_n3: float = 0.01  # weight of the N3 regulariser in the head's loss

    def __post_init__(self) -> None:
        self.validate()  # a ProverConfig cannot be built invalid

    def validate(self) -> "ProverConfig":
        problems = choice_problems(self, "method", METHODS) + choice_problems(self, "device", DEVICES)
        problems += choice_problems(self, "proof_score", PROOF_SCORES)
        problems += choice_problems(self, "aggregation", AGGREGATIONS)
        if self.method == "apply" and self.embedding_run and self.aggregation == "maxplus":
            problems.append("aggregation='maxplus' with embedding_run: a hybrid adds the rules' score to a logit, and "
                            "maxplus's scores are ranking keys; fix: use aggregation max, noisy_or or nr_noisy_or")
        for key, low in (("depth", 1), ("max_atoms", 2), ("max_states", 0), ("max_facts", 0), ("threads", 0),
                         ("embedding_dim", 1), ("beam_width", 1), ("epochs", 1), ("chunk_queries", 1), ("corruptions", 0),
                         ("ppo_epochs", 1), ("minibatch", 1), ("checkpoint_every", 1), ("eval_every", 0),
                         ("eval_triples", 1), ("eval_corruptions", 1)):
            if getattr(self, key) < low:
                problems.append(f"{key}={getattr(self, key)}: must be at least {low}")
        problems += self._link_problems()
        for key in ("hybrid_weight", "negative_reward", "entropy", "value_coef", "link_weight", "link_epochs", "link_n3",
                    "link_init"):
            if getattr(self, key) < 0:
                problems.append(f"{key}={getattr(self, key)}: must be 0 or more")
        for key in ("lr", "link_lr"):
            if not getattr(self, key) > 0:
                problems.append(f"{key}={getattr(self, key)}: must be positive")
        if not 0 < self.clip < 1 or not 0 <= self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            problems.append(f"clip={self.clip}, gamma={self.gamma}, gae_lambda={self.gae_lambda}: clip must be in "
                            "(0, 1), gamma and gae_lambda in [0, 1]")
        if problems:
            raise ConfigError(problems)
        return self

    def _link_problems(self) -> list[str]:
        if not self.link_weight > 0:
            return [f"link_epochs={self.link_epochs}: trains the link head, which needs link_weight > 0"] \
                if self.link_epochs else []
        problems = []
        if self.method != "policy":
            problems.append(f"link_weight={self.link_weight}: the link head is trained with the policy; use method "
                            "policy (kgtrace prove train), or link_weight 0")
        if not self.entity_embeddings:
            problems.append(f"link_weight={self.link_weight}: the link head needs one embedding per entity; set "
                            "entity_embeddings true (kgtrace prove train sets it with --link-weight)")
        if self.embedding_dim % 2:
            problems.append(f"embedding_dim={self.embedding_dim}: the link head reads it as complex numbers; use an "
                            "even width")
        if self.embedding_run:
            problems.append(f"embedding_run={self.embedding_run}: a run with a link head has its own embedding score; "
                            "drop embedding_run or set link_weight 0")
        return problems

    def max_body(self) -> int:
        return max_body(self.method)

    def hybrid(self) -> bool:
        """Whether a triple's score adds an embedding logit (an embedding run's, or the link head's) to its proofs'."""
        return bool(self.embedding_run) or self.link_weight > 0

    def shapes(self) -> EngineShapes:
        """The engine's EngineShapes (kgtrace.prover.logic): A, S, F, and a history of depth + 1 states."""
        return EngineShapes(self.max_atoms, self.max_states, self.max_facts, self.depth + 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
