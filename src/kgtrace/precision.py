"""Numeric precision, one rule for every command: fp32, bf16 (autocast) or fp16 (autocast; CUDA only)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from kgtrace.config import PRECISIONS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
assert tuple(DTYPES) == PRECISIONS


def precision_problems(precision: str, device: torch.device, key: str = "precision") -> list[str]:
    """What is wrong with running ``precision`` on ``device`` ([] when nothing)."""
    if precision not in DTYPES:
        return [f"{key}={precision!r}: must be one of {', '.join(PRECISIONS)}"]
    if precision == "fp16" and device.type != "cuda":
        return [f"{key}='fp16': needs a CUDA device; use bf16 on the CPU"]
    return []


def precision_context(precision: str, device: torch.device) -> AbstractContextManager:
    """Autocast to bf16/fp16 on ``device``; fp32 runs as is."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])
