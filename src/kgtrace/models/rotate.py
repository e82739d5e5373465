"""RotatE (Sun et al., 2019): score(h, r, t) = margin - ||h r - t||, each relation a rotation r_d = exp(i theta_d)
in the complex plane; the norm the sum of the moduli (the authors' code) or their Euclidean norm (PyKEEN's)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import ModelSpec, PykeenLayout
from kgtrace.models._checks import check_bool, check_sizes
from kgtrace.models._tables import inverse_sign, rows
from kgtrace.models.base import inverse_queries
from kgtrace.models.complex import complex_product
from kgtrace.models.transe import distance_chunks, euclidean, under_autograd

__all__ = ["SPEC", "RotatE"]

EPSILON = 2.0  # the authors' epsilon: entities start uniform in +-(margin + EPSILON) / D


class RotatE(nn.Module):
    """RotatE as its authors' code scores it (``RotatE`` in github.com/DeepGraphLearning/KnowledgeGraphEmbedding):
    the distance is the sum over dimensions of the moduli |h_d r_d - t_d| (``scoring_norm`` 1; 2: the Euclidean
    norm of the moduli, as PyKEEN's RotatE), and ``margin`` (their gamma) is added to every score, the logit
    offset of their self-adversarial sigmoid loss.

    |h r - t| = |t conj(r) - h| since |r| = 1, so the head query (t, r + R) rotates by -theta and answers
    (?, r, t) exactly, unless ``inverse_relations`` gives each inverse its own phases.

    Parameters: ``entity_embeddings`` [E, 2D] in the real | imag layout of `kgtrace.models.complex`, uniform in
    +-(margin + 2) / D as theirs; ``relation_phases`` [R, D] ([2R, D] with inverse relations), uniform in
    [-pi, pi]. Query representation: q = h r, [B, 2D].
    """

    def __init__(self, num_entities: int, num_relations: int, *, embedding_dim: int = 500, margin: float = 9.0,
                 scoring_norm: int = 1, inverse_relations: bool = False):
        super().__init__()
        problems: list[str] = []
        check_sizes(problems, num_entities, num_relations, embedding_dim)
        check_bool(problems, "inverse_relations", inverse_relations)
        if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not math.isfinite(margin) or margin < 0:
            problems.append(f"margin={margin!r}: must be a number >= 0; fix: e.g. margin=9 (the authors' FB15k-237 "
                            "gamma) or 6 (WN18RR)")
        if scoring_norm not in (1, 2) or isinstance(scoring_norm, bool):
            problems.append(f"scoring_norm={scoring_norm!r}: must be 1 or 2; fix: 1 sums the moduli (the authors'), 2 "
                            "takes their Euclidean norm (PyKEEN's)")
        if problems:
            raise ConfigError(problems)
        self.num_entities, self.num_relations, self.embedding_dim = num_entities, num_relations, embedding_dim
        self.margin, self.scoring_norm, self.inverse_relations = float(margin), scoring_norm, inverse_relations
        self.entity_embeddings = nn.Parameter(torch.empty(num_entities, 2 * embedding_dim))
        self.relation_phases = nn.Parameter(torch.empty((1 + inverse_relations) * num_relations, embedding_dim))
        bound = (self.margin + EPSILON) / embedding_dim
        nn.init.uniform_(self.entity_embeddings, -bound, bound)
        nn.init.uniform_(self.relation_phases, -math.pi, math.pi)
        self.sparse_grad = False  # sparse gradients of the rows read (kgtrace.models._tables.rows)

    def _rotations(self, relations: Tensor) -> Tensor:
        """Relation-or-inverse ids [B] -> r = exp(i theta) as [cos | sin], [B, 2D]; theta negated for r + R
        without inverse rows."""
        ids = relations if self.inverse_relations else relations.remainder(self.num_relations)
        theta = rows(self.relation_phases, ids, self.sparse_grad)  # [B, D]
        if not self.inverse_relations:
            theta = theta * inverse_sign(relations, self.num_relations, theta.dtype).unsqueeze(1)
        return torch.cat([torch.cos(theta), torch.sin(theta)], dim=-1)

    def encode_query(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> q = h r as [Re | Im], [B, 2D]."""
        return complex_product(rows(self.entity_embeddings, hr[:, 0], self.sparse_grad), self._rotations(hr[:, 1]))

    def _scores(self, q: Tensor, entities: Tensor) -> Tensor:
        """q [..., 2D] against entity rows [..., 2D] (broadcast) -> margin - ||(|q_d - e_d|)_d||_p."""
        difference = q - entities  # [..., 2D]: real | imaginary
        if self.scoring_norm == 2:  # the Euclidean norm of the moduli is that of the whole difference
            return self.margin - torch.linalg.vector_norm(difference, dim=-1)
        real, imaginary = difference[..., :self.embedding_dim], difference[..., self.embedding_dim:]  # [..., D] each
        if difference.requires_grad:  # vector_norm's gradient at a zero modulus is a subgradient (0), hypot's NaN
            moduli = torch.linalg.vector_norm(torch.stack([real, imaginary], dim=-1), dim=-1)  # [..., D]
        else:  # several times faster than a norm over a dimension of 2
            moduli = torch.hypot(real, imaginary)  # [..., D]
        return self.margin - moduli.sum(-1)

    def decode(self, q: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """q [B, 2D] -> scores of entities start..stop-1, [B, stop - start], in chunks of entities whose
        [B, chunk, 2D] differences stay within `kgtrace.models.transe.DIFFERENCES` entries; when ranking (no
        gradient) with ``scoring_norm`` 2, the Euclidean norm of the whole [Re | Im] difference by
        `kgtrace.models.transe.euclidean` (as TransE's decode)."""
        table = self.entity_embeddings[start:stop]  # [C, 2D]
        if self.scoring_norm == 2 and table.shape[0] and not under_autograd(q, table):
            return self.margin - euclidean(q, table)
        step = distance_chunks(table.shape[0], table.shape[1], q.shape[0])
        return torch.cat([self._scores(q.unsqueeze(1), table[i:i + step].unsqueeze(0))  # [B, 1, 2D] - [1, c, 2D]
                          for i in range(0, table.shape[0], step)], dim=1) if table.shape[0] else q.new_zeros(len(q), 0)

    def decode_ids(self, q: Tensor, ids: Tensor) -> Tensor:
        """q [B, 2D], entity ids [B, C] -> each query's scores of its own entities [B, C]."""
        return self._scores(q.unsqueeze(1), rows(self.entity_embeddings, ids, self.sparse_grad))

    def score_t(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> scores of every tail [B, E]."""
        return self.decode(self.encode_query(hr))

    def score_h(self, rt: Tensor) -> Tensor:
        """[B, 2] (relation, tail) ids -> scores of every head [B, E]."""
        return self.score_t(inverse_queries(rt, self.num_relations))

    def score_hrt(self, hrt: Tensor) -> Tensor:
        """[B, 3] (head, relation, tail) ids -> scores [B]."""
        return self._scores(self.encode_query(hrt[:, :2]), rows(self.entity_embeddings, hrt[:, 2], self.sparse_grad))


SPEC = ModelSpec(
    name="rotate",
    model_class=RotatE,
    last_layer=("entity_embeddings",),  # the tail side of the score (also the head side: one entity table)
    row_tables={"entity_embeddings": "entity", "relation_phases": "relation"},
    factoriser="rows",
    decodes_by_product=False,  # a distance per entity
    # PyKEEN's RotatE: no margin, the Euclidean norm, relations stored as unit complex numbers.
    pykeen=PykeenLayout("RotatE", relation="relation_phases", entity_form="complex", relation_form="phases",
                        dims=(("embedding_dim", "entity", 2),), implied=(("margin", 0.0), ("scoring_norm", 2))),
)
