"""One self-describing checkpoint dict, written atomically, read with weights_only=True.

Keys: format, version, model ({"name", "args", "num_entities", "num_relations"}),
entity_digest / relation_digest (sha256 of the id maps: a checkpoint is refused
against data whose ids differ), model_state, optimizer_state, scheduler_state,
scaler_state, epoch (epochs completed), step (optimizer steps), lr (the learning
rate used during that last epoch: TracIn weighs each checkpoint by it),
rng ({"torch", "shuffle"} generator states), config (the resolved TrainConfig),
early_stopping ({"best_mrr", "best_epoch", "bad_validations"}).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kgtrace.core.errors import KgtraceError
from kgtrace.core.io import atomic_open
from kgtrace.core.layout import EPOCH_FILE, epoch_file

FORMAT = "kgtrace-checkpoint"
VERSION = 1


def epoch_path(folder: Path, epoch: int) -> Path:
    """A checkpoints folder's file of ``epoch`` (kgtrace.core.layout names it)."""
    return folder / epoch_file(epoch)


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Write ``state`` to ``path`` via a temporary file and an atomic rename.

    A write the operating system refuses (disk full, a file-size limit) is raised as its OSError,
    naming the path: torch.save reports it only as "unexpected pos" otherwise.
    """
    with atomic_open(path, "wb") as f:
        writer = _Writer(f)
        try:
            torch.save({"format": FORMAT, "version": VERSION, **state}, writer)
        except RuntimeError:
            if writer.error is not None:
                raise OSError(writer.error.errno, writer.error.strerror, str(path)) from None
            raise


class _Writer:
    """A binary file for torch.save that keeps the first OSError its writes met."""

    def __init__(self, f: Any):
        self.f, self.error = f, None

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", *, mmap: bool = False,
                    finite: bool = True) -> dict[str, Any]:
    """Read a kgtrace checkpoint with ``weights_only=True`` (no code runs on load).

    mmap=True maps the file instead of reading it, for when only a few keys are needed. Its learning
    rate must be a finite number, and (with ``finite``) its weights finite: a run whose training
    diverged gives no answer worth reading, and a command refuses it rather than return an empty one.
    """
    path = Path(path)
    if not path.is_file():
        raise KgtraceError(f"{path}: no such checkpoint. Fix: list the run's checkpoints/ folder and pick one")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # a truncated or foreign file: say which, and what to do
        raise KgtraceError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e}). "
                           "Fix: use another checkpoint of the run, or retrain") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise KgtraceError(f"{path}: not a kgtrace checkpoint. Fix: pass a file from a run's checkpoints/ folder")
    lr = state.get("lr", 0.0)
    if not isinstance(lr, (int, float)) or not math.isfinite(lr):
        raise KgtraceError(f"{path}: its learning rate is {lr!r}, not a finite number. {DIVERGED_FIX}")
    if finite:
        bad = [name for name, t in state.get("model_state", {}).items()
               if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if bad:
            raise KgtraceError(f"{path}: weights that are not finite numbers (NaN or infinity) in {', '.join(bad)}. "
                               f"{DIVERGED_FIX}")
    return state


DIVERGED_FIX = ("Fix: the training diverged; train again with a smaller lr (or use an earlier checkpoint of the run: "
                "--checkpoint checkpoints/epoch-NNNN.pt)")


def check_digests(state: dict[str, Any], entity_digest: str, relation_digest: str, path: str | Path) -> None:
    """Refuse a checkpoint whose id maps differ from the data's, naming which differ."""
    wrong = [name for name, have in (("entity", entity_digest), ("relation", relation_digest))
             if state[f"{name}_digest"] != have]
    if wrong:
        raise KgtraceError(
            f"{path}: the checkpoint's {' and '.join(wrong)} id map differs from this run's, so its ids would "
            "point at the wrong labels (a checkpoint of another run, or one trained on other data). Fix: pass one of "
            "this run's own checkpoints (best, last, or a file in RUN_DIR/checkpoints), or use the checkpoint with "
            "the run folder that wrote it"
        )


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint file of a run and the learning rate of the epoch that ended in it."""

    path: Path
    epoch: int
    lr: float


def list_checkpoints(folder: str | Path) -> list[CheckpointInfo]:
    """The run's epoch checkpoints, oldest first."""
    found = []
    for path in Path(folder).glob("epoch-*.pt"):
        match = EPOCH_FILE.fullmatch(path.name)
        if match:
            lr = float(load_checkpoint(path, mmap=True, finite=False)["lr"])
            found.append(CheckpointInfo(path, int(match.group(1)), lr))
    return sorted(found, key=lambda c: c.epoch)


def latest_checkpoint(folder: str | Path) -> Path | None:
    paths = [p for p in Path(folder).glob("epoch-*.pt") if EPOCH_FILE.fullmatch(p.name)]
    return max(paths, key=lambda p: int(EPOCH_FILE.fullmatch(p.name).group(1)), default=None)
