"""TuckER (Balažević et al., 2019): score(h, r, t) = W x_1 e_h x_2 w_r x_3 e_t, a core tensor W shared by all
relations, with the batch norms and dropouts of the authors' code."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import ModelSpec, PykeenLayout
from kgtrace.models._checks import check_dropout, check_positive_int, check_sizes
from kgtrace.models._tables import ranking_by_relation, relation_groups, rows
from kgtrace.models.base import inverse_queries

__all__ = ["SPEC", "TuckER"]


class TuckER(nn.Module):
    """TuckER as its authors' code computes it (``TuckER`` in github.com/ibalazevic/TuckER):

    x = bn0(e_h), dropped (``input_dropout``); W_r = w_r W reshaped [De, De], dropped (``hidden_dropout1``);
    q = bn1(x W_r), dropped (``hidden_dropout2``); score = q . e_t.

    Inverse relations have their own rows (the authors train on every triple and its reciprocal), so the
    head query (?, r, t) is the tail query (t, r + R, ?).

    Parameters: ``entity_embeddings`` [E, De], ``relation_embeddings`` [2R, Dr] (Xavier-normal), ``core`` [Dr, De,
    De] (uniform in [-1, 1], as theirs), batch norms ``bn0`` and ``bn1`` over De. Query representation: q, [B, De].
    """

    def __init__(self, num_entities: int, num_relations: int, *, embedding_dim: int = 200, relation_dim: int = 200,
                 input_dropout: float = 0.3, hidden_dropout1: float = 0.4, hidden_dropout2: float = 0.5,
                 batch_norm: bool = True):
        super().__init__()
        problems: list[str] = []
        check_sizes(problems, num_entities, num_relations, embedding_dim)
        check_positive_int(problems, "relation_dim", relation_dim)
        for key, value in (("input_dropout", input_dropout), ("hidden_dropout1", hidden_dropout1),
                           ("hidden_dropout2", hidden_dropout2)):
            check_dropout(problems, key, value)
        if not isinstance(batch_norm, bool):
            problems.append(f"batch_norm={batch_norm!r}: must be true or false; fix: set batch_norm to true or false")
        if problems:
            raise ConfigError(problems)
        self.num_entities, self.num_relations = num_entities, num_relations
        self.embedding_dim, self.relation_dim = embedding_dim, relation_dim
        self.entity_embeddings = nn.Parameter(torch.empty(num_entities, embedding_dim))
        self.relation_embeddings = nn.Parameter(torch.empty(2 * num_relations, relation_dim))
        self.core = nn.Parameter(torch.empty(relation_dim, embedding_dim, embedding_dim))
        nn.init.xavier_normal_(self.entity_embeddings)
        nn.init.xavier_normal_(self.relation_embeddings)
        nn.init.uniform_(self.core, -1.0, 1.0)
        self.bn0 = nn.BatchNorm1d(embedding_dim) if batch_norm else nn.Identity()
        self.bn1 = nn.BatchNorm1d(embedding_dim) if batch_norm else nn.Identity()
        self.input_drop = nn.Dropout(input_dropout)
        self.hidden_drop1 = nn.Dropout(hidden_dropout1)
        self.hidden_drop2 = nn.Dropout(hidden_dropout2)
        self.sparse_grad = False  # sparse gradients of the rows read (kgtrace.models._tables.rows)

    def encode_query(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> q [B, De]."""
        x = self.input_drop(self.bn0(rows(self.entity_embeddings, hr[:, 0], self.sparse_grad)))  # [B, De]
        if ranking_by_relation(self):  # one core matrix per relation of the batch
            x = self._by_relation(x, hr[:, 1])
        else:  # each query its own (its own dropout; torch.func's transforms take no data-dependent grouping)
            w = rows(self.relation_embeddings, hr[:, 1], self.sparse_grad)  # [B, Dr]
            core = (w @ self.core.view(self.relation_dim, -1)).view(-1, self.embedding_dim, self.embedding_dim)
            x = torch.bmm(x.unsqueeze(1), self.hidden_drop1(core)).squeeze(1)  # [B, De, De]: [B, 1, De] -> [B, De]
        return self.hidden_drop2(self.bn1(x))

    def _by_relation(self, x: Tensor, relations: Tensor) -> Tensor:
        """x [B, De] times the core matrix W x_1 w_r of each query's relation [B], formed once per distinct relation:
        a batch of queries over few relations costs Dr De^2 per relation instead of per query."""
        distinct, groups = relation_groups(relations)
        w = self.relation_embeddings[distinct]  # [U, Dr]
        core = (w @ self.core.view(self.relation_dim, -1)).view(-1, self.embedding_dim, self.embedding_dim)  # [U, De, De]
        out = torch.empty_like(x)
        for u, at in enumerate(groups):
            out[at] = x[at] @ core[u]  # [n_u, De] @ [De, De]
        return out

    def decode(self, q: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """q [B, De] -> scores of entities start..stop-1, [B, stop - start]."""
        return q @ self.entity_embeddings[start:stop].t()

    def decode_ids(self, q: Tensor, ids: Tensor) -> Tensor:
        """q [B, De], entity ids [B, C] -> each query's scores of its own entities [B, C]."""
        return torch.linalg.vecdot(rows(self.entity_embeddings, ids, self.sparse_grad), q.unsqueeze(1))

    def score_t(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> scores of every tail [B, E]."""
        return self.decode(self.encode_query(hr))

    def score_h(self, rt: Tensor) -> Tensor:
        """[B, 2] (relation, tail) ids -> scores of every head [B, E]: the tail query (t, r + R)."""
        return self.score_t(inverse_queries(rt, self.num_relations))

    def score_hrt(self, hrt: Tensor) -> Tensor:
        """[B, 3] (head, relation-or-inverse, tail) ids -> scores [B]."""
        return self.decode_ids(self.encode_query(hrt[:, :2]), hrt[:, 2:]).squeeze(1)


SPEC = ModelSpec(
    name="tucker",
    model_class=TuckER,
    last_layer=("entity_embeddings",),  # the tail side: q . e_t
    row_tables={"entity_embeddings": "entity", "relation_embeddings": "relation"},
    factoriser="rows",
    inverse_relations=True,
    # PyKEEN's core tensor is [De, Dr, De] (its x_1 axis first); its dropouts are dropout_0/1/2.
    pykeen=PykeenLayout(
        "TuckER", parameters=(("core", "interaction.core_tensor", (1, 0, 2)),),
        modules=(("bn0", "interaction.head_batch_norm"), ("bn1", "interaction.head_relation_batch_norm")),
        dims=(("embedding_dim", "entity", 1), ("relation_dim", "relation", 1)),
        flags=(("batch_norm", "interaction.head_batch_norm."),),
        kwargs=(("embedding_dim", "embedding_dim"), ("relation_dim", "relation_dim"), ("input_dropout", "dropout_0"),
                ("hidden_dropout1", "dropout_1"), ("hidden_dropout2", "dropout_2"),
                ("batch_norm", "apply_batch_normalization")),
        attributes=(("input_dropout", "interaction.head_dropout.p"), ("hidden_dropout1", "interaction.relation_dropout.p"),
                    ("hidden_dropout2", "interaction.head_relation_dropout.p")),
        marker=("interaction.core_tensor",)),
)
