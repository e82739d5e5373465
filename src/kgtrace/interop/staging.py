"""Output folders of the interop commands: refuse to clobber what is not ours (written with kgtrace.io.atomic_folder)."""

from __future__ import annotations

from collections.abc import Callable
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
