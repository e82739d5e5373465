"""Errors a user can act on.

Every error a user can fix is a :class:`KgtraceError`; the CLI prints its message
and exits with status 2, without a traceback. Messages name the key or the file
and line, the offending value, and the fix.
"""

from __future__ import annotations

from os import PathLike


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
