"""Attribution methods scored by the LDS: each gives every training triple's attribution to each prediction.

A method maps (run, predictions [N, 3], inputs) to a matrix [N, n_train]: entry (i, j) says
how much training triple j raises prediction i's score (positive: a proponent). Methods:

* ``tracin-last`` / ``tracin-all``: TracInCP over every epoch checkpoint (lr-weighted), with
  the last-layer or all parameters (:class:`~kgtrace.attribution.TracIn`);
* ``tracin-last-final`` / ``tracin-all-final``: the same over the last checkpoint only;
* ``grad-dot``: the dot product of the two triples' loss gradients at the final weights, over
  every parameter (Bhardwaj et al., 2021): ``tracin-all-final`` without the learning rate;
* ``grad-cos``: their cosine, grad-dot over the product of the two gradients' norms;
* ``influence`` / ``influence-last``: influence functions with the exact, damped Hessian of the
  training objective at the final weights (:class:`~kgtrace.attribution.influence.InfluenceFunction`),
  over every parameter or the last layer; refused for models too large to form the Hessian;
* ``influence-fisher``: influence functions for any model size, the Hessian replaced by the
  training triples' empirical Fisher kept block-diagonal (a W x W block per embedding row, the
  diagonal elsewhere; :mod:`~kgtrace.attribution.fisher`);
* ``trak``: TRAK's projected-gradient estimator averaged over the run's checkpoints
  (:func:`~kgtrace.attribution.trak.trak`);
* ``random``: independent standard normal draws, seeded (a baseline: LDS near 0);
* ``neighbourhood``: 1 for a training triple that shares an entity with the prediction, else 0
  (GradRollback's baseline as a score).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from kgtrace.attribution.fisher import fisher_influence
from kgtrace.attribution.influence import InfluenceFunction
from kgtrace.attribution.topk import TopK
from kgtrace.attribution.tracin import TracIn
from kgtrace.attribution.trak import TrakCost, default_ridge, trak
from kgtrace.run import Run

__all__ = ["ATTRIBUTIONS", "AUTO_TRAK_FLOPS", "Attribution", "AttributionInputs", "METHOD_INPUTS", "METHOD_NOTES",
           "METHOD_REVISIONS", "MethodChoice", "attribution_signature", "checkpoints_used", "choose_method",
           "matrix_top_k", "shares_an_entity"]


@dataclass(frozen=True)
class AttributionInputs:
    """What a method may need besides the run and the predictions."""

    seed: int = 0  # random: the draw; trak: the projections
    progress: bool = False
    damping: float = 1e-3  # influence: the first damping tried
    trak_dim: int | None = None  # trak: the projection dimension; None: the exact gradients
    trak_ridge: float | None = None  # trak: the ridge, a fraction of its kernel's mean nonzero eigenvalue; None: the model's


Attribution = Callable[[Run, Tensor, AttributionInputs], Tensor]


def _tracin(params: str, final_only: bool) -> Attribution:
    def method(run: Run, predictions: Tensor, inputs: AttributionInputs) -> Tensor:
        checkpoints = [run.checkpoints[-1].epoch] if final_only else "all"
        return TracIn(run, params=params, checkpoints=checkpoints).influence(predictions).double()
    return method


def grad_dot(run: Run, predictions: Tensor, inputs: AttributionInputs) -> Tensor:
    last = run.checkpoints[-1]
    return TracIn(run, params="all", checkpoints=[last.epoch]).influence(predictions).double() / last.lr


def grad_cos(run: Run, predictions: Tensor, inputs: AttributionInputs) -> Tensor:
    """grad-dot / (|g_prediction| |g_train|); a zero gradient (a saturated triple) gets cosine 0."""
    last = run.checkpoints[-1]
    dot = grad_dot(run, predictions, inputs)  # [N, n]
    train_norm = _gradient_norms(run, run.dataset.train, last.epoch) / last.lr ** 0.5  # [n]
    test_norm = _gradient_norms(run, predictions, last.epoch) / last.lr ** 0.5  # [N]
    denominator = test_norm.unsqueeze(1) * train_norm.unsqueeze(0)  # [N, n]
    return torch.where(denominator > 0, dot / denominator.clamp_min(1e-300), torch.zeros_like(dot))


def _gradient_norms(run: Run, triples: Tensor, epoch: int) -> Tensor:
    """sqrt(lr) |grad l(z)| [len(triples)] at the checkpoint of ``epoch``: TracIn's self-influence of ``triples``."""
    as_train = dataclasses.replace(run, dataset=dataclasses.replace(run.dataset, train=triples.long().reshape(-1, 3)))
    return TracIn(as_train, params="all", checkpoints=[epoch]).self_influence().double().clamp_min(0).sqrt()


def _influence(params: str) -> Attribution:
    def method(run: Run, predictions: Tensor, inputs: AttributionInputs) -> Tensor:
        return InfluenceFunction(run, params=params, damping=inputs.damping).influence(predictions).double()
    return method


def _fisher(params: str) -> Attribution:
    def method(run: Run, predictions: Tensor, inputs: AttributionInputs) -> Tensor:
        return fisher_influence(run, predictions, params=params, damping=inputs.damping)
    return method


def trak_method(run: Run, predictions: Tensor, inputs: AttributionInputs) -> Tensor:
    return trak(run, predictions, dim=inputs.trak_dim, seed=inputs.seed, ridge=inputs.trak_ridge)


def random_scores(run: Run, predictions: Tensor, inputs: AttributionInputs) -> Tensor:
    generator = torch.Generator().manual_seed(inputs.seed)
    return torch.randn(len(predictions), len(run.dataset.train), generator=generator, dtype=torch.float64)


def shares_an_entity(train: Tensor, triple: Tensor) -> Tensor:
    """[n] bool: the training triples [n, 3] that hold ``triple``'s head or tail [3], as head or tail."""
    ends = triple[[0, 2]]  # [2] the prediction's head and tail
    return torch.isin(train[:, 0], ends) | torch.isin(train[:, 2], ends)


def neighbourhood_scores(run: Run, predictions: Tensor, inputs: AttributionInputs) -> Tensor:
    train = run.dataset.train
    rows = [shares_an_entity(train, triple).double() for triple in predictions.long().reshape(-1, 3)]  # [n] each
    return torch.stack(rows) if rows else torch.zeros(0, len(train), dtype=torch.float64)


#: Attribution methods by name (module doc).
ATTRIBUTIONS: dict[str, Attribution] = {
    "tracin-last": _tracin("last", final_only=False),
    "tracin-all": _tracin("all", final_only=False),
    "tracin-last-final": _tracin("last", final_only=True),
    "tracin-all-final": _tracin("all", final_only=True),
    "grad-dot": grad_dot,
    "grad-cos": grad_cos,
    "influence": _influence("all"),
    "influence-last": _influence("last"),
    "influence-fisher": _fisher("all"),
    "trak": trak_method,
    "random": random_scores,
    "neighbourhood": neighbourhood_scores,
}

#: The AttributionInputs fields each method's values depend on (a saved matrix is reused while they are the same).
METHOD_INPUTS: dict[str, tuple[str, ...]] = {
    **{name: () for name in ATTRIBUTIONS},
    "influence": ("damping",), "influence-last": ("damping",), "influence-fisher": ("damping",),
    "trak": ("seed", "trak_dim", "trak_ridge"),
    "random": ("seed",),
}
#: Methods whose formula changed: results saved under an earlier revision are recomputed (absent: the first).
# trak 2: q_j from the run's objective (KvsAll: 1), not 1 - sigmoid; 3: lambda from trace / min(n, k), not trace / k.
METHOD_REVISIONS: dict[str, int] = {"trak": 3}


def attribution_signature(method: str, inputs: AttributionInputs, run: Run) -> dict:
    """What a saved result of ``method`` on ``run`` depends on besides the run and the predictions: the inputs it
    reads, as ``run``'s model resolves them (its own TRAK ridge for None, so a new default is a new signature),
    and its revision (a method's first revision adds nothing, so results saved before revisions stay valid)."""
    if inputs.trak_ridge is None:
        inputs = dataclasses.replace(inputs, trak_ridge=default_ridge(run.model))
    signature: dict = {"inputs": {k: getattr(inputs, k) for k in METHOD_INPUTS[method]}}
    if method in METHOD_REVISIONS:
        signature["revision"] = METHOD_REVISIONS[method]
    return signature


def checkpoints_used(method: str, run: Run) -> list[int]:
    """The epochs of the checkpoints whose weights ``method`` differentiates (none for the baselines)."""
    if method in ("random", "neighbourhood"):
        return []
    if method in ("tracin-last", "tracin-all", "trak"):
        return [c.epoch for c in run.checkpoints]
    return [run.checkpoints[-1].epoch]


#: ``choose_method`` picks TRAK up to this many floating-point operations in its kernels (TrakCost.flops): about
#: three minutes on one CPU core (UMLS ComplEx dim 32, eight checkpoints: 5.0e12 in 97 s).
AUTO_TRAK_FLOPS = 10**13


@dataclass(frozen=True)
class MethodChoice:
    """The method ``choose_method`` picked for a run, and why, in words a console line can carry."""

    method: str  # "trak" or "tracin"
    reason: str


def choose_method(run: Run) -> MethodChoice:
    """``kgtrace explain --method auto``: TRAK, the best method by LDS on every benchmark graph
    (docs/benchmarks.md), where its exact gradients fit and its kernels stay within ``AUTO_TRAK_FLOPS``;
    else TracIn, which streams over any number of training triples and parameters."""
    cost = TrakCost.of(run)
    size = f"{cost.triples:,} training triples x {cost.parameters:,} parameters"
    if run.config.training == "negative-sampling":
        return MethodChoice("tracin", "TRAK weighs triples by a 1-N objective's probabilities, and this run trained "
                                      "with negative sampling")
    if not cost.fits:
        return MethodChoice("tracin", f"TRAK's exact gradients of {size} would take "
                                      f"{cost.feature_bytes / 2**30:.1f} GiB")
    if cost.flops > AUTO_TRAK_FLOPS:
        return MethodChoice("tracin", f"TRAK over {size} and {cost.checkpoints} checkpoints would take "
                                      f"{cost.flops:.1e} operations, more than {AUTO_TRAK_FLOPS:.0e}")
    return MethodChoice("trak", f"the best LDS on the benchmark graphs; its exact gradients of {size} fit "
                                f"({cost.feature_bytes / 2**30:.2f} GiB, {cost.flops:.1e} operations over "
                                f"{cost.checkpoints} checkpoints)")


def matrix_top_k(matrix: Tensor, test: Tensor, k: int) -> list[TopK]:
    """Per row of an attribution matrix [N, n_train]: the k largest (proponents, descending) and the k
    smallest (opponents, ascending), as :class:`TopK` with one part (the whole value) per entry."""
    k = min(k, matrix.shape[1])
    best = matrix.float().topk(k, dim=1)  # [N, k] descending
    worst = matrix.float().topk(k, dim=1, largest=False)  # [N, k] ascending
    test = test.long().reshape(-1, 3)
    return [TopK(test[i], best.indices[i], best.values[i], best.values[i].unsqueeze(1),
                 worst.indices[i], worst.values[i], worst.values[i].unsqueeze(1)) for i in range(len(test))]


#: Each method's name for its values and what they are (explain's console and the report say it beside them).
METHOD_NOTES = {
    "tracin": ("TracIn influence", "the sum over the saved checkpoints of the learning rate times the dot product "
                                   "of the two triples' loss gradients"),
    "trak": ("TRAK attribution", "the prediction's score gradient (projected with --trak-dim) against the training "
                                 "triple's, through the inverse of the training triples' kernel, times the training "
                                 "triple's weight under the run's objective (KvsAll: 1), averaged over the checkpoints"),
    "influence": ("Influence (influence function)", "the prediction's loss gradient through the inverse of the "
                                                    "damped training Hessian (exact) onto the training triple's, at "
                                                    "the final weights"),
    "influence-last": ("Influence (influence function, last layer)", "the prediction's loss gradient through the "
                                                                     "inverse of the damped training Hessian (exact) "
                                                                     "onto the training triple's, at the final weights"),
    "influence-fisher": ("Influence (influence function, block-diagonal Fisher)", "the prediction's loss gradient "
                         "through the inverse of the training triples' damped Fisher, kept block-diagonal, onto the "
                         "training triple's, at the final weights"),
    "grad-dot": ("Gradient similarity", "the dot product of the two triples' loss gradients at the final weights"),
    "grad-cos": ("Gradient cosine", "the cosine of the two triples' loss gradients at the final weights"),
}
