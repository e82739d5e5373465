"""ComplEx (Trouillon et al., 2016): score(h, r, t) = Re(sum_d h_d * r_d * conj(t_d)).

Storage layout: complex vectors of dimension D are stored as real tensors [N, 2D] whose
first D columns are the real parts and last D columns the imaginary parts ("real | imag").

Importing PyKEEN weights: PyKEEN (checked with 1.11) keeps a complex embedding of
dimension D as a real ``_embeddings.weight`` [N, 2D] that it reads as [N, D, 2] with
(real, imag) interleaved, i.e. ``torch.view_as_real`` of the complex [N, D] tensor.
Convert with ``w.view(N, D, 2).transpose(1, 2).reshape(N, 2 * D)`` (equivalently
``torch.cat([w[:, 0::2], w[:, 1::2]], dim=1)``); from a complex tensor ``z`` [N, D] use
``torch.cat([z.real, z.imag], dim=1)``. PyKEEN's ComplEx needs no inverse relations, so
its relation table [R, 2D] converts the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kgtrace.errors import ConfigError
from kgtrace.models._checks import check_sizes
from kgtrace.models.base import inverse_queries
from kgtrace.registry import ModelSpec

__all__ = ["SPEC", "ComplEx", "complex_query"]


def complex_query(entities: Tensor, relations: Tensor, hr: Tensor, num_relations: int) -> Tensor:
    """q = h * r as [Re | Im], [B, 2D], for (head, relation-or-inverse) ids hr [B, 2] over tables
    entities [E, 2D] and relations [R, 2D] in the real | imag layout; the inverse id r + R uses conj(r)."""
    h_real, h_imag = F.embedding(hr[:, 0], entities).chunk(2, dim=-1)  # [B, D] each, views
    r_packed = F.embedding(torch.remainder(hr[:, 1], num_relations), relations)  # [B, 2D]
    r_real, r_imag = r_packed.chunk(2, dim=-1)
    # conj flips the imaginary part's sign for the inverse ids.
    r_imag = r_imag * (1.0 - 2.0 * (hr[:, 1] >= num_relations).to(r_imag.dtype)).unsqueeze(1)  # [B, D]
    real = h_real * r_real - h_imag * r_imag
    imag = h_real * r_imag + h_imag * r_real
    return torch.cat([real, imag], dim=-1)  # [B, 2D]


class ComplEx(nn.Module):
    """ComplEx with inverse relations answered exactly through the conjugate relation.

    Re(<h, r, conj(t)>) = Re(<t, conj(r), conj(h)>), so the query (t, r + R) uses conj(r)
    and its scores over all entities are exactly the head scores of (?, r, t).

    Parameters: ``entity_embeddings`` [E, 2D] and ``relation_embeddings`` [R, 2D] in the
    real | imag layout, Xavier-normal over the whole table. Query representation:
    q = h * r packed as [Re | Im], [B, 2D], so that score = q . [Re(t) | Im(t)].
    """

    def __init__(self, num_entities: int, num_relations: int, *, embedding_dim: int = 200):
        super().__init__()
        problems: list[str] = []
        check_sizes(problems, num_entities, num_relations, embedding_dim)
        if problems:
            raise ConfigError(problems)
        self.num_entities = num_entities
        self.num_relations = num_relations
        self.embedding_dim = embedding_dim
        self.entity_embeddings = nn.Parameter(torch.empty(num_entities, 2 * embedding_dim))
        self.relation_embeddings = nn.Parameter(torch.empty(num_relations, 2 * embedding_dim))
        nn.init.xavier_normal_(self.entity_embeddings)
        nn.init.xavier_normal_(self.relation_embeddings)

    def encode_query(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> q = h * r as [Re | Im], [B, 2D]."""
        return complex_query(self.entity_embeddings, self.relation_embeddings, hr, self.num_relations)

    def decode(self, q: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """q [B, 2D] -> scores Re(<q, conj(t)>) of entities start..stop-1, [B, stop - start]."""
        # Re(q * conj(t)) = Re(q) Re(t) + Im(q) Im(t): one real matmul on the packed layout.
        return q @ self.entity_embeddings[start:stop].t()

    def score_t(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> scores of every tail [B, E]."""
        return self.decode(self.encode_query(hr))

    def score_h(self, rt: Tensor) -> Tensor:
        """[B, 2] (relation, tail) ids -> scores of every head [B, E]."""
        return self.score_t(inverse_queries(rt, self.num_relations))

    def score_hrt(self, hrt: Tensor) -> Tensor:
        """[B, 3] (head, relation, tail) ids -> scores [B]."""
        t = F.embedding(hrt[:, 2], self.entity_embeddings)  # [B, 2D]
        return torch.linalg.vecdot(self.encode_query(hrt[:, :2]), t)


SPEC = ModelSpec(
    name="complex",
    model_class=ComplEx,
    last_layer=("entity_embeddings",),  # the tail side of the score (also the head side: one entity table)
    row_tables={"entity_embeddings": "entity", "relation_embeddings": "relation"},
    factoriser="rows",
    pykeen="ComplEx",
)
