"""Progress of TracIn's streaming passes, saved now and then so that a killed run resumes where it stopped.

A pass with ``state=FILE`` saves, atomically and loadable with ``weights_only``, the step it has
reached and what its consumer keeps (the running top-k, the self-influence parts), under a
signature of the computation and its inputs: a later pass resumes from the file only when the
signature matches, and removes it when done.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from kgtrace.compute.distributed import World
from kgtrace.core.checkpoint import CheckpointInfo
from kgtrace.core.errors import ConfigError
from kgtrace.core.io import atomic_open, remove_stale_temporaries

__all__ = ["Progress", "signature", "state_file"]


class Progress:
    """Progress of a streaming pass, saved atomically to a file now and then (weights_only-loadable).

    save_every: seconds between saves (0: after every step).
    """

    def __init__(self, path: Path | None, signature: str, next_chunk: int, data: dict | None, save_every: float):
        self.path, self.signature, self.next, self.data = path, signature, next_chunk, data
        self.save_every = float(save_every)
        self.saved_at = time.monotonic()

    @classmethod
    def fresh(cls) -> Progress:
        """A pass from its start that saves nothing."""
        return cls(None, "", 0, None, 0.0)

    @classmethod
    def open(cls, path: str | Path | None, signature: str, save_every: float) -> Progress:
        """Resume from ``path`` if it holds this computation's progress, else start at chunk 0."""
        if not save_every >= 0:
            raise ConfigError([f"save_every={save_every!r}: must be a number of seconds, 0 or more"])
        if path is not None:  # what saves killed mid-write left (the state file is this pass's alone)
            remove_stale_temporaries(Path(path).parent, [Path(path).name])
        if path is None or not Path(path).is_file():
            return cls(None if path is None else Path(path), signature, 0, None, save_every)
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a foreign or damaged state file: start over (it is ours, and rewritten)
            saved = {}
        if saved.get("signature") != signature:
            return cls(Path(path), signature, 0, None, save_every)
        return cls(Path(path), signature, int(saved["next"]), saved["data"], save_every)

    def step(self, number: int, data: Callable[[], dict] | None) -> None:
        """Step ``number`` is done: save ``data()`` if it is time to (data None: a pass that saves nothing)."""
        if data is not None and self.path is not None and time.monotonic() - self.saved_at >= self.save_every:
            with atomic_open(self.path, "wb") as f:
                torch.save({"signature": self.signature, "next": number + 1, "data": data()}, f)
            self.saved_at = time.monotonic()

    def finish(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def signature(checkpoints: Sequence[CheckpointInfo], settings: Sequence[object], world: World, train: Tensor,
              test: Tensor | None) -> str:
    """What a saved state must match to be resumed: the same computation (``settings``) on the same inputs."""
    h = hashlib.sha256()
    for c in checkpoints:
        stat = c.path.stat()
        h.update(f"{c.path.resolve()}|{c.epoch}|{c.lr!r}|{stat.st_size}|{stat.st_mtime_ns};".encode())
    h.update(("|".join(str(s) for s in settings) + ";").encode())
    if world.distributed:  # a process's progress is its share of the chunks
        h.update(f"rank {world.rank} of {world.size};".encode())
    h.update(train.cpu().numpy().tobytes())
    if test is not None:
        h.update(test.cpu().numpy().tobytes())
    return h.hexdigest()


def state_file(state: str | Path | None, world: World) -> Path | None:
    """Each process of a distributed job saves its own progress beside ``state``."""
    if state is None or not world.distributed:
        return None if state is None else Path(state)
    return Path(f"{state}.rank{world.rank}-of-{world.size}")
