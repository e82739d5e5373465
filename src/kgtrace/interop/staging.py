"""Writing an output folder whole or not at all: fill a temporary sibling, then rename it into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kgtrace.errors import KgtraceError


def check_out(out: Path, overwrite: bool, ours: Callable[[Path], bool], what: str) -> None:
    """Refuse to clobber: a non-empty ``out`` needs ``overwrite``, and is replaced only if ``ours(out)``."""
    if out.exists() and not out.is_dir():
        raise KgtraceError(f"{out}: a file, not a folder. Fix: choose another --out")
    existing = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if existing and not overwrite:
        raise KgtraceError(f"{out}: folder is not empty ({', '.join(existing[:5])}). "
                           "Fix: pass --overwrite to replace it, or choose another --out")
    if existing and not ours(out):
        raise KgtraceError(f"{out}: --overwrite only replaces {what}, and this folder is not one. Fix: choose another --out")


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``out``; on success it replaces ``out``, on error it is removed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        swap(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def swap(new: Path, out: Path) -> None:
    """Rename ``new`` to ``out``; an existing ``out`` is moved aside first and deleted after."""
    if not out.exists():
        os.rename(new, out)
        return
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
    os.rename(out, old / "replaced")
    os.rename(new, out)
    shutil.rmtree(old)
