"""The training, attribution and prover benchmarks at a smoke size (tests/benchmark_smoke.py)."""

import pytest
from benchmark_smoke import run_smoke

SCRIPTS = ["auto_method", "compile_speedup", "faithfulness", "lds", "precision", "prover", "tracin_index", "train_vs_pykeen"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_runs_at_a_smoke_size(script, tmp_path):
    result = run_smoke(script, tmp_path)
    assert result
    if script == "train_vs_pykeen":  # a cell's failure is recorded in the JSON, not in the exit status
        cells = [row[tool] for row in result["results"] for tool in ("pykeen", "kgtrace")]
        assert len(cells) == 4 and not [cell["error"] for cell in cells if "error" in cell]
