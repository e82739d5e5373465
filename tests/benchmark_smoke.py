"""Every script of benchmarks/ at a smoke size (seconds each): a change that breaks one fails a test, not a user.

Scripts with tests of their own (tracin_scale, tracin_vs_captum, reproduce, make_graph, conve_first_protocol,
gpu_profile) are run there; the rest by tests/test_benchmark_smoke_*.py (two files, so that two test processes
share them). Each runs as a user runs it, ``python benchmarks/NAME.py ...``, in a scratch folder, after the
commands that make its input (a graph, a run), and must exit 0 and print JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmark_scripts import BENCHMARKS

KGTRACE = [sys.executable, "-m", "kgtrace"]
TINY_RUN = [*KGTRACE, "train", "--dataset", "nations", "--model", "distmult", "--epochs", "2", "--model-arg",
            "embedding_dim=8", "--eval-every", "0", "--threads", "1", "--device", "cpu", "--no-progress", "--out", "run"]
ROBOKOP = [sys.executable, str(BENCHMARKS / "make_graph.py"), "robokop", "--out", "graphs/robokop", "--nodes", "3000",
           "--edges", "20000"]

#: script -> (commands making its input, its arguments at a smoke size)
SMOKE: dict[str, tuple[list[list[str]], list[str]]] = {
    "auto_method": ([], ["--smoke", "--out", "runs", "--device", "cpu"]),
    "compile_speedup": ([], ["--repeats", "1", "--steps", "2", "--evals", "1", "--threads", "1", "--parts", "train_step"]),
    "distributed_scaling": ([], ["--procs", "1", "--dataset", "nations", "--epochs", "1", "--base-epochs", "1",
                                 "--explain", "2"]),
    "eval_vs_pykeen": ([], ["--entities", "1000", "--train", "8000", "--test", "50", "--models", "distmult",
                            "--sampled-queries", "20", "--corruptions", "400", "--no-compile"]),
    "faithfulness": ([], ["--datasets", "nations", "--models", "distmult", "--predictions", "2", "--retrain", "1",
                          "--k", "1", "--methods", "random", "--jobs", "1", "--out", "faithfulness", "--no-progress",
                          "--device", "cpu"]),
    "head_tail": ([TINY_RUN], ["--run", "run", "--device", "cpu", "--threads", "1"]),
    "lds": ([], ["--datasets", "nations", "--models", "distmult", "--subsets", "3", "--predictions", "2", "--methods",
                 "random,neighbourhood", "--peers", ""]),
    "matmul": ([], ["--threads", "1", "--repeats", "1", "--calls", "2", "--device", "cpu"]),
    "precision": ([], ["--dataset", "nations", "--model", "distmult", "--epochs", "1", "--device", "cpu"]),
    "prover": ([], ["--datasets", "nations", "--threads", "1", "--depth", "2", "--engine-speed-only"]),
    "rules": ([TINY_RUN], ["--dataset", "nations", "--rounds", "1", "--paths-per-round", "256", "--aggregations",
                           "max,nr_noisy_or", "--test-triples", "20", "--work", "rules", "--threads", "1", "--device",
                           "cpu", "--embedding-run", "run", "--hybrid-valid", "30"]),
    "scale": ([ROBOKOP], ["--robokop", "graphs/robokop", "--hetionet", "graphs/hetionet", "--work", "work", "--steps",
                          "prepare,train,rules", "--train-steps", "2", "--rules-seconds", "3", "--threads", "1",
                          "--device", "cpu", "--results", "scale.json"]),
    "tracin_index": ([], ["--dataset", "nations", "--models", "distmult", "--epochs", "2", "--checkpoint-every", "1",
                          "--dims", "16", "--n-test", "2", "--threads", "1", "--device", "cpu"]),
    "train_memory": ([], ["--entities", "2000", "--triples", "10000", "--relations", "5", "--batch", "16", "--chunk",
                          "512", "--device", "cpu"]),
    "train_vs_pykeen": ([], ["--models", "conve,transe", "--datasets", "nations", "--epochs", "1", "--threads", "1"]),
}


def run_smoke(script: str, folder: Path) -> object:
    """Make the script's input in ``folder``, run it at its smoke size there; returns the (first) JSON it printed."""
    before, args = SMOKE[script]
    for command in before:
        made = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=folder)
        assert made.returncode == 0, made.stderr[-3000:]
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), *args], capture_output=True, text=True,
                          timeout=570, cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.JSONDecoder().raw_decode(done.stdout[done.stdout.index("{"):])[0]
