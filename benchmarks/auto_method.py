"""explain --method auto's estimate of TRAK's time against TRAK timed: print JSON, one row per run.

``kgtrace explain --method auto`` picks TRAK where its exact gradients fit and its time, estimated from
two timed pilots (``kgtrace.attribution.trak.TrakTime``), is within ``--budget`` seconds. This script
trains small runs (reused when present), estimates, times exact TRAK over every checkpoint for one
test triple, and reports measured / estimated (the target: within 2x either way).

    python benchmarks/auto_method.py [--runs nations-distmult,nations-conve,...] [--out benchmarks/runs/auto]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from common import base_run, processor_name, resolved

RUNS = {
    "nations-distmult": {"model_args": {"embedding_dim": 64}, "epochs": 20, "lr": 0.01},
    "nations-conve": {"model_args": {"embedding_dim": 32, "embedding_height": 4, "output_channels": 8}, "epochs": 10,
                      "lr": 0.003},
    "kinships-complex": {"model_args": {"embedding_dim": 32}, "epochs": 20, "lr": 0.01},
    "umls-complex": {"model_args": {"embedding_dim": 32}, "epochs": 40, "lr": 0.01},
}
SMOKE = {"nations-distmult": {"model_args": {"embedding_dim": 8}, "epochs": 5, "lr": 0.01}}


def one(name: str, spec: dict, out: Path, threads: int, device: torch.device) -> dict:
    from kgtrace.attribution.trak import TrakCost, TrakTime, trak
    from kgtrace.runs.embedding import load_run

    dataset, model = name.split("-")
    run = load_run(base_run(dataset, model, spec, out, threads, device))
    cost = TrakCost.of(run)
    start = time.perf_counter()
    estimate = TrakTime.measure(run)
    pilots = time.perf_counter() - start
    start = time.perf_counter()
    trak(run, run.dataset.test[:1])
    measured = time.perf_counter() - start
    ratio = measured / estimate.seconds
    return {"run": name, "triples": cost.triples, "parameters": cost.parameters, "checkpoints": cost.checkpoints,
            "estimate_s": round(estimate.seconds, 2), "measured_s": round(measured, 2), "pilots_s": round(pilots, 2),
            "measured_over_estimate": round(ratio, 3), "within_2x": 0.5 <= ratio <= 2.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("--smoke", action="store_true", help="one tiny run (seconds), for the test that runs every script")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/runs/auto"), help="where the runs are kept")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="where the runs train (TRAK itself runs on the CPU)")
    args = parser.parse_args()
    device = resolved(args.device)
    torch.set_num_threads(args.threads)
    specs = SMOKE if args.smoke else {name: RUNS[name] for name in args.runs.split(",")}
    rows = [one(name, spec, args.out, args.threads, device) for name, spec in specs.items()]
    print(json.dumps({"processor": processor_name(), "threads": args.threads, "target": "measured within 2x of the "
                      "estimate either way", "rows": rows, "met": all(r["within_2x"] for r in rows)}, indent=1))


if __name__ == "__main__":
    main()
