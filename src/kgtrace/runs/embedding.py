"""A run folder, reloaded in one call: model, dataset with its id maps and names, checkpoints.

Layout written by training::

    config.yaml            the resolved TrainConfig
    node_dict, rel_dict    the id maps the model was trained with (label<TAB>id)
    checkpoints/           epoch-NNNN.pt every checkpoint_every epochs, best.pt
    metrics.jsonl          one record per epoch (loss, lr, seconds, validation metrics)
    training_curve.png
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kgtrace.core.checkpoint import CheckpointInfo, check_digests, latest_checkpoint, list_checkpoints, load_checkpoint
from kgtrace.core.config import TrainConfig, from_sources
from kgtrace.core.errors import KgtraceError
from kgtrace.core.layout import RunLayout
from kgtrace.data.dataset import Dataset
from kgtrace.data.pinned import load_pinned_dataset
from kgtrace.models import build_model


@dataclass
class Run:
    """A trained run: its folder, config, dataset, the loaded model and every epoch checkpoint."""

    path: Path
    config: TrainConfig
    dataset: Dataset
    model: nn.Module  # in eval mode, weights of ``checkpoint``
    checkpoint: Path  # the file the model's weights came from
    checkpoints: list[CheckpointInfo]  # epoch checkpoints with their learning rates, oldest first


def model_from_checkpoint(state: dict[str, Any], device: torch.device | str = "cpu") -> nn.Module:
    """Build the checkpoint's model around its weights; returned in eval mode.

    The module is built on the meta device and takes the checkpoint's tensors as they are
    (``assign=True``): no initialisation is drawn only to be overwritten, and nothing is
    copied, so a memory-mapped checkpoint stays mapped.
    """
    spec = state["model"]
    with torch.device("meta"):
        model = build_model(spec["name"], spec["num_entities"], spec["num_relations"], **spec["args"])
    try:
        model.load_state_dict(state["model_state"], assign=True)
    except RuntimeError as e:  # weights of another shape than the model it names: a checkpoint pieced together
        raise KgtraceError(f"a checkpoint's weights do not fit the {spec['name']} model it names ({e}). Fix: use a "
                           "checkpoint that kgtrace train wrote, or retrain") from None
    return model.to(device).eval()


def final_model(run: Run) -> nn.Module:
    """The model of the run's last epoch checkpoint (its final weights), in eval mode, on the CPU."""
    return model_from_checkpoint(load_checkpoint(run.checkpoints[-1].path))


def resolve_checkpoint(run_dir: Path, checkpoint: str | Path | None) -> Path:
    """None or 'best' -> best.pt (else the latest epoch); 'last' -> the latest epoch; else a path."""
    layout = RunLayout(run_dir)
    folder = layout.checkpoints
    if checkpoint in (None, "best") and layout.best_checkpoint.is_file():
        return layout.best_checkpoint
    if checkpoint in (None, "best", "last"):
        latest = latest_checkpoint(folder)
        if latest is None:
            raise KgtraceError(f"{run_dir}: the run has no checkpoint yet. Fix: train it (kgtrace train --resume)")
        return latest
    path = Path(checkpoint)
    return path if path.is_absolute() or path.exists() else folder / path


def read_run_config(run_dir: Path) -> TrainConfig:
    """The run's config.yaml as a validated TrainConfig; every problem (e.g. a hand-edited key) named at once."""
    path = RunLayout(run_dir).config
    return from_sources(TrainConfig, path, {})


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None, device: torch.device | str = "cpu") -> Run:
    """Reload a run: the dataset with the run's own id maps, and the model of ``checkpoint``.

    checkpoint: None/'best' (best validation MRR, else latest), 'last', or a file.
    """
    run_dir = Path(run_dir)
    if not RunLayout(run_dir).config.is_file():
        raise KgtraceError(f"{run_dir}: not a kgtrace run (no config.yaml). Fix: pass the --out folder of kgtrace train")
    config = read_run_config(run_dir)
    dataset = load_pinned_dataset(run_dir, config.dataset)
    path = resolve_checkpoint(run_dir, checkpoint)
    # Mapped, not read: the optimizer state stays on disk, and the weights are read as they are touched.
    state = load_checkpoint(path, mmap=True)
    check_digests(state, dataset.entities.digest(), dataset.relations.digest(), path)
    model = model_from_checkpoint(state, device)
    return Run(run_dir, config, dataset, model, path, list_checkpoints(RunLayout(run_dir).checkpoints))
