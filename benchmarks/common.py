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
    from kgtrace.errors import KgtraceError
    from kgtrace.system import resolve_device

    try:
        return resolve_device(name)
    except KgtraceError as e:
        sys.exit(f"{Path(sys.argv[0]).name}: error: {e}")


def processor_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what ``platform`` knows (often just x86_64)."""
    from kgtrace.matmul import cpuinfo_field

    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def base_run(dataset: str, model: str, spec: dict, out: Path, threads: int, device: torch.device) -> Path:
    """Train (or reuse) the run OUT/DATASET-MODEL with ``spec`` (model_args, epochs, lr; a checkpoint every 5 epochs)."""
    from kgtrace.checkpoint import latest_checkpoint
    from kgtrace.config import TrainConfig
    from kgtrace.training.loop import train

    run = out / f"{dataset}-{model}"
    latest = latest_checkpoint(run / "checkpoints") if run.is_dir() else None
    if latest is not None and latest.name == f"epoch-{spec['epochs']:04d}.pt":
        return run
    config = TrainConfig(dataset=dataset, model=model, model_args=spec["model_args"], epochs=spec["epochs"],
                         lr=spec["lr"], checkpoint_every=5, eval_every=0, threads=threads, device=device.type, seed=0)
    train(config, run, overwrite=run.exists(), progress=False, log=lambda *_: None)
    return run
