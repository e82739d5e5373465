"""Influence functions (Koh & Liang, 2017) with the exact Hessian of the training objective.

influence(z, z') = grad l(z')^T (H + lambda I)^{-1} grad l(z)

* l(z) = softplus(-score_hrt(z)), the triple's own BCE-with-logits loss against label 1, as
  TracIn takes it (:mod:`.tracin`), so that the two compare; gradients over the selected
  parameters at the run's final weights, model in eval mode (dropout off).
* H: the Hessian of the run's training objective at those weights: the mean over every
  training example of the run's loss (KvsAll: BCE over all entities with the run's label
  smoothing, per query; 1vsAll: cross-entropy per (triple, direction)), formed exactly by
  reverse-over-reverse differentiation (``torch.func.jacrev`` of ``grad``) in float64.
* lambda: the damping. A trained model's H need not be positive definite (the loss is not
  convex in the embeddings); ``damping`` is tried first, then ten times more until the
  Cholesky factorisation succeeds. The damping used is kept in ``InfluenceFunction.damping``.

Sign: upweighting z by eps moves the weights by -eps (H + lambda I)^{-1} grad l(z) and so the
test loss by -eps * influence(z, z'): a positive influence is a proponent (training on z
lowers the loss of z', raises its score), as in TracIn.

Size: H has P x P entries for P selected parameters; forming it costs P Hessian-vector
products over the training set, factoring it P^3 / 3. ``max_params`` (default 20,000:
3.2 GB of float64) refuses larger sets with the fix (``params="last"`` or a smaller model).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, hessian, jacrev, vmap

from kgtrace.attribution.grads import ScoreHRT, per_sample_gradients
from kgtrace.attribution.params import select_parameters
from kgtrace.attribution.rows import row_tables
from kgtrace.config import TrainConfig
from kgtrace.errors import ConfigError, KgtraceError
from kgtrace.run import Run
from kgtrace.training.batches import Batches
from kgtrace.training.loss import smoothed_label_values

__all__ = ["InfluenceFunction", "dense_hessian", "row_hessian", "training_hessian"]

# Elements of the [basis vectors x queries x entities] scores one reverse-over-reverse call holds.
_HESSIAN_BLOCK_ELEMENTS = 1 << 24


class InfluenceFunction:
    """Exact-Hessian influence of a run's training triples on test triples (module doc).

    run: a loaded run; its model (final weights) is copied, not changed.
    params: "all" (default), "last" or a list of parameter names.
    damping: the first lambda tried (module doc).
    """

    def __init__(self, run: Run, params: str | Sequence[str] = "all", damping: float = 1e-3,
                 max_params: int = 20_000, chunk_size: int = 1024):
        self.model = copy.deepcopy(run.model).double().eval()
        self.names = select_parameters(self.model, params)
        sizes = dict((n, p.numel()) for n, p in self.model.named_parameters())
        self.num_params = sum(sizes[n] for n in self.names)
        if self.num_params > max_params:
            raise ConfigError([f"influence with the exact Hessian: {self.num_params:,} parameters selected "
                               f"({', '.join(self.names)}), more than max_params={max_params:,} (the Hessian "
                               f"would hold {self.num_params ** 2 * 8 / 1e9:.1f} GB); fix: select fewer "
                               "parameters (params='last'), train a smaller model, or raise max_params"])
        if damping <= 0:
            raise ConfigError([f"damping={damping}: must be positive"])
        self.train = run.dataset.train
        self.chunk_size = chunk_size
        hessian = training_hessian(self.model, run.dataset.train, run.dataset.num_relations, run.config, self.names)
        self.factor, self.damping = _damped_cholesky(hessian, damping)

    def influence(self, test: Tensor) -> Tensor:
        """Influence [n_test, n_train] (float64) of each training triple on each test triple."""
        g_test = per_sample_gradients(self.model, test.long().reshape(-1, 3), self.names)  # [n_test, P]
        solved = torch.cholesky_solve(g_test.T.contiguous(), self.factor)  # [P, n_test] = (H + lambda I)^-1 g_test
        parts = [per_sample_gradients(self.model, chunk, self.names) @ solved  # [chunk, n_test]
                 for chunk in self.train.split(self.chunk_size)]
        return torch.cat(parts).T.contiguous().detach()  # [n_test, n_train]


def training_hessian(model: nn.Module, train: Tensor, num_relations: int, config: TrainConfig,
                     names: Sequence[str]) -> Tensor:
    """The Hessian [P, P] of the mean training loss (module doc) over the parameters ``names``, in ``model``'s dtype.

    KvsAll training of a model whose parameters are all embedding tables (DistMult,
    ComplEx), all selected: :func:`row_hessian`, summing each (query, candidate) pair's
    Hessian over the three rows it reads. Otherwise :func:`dense_hessian`.
    """
    tables = row_tables(model)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if config.training == "kvsall" and list(names) == trainable and all(n in tables for n in names):
        return row_hessian(model, train, num_relations, config, names)
    return dense_hessian(model, train, num_relations, config, names)


def row_hessian(model: nn.Module, train: Tensor, num_relations: int, config: TrainConfig,
                names: Sequence[str], pairs_per_call: int = 2048) -> Tensor:
    """The KvsAll training Hessian of a model made of embedding tables, pair by pair.

    The loss is a sum over (query (a, r), candidate t) pairs of BCE(score(a, r, t), y), and
    each term reads three rows: entity a, relation r, entity t. Its Hessian over those rows
    (a [3, W, 3, W] block, ``torch.func.hessian`` of the model's own ``score_hrt`` on local
    tables, as :mod:`.rows` does for gradients) is added into H at their global rows; summed
    over the pairs this is H exactly (a row read twice, a = t, adds both of its parts).
    """
    tables = row_tables(model)
    params = dict(model.named_parameters())
    widths = {params[n].shape[1] if params[n].dim() > 1 else 1 for n in names}
    spaces = [tables[n] for n in names]
    if len(widths) != 1 or sorted(spaces) != ["entity", "relation"]:  # one table per space, one width
        return dense_hessian(model, train, num_relations, config, names)
    (width,) = widths
    first_row, rows_total = {}, 0
    for name in names:  # the flat parameter vector is the tables in ``names`` order, row-major
        first_row[tables[name]] = rows_total
        rows_total += params[name].shape[0]
    entity_table = names[spaces.index("entity")]
    relation_table = names[spaces.index("relation")]
    batches = Batches.build(train, num_relations, "kvsall")
    n_examples, n_entities = len(batches), model.num_entities
    positive, negative = smoothed_label_values(config.label_smoothing, n_entities, config.label_smoothing_style)
    wrapper = ScoreHRT(model)
    # Local ids: entity rows [a, t] as 0 and 1, the relation row as 0, or as R for an inverse
    # query (t, r + R): the models map r + R to row r themselves (DistMult as r, ComplEx as conj(r)).
    inverse_id = model.num_relations

    def pair_loss(local: Tensor, label: Tensor, relation: Tensor) -> Tensor:  # local [3, W]: rows a, r, t
        weights = {f"model.{entity_table}": local[[0, 2]], f"model.{relation_table}": local[1:2]}
        hrt = torch.stack([torch.zeros_like(relation), relation, torch.ones_like(relation)]).reshape(1, 3)
        score = functional_call(wrapper, weights, (hrt,), strict=False)
        return F.binary_cross_entropy_with_logits(score, label.reshape(1), reduction="sum")

    # ([n, 3, W], [n], [n]) -> [n, 3, W, 3, W]
    pair_hessian = vmap(hessian(pair_loss), in_dims=(0, 0, 0))
    blocks = torch.zeros(rows_total, rows_total, width, width, dtype=params[names[0]].dtype)  # H by row pairs
    queries_per_call = max(1, pairs_per_call // n_entities)
    entities = params[entity_table].detach()
    relations = params[relation_table].detach()
    candidates = torch.arange(n_entities)
    with torch.enable_grad():
        for pos in torch.arange(n_examples).split(queries_per_call):
            queries = batches.queries[pos]  # [B, 2]
            b = len(pos)
            labels = torch.full((b, n_entities), negative, dtype=entities.dtype)  # [B, E]
            query_rows, answer_cols = batches.index.pairs_at(pos)
            labels[query_rows, answer_cols] = positive
            relation_rows = torch.remainder(queries[:, 1], len(relations))  # [B]
            local = torch.stack([entities[queries[:, 0]].unsqueeze(1).expand(b, n_entities, width),
                                 relations[relation_rows].unsqueeze(1).expand(b, n_entities, width),
                                 entities.unsqueeze(0).expand(b, n_entities, width)], dim=2)  # [B, E, 3, W]
            local_relation = (queries[:, 1] >= len(relations)).long() * inverse_id  # [B]
            h = pair_hessian(local.reshape(-1, 3, width), labels.reshape(-1),
                             local_relation.repeat_interleave(n_entities))  # [B*E, 3, W, 3, W]
            rows = torch.stack([first_row["entity"] + queries[:, 0].repeat_interleave(n_entities),
                                first_row["relation"] + relation_rows.repeat_interleave(n_entities),
                                first_row["entity"] + candidates.repeat(b)], dim=1)  # [B*E, 3] global rows
            for i in range(3):
                for j in range(3):
                    blocks.index_put_((rows[:, i], rows[:, j]), h[:, i, :, j, :], accumulate=True)
    scale = 1.0 / (n_examples * n_entities)  # the loss is a mean over every (example, entity) element
    return (blocks.permute(0, 2, 1, 3).reshape(rows_total * width, rows_total * width) * scale).contiguous()


def dense_hessian(model: nn.Module, train: Tensor, num_relations: int, config: TrainConfig,
                  names: Sequence[str]) -> Tensor:
    """The training Hessian by reverse-over-reverse differentiation of the whole loss (any model, any loss).

    The objective is a sum over blocks of training examples, so H is summed block by block;
    each block's Hessian is ``jacrev(grad(loss))`` with the basis vectors vmapped in chunks.
    It costs P Hessian-vector products over the training set: minutes for P ~ 10^4.
    """
    batches = Batches.build(train, num_relations, config.training)
    params = dict(model.named_parameters())
    flat = torch.cat([params[n].detach().reshape(-1) for n in names])  # [P]
    shapes = [(n, params[n].shape, params[n].numel()) for n in names]
    frozen = {n: p.detach() for n, p in params.items() if n not in names}
    n_examples, n_entities = len(batches), model.num_entities
    positive, negative = smoothed_label_values(config.label_smoothing, n_entities, config.label_smoothing_style)
    rows = max(1, _HESSIAN_BLOCK_ELEMENTS // (256 * n_entities))  # examples per block, for 256 basis vectors

    def loss(theta: Tensor, pos: Tensor) -> Tensor:
        weights = dict(frozen)
        offset = 0
        for name, shape, size in shapes:
            weights[name] = theta[offset:offset + size].view(shape)
            offset += size
        scores = _score_t(model, weights, batches.queries[pos])  # [B, E]
        if batches.index is None:  # 1vsAll: cross-entropy of each example's answer
            return F.cross_entropy(scores, batches.answers[pos], reduction="sum") / n_examples
        labels = torch.full_like(scores, negative)  # [B, E]
        query_rows, answer_cols = batches.index.pairs_at(pos)
        labels[query_rows, answer_cols] = positive
        return F.binary_cross_entropy_with_logits(scores, labels, reduction="sum") / (n_examples * n_entities)

    hessian_sum = torch.zeros(len(flat), len(flat), dtype=flat.dtype)
    with torch.enable_grad():
        for pos in torch.arange(n_examples).split(rows):
            hessian_sum += jacrev(grad(loss), chunk_size=256)(flat, pos)  # [P, P]
    return (hessian_sum + hessian_sum.T) / 2  # exact up to rounding; made symmetric for the factorisation


class _ScoreT(nn.Module):
    """functional_call target whose forward is the wrapped model's ``score_t``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, queries: Tensor) -> Tensor:
        return self.model.score_t(queries)


def _score_t(model: nn.Module, weights: dict[str, Tensor], queries: Tensor) -> Tensor:
    """``model.score_t(queries)`` [B, E] with ``weights`` in place of the model's parameters."""
    return functional_call(_ScoreT(model), {f"model.{n}": w for n, w in weights.items()}, (queries,), strict=False)


def _damped_cholesky(hessian: Tensor, damping: float, tries: int = 12) -> tuple[Tensor, float]:
    """The lower Cholesky factor of ``hessian + lambda I`` and lambda: the first of damping x 10^k that factors."""
    eye = torch.eye(len(hessian), dtype=hessian.dtype)
    for k in range(tries):
        lam = damping * 10.0 ** k
        factor, info = torch.linalg.cholesky_ex(hessian + lam * eye)
        if int(info) == 0:
            return factor, lam
    scale = float(hessian.diagonal().abs().max()) if len(hessian) else math.nan
    raise KgtraceError(f"influence with the exact Hessian: H + lambda I is not positive definite up to lambda = "
                       f"{damping * 10.0 ** (tries - 1):g} (largest |diagonal| {scale:g}). Fix: pass a larger damping")
