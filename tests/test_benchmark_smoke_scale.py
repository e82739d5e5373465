"""The ranking, memory, scale and machine benchmarks at a smoke size (tests/benchmark_smoke.py)."""

import json

import pytest
from benchmark_smoke import SMOKE, run_smoke

SCRIPTS = ["distributed_scaling", "eval_vs_pykeen", "head_tail", "matmul", "rules", "scale", "train_memory"]


def test_every_script_without_a_test_of_its_own_has_a_smoke_size():
    from benchmark_scripts import BENCHMARKS
    from test_benchmark_smoke_training import SCRIPTS as TRAINING

    own = {"tracin_scale", "tracin_vs_captum", "reproduce", "make_graph", "conve_first_protocol", "gpu_profile",
           "common"}
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - own
    assert scripts == set(SMOKE) == set(SCRIPTS) | set(TRAINING)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_runs_at_a_smoke_size(script, tmp_path):
    result = run_smoke(script, tmp_path)
    assert result
    if script == "rules":  # rules alone, the embedding run alone and their hybrid per aggregation but maxplus
        assert set(result["ranked"]) == {"embedding", "max", "nr_noisy_or", "hybrid-max", "hybrid-nr_noisy_or"}
    if script == "scale":  # a step that fails is recorded and the script goes on: each must have succeeded
        steps = json.loads((tmp_path / "scale.json").read_text())["steps"]
        assert {name: step["returncode"] for name, step in steps.items()} == dict.fromkeys(steps, 0)
