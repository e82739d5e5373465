"""TransE (Bordes et al., 2013): score(h, r, t) = margin - ||e_h + w_r - e_t||_p, a translation per relation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import ModelSpec, PykeenLayout
from kgtrace.models._checks import check_sizes
from kgtrace.models._tables import dropped, init_tables, inverse_sign, relation_ids, rows, table_problems
from kgtrace.models.base import inverse_queries

__all__ = ["SPEC", "TransE", "distance_chunks", "euclidean", "under_autograd"]

#: Entries of the [B, chunk, D] differences a distance decode holds at once (4 MB of float32: on one CPU thread
#: RotatE ranked FB15k-237's entities with chunks of 4 MB in 1.4 s where 64 MB took 3.5 s, the intermediates
#: staying in cache).
DIFFERENCES = 1 << 20


def distance_chunks(rows_per_query: int, width: int, num_queries: int) -> int:
    """Entities per chunk of a distance decode: [B, chunk, width] differences within `DIFFERENCES` entries."""
    return max(1, min(rows_per_query, DIFFERENCES // max(1, num_queries * width)))


def euclidean(q: Tensor, table: Tensor) -> Tensor:
    """||q_i - e_j||_2 for ranking, q [B, D], table [C, D] -> [B, C] in q's dtype.

    float32 (and narrower) inputs take the matrix-product expansion |q|^2 + |e|^2 - 2 q.e, in float64: the
    expansion cancels where a distance is small beside the norms, and float64's rounding of the squared distance
    (about 1e-16 of the squared norms) stays below float32's of the distance itself for norms up to about 1e4,
    at the speed of a matrix product (about 20x torch.cdist's sums of squared differences on one CPU thread).
    float64 inputs keep cdist's sums, exact to their own rounding."""
    if q.dtype == torch.float64:
        return torch.cdist(q, table, compute_mode="donot_use_mm_for_euclid_dist")
    q64, table64 = q.double(), table.double()
    squared = q64.square().sum(1, keepdim=True) + table64.square().sum(1) - 2.0 * (q64 @ table64.t())  # [B, C]
    return squared.clamp_(min=0.0).sqrt_().to(q.dtype)


def under_autograd(*tensors: Tensor) -> bool:
    """Whether autograd records a computation on ``tensors`` (a parameter keeps ``requires_grad`` under
    ``torch.no_grad``): then a distance decode forms its differences, which are twice differentiable, where
    ranking takes ``torch.cdist``, which has no second derivative."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class TransE(nn.Module):
    """TransE with the p-norm distance (``scoring_norm`` 1 or 2) and a constant ``margin`` added to every score
    (the logit offset of a sigmoid loss; ranks do not depend on it). The head query (t, r + R) translates by
    -w_r: margin - ||(e_t - w_r) - e_h|| is exactly the score of (h, r, t), unless ``inverse_relations`` gives
    each inverse its own row (options: `kgtrace.models._tables`).

    Parameters: ``entity_embeddings`` [E, D], ``relation_embeddings`` [R, D] ([2R, D] with inverse relations),
    Xavier-normal over the whole table (or ``init_uniform``, ``init_normal``). Query representation:
    q = e_h + w_r, [B, D].
    """

    def __init__(self, num_entities: int, num_relations: int, *, embedding_dim: int = 200, scoring_norm: int = 1,
                 margin: float = 0.0, inverse_relations: bool = False, entity_dropout: float = 0.0,
                 relation_dropout: float = 0.0, init_uniform: list[float] | None = None,
                 init_normal: float | None = None):
        super().__init__()
        problems: list[str] = []
        check_sizes(problems, num_entities, num_relations, embedding_dim)
        problems += table_problems(inverse_relations=inverse_relations, entity_dropout=entity_dropout,
                                   relation_dropout=relation_dropout, init_uniform=init_uniform,
                                   init_normal=init_normal)
        if scoring_norm not in (1, 2) or isinstance(scoring_norm, bool):
            problems.append(f"scoring_norm={scoring_norm!r}: must be 1 or 2; fix: set scoring_norm to 1 (L1) or 2 (L2)")
        if not isinstance(margin, (int, float)) or isinstance(margin, bool) or margin != margin:
            problems.append(f"margin={margin!r}: must be a number; fix: e.g. margin=0")
        if problems:
            raise ConfigError(problems)
        self.num_entities, self.num_relations, self.embedding_dim = num_entities, num_relations, embedding_dim
        self.scoring_norm, self.margin = scoring_norm, float(margin)
        self.inverse_relations = inverse_relations
        self.entity_dropout, self.relation_dropout = entity_dropout, relation_dropout
        self.entity_embeddings = nn.Parameter(torch.empty(num_entities, embedding_dim))
        self.relation_embeddings = nn.Parameter(torch.empty((1 + inverse_relations) * num_relations, embedding_dim))
        init_tables(init_uniform, self.entity_embeddings, self.relation_embeddings, init_normal=init_normal)
        self.sparse_grad = False  # sparse gradients of the rows read (kgtrace.models._tables.rows)

    def _entities(self, ids: Tensor) -> Tensor:
        """Entity ids [*] -> rows [*, D] (dropped out in training)."""
        return dropped(rows(self.entity_embeddings, ids, self.sparse_grad), self.entity_dropout, self.training)

    def encode_query(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> q = e_h + w_r, [B, D] (e_t - w_r for an inverse r + R)."""
        relations = hr[:, 1]
        ids = relation_ids(relations, self.num_relations, self.inverse_relations)
        w = dropped(rows(self.relation_embeddings, ids, self.sparse_grad), self.relation_dropout, self.training)
        if not self.inverse_relations:
            w = w * inverse_sign(relations, self.num_relations, w.dtype).unsqueeze(1)  # -w_r for r + R
        return self._entities(hr[:, 0]) + w

    def _scores(self, q: Tensor, entities: Tensor) -> Tensor:
        """q [B, 1, D] or [B, D] against entity rows [B, C, D] or [C, D] -> margin - ||q - e||_p."""
        return self.margin - torch.linalg.vector_norm(q - entities, ord=self.scoring_norm, dim=-1)

    def decode(self, q: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """q [B, D] -> scores of entities start..stop-1, [B, stop - start].

        Ranking (no gradient) forms no [B, C, D] difference tensor: L1 by ``torch.cdist`` (on one CPU thread
        about 7x faster than differences in chunks), L2 by `euclidean` (a float64 matrix-product expansion), so
        its scores equal `_scores`' to rounding. Under autograd (training, the influence function's Hessian,
        which needs a second derivative that cdist lacks) the differences are formed in chunks of `DIFFERENCES`
        entries."""
        table = dropped(self.entity_embeddings[start:stop], self.entity_dropout, self.training)  # [C, D]
        if not table.shape[0]:
            return q.new_zeros(len(q), 0)
        if not under_autograd(q, table):
            if self.scoring_norm == 2:
                return self.margin - euclidean(q, table)
            return self.margin - torch.cdist(q, table, p=1)
        step = distance_chunks(table.shape[0], table.shape[1], q.shape[0])
        return torch.cat([self._scores(q.unsqueeze(1), table[i:i + step].unsqueeze(0))  # [B, 1, D] - [1, c, D]
                          for i in range(0, table.shape[0], step)], dim=1)

    def decode_ids(self, q: Tensor, ids: Tensor) -> Tensor:
        """q [B, D], entity ids [B, C] -> each query's scores of its own entities [B, C]."""
        return self._scores(q.unsqueeze(1), self._entities(ids))  # [B, 1, D] - [B, C, D]

    def score_t(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> scores of every tail [B, E]."""
        return self.decode(self.encode_query(hr))

    def score_h(self, rt: Tensor) -> Tensor:
        """[B, 2] (relation, tail) ids -> scores of every head [B, E]."""
        return self.score_t(inverse_queries(rt, self.num_relations))

    def score_hrt(self, hrt: Tensor) -> Tensor:
        """[B, 3] (head, relation, tail) ids -> scores [B]."""
        return self._scores(self.encode_query(hrt[:, :2]), self._entities(hrt[:, 2]))


SPEC = ModelSpec(
    name="transe",
    model_class=TransE,
    last_layer=("entity_embeddings",),  # the tail side of the score (also the head side: one entity table)
    row_tables={"entity_embeddings": "entity", "relation_embeddings": "relation"},
    factoriser="rows",
    decodes_by_product=False,  # a distance per entity
    # PyKEEN's TransE scores -||h + r - t||_p: no margin; its p is scoring_fct_norm (interaction.p).
    pykeen=PykeenLayout("TransE", kwargs=(("embedding_dim", "embedding_dim"), ("scoring_norm", "scoring_fct_norm")),
                        implied=(("margin", 0.0),), attributes=(("scoring_norm", "interaction.p"),)),
)
