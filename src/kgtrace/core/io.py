"""Atomic file and folder writes: a crash leaves the old file (or folder) or none, never half a new one.

Every file written here inside a folder kgtrace owns (one holding the ``.kgtrace`` marker, see
`kgtrace.core.owned`) is listed in that folder's ``.kgtrace.files``: what ``--overwrite`` may remove.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

from kgtrace.core.errors import KgtraceError, option

MARKER = ".kgtrace"  # the marker of a folder kgtrace owns (kgtrace.core.owned)
MANIFEST = ".kgtrace.files"  # beside it: the files kgtrace wrote there, one path (relative to the folder) a line
LOCK = ".kgtrace.lock"  # the lock of a folder kgtrace writes (kgtrace.core.owned.folder_lock)


def owner_folder(path: Path) -> Path | None:
    """The nearest folder above ``path`` that holds kgtrace's marker, or None."""
    for folder in Path(os.path.abspath(path)).parents:
        if (folder / MARKER).is_file():
            return folder
    return None


def record_written(path: str | os.PathLike) -> None:
    """List ``path`` (just written) in the manifest of the kgtrace folder it lies in, if any.

    One line appended with O_APPEND: writers in several processes (a faithfulness check's trainings)
    never interleave within a line.
    """
    path = Path(os.path.abspath(path))
    owner = owner_folder(path)
    if owner is None or path.name in (MARKER, MANIFEST):
        return
    line = (os.path.relpath(path, owner) + "\n").encode("utf-8")
    fd = os.open(owner / MANIFEST, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def written_files(folder: str | os.PathLike) -> set[str] | None:
    """The paths (relative to ``folder``) its manifest lists; None when it has none (written before manifests)."""
    try:
        text = (Path(folder) / MANIFEST).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return {line for line in text.splitlines() if line}


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    On any exception the temporary file is removed and ``path`` is left untouched. An OSError that
    names no file (a full disk met by a write or an fsync) is raised naming ``path``.
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
        record_written(target)
    except BaseException as e:
        with suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(e, OSError) and e.filename is None:
            raise OSError(e.errno, e.strerror or str(e), str(target)) from e
        raise


#: The name of atomic_path's temporary file for TARGET: ".TARGET." + mkstemp's 8 random characters + ".tmp".
TEMPORARY_NAME = re.compile(r"\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp")


def remove_stale_temporaries(folder: str | os.PathLike, targets: Collection[str] | None = None) -> list[str]:
    """Remove the temporary files that killed atomic writes left in ``folder``; returns their names, sorted.

    Only regular files named exactly as `atomic_path` names them go (with ``targets``: only
    those whose target is one of these names); nothing else is touched, and sub-folders are not
    searched. Call it only where no other process may be writing into ``folder`` (a run folder
    under its lock): a live write's temporary file has the same name as a dead one's.
    """
    if not os.path.isdir(folder):
        return []
    removed = []
    for entry in os.scandir(folder):
        match = TEMPORARY_NAME.fullmatch(entry.name)
        if match is None or (targets is not None and match.group("target") not in targets):
            continue
        if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
            continue
        with suppress(FileNotFoundError):
            os.unlink(entry.path)
            removed.append(entry.name)
    return sorted(removed)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path`` ("w": UTF-8 text with LF ends, or "wb"); fsync, rename."""
    with atomic_path(path) as tmp:
        text = "b" not in mode
        with open(tmp, mode, encoding="utf-8" if text else None, newline="\n" if text else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line (a record of a log such as metrics.jsonl) to a file, listed as kgtrace's (`record_written`)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    record_written(path)


def atomic_write_text(path: str | os.PathLike, chunks: str | Iterable[str]) -> None:
    """Write text (or an iterable of chunks) as UTF-8, atomically."""
    with atomic_open(path) as f:
        for chunk in [chunks] if isinstance(chunks, str) else chunks:
            f.write(chunk)


@contextmanager
def atomic_folder(out: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``out``; on success it replaces ``out``, on error it is removed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        _swap_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_folder(new: Path, out: Path) -> None:
    """Rename ``new`` to ``out``; an existing ``out`` is moved aside first and deleted after, but for the files
    kgtrace did not write there (`foreign_files`), which move into the new folder at the same place."""
    if not out.exists():
        os.rename(new, out)
        return
    kept = foreign_files(out)
    clash = [name for name in kept if (new / name).exists()]
    if clash:
        raise KgtraceError(f"{out}: holds {', '.join(clash)}, which kgtrace did not write there, where the new "
                           "folder has files of the same name. Nothing was replaced. Fix: move them away")
    for name in kept:
        (new / name).parent.mkdir(parents=True, exist_ok=True)
        os.rename(out / name, new / name)
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
    os.rename(out, old / "replaced")
    os.rename(new, out)
    shutil.rmtree(old)


def foreign_files(folder: str | os.PathLike) -> list[str]:
    """The files below ``folder`` (relative paths, sorted) that its manifest does not list: the user's, which
    ``--overwrite`` keeps. kgtrace's marker, manifest and lock and the temporaries of its writes are its own; in a
    folder below that kgtrace owns too (a run's TracIn index), that folder's own list decides. Every file of a
    folder without a manifest."""
    folder = Path(folder)
    listed = written_files(folder) or set()
    found = []
    for root, dirs, names in os.walk(folder):
        if root != str(folder) and os.path.isfile(os.path.join(root, MARKER)):
            below = os.path.relpath(root, folder)
            found += [os.path.join(below, name) for name in foreign_files(root)]
            dirs[:] = []  # its own list covered everything below it
            continue
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), folder)
            own = relative in (MARKER, MANIFEST, LOCK) or TEMPORARY_NAME.fullmatch(name) is not None
            if relative not in listed and not own:
                found.append(relative)
    return sorted(found)


def remove_written(folder: str | os.PathLike) -> None:
    """Remove what the manifest of ``folder`` lists, and what the folders below it that kgtrace owns list (with
    their marker, list and lock), then the folders that leaves empty, and the manifest itself."""
    folder = Path(folder)
    for root, dirs, _ in os.walk(folder):
        for name in list(dirs):
            below = Path(root) / name
            if (below / MARKER).is_file():
                dirs.remove(name)
                remove_written(below)
                for own in (MARKER, LOCK):
                    (below / own).unlink(missing_ok=True)
                _remove_if_empty(below, folder)
    top = folder.resolve()
    for name in sorted(written_files(folder) or (), reverse=True):
        path = folder / name
        if top not in path.parent.resolve().parents and path.parent.resolve() != top:
            continue  # a line that leads out of the folder (an edited or foreign list): never followed
        if path.is_file() or path.is_symlink():
            path.unlink()
        _remove_if_empty(path.parent, folder)
    (folder / MANIFEST).unlink(missing_ok=True)


def _remove_if_empty(path: Path, top: Path) -> None:
    """Remove ``path`` and its parents while they are empty folders, up to ``top`` (kept)."""
    for folder in (path, *path.parents):
        if folder == top or top not in folder.parents or not folder.is_dir() or any(folder.iterdir()):
            return
        folder.rmdir()


def check_json_out(path: str | os.PathLike) -> None:
    """Refuse an --out that is not .json (a TSV with the same stem is written beside it)."""
    if Path(path).suffix.lower() != ".json":
        raise KgtraceError(f"{option('--out', str(path))}: must end in .json (a .tsv is written beside it). Fix: e.g. "
                           f"{option('--out', 'out.json')}")
