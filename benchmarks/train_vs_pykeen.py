"""Train PyKEEN's ConvE and ours on the same data with the same hyperparameters; print JSON.

Both tools train ConvE (dim 200, 10x20, 32 3x3 filters) with KvsAll/LCWA over reciprocal queries,
BCE with label smoothing 0.1, Adam 1e-3, batch 128, for --epochs epochs on --device, then rank the
test split filtered by train+valid+test (realistic ties). The data comes from kgtrace's dataset
registry (bundled: umls, kinships, nations; fetched into the cache: fb15k237, wn18rr; or a dataset
folder), and PyKEEN gets the very same id triples and label-to-id maps (``TriplesFactory`` built from
kgtrace's ids), so both train on identical triples with identical ids; valid/test triples whose
entity never occurs in train are left out on both sides (kgtrace warns, as PyKEEN does).

Each (tool, dataset, threads) cell runs in its own process, so peak RSS is that tool's alone. Per
tool: the seconds of every epoch (PyKEEN's from a training callback: first batch to end of epoch 1,
then end to end; kgtrace's from its metrics.jsonl), their mean (``seconds_per_epoch``), the loss of
every epoch (mean BCE over batch x entities in both), test metrics, and peak RSS after training
(``peak_rss_training_mb``) and at the end (``peak_rss_mb``, with the test ranking). The parent
prints one JSON document with the ratios (kgtrace / PyKEEN); a cell that fails or runs past
--cell-timeout seconds records its error and the epochs it completed (training's ratios are given
when both tools finished training); PyKEEN's cell prints progress every few batches, so one that
runs out of time inside its first epoch records the batches it completed and the seconds per epoch
they extrapolate to (``extrapolated_seconds_per_epoch``, the ratio marked ``_extrapolated``).

    python benchmarks/train_vs_pykeen.py [--datasets umls,kinships] [--threads 1,2] [--epochs 100]
        [--device auto|cpu|cuda] [--cell-timeout SECONDS]
    python benchmarks/train_vs_pykeen.py --datasets fb15k237 --threads 1 --epochs 2

Needs PyKEEN (`pip install pykeen==1.11.1` beside kgtrace).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HYPER = {"embedding_dim": 200, "batch_size": 128, "lr": 1e-3, "label_smoothing": 0.1}
PROGRESS_EVERY = 10  # PyKEEN batches between progress lines


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def load(dataset: str):
    """The kgtrace Dataset of a registry name or folder (both tools train on its id triples)."""
    from kgtrace.data.dataset import load_dataset

    return load_dataset(dataset)


def pykeen_factories(ds) -> tuple:
    """PyKEEN TriplesFactories of train, valid and test: kgtrace's id triples and label maps, with inverses."""
    from pykeen.triples import TriplesFactory

    maps = {"entity_to_id": dict(ds.entities.to_id), "relation_to_id": dict(ds.relations.to_id)}
    return tuple(TriplesFactory(mapped_triples=split, create_inverse_triples=True, **maps)
                 for split in (ds.train, ds.valid, ds.test))


def epoch_timer():
    """A PyKEEN training callback timing each epoch (first batch to end, then end to end) and printing progress."""
    from pykeen.training.callbacks import TrainingCallback

    class EpochTimer(TrainingCallback):
        def __init__(self):
            super().__init__()
            self.start = self.mark = None
            self.seconds: list[float] = []
            self.batches, self.loss_sum = 0, 0.0
            self.peak_rss_mb = 0.0  # after the last epoch: training's peak, before the evaluation

        def pre_batch(self, **kwargs) -> None:
            if self.mark is None:
                self.start = self.mark = time.perf_counter()

        def on_batch(self, epoch: int, batch, batch_loss: float, **kwargs) -> None:
            self.batches += 1
            self.loss_sum += float(batch_loss)
            if self.batches % PROGRESS_EVERY == 0:  # what the parent keeps if an epoch outlasts the cell
                print(json.dumps({"batches": self.batches, "seconds": time.perf_counter() - self.start,
                                  "mean_batch_loss": self.loss_sum / self.batches,
                                  "peak_rss_mb": peak_rss_mb()}), flush=True)

        def post_epoch(self, epoch: int, epoch_loss: float, **kwargs) -> None:
            now = time.perf_counter()
            self.seconds.append(now - self.mark)
            self.mark = now
            self.peak_rss_mb = peak_rss_mb()
            print(json.dumps({"epoch": epoch, "seconds": self.seconds[-1], "loss": epoch_loss,
                              "peak_rss_mb": self.peak_rss_mb}), flush=True)

    return EpochTimer()


def batches_per_epoch(ds) -> int:
    """PyKEEN's LCWA batches per epoch: distinct (head, relation) queries with inverses over the batch size,
    the last incomplete batch dropped."""
    import torch

    train = ds.train
    inverse = torch.stack([train[:, 2], train[:, 1] + ds.num_relations], 1)
    queries = len(torch.unique(torch.cat([train[:, :2], inverse]), dim=0))
    return queries // HYPER["batch_size"]


def run_pykeen(dataset: str, epochs: int, seed: int, device: str) -> dict:
    from pykeen.pipeline import pipeline

    ds = load(dataset)
    print(json.dumps({"batches_per_epoch": batches_per_epoch(ds)}), flush=True)
    train, valid, test = pykeen_factories(ds)
    timer = epoch_timer()
    start = time.perf_counter()
    result = pipeline(
        training=train, validation=valid, testing=test, model="ConvE",
        model_kwargs={"embedding_dim": HYPER["embedding_dim"]},
        loss="BCEWithLogits", training_loop="LCWA", optimizer="Adam", optimizer_kwargs={"lr": HYPER["lr"]},
        training_kwargs={"num_epochs": epochs, "batch_size": HYPER["batch_size"],
                         "label_smoothing": HYPER["label_smoothing"], "use_tqdm": False, "callbacks": timer},
        evaluator="RankBasedEvaluator", evaluator_kwargs={"filtered": True},
        evaluation_kwargs={"use_tqdm": False}, random_seed=seed, device=device,
    )
    total = time.perf_counter() - start
    get = result.metric_results.get_metric
    return {
        "seconds_per_epoch": sum(timer.seconds) / epochs, "epoch_seconds": timer.seconds,
        "train_seconds": result.train_seconds, "total_seconds": total,
        "losses": list(result.losses), "final_loss": result.losses[-1], "peak_rss_training_mb": timer.peak_rss_mb,
        "test_mrr": get("both.realistic.inverse_harmonic_mean_rank"),
        "test_hits_at_1": get("both.realistic.hits_at_1"), "test_hits_at_3": get("both.realistic.hits_at_3"),
        "test_hits_at_10": get("both.realistic.hits_at_10"),
        "test_mrr_head": get("head.realistic.inverse_harmonic_mean_rank"),
        "test_mrr_tail": get("tail.realistic.inverse_harmonic_mean_rank"),
    }


def run_kgtrace(dataset: str, epochs: int, seed: int, threads: int, device: str) -> dict:
    import kgtrace

    config = kgtrace.TrainConfig(
        dataset=dataset, model="conve", model_args={"embedding_dim": HYPER["embedding_dim"]}, epochs=epochs,
        batch_size=HYPER["batch_size"], lr=HYPER["lr"], label_smoothing=HYPER["label_smoothing"],
        eval_every=0, checkpoint_every=epochs, seed=seed, threads=threads, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        kgtrace.train(config, Path(tmp) / "run", progress=False, log=lambda *_: None)
        training_rss = peak_rss_mb()
        run = kgtrace.load_run(Path(tmp) / "run", "last", device=device)
        ds = run.dataset
        metrics = kgtrace.evaluate(run.model, ds.test, known=ds.all_triples())
        total = time.perf_counter() - start
        records = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    m = metrics.both.realistic
    seconds = [r["seconds"] for r in records]
    floor = epoch_floor(run.model, ds, next(run.model.parameters()).device, steps=records[0]["step"])
    return {
        **floor, "floor_fraction": floor["epoch_floor_seconds"] / min(seconds),
        "seconds_per_epoch": sum(seconds) / epochs, "epoch_seconds": seconds, "train_seconds": sum(seconds),
        "total_seconds": total, "losses": [r["loss"] for r in records], "final_loss": records[-1]["loss"],
        "peak_rss_training_mb": training_rss,
        "test_mrr": m.mrr, "test_hits_at_1": m.hits_at[1], "test_hits_at_3": m.hits_at[3],
        "test_hits_at_10": m.hits_at[10],
        "test_mrr_head": metrics.sides["head"].realistic.mrr, "test_mrr_tail": metrics.sides["tail"].realistic.mrr,
    }


def epoch_floor(model, ds, device, steps: int) -> dict:
    """The fewest seconds an epoch can take on ``device`` (benchmarks/common.py: floor_ms): its steps' FLOPs at
    the measured float32 product rate, or their bytes at the measured copy bandwidth. steps: an epoch's
    optimizer steps, as the run's first metrics record counts them."""
    from common import conve_step_cost, device_rates, floor_ms

    params = sum(p.numel() for p in model.parameters())
    cost = conve_step_cost(HYPER["batch_size"], ds.num_entities, HYPER["embedding_dim"], params)
    return {"epoch_floor_seconds": steps * floor_ms(*cost, device_rates(device)) / 1000}


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.worker == "pykeen":
        out = run_pykeen(args.dataset, args.epochs, args.seed, args.device)
    else:
        out = run_kgtrace(args.dataset, args.epochs, args.seed, args.threads, args.device)
    out["peak_rss_mb"] = peak_rss_mb()
    if args.device == "cuda":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))


def cell(tool: str, dataset: str, threads: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--worker", tool, "--dataset", dataset, "--threads", str(threads),
           "--epochs", str(args.epochs), "--seed", str(args.seed), "--device", args.device]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.cell_timeout)
    except subprocess.TimeoutExpired as e:
        return {"error": f"timed out after {args.cell_timeout} s", **epochs_done(e.stdout, args.epochs)}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed",
                **epochs_done(done.stdout, args.epochs)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def epochs_done(stdout: str | bytes | None, epochs: int) -> dict:
    """What the progress lines of a cell that did not finish say: the epochs it completed and their mean
    seconds; if not even one, the batches it completed and the seconds per epoch they extrapolate to."""
    text = stdout.decode() if isinstance(stdout, bytes) else stdout or ""
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    done = [d for d in lines if "epoch" in d]
    if done:
        seconds = [d["seconds"] for d in done]
        out = {"epochs_completed": len(done), "epoch_seconds": seconds, "losses": [d["loss"] for d in done],
               "peak_rss_training_mb": done[-1]["peak_rss_mb"]}
        if len(done) == epochs:  # training finished; the evaluation did not
            out.update(seconds_per_epoch=sum(seconds) / epochs, final_loss=done[-1]["loss"])
        return out
    per_epoch = next((d["batches_per_epoch"] for d in lines if "batches_per_epoch" in d), None)
    partial = [d for d in lines if "batches" in d]
    if not partial or per_epoch is None:
        return {"epochs_completed": 0}
    last = partial[-1]
    return {"epochs_completed": 0, "batches_completed": last["batches"], "batches_per_epoch": per_epoch,
            "seconds_for_those_batches": last["seconds"], "mean_batch_loss": last["mean_batch_loss"],
            "extrapolated_seconds_per_epoch": last["seconds"] / last["batches"] * per_epoch,
            "peak_rss_at_timeout_mb": last["peak_rss_mb"]}


def dataset_sizes(dataset: str) -> dict:
    ds = load(dataset)
    return {"entities": ds.num_entities, "relations": ds.num_relations, "train": len(ds.train),
            "valid": len(ds.valid), "test": len(ds.test)}


def compare(row: dict) -> None:
    """Add the kgtrace / PyKEEN ratios to ``row``: training's when both trained, the rest when both finished."""
    p, k = row["pykeen"], row["kgtrace"]
    if "seconds_per_epoch" in p and "seconds_per_epoch" in k:  # training done (PyKEEN's evaluation may not be)
        row["epoch_time_ratio_kgtrace_over_pykeen"] = k["seconds_per_epoch"] / p["seconds_per_epoch"]
        row["peak_rss_training_ratio_kgtrace_over_pykeen"] = k["peak_rss_training_mb"] / p["peak_rss_training_mb"]
    elif "extrapolated_seconds_per_epoch" in p and "seconds_per_epoch" in k:  # PyKEEN ran out of time in epoch 1
        row["epoch_time_ratio_kgtrace_over_pykeen_extrapolated"] = (k["seconds_per_epoch"]
                                                                    / p["extrapolated_seconds_per_epoch"])
    if "error" not in p and "error" not in k:
        row["peak_rss_ratio_kgtrace_over_pykeen"] = k["peak_rss_mb"] / p["peak_rss_mb"]
        row["test_mrr_difference_kgtrace_minus_pykeen"] = k["test_mrr"] - p["test_mrr"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="umls,kinships",
                        help="comma-separated registry names (kgtrace datasets lists them) or dataset folders")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--cell-timeout", type=int, default=None, help="seconds before a cell is abandoned")
    parser.add_argument("--worker", choices=("pykeen", "kgtrace"), help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.threads = int(args.threads)
        return worker(args)
    from kgtrace.compute.system import resolve_device

    args.device = resolve_device(args.device).type
    results = []
    for dataset in args.datasets.split(","):
        sizes = dataset_sizes(dataset)
        for threads in (int(t) for t in args.threads.split(",")):
            row = {"dataset": dataset, **sizes, "threads": threads, "device": args.device, "epochs": args.epochs,
                   **HYPER, "pykeen": cell("pykeen", dataset, threads, args),
                   "kgtrace": cell("kgtrace", dataset, threads, args)}
            compare(row)
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"benchmark": "train_vs_pykeen", "results": results}, indent=2))


if __name__ == "__main__":
    main()
