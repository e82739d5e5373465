"""RESCAL (Nickel et al., 2011): score(h, r, t) = e_h^T M_r e_t, a full D x D matrix per relation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import ModelSpec, PykeenLayout
from kgtrace.models._checks import check_sizes
from kgtrace.models._tables import (dropped, init_tables, ranking_by_relation, relation_groups, relation_ids, rows,
                                    table_problems)
from kgtrace.models.base import inverse_queries

__all__ = ["SPEC", "Rescal"]


class Rescal(nn.Module):
    """RESCAL; the head query (t, r + R) uses M_r transposed, which answers it exactly, unless
    ``inverse_relations`` gives each inverse its own matrix (options: `kgtrace.models._tables`).

    Parameters: ``entity_embeddings`` [E, D], ``relation_matrices`` [R, D * D] ([2R, D * D] with inverse
    relations), each row a matrix M_r read row-major, Xavier-normal over the whole table (or ``init_uniform``,
    ``init_normal``). Query representation: q = e_h^T M_r, [B, D].
    """

    def __init__(self, num_entities: int, num_relations: int, *, embedding_dim: int = 128,
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
        self.num_entities, self.num_relations, self.embedding_dim = num_entities, num_relations, embedding_dim
        self.inverse_relations = inverse_relations
        self.entity_dropout, self.relation_dropout = entity_dropout, relation_dropout
        self.entity_embeddings = nn.Parameter(torch.empty(num_entities, embedding_dim))
        self.relation_matrices = nn.Parameter(torch.empty((1 + inverse_relations) * num_relations,
                                                          embedding_dim * embedding_dim))
        init_tables(init_uniform, self.entity_embeddings, self.relation_matrices, init_normal=init_normal)
        self.sparse_grad = False  # sparse gradients of the rows read (kgtrace.models._tables.rows)

    def _entities(self, ids: Tensor) -> Tensor:
        """Entity ids [*] -> rows [*, D] (dropped out in training)."""
        return dropped(rows(self.entity_embeddings, ids, self.sparse_grad), self.entity_dropout, self.training)

    def _matrices(self, relations: Tensor) -> Tensor:
        """Relation-or-inverse ids [B] in [0, 2R) -> M [B, D, D], such that the query is e_anchor^T M: M_r for
        r, its transpose for r + R (or the inverse's own matrix with ``inverse_relations``)."""
        ids = relation_ids(relations, self.num_relations, self.inverse_relations)
        flat = dropped(rows(self.relation_matrices, ids, self.sparse_grad), self.relation_dropout, self.training)
        m = flat.view(-1, self.embedding_dim, self.embedding_dim)  # [B, D, D]
        if self.inverse_relations:
            return m
        inverse = (relations >= self.num_relations).view(-1, 1, 1)  # [B, 1, 1]
        return torch.where(inverse, m.transpose(1, 2), m)

    def encode_query(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> q = e_h^T M_r, [B, D]."""
        if ranking_by_relation(self):  # each relation's matrix read in place, once per batch
            return self._by_relation(self._entities(hr[:, 0]), hr[:, 1])
        return torch.bmm(self._entities(hr[:, 0]).unsqueeze(1), self._matrices(hr[:, 1])).squeeze(1)  # [B, 1, D]

    def _by_relation(self, x: Tensor, relations: Tensor) -> Tensor:
        """x [B, D] times each query's M (as `_matrices` gives it), one product per distinct relation of the batch
        instead of a gathered [B, D, D] copy."""
        distinct, groups = relation_groups(relations)
        matrices = self._matrices(distinct)  # [U, D, D]
        out = torch.empty_like(x)
        for u, at in enumerate(groups):
            out[at] = x[at] @ matrices[u]  # [n_u, D] @ [D, D]
        return out

    def decode(self, q: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """q [B, D] -> scores of entities start..stop-1, [B, stop - start]."""
        return q @ dropped(self.entity_embeddings[start:stop], self.entity_dropout, self.training).t()

    def decode_ids(self, q: Tensor, ids: Tensor) -> Tensor:
        """q [B, D], entity ids [B, C] -> each query's scores of its own entities [B, C]."""
        return torch.linalg.vecdot(self._entities(ids), q.unsqueeze(1))  # [B, C, D] . [B, 1, D]

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
    name="rescal",
    model_class=Rescal,
    last_layer=("entity_embeddings",),  # the tail side of the score (also the head side: one entity table)
    row_tables={"entity_embeddings": "entity", "relation_matrices": "relation"},
    factoriser="rows",
    # PyKEEN keeps M_r as a row of D * D entries, row-major, h on the first index: the same table.
    pykeen=PykeenLayout("RESCAL", relation="relation_matrices",
                        marker=("entity_representations.0.regularizer.", "relation_representations.0.regularizer.")),
)
