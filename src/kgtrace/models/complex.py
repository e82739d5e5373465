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

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import ModelSpec, PykeenLayout
from kgtrace.models._checks import check_sizes
from kgtrace.models._tables import dropped, init_tables, inverse_sign, relation_ids, rows, table_problems
from kgtrace.models.base import inverse_queries

__all__ = ["SPEC", "ComplEx", "complex_product", "complex_query", "conjugate_inverses"]


def complex_product(h: Tensor, r: Tensor) -> Tensor:
    """q = h * r as [Re | Im], [B, 2D], for rows h and r [B, 2D] in the real | imag layout."""
    h_real, h_imag = h.chunk(2, dim=-1)  # [B, D] each, views
    r_real, r_imag = r.chunk(2, dim=-1)
    return torch.cat([h_real * r_real - h_imag * r_imag, h_real * r_imag + h_imag * r_real], dim=-1)  # [B, 2D]


def conjugate_inverses(r: Tensor, relations: Tensor, num_relations: int) -> Tensor:
    """Rows r [B, 2D] of relation-or-inverse ids ``relations`` [B] read at row ``id mod R``: conj(r) for the
    inverse ids r + R (the imaginary part's sign flipped), r itself for the others."""
    r_real, r_imag = r.chunk(2, dim=-1)
    sign = inverse_sign(relations, num_relations, r_imag.dtype)  # [B] +1, or -1 for an inverse
    return torch.cat([r_real, r_imag * sign.unsqueeze(1)], dim=-1)


def complex_query(entities: Tensor, relations: Tensor, hr: Tensor, num_relations: int) -> Tensor:
    """q = h * r as [Re | Im], [B, 2D], for (head, relation-or-inverse) ids hr [B, 2] over tables
    entities [E, 2D] and relations [R, 2D] in the real | imag layout; the inverse id r + R uses conj(r)."""
    r = F.embedding(torch.remainder(hr[:, 1], num_relations), relations)  # [B, 2D]
    return complex_product(F.embedding(hr[:, 0], entities), conjugate_inverses(r, hr[:, 1], num_relations))


class ComplEx(nn.Module):
    """ComplEx with inverse relations answered exactly through the conjugate relation, unless
    ``inverse_relations`` gives each inverse its own row (options: `kgtrace.models._tables`).

    Re(<h, r, conj(t)>) = Re(<t, conj(r), conj(h)>), so the query (t, r + R) uses conj(r)
    and its scores over all entities are exactly the head scores of (?, r, t).

    Parameters: ``entity_embeddings`` [E, 2D] and ``relation_embeddings`` [R, 2D] ([2R, 2D] with
    inverse relations) in the real | imag layout, Xavier-normal over the whole table (or
    ``init_uniform``, ``init_normal``). Query representation: q = h * r packed as [Re | Im], [B, 2D], so that
    score = q . [Re(t) | Im(t)].
    """

    def __init__(self, num_entities: int, num_relations: int, *, embedding_dim: int = 200,
                 inverse_relations: bool = False, entity_dropout: float = 0.0, relation_dropout: float = 0.0,
                 init_uniform: list[float] | None = None,
                 init_normal: float | None = None):
        super().__init__()
        problems: list[str] = []
        check_sizes(problems, num_entities, num_relations, embedding_dim)
        problems += table_problems(inverse_relations=inverse_relations, entity_dropout=entity_dropout,
                                   relation_dropout=relation_dropout, init_uniform=init_uniform,
                                   init_normal=init_normal)
        if problems:
            raise ConfigError(problems)
        self.num_entities = num_entities
        self.num_relations = num_relations
        self.embedding_dim = embedding_dim
        self.inverse_relations = inverse_relations
        self.entity_dropout, self.relation_dropout = entity_dropout, relation_dropout
        self.entity_embeddings = nn.Parameter(torch.empty(num_entities, 2 * embedding_dim))
        self.relation_embeddings = nn.Parameter(torch.empty((1 + inverse_relations) * num_relations,
                                                            2 * embedding_dim))
        init_tables(init_uniform, self.entity_embeddings, self.relation_embeddings, init_normal=init_normal)
        self.sparse_grad = False  # sparse gradients of the rows read (kgtrace.models._tables.rows)

    def _entities(self, ids: Tensor) -> Tensor:
        """Entity ids [B] -> rows [B, 2D] (dropped out in training)."""
        return dropped(rows(self.entity_embeddings, ids, self.sparse_grad), self.entity_dropout, self.training)

    def encode_query(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> q = h * r as [Re | Im], [B, 2D]."""
        ids = relation_ids(hr[:, 1], self.num_relations, self.inverse_relations)
        r = dropped(rows(self.relation_embeddings, ids, self.sparse_grad), self.relation_dropout, self.training)  # [B, 2D]
        if not self.inverse_relations:
            r = conjugate_inverses(r, hr[:, 1], self.num_relations)
        return complex_product(self._entities(hr[:, 0]), r)

    def decode(self, q: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """q [B, 2D] -> scores Re(<q, conj(t)>) of entities start..stop-1, [B, stop - start]."""
        # Re(q * conj(t)) = Re(q) Re(t) + Im(q) Im(t): one real matmul on the packed layout.
        return q @ dropped(self.entity_embeddings[start:stop], self.entity_dropout, self.training).t()

    def decode_ids(self, q: Tensor, ids: Tensor) -> Tensor:
        """q [B, 2D], entity ids [B, C] -> each query's scores of its own entities [B, C] (rows dropped out
        in training, each occurrence apart)."""
        return torch.linalg.vecdot(self._entities(ids), q.unsqueeze(1))  # [B, C, 2D] . [B, 1, 2D]

    def score_t(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> scores of every tail [B, E]."""
        return self.decode(self.encode_query(hr))

    def score_h(self, rt: Tensor) -> Tensor:
        """[B, 2] (relation, tail) ids -> scores of every head [B, E]."""
        return self.score_t(inverse_queries(rt, self.num_relations))

    def score_hrt(self, hrt: Tensor) -> Tensor:
        """[B, 3] (head, relation, tail) ids -> scores [B]."""
        return torch.linalg.vecdot(self.encode_query(hrt[:, :2]), self._entities(hrt[:, 2]))


SPEC = ModelSpec(
    name="complex",
    model_class=ComplEx,
    last_layer=("entity_embeddings",),  # the tail side of the score (also the head side: one entity table)
    row_tables={"entity_embeddings": "entity", "relation_embeddings": "relation"},
    factoriser="rows",
    pykeen=PykeenLayout("ComplEx", entity_form="complex", relation_form="complex", dims=(("embedding_dim", "entity", 2),),
                        # PyKEEN regularizes both tables (RESCAL too: their tables' shapes tell them apart)
                        marker=("entity_representations.0.regularizer.", "relation_representations.0.regularizer.")),
)
