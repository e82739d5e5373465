"""The scoring contract every knowledge-graph model in kgtrace fulfils.

Shapes use ``B`` for the batch, ``E`` for the number of entities, ``R`` for the number of
the dataset's relations and ``D`` for a model's query width.

Relation ids ``r`` in ``[0, R)`` are the dataset's relations; an id ``r + R`` in ``[R, 2R)``
denotes the inverse of relation ``r``, so a head query ``(?, r, t)`` is asked as the tail
query ``(t, r + R, ?)``. Training only ever asks such (anchor, relation-or-inverse) tail
queries, which is why every model accepts relation ids in ``[0, 2R)`` in ``score_t`` and
``encode_query``.

The protocols are structural (``typing.Protocol``): a model need not inherit from them,
and ``isinstance(model, FactorisedScorer)`` checks that the attributes and methods exist.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["FactorisedScorer", "QueryScorer", "Scorer", "forward_triples", "inverse_queries"]


@runtime_checkable
class Scorer(Protocol):
    """Scores (head, relation, tail) triples; higher scores are more plausible (logits)."""

    num_entities: int
    """E, the number of entities."""
    num_relations: int
    """R, the dataset's relations (not counting their inverses)."""

    def score_hrt(self, hrt: Tensor) -> Tensor:
        """Score whole triples.

        Args:
            hrt: LongTensor [B, 3] of (head, relation, tail) ids, relation in [0, R); a
                scorer that has ``score_t`` also takes relation ids in [R, 2R): ``(t, r + R, h)``
                is the head query ``(t, r + R, ?)`` answered by h, and its score is column h of
                ``score_t([t, r + R])`` (for ConvE, which learns inverse relations apart, not
                the score of (h, r, t)). A scorer without ``score_t`` gets [0, R) only (see
                `forward_triples`).
        Returns:
            scores [B] (logits).
        """
        ...

    def score_t(self, hr: Tensor) -> Tensor:
        """Score every entity as the tail of each (head, relation) query.

        Args:
            hr: LongTensor [B, 2] of (head, relation) ids. Relation ids in [R, 2R)
                denote the inverse of relation ``r - R``: ``score_t([t, r + R])`` scores every
                head h of (h, r, t).
        Returns:
            scores [B, E].
        """
        ...

    def score_h(self, rt: Tensor) -> Tensor:
        """Score every entity as the head of each (relation, tail) query.

        Args:
            rt: LongTensor [B, 2] of (relation, tail) ids, relation in [0, R).
        Returns:
            scores [B, E]; equals ``score_t`` of ``(t, r + R)``.
        """
        ...


@runtime_checkable
class QueryScorer(Protocol):
    """What scores every entity as the answer of a query: ``score_t`` (every `Scorer`; a scorer of
    whole triples alone, ``score_hrt`` only, is not one). Paths that can take a query's [E] scores at once
    ask ``isinstance(model, QueryScorer)``."""

    def score_t(self, hr: Tensor) -> Tensor:
        """As `Scorer.score_t`: hr [B, 2] (anchor, relation in [0, 2R)) -> scores [B, E]."""
        ...


@runtime_checkable
class FactorisedScorer(Scorer, Protocol):
    """A scorer whose ``score_t`` is ``decode(encode_query(hr))``.

    The split lets callers score entities chunk by chunk (entity-chunked losses, chunked
    evaluation) and reuse one query representation (TracIn fast paths).
    """

    def encode_query(self, hr: Tensor) -> Tensor:
        """Encode (head, relation) queries.

        Args:
            hr: LongTensor [B, 2] of (head, relation-or-inverse) ids, relation in [0, 2R).
        Returns:
            query representation [B, D]; D may differ from the entity dimension
                (e.g. ComplEx packs real and imaginary parts).
        """
        ...

    def decode(self, q: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """Score the entities ``start .. stop-1`` against encoded queries.

        Args:
            q: query representation [B, D] from `encode_query`.
            start: first entity id scored.
            stop: one past the last entity id scored; None means E.
        Returns:
            scores [B, stop - start].
        """
        ...

    def decode_ids(self, q: Tensor, ids: Tensor) -> Tensor:
        """Score, for each query, its own entities: column j of row b scores entity ``ids[b, j]``.

        Args:
            q: query representation [B, D] from `encode_query`.
            ids: LongTensor [B, C] of entity ids (negative sampling's candidates).
        Returns:
            scores [B, C], equal to ``decode(q).gather(1, ids)`` (in eval mode) without scoring all E.
        """
        ...


def inverse_queries(rt: Tensor, num_relations: int) -> Tensor:
    """Turn head queries into tail queries over inverse relations.

    Args:
        rt: LongTensor [B, 2] of (relation, tail) ids, relation in [0, R).
        num_relations: R.
    Returns:
        LongTensor [B, 2] of (tail, relation + R).
    """
    return torch.stack([rt[:, 1], rt[:, 0] + num_relations], dim=1)


def forward_triples(hrt: Tensor, num_relations: int) -> Tensor:
    """Write query-form triples with the relation as stated.

    Args:
        hrt: LongTensor [B, 3] of (anchor, relation-or-inverse, answer) ids, relation in [0, 2R).
        num_relations: R.
    Returns:
        LongTensor [B, 3] of (head, relation, tail), relation in [0, R): (t, r + R, h) becomes (h, r, t).
    """
    anchor, relation, answer = hrt.unbind(1)
    inverse = relation >= num_relations
    return torch.stack([torch.where(inverse, answer, anchor), torch.where(inverse, relation - num_relations, relation),
                        torch.where(inverse, anchor, answer)], dim=1)
