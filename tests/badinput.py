"""The bad-input harness: run the real CLI on a bad input and check how it refuses.

``refused(argv, watch=folder, mentions=[...])`` runs ``kgtrace ARGV`` in this process
(``kgtrace.cli.main``, as the console script does) and asserts what a user is promised:
a non-zero exit, no traceback and no "internal error", a message that names what it
should (the file, the line, the option), and not one file under ``watch`` created,
changed or removed.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from kgtrace.cli import main
from kgtrace.core.owned import LOCK


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder below ``folder``: relative path -> sha256 of its bytes ('dir' for a folder).

    A run folder's lock file is left out: it holds the last holder's pid, rewritten by each
    process that takes the lock (a refusal after taking it is still a refusal).
    """
    found = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.name == LOCK:
            continue
        key = str(path.relative_to(folder))
        found[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``kgtrace ARGV``; argparse's exits count as statuses."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse: usage errors exit 2
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def refused(argv: list, *, watch: Path | Iterable[Path], mentions: Iterable[str] = ()) -> str:
    """Assert that ``kgtrace ARGV`` refuses cleanly and leaves ``watch`` as it was; returns its stderr."""
    folders = [watch] if isinstance(watch, Path) else list(watch)
    before = [snapshot(f) for f in folders]
    code, out, err = run_cli(argv)
    text = out + err
    assert code != 0, f"exit 0 for a bad input: {argv}\n{text}"
    assert "Traceback" not in text and "internal error" not in text, text
    for needle in mentions:
        assert str(needle) in err, f"{needle!r} not in the message:\n{err}"
    for folder, was in zip(folders, before):
        now = snapshot(folder)
        assert now == was, f"{folder} changed: {sorted(set(now.items()) ^ set(was.items()))}"
    return err
