"""Influence functions (Koh & Liang, 2017) with the exact Hessian of the training objective.

influence(z, z') = grad l(z')^T (H + lambda I)^{-1} grad l(z)

* l(z) = softplus(-score_hrt(z)), the triple's own BCE-with-logits loss against label 1, as
  TracIn takes it (`.tracin`), so that the two compare; gradients over the selected
  parameters at the run's final weights, model in eval mode (dropout off).
* H: the Hessian of the run's training objective at those weights: the mean over every
  training example of the run's loss (KvsAll: BCE over all entities with the run's label
  smoothing, per query; kvsall-ce: its cross-entropy per query;
  1vsAll: cross-entropy per (triple, direction)), formed exactly by
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

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, jacrev

from kgtrace.attribution.grads import per_sample_gradients
from kgtrace.attribution.params import select_parameters
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.runs.embedding import Run, final_model
from kgtrace.training.batches import Batches
from kgtrace.training.loss import ce_target_weights, smoothed_label_values

__all__ = ["InfluenceFunction", "training_hessian"]

# Elements of the [basis vectors x queries x entities] scores one reverse-over-reverse call holds.
_HESSIAN_BLOCK_ELEMENTS = 1 << 24


class InfluenceFunction:
    """Exact-Hessian influence of a run's training triples on test triples (module doc).

    run: a loaded run; the weights are those of its last epoch checkpoint (the final weights, as
        the other methods of `.methods` take them), whichever checkpoint ``run.model`` holds.
    params: "all" (default), "last" or a list of parameter names.
    damping: the first lambda tried (module doc).
    """

    def __init__(self, run: Run, params: str | Sequence[str] = "all", damping: float = 1e-3,
                 max_params: int = 20_000, chunk_size: int = 1024):
        self.model = final_model(run).double()
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
    """The Hessian [P, P] of the mean training loss (module doc) over the parameters ``names``, in ``model``'s dtype,
    by reverse-over-reverse differentiation of the whole loss (any model, either training mode).

    The objective is a sum over blocks of training examples, so H is summed block by block;
    each block's Hessian is ``jacrev(grad(loss))`` with the basis vectors vmapped in chunks.
    It costs P Hessian-vector products over the training set: minutes for P ~ 10^4.
    """
    if config.training == "negative-sampling":
        raise KgtraceError("influence with the exact Hessian: the run trained with negative-sampling, whose loss "
                           "depends on the entities drawn at each step, so it has no one Hessian to invert. Fix: "
                           "explain it with TracIn (the default), grad-cos or the Fisher approximation "
                           "(--methods tracin-last,grad-cos,influence-fisher)")
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
        query_rows, answer_cols = batches.index.pairs_at(pos)
        if config.training == "kvsall-ce":  # cross-entropy against alpha at the answers + beta everywhere
            answers = torch.bincount(query_rows, minlength=len(pos))  # [B]
            alpha, beta = ce_target_weights(config.label_smoothing, n_entities, answers, config.label_smoothing_style)
            target = beta.to(scores.dtype)[:, None].expand_as(scores).clone()  # [B, E]
            target[query_rows, answer_cols] += alpha.to(scores.dtype)[query_rows]
            return F.cross_entropy(scores, target, reduction="sum") / n_examples
        labels = torch.full_like(scores, negative)  # [B, E]
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
