"""NTP-lambda's link head: ComplEx on the policy's own entity and relation embeddings, trained beside PPO.

NTP-lambda (Rocktäschel and Riedel 2017, "End-to-end differentiable proving") trains a prover and
ComplEx together on shared embeddings. With ``link_weight > 0`` a prover run does the same:

- the policy's entity rows ``terms.weight[:E]`` [E, dim] and relation rows ``relations.weight[:R]``
  [R, dim] are read as ComplEx tables of dimension dim / 2, in `kgtrace.models.ComplEx`'s
  layout (real parts, then imaginary parts); `LinkHead` scores with them (a Scorer);
- its loss (`link_loss`) is the cross-entropy of each training triple's tail over all
  entities and of its head through the inverse query, plus ``n3`` times the N3 regulariser
  (Lacroix et al. 2018: the cubed moduli of the triple's head, relation and tail embeddings),
  which keeps ComplEx from overfitting small graphs;
- PPO adds ``link_weight`` times it, over the iteration's training triples, at every optimiser
  step, so both objectives shape the shared embeddings; ``link_epochs`` passes of it alone
  (`warm_up`: rows drawn at std ``link_init``, then Adagrad, Lacroix et al.'s recipe) may come first;
- a triple scores the head's logit + ``hybrid_weight`` x the proof part of its policy score
  (`kgtrace.prover.scorer.HybridScorer`), the weight chosen on validation triples by
  ``kgtrace prove weigh``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from kgtrace.data.answers import reciprocal_queries
from kgtrace.models.base import inverse_queries
from kgtrace.models.complex import complex_query

__all__ = ["LinkHead", "link_loss", "warm_up"]


class LinkHead(nn.Module):
    """ComplEx over a `ProofPolicy`'s tables (shared, not copied): a Scorer."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        assert policy.terms.weight.shape[1] % 2 == 0, "ProverConfig.validate requires an even embedding_dim"
        self.policy = policy
        self.num_entities, self.num_relations = policy.num_entities, policy.num_relations

    def entities(self) -> Tensor:
        return self.policy.terms.weight[: self.num_entities]  # [E, 2d]: real | imag

    def encode_query(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> q = h * r as [Re | Im], [B, 2d] (kgtrace's ComplEx query)."""
        return complex_query(self.entities(), self.policy.relations.weight[: self.num_relations], hr, self.num_relations)

    def score_t(self, hr: Tensor) -> Tensor:
        """[B, 2] -> [B, E]: Re(<h, r, conj(t)>) = q . [Re(t) | Im(t)] for every tail."""
        return self.encode_query(hr) @ self.entities().T

    def score_h(self, rt: Tensor) -> Tensor:
        return self.score_t(inverse_queries(rt, self.num_relations))

    def score_hrt(self, hrt: Tensor) -> Tensor:
        return torch.linalg.vecdot(self.encode_query(hrt[:, :2]), F.embedding(hrt[:, 2], self.entities()))

    def reset(self, std: float, generator: torch.Generator) -> None:
        """Draw the head's entity and relation rows from N(0, std^2); ComplEx-N3 starts small (Lacroix et al. use
        1e-3)."""
        with torch.no_grad():
            for rows in (self.entities(), self.policy.relations.weight[: self.num_relations]):
                rows.normal_(0.0, std, generator=generator)

    def n3(self, hrt: Tensor) -> Tensor:
        """Mean over triples [B, 3] of the cubed moduli of their head, relation and tail embeddings (N3)."""
        parts = (F.embedding(hrt[:, 0], self.entities()), F.embedding(hrt[:, 1], self.policy.relations.weight),
                 F.embedding(hrt[:, 2], self.entities()))
        cubes = [torch.stack(x.chunk(2, dim=-1)).pow(2).sum(0).pow(1.5).sum(-1) for x in parts]  # [B] each
        return sum(cubes).mean()


def link_loss(head: LinkHead, triples: Tensor, n3: float) -> Tensor:
    """Cross-entropy of each triple's tail and (inverse query) head over all entities, plus n3 x N3; a scalar."""
    queries, answers = reciprocal_queries(triples, head.num_relations)  # [2B, 2], [2B]
    return F.cross_entropy(head.score_t(queries), answers) + n3 * head.n3(triples)


def warm_up(head: LinkHead, train: Tensor, *, epochs: int, lr: float, n3: float, generator: torch.Generator,
            batch_size: int = 256) -> list[float]:
    """``epochs`` passes of `link_loss` alone over ``train`` [N, 3], with Adagrad on the head's tables only
    (Lacroix et al.'s optimiser for ComplEx-N3); returns each pass's mean loss."""
    tables = [head.policy.terms.weight, head.policy.relations.weight]
    optimizer = torch.optim.Adagrad(tables, lr=lr)
    losses = []
    for _ in range(epochs):
        total, batches = 0.0, 0
        for index in torch.randperm(len(train), generator=generator).split(batch_size):
            loss = link_loss(head, train[index], n3)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total, batches = total + float(loss.detach()), batches + 1
        losses.append(total / max(batches, 1))
    return losses
