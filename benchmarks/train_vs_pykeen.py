"""Train PyKEEN's model and ours on the same data with the same hyperparameters; print JSON.

Both tools train each model of --models (default ConvE) for --epochs epochs on --device, then rank the
test split filtered by train+valid+test (realistic ties). The settings per model are in ``SETTINGS``:

* ConvE (dim 200, 10x20, 32 3x3 filters), DistMult and ComplEx (dim 200), TuckER (200 x 200, the
  authors' dropouts) and RESCAL (dim 128): KvsAll/LCWA over reciprocal queries, BCE with label
  smoothing 0.1, Adam 1e-3, batch 128.
* TransE (L1) and RotatE (dim 200; the Euclidean norm of the moduli, as PyKEEN's): negative sampling,
  PyKEEN's sLCWA, with the self-adversarial loss of Sun et al. 2019 (PyKEEN's NSSALoss, margin 9,
  temperature 1), 64 uniform negatives per positive, Adam 1e-3. PyKEEN trains every triple and its
  inverse as a positive (batch 1,024 of them), each with 64 negatives corrupting its head or tail;
  kgtrace trains every triple's tail query and its inverse's with 64 negatives each (batch 512
  triples): the same positives, negatives and scores per epoch and per step. kgtrace's loss sums the
  two sides, PyKEEN's averages them (the losses are a factor 2 apart).

PyKEEN's model, its keyword arguments and inverse triples follow from kgtrace's model arguments
through kgtrace's PyKEEN mapping (each model's ``ModelSpec.pykeen``). The data comes from kgtrace's dataset
registry (bundled: umls, kinships, nations; fetched into the cache: fb15k237, wn18rr; or a dataset
folder), and PyKEEN gets the very same id triples and label-to-id maps (``TriplesFactory`` built from
kgtrace's ids), so both train on identical triples with identical ids; valid/test triples whose
entity never occurs in train are left out on both sides (kgtrace warns, as PyKEEN does).

Each (tool, model, dataset, threads) cell runs in its own process, so peak RSS is that tool's alone. Per
tool: the seconds of every epoch (PyKEEN's from a training callback: first batch to end of epoch 1,
then end to end; kgtrace's from its metrics.jsonl, printed before the test ranking), their mean
(``seconds_per_epoch``), the loss of every epoch (KvsAll: mean BCE over batch x entities in both), test
metrics, and peak RSS after training (``peak_rss_training_mb``) and at the end (``peak_rss_mb``, with the
test ranking). The parent prints one JSON document with the ratios (kgtrace / PyKEEN); a cell that fails or runs past
--cell-timeout seconds records its error and the epochs it completed (training's ratios are given
when both tools finished training); PyKEEN's cell prints progress every few batches, so one that
runs out of time inside its first epoch records the batches it completed and the seconds per epoch
they extrapolate to (``extrapolated_seconds_per_epoch``, the ratio marked ``_extrapolated``).

    python benchmarks/train_vs_pykeen.py [--models conve,transe] [--datasets umls,kinships] [--threads 1,2]
        [--epochs 100] [--device auto|cpu|cuda] [--cell-timeout SECONDS]
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

LCWA = {"training": "kvsall", "batch_size": 128, "lr": 1e-3, "label_smoothing": 0.1}
SLCWA = {"training": "negative-sampling", "batch_size": 512, "lr": 1e-3, "label_smoothing": 0.0,
         "negatives_tail": 64, "negatives_head": 64, "adversarial_temperature": 1.0}
#: kgtrace TrainConfig settings per model; PyKEEN's follow from them (`pykeen_settings`).
SETTINGS = {
    "conve": {**LCWA, "model_args": {"embedding_dim": 200}},
    "distmult": {**LCWA, "model_args": {"embedding_dim": 200, "inverse_relations": True}},
    "complex": {**LCWA, "model_args": {"embedding_dim": 200, "inverse_relations": True}},
    "tucker": {**LCWA, "model_args": {"embedding_dim": 200, "relation_dim": 200}},
    "rescal": {**LCWA, "model_args": {"embedding_dim": 128, "inverse_relations": True}},
    "transe": {**SLCWA, "model_args": {"embedding_dim": 200, "scoring_norm": 1, "margin": 9.0,
                                       "inverse_relations": True}},
    "rotate": {**SLCWA, "model_args": {"embedding_dim": 200, "margin": 9.0, "scoring_norm": 2, "inverse_relations": True}},
}
#: PyKEEN model keyword arguments beyond the mapped ones, to train the same model: PyKEEN's TransE normalises
#: every entity row after each step by default, kgtrace's (as the paper's loss here) does not.
PYKEEN_EXTRA = {"transe": {"entity_constrainer": None}}
PROGRESS_EVERY = 10  # PyKEEN batches between progress lines


def pykeen_settings(model: str) -> dict:
    """PyKEEN pipeline keyword arguments training the same model as kgtrace's ``SETTINGS[model]``."""
    from kgtrace.interop.pykeen import PYKEEN_NAMES, pykeen_model_kwargs
    from kgtrace.interop.pykeen_export import full_args

    ours = SETTINGS[model]
    args = full_args(model, ours["model_args"])
    common = {"model": PYKEEN_NAMES[model], "model_kwargs": {**pykeen_model_kwargs(model, args), **PYKEEN_EXTRA.get(model, {})},
              "optimizer": "Adam", "optimizer_kwargs": {"lr": ours["lr"]}}
    if ours["training"] == "kvsall":
        return {**common, "loss": "BCEWithLogits", "training_loop": "LCWA",
                "training_kwargs": {"batch_size": ours["batch_size"], "label_smoothing": ours["label_smoothing"]}}
    return {**common, "loss": "NSSA",
            "loss_kwargs": {"margin": args["margin"], "adversarial_temperature": ours["adversarial_temperature"]},
            "training_loop": "sLCWA", "negative_sampler": "basic",
            "negative_sampler_kwargs": {"num_negs_per_pos": ours["negatives_tail"]},
            "training_kwargs": {"batch_size": 2 * ours["batch_size"]}}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def load(dataset: str):
    """The kgtrace Dataset of a registry name or folder (both tools train on its id triples)."""
    from kgtrace.data.dataset import load_dataset

    return load_dataset(dataset)


def pykeen_factories(ds, model: str) -> tuple:
    """PyKEEN TriplesFactories of train, valid and test: kgtrace's id triples and label maps, with inverses
    where kgtrace's model has inverse relations."""
    from pykeen.triples import TriplesFactory

    from kgtrace.interop.pykeen import has_inverse_relations

    inverse = has_inverse_relations(model, SETTINGS[model]["model_args"])
    maps = {"entity_to_id": dict(ds.entities.to_id), "relation_to_id": dict(ds.relations.to_id)}
    return tuple(TriplesFactory(mapped_triples=split, create_inverse_triples=inverse, **maps)
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


def batches_per_epoch(ds, model: str) -> int:
    """PyKEEN's batches per epoch: LCWA's distinct (head, relation) queries with inverses over the batch size,
    the last incomplete batch dropped; sLCWA's triples and their inverses over its batch size, the last kept."""
    import torch

    train, settings = ds.train, pykeen_settings(model)
    batch = settings["training_kwargs"]["batch_size"]
    if settings["training_loop"] == "sLCWA":
        return -(-2 * len(train) // batch)
    inverse = torch.stack([train[:, 2], train[:, 1] + ds.num_relations], 1)
    queries = len(torch.unique(torch.cat([train[:, :2], inverse]), dim=0))
    return queries // batch


def run_pykeen(dataset: str, model: str, epochs: int, seed: int, device: str) -> dict:
    from pykeen.pipeline import pipeline

    ds = load(dataset)
    print(json.dumps({"batches_per_epoch": batches_per_epoch(ds, model)}), flush=True)
    train, valid, test = pykeen_factories(ds, model)
    timer = epoch_timer()
    settings = pykeen_settings(model)
    training_kwargs = {**settings.pop("training_kwargs"), "num_epochs": epochs, "use_tqdm": False, "callbacks": timer}
    start = time.perf_counter()
    result = pipeline(
        training=train, validation=valid, testing=test, **settings, training_kwargs=training_kwargs,
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


def run_kgtrace(dataset: str, model: str, epochs: int, seed: int, threads: int, device: str) -> dict:
    import kgtrace

    config = kgtrace.TrainConfig(dataset=dataset, model=model, optimizer="adam", epochs=epochs, eval_every=0,
                                 checkpoint_every=epochs, seed=seed, threads=threads, device=device, **SETTINGS[model])
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        kgtrace.train(config, Path(tmp) / "run", progress=False, log=lambda *_: None)
        training_rss = peak_rss_mb()
        records = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
        for record in records:  # printed now, kept by the parent if the ranking times out
            print(json.dumps({"epoch": record["epoch"], "seconds": record["seconds"], "loss": record["loss"],
                              "peak_rss_mb": training_rss}), flush=True)
        run = kgtrace.load_run(Path(tmp) / "run", "last", device=device)
        ds = run.dataset
        metrics = kgtrace.evaluate(run.model, ds.test, known=ds.all_triples())
        total = time.perf_counter() - start
    m = metrics.both.realistic
    seconds = [r["seconds"] for r in records]
    floor = {}
    if model == "conve":  # the arithmetic floor is worked out for ConvE's step
        floor = epoch_floor(run.model, ds, next(run.model.parameters()).device, steps=records[0]["step"])
        floor["floor_fraction"] = floor["epoch_floor_seconds"] / min(seconds)
    return {
        **floor,
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
    settings = SETTINGS["conve"]
    cost = conve_step_cost(settings["batch_size"], ds.num_entities, settings["model_args"]["embedding_dim"], params)
    return {"epoch_floor_seconds": steps * floor_ms(*cost, device_rates(device)) / 1000}


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.worker == "pykeen":
        out = run_pykeen(args.dataset, args.model, args.epochs, args.seed, args.device)
    else:
        out = run_kgtrace(args.dataset, args.model, args.epochs, args.seed, args.threads, args.device)
    out["peak_rss_mb"] = peak_rss_mb()
    if args.device == "cuda":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))


def cell(tool: str, model: str, dataset: str, threads: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--worker", tool, "--model", model, "--dataset", dataset, "--threads", str(threads),
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
    parser.add_argument("--models", default="conve", help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--datasets", default="umls,kinships",
                        help="comma-separated registry names (kgtrace datasets lists them) or dataset folders")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--cell-timeout", type=int, default=None, help="seconds before a cell is abandoned")
    parser.add_argument("--worker", choices=("pykeen", "kgtrace"), help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = sorted(set(args.models.split(",")) - set(SETTINGS))
    if unknown:
        parser.error(f"--models: no settings for {', '.join(unknown)}; choose from {', '.join(SETTINGS)}")
    if args.worker:
        args.threads = int(args.threads)
        return worker(args)
    from kgtrace.compute.system import resolve_device

    args.device = resolve_device(args.device).type
    results = []
    for dataset in args.datasets.split(","):
        sizes = dataset_sizes(dataset)
        for model in args.models.split(","):
            for threads in (int(t) for t in args.threads.split(",")):
                row = {"dataset": dataset, **sizes, "model": model, "threads": threads, "device": args.device,
                       "epochs": args.epochs, "settings": SETTINGS[model], "pykeen_settings": pykeen_settings(model),
                       "pykeen": cell("pykeen", model, dataset, threads, args),
                       "kgtrace": cell("kgtrace", model, dataset, threads, args)}
                compare(row)
                results.append(row)
                print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"benchmark": "train_vs_pykeen", "results": results}, indent=2))


if __name__ == "__main__":
    main()
