"""Float32 products x W^T on the CPU through oneDNN, where PyTorch's ``@`` goes to MKL.

PyTorch's CPU wheels send a float32 ``@`` to MKL, whose sgemm reached half of oneDNN's rate on
this project's AMD processor (MKL picks its kernels by processor vendor; oneDNN, which the same
wheels carry, uses the AVX-512 units). Both compute in float32 (no reduced-precision mode is
involved); only the order of the sums differs.
``benchmarks/matmul.py`` measures the two on ConvE's fc products (docs/benchmarks.md).

oneDNN compiles a kernel for every distinct number of rows and keeps it, so a pass whose chunks
vary in rows would grow a process's memory with every new count. :func:`linear` therefore gives
oneDNN the rows up to a multiple of :data:`ROWS` and the few left over to MKL: at most
4096 / ROWS kernels per shape of W for a TracIn chunk, and fewer compiles.

:func:`linear` takes that path on the CPU where it applies (float32, 2-D, no autograd, no
autocast, which would have ``@`` compute in a lower precision, not inside torch.compile, which
picks its own kernels) and is ``x @ weight.T`` everywhere else.
tests/test_matmul.py checks both paths against a float64 product.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ROWS", "linear", "onednn_available"]

#: oneDNN takes the rows of x up to a multiple of this; the rest go to MKL (module doc).
ROWS = 64


def onednn_available() -> bool:
    """Whether this PyTorch build carries oneDNN's dense linear kernel."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


_ONEDNN = onednn_available()


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [M, K] times weight [N, K] transposed: [M, N], as ``x @ weight.T`` (module doc)."""
    rows = x.shape[0] // ROWS * ROWS if x.dim() == 2 else 0
    if not rows or not _takes_onednn(x, weight):
        return x @ weight.T
    # "none": no activation fused into the product.
    head = torch.ops.mkldnn._linear_pointwise(x[:rows].contiguous(), weight.contiguous(), None, "none", [], "")
    return head if rows == len(x) else torch.cat([head, x[rows:] @ weight.T])  # the last < ROWS rows by MKL


def _takes_onednn(x: Tensor, weight: Tensor) -> bool:
    return (_ONEDNN and x.device.type == "cpu" and weight.device.type == "cpu" and weight.dim() == 2
            and x.dtype == torch.float32 and weight.dtype == torch.float32 and x.shape[1] > 0 and weight.shape[0] > 0
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())
