"""Rules alone at the field's scale: AnyBURL's path rules learned (kgtrace rules learn) and applied to every test
triple (kgtrace prove apply), filtered test metrics per aggregation; prints JSON.

Steps, each timed:

1. learn for --seconds into WORK/rules.txt (resumable: a rerun continues from WORK/rules.txt.state; give more
   --seconds to learn longer);
2. per aggregation (--aggregations, default maxplus and noisy_or; nr_noisy_or first learns SAFRAN's clusters of
   redundant rules on the validation split, timed with it): rank the test split, both sides, against
   every entity, filtered by train + valid + test, realistic ties (the same `kgtrace.evaluate` as the
   embedding runs). Test triples whose entity training never sees are left out at load (no rule can reach
   them); ``mrr_all_test`` counts them too, each at reciprocal rank 0, the protocol of AnyBURL's and SAFRAN's
   published figures (all 3,134 test triples of WN18RR, 20,466 of FB15k-237);
3. with --embedding-run RUN (an embedding run of the same dataset): that run alone, and for each aggregation but
   maxplus (whose scores are ranking keys) the hybrid ``logit + w x the rules' score`` with w chosen on the first
   --hybrid-valid validation triples by `kgtrace prove weigh`'s one-standard-error rule.

The targets (issue 55, filtered test MRR): AnyBURL's level .34 (FB15k-237) and .49 (WN18RR), SAFRAN's
.389 / .502; learning plus ranking within 30 minutes on 2 cores.

    python benchmarks/rules.py --dataset fb15k237 --seconds 600 [--rounds N] [--paths-per-round 4096] [--meet-neighbours N]
        [--confidence-sample 100] [--aggregations maxplus,noisy_or] [--test-triples N] [--embedding-run RUN [--hybrid-valid 2000]]
        [--work benchmarks/runs/rules-fb15k237] [--out benchmarks/results/rules-fb15k237-cpu.json] [--threads 2]
        [--device cpu]

Rule application runs on the CPU; an --embedding-run scores on --device.
Set KGTRACE_DATASETS_MIRROR=../shared/datasets/benchmarks on a machine without internet.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch
from common import processor_name, resolved

from kgtrace.data.answers import AnswerIndex
from kgtrace.data.dataset import load_dataset, split_path
from kgtrace.evaluation.evaluate import evaluate
from kgtrace.prover.apply import RuleScorer
from kgtrace.prover.clusters import RuleClusters
from kgtrace.prover.config import AGGREGATIONS, LearnConfig
from kgtrace.prover.graph import DirectedGraph
from kgtrace.prover.hybrid import choose_hybrid_weight
from kgtrace.prover.learn import learn_rule_file, state_path
from kgtrace.prover.neural import embedding_model
from kgtrace.prover.redundancy import learn_clusters
from kgtrace.prover.rules import RuleSet
from kgtrace.prover.scorer import HybridScorer

TARGETS = {"fb15k237": {"anyburl": 0.34, "safran": 0.389}, "wn18rr": {"anyburl": 0.49, "safran": 0.502}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="nations")
    parser.add_argument("--seconds", type=float, default=600.0, help="learning time (all reruns together)")
    parser.add_argument("--rounds", type=int, default=0, help="learn for this many rounds (0: for --seconds)")
    parser.add_argument("--paths-per-round", type=int, default=LearnConfig.paths_per_round,
                        help="training facts sampled per round")
    parser.add_argument("--meet-neighbours", type=int, default=LearnConfig.meet_neighbours,
                        help="cyclic paths of 2 and 3 steps also met in the middle (kgtrace rules learn's option)")
    parser.add_argument("--confidence-sample", type=int, default=LearnConfig.confidence_sample,
                        help="start entities whose groundings measure a cyclic rule (kgtrace rules learn's option)")
    parser.add_argument("--aggregations", default="maxplus,noisy_or")
    parser.add_argument("--test-triples", type=int, default=0, help="rank the first N test triples (0: all)")
    parser.add_argument("--embedding-run", type=Path,
                        help="also rank by the embedding run alone and by a hybrid of it with each aggregation but "
                             "maxplus: logit + w x the rules' score, w chosen on validation (kgtrace prove weigh's rule)")
    parser.add_argument("--hybrid-valid", type=int, default=2000,
                        help="validation triples the hybrid's weight is chosen on (0: all)")
    parser.add_argument("--work", type=Path, help="where the rules and their state are kept")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = resolved(args.device)
    torch.set_num_threads(args.threads)
    aggregations = args.aggregations.split(",")
    unknown = [a for a in aggregations if a not in AGGREGATIONS]
    if unknown:
        sys.exit(f"rules.py: error: --aggregations {','.join(unknown)}: choose from {', '.join(AGGREGATIONS)}")
    work = args.work or Path("benchmarks/runs") / f"rules-{args.dataset}"
    work.mkdir(parents=True, exist_ok=True)
    config = LearnConfig(seconds=args.seconds, rounds=args.rounds, paths_per_round=args.paths_per_round,
                         meet_neighbours=args.meet_neighbours, confidence_sample=args.confidence_sample)
    ds = load_dataset(args.dataset)

    start = time.perf_counter()
    learned = learn_rule_file(args.dataset, work / "rules.txt", config, log=lambda line: print(line, file=sys.stderr))
    learn_wall = time.perf_counter() - start
    learn_seconds = json.loads(state_path(work / "rules.txt").read_text())["seconds"]  # over every rerun
    rules = RuleSet(tuple(m.rule for m in learned), ds.num_relations)
    test = ds.test[: args.test_triples] if args.test_triples else ds.test
    graph = DirectedGraph.of(ds.train, ds.num_entities, ds.num_relations)
    written = raw_lines(split_path(ds, "test"))  # test triples as distributed, before the unseen are left out
    known_valid = AnswerIndex.build(ds.known_triples("valid"), ds.num_relations)
    embedding = embedding_model(str(args.embedding_run), ds, device) if args.embedding_run else None
    ranked = {}
    if embedding is not None:  # the hybrid's other part, alone
        start = time.perf_counter()
        metrics = evaluate(embedding, test, known=ds.all_triples())
        ranked["embedding"] = metric_row(metrics, time.perf_counter() - start, written, args.test_triples)
    for aggregation in aggregations:
        start = time.perf_counter()
        clusters = None
        if aggregation == "nr_noisy_or":  # SAFRAN's clusters of redundant rules, chosen on the validation split
            clusters = learn_clusters(graph, rules, ds.valid, known_valid,
                                      log=lambda line: print(line, file=sys.stderr))
        cluster_seconds = time.perf_counter() - start
        scorer = RuleScorer(graph, rules, aggregation, clusters=clusters)
        metrics = evaluate(scorer, test, known=ds.all_triples())
        ranked[aggregation] = metric_row(metrics, time.perf_counter() - start, written, args.test_triples)
        if clusters is not None:
            ranked[aggregation]["clusters"] = cluster_summary(clusters, cluster_seconds)
        if embedding is not None and aggregation != "maxplus":  # maxplus's scores are ranking keys, not evidence
            start = time.perf_counter()
            valid = ds.valid[: args.hybrid_valid] if args.hybrid_valid else ds.valid
            choice = choose_hybrid_weight(scorer, embedding, valid.to(device), known_valid)
            metrics = evaluate(HybridScorer(scorer, embedding, choice.weight), test, known=ds.all_triples())
            ranked[f"hybrid-{aggregation}"] = {**metric_row(metrics, time.perf_counter() - start, written,
                                                            args.test_triples),
                                              "weight": choice.weight, "weight_choice": choice.to_dict()}
    for name, row in ranked.items():
        print(f"{name}: MRR {row['mrr']:.4f}, Hits@1 {row['hits_at'][1]:.4f}, Hits@10 {row['hits_at'][10]:.4f} "
              f"({row['seconds']:.0f} s)", file=sys.stderr)
    result = {
        "dataset": args.dataset, "test_triples": len(test), "test_triples_written": written,
        "device": str(device), "threads": args.threads,
        "processor": processor_name(), "learn": {**asdict(config), "seconds_spent": round(learn_seconds, 1),
                                                 "wall_this_run": round(learn_wall, 1)},
        "rules": {"total": len(learned), "with_constants": sum(m.rule.has_constants for m in learned),
                  "by_length": {n: sum(len(m.rule.body) == n for m in learned) for n in (1, 2, 3)}},
        "ranked": ranked, "targets": TARGETS.get(args.dataset, {}),
        "total_minutes": round((learn_seconds + sum(r["seconds"] for r in ranked.values())) / 60, 1),
        "command": "python benchmarks/rules.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


def metric_row(metrics, seconds: float, written: int | None, test_triples: int) -> dict:
    """A ranking's filtered metrics (realistic ties) and seconds; ``mrr_all_test`` counts the test triples left out at
    load at reciprocal rank 0 (when the whole split was ranked)."""
    both = metrics.both.realistic
    row = {"mrr": both.mrr, "hits_at": both.hits_at, "head_mrr": metrics.sides["head"].realistic.mrr,
           "tail_mrr": metrics.sides["tail"].realistic.mrr, "seconds": round(seconds, 1)}
    if written and not test_triples:
        row["mrr_all_test"] = both.mrr * metrics.num_queries / written  # num_queries: the triples ranked
    return row


def cluster_summary(clusters: RuleClusters, seconds: float) -> dict:
    """How the clusters were chosen: the seconds (included in the aggregation's), the query relations by threshold,
    and the rules in clusters of two or more."""
    thresholds = Counter(clusters.thresholds.values())
    return {"seconds": round(seconds, 1), "query_relations": len(clusters.thresholds),
            "by_threshold": {str(t): thresholds[t] for t in sorted(thresholds)},
            "rules_in_clusters": sum(len(g) for groups in clusters.groups.values() for g in groups if len(g) > 1)}


def raw_lines(path: str) -> int | None:
    """Non-blank lines of a split's file; None for a bundled dataset (no file to count)."""
    file = Path(path)
    return sum(1 for line in file.open(encoding="utf-8") if line.strip()) if file.is_file() else None


if __name__ == "__main__":
    raise SystemExit(main())
