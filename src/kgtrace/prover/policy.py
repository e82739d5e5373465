"""The learned proof policy, its scorer, and the proof it finds for a triple.

`ProofPolicy` scores every derived state of the current state. An atom is embedded as
``relu(W [relation; arg1; arg2] + status)`` from relation and term embeddings (entities, and
one embedding per variable number) and an embedding of its status: it has a variable, it is a
ground fact, or it is ground and no fact (a one-step look-up in the sorted fact keys, which
tells a state one fact step from a proof apart; the episode's excluded fact, a training
query's own triple, counts as no fact, so that a training query looks like a test query and
not like a known fact); a state is the sum of its atoms'; a derived state's logit is
its embedding against a projection of the current state's, plus a learned weight times the
log confidence of the rule the step used (initially 1: at first the policy prefers confident
rules, as the best-proof search does) and a learned bias for states that are proofs; invalid
slots get a large negative logit. A value head reads the current
state's embedding (tanh, in (-1, 1)). Entity and relation embeddings may start from a
trained kgtrace embedding run (`init_from_run`).

`PolicyScorer` fulfils the Scorer protocol with a policy-guided beam search of each
ground query (`kgtrace.prover.env.beam_search`; width 1 follows the policy's most
probable step): a proved triple scores above 1, by default ``1 + c + 0.001 n`` with c the
confidence of the most confident proof found and n the noisy-or over its first steps' best
proofs (``proof_score="noisy_or"``: ``1 + n``; ``"probability"``: ``1 + p``, p the probability of the most probable
proof found); an unproved one scores the value of its start state, below every proved one.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from kgtrace.compute.compile import CompiledCall
from kgtrace.core.checkpoint import check_digests, load_checkpoint
from kgtrace.core.errors import KgtraceError
from kgtrace.models.base import forward_triples, inverse_queries
from kgtrace.prover.engine import NO_FACT, VectorEngine, pad_states, unpad_states
from kgtrace.prover.env import Beams, beam_search, rollout
from kgtrace.prover.logic import query_state
from kgtrace.prover.neural import embedding_model
from kgtrace.prover.reference import FACT, RULE, Derivation, Proof
from kgtrace.prover.scorer import HybridScorer
from kgtrace.prover.search import Deriver, eager_deriver
from kgtrace.runs.embedding import resolve_checkpoint

__all__ = ["MASKED", "PolicyScorer", "ProofPolicy", "init_from_run", "load_policy_scorer", "policy_proof"]

MASKED = -1e9  # the logit of an invalid slot: finite, so that a row with no valid slot gives no NaN


class ProofPolicy(nn.Module):
    """Logits over derived states [N, S] and a value [N] for current states [N, A, 3]."""

    def __init__(self, num_entities: int, num_relations: int, num_variables: int, dim: int, fact_keys: Tensor,
                 entity_embeddings: bool = True):
        """fact_keys: the engine's sorted keys (r E + h) E + t of the facts (VectorEngine.keys_head).

        entity_embeddings False: every entity shares one embedding, so that the policy learns from
        relations, variable patterns, fact status and rule confidences only (it cannot memorise
        the training queries' entities).
        """
        super().__init__()
        self.entity_embeddings = entity_embeddings
        self.num_entities, self.num_relations, self.num_variables = num_entities, num_relations, num_variables
        self.register_buffer("fact_keys", fact_keys.clone())
        self.status = nn.Embedding(3, dim)  # 0: has a variable, 1: a ground fact, 2: ground, not a fact
        self.terms = nn.Embedding(num_entities + num_variables, dim)  # entities, then variables 0, 1, ...
        self.relations = nn.Embedding(num_relations + 2, dim)  # the dataset's, the answer atom, padding
        self.atom = nn.Linear(3 * dim, dim)
        self.query = nn.Linear(dim, dim)
        self.value_head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))
        self.proved_bias = nn.Parameter(torch.zeros(()))
        self.confidence_weight = nn.Parameter(torch.ones(()))
        nn.init.normal_(self.terms.weight, std=dim ** -0.5)
        nn.init.normal_(self.relations.weight, std=dim ** -0.5)

    def embed(self, states: Tensor, excluded: Tensor) -> Tensor:
        """States [N, ..., A, 3] -> [N, ..., dim]: the sum of their atoms' embeddings (padding adds nothing).

        An atom is relu(W [relation; arg1; arg2] + b + status). W splits into three [dim, dim]
        blocks, so each table is projected once and an atom is a sum of three looked-up rows:
        the same value as the concatenation through the linear layer (`embed_reference`),
        without a [..., A, 3 dim] x [3 dim, dim] product per atom (the beam search's cost).
        """
        relation, terms = self._ids(states)
        w_relation, w_first, w_second = self.atom.weight.split(self.atom.weight.shape[1] // 3, 1)  # [dim, dim] each
        first = self.terms.weight @ w_first.T  # [E + V, dim]: each term as a first argument
        second = self.terms.weight @ w_second.T
        # F.embedding rather than table[ids]: indexing's backward accumulates with atomic adds on a
        # multi-threaded CPU, so its gradients (and PPO) would change from run to run.
        pre = (F.embedding(relation, self.relations.weight @ w_relation.T + self.atom.bias)
               + F.embedding(terms[..., 0], first) + F.embedding(terms[..., 1], second)
               + self.status(self._status(states, excluded)))  # [N, ..., A, dim]
        real = (relation <= self.num_relations).unsqueeze(-1)  # goals and the answer atom
        return (torch.relu(pre) * real).sum(-2)

    def embed_reference(self, states: Tensor, excluded: Tensor) -> Tensor:
        """`embed` as written: each atom's concatenated embeddings through the linear layer."""
        relation, terms = self._ids(states)
        atoms = torch.cat([self.relations(relation), self.terms(terms).flatten(-2)], -1)  # [..., A, 3 dim]
        real = (relation <= self.num_relations).unsqueeze(-1)
        return (torch.relu(self.atom(atoms) + self.status(self._status(states, excluded))) * real).sum(-2)

    def _ids(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """(relation ids [..., A], term ids [..., A, 2]) into the embedding tables."""
        relation = states[..., 0].clamp(0, self.num_relations + 1)
        terms = states[..., 1:].clamp(0, self.num_entities + self.num_variables - 1)
        if not self.entity_embeddings:
            terms = torch.where(terms < self.num_entities, 0, terms)  # one shared embedding: entity 0's row
        return relation, terms

    def _status(self, states: Tensor, excluded: Tensor) -> Tensor:
        """[..., A]: 0 an atom with a variable (or not a goal), 1 a ground fact, 2 ground and not a fact.

        excluded [N, 3] (r, h, t) per row of states [N, ..., A, 3]: no fact for that row (-1s: none).
        Without it a training query, whose own triple is a fact, would be told apart from every
        test query and corruption by its status alone (the policy learned to prove "facts" only).
        """
        E = self.num_entities
        relation, a, b = states.unbind(-1)
        ground = (relation < self.num_relations) & (a < E) & (b < E)
        key = (relation.clamp(0, self.num_relations - 1) * E + a.clamp(0, E - 1)) * E + b.clamp(0, E - 1)
        position = torch.searchsorted(self.fact_keys, key.reshape(-1)).view_as(key).clamp(max=len(self.fact_keys) - 1)
        banned = excluded.view(excluded.shape[0], *([1] * (states.dim() - 2)), 3)  # [N, 1.., 3] against [N, .., A, 3]
        is_fact = (self.fact_keys[position] == key) & ~(states == banned).all(-1)
        return torch.where(ground, torch.where(is_fact, 1, 2), 0)

    def forward(self, states: Tensor, derived: Tensor, valid: Tensor, log_confidence: Tensor,
                excluded: Tensor) -> tuple[Tensor, Tensor]:
        current = self.embed(states, excluded)  # [N, D]
        options = self.embed(derived, excluded)  # [N, S, D]
        logits = (options @ self.query(current).unsqueeze(-1)).squeeze(-1) / math.sqrt(current.shape[-1])  # [N, S]
        proved = (derived[..., 0] < self.num_relations).sum(-1) == 0
        logits = logits + self.proved_bias * proved + self.confidence_weight * log_confidence
        value = torch.tanh(self.value_head(current)).squeeze(-1)
        return logits.masked_fill(~valid, MASKED), value


def init_from_run(policy: ProofPolicy, run_dir: str | Path, dataset) -> str:
    """Start the policy's entity and relation embeddings from an embedding run's (same ids).

    Tables of another width are mapped by a fixed random orthogonal projection. Returns a note.
    """
    model = embedding_model(str(run_dir), dataset, "cpu")
    if not (hasattr(model, "entity_embeddings") and hasattr(model, "relation_embeddings")):
        raise KgtraceError(f"init_from={run_dir}: its model has no entity_embeddings / relation_embeddings tables. "
                           "Fix: start from a ConvE or DistMult run, or drop init_from")
    entities = model.entity_embeddings.detach().float()
    relations = model.relation_embeddings.detach().float()[: policy.num_relations]
    dim = policy.terms.weight.shape[1]
    if entities.shape[1] != dim:
        projection = torch.nn.init.orthogonal_(torch.empty(entities.shape[1], dim), generator=torch.Generator()
                                               .manual_seed(0))
        entities, relations = entities @ projection, relations @ projection
    scale = dim ** -0.5 / entities.std().clamp(min=1e-12)  # the policy's own initial scale
    with torch.no_grad():
        policy.terms.weight[: policy.num_entities] = entities * scale
        policy.relations.weight[: policy.num_relations] = relations * scale
    return f"entity and relation embeddings from {run_dir}"


SUPPORT_WEIGHT = 1e-3  # the noisy-or's share of a "confidence" score: a tie-break among equal best confidences


def beam_scores(beams: Beams, proof_score: str = "confidence") -> Tensor:
    """A proved triple's score in (1, 2.001], an unproved one's the start state's value (in (-1, 1)).

    proof_score "confidence": 1 + the best found proof's confidence + SUPPORT_WEIGHT x the
    noisy-or over the best proofs through each first step (AnyBURL's max+ ranking in one
    number: the best rule decides, the others break its ties). "noisy_or": 1 + that noisy-or
    (every first step's evidence adds up). "probability": 1 + the probability of the most
    probable proof found.
    """
    proved = {"confidence": lambda: 1.0 + beams.log_confidence.exp() + SUPPORT_WEIGHT * beams.support,
              "noisy_or": lambda: 1.0 + beams.support, "probability": lambda: 1.0 + beams.log_prob.exp()}
    return torch.where(beams.success, proved[proof_score](), beams.value)


class PolicyScorer(nn.Module):
    """Policy-guided beam search of ground queries as scores (see the module docstring)."""

    proof_line = 1.0  # scores above it are proofs (an unproved triple scores its value, below 1)

    def __init__(self, policy: ProofPolicy, engine: VectorEngine, max_steps: int, derive: Deriver | None = None, *,
                 width: int = 1, proof_score: str = "confidence", batch_size: int = 1024, compile: bool = False):
        super().__init__()
        self.policy, self.engine, self.max_steps, self.width = policy, engine, max_steps, width
        self.proof_score = proof_score
        self.derive = derive or eager_deriver(engine)
        self.batch_size = batch_size
        self.num_entities, self.num_relations = engine.num_entities, engine.num_relations
        self.overflow = torch.zeros(3, dtype=torch.long)
        self._compiled = compiled_beams(policy, engine, max_steps, width, batch_size) if compile else None

    def search(self, hrt: Tensor) -> Beams:
        """The beam search of the ground queries hrt [B, 3] (no fact excluded)."""
        device = self.engine.keys_head.device
        states = pad_states([query_state(t) for t in hrt.tolist()], self.engine.shapes.max_atoms,
                            self.num_relations).to(device)
        excluded = torch.full((len(hrt), 3), NO_FACT, dtype=torch.long, device=device)
        if self._compiled is not None:
            return Beams(*self._compiled(self.policy, self.engine, states=states, excluded=excluded))
        return beam_search(self.policy, self.derive, states, excluded, width=self.width, max_steps=self.max_steps,
                           num_relations=self.num_relations)

    @torch.no_grad()
    def score_hrt(self, hrt: Tensor) -> Tensor:
        """[B, 3] -> [B]: each ground query's beam score; (t, r + R, h) is searched as (h, r, t)."""
        parts = []
        for part in forward_triples(hrt.cpu(), self.num_relations).split(self.batch_size):
            beams = self.search(part)
            self.overflow += beams.overflow.sum(0).cpu()
            parts.append(beam_scores(beams, self.proof_score))
        return torch.cat(parts).float().to(hrt.device) if parts else torch.zeros(0, device=hrt.device)

    @torch.no_grad()
    def score_t(self, hr: Tensor) -> Tensor:
        """Every entity as the answer of each (anchor, relation-or-inverse) query: one search per triple [B, E]."""
        E = self.num_entities
        entity = torch.arange(E).repeat(len(hr)).unsqueeze(1)
        triples = torch.cat([hr.cpu().repeat_interleave(E, 0), entity], 1)  # [B E, 3] (anchor, relation, entity)
        return self.score_hrt(triples).view(len(hr), E).to(hr.device)

    def score_h(self, rt: Tensor) -> Tensor:
        return self.score_t(inverse_queries(rt, self.num_relations))


def compiled_beams(policy: ProofPolicy, engine: VectorEngine, max_steps: int, width: int,
                   batch_size: int) -> CompiledCall:
    """The whole beam search (engine steps and policy) as one compiled graph over static buffers."""
    A = engine.shapes.max_atoms
    device = engine.keys_head.device
    example = {"states": torch.zeros(1, A, 3, dtype=torch.long, device=device),
               "excluded": torch.zeros(1, 3, dtype=torch.long, device=device)}

    def run(policy: ProofPolicy, engine: VectorEngine, states: Tensor, excluded: Tensor, valid: Tensor) -> tuple:
        return tuple(beam_search(policy, engine.derive, states, excluded, width=width, max_steps=max_steps,
                                 num_relations=engine.num_relations))

    return CompiledCall("prover_beams", run, batch_size, example)


def compiled_rollout(policy: ProofPolicy, engine: VectorEngine, max_steps: int, batch_size: int) -> CompiledCall:
    """The whole unrolled rollout (engine steps and policy) as one compiled graph over static buffers."""
    A, S = engine.shapes.max_atoms, engine.shapes.max_states
    device = engine.keys_head.device
    example = {"states": torch.zeros(1, A, 3, dtype=torch.long, device=device),
               "excluded": torch.zeros(1, 3, dtype=torch.long, device=device),
               "noise": torch.zeros(1, max_steps, S, device=device)}

    def run(policy: ProofPolicy, engine: VectorEngine, states: Tensor, excluded: Tensor, noise: Tensor,
            valid: Tensor) -> tuple[Tensor, ...]:
        return tuple(rollout(policy, engine.derive, states, excluded, noise, max_steps=max_steps,
                             num_relations=engine.num_relations))

    return CompiledCall("prover_rollout", run, batch_size, example)


def load_policy_scorer(run_dir: Path, config, dataset, engine: VectorEngine, derive: Deriver | None,
                       checkpoint: str | Path | None, device: torch.device | str, compile: bool = False) -> PolicyScorer:
    """The policy of a run's checkpoint (best, last or a file) as a scorer (compile: its beam search compiled)."""
    path = resolve_checkpoint(run_dir, checkpoint)
    state = load_checkpoint(path, map_location=device)
    check_digests(state, dataset.entities.digest(), dataset.relations.digest(), path)
    policy = ProofPolicy(dataset.num_entities, dataset.num_relations, engine.num_variables, config.embedding_dim,
                         engine.keys_head, config.entity_embeddings)
    policy.load_state_dict(state["policy_state"])
    return PolicyScorer(policy.to(device).eval(), engine, config.depth, derive, width=config.beam_width,
                        proof_score=config.proof_score, compile=compile)


def policy_proof(run, triple: tuple[int, int, int]):
    """The best proof the run's policy finds for ``triple`` (its beam search), as a reference Proof, or None."""
    scorer = run.model.prover if isinstance(run.model, HybridScorer) else run.model
    with torch.no_grad():
        beams = scorer.search(torch.tensor([triple]))
    if not bool(beams.success[0]):
        return None
    steps, num_facts = [], scorer.engine.num_facts
    for t in range(int(beams.length[0])):
        step = int(beams.step[0, t])
        state = unpad_states(beams.states[0, t : t + 1], scorer.num_relations)[0]
        kind, index = (FACT, step) if step < num_facts else (RULE, step - num_facts)
        confidence = math.log(run.rules.rules[index].confidence) if kind == RULE else 0.0
        steps.append(Derivation(state, kind, index, confidence))
    return Proof(tuple(steps), sum(s.log_confidence for s in steps), None)
