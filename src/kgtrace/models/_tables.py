"""Options of the embedding-table models (DistMult, ComplEx), as LibKGE's tuned runs set them.

* ``inverse_relations``: a relation table of 2R rows, the inverse relation r + R with its own
  row (LibKGE's ``reciprocal_relations_model``, PyKEEN's ``create_inverse_triples``); without,
  the head query (t, r + R) reuses row r (DistMult: r itself; ComplEx: its conjugate), which
  answers it exactly.
* ``entity_dropout``, ``relation_dropout``: dropout on every embedding row read in training
  (LibKGE's ``entity_embedder.dropout`` / ``relation_embedder.dropout``): the query's anchor and
  relation rows, and the candidate entities' rows when scored; the identity in eval mode, where
  every attribution and evaluation runs.
* ``init_uniform``: [low, high] to draw both tables from U(low, high) instead of Xavier-normal.
  LibKGE's tuned configurations give only its ``uniform_.a`` (low) and so draw from
  U(a, 1.0), torch's default upper bound (uma-pi1/kge issue 244): their recipes pass [a, 1.0].
* ``init_normal``: a standard deviation to draw both tables from N(0, std^2) instead (LibKGE's
  ``normal_`` initialisation, its default); at most one of the two.

Every model reads its rows through `rows`, with its ``sparse_grad`` attribute (False when
built; ``kgtrace train --sparse`` sets it): then a table's gradient is a sparse tensor of the rows
a step read, as ``nn.Embedding(sparse=True)`` gives, instead of a dense one of the whole table.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kgtrace.models._checks import check_bool, check_dropout


def table_problems(*, inverse_relations: object, entity_dropout: object, relation_dropout: object,
                   init_uniform: object, init_normal: object = None) -> list[str]:
    """One line per bad table option (module doc), with its fix."""
    problems: list[str] = []
    check_bool(problems, "inverse_relations", inverse_relations)
    check_dropout(problems, "entity_dropout", entity_dropout)
    check_dropout(problems, "relation_dropout", relation_dropout)
    if init_uniform is not None:
        pair = isinstance(init_uniform, (list, tuple)) and len(init_uniform) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in init_uniform)
        if not pair or not init_uniform[0] < init_uniform[1]:
            problems.append(f"init_uniform={init_uniform!r}: must be [low, high] with low < high; fix: e.g. "
                            "init_uniform=[-0.9,1.0], or leave it unset for Xavier-normal")
    if init_normal is not None:
        if isinstance(init_normal, bool) or not isinstance(init_normal, (int, float)) or not (
                math.isfinite(init_normal) and init_normal > 0):
            problems.append(f"init_normal={init_normal!r}: must be a standard deviation > 0; fix: e.g. "
                            "init_normal=0.1, or leave it unset for Xavier-normal")
        elif init_uniform is not None:
            problems.append(f"init_uniform={init_uniform!r} and init_normal={init_normal!r}: both set; fix: keep one")
    return problems


def init_tables(init_uniform: list[float] | tuple[float, float] | None, *tables: nn.Parameter,
                init_normal: float | None = None) -> None:
    """Xavier-normal over each whole table, U(low, high) with ``init_uniform`` = [low, high], or N(0, std^2)
    with ``init_normal`` = std."""
    for table in tables:
        if init_uniform is not None:
            nn.init.uniform_(table, float(init_uniform[0]), float(init_uniform[1]))
        elif init_normal is not None:
            nn.init.normal_(table, 0.0, float(init_normal))
        else:
            nn.init.xavier_normal_(table)


def relation_ids(relations: Tensor, num_relations: int, inverse_relations: bool) -> Tensor:
    """Relation-or-inverse ids [B] in [0, 2R) -> rows of the relation table: r + R is its own row with
    ``inverse_relations``, row r without."""
    return relations if inverse_relations else relations.remainder(num_relations)


def ranking_by_relation(model: nn.Module) -> bool:
    """Whether a query's relation-specific matrix may be formed once per relation of the batch (TuckER, RESCAL):
    only when ranking (inference mode, eval mode), never under autograd, dropout or torch.func's transforms, which
    take no grouping that depends on the data."""
    return torch.is_inference_mode_enabled() and not model.training


def relation_groups(relations: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Relation-or-inverse ids [B] -> the distinct ones [U], and the positions [n_u] of the queries of each."""
    distinct, which = torch.unique(relations, return_inverse=True)  # [U], [B]
    order = torch.argsort(which, stable=True)
    return distinct, list(order.split(torch.bincount(which, minlength=len(distinct)).tolist()))


def inverse_sign(relations: Tensor, num_relations: int, dtype: torch.dtype) -> Tensor:
    """Relation-or-inverse ids [B] -> [B] of +1 for a relation r, -1 for an inverse r + R: the factor that turns r's
    parameters into its inverse's (ComplEx's conjugate, TransE's -w_r, RotatE's -theta)."""
    return 1.0 - 2.0 * (relations >= num_relations).to(dtype)


def rows(table: Tensor, ids: Tensor, sparse: bool) -> Tensor:
    """Rows of ``table`` [N, D] (or entries of a vector [N]) at ``ids`` [*]: [*, D] (or [*]); sparse: the
    table's gradient is a sparse tensor of the rows read (module doc)."""
    if table.dim() == 1:
        return torch.gather(table, 0, ids.reshape(-1), sparse_grad=sparse).view(ids.shape)
    return F.embedding(ids, table, sparse=sparse)


def dropped(values: Tensor, p: float, training: bool) -> Tensor:
    """``values`` with dropout p in training (a new tensor), else ``values`` itself: each value kept with
    probability 1 - p and scaled by 1 / (1 - p), as ``F.dropout``.

    On CPU the mask is ``torch.rand >= p``: F.dropout's bernoulli_ draws masks several times slower there,
    and LibKGE's recipes drop out the whole entity table twice a step. CUDA keeps F.dropout's fused kernel.
    """
    if not (training and p):
        return values
    if values.device.type != "cpu":
        return F.dropout(values, p, training=True)
    keep = torch.rand(values.shape) >= p  # float32 draws whatever the values' dtype: P(keep) = 1 - p to 2^-24
    return values * (keep.to(values.dtype) / (1.0 - p))
