"""Filtered rank evaluation, PyKEEN's RankBasedEvaluator against ours, same weights; prints JSON.

A synthetic graph (default 50,000 entities, 20 relations, 500,000 training and 5,000 test
triples); DistMult-200 and ConvE-200 built by kgtrace with a fixed seed and copied into PyKEEN's
models, so both tools rank with identical weights. Each (tool, model) cell runs in its own process
(peak RSS is that tool's alone); the parent prints seconds, peak RSS, MRR and the ratios. A last
cell ranks --sampled-queries queries against --corruptions sampled filtered corruptions each under
a 2 GB budget and reports candidates scored per second.

    python benchmarks/eval_vs_pykeen.py [--models distmult,conve] [--threads 1] [--entities 50000] ...

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


def build(args: argparse.Namespace, name: str):
    import torch

    from kgtrace.models import build_model

    torch.manual_seed(args.seed)
    model = build_model(name, args.entities, args.relations, embedding_dim=200)
    return model.eval()


def run_ours(args: argparse.Namespace, train, test, model) -> dict:
    import torch

    from kgtrace.evaluation.evaluate import Candidates, evaluate

    start = time.perf_counter()
    metrics = evaluate(model, test, known=torch.cat([train, test]), memory_budget=2 << 30,
                       candidates=Candidates(compile=args.compile))
    return {"seconds": time.perf_counter() - start, "mrr": metrics.both.realistic.mrr,
            "hits_at_10": metrics.both.realistic.hits_at[10]}


def run_pykeen(args: argparse.Namespace, train, test, model) -> dict:
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.models import ConvE, DistMult
    from pykeen.triples import CoreTriplesFactory

    from kgtrace.interop.pykeen import pykeen_state_dict

    conve = args.model == "conve"
    factory = CoreTriplesFactory.create(mapped_triples=train, num_entities=args.entities,
                                        num_relations=args.relations, create_inverse_triples=conve)
    theirs = (ConvE if conve else DistMult)(triples_factory=factory, embedding_dim=200, random_seed=args.seed)
    theirs.load_state_dict(pykeen_state_dict(model, theirs.state_dict()))
    del model
    start = time.perf_counter()
    result = RankBasedEvaluator(filtered=True).evaluate(theirs.eval(), test, additional_filter_triples=[train],
                                                         batch_size=args.pykeen_batch, use_tqdm=False)
    return {"seconds": time.perf_counter() - start, "mrr": result.get_metric("both.realistic.inverse_harmonic_mean_rank"),
            "hits_at_10": result.get_metric("both.realistic.hits_at_10")}


def run_sampled(args: argparse.Namespace, train, test, model) -> dict:
    import torch

    from kgtrace.evaluation.evaluate import Candidates, evaluate

    queries = torch.cat([test, train])[: args.sampled_queries]
    start = time.perf_counter()
    metrics = evaluate(model, queries, known=torch.cat([train, test]), sides=("tail",), memory_budget=2 << 30,
                       candidates=Candidates(corruptions=args.corruptions, seed=0))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "queries": len(queries), "corruptions": args.corruptions,
            "candidates_per_second": len(queries) * (args.corruptions + 1) / seconds,
            "mrr": metrics.both.realistic.mrr, "memory_budget": "2GB"}


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    train, test = synthetic(args)
    model = build(args, args.model)
    rss_before = peak_rss_mb()
    job = {"ours": run_ours, "pykeen": run_pykeen, "sampled": run_sampled}[args.worker]
    out = job(args, train, test, model)
    out.update(peak_rss_mb=peak_rss_mb(), rss_before_evaluation_mb=rss_before)
    print(json.dumps(out))


def cell(args: argparse.Namespace, tool: str, model: str) -> dict:
    flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
             ("entities", "relations", "train", "test", "seed", "threads", "pykeen_batch", "sampled_queries",
              "corruptions")]
    cmd = [sys.executable, __file__, "--worker", tool, "--model", model, *flags]
    if not args.compile:
        cmd.append("--no-compile")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="distmult,conve")
    parser.add_argument("--entities", type=int, default=50_000)
    parser.add_argument("--relations", type=int, default=20)
    parser.add_argument("--train", type=int, default=500_000)
    parser.add_argument("--test", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pykeen-batch", type=int, default=256)
    parser.add_argument("--sampled-queries", type=int, default=10_000)
    parser.add_argument("--corruptions", type=int, default=80_000)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--skip-pykeen", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    report = {"benchmark": "eval_vs_pykeen", "entities": args.entities, "relations": args.relations,
              "train": args.train, "test": args.test, "threads": args.threads, "compiled": args.compile,
              "results": []}
    for model in args.models.split(","):
        row = {"model": model, "kgtrace": cell(args, "ours", model)}
        if not args.skip_pykeen:
            row["pykeen"] = cell(args, "pykeen", model)
            ours, theirs = row["kgtrace"], row["pykeen"]
            if "error" not in ours and "error" not in theirs:
                row["speedup_pykeen_seconds_over_kgtrace"] = theirs["seconds"] / ours["seconds"]
                row["peak_rss_ratio_kgtrace_over_pykeen"] = ours["peak_rss_mb"] / theirs["peak_rss_mb"]
                row["mrr_difference"] = ours["mrr"] - theirs["mrr"]
        report["results"].append(row)
        print(json.dumps(row), file=sys.stderr)
    # 80,000 corruptions need more than 80,000 entities to sample from.
    sampled_args = argparse.Namespace(**{**vars(args), "entities": max(args.entities, 2 * args.corruptions)})
    report["sampled"] = {"entities": sampled_args.entities, **cell(sampled_args, "sampled", "distmult")}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
