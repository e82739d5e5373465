"""Atomic file writes: a crash leaves the old file or none, never half a new one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

from kgtrace.errors import KgtraceError


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs should be readable like any other file
        os.replace(tmp, target)
    except BaseException:
        with suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path`` ("w": UTF-8 text with LF ends, or "wb"); fsync, rename."""
    with atomic_path(path) as tmp:
        text = "b" not in mode
        with open(tmp, mode, encoding="utf-8" if text else None, newline="\n" if text else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(path: str | os.PathLike, chunks: str | Iterable[str]) -> None:
    """Write text (or an iterable of chunks) as UTF-8, atomically."""
    with atomic_open(path) as f:
        for chunk in [chunks] if isinstance(chunks, str) else chunks:
            f.write(chunk)


def check_outputs_spare_inputs(outputs: Iterable[str | os.PathLike], inputs: Iterable[str | os.PathLike | None],
                               option: str = "--out") -> None:
    """Refuse outputs that would replace an input file (e.g. the TSV written beside --out x.json when x.tsv is read)."""
    given = {Path(p).resolve() for p in inputs if p is not None}
    clash = [str(p) for p in outputs if Path(p).resolve() in given]
    if clash:
        raise KgtraceError(f"{option}: writing {', '.join(clash)} would replace an input file. "
                           f"Fix: choose another {option} name")
