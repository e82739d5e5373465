"""Every Python example of the README and the docs runs, as written, in one scratch folder.

The README's example runs first: it trains the run (``runs/nations``) the other pages' examples read. A
page's blocks run in order in one namespace. An example that needs other runs says so in an HTML comment
just above it (``<!-- doc-test setup:`` then one ``kgtrace`` command per line, ``-->``), shown to readers
as the commands beside it; those commands run first.
"""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from kgtrace.cli import main

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?:<!-- doc-test setup:\n(?P<setup>.*?)-->\n)?```python\n(?P<code>.*?)```", re.S)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NEEDS = {"pykeen.md": "pykeen"}  # a page whose examples need an optional package


def examples(page: Path) -> list[tuple[list[str], str]]:
    """(setup commands, code) of each Python block of ``page``, in order."""
    found = []
    for match in BLOCK.finditer(page.read_text(encoding="utf-8")):
        setup = [shlex.split(line)[1:] for line in (match["setup"] or "").splitlines() if line.strip()]
        found.append((setup, match["code"]))
    return found


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder where the README's example has run (its run folder, runs/nations, serves the other pages)."""
    folder = tmp_path_factory.mktemp("docs")
    with contextlib.chdir(folder):
        run_page(ROOT / "README.md")
    return folder


def run_page(page: Path) -> None:
    namespace: dict = {"__name__": f"doc_{page.stem}"}
    for setup, code in examples(page):
        for command in setup:
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(command) == 0, f"{page.name}: setup command failed: kgtrace {shlex.join(command)}"
        exec(compile(code, f"{page.name} example", "exec"), namespace)  # noqa: S102 - the docs' own examples


def test_the_pages_hold_examples():
    assert examples(ROOT / "README.md") and sum(len(examples(p)) for p in PAGES) >= 6


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "README.md" and examples(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_run(scratch, page):
    if page.name in NEEDS:
        pytest.importorskip(NEEDS[page.name])
    with contextlib.chdir(scratch):
        run_page(page)
