"""Errors a user can act on.

Every error a user can fix is a `KgtraceError`; the CLI prints its message
and exits with status 2, without a traceback. Messages name the key or the file
and line, the offending value, and the fix, in their reader's terms where it matters:
`option` spells an option ``--overwrite`` under the command line (its main runs inside
`command_line`) and ``overwrite=True`` for a Python caller.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from os import PathLike

#: Who reads the messages: "python" (a script or notebook, the default) or "cli" (``kgtrace ...``, set by its main).
_READER: ContextVar[str] = ContextVar("kgtrace_reader", default="python")


@contextmanager
def command_line() -> Iterator[None]:
    """Messages raised inside the block speak to a command line (``--overwrite``), not to Python (``overwrite=True``)."""
    token = _READER.set("cli")
    try:
        yield
    finally:
        _READER.reset(token)


def on_command_line() -> bool:
    """Whether messages raised now speak to a command line (inside `command_line`)."""
    return _READER.get() == "cli"


def option(flag: str, value: object = True) -> str:
    """An option as its reader gives it: ``flag`` (``--overwrite``, ``--out x``) on the command line, the keyword
    argument (``overwrite=True``, ``out='x'``) from Python. value True: a switch."""
    if on_command_line():
        return flag if value is True else f"{flag} {value}"
    return f"{flag.lstrip('-').replace('-', '_')}={value!r}"


def option_off(flag: str) -> str:
    """A switch turned off as its reader gives it: ``--no-compile`` on the command line, ``compile=False`` from Python."""
    return f"--no-{flag.lstrip('-')}" if on_command_line() else f"{flag.lstrip('-').replace('-', '_')}=False"


def option_name(flag: str, python: str | None = None) -> str:
    """The option's name as its reader writes it: ``--out`` on the command line, ``out`` from Python (``python``
    where the keyword argument is spelled otherwise: ``--category-pair`` is ``category_pairs``)."""
    if on_command_line():
        return flag
    return python or flag.lstrip("-").replace("-", "_")


class KgtraceError(Exception):
    """An error caused by input or configuration; its message says how to fix it."""


class DataError(KgtraceError):
    """A problem in an input file, located by path and (1-based) line number.

    ``line`` is None when the problem concerns the whole file.
    """

    def __init__(self, path: str | PathLike, line: int | None, problem: str, fix: str):
        self.path = str(path)
        self.line = line
        self.problem = problem
        self.fix = fix
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {problem}. Fix: {fix}")


class UnknownLabel(DataError):
    """A triple whose label the id map in use does not hold."""


class DataWarning(UserWarning):
    """Input that was read after leaving something out (e.g. test triples whose entity never occurs
    in train); the message names the file, what was left out and how to keep it. The CLI prints
    it as one line."""


class ConfigError(KgtraceError):
    """One or more invalid settings, all reported at once.

    ``problems`` holds one line per problem, each naming the key, the value and the fix. One
    problem reads as one line; several are listed one per line.
    """

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        if len(self.problems) == 1:
            super().__init__(f"invalid setting: {self.problems[0]}")
            return
        super().__init__("invalid configuration:\n  - " + "\n  - ".join(self.problems))


#: errno name -> the fix a user can make, for the faults of the operating system a command may meet.
OS_FIXES = {
    "ENOSPC": "free disk space (`df -h` shows where), then run the same command again; a run it was training "
              "continues from its last checkpoint with `kgtrace train --resume RUN`",
    "EDQUOT": "free space within your disk quota, then run the same command again",
    "EFBIG": "lift the file-size limit (`ulimit -f unlimited`) or write to another file system, then run the "
             "same command again",
    "EACCES": "check the permissions (`ls -ld` the path and its folder), or choose another path",
    "EPERM": "check the permissions (`ls -ld` the path and its folder), or choose another path",
    "EROFS": "the file system is read-only: choose a path on a writable one",
    "ENAMETOOLONG": "shorten the file or folder name (most file systems allow 255 bytes a name)",
    "ENOTDIR": "a part of the path is a file, not a folder: choose another path",
    "EISDIR": "the path is a folder: give the path of a file",
    "ENOENT": "check the path (a folder on the way does not exist)",
    "EEXIST": "remove it or choose another path",
    "EMFILE": "raise the open-file limit (`ulimit -n`), then run the same command again",
    "EIO": "the disk reported an I/O error: check it, then run the same command again",
}


def os_fault(error: OSError) -> KgtraceError:
    """A fault of the operating system (disk full, permission denied, ...) as an error naming the path and the fix."""
    code = errno.errorcode.get(error.errno, "") if error.errno is not None else ""
    paths = [str(p) for p in (error.filename, error.filename2) if p is not None]
    where = f"{' -> '.join(paths)}: " if paths else ""
    reason = error.strerror or str(error)
    fix = OS_FIXES.get(code, "check the path and the disk, then run the same command again")
    return KgtraceError(f"{where}{reason}{f' ({code})' if code else ''}. Fix: {fix}")
