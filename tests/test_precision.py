"""Precision settings: tf32 and fp16 need CUDA; matmul_mode sets CUDA's float32 modes for a block and restores them."""

from __future__ import annotations

import pytest
import torch

from kgtrace.compute.precision import matmul_mode, precision_context, precision_problems
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError
from kgtrace.training.loop import setup_device


def test_cuda_only_precisions_are_refused_on_a_cpu():
    cpu = torch.device("cpu")
    assert precision_problems("fp32", cpu) == [] and precision_problems("bf16", cpu) == []
    assert "needs a CUDA device" in precision_problems("tf32", cpu)[0]
    assert "use bf16 on the CPU" in precision_problems("fp16", cpu)[0]
    assert "must be one of fp32, tf32, bf16, fp16" in precision_problems("fp64", cpu)[0]
    with pytest.raises(ConfigError, match="precision='tf32': needs a CUDA device"):
        setup_device(TrainConfig(precision="tf32", device="cpu"))


def test_matmul_mode_sets_and_restores_cudas_float32_modes():
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision
    with matmul_mode("tf32"):
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", "tf32")
        with precision_context("fp32", torch.device("cpu")), matmul_mode("fp32"):  # fp32 means IEEE, convolutions too
            assert (matmul.fp32_precision, conv.fp32_precision) == ("ieee", "ieee")
        assert matmul.fp32_precision == "tf32"
    assert (matmul.fp32_precision, conv.fp32_precision) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tf32_products_round_like_tf32_and_fp32_ones_do_not():
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(512, 512, device="cuda", generator=gen) for _ in range(2))
    exact = (a.double() @ b.double())
    errors = {}
    for precision in ("fp32", "tf32"):
        with matmul_mode(precision):
            errors[precision] = float((a @ b - exact).norm() / exact.norm())
    assert errors["fp32"] < 1e-6 < errors["tf32"] < 3e-3
