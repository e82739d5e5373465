"""Train PyKEEN's ConvE and ours on the same data with the same hyperparameters; print JSON.

Both tools train ConvE (dim 200, 10x20, 32 3x3 filters) with KvsAll/LCWA over reciprocal queries,
BCE with label smoothing 0.1, Adam 1e-3, batch 128, for --epochs epochs, then rank the test split
filtered by train+valid+test (realistic ties). Each (tool, dataset, threads) cell runs in its own
process, so peak RSS is that tool's alone; the parent prints one JSON document with the ratios.

    python benchmarks/train_vs_pykeen.py [--datasets umls,kinships] [--threads 1,2] [--epochs 100]

Needs PyKEEN (`pip install pykeen==1.11.1` beside kgtrace).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HYPER = {"embedding_dim": 200, "batch_size": 128, "lr": 1e-3, "label_smoothing": 0.1}


def bundled_folder(name: str) -> Path:
    from importlib.resources import files

    return Path(str(files("kgtrace.data") / "bundled" / name))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run_pykeen(dataset: str, epochs: int, seed: int) -> dict:
    from pykeen.pipeline import pipeline
    from pykeen.triples import TriplesFactory

    folder = bundled_folder(dataset)
    train = TriplesFactory.from_path(folder / "train.txt", create_inverse_triples=True)
    valid = TriplesFactory.from_path(folder / "valid.txt", entity_to_id=train.entity_to_id,
                                     relation_to_id=train.relation_to_id, create_inverse_triples=True)
    test = TriplesFactory.from_path(folder / "test.txt", entity_to_id=train.entity_to_id,
                                    relation_to_id=train.relation_to_id, create_inverse_triples=True)
    start = time.perf_counter()
    result = pipeline(
        training=train, validation=valid, testing=test, model="ConvE",
        model_kwargs={"embedding_dim": HYPER["embedding_dim"]},
        loss="BCEWithLogits", training_loop="LCWA", optimizer="Adam", optimizer_kwargs={"lr": HYPER["lr"]},
        training_kwargs={"num_epochs": epochs, "batch_size": HYPER["batch_size"],
                         "label_smoothing": HYPER["label_smoothing"], "use_tqdm": False},
        evaluator="RankBasedEvaluator", evaluator_kwargs={"filtered": True},
        evaluation_kwargs={"use_tqdm": False}, random_seed=seed, device="cpu",
    )
    total = time.perf_counter() - start
    get = result.metric_results.get_metric
    return {
        "seconds_per_epoch": result.train_seconds / epochs,
        "train_seconds": result.train_seconds, "total_seconds": total,
        "test_mrr": get("both.realistic.inverse_harmonic_mean_rank"),
        "test_hits_at_1": get("both.realistic.hits_at_1"), "test_hits_at_3": get("both.realistic.hits_at_3"),
        "test_hits_at_10": get("both.realistic.hits_at_10"),
    }


def run_kgtrace(dataset: str, epochs: int, seed: int, threads: int) -> dict:
    import torch

    import kgtrace

    config = kgtrace.TrainConfig(
        dataset=dataset, model="conve", model_args={"embedding_dim": HYPER["embedding_dim"]}, epochs=epochs,
        batch_size=HYPER["batch_size"], lr=HYPER["lr"], label_smoothing=HYPER["label_smoothing"],
        eval_every=0, checkpoint_every=epochs, seed=seed, threads=threads, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        kgtrace.train(config, Path(tmp) / "run", progress=False, log=lambda *_: None)
        run = kgtrace.load_run(Path(tmp) / "run", "last")
        ds = run.dataset
        metrics = kgtrace.evaluate(run.model, ds.test, known=torch.cat([ds.train, ds.valid, ds.test]))
        total = time.perf_counter() - start
        records = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    m = metrics.both.realistic
    train_seconds = sum(r["seconds"] for r in records)
    return {
        "seconds_per_epoch": train_seconds / epochs, "train_seconds": train_seconds, "total_seconds": total,
        "test_mrr": m.mrr, "test_hits_at_1": m.hits_at[1], "test_hits_at_3": m.hits_at[3],
        "test_hits_at_10": m.hits_at[10],
    }


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.worker == "pykeen":
        out = run_pykeen(args.dataset, args.epochs, args.seed)
    else:
        out = run_kgtrace(args.dataset, args.epochs, args.seed, args.threads)
    out["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(out))


def cell(tool: str, dataset: str, threads: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--worker", tool, "--dataset", dataset, "--threads", str(threads),
           "--epochs", str(args.epochs), "--seed", str(args.seed)]
    env_threads = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    import os

    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env_threads})
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="umls,kinships")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", choices=("pykeen", "kgtrace"), help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.threads = int(args.threads)
        return worker(args)
    results = []
    for dataset in args.datasets.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            row = {"dataset": dataset, "threads": threads, "epochs": args.epochs, **HYPER,
                   "pykeen": cell("pykeen", dataset, threads, args), "kgtrace": cell("kgtrace", dataset, threads, args)}
            p, k = row["pykeen"], row["kgtrace"]
            if "error" not in p and "error" not in k:
                row["epoch_time_ratio_kgtrace_over_pykeen"] = k["seconds_per_epoch"] / p["seconds_per_epoch"]
                row["peak_rss_ratio_kgtrace_over_pykeen"] = k["peak_rss_mb"] / p["peak_rss_mb"]
                row["test_mrr_difference_kgtrace_minus_pykeen"] = k["test_mrr"] - p["test_mrr"]
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"benchmark": "train_vs_pykeen", "results": results}, indent=2))


if __name__ == "__main__":
    main()
