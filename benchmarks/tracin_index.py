"""The projected TracIn index against exact TracIn on bundled data; print JSON.

One run per model (trained here on --dataset for --epochs epochs, a checkpoint every
--checkpoint-every, or given with --run), the first --n-test test triples, all training
triples, all checkpoints, params "last" (and "all" with --all). For each index dimension:

* build: seconds to project every training gradient at every checkpoint, and the size on disk;
* query: seconds to answer the test triples' top-10 from the index, against exact TracIn's
  streaming ``top_k`` on the same triples (the index's reason to exist);
* error against exact influence [n_test, n_train]: relative Frobenius error
  ||approx - exact|| / ||exact||, the mean and minimum over test triples of the Pearson
  correlation of a test triple's influences, and the overlap of the top-10 proponents.

    python benchmarks/tracin_index.py [--dataset umls] [--models conve,distmult] [--dims 256,1024,4096]
        [--n-test 100] [--threads 2] [--dtype float16] [--all] [--device auto]

Training, exact TracIn and the index (build and queries) all run on --device.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import resolved

import kgtrace
from kgtrace.attribution import TracIn, build_index


def train_run(folder: Path, dataset: str, model: str, epochs: int, every: int, threads: int,
              device: torch.device) -> None:
    config = kgtrace.TrainConfig(dataset=dataset, model=model, epochs=epochs, checkpoint_every=every, eval_every=0,
                                 threads=threads, device=device.type, seed=0)
    kgtrace.train(config, folder, progress=False, log=lambda *_: None)


def errors(approx: torch.Tensor, exact: torch.Tensor, k: int = 10) -> dict:
    corr = torch.stack([torch.corrcoef(torch.stack([a, e]))[0, 1] for a, e in zip(approx, exact)])
    overlap = [len(set(torch.topk(a, k).indices.tolist()) & set(torch.topk(e, k).indices.tolist())) / k
               for a, e in zip(approx, exact)]
    return {"relative_error": float((approx - exact).norm() / exact.norm()),
            "pearson_mean": float(corr.mean()), "pearson_min": float(corr.min()),
            "top10_overlap_mean": sum(overlap) / len(overlap)}


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    value = function(*args, **kwargs)
    return value, time.perf_counter() - start


def measure(run, params: str, dims: list[int], n_test: int, dtype: str, scratch: Path, device: torch.device) -> dict:
    test = run.dataset.test[:n_test]
    exact = TracIn(run, params=params, device=device).influence(test)
    _, exact_seconds = timed(TracIn(run, params=params, device=device).top_k, test, 10)  # results come back on the CPU
    rows = []
    for dim in dims:
        folder = scratch / f"{params}-{dim}"
        index, build_seconds = timed(build_index, run, folder, params=params, dim=dim, dtype=dtype, device=device)
        _, query_seconds = timed(index.top_k, test, 10)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        rows.append({"dim": dim, "build_seconds": build_seconds, "index_mb": size / 2**20,
                     "query_top10_seconds": query_seconds, "exact_top10_seconds": exact_seconds,
                     "query_speedup_over_exact": exact_seconds / query_seconds,
                     **errors(index.influence(test), exact)})
        print(json.dumps({"params": params, **rows[-1]}), flush=True, file=sys.stderr)
    return {"params": params, "n_test": len(test), "n_train": len(run.dataset.train), "dims": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="umls")
    parser.add_argument("--models", default="conve,distmult")
    parser.add_argument("--run", help="an existing run (then --models is ignored)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--dims", default="256,1024,4096")
    parser.add_argument("--n-test", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    parser.add_argument("--all", action="store_true", help='also params="all"')
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto (CUDA when available), cpu or cuda")
    args = parser.parse_args()
    device = resolved(args.device)
    torch.set_num_threads(args.threads)
    dims = [int(x) for x in args.dims.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        runs = [Path(args.run)] if args.run else []
        for model in ([] if args.run else args.models.split(",")):
            runs.append(scratch / model)
            train_run(runs[-1], args.dataset, model, args.epochs, args.checkpoint_every, args.threads, device)
        for folder in runs:
            run = kgtrace.load_run(folder, "last", device=device)
            for params in ["last"] + (["all"] if args.all else []):
                work = scratch / f"index-{folder.name}"
                work.mkdir(exist_ok=True)
                results.append({"model": run.config.model, "checkpoints": len(run.checkpoints),
                                **measure(run, params, dims, args.n_test, args.dtype, work, device)})
    print(json.dumps({"benchmark": "tracin_index", "dataset": args.dataset, "device": device.type, "threads": args.threads,
                      "dtype": args.dtype, "torch": torch.__version__, "results": results}, indent=2))


if __name__ == "__main__":
    main()
