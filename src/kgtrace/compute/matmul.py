"""Float32 products x W^T on the CPU through oneDNN, where PyTorch's ``@`` goes to MKL.

PyTorch's CPU wheels send a float32 ``@`` to MKL, whose sgemm reached half of oneDNN's rate on
this project's AMD processor (MKL picks its kernels by processor vendor; oneDNN, which the same
wheels carry, uses the AVX-512 units). On an Intel processor MKL takes its own fast kernels and
oneDNN gained nothing (0.95-1.01 of MKL's rate on the same products, 0.68 on a score product), so
`linear` takes oneDNN on other vendors' processors only (`prefers_onednn`). Both compute
in float32 (no reduced-precision mode is involved); only the order of the sums differs.
``benchmarks/matmul.py`` measures the two on ConvE's fc products and a score product (docs/benchmarks.md).

oneDNN compiles a kernel for every distinct number of rows and keeps it, so a pass whose chunks
vary in rows would grow a process's memory with every new count. `linear` therefore gives
oneDNN the rows up to a multiple of `ROWS` and the few left over to MKL: at most
4096 / ROWS kernels per shape of W for a TracIn chunk, and fewer compiles.

`linear` takes that path on the CPU where it applies (float32, 2-D, no autograd, no
autocast, which would have ``@`` compute in a lower precision, not inside torch.compile, which
picks its own kernels) and is ``x @ weight.T`` everywhere else.
tests/test_matmul.py checks both paths against a float64 product.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["ROWS", "cpu_vendor", "cpuinfo_field", "linear", "onednn_available", "prefers_onednn"]

#: oneDNN takes the rows of x up to a multiple of this; the rest go to MKL (module doc).
ROWS = 64


def onednn_available() -> bool:
    """Whether this PyTorch build carries oneDNN's dense linear kernel."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def cpuinfo_field(key: str, cpuinfo: str | None = None) -> str:
    """The first value of ``key`` in Linux's /proc/cpuinfo ("vendor_id", "model name"), from ``cpuinfo`` (that
    file's text) or the file itself, read only up to that line; "" where there is none (other systems)."""
    if cpuinfo is not None:
        return _first_value(key, cpuinfo.splitlines())
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as lines:
            return _first_value(key, lines)
    except OSError:
        return ""


def _first_value(key: str, lines: Iterable[str]) -> str:
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return ""


def cpu_vendor(cpuinfo: str | None = None) -> str:
    """The processor's vendor id ("GenuineIntel", "AuthenticAMD"; `cpuinfo_field`)."""
    return cpuinfo_field("vendor_id", cpuinfo)


def prefers_onednn(vendor: str | None = None) -> bool:
    """Whether `linear` takes oneDNN on this processor: where PyTorch carries it, and the processor is
    not Intel's, whose MKL kernels matched oneDNN (module doc)."""
    return onednn_available() and (cpu_vendor() if vendor is None else vendor) != "GenuineIntel"


_ONEDNN = prefers_onednn()


def linear(x: Tensor, weight: Tensor, *, onednn: bool | None = None) -> Tensor:
    """x [M, K] times weight [N, K] transposed: [M, N], as ``x @ weight.T`` (module doc).

    ``onednn``: True or False to choose the path where oneDNN applies (benchmarks, tests); None, the
    processor's choice (`prefers_onednn`).
    """
    rows = x.shape[0] // ROWS * ROWS if x.dim() == 2 else 0
    wanted = _ONEDNN if onednn is None else onednn and onednn_available()
    if not rows or not wanted or not _applies(x, weight):
        return x @ weight.T
    # "none": no activation fused into the product.
    head = torch.ops.mkldnn._linear_pointwise(x[:rows].contiguous(), weight.contiguous(), None, "none", [], "")
    return head if rows == len(x) else torch.cat([head, x[rows:] @ weight.T])  # the last < ROWS rows by MKL


def _applies(x: Tensor, weight: Tensor) -> bool:
    return (x.device.type == "cpu" and weight.device.type == "cpu" and weight.dim() == 2
            and x.dtype == torch.float32 and weight.dtype == torch.float32 and x.shape[1] > 0 and weight.shape[0] > 0
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())
