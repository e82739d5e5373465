"""Every test has a time limit (pyproject.toml, pytest-timeout): a hang fails, naming the test and where it hung."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_has_a_limit_that_stops_even_a_hang_in_native_code():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < settings["timeout"] <= 300
    assert settings["timeout_method"] == "thread"  # a signal waits for Python code, which a native hang never reaches


def test_a_hung_test_is_named_with_the_stack_where_it_hung(tmp_path):
    (tmp_path / "test_hang.py").write_text("import time\nimport pytest\n\n\n@pytest.mark.timeout(2)\n"
                                           "def test_waits_forever():\n    time.sleep(120)\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", ROOT / "pyproject.toml",
                           "--rootdir", tmp_path, tmp_path / "test_hang.py"], capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Timeout" in out and "test_waits_forever" in out
    assert 'test_hang.py", line 7, in test_waits_forever' in out  # the line it hung on
