"""The import contracts in pyproject.toml (import-linter): layers flow one way, no package has a cycle."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    beside = Path(sys.executable).parent / "lint-imports"  # the test's own environment first
    lint = str(beside) if beside.is_file() else shutil.which("lint-imports")
    assert lint, "lint-imports is not installed: pip install -e '.[test]'"
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout
