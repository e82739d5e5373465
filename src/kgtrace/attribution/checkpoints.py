"""The checkpoints a TracIn pass weighs, and their models held a group at a time within a memory budget.

Checkpoints a group at a time: with a ``memory_budget`` smaller than the checkpoints' models
together, the pass goes over the training set once per group of checkpoints that fits; top-k
keeps the earlier groups' parts on disk (`.spill`) and ranks in the last group's pass.
Memory then holds one group's models, whatever the number of checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch
from torch import nn

from kgtrace.core.checkpoint import CheckpointInfo, load_checkpoint
from kgtrace.core.config import parse_size
from kgtrace.runs.embedding import model_from_checkpoint

__all__ = ["CheckpointModels", "checkpoint_groups", "choose_checkpoints", "model_bytes", "parse_budget"]


def choose_checkpoints(available: list[CheckpointInfo], wanted) -> tuple[list[CheckpointInfo], list[str]]:
    """The checkpoints of ``wanted`` ("all" or epochs) among ``available``, and what is wrong with the choice."""
    if wanted == "all":
        chosen, problems = list(available), []
    else:
        by_epoch = {c.epoch: c for c in available}
        missing = [e for e in wanted if e not in by_epoch]
        problems = [f"checkpoints: no epoch checkpoint for epoch(s) {missing}; fix: use epochs from "
                    f"{sorted(by_epoch)}"] if missing else []
        chosen = [by_epoch[e] for e in wanted if e in by_epoch]
    if not chosen and not problems:
        problems.append("checkpoints: none selected (the run has no epoch checkpoints?); "
                        "fix: train with checkpoint_every > 0")
    return chosen, problems


def parse_budget(memory_budget: int | str | None) -> tuple[int | None, list[str]]:
    """The budget in bytes (None: no limit), and what is wrong with it."""
    if memory_budget is None:
        return None, []
    try:
        budget = parse_size(memory_budget)
    except ValueError as e:
        return None, [str(e)]
    return (budget, []) if budget >= 1 else (None, [f"memory_budget={memory_budget!r}: must be 1 byte or more"])


def model_bytes(model: nn.Module) -> int:
    """The bytes of ``model``'s parameters and buffers: what one checkpoint's model holds."""
    return sum(t.numel() * t.element_size() for t in chain(model.parameters(), model.buffers()))


def checkpoint_groups(checkpoints: int, model_bytes: int, budget: int | None) -> list[list[int]]:
    """Checkpoint indices held at once, in order: as many as ``budget`` has room for, at least one."""
    size = checkpoints if budget is None else max(1, min(checkpoints, budget // max(model_bytes, 1)))
    return [list(range(i, min(i + size, checkpoints))) for i in range(0, checkpoints, max(size, 1))]


class CheckpointModels:
    """Eval-mode models of ``checkpoints`` on ``device`` (model weights only, memory-mapped), held by ``groups``."""

    def __init__(self, checkpoints: list[CheckpointInfo], groups: list[list[int]], device: torch.device):
        self.checkpoints, self.groups, self.device = checkpoints, groups, device
        self._all: list[nn.Module] | None = None

    def all(self) -> list[nn.Module]:
        """One model per checkpoint, loaded once."""
        if self._all is None:
            self._all = [self._load(info) for info in self.checkpoints]
        return self._all

    def group(self, group: Sequence[int]) -> list[nn.Module]:
        """The models of a group of checkpoints: kept for later calls when one group holds them all."""
        if len(self.groups) == 1:
            return self.all()
        return [self._load(self.checkpoints[i]) for i in group]

    def _load(self, info: CheckpointInfo) -> nn.Module:
        return model_from_checkpoint(load_checkpoint(info.path, map_location=self.device, mmap=True), self.device)
