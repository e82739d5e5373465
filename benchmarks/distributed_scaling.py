"""kgtrace evaluate, explain and train under torchrun with 1, 2, ... processes, side by side; prints JSON.

Trains a run once (one process), then times each command as a user runs it (the whole torchrun
command, start-up included) for every process count, and checks that the outputs equal the
single process's: evaluation metrics and TracIn explanations exactly, training losses to float
rounding (DistMult, so that no batch statistics or dropout differ). Ratios are seconds against
one process.

    python benchmarks/distributed_scaling.py [--procs 1,2,4] [--dataset kinships] [--device cpu|cuda]
        [--threads 1] [--memory-budget 256KB] [--explain 50] [--epochs 5] [--base-epochs 4]

On CPUs each process gets --threads threads: give N processes N times fewer than one would get.
--memory-budget sets the evaluation chunk: the processes share whole chunks, so a budget that
fits a split in one chunk leaves the others idle.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def kgtrace(procs: int, args: list[str], env: dict[str, str]) -> float:
    """Seconds of ``torchrun --nproc-per-node procs -m kgtrace ARGS`` (one plain process for 1)."""
    launcher = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    "--nproc-per-node", str(procs)]
    start = time.perf_counter()
    done = subprocess.run([*launcher, "-m", "kgtrace", *args], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:2])} with {procs} processes failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", default="1,2")
    parser.add_argument("--dataset", default="kinships")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1, help="threads per process")
    parser.add_argument("--memory-budget", default="256KB", help="evaluation budget (sets the chunk)")
    parser.add_argument("--explain", type=int, default=50, help="test triples explained")
    parser.add_argument("--epochs", type=int, default=5, help="epochs of the timed DistMult training")
    parser.add_argument("--base-epochs", type=int, default=4, help="epochs of the ConvE run evaluated and explained")
    args = parser.parse_args()
    procs = [int(p) for p in args.procs.split(",")]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    common = ["--device", args.device]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = tmp / "run"
        kgtrace(1, ["train", "--dataset", args.dataset, "--model", "conve", "--epochs", str(args.base_epochs),
                    "--checkpoint-every", "1", "--eval-every", "0", "--threads", str(args.threads), "--no-progress",
                    "--out", str(run), *common], env)
        rows = []
        for n in procs:
            row = {"processes": n}
            row["evaluate_s"] = kgtrace(n, ["evaluate", str(run), "--memory-budget", args.memory_budget, "--out",
                                            str(tmp / f"eval-{n}.json"), *common], env)
            row["explain_s"] = kgtrace(n, ["explain", str(run), "--test", str(args.explain), "--params", "all",
                                           "--no-progress", "--out", str(tmp / f"explain-{n}.json"), *common], env)
            row["train_s"] = kgtrace(n, ["train", "--dataset", args.dataset, "--model", "distmult", "--epochs",
                                         str(args.epochs), "--eval-every", "0", "--threads", str(args.threads),
                                         "--no-progress", "--out", str(tmp / f"train-{n}"), *common], env)
            rows.append(row)
        one = rows[0]
        for row in rows:
            n = row["processes"]
            for key in ("evaluate_s", "explain_s", "train_s"):
                row[key.replace("_s", "_ratio")] = row[key] / one[key]
            row["evaluate_equal"] = (tmp / f"eval-{n}.json").read_bytes() == (tmp / f"eval-{procs[0]}.json").read_bytes()
            row["explain_equal"] = (tmp / f"explain-{n}.json").read_bytes() == (
                tmp / f"explain-{procs[0]}.json").read_bytes()
            mine, theirs = losses(tmp / f"train-{n}"), losses(tmp / f"train-{procs[0]}")
            row["train_loss_max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(mine, theirs))
    print(json.dumps({"dataset": args.dataset, "device": args.device, "threads_per_process": args.threads,
                      "memory_budget": args.memory_budget, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
