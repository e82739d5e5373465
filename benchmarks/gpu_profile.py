"""Where a step's time goes: device (kernel) time against host time, per step, under torch.profiler; print JSON.

For each training path of ConvE (and DistMult) on a synthetic FB15k-237-shaped graph (14,541 entities,
237 relations, 272,115 triples), the 16M-edge graph's (--shape robokop) or a dataset's (--dataset), and
for all-entity ranking on a synthetic graph of 500,000 entities and 10,000 test triples,
this script runs a few warm-up steps, then times --steps steps with the device synchronised at both
ends (``wall_ms``), then profiles the same number of steps and sums, per step:

* ``kernel_ms``: the union of the device's busy intervals (kernels and copies; overlaps counted once);
* ``kernels``: the number of device activities;
* ``host_ms``: the time the host took to issue the steps (the loop without the final synchronisation);
* ``busy``: kernel_ms / wall_ms, the share of the step the device worked: far below 1, the step is
  bound by launches and host work, not by arithmetic;
* ``floor_ms``: the step's arithmetic (counted FLOPs at the chip's measured float32 product rate) or its
  bytes (at the measured copy bandwidth), whichever is larger, and ``floor_fraction`` = floor / wall.

Training paths: ``eager`` (the step by step loop), ``compiled`` (the step's loss under torch.compile,
CUDA graphs per call), ``captured`` (kgtrace.training.graphed: the whole step one CUDA graph),
``captured-compiled`` (the same, its loss's kernels Inductor's) and ``captured-tf32``. Each row also
lists the device activities that took the most time (``top_kernels``). Ranking: eager and compiled.
On a CPU the profiler sees no device activity: ``kernel_ms`` is null and the script still checks that
every path runs (its smoke test).

    python benchmarks/gpu_profile.py --device cuda [--steps 50] [--paths eager,captured,captured-compiled]
    python benchmarks/gpu_profile.py --device cuda --shape robokop --models conve --paths captured-tf32 \
        --batches 128,1024 --skip rank   # a step of the 16M-edge graph (epoch_seconds_estimate)
    python benchmarks/gpu_profile.py --device cpu --scale 0.01 --steps 3   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import conve_step_cost, device_rates, distmult_step_cost, floor_ms, resolved  # noqa: E402

SHAPES = {  # synthetic graphs of these sizes (uniformly random triples)
    "fb15k237": {"entities": 14_541, "relations": 237, "train": 272_115},
    "robokop": {"entities": 1_097_020, "relations": 20, "train": 10_341_769},  # the 16M-edge graph's training split
}
PATHS = ("eager", "compiled", "captured", "captured-compiled", "captured-tf32")


def synthetic_train(entities: int, relations: int, n: int, seed: int = 0) -> torch.Tensor:
    """Distinct uniformly random triples [n', 3] (n' <= n)."""
    gen = torch.Generator().manual_seed(seed)
    triples = torch.stack([torch.randint(0, entities, (n,), generator=gen),
                           torch.randint(0, relations, (n,), generator=gen),
                           torch.randint(0, entities, (n,), generator=gen)], 1)
    return torch.unique(triples, dim=0)


def device_activities(events) -> list:
    """The profiler's device events: kernels, copies and sets, without the ranges torch annotates on the device's
    timeline (``Optimizer.step#Adam.step`` spans a step's launches, gaps included)."""
    return [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
            and not getattr(e, "is_user_annotation", False) and "#" not in e.name]


def top_kernels(events, steps: int, shown: int = 12) -> list[list]:
    """The device activities taking the most time: [name, microseconds per step, launches per step]."""
    totals: dict[str, list[float]] = {}
    for e in device_activities(events):
        entry = totals.setdefault(e.name, [0.0, 0])
        entry[0] += e.time_range.end - e.time_range.start
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:shown]
    return [[name[:90], round(us / steps, 2), count / steps] for name, (us, count) in ranked]


def busy_ms(events) -> tuple[float | None, int]:
    """The union of device activity intervals in ms, and their count (None, 0 without device activity)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in device_activities(events))
    if not spans:
        return None, 0
    total, (lo, hi) = 0, spans[0]
    for start, end in spans[1:]:
        if start > hi:
            total, lo = total + hi - lo, start
        hi = max(hi, end)
    return (total + hi - lo) / 1000, len(spans)


def measure(run_steps, steps: int, device: torch.device) -> dict:
    """wall_ms, host_ms, kernel_ms and kernels per step of ``run_steps()`` (which runs ``steps`` steps)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    run_steps()
    issued = time.perf_counter()
    sync()
    wall = (time.perf_counter() - start) / steps * 1000
    host = (issued - start) / steps * 1000
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        run_steps()
        sync()
    events = prof.events()
    kernel, count = busy_ms(events)
    return {"wall_ms": wall, "host_ms": host, "kernel_ms": None if kernel is None else kernel / steps,
            "kernels": count / steps, "busy": None if kernel is None else kernel / steps / wall,
            "top_kernels": top_kernels(events, steps)}


def training_paths(args: argparse.Namespace, device: torch.device, rates: dict) -> list[dict]:
    from kgtrace.data.dataset import load_dataset
    from kgtrace.training.batches import Batches

    if args.dataset:
        ds = load_dataset(args.dataset)
        train, entities, relations = ds.train, ds.num_entities, ds.num_relations
    else:
        shape = SHAPES[args.shape]
        entities, relations = int(shape["entities"] * args.scale), max(2, int(shape["relations"] * args.scale))
        train = synthetic_train(entities, relations, int(shape["train"] * args.scale))
    shape = SimpleNamespace(num_entities=entities, num_relations=relations)  # what new_state reads of a dataset
    batches = Batches.build(train, relations, "kvsall")
    rows = []
    for batch in map(int, args.batches.split(",")):
        for model in args.models.split(","):
            for path in args.paths.split(","):
                if path.endswith("tf32") and device.type != "cuda":
                    continue
                rows.append(training_path(args, model, path, batch, batches, shape, device, rates))
                print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def training_path(args: argparse.Namespace, model: str, path: str, batch: int, batches, shape,
                  device: torch.device, rates: dict) -> dict:
    """One row of the table: ``path``'s training step of ``model``, warmed up, timed and profiled."""
    from kgtrace.compute.precision import matmul_mode
    from kgtrace.core.config import TrainConfig
    from kgtrace.training.graphed import GraphedTraining
    from kgtrace.training.loop import new_state
    from kgtrace.training.step import run_epoch

    precision = "tf32" if path.endswith("tf32") else "fp32"
    config = TrainConfig(dataset="umls", model=model, model_args={"embedding_dim": 200}, batch_size=batch,
                         steps_per_epoch=args.steps, device=device.type, precision=precision,
                         compile="compiled" in path, captured_step=path.startswith("captured"), eval_every=0)
    state = new_state(config, shape, device)
    epoch = GraphedTraining(batches, device) if config.captured_step else run_epoch
    started = time.perf_counter()
    with matmul_mode(precision):
        for _ in range(args.warmup_epochs):  # compilation, captures, warm-up steps
            epoch(state, batches, config, device, False)
        warm = time.perf_counter() - started
        numbers = measure(lambda: epoch(state, batches, config, device, False), args.steps, device)
    params = sum(p.numel() for p in state.model.parameters())
    cost = (conve_step_cost if model == "conve" else distmult_step_cost)(batch, shape.num_entities, 200, params)
    floor = floor_ms(*cost, rates)
    return {"work": "train step", "model": model, "path": path, "batch": batch, "entities": shape.num_entities,
            "examples": len(batches), "warmup_seconds": warm, **numbers, "floor_ms": floor,
            "floor_fraction": floor / numbers["wall_ms"],
            "epoch_seconds_estimate": numbers["wall_ms"] * -(-len(batches) // batch) / 1000}


def ranking_paths(args: argparse.Namespace, device: torch.device, rates: dict) -> list[dict]:
    from kgtrace.data.answers import AnswerIndex, answering
    from kgtrace.evaluation.compiled import rank_side_compiled
    from kgtrace.evaluation.sides import query_chunk_size, rank_side, side_queries
    from kgtrace.models import build_model

    entities, n_train, n_test = int(500_000 * args.scale), int(2_000_000 * args.scale), max(8, int(10_000 * args.scale))
    triples = synthetic_train(entities, 20, n_train + n_test, seed=1)
    triples = triples[torch.randperm(len(triples), generator=torch.Generator().manual_seed(1))]
    test, known = triples[:n_test], triples
    torch.manual_seed(0)
    model = build_model("distmult", entities, 20, embedding_dim=200).to(device).eval()
    index = AnswerIndex.build(answering(known, test, 20), 20)
    budget = args.rank_budget << 20
    sides = [side_queries(test, 20, side) for side in ("head", "tail")]
    rows = []
    for path, rank in (("eager", rank_side), ("compiled", rank_side_compiled)):
        if path not in args.rank_paths.split(","):
            continue

        def both_sides(rank=rank) -> None:
            for sq in sides:
                rank(model, sq, index, memory_budget=budget, device=device)

        started = time.perf_counter()
        both_sides()  # warm-up (compilation)
        warm = time.perf_counter() - started
        numbers = measure(both_sides, 1, device)
        queries = 2 * n_test
        chunk = query_chunk_size(entities, budget)
        floor = floor_ms(2 * queries * 200 * entities, 4 * queries * entities * 3, rates)
        rows.append({"work": "rank both sides", "model": "distmult", "path": path, "entities": entities,
                     "queries": queries, "chunk": chunk, "memory_budget_mb": args.rank_budget, "warmup_seconds": warm,
                     **numbers, "floor_ms": floor, "floor_fraction": floor / numbers["wall_ms"]})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'work':<16} {'model':<9} {'path':<22} {'batch':>5} {'wall ms':>9} {'host ms':>9} {'kernel ms':>9} {'busy':>6} " \
           f"{'kernels':>8} {'floor ms':>9} {'of floor':>8}"
    lines = [head]
    for r in rows:
        kernel = "-" if r["kernel_ms"] is None else f"{r['kernel_ms']:.3f}"
        busy = "-" if r["busy"] is None else f"{r['busy']:.2f}"
        lines.append(f"{r['work']:<16} {r['model']:<9} {r['path']:<22} {r.get('batch', '-'):>5} "
                     f"{r['wall_ms']:>9.3f} {r['host_ms']:>9.3f} "
                     f"{kernel:>9} {busy:>6} {r['kernels']:>8.0f} {r['floor_ms']:>9.3f} {r['floor_fraction']:>8.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dataset", help="train on this dataset (registry name or folder) instead of the synthetic")
    parser.add_argument("--shape", default="fb15k237", choices=sorted(SHAPES), help="the synthetic graph's sizes")
    parser.add_argument("--batches", default="128", help="comma-separated batch sizes")
    parser.add_argument("--models", default="conve,distmult")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--rank-paths", default="eager,compiled")
    parser.add_argument("--steps", type=int, default=50, help="training steps timed and profiled per path")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="epochs of --steps steps before timing")
    parser.add_argument("--rank-budget", type=int, default=2048, help="ranking memory budget, MiB")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink every graph by this factor (smoke runs)")
    parser.add_argument("--skip", default="", help="comma-separated: train, rank")
    args = parser.parse_args()
    device = resolved(args.device)
    rates = device_rates(device)
    rows = [] if "train" in args.skip else training_paths(args, device, rates)
    rows += [] if "rank" in args.skip else ranking_paths(args, device, rates)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for r in rows:
        print(f"{r['work']} {r['model']} {r['path']}: " + "; ".join(f"{name} {us} us x{n:g}"
                                                                   for name, us, n in r["top_kernels"][:8]),
              file=sys.stderr)
    print(table(rows), file=sys.stderr)
    print(json.dumps({"benchmark": "gpu_profile", "device": str(device), "device_name": name,
                      "torch": torch.__version__, "rates": rates, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
