"""ConvE on FB15k-237 under the ConvE authors' first preprocessing: one relation for both directions; print JSON.

    python benchmarks/conve_first_protocol.py --data DIR --run RUN [--epochs 20] [--threads 1] [--device auto]

An earlier wrangle_KG.py of the authors' repository (before its ``_reverse`` relations) filed both
directions of a triple (h, r, t) under r: training asks (h, r) for t and (t, r) for h, and the test asks
every test triple's (h, r, ?) -> t and (t, r, ?) -> h, each filtered by the known answers of both
directions. This script emulates that with kgtrace:

* ``--data DIR``: FB15k-237 (from the dataset registry) with every triple of every split also as its
  reverse under the same relation (a reverse already in an earlier split, or repeated, written once);
* ``--run RUN``: the ``conve-code-fb15k237`` recipe's settings trained on DIR (reused when RUN exists:
  then ``--epochs`` is the run's), validation every 5 epochs; kgtrace adds its inverse-relation queries,
  which on this graph repeat each query under a second relation id;
* the test protocol above on the best checkpoint, over all 2 x 20,438 queries of the original test
  triples whose entities occur in training (``all``), and per direction.

Offline: ``KGTRACE_DATASETS_MIRROR=../shared/datasets/benchmarks``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from common import resolved
from reproduce import RECIPES

from kgtrace.data.triples import read_labeled_triples, write_labeled_triples


def write_symmetrised(source: Path, out: Path) -> None:
    """train/valid/test of ``source`` with each triple's reverse under the same relation, each triple once."""
    out.mkdir(parents=True, exist_ok=True)
    seen: set[tuple[str, str, str]] = set()
    for split in ("train", "valid", "test"):
        rows = []
        for h, r, t in read_labeled_triples(source / f"{split}.txt").tolist():
            for triple in ((h, r, t), (t, r, h)):
                if triple not in seen:
                    seen.add(triple)
                    rows.append(triple)
        write_labeled_triples(np.array(rows, dtype=object).reshape(-1, 3), out / f"{split}.txt")


def first_protocol(run_dir: Path, source: Path) -> dict:
    """Filtered realistic metrics of the original test triples asked in both directions under one relation."""
    from kgtrace.evaluation.evaluate import rank_queries
    from kgtrace.evaluation.ranks import RankCounts, summarize
    from kgtrace.runs.embedding import load_run

    run = load_run(run_dir)
    ds = run.dataset
    test = read_labeled_triples(source / "test.txt")  # [m, 3] labels
    ids = torch.from_numpy(np.stack([ds.entities.lookup(test[:, 0]), ds.relations.lookup(test[:, 1]),
                                     ds.entities.lookup(test[:, 2])], axis=1))  # [m, 3], -1 for a label not in training
    forward = ids[(ids >= 0).all(dim=1)]  # [n, 3]
    queries = torch.cat([forward, forward[:, [2, 1, 0]]])  # [2n, 3]: (h, r, ?) -> t, then (t, r, ?) -> h
    counts = rank_queries(run.model, queries, known=ds.all_triples(), sides=("tail",)).counts["tail"]

    def metrics(rows: slice) -> dict[str, float]:
        part = RankCounts(counts.greater[rows], counts.equal[rows], counts.num_candidates[rows])
        return summarize(part).realistic.to_dict()

    n = len(forward)
    return {"test_triples": len(test), "ranked": n, "all": metrics(slice(0, 2 * n)),
            "tail_queries": metrics(slice(0, n)), "head_queries": metrics(slice(n, 2 * n))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="where the symmetrised dataset goes")
    p.add_argument("--run", type=Path, required=True, help="the run folder (trained when missing)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = p.parse_args()
    device = resolved(args.device)
    from kgtrace.core.config import TrainConfig
    from kgtrace.data.registry import fetch
    from kgtrace.report.sections import read_records
    from kgtrace.training.loop import train

    source = fetch("fb15k237")
    if not (args.data / "test.txt").is_file():
        write_symmetrised(source, args.data)
    if not args.run.exists():
        settings = {**RECIPES["conve-code-fb15k237"].settings, "epochs": args.epochs}
        config = TrainConfig(dataset=str(args.data), threads=args.threads, device=device.type, **settings)
        train(config, args.run, progress=False)
    curve = [{k: r[k] for k in ("epoch", "loss", "seconds", "valid_mrr") if k in r}
             for r in read_records(args.run / "metrics.jsonl")]
    print(json.dumps({"command": " ".join(["python", "benchmarks/conve_first_protocol.py", *sys.argv[1:]]),
                      "curve": curve, "test": first_protocol(args.run, source)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
