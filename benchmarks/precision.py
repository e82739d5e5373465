"""Training in fp32 against bf16 autocast (and tf32 on CUDA): seconds per epoch and the MRR each reaches; prints JSON.

The same recipe (kgtrace's default ConvE unless --model/--model-arg say otherwise) trains twice from
the same seed, once per precision, for --epochs epochs; then each run's last checkpoint ranks the
valid split (filtered) and, with --test, the test split. bf16 is worth using where it is faster and
its MRR stays within .005 of fp32's; so is tf32 (``--precisions fp32,tf32,bf16 --device cuda``).

    python benchmarks/precision.py --dataset umls --epochs 100 --threads 1
    KGTRACE_DATASETS_MIRROR=../shared/datasets/benchmarks \\
        python benchmarks/precision.py --dataset fb15k237 --epochs 1 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="umls")
    p.add_argument("--model", default="conve")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--test", action="store_true", help="also rank the test split")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="train's --compile (unset: its default, on CUDA only)")
    return p.parse_args(argv)


def one(args: argparse.Namespace, precision: str, root: Path) -> dict:
    from kgtrace.cli.common import model_args
    from kgtrace.core.config import TrainConfig
    from kgtrace.core.layout import RunLayout
    from kgtrace.evaluation.run_metrics import evaluate_run
    from kgtrace.report.sections import read_records
    from kgtrace.training.loop import train

    config = TrainConfig(dataset=args.dataset, model=args.model, model_args=model_args(args.model_arg),
                         epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, eval_every=args.epochs,
                         checkpoint_every=args.epochs, threads=args.threads, device=args.device,
                         precision=precision, compile=args.compile)
    start = time.perf_counter()
    train(config, root / precision, progress=False, log=lambda *_: None)
    wall = time.perf_counter() - start
    records = read_records(RunLayout(root / precision).metrics)
    out = {"seconds_per_epoch": sum(r["seconds"] for r in records) / len(records), "wall_seconds": wall,
           "final_loss": records[-1]["loss"], "valid_mrr": records[-1]["valid_mrr"]}
    if args.test:
        out["test_mrr"] = evaluate_run(root / precision).both.realistic.mrr
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    precisions = [p.strip() for p in args.precisions.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        cells = {p: one(args, p, Path(tmp)) for p in precisions}
    result = {"dataset": args.dataset, "model": args.model, "epochs": args.epochs, "threads": args.threads,
              "device": args.device, "compile": args.compile, "cells": cells}
    for other in sorted(set(cells) - {"fp32"}):
        if "fp32" not in cells:
            break
        fp32, cell = cells["fp32"], cells[other]
        result[f"{other}_time_ratio"] = cell["seconds_per_epoch"] / fp32["seconds_per_epoch"]
        result[f"{other}_valid_mrr_diff"] = cell["valid_mrr"] - fp32["valid_mrr"]
        if args.test:
            result[f"{other}_test_mrr_diff"] = cell["test_mrr"] - fp32["test_mrr"]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
