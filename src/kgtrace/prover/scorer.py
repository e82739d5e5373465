"""Provers as scorers: the project's evaluation ranks them exactly as it ranks embedding models.

Each class here fulfils `kgtrace.models.base.Scorer` (score_hrt [B], score_t [B, E],
score_h [B, E]), so ``kgtrace.evaluate``, sampled corruptions and realistic ties apply as they
are. Scores:

* `BfsScorer` (the non-learned baseline): exhaustive proof search to depth d; a triple's
  score is its best proof's confidence, the product of the confidences of the rules it uses
  (facts count 1), and 0 when no proof is found within d steps. ``score_t`` searches the open
  query ``r(h, X)`` once and reads every answer's best proof, which equals searching each
  ``r(h, e)`` alone (a proof of one is a proof of the other, step for step; best proofs never
  revisit a state).
* `HybridScorer`: an embedding model's logit plus ``weight`` times how far a prover's score
  lies above its proof line, 0 for a triple it does not prove. Every prover scorer says where
  its proofs start (``proof_line``: scores above it are proofs): BFS scores a proof by its
  confidence and an unproved triple 0 (line 0); the policy scores a proof 1 + its confidence
  and an unproved triple its value estimate (line 1). So both hybrids add ``weight`` x the
  best found proof's confidence (the policy's other proof scores likewise, without the 1),
  and the embedding alone ranks what the prover does not prove (the policy's value estimate
  ranks unproved triples only when the policy is alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl
import torch
from torch import Tensor, nn

from kgtrace.display.frames import FrameKind, as_frame
from kgtrace.models.base import Scorer, forward_triples, inverse_queries
from kgtrace.prover.engine import VectorEngine, pad_states
from kgtrace.prover.logic import open_query_state, query_state
from kgtrace.prover.search import Deriver, eager_deriver, vector_search

__all__ = ["BfsScorer", "HybridScorer", "ProverReport", "proof_part", "prover_report"]


class BfsScorer(nn.Module):
    """Best proof confidence within ``depth`` steps, by exhaustive breadth-first search.

    overflow [3] counts what the engine's fixed shapes lost over every search so far (states,
    atoms, facts; see `kgtrace.prover.engine`).
    """

    proof_line = 0.0  # scores above it are proofs (an unproved triple scores 0)

    def __init__(self, engine: VectorEngine, depth: int, derive: Deriver | None = None, *, query_chunk: int = 256,
                 state_chunk: int = 2048):
        super().__init__()
        self.engine = engine
        self.depth = depth
        self.derive = derive or eager_deriver(engine)
        self.query_chunk, self.state_chunk = query_chunk, state_chunk
        self.num_entities, self.num_relations = engine.num_entities, engine.num_relations
        self.overflow = torch.zeros(3, dtype=torch.long)

    @torch.no_grad()
    def score_hrt(self, hrt: Tensor) -> Tensor:
        """Best proof confidence of each triple [B, 3] (h, r, t): [B], 0 when unproved; (t, r + R, h) is (h, r, t)."""
        ground = forward_triples(hrt.cpu(), self.num_relations)
        scores = [self._search([query_state(t) for t in part.tolist()], open_queries=False).log_confidence
                  for part in ground.split(self.query_chunk)]
        return self._confidence(scores, len(hrt), hrt.device)

    @torch.no_grad()
    def score_t(self, hr: Tensor) -> Tensor:
        """Best proof confidence of every tail of each (anchor, relation-or-inverse) [B, 2]: [B, E]."""
        E, R = self.num_entities, self.num_relations
        scores = [self._search([open_query_state(a, r, E, R) for a, r in part.tolist()], open_queries=True).answers
                  for part in hr.cpu().split(self.query_chunk)]
        return self._confidence(scores, len(hr), hr.device, E)

    def score_h(self, rt: Tensor) -> Tensor:
        return self.score_t(inverse_queries(rt, self.num_relations))

    def _search(self, states: list, open_queries: bool):
        device = self.engine.keys_head.device
        starts = pad_states(states, self.engine.shapes.max_atoms, self.num_relations).to(device)
        result = vector_search(self.engine, self.derive, starts, self.depth, open_queries=open_queries,
                               chunk=self.state_chunk)
        self.overflow += result.overflow.sum(0).cpu()
        return result

    @staticmethod
    def _confidence(parts: list[Tensor], n: int, device: torch.device, *width: int) -> Tensor:
        if not parts:
            return torch.zeros(n, *width, device=device)
        return torch.cat(parts).exp().float().to(device)  # exp(-inf) = 0: no proof


def proof_part(scores: Tensor, proof_line: float) -> Tensor:
    """How far a prover's scores (any shape) lie above ``proof_line`` where they are proofs, 0 elsewhere."""
    return torch.where(scores > proof_line, scores - proof_line, torch.zeros_like(scores))


class HybridScorer(nn.Module):
    """``embedding logit + weight * proof_part(prover score)`` for every triple (weight 0: the embedding
    model alone). ``prover`` must say where its proofs start (``proof_line``)."""

    def __init__(self, prover: Scorer, embedding: Scorer, weight: float):
        super().__init__()
        self.prover, self.embedding, self.weight = prover, embedding, weight
        self.num_entities, self.num_relations = embedding.num_entities, embedding.num_relations

    @torch.no_grad()
    def score_hrt(self, hrt: Tensor) -> Tensor:
        """[B, 3] -> [B]; relation ids in [R, 2R) ask head queries, as in score_t (both parts take them)."""
        proofs = proof_part(self.prover.score_hrt(hrt).float(), self.prover.proof_line).to(hrt.device)
        return self.embedding.score_hrt(hrt).float() + self.weight * proofs

    @torch.no_grad()
    def score_t(self, hr: Tensor) -> Tensor:
        proofs = proof_part(self.prover.score_t(hr).float(), self.prover.proof_line).to(hr.device)
        return self.embedding.score_t(hr).float() + self.weight * proofs

    def score_h(self, rt: Tensor) -> Tensor:
        return self.score_t(inverse_queries(rt, self.num_relations))


@dataclass(frozen=True)
class ProverReport:
    """What a prover scorer's engine lost to its fixed shapes so far (0 each: nothing; the ranks are exact).

    states: derived states dropped past max_states; atoms: states dropped for holding more than
    max_atoms goals; facts: fact candidates dropped past max_facts.
    """

    states: int
    atoms: int
    facts: int

    def to_dict(self) -> dict[str, dict[str, int]]:
        """As ``kgtrace evaluate`` writes it under "prover": {"overflow": {states, atoms, facts}}."""
        return {"overflow": {"states": self.states, "atoms": self.atoms, "facts": self.facts}}

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """One row: the overflow counts (columns states, atoms, facts)."""
        return as_frame(pl.DataFrame([self.to_dict()["overflow"]]), kind)


def prover_report(model: nn.Module) -> ProverReport:
    """What the engine of a prover scorer (or of a hybrid's prover part) lost to its fixed shapes so far."""
    prover = model.prover if isinstance(model, HybridScorer) else model
    return ProverReport(*(int(n) for n in prover.overflow.tolist()))
