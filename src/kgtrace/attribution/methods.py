"""Attribution methods: each gives every training triple's attribution to each prediction, and declares itself
once, in a `MethodSpec` (`METHOD_SPECS`), from which explain, faithfulness, the LDS and the report
take what they offer and say.

A method maps (run, predictions [N, 3], inputs) to a matrix [N, n_train]: entry (i, j) says
how much training triple j raises prediction i's score (positive: a proponent). Methods:

* ``tracin-last`` / ``tracin-all``: TracInCP over every epoch checkpoint (lr-weighted), with
  the last-layer or all parameters (`TracIn`);
* ``tracin-last-final`` / ``tracin-all-final``: the same over the last checkpoint only;
* ``grad-dot``: the dot product of the two triples' loss gradients at the final weights, over
  every parameter (Bhardwaj et al., 2021): ``tracin-all-final`` without the learning rate;
* ``grad-cos``: their cosine, grad-dot over the product of the two gradients' norms;
* ``influence`` / ``influence-last``: influence functions with the exact, damped Hessian of the
  training objective at the final weights (`InfluenceFunction`),
  over every parameter or the last layer; refused for models too large to form the Hessian;
* ``influence-fisher``: influence functions for any model size, the Hessian replaced by the
  training triples' empirical Fisher kept block-diagonal (a W x W block per embedding row, the
  diagonal elsewhere; `fisher`);
* ``trak``: TRAK's projected-gradient estimator averaged over the run's checkpoints
  (`trak`);
* ``random``: independent standard normal draws, seeded (a baseline: LDS near 0);
* ``neighbourhood``: 1 for a training triple that shares an entity with the prediction, else 0
  (GradRollback's baseline as a score).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from kgtrace.attribution.fisher import fisher_influence
from kgtrace.attribution.influence import InfluenceFunction
from kgtrace.attribution.topk import TopK
from kgtrace.attribution.tracin import TracIn
from kgtrace.attribution.trak import TrakCost, TrakTime, default_ridge, trak
from kgtrace.core.config import MAX_SEED
from kgtrace.core.errors import ConfigError, option
from kgtrace.runs.embedding import Run

__all__ = ["AUTO_BUDGET_S", "Attribution", "AttributionInputs", "METHOD_SPECS", "MethodChoice", "MethodSpec",
           "attribution_signature", "attributions", "choose_method", "explain_methods", "lds_methods", "matrix_top_k",
           "method_note", "register", "removal_tops", "shares_an_entity"]


@dataclass(frozen=True)
class AttributionInputs:
    """What a method may need besides the run and the predictions; cannot be built invalid (every problem at once)."""

    seed: int = 0  # random: the draw; trak: the projections
    progress: bool = False
    damping: float = 1e-3  # influence: the first damping tried
    trak_dim: int | None = None  # trak: the projection dimension; None: the exact gradients
    trak_ridge: float | None = None  # trak: the ridge, a fraction of its kernel's mean nonzero eigenvalue; None: the model's

    def __post_init__(self) -> None:
        problems = []
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            problems.append(f"seed={self.seed!r}: must be an integer from 0 to 2**63 - 1")
        if not (isinstance(self.damping, (int, float)) and 0 < self.damping < math.inf):
            problems.append(f"damping={self.damping!r}: must be a positive finite number, e.g. 0.001")
        if self.trak_dim is not None and (not isinstance(self.trak_dim, int) or self.trak_dim < 1):
            problems.append(f"trak_dim={self.trak_dim!r}: must be at least 1 (or unset: the exact gradients)")
        if self.trak_ridge is not None and not (isinstance(self.trak_ridge, (int, float))
                                                and 0 < self.trak_ridge < math.inf):
            problems.append(f"trak_ridge={self.trak_ridge!r}: must be a positive finite number (or unset: the model's)")
        if problems:
            raise ConfigError(problems)


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


@dataclass(frozen=True)
class MethodSpec:
    """Everything kgtrace knows of one attribution method, declared once beside its code (as ``ModelSpec`` is
    for a model). explain, faithfulness, the LDS and the report derive what they offer and say from these.

    compute: (run, predictions [N, 3], inputs) -> [N, n_train] attributions; None for a method that only
    streams its top-k (``streaming``, TracIn's own pass in ``kgtrace explain``).
    """

    name: str
    compute: Attribution | None
    title: str  # the name of its values, as the console and the report print it beside them
    meaning: str  # what its values are, in words
    reads: tuple[str, ...] = ()  # the AttributionInputs fields its values depend on (a saved matrix is reused
    # while they are the same)
    checkpoints: Literal["all", "last", "none"] = "last"  # the checkpoints whose weights it differentiates
    revision: int = 1  # raised when its formula changes: results saved under an earlier one are recomputed
    explain: bool = False  # offered by ``kgtrace explain --method``
    streaming: bool = False  # explain's streaming top-k over any number of training triples (TracIn)
    lds: bool = False  # scored by ``kgtrace faithfulness lds`` unless --methods says otherwise
    removal: bool = False  # its top proponents are a removal method of ``kgtrace faithfulness``

    def used_checkpoints(self, run: Run) -> list[int]:
        """The epochs of the checkpoints whose weights it differentiates (none for the baselines)."""
        if self.checkpoints == "none":
            return []
        if self.checkpoints == "all":
            return [c.epoch for c in run.checkpoints]
        return [run.checkpoints[-1].epoch]


#: Every attribution method, by name, in the order they are offered (`register` adds one).
METHOD_SPECS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add an attribution method: from then on explain, faithfulness and the LDS offer it as its spec says."""
    if spec.name in METHOD_SPECS:
        raise ValueError(f"attribution method {spec.name!r} is registered already")
    if spec.compute is None and not spec.streaming:
        raise ValueError(f"attribution method {spec.name!r}: needs compute, or streaming (explain's own pass)")
    METHOD_SPECS[spec.name] = spec
    return spec


def attributions() -> dict[str, Attribution]:
    """The methods that give a whole matrix, by name."""
    return {name: spec.compute for name, spec in METHOD_SPECS.items() if spec.compute is not None}


def _offered_by(trait: str) -> tuple[str, ...]:
    """The methods whose spec sets ``trait`` (explain, lds, removal), in registration order."""
    return tuple(name for name, spec in METHOD_SPECS.items() if getattr(spec, trait))


def explain_methods() -> tuple[str, ...]:
    """``kgtrace explain --method``'s choices besides auto."""
    return _offered_by("explain")


def lds_methods() -> tuple[str, ...]:
    """The methods ``kgtrace faithfulness lds`` scores by default."""
    return _offered_by("lds")


def removal_tops() -> tuple[str, ...]:
    """The methods whose top proponents ``kgtrace faithfulness`` removes."""
    return _offered_by("removal")


def method_note(name: str) -> tuple[str, str]:
    """(the name of a method's values, what they are); a name no spec declares (an older file's) says so."""
    spec = METHOD_SPECS.get(name)
    return (spec.title, spec.meaning) if spec is not None else (name, "see the method's documentation")


_TRACIN = ("TracIn influence", "the sum over the saved checkpoints of the learning rate times the dot product of the "
                               "two triples' loss gradients")
_TRACIN_FINAL = ("TracIn influence (last checkpoint)", "the last checkpoint's learning rate times the dot product of "
                                                       "the two triples' loss gradients")
_INFLUENCE = "the prediction's loss gradient through the inverse of the damped training Hessian (exact) onto the " \
             "training triple's, at the final weights"
for _spec in (
    MethodSpec("tracin", None, *_TRACIN, checkpoints="all", explain=True, streaming=True),
    MethodSpec("tracin-last", _tracin("last", final_only=False), *_TRACIN, checkpoints="all", lds=True),
    MethodSpec("tracin-all", _tracin("all", final_only=False), *_TRACIN, checkpoints="all", lds=True),
    MethodSpec("tracin-last-final", _tracin("last", final_only=True), *_TRACIN_FINAL, lds=True),
    MethodSpec("tracin-all-final", _tracin("all", final_only=True), *_TRACIN_FINAL),
    MethodSpec("grad-dot", grad_dot, "Gradient similarity",
               "the dot product of the two triples' loss gradients at the final weights", explain=True, lds=True),
    MethodSpec("grad-cos", grad_cos, "Gradient cosine", "the cosine of the two triples' loss gradients at the final "
               "weights", explain=True, lds=True, removal=True),
    MethodSpec("influence", _influence("all"), "Influence (influence function)", _INFLUENCE, reads=("damping",),
               explain=True, lds=True, removal=True),
    MethodSpec("influence-last", _influence("last"), "Influence (influence function, last layer)", _INFLUENCE,
               reads=("damping",), explain=True),
    MethodSpec("influence-fisher", _fisher("all"), "Influence (influence function, block-diagonal Fisher)",
               "the prediction's loss gradient through the inverse of the training triples' damped Fisher, kept "
               "block-diagonal, onto the training triple's, at the final weights", reads=("damping",), explain=True,
               lds=True, removal=True),
    # revision 2: q_j from the run's objective (KvsAll: 1), not 1 - sigmoid; 3: lambda from trace / min(n, k)
    MethodSpec("trak", trak_method, "TRAK attribution", "the prediction's score gradient (projected with --trak-dim) "
               "against the training triple's, through the inverse of the training triples' kernel, times the "
               "training triple's weight under the run's objective (KvsAll: 1), averaged over the checkpoints",
               reads=("seed", "trak_dim", "trak_ridge"), checkpoints="all", revision=3, explain=True, lds=True,
               removal=True),
    MethodSpec("random", random_scores, "Random score", "independent standard normal draws, seeded (a baseline: LDS "
               "near 0)", reads=("seed",), checkpoints="none", lds=True),
    MethodSpec("neighbourhood", neighbourhood_scores, "Shares an entity", "1 for a training triple that shares the "
               "prediction's head or tail, else 0 (a baseline)", checkpoints="none", lds=True),
):
    register(_spec)


def attribution_signature(method: str, inputs: AttributionInputs, run: Run) -> dict:
    """What a saved result of ``method`` on ``run`` depends on besides the run and the predictions: the inputs it
    reads, as ``run``'s model resolves them (its own TRAK ridge for None, so a new default is a new signature),
    and its revision (a method's first revision adds nothing, so results saved before revisions stay valid)."""
    if inputs.trak_ridge is None:
        inputs = dataclasses.replace(inputs, trak_ridge=default_ridge(run.model))
    spec = METHOD_SPECS[method]
    signature: dict = {"inputs": {k: getattr(inputs, k) for k in spec.reads}}
    if spec.revision > 1:
        signature["revision"] = spec.revision
    return signature


#: ``choose_method``'s budget for TRAK, in seconds of this machine (``kgtrace explain --budget``).
AUTO_BUDGET_S = 180.0


@dataclass(frozen=True)
class MethodChoice:
    """The method ``choose_method`` picked for a run, and why, in words a console line can carry."""

    method: str  # "trak" or "tracin"
    reason: str


def choose_method(run: Run, budget: float = AUTO_BUDGET_S) -> MethodChoice:
    """``kgtrace explain --method auto``: TRAK, the best method by LDS on every benchmark graph
    (docs/benchmarks.md), where its exact gradients fit in memory and its time on this machine, estimated
    from two timed pilots (`TrakTime`), is within ``budget`` seconds; else TracIn, which streams over any
    number of training triples and parameters."""
    if not budget >= 0:  # also NaN
        raise ConfigError([f"{option('--budget', budget)}: must be a number of seconds, 0 or more"])
    cost = TrakCost.of(run)
    size = f"{cost.triples:,} training triples x {cost.parameters:,} parameters"
    if run.config.training == "negative-sampling":
        return MethodChoice("tracin", "TRAK weighs triples by a 1-N objective's probabilities, and this run trained "
                                      "with negative sampling")
    if not cost.fits:
        return MethodChoice("tracin", f"TRAK's exact gradients of {size} would take "
                                      f"{cost.feature_bytes / 2**30:.1f} GiB")
    estimate = TrakTime.measure(run)
    if estimate.seconds > budget:
        return MethodChoice("tracin", f"TRAK over {size} and {cost.checkpoints} checkpoints would take about "
                                      f"{estimate.seconds:,.0f} s here (two timed pilots), more than the budget of "
                                      f"{budget:g} s")
    return MethodChoice("trak", f"the best LDS on the benchmark graphs; over {size} and {cost.checkpoints} "
                                f"checkpoints it takes about {estimate.seconds:,.0f} s here (two timed pilots), "
                                f"within the budget of {budget:g} s")


def matrix_top_k(matrix: Tensor, test: Tensor, k: int) -> list[TopK]:
    """Per row of an attribution matrix [N, n_train]: the k largest (proponents, descending) and the k
    smallest (opponents, ascending), as `TopK` with one part (the whole value) per entry."""
    k = min(k, matrix.shape[1])
    best = matrix.float().topk(k, dim=1)  # [N, k] descending
    worst = matrix.float().topk(k, dim=1, largest=False)  # [N, k] ascending
    test = test.long().reshape(-1, 3)
    return [TopK(test[i], best.indices[i], best.values[i], best.values[i].unsqueeze(1),
                 worst.indices[i], worst.values[i], worst.values[i].unsqueeze(1)) for i in range(len(test))]
