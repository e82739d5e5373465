"""TRAK (Park et al., 2023) for a run's triples: projected score gradients, an ensemble over checkpoints.

A triple z is a binary example (label 1) with output f(z) = score_hrt(z), a logit. At one
model theta, with a random projection R [P, k] (Gaussian, entries N(0, 1/k)):

    phi(z)     = R^T grad_theta f(z)                       [k]   the projected gradient
    Phi        = [phi(z_1); ...; phi(z_n)]                 [n, k] over the training triples
    q_j        = 1 - sigmoid(f(z_j))                       the residual of training triple j
    tau(z, j)  = phi(z)^T (Phi^T Phi + lambda I)^{-1} phi(z_j) q_j

TRAK's estimate of how much training on z_j raises f(z) (its eq. for binary logistic outputs;
positive: a proponent, as TracIn's sign). The estimate is averaged over an ensemble of
models: here the run's epoch checkpoints, each with its own projection (seeded by (seed, c)).
The paper trains independent models instead; checkpoints of one run are the cheap ensemble it
also discusses. lambda = ``ridge`` x the kernel's mean diagonal: a strong ridge by default (1),
which pulls the estimate towards the residual-weighted projected gradient product and was the
most faithful setting by the LDS (docs/benchmarks.md); small ridges (1e-6) give the plain
least-squares estimate. Gradients are over every parameter, computed per triple with ``torch.func`` (model in
eval mode), a chunk at a time and projected at once, so memory holds [chunk, P] and R.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from kgtrace.attribution.grads import per_sample_gradients
from kgtrace.attribution.params import select_parameters
from kgtrace.checkpoint import load_checkpoint
from kgtrace.errors import KgtraceError
from kgtrace.run import Run, model_from_checkpoint

__all__ = ["trak"]

# The projection matrix R [P, k] (float32) may take at most this many bytes.
MAX_PROJECTION_BYTES = 2 << 30


def trak(run: Run, test: Tensor, dim: int = 2048, seed: int = 0, chunk_size: int = 512,
         checkpoints: Sequence[int] | None = None, ridge: float = 1.0) -> Tensor:
    """TRAK attributions [n_test, n_train] (float64) of the run's training triples (module doc).

    checkpoints: positions in ``run.checkpoints`` forming the ensemble; None: all of them.
    ridge: lambda as a fraction of the kernel's mean diagonal.
    """
    chosen = list(range(len(run.checkpoints))) if checkpoints is None else list(checkpoints)
    train = run.dataset.train
    total = torch.zeros(len(test), len(train), dtype=torch.float64)
    for c in chosen:
        model = model_from_checkpoint(load_checkpoint(run.checkpoints[c].path))  # in eval mode
        total += _one_model(model, train, test.long().reshape(-1, 3), dim, seed * 1_000_003 + c, chunk_size, ridge)
    return total / len(chosen)


def _one_model(model: nn.Module, train: Tensor, test: Tensor, dim: int, seed: int, chunk_size: int,
               ridge: float) -> Tensor:
    """One model's TRAK estimate [n_test, n_train] (float64)."""
    names = select_parameters(model, "all")
    size = sum(p.numel() for n, p in model.named_parameters() if n in names)
    if size * dim * 4 > MAX_PROJECTION_BYTES:
        raise KgtraceError(f"TRAK: a projection of {size:,} parameters to {dim} dimensions takes "
                           f"{size * dim * 4 / 2**30:.1f} GiB, more than {MAX_PROJECTION_BYTES / 2**30:.0f} GiB. "
                           f"Fix: a smaller projection (--trak-dim {max(1, MAX_PROJECTION_BYTES // (size * 4))})")
    projection = torch.randn(size, dim, generator=torch.Generator().manual_seed(seed)) / dim ** 0.5  # [P, k]
    features = torch.cat([per_sample_gradients(model, chunk, names, of="score") @ projection
                          for chunk in train.split(chunk_size)]).double()  # [n, k]
    with torch.no_grad():
        residual = 1.0 - torch.sigmoid(model.score_hrt(train).double())  # [n] q_j
    test_features = (per_sample_gradients(model, test, names, of="score") @ projection).double()  # [n_test, k]
    kernel = features.T @ features  # [k, k]
    lam = ridge * float(kernel.diagonal().mean()) + 1e-12
    solved = torch.linalg.solve(kernel + lam * torch.eye(dim, dtype=kernel.dtype), test_features.T)  # [k, n_test]
    return (features @ solved).T * residual  # [n_test, n] each column j scaled by q_j
