"""Numeric precision, one rule for every command: fp32, tf32 (CUDA's matrix units), bf16 (autocast) or fp16
(autocast; CUDA only).

fp32 means float32 arithmetic throughout: on CUDA, cuDNN's convolutions too (torch lets them use TF32
by default). tf32 keeps float32 storage and lets CUDA's matrix products and convolutions round their
inputs to TF32 (10 mantissa bits), several times faster on the matrix units; a run trained so is
validated and tested in fp32 all the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

from kgtrace.core.config import PRECISIONS

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
assert tuple(DTYPES) == PRECISIONS
CUDA_ONLY = {"fp16": "use bf16 on the CPU", "tf32": "TF32 is a mode of CUDA's matrix units; use fp32 or bf16 on the CPU"}


def precision_problems(precision: str, device: torch.device, key: str = "precision") -> list[str]:
    """What is wrong with running ``precision`` on ``device`` ([] when nothing)."""
    if precision not in DTYPES:
        return [f"{key}={precision!r}: must be one of {', '.join(PRECISIONS)}"]
    if precision in CUDA_ONLY and device.type != "cuda":
        return [f"{key}={precision!r}: needs a CUDA device; {CUDA_ONLY[precision]}"]
    return []


def precision_context(precision: str, device: torch.device, *, cache: bool = True) -> AbstractContextManager:
    """Autocast to bf16/fp16 on ``device``; tf32: `matmul_mode`; fp32 runs as is.

    cache: autocast's cache of cast weights (off inside a CUDA graph capture, which would keep the first casts).
    """
    if precision == "fp32":
        return nullcontext()
    if precision == "tf32":
        return matmul_mode(precision)
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision], cache_enabled=cache)


@contextmanager
def matmul_mode(precision: str) -> Iterator[None]:
    """CUDA's float32 products and convolutions in TF32 for ``tf32``, in IEEE float32 otherwise, for the block.

    Forward and backward alike: a training epoch runs wholly inside (kgtrace.training.loop.fit).
    """
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    saved = matmul.fp32_precision, conv.fp32_precision
    matmul.fp32_precision = conv.fp32_precision = "tf32" if precision == "tf32" else "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision, conv.fp32_precision = saved
