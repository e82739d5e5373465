"""Per-checkpoint influences held on disk while TracIn goes through the checkpoints a group at a time.

TracIn's top-k needs, for each training chunk, the influence parts of every checkpoint at once
(the ranking is of their sum). When the checkpoints' models do not fit the memory budget
together, the pass visits them in groups: each group but the last writes its parts here, chunk
by chunk, and the last group's pass reads them back beside its own. The arithmetic is the same
as with every model in memory, so the results are equal bit for bit.

Layout: one float32 file per spilled group, holding for each chunk (in the pass's chunk order)
the block [G, n_test, c] at byte offset ``G * n_test * start * 4``, where ``start`` is the number of
training triples in the chunks before it. Blocks are written with ``pwrite`` at their offset, so
redoing a chunk after a resume overwrites it in place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from kgtrace.core.errors import KgtraceError, option_name

__all__ = ["Spill", "spill_bytes"]

_ITEM = 4  # float32


def spill_bytes(groups: Sequence[Sequence[int]], n_test: int, n_train: int) -> int:
    """Disk the groups before the last one take: n_test * n_train float32 values per spilled checkpoint."""
    return sum(len(g) for g in groups[:-1]) * n_test * n_train * _ITEM


class Spill:
    """The spilled groups' files of one pass, opened for writing and reading.

    folder, stem: the files are ``folder/stem.spill{g}`` (beside the pass's state file, so that a
    resumed pass finds them); folder None: a temporary folder, removed on `close`.
    sizes: the training triples in each chunk of the pass, in order. fresh: start the files empty
    (a new pass); else they hold a resumed pass's blocks.
    """

    def __init__(self, folder: Path | None, stem: str, groups: Sequence[Sequence[int]], n_test: int,
                 sizes: Sequence[int], fresh: bool):
        self._stack = ExitStack()
        if folder is None:
            folder = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="kgtrace-tracin-")))
        folder.mkdir(parents=True, exist_ok=True)
        self.paths = [folder / f"{stem}.spill{g}" for g in range(len(groups) - 1)]
        self.widths = [len(g) for g in groups[:-1]]
        self.n_test = n_test
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # [chunks + 1]
        if fresh:
            _check_room(folder, spill_bytes(groups, n_test, int(self.starts[-1])) - self._present())
        self.fds = [os.open(p, os.O_RDWR | os.O_CREAT | (os.O_TRUNC if fresh else 0), 0o644) for p in self.paths]

    def _present(self) -> int:
        return sum(p.stat().st_size for p in self.paths if p.is_file())

    def write(self, group: int, chunk: int, parts: Tensor) -> None:
        """Store a spilled group's parts [G, n_test, c] of ``chunk``."""
        block = parts.detach().to("cpu", torch.float32).contiguous().numpy()
        os.pwrite(self.fds[group], block.tobytes(), self._offset(group, chunk))

    def read(self, chunk: int, device: torch.device) -> Tensor:
        """Every spilled group's parts of ``chunk``, in group order: [sum of G, n_test, c]."""
        c = int(self.starts[chunk + 1] - self.starts[chunk])
        out = np.empty((sum(self.widths), self.n_test, c), dtype=np.float32)  # [sum of G, n_test, c]
        row = 0
        for group, (fd, width) in enumerate(zip(self.fds, self.widths)):
            block = out[row : row + width]
            got = os.preadv(fd, [block], self._offset(group, chunk))
            if got != block.nbytes:  # the file lost its end (a disk filled, a file cut): not silently zero
                raise KgtraceError(f"{self.paths[group]}: holds {got} of the {block.nbytes} bytes of chunk {chunk}. "
                                   "Fix: delete it and the state file beside it, and run the command again")
            row += width
        return torch.from_numpy(out).to(device)

    def _offset(self, group: int, chunk: int) -> int:
        return int(self.widths[group] * self.n_test * self.starts[chunk] * _ITEM)

    def close(self, remove: bool) -> None:
        """Close the files; remove them too when the pass is done (they are this pass's alone)."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        if remove:
            for p in self.paths:
                p.unlink(missing_ok=True)
        self._stack.close()


def _check_room(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise KgtraceError(
            f"{folder}: TracIn's pass over the checkpoints a group at a time needs {needed / 2**30:.1f} GiB of disk "
            f"there for the groups' influences, and {free / 2**30:.1f} GiB are free. Fix: raise "
            f"{option_name('--memory-budget')} so that more checkpoints are held at once, explain fewer triples per "
            f"command, or save the progress elsewhere ({option_name('--out', 'state')})")
