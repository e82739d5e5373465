"""Pieces the benchmark scripts share: the --device option, the processor's name, and the small runs the
faithfulness benchmarks train.

Imported by the scripts beside it (``python benchmarks/NAME.py`` puts this folder on the path).
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch


def resolved(name: str) -> torch.device:
    """--device as a torch.device; exits with kgtrace's message where it cannot be had (cuda without a GPU)."""
    from kgtrace.compute.system import resolve_device
    from kgtrace.core.errors import KgtraceError

    try:
        return resolve_device(name)
    except KgtraceError as e:
        sys.exit(f"{Path(sys.argv[0]).name}: error: {e}")


def processor_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what ``platform`` knows (often just x86_64)."""
    from kgtrace.compute.matmul import cpuinfo_field

    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def base_run(dataset: str, model: str, spec: dict, out: Path, threads: int, device: torch.device) -> Path:
    """Train (or reuse) the run OUT/DATASET-MODEL with ``spec`` (model_args, epochs, lr; a checkpoint every 5 epochs)."""
    from kgtrace.core.checkpoint import latest_checkpoint
    from kgtrace.core.config import TrainConfig
    from kgtrace.training.loop import train

    run = out / f"{dataset}-{model}"
    latest = latest_checkpoint(run / "checkpoints") if run.is_dir() else None
    if latest is not None and latest.name == f"epoch-{spec['epochs']:04d}.pt":
        return run
    config = TrainConfig(dataset=dataset, model=model, model_args=spec["model_args"], epochs=spec["epochs"],
                         lr=spec["lr"], checkpoint_every=5, eval_every=0, threads=threads, device=device.type, seed=0)
    train(config, run, overwrite=run.exists(), progress=False, log=lambda *_: None)
    return run


def device_rates(device: torch.device, size: int | None = None) -> dict:
    """The device's measured ceilings: float32 product rate (IEEE, TF32 off) in FLOP/s and copy bandwidth in
    bytes/s (bytes read plus written), each the best of a few timed runs after a warm-up."""
    import time

    from kgtrace.compute.precision import matmul_mode

    size = size or (8192 if device.type == "cuda" else 1024)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, device=device, generator=gen) for _ in range(2))
    source = torch.randn((256 << 20) // 4 if device.type == "cuda" else (32 << 20) // 4, device=device, generator=gen)
    target = torch.empty_like(source)

    def best(fn) -> float:
        fn()
        sync()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        return min(times)

    with matmul_mode("fp32"):
        product = best(lambda: a @ b)
    copy = best(lambda: target.copy_(source))
    return {"fp32_flops": 2 * size**3 / product, "copy_bytes_per_s": 2 * source.numel() * 4 / copy}


def floor_ms(flops: float, bytes_: float, rates: dict) -> float:
    """The fewest milliseconds a piece of work can take: its FLOPs at the float32 product rate or its bytes
    at the copy bandwidth, whichever is larger (docs/benchmarks.md: the floor)."""
    return 1000 * max(flops / rates["fp32_flops"], bytes_ / rates["copy_bytes_per_s"])


def conve_step_cost(batch: int, entities: int, dim: int, params: int, height: int = 10,
                    channels: int = 32) -> tuple[float, float]:
    """FLOPs and bytes of one ConvE KvsAll step: forward, backward (twice the forward's products) and Adam.

    Products: the score product B x D x E and the fc layer B x (C * 2h * w) x D, each 2 FLOPs a
    multiply-add, thrice (forward, two backward products); the 3x3 convolution likewise. Bytes: the
    scores [B, E] written and read about six times (product, sigmoid-BCE terms, gradient), and Adam
    reading parameter, gradient and two moments and writing three, float32 each.
    """
    width = dim // height
    conv_out = channels * (2 * height - 2) * (width - 2)
    flops = 3 * 2 * batch * (dim * entities + conv_out * dim + conv_out * 9)
    bytes_ = 6 * 4 * batch * entities + 7 * 4 * params
    return flops, bytes_


def distmult_step_cost(batch: int, entities: int, dim: int, params: int) -> tuple[float, float]:
    """FLOPs and bytes of one DistMult KvsAll step (as conve_step_cost, the score product only)."""
    return 3 * 2 * batch * dim * entities, 6 * 4 * batch * entities + 7 * 4 * params
