"""Why head-side MRR trails tail-side MRR: the dataset's shape, and a run's ranks by relation category; JSON.

For a dataset (``--dataset``, a registered name or folder) it counts what each side asks of a model:
training examples per epoch under KvsAll (one per distinct query: (h, r, ?) for tails, (t, r^-1, ?)
for heads) and under 1vsAll (one per triple and side), the known answers per test query, and the test
triples per relation category (Bordes et al. 2013: 1-1, 1-N, N-1, N-N from the average heads per tail
and tails per head, threshold 1.5). For a run (``--run``) it adds the filtered test MRR per side, per
category, and the validation MRR per side over the training curve.

    KGTRACE_DATASETS_MIRROR=../shared/datasets/benchmarks \\
        python benchmarks/head_tail.py --run benchmarks/runs/conve-paper-fb15k237 [--device auto]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

CATEGORY_THRESHOLD = 1.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default=None, help="a registered dataset or folder (default: the run's)")
    p.add_argument("--run", type=Path, default=None, help="a kgtrace run folder to break down")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=int, default=0)
    return p.parse_args(argv)


def categories(train: torch.Tensor, num_relations: int) -> torch.Tensor:
    """Category per relation [R]: 0 = 1-1, 1 = 1-N, 2 = N-1, 3 = N-N (heads per tail, tails per head)."""
    out = torch.zeros(num_relations, dtype=torch.long)
    for r in range(num_relations):
        t = train[train[:, 1] == r]  # [n_r, 3]
        if len(t) == 0:
            continue
        tails_per_head = len(t) / torch.unique(t[:, 0]).numel()
        heads_per_tail = len(t) / torch.unique(t[:, 2]).numel()
        out[r] = 2 * int(heads_per_tail >= CATEGORY_THRESHOLD) + int(tails_per_head >= CATEGORY_THRESHOLD)
    return out


NAMES = ("1-1", "1-N", "N-1", "N-N")


def answers_per_query(known: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Known answers of each (anchor, relation) query [Q] among ``known`` (anchor, relation) pairs [K, 2]."""
    keys, counts = torch.unique(known, dim=0, return_counts=True)  # [U, 2], [U]
    index = {tuple(k): int(c) for k, c in zip(keys.tolist(), counts.tolist())}
    return torch.tensor([index.get(tuple(q), 0) for q in queries.tolist()], dtype=torch.float64)


def shape(ds) -> dict:
    """What each side asks of a model on ``ds``."""
    train, test, known = ds.train, ds.test, ds.all_triples()
    cats = categories(train, ds.num_relations)[test[:, 1]]  # [n_test]
    tail_answers = answers_per_query(known[:, [0, 1]], test[:, [0, 1]])
    head_answers = answers_per_query(known[:, [2, 1]], test[:, [2, 1]])
    return {
        "train_triples": len(train),
        "kvsall_examples_per_epoch": {"tail": torch.unique(train[:, [0, 1]], dim=0).shape[0],
                                      "head": torch.unique(train[:, [2, 1]], dim=0).shape[0]},
        "onevsall_examples_per_epoch": {"tail": len(train), "head": len(train)},
        "known_answers_per_test_query": {
            side: {"mean": float(a.mean()), "median": float(a.median())}
            for side, a in (("tail", tail_answers), ("head", head_answers))},
        "test_triples_per_category": {NAMES[c]: int((cats == c).sum()) for c in range(4)},
    }


def breakdown(run: Path, device: str) -> dict:
    """Filtered test MRR of a run's best checkpoint per side, overall and per relation category."""
    from kgtrace.compute.system import resolve_device
    from kgtrace.evaluation.evaluate import rank_queries
    from kgtrace.runs.embedding import load_run

    loaded = load_run(run, device=resolve_device(device))
    ds = loaded.dataset
    ranks = rank_queries(loaded.model, ds.test, known=ds.known_triples("test"))
    cats = categories(ds.train, ds.num_relations)[ds.test[:, 1]]  # [n_test]
    out: dict = {}
    for side, counts in ranks.counts.items():
        rr = 1.0 / counts.rank("realistic")  # [n_test]
        out[side] = {"mrr": float(rr.mean()),
                     **{NAMES[c]: float(rr[cats == c].mean()) for c in range(4) if bool((cats == c).any())}}
    return out


def curve(run: Path) -> list[dict]:
    from kgtrace.core.layout import RunLayout
    from kgtrace.report.sections import read_records

    records = read_records(RunLayout(run).metrics)
    return [{"epoch": r["epoch"], "head": r["valid_head_mrr"], "tail": r["valid_tail_mrr"]}
            for r in records if "valid_head_mrr" in r]


def main(argv: list[str] | None = None) -> int:
    from kgtrace.core.config import read_yaml
    from kgtrace.data.dataset import load_dataset

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.dataset is None and args.run is None:
        sys.exit("give --dataset or --run")
    name = args.dataset or read_yaml(args.run / "config.yaml")["dataset"]
    result: dict = {"dataset": name, "shape": shape(load_dataset(name))}
    if args.run is not None:
        result["run"] = str(args.run)
        result["test_mrr_by_side_and_category"] = breakdown(args.run, args.device)
        result["valid_mrr_by_side"] = curve(args.run)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
