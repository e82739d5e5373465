"""Exact TracIn at scale: time and peak memory of ConvE last-layer top-10 against the training-set size; print JSON.

For each size, a synthetic run folder is written (not trained: training 1M triples on a few CPU
cores takes hours, and TracIn's cost does not depend on how good the weights are):

* a dataset folder of random triples over --entities entities and --relations relations, heads and
  tails drawn from a Zipf-like distribution (a few hub entities, a long tail, as in biomedical
  graphs), relations skewed too, deduplicated; valid and test triples are not in train;
* node_dict, rel_dict and config.yaml as training writes them (ConvE with its default config,
  dim 200; lr 1e-3 decayed by 0.8 per epoch), and --checkpoints epoch checkpoints in kgtrace's
  format: the initial weights drifted a little further at every epoch, batch-norm running
  statistics set by forward passes in training mode over random training queries, each
  checkpoint with its epoch's learning rate (the optimizer state is a fresh Adam's).

Each size is then measured in a fresh process with --threads torch threads: ``kgtrace.load_run``,
then ``TracIn(run, params="last").top_k(test[:n_test], k=10)``, the exact streaming path over all
training triples and checkpoints. Reported per size: seconds (and minutes) of TracIn, training
triples per second, the distinct (head, relation) pairs (much of the time is per distinct pair, head
and relation: ConvE's fc input, in bands, and its products with the test triples' at every
checkpoint; on a skewed graph pairs grow slower than triples), the RSS after loading the run
(baseline: model, dataset, id maps), the peak RSS while loading and the peak RSS during TracIn (the
high-water mark is reset after loading, through /proc/self/clear_refs), and their difference,
TracIn's working memory. That difference should not grow with the training set;
``tracin_memory_ratio`` is its value at the largest size over the smallest. Files are written
under a temporary folder, removed after each size unless --keep.

The run folders are written on the CPU whatever --device (the same bytes for every device); the
measuring process loads the run and runs TracIn on --device. On CUDA it also reports the GPU's
allocated memory after loading and its peak during TracIn (``torch.cuda.max_memory_allocated``,
reset after loading), their difference, and ``cuda_tracin_memory_ratio`` beside the RSS figures.

    python benchmarks/tracin_scale.py [--sizes 250000,500000,1000000] [--entities 100000]
        [--relations 40] [--n-test 100] [--checkpoints 4] [--threads 2] [--keep DIR] [--device auto]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import resolved

FLAT_RATIO = 1.25  # TracIn's working memory at the largest size over the smallest, below which it counts as flat


# ----------------------------------------------------------------------------- synthetic triples


def zipf(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities over n ids proportional to rank^-exponent, ranks shuffled over the ids."""
    weights = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    return rng.permutation(weights / weights.sum())


def draw(n: int, entity_p: np.ndarray, relation_p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """n random triples [n, 3] (int64), endpoints and relations from the given distributions."""
    heads = rng.choice(len(entity_p), n, p=entity_p)
    tails = rng.choice(len(entity_p), n, p=entity_p)
    return np.stack([heads, rng.choice(len(relation_p), n, p=relation_p), tails], axis=1)


def keys(triples: np.ndarray, num_entities: int, num_relations: int) -> np.ndarray:
    return (triples[:, 0] * num_relations + triples[:, 1]) * num_entities + triples[:, 2]


def distinct(n: int, entity_p: np.ndarray, relation_p: np.ndarray, exclude: np.ndarray,
             rng: np.random.Generator) -> np.ndarray:
    """n distinct random triples whose keys are not in ``exclude``, in the order drawn."""
    triples = np.empty((0, 3), dtype=np.int64)
    while len(triples) < n:
        more = np.concatenate([triples, draw(int((n - len(triples)) * 1.2) + 100, entity_p, relation_p, rng)])
        k = keys(more, len(entity_p), len(relation_p))
        _, first = np.unique(k, return_index=True)
        first = np.sort(first)
        triples = more[first[~np.isin(k[first], exclude)]]
    return triples[:n]


def synthetic_triples(n_train: int, n_test: int, num_entities: int, num_relations: int,
                      seed: int) -> dict[str, np.ndarray]:
    """train, valid and test id triples; valid and test are disjoint from train and each other, and hold only
    entities and relations of train (loading drops any other, and the run's pinned splits would then differ)."""
    rng = np.random.default_rng(seed)
    entity_p, relation_p = zipf(num_entities, 1.0, rng), zipf(num_relations, 1.0, rng)
    train = distinct(n_train, entity_p, relation_p, np.empty(0, dtype=np.int64), rng)
    seen_entity, seen_relation = np.zeros(num_entities, bool), np.zeros(num_relations, bool)
    seen_entity[train[:, [0, 2]].reshape(-1)], seen_relation[train[:, 1]] = True, True
    held, draw_n = train[:0], 2 * n_test
    while len(held) < 2 * n_test:
        held = distinct(draw_n, entity_p, relation_p, keys(train, num_entities, num_relations), rng)
        held = held[seen_entity[held[:, 0]] & seen_relation[held[:, 1]] & seen_entity[held[:, 2]]]
        draw_n *= 2
    return {"train": train, "valid": held[n_test:2 * n_test], "test": held[:n_test]}


# ----------------------------------------------------------------------------- run folder


def dataset_of(triples: dict[str, np.ndarray], num_entities: int, num_relations: int):
    from kgtrace.data.dataset import Dataset
    from kgtrace.data.vocab import Vocab

    splits = {split: torch.from_numpy(t) for split, t in triples.items()}
    return Dataset(name="synthetic", source="synthetic", entities=Vocab([f"ENT:{i}" for i in range(num_entities)]),
                   relations=Vocab([f"rel_{i}" for i in range(num_relations)]), **splits)


@torch.no_grad()
def drift(model: torch.nn.Module, scale: float, generator: torch.Generator) -> None:
    """Move every parameter by scale times its own spread (0.05 for constant ones) in a random direction."""
    for p in model.parameters():
        spread = float(p.std()) if p.numel() > 1 else 0.0
        p.add_(torch.randn(p.shape, generator=generator) * scale * (spread or 0.05))


@torch.no_grad()
def calibrate_batch_norm(model: torch.nn.Module, train: torch.Tensor, generator: torch.Generator,
                         batches: int = 30, size: int = 512) -> None:
    """Running statistics from training-mode forward passes over random (head, relation) and inverse queries."""
    model.train()
    num_relations = model.num_relations
    for _ in range(batches):
        rows = train[torch.randint(len(train), (size,), generator=generator)]
        inverse = torch.stack([rows[:, 2], rows[:, 1] + num_relations], dim=1)
        model.encode_query(torch.cat([rows[: size // 2, :2], inverse[size // 2:]]))
    model.eval()


def write_run(folder: Path, triples: dict[str, np.ndarray], num_entities: int, num_relations: int,
              checkpoints: int, seed: int) -> None:
    """A run folder that ``kgtrace.load_run`` reads: dataset, id maps, config and epoch checkpoints."""
    from kgtrace.core.checkpoint import epoch_path, save_checkpoint
    from kgtrace.core.config import TrainConfig
    from kgtrace.data.dataset import save_dataset
    from kgtrace.training.loop import new_state, state_dict, write_run_files

    dataset = dataset_of(triples, num_entities, num_relations)
    save_dataset(dataset, folder / "data")
    # Written on the CPU whatever --device: the drift and calibration draw from a CPU generator, and the
    # checkpoints are then the same bytes for every device that measures them.
    config = TrainConfig(dataset=str((folder / "data").resolve()), model="conve", epochs=checkpoints,
                         checkpoint_every=1, eval_every=0, lr=1e-3, lr_decay=0.8, device="cpu", seed=seed)
    write_run_files(folder, config, dataset)
    state = new_state(config, dataset, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    steps = -(-len(triples["train"]) // config.batch_size)
    for epoch in range(1, checkpoints + 1):
        drift(state.model, 0.2, generator)
        calibrate_batch_norm(state.model, dataset.train, generator)
        state.epoch, state.step = epoch, epoch * steps
        lr = config.lr * config.lr_decay ** (epoch - 1)
        save_checkpoint(state_dict(state, config, dataset, lr), epoch_path(folder / "checkpoints", epoch))


# ----------------------------------------------------------------------------- measurement (child process)


def status_mb(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in MB."""
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def reset_peak() -> bool:
    """Reset the process's RSS high-water mark (VmHWM); False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(folder: Path, n_test: int, threads: int, device: torch.device) -> dict:
    import kgtrace

    torch.set_num_threads(threads)
    cuda = device.type == "cuda"
    start = time.perf_counter()
    run = kgtrace.load_run(folder, "last", device=device)
    if cuda:
        torch.cuda.synchronize(device)
    load_seconds = time.perf_counter() - start
    baseline, load_peak = status_mb("VmRSS"), status_mb("VmHWM")
    reset = reset_peak()
    if cuda:
        cuda_baseline, cuda_load_peak = (torch.cuda.memory_allocated(device) / 2**20,
                                         torch.cuda.max_memory_allocated(device) / 2**20)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    tracin = kgtrace.TracIn(run, params="last", device=device)
    results = tracin.top_k(run.dataset.test[:n_test], k=10)  # copied back to the CPU: the GPU's work is done
    seconds = time.perf_counter() - start
    peak = status_mb("VmHWM")
    cuda_memory = {}
    if cuda:
        cuda_peak = torch.cuda.max_memory_allocated(device) / 2**20
        cuda_memory = {"cuda_baseline_mb": cuda_baseline, "cuda_load_peak_mb": cuda_load_peak,
                       "tracin_cuda_peak_mb": cuda_peak, "tracin_cuda_working_memory_mb": cuda_peak - cuda_baseline}
    assert len(results) == min(n_test, len(run.dataset.test))
    assert all(bool(torch.isfinite(r.proponent_influence).all()) for r in results)
    n_train, train = len(run.dataset.train), run.dataset.train
    pairs = len(torch.unique(train[:, 0] * run.dataset.num_relations + train[:, 1]))
    return {"device": device.type, "n_train": n_train, "distinct_pairs": pairs, "n_test": len(results),
            "checkpoints": len(tracin.checkpoints),
            "chunk_size": tracin.chunk_size, "chunks": -(-n_train // tracin.chunk_size), "path": tracin.path,
            "params": tracin.names, "load_seconds": load_seconds, "tracin_seconds": seconds,
            "tracin_minutes": seconds / 60, "train_triples_per_second": n_train / seconds,
            "baseline_rss_mb": baseline, "load_peak_rss_mb": load_peak, "tracin_peak_rss_mb": peak,
            "tracin_working_memory_mb": peak - baseline, "peak_reset": reset,
            "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "train_ids_mb": run.dataset.train.numel() * 8 / 2**20, **cuda_memory}


# ----------------------------------------------------------------------------- driver


def run_size(n_train: int, args: argparse.Namespace, root: Path, device: torch.device) -> dict:
    folder = root / f"run-{n_train}"
    start = time.perf_counter()
    triples = synthetic_triples(n_train, args.n_test, args.entities, args.relations, seed=n_train)
    generate_seconds = time.perf_counter() - start
    write_run(folder, triples, args.entities, args.relations, args.checkpoints, seed=0)
    write_seconds = time.perf_counter() - start - generate_seconds
    del triples
    cmd = [sys.executable, __file__, "--measure", str(folder), f"--n-test={args.n_test}", f"--threads={args.threads}",
           f"--device={device.type}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if not args.keep:
        shutil.rmtree(folder)
    if done.returncode != 0:
        return {"n_train": n_train, "error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "generate_seconds": generate_seconds,
            "write_seconds": write_seconds}


def flatness(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    if len(ok) < 2:
        return {}
    small, large = min(ok, key=lambda r: r["n_train"]), max(ok, key=lambda r: r["n_train"])
    ratio = large["tracin_working_memory_mb"] / small["tracin_working_memory_mb"]
    cuda = ({"cuda_tracin_memory_ratio": large["tracin_cuda_working_memory_mb"] / small["tracin_cuda_working_memory_mb"]}
            if "tracin_cuda_working_memory_mb" in small else {})
    return {"tracin_memory_ratio": ratio, "train_size_ratio": large["n_train"] / small["n_train"],
            "baseline_rss_growth_mb": large["baseline_rss_mb"] - small["baseline_rss_mb"],
            "memory_flat": ratio <= FLAT_RATIO, "flat_threshold": FLAT_RATIO, **cuda}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="250000,500000,1000000")
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--relations", type=int, default=40)
    parser.add_argument("--n-test", type=int, default=100)
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", help="write the run folders here and keep them")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto (CUDA when available), cpu or cuda")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = resolved(args.device)  # once: the measuring processes are given the device it resolved to
    if args.measure:
        print(json.dumps(measure(Path(args.measure), args.n_test, args.threads, device)))
        return
    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for n_train in (int(x) for x in args.sizes.split(",")):
            results.append(run_size(n_train, args, root, device))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "tracin_scale", "device": device.type, "model": "conve", "embedding_dim": 200,
                      "params": "last",
                      "entities": args.entities, "relations": args.relations, "n_test": args.n_test,
                      "checkpoints": args.checkpoints, "threads": args.threads, "torch": torch.__version__,
                      "results": results, **flatness(results)}, indent=2))


if __name__ == "__main__":
    main()
