"""benchmarks/tracin_scale.py at a smoke size: its synthetic runs load (their held-out triples use only entities and
relations of train, so loading drops none and the pinned splits hold) and its JSON has a figure per size."""

import json
import subprocess
import sys

from benchmark_scripts import BENCHMARKS, benchmark_script


def test_held_out_triples_only_use_what_train_has():
    with benchmark_script("tracin_scale") as scale:
        triples = scale.synthetic_triples(300, 20, 200, 5, seed=1)
    train = triples["train"]
    for split in ("valid", "test"):
        held = triples[split]
        assert len(held) == 20
        assert set(held[:, [0, 2]].reshape(-1)) <= set(train[:, [0, 2]].reshape(-1))
        assert set(held[:, 1]) <= set(train[:, 1])
    keys = {tuple(t) for t in train}
    assert not {tuple(t) for t in triples["valid"]} & keys and not {tuple(t) for t in triples["test"]} & keys


def test_the_script_runs_at_a_smoke_size(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "tracin_scale.py"), "--sizes", "1500", "--entities", "200",
                           "--relations", "5", "--n-test", "3", "--checkpoints", "2", "--threads", "1",
                           "--device", "cpu"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    (size,) = result["results"]
    assert size["n_train"] == 1500 and size["tracin_seconds"] > 0 and size["tracin_working_memory_mb"] > 0
