"""TRAK (Park et al., 2023) for a run's triples: score gradients, an ensemble over checkpoints.

A training triple z_j enters the run's 1-N objective through its score f(z_j) = score_hrt(z_j),
a logit. At one model theta, with R [P, k] either the identity (k = P: the exact gradients, the
default) or a random projection (Gaussian, entries N(0, 1/k), ``dim=k``):

    phi(z)     = R^T grad_theta f(z)                       [k]   the gradient's features
    Phi        = [phi(z_1); ...; phi(z_n)]                 [n, k] over the training triples
    q_j        = how the loss's gradient changes when z_j is left out, per unit of grad f(z_j)
    tau(z, j)  = phi(z)^T (Phi^T Phi + lambda I)^{-1} phi(z_j) q_j

TRAK's estimate of how much training on z_j raises f(z) (positive: a proponent, as TracIn's
sign). TRAK derives q_j for a dataset of independent examples: leaving a binary example out
removes its loss, whose gradient is -(1 - sigmoid(f)) grad f, so q_j = 1 - sigmoid(f(z_j)).
A 1-N objective does not remove anything when z_j is left out (``removal_weights``):

* KvsAll: every query (h, r) is scored against all tails with BCE and z_j's tail is one of its
  labels; leaving z_j out turns that label from positive to negative (its smoothed values
  1 - eps and eps), which changes the loss's gradient by the label difference times grad f(z_j):
  the same for every triple, q_j = 1. (Training also asks the reciprocal query (t, r^-1), whose
  score of the head is f(z_j) again for DistMult and ComplEx; ConvE's has its own relation
  embedding, and phi keeps the forward score's gradient only.)
* 1vsAll: z_j's cross-entropy over all tails goes, gradient -(1 - p_j) grad f(z_j) plus the
  other tails' terms; as TRAK's multi-class case, q_j = 1 - p_j with p_j the softmax
  probability of z_j's tail among all tails.
* KvsAll with cross-entropy (``kvsall-ce``): the query (h, r) of z_j has n_j answers and a target of
  alpha(n_j) + beta(n_j) at each, beta(n_j) elsewhere (``ce_target_weights``). Leaving z_j out sets
  its target to beta(n_j - 1), which changes the loss's gradient by that difference times grad f(z_j)
  plus the other tails' terms: q_j = alpha(n_j) + beta(n_j) - beta(n_j - 1) (1/n_j without smoothing).
  With n_j = 1 the query itself goes, as a 1vsAll example does: q_j = alpha(1) + beta(1) - p_j.

The estimate is averaged over an ensemble of models: here the run's epoch checkpoints, each
with its own projection (seeded by (seed, c)). The paper trains independent models instead;
checkpoints of one run are the cheap ensemble it also discusses.

lambda = ``ridge`` x the mean of the kernel's nonzero eigenvalues, trace(Phi^T Phi) / min(n, k)
(its rank is at most min(n, k)). Parameters that no triple's gradient touches leave it unchanged;
the mean diagonal, trace / k, would shrink with them once k > n.

The projection exists to make Phi fit: TRAK's models have millions of parameters. Where the exact
gradients fit (n x P x 8 bytes within ``MAX_FEATURE_BYTES``, as for the bundled graphs' small
models) they are used as they are (docs/benchmarks.md compares the two). The kernel is solved in
whichever space is smaller: by the push-through identity
Phi (Phi^T Phi + lambda I)^-1 = (Phi Phi^T + lambda I)^-1 Phi, an [n, n] system when k > n.

Gradients are over every parameter, computed per triple with ``torch.func`` (model in eval mode),
a chunk at a time (and projected at once), so memory holds Phi [n, k] besides one chunk's
[chunk, P] and R.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from kgtrace.attribution.grads import per_sample_gradients
from kgtrace.attribution.params import select_parameters
from kgtrace.core.checkpoint import load_checkpoint
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import KgtraceError, option
from kgtrace.core.specs import DEFAULT_TRAK_RIDGE, spec_of
from kgtrace.runs.embedding import Run, model_from_checkpoint
from kgtrace.training.loss import ce_target_weights

__all__ = ["TrakCost", "TrakTime", "default_ridge", "removal_weights", "trak", "trak_ridges"]

# The projection matrix R [P, k] (float32) may take at most this many bytes.
MAX_PROJECTION_BYTES = 2 << 30
# Phi [n, k] counted at 8 bytes an entry may take at most this many bytes: float32 itself, and its kernel
# (at most min(n, k)^2 <= n k entries) in float64.
MAX_FEATURE_BYTES = 2 << 30


@dataclass(frozen=True)
class TrakCost:
    """What exact TRAK (no projection) over a run takes: Phi [n, P] per checkpoint, and its kernel's product."""

    triples: int  # n, the training triples
    parameters: int  # P, every parameter of the model
    checkpoints: int  # the ensemble: every epoch checkpoint

    @classmethod
    def of(cls, run: Run) -> TrakCost:
        return cls(len(run.dataset.train), _size(run.model, select_parameters(run.model, "all")), len(run.checkpoints))

    @property
    def feature_bytes(self) -> int:
        """Phi counted at 8 bytes an entry, as ``MAX_FEATURE_BYTES`` bounds it."""
        return self.triples * self.parameters * 8

    @property
    def fits(self) -> bool:
        return self.feature_bytes <= MAX_FEATURE_BYTES

    @property
    def flops(self) -> int:
        """The kernel products over all checkpoints: 2 n P min(n, P) each (Phi Phi^T or Phi^T Phi)."""
        n, size = self.triples, self.parameters
        return 2 * n * size * min(n, size) * self.checkpoints


@dataclass(frozen=True)
class TrakTime:
    """Exact TRAK's time over a run on this machine, from timed pilots and measured rates.

    Each checkpoint costs about ``load + linear * n + kernel_flops / matmul_rate + solve_flops /
    solve_rate`` seconds for n training triples of P parameters, m = min(n, P): the score gradients
    and their copies grow with n (``linear``: the slope between two timed pilots of exact TRAK on the
    first ``pilots`` training triples, where the kernel is negligible); the kernel Phi Phi^T (or
    Phi^T Phi) takes 2 n P m operations in float32 and its Cholesky solve m^3 / 3 in float64, each at
    the rate a product and a solve of their shapes reach here, timed.
    """

    pilots: tuple[int, int]  # training triples in each timed pilot
    pilot_seconds: tuple[float, float]
    load: float  # seconds to load one checkpoint
    linear: float  # seconds per training triple, per checkpoint: gradients and copies
    matmul_rate: float  # float32 operations per second of a kernel-shaped product, timed
    solve_rate: float  # float64 operations per second of a Cholesky solve, timed
    triples: int
    parameters: int
    checkpoints: int

    @property
    def seconds(self) -> float:
        kernel = TrakCost(self.triples, self.parameters, checkpoints=1).flops  # counted in tests/test_lds.py
        solve = min(self.triples, self.parameters) ** 3 / 3.0
        per_checkpoint = self.load + self.linear * self.triples + kernel / self.matmul_rate + solve / self.solve_rate
        return self.checkpoints * per_checkpoint

    @classmethod
    def measure(cls, run: Run, pilots: tuple[int, int] = (32, 96)) -> TrakTime:
        """Time exact TRAK on ``pilots`` training triples of ``run`` (its model), a checkpoint's loading, a product
        and a solve shaped as the run's, and fit."""
        train, cost = run.dataset.train, TrakCost.of(run)
        small, large = (min(m, len(train)) for m in pilots)
        _timed_pilot(run, train[:small])  # a warm-up: the first call pays for allocations the others reuse
        times = (_timed_pilot(run, train[:small]), _timed_pilot(run, train[:large]))
        start = time.perf_counter()
        model_from_checkpoint(load_checkpoint(run.checkpoints[-1].path))
        load = time.perf_counter() - start
        linear = (times[1] - times[0]) / (large - small) if large > small else times[1] / max(large, 1)
        linear = max(linear, times[1] / max(large, 1) / 4)  # noise never makes gradients nearly free
        m = min(cost.triples, cost.parameters)
        return cls((small, large), times, load, linear, _matmul_rate(m, max(cost.triples, cost.parameters)),
                   _solve_rate(m), cost.triples, cost.parameters, cost.checkpoints)


def _timed_pilot(run: Run, train: Tensor) -> float:
    """Seconds of one checkpoint's exact TRAK over ``train`` (one test triple, the run's model)."""
    start = time.perf_counter()
    _one_model(run.model, train, train[:1], None, 0, 512, [DEFAULT_TRAK_RIDGE], run.config)
    return time.perf_counter() - start


def _matmul_rate(m: int, inner: int) -> float:
    """float32 operations per second of a product [d, q] @ [q, d] shaped as the kernel's (d up to 512, q up to 8192),
    the best of three after a warm-up."""
    d, q = max(1, min(m, 512)), max(1, min(inner, 8192))
    a = torch.randn(d, q, generator=torch.Generator().manual_seed(0))
    return 2.0 * d * d * q / _best_time(lambda: a @ a.T)


def _solve_rate(m: int) -> float:
    """float64 operations (d^3 / 3) per second of a Cholesky solve of a d x d positive definite matrix (d up to
    512), the best of three after a warm-up."""
    d = max(2, min(m, 512))
    a = torch.randn(d, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    spd = a @ a.T + d * torch.eye(d, dtype=torch.float64)
    right = torch.ones(d, 1, dtype=torch.float64)
    return d ** 3 / 3.0 / _best_time(lambda: _solve_positive(spd, right))


def _best_time(work) -> float:
    work()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def default_ridge(model: nn.Module) -> float:
    """TRAK's ridge for ``model`` when none is given: its model spec's ``trak_ridge``."""
    spec = spec_of(model)
    return DEFAULT_TRAK_RIDGE if spec is None else spec.trak_ridge


def trak(run: Run, test: Tensor, dim: int | None = None, seed: int = 0, chunk_size: int = 512,
         checkpoints: Sequence[int] | None = None, ridge: float | None = None) -> Tensor:
    """TRAK attributions [n_test, n_train] (float64) of the run's training triples (module doc).

    dim: the random projection's dimension k; None: the exact gradients (k = P).
    checkpoints: positions in ``run.checkpoints`` forming the ensemble; None: all of them.
    ridge: lambda as a fraction of the mean of the kernel's nonzero eigenvalues (module doc);
    None: the model's (`default_ridge`).
    """
    ridge = default_ridge(run.model) if ridge is None else ridge
    return trak_ridges(run, test, [ridge], dim, seed, chunk_size, checkpoints)[0]


def trak_ridges(run: Run, test: Tensor, ridges: Sequence[float], dim: int | None = None, seed: int = 0,
                chunk_size: int = 512, checkpoints: Sequence[int] | None = None) -> Tensor:
    """[len(ridges), n_test, n_train] (float64): `trak` at each ridge, the gradients computed once."""
    chosen = list(range(len(run.checkpoints))) if checkpoints is None else list(checkpoints)
    train = run.dataset.train
    total = torch.zeros(len(ridges), len(test), len(train), dtype=torch.float64)
    for c in chosen:
        model = model_from_checkpoint(load_checkpoint(run.checkpoints[c].path))  # in eval mode
        total += _one_model(model, train, test.long().reshape(-1, 3), dim, seed * 1_000_003 + c, chunk_size, ridges,
                            run.config)
    return total / len(chosen)


def removal_weights(model: nn.Module, train: Tensor, config: TrainConfig, chunk_size: int = 512) -> Tensor:
    """[n] q_j of each training triple under the run's objective ``config.training`` (module doc), float64."""
    if config.training == "kvsall":
        return torch.ones(len(train), dtype=torch.float64)
    if config.training == "negative-sampling":
        raise KgtraceError("TRAK: its removal weights come from the training loss's probabilities, and a run trained "
                           "with negative-sampling has them only for the entities drawn at each step. Fix: explain it "
                           "with TracIn (the default) or grad-cos (--methods tracin-last,grad-cos)")
    if config.training == "1vsall":
        return 1.0 - tail_probabilities(model, train, chunk_size)
    _, query, answers = torch.unique(train[:, :2], dim=0, return_inverse=True, return_counts=True)
    n = answers[query]  # [n] answers of each triple's query (h, r)
    eps, style, entities = config.label_smoothing, config.label_smoothing_style, model.num_entities
    alpha, beta = ce_target_weights(eps, entities, n, style)  # [n] each
    beta_without = ce_target_weights(eps, entities, (n - 1).clamp_min(1), style)[1]  # [n]
    weights = alpha + beta - beta_without
    alone = (n == 1).nonzero().squeeze(1)  # only a query's sole answer needs the model's probability
    weights[alone] = alpha[alone] + beta[alone] - tail_probabilities(model, train[alone], chunk_size)
    return weights


def tail_probabilities(model: nn.Module, triples: Tensor, chunk_size: int) -> Tensor:
    """[n] softmax probability of each triple's tail among all tails of its query, float64."""
    with torch.no_grad():
        return torch.cat([model.score_t(chunk[:, :2]).double().softmax(1).gather(1, chunk[:, 2:3]).squeeze(1)
                          for chunk in triples.split(chunk_size)] or [torch.zeros(0, dtype=torch.float64)])


def _one_model(model: nn.Module, train: Tensor, test: Tensor, dim: int | None, seed: int, chunk_size: int,
               ridges: Sequence[float], config: TrainConfig) -> Tensor:
    """One model's TRAK estimates [len(ridges), n_test, n_train] (float64)."""
    names = select_parameters(model, "all")
    projection = _projection(_size(model, names), len(train), dim, seed)
    chunks = [_features(model, chunk, names, projection) for chunk in train.split(chunk_size)]
    features = chunks[0] if len(chunks) == 1 else torch.cat(chunks)  # [n, k] Phi
    weights = removal_weights(model, train, config, chunk_size)  # [n] q_j
    test_features = _features(model, test, names, projection)  # [n_test, k]
    n, k = features.shape
    # trace(Phi^T Phi) / its largest possible rank, summed in float64 a block of rows at a time (no copy of Phi)
    scale = sum(float(block.double().square().sum()) for block in features.split(8)) / min(n, k)
    dual = k > n
    # The products, n^2 k or n k^2, are most of the time: in float32 (half of float64's), solved in float64.
    kernel = (features @ features.T if dual else features.T @ features).double()  # [n, n] or [k, k]
    right = (features @ test_features.T if dual else test_features.T).double()  # [n, n_test] or [k, n_test]
    estimates = []
    for ridge in ridges:
        damped = kernel + (ridge * scale + 1e-12) * torch.eye(len(kernel), dtype=kernel.dtype)
        solved = _solve_positive(damped, right)  # [n, n_test] or [k, n_test]
        estimates.append((solved if dual else features.double() @ solved).T * weights)  # [n_test, n] times q_j
    return torch.stack(estimates)


def _projection(size: int, n: int, dim: int | None, seed: int) -> Tensor | None:
    """R [P, k] (float32) for ``dim`` = k, or None for the exact gradients; refused where R or Phi would not fit."""
    fits = max(1, min(2048, MAX_PROJECTION_BYTES // (size * 4), MAX_FEATURE_BYTES // (n * 8)))  # a k that fits
    if dim is None:
        exact = TrakCost(n, size, checkpoints=1)
        if not exact.fits:
            raise KgtraceError(f"TRAK: the exact score gradients of {n:,} training triples over {size:,} parameters "
                               f"take {exact.feature_bytes / 2**30:.1f} GiB, more than "
                               f"{MAX_FEATURE_BYTES / 2**30:.0f} GiB. Fix: project them ({option('--trak-dim', fits)})")
        return None
    if size * dim * 4 > MAX_PROJECTION_BYTES or n * dim * 8 > MAX_FEATURE_BYTES:
        raise KgtraceError(f"TRAK: a projection of {size:,} parameters to {dim} dimensions takes "
                           f"{size * dim * 4 / 2**30:.1f} GiB and its features of {n:,} training triples "
                           f"{n * dim * 8 / 2**30:.1f} GiB, more than {MAX_PROJECTION_BYTES / 2**30:.0f} GiB each may. "
                           f"Fix: a smaller projection ({option('--trak-dim', fits)})")
    return torch.randn(size, dim, generator=torch.Generator().manual_seed(seed)) / dim ** 0.5


def _size(model: nn.Module, names: list[str]) -> int:
    """P, the number of entries of the parameters ``names``."""
    chosen = set(names)
    return sum(p.numel() for name, p in model.named_parameters() if name in chosen)


def _features(model: nn.Module, triples: Tensor, names: list[str], projection: Tensor | None) -> Tensor:
    """[len(triples), k] (float32): the triples' score gradients, projected when ``projection`` is given."""
    gradients = per_sample_gradients(model, triples, names, of="score")  # [m, P]
    return gradients if projection is None else gradients @ projection


def _solve_positive(matrix: Tensor, right: Tensor) -> Tensor:
    """matrix^-1 right for a symmetric positive definite ``matrix``: by Cholesky (half of LU's work), by LU
    where rounding leaves a tiny ridge's matrix not numerically positive definite."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    return torch.cholesky_solve(right, factor) if int(info) == 0 else torch.linalg.solve(matrix, right)
