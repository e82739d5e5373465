"""Are TracIn's explanations true? The faithfulness table for DistMult and ConvE on Nations and UMLS; prints JSON.

For each dataset x model: train a base run (small models, few epochs, so that hundreds of
retrainings fit on a laptop), take N of its rank-first test triples (tail side, filtered),
and for each method (TracIn with last-layer / all parameters, k random triples, k triples of
GradRollback's neighbourhood) and each k remove those training triples and train again:

* ``retrain``: from scratch with the run's config and seed, for the first ``--retrain`` of
  the N predictions (all of them by default);
* ``finetune``: from the run's checkpoint at half the epochs, for all N predictions;

With ``--with-proof``, a BFS prover run with rules mined from the dataset's training triples
(kgtrace's defaults, depth 3) is made per dataset, and the ``proof`` method (the facts of the
prover's best proof of each prediction) is measured beside the others. With ``--with-paths``, rules are
learned from each dataset's training triples (``kgtrace rules learn``, ``--rule-rounds`` rounds: the same
rules on any machine), and the ``paths`` method (the facts of the strongest paths that imply each
prediction) is measured beside the others.

then report PD, TC, score drop, rank change and MRR drop per (variant, method, k), what
training again with nothing removed changes (the control), and how far fine-tuning agrees
with retraining on the removals both ran. GradRollback's anchor (Nations, DistMult, their
own training; PD/TC %): NH-1 54/18, GR-1 93/38, GR-10 97/83.

    python benchmarks/faithfulness.py [--datasets nations,umls] [--models distmult,conve] [--predictions 50]
        [--k 1,10] [--retrain 50] [--jobs 2] [--threads 1] [--with-proof] [--with-paths [--rule-rounds 50]]
        [--out /tmp/faithfulness-bench]
        [--device auto]

Everything lands in --out (base runs, and each check's folder inside its run, which
``kgtrace report RUN`` shows); rerunning resumes every finished training (whatever device it ran on).
The base trainings, their test metrics and every retraining and fine-tuning run on --device; the
methods' removals (TracIn among them) are computed by kgtrace's faithfulness check on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from common import base_run, resolved

if TYPE_CHECKING:
    from kgtrace.faithfulness import FaithfulnessResult

# Small models and few epochs: each retraining takes about a second on one core.
MODELS = {
    "distmult": {"model_args": {"embedding_dim": 64}, "epochs": 40, "lr": 0.01},
    "conve": {"model_args": {"embedding_dim": 32, "embedding_height": 4, "output_channels": 8}, "epochs": 20,
              "lr": 0.003},
}
ANCHOR = {"dataset": "nations", "model": "DistMult (GradRollback's training)", "source": "Lawrence et al. 2021, Table 1",
          "pd_tc_percent": {"NH-1": [54, 18], "NH-10": [66, 36], "GR-1": [93, 38], "GR-10": [97, 83]}}
SHOWN = ("variant", "method", "k", "n", "removed", "pd", "tc", "score_drop", "prob_drop", "rank_change", "mrr_drop",
         "seconds")


def base_metrics(run_dir: Path, device: torch.device) -> dict:
    """Filtered tail-side MRR and Hits@1 of the last checkpoint on test, and how many test triples it ranks first."""
    from kgtrace.evaluation.evaluate import evaluate
    from kgtrace.runs.embedding import load_run

    run = load_run(run_dir, "last", device=device)
    tail = evaluate(run.model, run.dataset.test, known=run.dataset.all_triples(), sides=("tail",),
                    device=device).sides["tail"].realistic
    return {"test_tail_mrr": round(tail.mrr, 4), "test_tail_hits_at_1": round(tail.hits_at[1], 4),
            "test_triples": len(run.dataset.test), "train_triples": len(run.dataset.train)}


def prover_run(dataset: str, out: Path) -> Path:
    """Make (or reuse) a BFS prover run on ``dataset`` with mined rules, for the proof method."""
    from kgtrace.cli import main as kgtrace
    from kgtrace.prover.run import is_prover_run

    run = out / f"{dataset}-bfs"
    if is_prover_run(run):
        return run
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON only
        done = kgtrace(["prove", "bfs", "--dataset", dataset, "--mine", "--depth", "3", "--out", str(run)])
    if done != 0:
        raise SystemExit(f"could not make the prover run {run}")
    return run


def rule_file(dataset: str, out: Path, rounds: int) -> Path:
    """Learn (or reuse) ``rounds`` rounds of rules from ``dataset``'s training triples, for the paths method."""
    from kgtrace.prover.config import LearnConfig
    from kgtrace.prover.learn import learn_rule_file

    rules = out / f"{dataset}.rules"
    learn_rule_file(dataset, rules, LearnConfig(rounds=rounds), log=lambda text: print(text, file=sys.stderr))
    return rules


def check(run: Path, mode: str, sample: int, args: argparse.Namespace,
          prover: Path | None, rules: Path | None) -> tuple[FaithfulnessResult, float]:
    from kgtrace.faithfulness import FaithfulnessSettings, check_faithfulness

    methods = args.methods + (("proof",) if prover is not None else ()) + (("paths",) if rules is not None else ())
    settings = FaithfulnessSettings(ks=args.k, methods=methods, mode=mode, sample=sample, seed=0, jobs=args.jobs,
                                    threads=args.threads, device=args.device.type,  # where the trainings run
                                    prover_run=None if prover is None else str(prover),
                                    rules=None if rules is None else str(rules))
    start = time.perf_counter()
    summary = check_faithfulness(run, run / "faithfulness", settings, progress=not args.no_progress,
                                 log=lambda text: print(f"{run.name}: {text}", file=sys.stderr))
    return summary, time.perf_counter() - start


def rounded(row: dict, keys: tuple[str, ...]) -> dict:
    return {k: (round(row[k], 4) if isinstance(row[k], float) else row[k]) for k in keys if k in row}


def one(dataset: str, model: str, args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    run = base_run(dataset, model, MODELS[model], args.out, args.threads, args.device)
    trained = time.perf_counter() - start
    prover = prover_run(dataset, args.out) if args.with_proof else None
    rules = rule_file(dataset, args.out, args.rule_rounds) if args.with_paths else None
    retrained, retrain_s = check(run, "retrain", args.retrain, args, prover, rules)
    summary, finetune_s = check(run, "finetune", args.predictions, args, prover, rules)
    return {
        "dataset": dataset, "model": model, "config": MODELS[model], "base": base_metrics(run, args.device),
        "base_training_s": round(trained, 1),
        "predictions": summary.predictions.how,
        "retrained_predictions": retrained.predictions.how,
        "control_max_abs_score_change": summary.control_max_abs_score_change,
        "wall_s": {"retrain": round(retrain_s, 1), "finetune": round(finetune_s, 1)},
        "table": [rounded(row.to_dict(), SHOWN) for row in summary.table],
        "agreement": [rounded(row.to_dict(), tuple(row.to_dict())) for row in summary.agreement],
        "folder": str(run / "faithfulness"),
        "prover_run": None if prover is None else str(prover),
        "rules": None if rules is None else str(rules),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="nations,umls")
    parser.add_argument("--models", default="distmult,conve")
    parser.add_argument("--predictions", type=int, default=50, help="rank-first test triples explained per run")
    parser.add_argument("--retrain", type=int, default=50, help="of those, how many are also retrained from scratch")
    parser.add_argument("--k", default="1,10")
    parser.add_argument("--methods", default="tracin-last,tracin-all,random,neighbourhood")
    parser.add_argument("--jobs", type=int, default=2, help="trainings in parallel")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--out", type=Path, default=Path("/tmp/faithfulness-bench"))
    parser.add_argument("--with-proof", action="store_true", help="also the proof method, with a BFS prover run "
                                                                   "on mined rules")
    parser.add_argument("--with-paths", action="store_true", help="also the paths method, with rules learned "
                                                                   "from the training triples")
    parser.add_argument("--rule-rounds", type=int, default=50, help="rounds of rule learning (--with-paths)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto (CUDA when available), cpu or cuda")
    args = parser.parse_args()
    args.k = tuple(int(k) for k in args.k.split(","))
    args.methods = tuple(args.methods.split(","))
    args.device = resolved(args.device)

    torch.set_num_threads(args.threads)
    results = [one(dataset, model, args) for dataset in args.datasets.split(",") for model in args.models.split(",")]
    print(json.dumps({"command": " ".join(sys.argv), "device": args.device.type, "anchor": ANCHOR, "results": results},
                     indent=1))


if __name__ == "__main__":  # the process pool spawns workers that import this file
    main()
