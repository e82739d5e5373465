"""Filtered rank evaluation, PyKEEN's RankBasedEvaluator against ours, same weights; prints JSON.

Data: by default a synthetic graph (50,000 entities, 20 relations, 500,000 training and 5,000 test
triples, ranked filtered by train+test); with --dataset NAME (a registry name such as fb15k237, or a
dataset folder) the real test split (its first --test-limit triples), every test triple on both sides,
filtered by train+valid+test; with --run DIR the dataset and model of a kgtrace run (its last
checkpoint). Without --run, each model of --models (default DistMult and ConvE) is built by kgtrace with
dimension 200 and a fixed seed. Either way the weights are copied into PyKEEN's models (kgtrace's PyKEEN
mapping), so both tools rank with identical weights on --device.

Each (tool, model) cell runs in its own process (peak RSS is that tool's alone; a cell past
--cell-timeout seconds records a timeout); the parent prints seconds, peak RSS, MRR (both sides
and each side) and the ratios. On the synthetic graph a last cell ranks --sampled-queries queries
against --corruptions sampled filtered corruptions each under a 2 GB budget and reports candidates
scored per second (left out with --dataset or --run).

    python benchmarks/eval_vs_pykeen.py [--models distmult,conve] [--threads 1] [--entities 50000] ...
    python benchmarks/eval_vs_pykeen.py --dataset fb15k237 [--run DIR] [--device auto|cpu|cuda] [--no-compile]
    python benchmarks/eval_vs_pykeen.py --dataset fb15k237 --models transe,rotate,tucker,rescal --test-limit 2000

Needs PyKEEN (`pip install -e .[pykeen]`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

MODEL_ARGS = {"embedding_dim": 200}  # of the models built here (a --run keeps its own)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic(args: argparse.Namespace):
    """Train and test triples [n, 3]; test triples are distinct from train (filtering matters)."""
    import torch

    gen = torch.Generator().manual_seed(args.seed)
    n = args.train + args.test
    triples = torch.stack([torch.randint(0, args.entities, (n,), generator=gen),
                           torch.randint(0, args.relations, (n,), generator=gen),
                           torch.randint(0, args.entities, (n,), generator=gen)], 1)  # [n, 3]
    triples = torch.unique(triples, dim=0)
    triples = triples[torch.randperm(len(triples), generator=gen)]
    return triples[args.test:], triples[: args.test]


def problem(args: argparse.Namespace) -> dict:
    """What to rank: train/valid/test id triples [n, 3], entity and relation counts, and a run's model or None."""
    if args.run:
        import kgtrace

        run = kgtrace.load_run(args.run, "last")
        ds, model, model_args = run.dataset, run.model, run.config.model_args
    elif args.dataset:
        from kgtrace.data.dataset import load_dataset

        ds, model, model_args = load_dataset(args.dataset), None, MODEL_ARGS
    else:
        train, test = synthetic(args)
        return {"train": train, "valid": train[:0], "test": test, "entities": args.entities,
                "relations": args.relations, "model": None, "model_args": MODEL_ARGS}
    test = ds.test[:args.test_limit] if args.test_limit else ds.test  # both tools rank the same first triples
    return {"train": ds.train, "valid": ds.valid, "test": test, "entities": ds.num_entities,
            "relations": ds.num_relations, "model": model, "model_args": model_args}


def build(args: argparse.Namespace, name: str, data: dict):
    import torch

    from kgtrace.interop.pykeen import layout_of
    from kgtrace.models import build_model

    if data["model"] is not None:
        return data["model"].eval()
    torch.manual_seed(args.seed)
    implied = dict(layout_of(name).implied)  # what PyKEEN's model fixes (RotatE's Euclidean norm of the moduli)
    model = build_model(name, data["entities"], data["relations"], **{**MODEL_ARGS, **implied})
    return model.eval()


def run_ours(args: argparse.Namespace, data: dict, model) -> dict:
    import torch

    from kgtrace.evaluation.evaluate import Candidates, evaluate

    model = model.to(args.device)
    start = time.perf_counter()
    metrics = evaluate(model, data["test"], known=torch.cat([data["train"], data["valid"], data["test"]]),
                       memory_budget=2 << 30, candidates=Candidates(compile=args.compile), device=args.device)
    seconds = time.perf_counter() - start
    sides = {f"mrr_{side}": m.realistic.mrr for side, m in metrics.sides.items()}
    floor = ranking_floor_seconds(len(data["test"]), data["entities"], model, torch.device(args.device))
    return {"floor_seconds": floor, "floor_fraction": floor / seconds, "seconds": seconds,
            "mrr": metrics.both.realistic.mrr, **sides, "hits_at_10": metrics.both.realistic.hits_at[10]}


def ranking_floor_seconds(n_test: int, entities: int, model, device) -> float:
    """The fewest seconds ranking both sides can take (benchmarks/common.py: floor_ms): the score products
    (2 x D FLOPs per query and entity) at the measured float32 rate, or the scores written and read thrice
    (product, comparisons) at the measured copy bandwidth."""
    from common import device_rates, floor_ms

    queries, dim = 2 * n_test, model.embedding_dim  # ComplEx: its complex dimension (half the real work)
    return floor_ms(2 * queries * dim * entities, 3 * 4 * queries * entities, device_rates(device)) / 1000


def pykeen_model(args: argparse.Namespace, data: dict, model):
    """PyKEEN's counterpart of kgtrace ``model`` (run's hyperparameters, or dim 200) holding its weights."""
    from pykeen.models import model_resolver
    from pykeen.triples import CoreTriplesFactory

    from kgtrace.core.specs import spec_named
    from kgtrace.interop.pykeen import PYKEEN_NAMES, pykeen_model_kwargs, pykeen_state_dict
    from kgtrace.interop.pykeen_export import full_args

    kwargs = pykeen_model_kwargs(args.model, full_args(args.model, data["model_args"]))
    factory = CoreTriplesFactory.create(mapped_triples=data["train"], num_entities=data["entities"],
                                        num_relations=data["relations"],
                                        create_inverse_triples=spec_named(args.model).inverse_relations)
    theirs = model_resolver.make(PYKEEN_NAMES[args.model], kwargs, triples_factory=factory, random_seed=args.seed)
    theirs.load_state_dict(pykeen_state_dict(model, theirs.state_dict()))
    return theirs.to(args.device).eval()


def run_pykeen(args: argparse.Namespace, data: dict, model) -> dict:
    from pykeen.evaluation import RankBasedEvaluator

    theirs = pykeen_model(args, data, model)
    del model
    filters = [data["train"]] + ([data["valid"]] if len(data["valid"]) else [])  # PyKEEN adds the test triples
    start = time.perf_counter()
    result = RankBasedEvaluator(filtered=True).evaluate(theirs, data["test"], additional_filter_triples=filters,
                                                         batch_size=args.pykeen_batch, use_tqdm=False,
                                                         device=theirs.device)
    get = result.get_metric
    return {"seconds": time.perf_counter() - start, "mrr": get("both.realistic.inverse_harmonic_mean_rank"),
            "mrr_head": get("head.realistic.inverse_harmonic_mean_rank"),
            "mrr_tail": get("tail.realistic.inverse_harmonic_mean_rank"),
            "hits_at_10": get("both.realistic.hits_at_10")}


def run_sampled(args: argparse.Namespace, data: dict, model) -> dict:
    import torch

    from kgtrace.evaluation.evaluate import Candidates, evaluate

    train, test = data["train"], data["test"]
    queries = torch.cat([test, train])[: args.sampled_queries]
    model = model.to(args.device)
    start = time.perf_counter()
    metrics = evaluate(model, queries, known=torch.cat([train, test]), sides=("tail",), memory_budget=2 << 30,
                       candidates=Candidates(corruptions=args.corruptions, seed=0), device=args.device)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "queries": len(queries), "corruptions": args.corruptions,
            "candidates_per_second": len(queries) * (args.corruptions + 1) / seconds,
            "mrr": metrics.both.realistic.mrr, "memory_budget": "2GB"}


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    data = problem(args)
    model = build(args, args.model, data)
    rss_before = peak_rss_mb()
    job = {"ours": run_ours, "pykeen": run_pykeen, "sampled": run_sampled}[args.worker]
    out = job(args, data, model)
    out.update(peak_rss_mb=peak_rss_mb(), rss_before_evaluation_mb=rss_before)
    if args.device == "cuda":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))


def cell(args: argparse.Namespace, tool: str, model: str) -> dict:
    flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
             ("entities", "relations", "train", "test", "seed", "threads", "pykeen_batch", "sampled_queries",
              "corruptions", "device")]
    flags += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("dataset", "run", "test_limit") if getattr(args, k)]
    cmd = [sys.executable, __file__, "--worker", tool, "--model", model, *flags]
    if not args.compile:
        cmd.append("--no-compile")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.cell_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.cell_timeout} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(row: dict) -> None:
    """Add the speed-up, the peak RSS ratio and the MRR differences when both cells succeeded."""
    ours, theirs = row["kgtrace"], row["pykeen"]
    if "error" not in ours and "error" not in theirs:
        row["speedup_pykeen_seconds_over_kgtrace"] = theirs["seconds"] / ours["seconds"]
        row["peak_rss_ratio_kgtrace_over_pykeen"] = ours["peak_rss_mb"] / theirs["peak_rss_mb"]
        row["mrr_difference"] = ours["mrr"] - theirs["mrr"]
        for side in ("head", "tail"):
            row[f"mrr_{side}_difference"] = ours[f"mrr_{side}"] - theirs[f"mrr_{side}"]


def setup(args: argparse.Namespace) -> dict:
    """The report's header: what was ranked, on which device and threads."""
    head = {"benchmark": "eval_vs_pykeen", "device": args.device, "threads": args.threads, "compiled": args.compile}
    if not (args.dataset or args.run):
        return {**head, "entities": args.entities, "relations": args.relations, "train": args.train,
                "test": args.test, "filter": "train+test"}
    data = problem(args)
    return {**head, "dataset": args.dataset or run_config(args).dataset, "run": args.run, "test_limit": args.test_limit,
            "entities": data["entities"],
            "relations": data["relations"], "train": len(data["train"]), "valid": len(data["valid"]),
            "test": len(data["test"]), "filter": "train+valid+test"}


def run_config(args: argparse.Namespace):
    """The TrainConfig of the run given with --run (its model and dataset names)."""
    from kgtrace.runs.embedding import read_run_config

    return read_run_config(Path(args.run))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="distmult,conve")
    parser.add_argument("--dataset", help="rank this dataset's test split (registry name or folder)")
    parser.add_argument("--run", help="rank with this kgtrace run's dataset and model (last checkpoint)")
    parser.add_argument("--test-limit", type=int, default=0,
                        help="with --dataset or --run: rank only the first N test triples (0: all), e.g. for the "
                             "distance models, whose every score is elementwise work")
    parser.add_argument("--entities", type=int, default=50_000)
    parser.add_argument("--relations", type=int, default=20)
    parser.add_argument("--train", type=int, default=500_000)
    parser.add_argument("--test", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--pykeen-batch", type=int, default=256)
    parser.add_argument("--sampled-queries", type=int, default=10_000)
    parser.add_argument("--corruptions", type=int, default=80_000)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--skip-pykeen", action="store_true")
    parser.add_argument("--cell-timeout", type=int, default=None, help="seconds before a cell is abandoned")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    from kgtrace.compute.system import resolve_device

    args.device = resolve_device(args.device).type
    report = {**setup(args), "results": []}
    models = [run_config(args).model] if args.run else args.models.split(",")
    for model in models:
        row = {"model": model, "kgtrace": cell(args, "ours", model)}
        if not args.skip_pykeen:
            row["pykeen"] = cell(args, "pykeen", model)
            compare(row)
        report["results"].append(row)
        print(json.dumps(row), file=sys.stderr)
    if not (args.dataset or args.run):
        # 80,000 corruptions need more than 80,000 entities to sample from.
        sampled_args = argparse.Namespace(**{**vars(args), "entities": max(args.entities, 2 * args.corruptions)})
        report["sampled"] = {"entities": sampled_args.entities, **cell(sampled_args, "sampled", "distmult")}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
