"""What kgtrace may replace, who may write, and results read as one.

* **Owned folders.** A folder kgtrace creates (a run, a prepared dataset, a prover run, an
  export) carries a marker file, ``.kgtrace`` (JSON: what kind of folder, which command, when).
  ``--overwrite`` replaces a folder only when it carries the marker for the same kind, holds no
  input of the same command, and is neither the working directory nor one of its parents.
  Anything else is refused, naming the folder and what is in it: kgtrace never deletes a file
  it did not write.
* **Locks.** A command that writes into a folder (train, resume) or a result file (evaluate,
  explain ``--out``) holds an exclusive lock (``filelock``, an OS-level ``flock`` the kernel
  releases when the process dies) while it writes; a second process is refused at once,
  naming the holder.
* **Results read as one.** A result written as several files (a JSON and the table beside it)
  is written index last: the old JSON is removed first, the companions are written, and the
  JSON comes last with their sha256 (`write_index`). A reader that starts from the JSON
  never sees a new table beside an old JSON, or the other way round.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from kgtrace.core.errors import KgtraceError, option_name
from kgtrace.core.errors import option as spoken
from kgtrace.core.io import LOCK, MANIFEST, MARKER, atomic_write_text, foreign_files, remove_written, written_files

KINDS = {"run": "a run folder", "dataset": "a dataset folder", "prover-run": "a prover run folder",
         "pykeen-export": "an export-pykeen folder", "tracin-index": "a TracIn index folder"}


@dataclass(frozen=True)
class Mark:
    """The marker's content: which kind of folder kgtrace wrote, with which command, when."""

    kind: str
    command: str
    created: str


def command_line() -> str:
    """How this process was started, as a user would type it (``kgtrace train --out r``)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    name = "kgtrace" if name in ("kgtrace", "__main__.py") else name
    return " ".join([name, *sys.argv[1:]])


def read_mark(folder: str | os.PathLike) -> Mark | None:
    """The folder's marker, or None when kgtrace did not write the folder (or it predates markers)."""
    path = Path(folder) / MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Mark(**{key: str(data[key]) for key in ("kind", "command", "created")})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_mark(folder: str | os.PathLike, kind: str) -> None:
    """Mark ``folder`` as one kgtrace wrote, with an empty list of the files it wrote there (call it on a folder
    kgtrace has just created or emptied, before it writes the folder's files: each is listed as it is written)."""
    mark = Mark(kind=kind, command=command_line(), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    atomic_write_text(Path(folder) / MARKER, json.dumps(asdict(mark), indent=2) + "\n")
    (Path(folder) / MANIFEST).touch()


def contents(folder: Path) -> list[str]:
    """The names in ``folder`` other than kgtrace's marker, manifest and lock, sorted ([] for a missing folder)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in (LOCK, MARKER, MANIFEST)) if folder.is_dir() else []


def replace_problem(out: Path, kind: str, inputs: Iterable[str | os.PathLike | None] = ()) -> str | None:
    """Why ``--overwrite`` may not replace the non-empty folder ``out`` with a new ``kind``, or None."""
    resolved = out.resolve()
    here = Path.cwd().resolve()
    if resolved == here or resolved in here.parents:
        return "is the working directory or one of its parents"
    held = [str(p) for p in inputs if p is not None and _inside(Path(p).resolve(), resolved)]
    if held:
        return f"holds an input of this command ({', '.join(held)})"
    mark = read_mark(out)
    if mark is None:
        return f"was not written by kgtrace (it has no {MARKER} marker; folders written before markers existed " \
               "have none either)"
    if mark.kind != kind:
        return f"is {KINDS.get(mark.kind, mark.kind)}, not {KINDS.get(kind, kind)}"
    if written_files(out) is None:
        return (f"was written by an earlier kgtrace, which did not list the files it wrote ({MANIFEST}), so "
                "--overwrite cannot tell yours from its own")
    return None


def check_out_folder(out: str | os.PathLike, *, kind: str, overwrite: bool,
                     inputs: Iterable[str | os.PathLike | None] = (), option: str = "--out",
                     hints: tuple[str, ...] = ()) -> None:
    """Refuse an output folder that this command may not fill: a file, a non-empty folder without
    ``overwrite``, or one ``--overwrite`` may not replace (see `replace_problem`). Changes nothing.

    hints: other ways out of a non-empty folder, e.g. "pass --resume to continue that run".
    """
    out = Path(out)
    given, other = spoken(option, str(out)), f"choose another {option_name(option)}"
    if out.exists() and not out.is_dir():
        raise KgtraceError(f"{given}: is a file, not a folder. Fix: {other}")
    existing = contents(out)
    if not existing:
        return
    listing = ", ".join(existing[:5]) + (f" and {len(existing) - 5} more" if len(existing) > 5 else "")
    if not overwrite:
        ways = [other, *hints]
        if replace_problem(out, kind, inputs) is None:
            ways.append(f"pass {spoken('--overwrite')} to replace it")
        raise KgtraceError(f"{given}: folder is not empty ({listing}). Fix: {' or '.join(ways)}")
    problem = replace_problem(out, kind, inputs)
    if problem:
        raise KgtraceError(f"{given}: {spoken('--overwrite')} only replaces {KINDS.get(kind, kind)} that "
                           f"kgtrace wrote, and this folder {problem}; it holds {listing}. Nothing was deleted. Fix: "
                           f"{other} (or delete the folder yourself if you are sure)")



def claim_out_folder(out: str | os.PathLike, *, kind: str, overwrite: bool,
                     inputs: Iterable[str | os.PathLike | None] = (), option: str = "--out") -> list[str]:
    """Make ``out`` a marked folder for a new ``kind``: created, or cleared where ``--overwrite`` may. Returns the
    files it kept: those kgtrace did not write there (its manifest does not list them), relative to ``out``.

    Clearing removes exactly what the manifest lists. Checks again what `check_out_folder` checked
    (call it under the folder's lock, so that no other kgtrace process writes there meanwhile); the lock
    file itself stays.
    """
    out = Path(out)
    check_out_folder(out, kind=kind, overwrite=overwrite, inputs=inputs, option=option)
    out.mkdir(parents=True, exist_ok=True)
    kept = foreign_files(out) if contents(out) else []  # only non-empty for a marked folder of this kind
    remove_written(out)
    write_mark(out, kind)
    return kept


def kept_note(out: str | os.PathLike, kept: list[str]) -> str | None:
    """What ``--overwrite`` says of the files it kept in ``out`` (None when it kept none)."""
    if not kept:
        return None
    listing = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
    return f"{spoken('--overwrite')} {out}: kept {len(kept)} file{'s' * (len(kept) > 1)} kgtrace did not write there: {listing}"


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


# ----------------------------------------------------------------------------- output files


@dataclass(frozen=True)
class Output:
    """A file a command writes: where, under which option, with which suffix.

    index: None for a file the user named; for a companion kgtrace names itself (the TSV beside
    ``--out x.json``), the index JSON that lists it (`write_index`).
    """

    path: Path
    option: str
    suffix: str
    index: Path | None = None


def check_outputs(outputs: Iterable[Output], *, reads: Iterable[str | os.PathLike | None] = (),
                  pinned: Iterable[str | os.PathLike | None] = ()) -> None:
    """The one rule for the files a command writes, checked before it computes anything; changes nothing.

    Each output must end in its suffix; must not be a file the command reads (``reads``) nor lie in
    ``pinned`` (the run's and dataset's inputs: files, or folders and all below them); must not be a
    folder; its folder must be one that can be made or written. An existing companion is replaced only
    when kgtrace wrote it: its index lists it with its current sha256. All problems are listed at once
    (a KgtraceError).
    """
    read = {Path(p).resolve() for p in reads if p is not None}
    kept = [Path(p).resolve() for p in pinned if p is not None]
    problems = []
    for out in outputs:
        where = f"{out.option} {out.path}" if out.index is None else f"{out.path} (written beside {out.index})"
        resolved = out.path.resolve()
        if out.path.suffix.lower() != out.suffix:
            problems.append(f"{where}: must end in {out.suffix}. Fix: e.g. {out.option} {out.path.stem}{out.suffix}")
        elif resolved in read:
            problems.append(f"{where}: is a file this command reads; writing it would replace it. Fix: choose "
                            f"another {out.option}")
        elif any(_inside(resolved, folder) for folder in kept):
            problems.append(f"{where}: lies among the files the run or its dataset is read from. Fix: choose "
                            f"another {out.option} outside them")
        elif out.path.is_dir():
            problems.append(f"{where}: is a folder. Fix: give the path of a file")
        elif out.index is not None and out.path.exists() and not _listed(out.index, out.path):
            problems.append(f"{where}: exists, and kgtrace did not write it there (no {out.index.name} lists "
                            f"it as written): it would be replaced. Fix: move it away, or choose another {out.option}")
        else:
            problems.extend(f"{where}: {problem}" for problem in _folder_problems(out.path.parent, out.option))
    if problems:
        raise KgtraceError(problems[0] if len(problems) == 1 else "cannot write:\n  - " + "\n  - ".join(problems))


def _listed(index: Path, path: Path) -> bool:
    """Whether the index JSON lists ``path`` with the sha256 it has now (kgtrace wrote it, and it is unchanged)."""
    try:
        files = json.loads(index.read_text(encoding="utf-8")).get("files", {})
    except (OSError, ValueError, AttributeError):
        return False
    name = os.path.relpath(path, index.parent) if _inside(path.resolve(), index.parent.resolve()) else str(path)
    return isinstance(files, dict) and files.get(name) == file_digest(path)


def _folder_problems(folder: Path, option: str) -> list[str]:
    """Why a file cannot be written into ``folder`` (made where missing): its nearest existing part is a file,
    or is not writable."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f"{existing} is a file, not a folder. Fix: choose another {option}"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"the folder {existing} is not writable. Fix: check its permissions (`ls -ld {existing}`), or "
                f"choose another {option}"]
    return []


# ----------------------------------------------------------------------------- locks


@contextmanager
def folder_lock(folder: str | os.PathLike, what: str = "folder") -> Iterator[None]:
    """Hold the exclusive lock of a folder kgtrace writes (its ``.kgtrace.lock``); re-entrant in one process.

    A second process is refused at once with a KgtraceError naming the holder (pid, command, since when).
    """
    with _lock(Path(folder) / LOCK, Path(folder), what, keep_file=True):
        yield


@contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold the exclusive lock of a result file kgtrace writes (a hidden ``.NAME.lock`` beside it, removed after)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path.with_name(f".{path.name}.lock"), path, "output", keep_file=False):
        yield


@contextmanager
def _lock(lock_path: Path, guarded: Path, what: str, keep_file: bool) -> Iterator[None]:
    if lock_path.is_dir():  # FileLock would fail with IsADirectoryError, naming nothing the user knows
        raise KgtraceError(f"{lock_path}: is a folder, where kgtrace keeps the lock file of {guarded}. Fix: move that "
                           "folder away (kgtrace never makes one there)")
    lock = FileLock(lock_path, timeout=0, is_singleton=True)
    try:
        lock.acquire()
    except Timeout:
        raise KgtraceError(f"{guarded}: the {what} is in use by another kgtrace process ({_holder(lock_path)}). "
                           "Fix: wait until it finishes, or write somewhere else") from None
    first = lock.lock_counter == 1
    try:
        if first:  # tell a refused process who holds the lock; the holder alone writes the file
            lock_path.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                             "command": command_line(), "since": time.strftime("%H:%M:%S")}))
        yield
    finally:
        if first and not keep_file:
            lock_path.unlink(missing_ok=True)  # still held: a process waiting on this name retries on a new file
        lock.release()


def _holder(lock_path: Path) -> str:
    try:
        who = json.loads(lock_path.read_text(encoding="utf-8"))
        return f"pid {who['pid']} on {who['host']}, `{who['command']}`, since {who['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


# ----------------------------------------------------------------------------- results of several files


def retire(index: str | os.PathLike) -> None:
    """Remove an earlier index JSON before its companions are rewritten (so no reader pairs it with new ones)."""
    Path(index).unlink(missing_ok=True)


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_index(index: str | os.PathLike, data: dict, companions: Iterable[str | os.PathLike]) -> None:
    """Write the JSON ``index`` last, listing each companion file (already written) with its sha256.

    ``data["files"]`` maps each companion's name (relative to the index's folder when inside it)
    to its sha256: a reader can check that the files it reads beside the JSON are the ones
    written with it.
    """
    index = Path(index)
    files = {}
    for path in map(Path, companions):
        name = os.path.relpath(path, index.parent) if _inside(path.resolve(), index.parent.resolve()) else str(path)
        files[name] = file_digest(path)
    atomic_write_text(index, json.dumps({**data, "files": files}, indent=2) + "\n")
