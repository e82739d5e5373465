"""Eager against torch.compile, side by side in one process: evaluation and the training step; prints JSON.

ConvE (kgtrace defaults: 200 dimensions, 32 channels) on UMLS, on --device:

* evaluation: filtered all-entity ranking of the test split, both sides (``evaluate`` with
  ``Candidates(compile=...)``), the model in eval mode;
* training step: zero_grad, the KvsAll loss of a batch of --batch-size queries, backward and
  a fused Adam step, as ``kgtrace train`` runs it (``--compile`` or not), on two copies of one
  model, full batches only.

The compiled side's first call (compilation, through Inductor's cache when it holds the graph:
run with TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 for a cold compile) is reported apart as
warm-up seconds, and its counters (kgtrace.compute.compile.compile_log) with it. Then eager and compiled
alternate for --repeats rounds; each round times --evals evaluations or --steps steps; the
medians and their ratio (eager / compiled: above 1 means compiled is faster) are printed.

    python benchmarks/compile_speedup.py [--threads 2] [--repeats 5] [--steps 50] [--evals 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def evaluation(args: argparse.Namespace, dataset, model, device: torch.device) -> dict:
    from kgtrace.compute.compile import compile_log
    from kgtrace.data.answers import AnswerIndex
    from kgtrace.evaluation.evaluate import Candidates, evaluate

    model = copy.deepcopy(model).to(device).eval()
    known = AnswerIndex.build(dataset.known_triples("test"), dataset.num_relations)

    def run(compiled: bool):
        return lambda: evaluate(model, dataset.test, known=known, candidates=Candidates(compile=compiled),
                                device=device)

    eager_metrics, compiled_metrics = run(False)(), None
    with compile_log() as log:
        warmup = timed(run(True), device)
    compiled_metrics = evaluate(model, dataset.test, known=known, candidates=Candidates(compile=True), device=device)
    times = {False: [], True: []}
    for _ in range(args.repeats):
        for compiled in (False, True):
            times[compiled].append(sum(timed(run(compiled), device) for _ in range(args.evals)) / args.evals)
    queries = 2 * len(dataset.test)
    return _summary(times, warmup, log, queries, "queries", same_mrr=eager_metrics.both.realistic.mrr
                    == compiled_metrics.both.realistic.mrr)


def train_step(args: argparse.Namespace, dataset, model, device: torch.device) -> dict:
    from kgtrace.compute.compile import compile_log
    from kgtrace.core.config import TrainConfig
    from kgtrace.training.batches import Batches
    from kgtrace.training.step import batch_loss

    batches = Batches.build(dataset.train, dataset.num_relations, "kvsall")
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(batches), generator=gen)
    positions = [order[i:i + args.batch_size] for i in range(0, len(batches) - args.batch_size + 1, args.batch_size)]
    sides = {}
    for compiled in (False, True):
        twin = copy.deepcopy(model).to(device).train()
        config = TrainConfig(batch_size=args.batch_size, compile=compiled, device=device.type)
        optimizer = torch.optim.Adam(twin.parameters(), lr=1e-3, fused=True)
        sides[compiled] = (twin, config, optimizer)
    step_count = [0]

    def steps(compiled: bool, count: int):
        twin, config, optimizer = sides[compiled]

        def run():
            for _ in range(count):
                pos = positions[step_count[0] % len(positions)]
                step_count[0] += 1
                optimizer.zero_grad(set_to_none=True)
                loss = batch_loss(twin, batches, pos, config, device)
                loss.backward()
                optimizer.step()
        return run

    steps(False, 1)()  # eager warm-up: allocator, first-touch
    with compile_log() as log:
        warmup = timed(steps(True, 1), device)
    times = {False: [], True: []}
    for _ in range(args.repeats):
        for compiled in (False, True):
            times[compiled].append(timed(steps(compiled, args.steps), device) / args.steps)
    return _summary(times, warmup, log, args.batch_size, "queries")


def _summary(times: dict, warmup: float, log, per_call: int, unit: str, **extra) -> dict:
    eager, compiled = statistics.median(times[False]), statistics.median(times[True])
    return {
        "eager_seconds": round(eager, 6),
        "compiled_seconds": round(compiled, 6),
        "speedup": round(eager / compiled, 3),
        f"eager_{unit}_per_second": round(per_call / eager, 1),
        f"compiled_{unit}_per_second": round(per_call / compiled, 1),
        "warmup_seconds": round(warmup, 3),
        "eager_runs": [round(t, 6) for t in times[False]],
        "compiled_runs": [round(t, 6) for t in times[True]],
        "compiled_calls": log.entries(),
        **extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=5, help="alternating eager/compiled rounds (medians)")
    parser.add_argument("--steps", type=int, default=50, help="training steps per round")
    parser.add_argument("--evals", type=int, default=5, help="evaluations per round")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--parts", default="evaluation,train_step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from kgtrace.data.dataset import load_dataset
    from kgtrace.models import build_model

    dataset = load_dataset("umls")
    torch.manual_seed(0)
    model = build_model("conve", dataset.num_entities, dataset.num_relations)
    device = torch.device(args.device)
    result = {"torch": torch.__version__, "device": args.device, "threads": args.threads, "dataset": "umls",
              "model": "conve (200 dimensions, 32 channels)", "batch_size": args.batch_size}
    parts = {"evaluation": evaluation, "train_step": train_step}
    for part in args.parts.split(","):
        result[part] = parts[part](args, dataset, model, device)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
