"""DistMult (Yang et al., 2015): score(h, r, t) = sum_d e_h[d] * w_r[d] * e_t[d]."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import ModelSpec, PykeenLayout
from kgtrace.models._checks import check_sizes
from kgtrace.models._tables import dropped, init_tables, relation_ids, rows, table_problems
from kgtrace.models.base import inverse_queries

__all__ = ["SPEC", "DistMult"]


class DistMult(nn.Module):
    """DistMult; symmetric in head and tail, so an inverse relation r + R reuses r's vector unless
    ``inverse_relations`` gives it its own (options: `kgtrace.models._tables`).

    Parameters: ``entity_embeddings`` [E, D], ``relation_embeddings`` [R, D] ([2R, D] with
    inverse relations, the inverses after the relations), Xavier-normal over the whole table
    (or ``init_uniform``, ``init_normal``). Query representation: q = e_h * w_r, [B, D].
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
        self.entity_embeddings = nn.Parameter(torch.empty(num_entities, embedding_dim))
        self.relation_embeddings = nn.Parameter(torch.empty((1 + inverse_relations) * num_relations, embedding_dim))
        init_tables(init_uniform, self.entity_embeddings, self.relation_embeddings, init_normal=init_normal)
        self.sparse_grad = False  # sparse gradients of the rows read (kgtrace.models._tables.rows)

    def _entities(self, ids: Tensor) -> Tensor:
        """Entity ids [B] -> rows [B, D] (dropped out in training)."""
        return dropped(rows(self.entity_embeddings, ids, self.sparse_grad), self.entity_dropout, self.training)

    def _relations(self, relations: Tensor) -> Tensor:
        """Relation-or-inverse ids [B] in [0, 2R) -> vectors [B, D] (dropped out in training)."""
        ids = relation_ids(relations, self.num_relations, self.inverse_relations)
        return dropped(rows(self.relation_embeddings, ids, self.sparse_grad), self.relation_dropout, self.training)

    def encode_query(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> q = e_h * w_r, [B, D]."""
        return self._entities(hr[:, 0]) * self._relations(hr[:, 1])

    def decode(self, q: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """q [B, D] -> scores of entities start..stop-1, [B, stop - start]."""
        return q @ dropped(self.entity_embeddings[start:stop], self.entity_dropout, self.training).t()

    def decode_ids(self, q: Tensor, ids: Tensor) -> Tensor:
        """q [B, D], entity ids [B, C] -> each query's scores of its own entities [B, C] (rows dropped out
        in training, each occurrence apart)."""
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
    name="distmult",
    model_class=DistMult,
    last_layer=("entity_embeddings",),  # the tail side of the score (also the head side: one entity table)
    row_tables={"entity_embeddings": "entity", "relation_embeddings": "relation"},
    factoriser="rows",
    pykeen=PykeenLayout("DistMult", marker=("relation_representations.0.regularizer.",)),  # PyKEEN regularizes its relations only
)
