"""kgtrace evaluate, predict, score and summarize."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kgtrace.cli.common import (
    add_restrict_arg,
    candidates_label,
    check_run_outputs,
    compile_stats_path,
    indexed_outputs,
    memory_budget,
    named_output,
    output_lock,
    output_problems,
    print_evaluation,
    run_dataset_inputs,
)
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.io import check_json_out
from kgtrace.core.layout import RunLayout
from kgtrace.core.owned import Output, check_outputs

if TYPE_CHECKING:
    pass


def add_evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train")
    p.add_argument("--checkpoint", default="best", help="best, last, or a checkpoint file")
    p.add_argument("--split", choices=("test", "valid"), default="test",
                   help="which split to rank (test is filtered by train+valid+test, valid by train+valid)")
    p.add_argument("--corruptions", type=int, default=0, metavar="K",
                   help="rank against K sampled filtered corruptions per query instead of all entities (0: all)")
    p.add_argument("--modes", default="head,tail", help="sides to rank: head, tail or head,tail")
    add_restrict_arg(p)
    p.add_argument("--ks", default="1,3,10", help="k of Hits@k, comma-separated")
    p.add_argument("--memory-budget", default="2GB", help="memory for scores while ranking, e.g. 2GB")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled corruptions")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="rank all entities through torch.compile with static buffers (default: on CUDA only; "
                        "on a CPU it costs seconds of compiling, which pays back only on large graphs: 1.35x faster "
                        "at 1.1M entities). A failed compilation is an error, never a silent fallback")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="rank eagerly")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to score")
    p.add_argument("--per-query", metavar="FILE", help="write each query's ranks and true score (.tsv or .parquet)")
    p.add_argument("--histogram", metavar="FILE.png", help="write a histogram of the realistic ranks")
    p.add_argument("--out", help="write the metrics as JSON to this file")


@dataclass(frozen=True)
class EvaluateOptions:
    """kgtrace evaluate's parsed options."""

    sides: tuple[str, ...]  # "head" and/or "tail", in the order given
    ks: tuple[int, ...]  # k of each Hits@k, each 1 or more
    memory_budget: int  # bytes, 1 or more


# The files kgtrace evaluate writes: option attribute, accepted suffixes, what is written, an example name.
EVALUATE_OUTPUTS = (("out", (".json",), "the metrics JSON", "metrics.json"),
                    ("per_query", (".tsv", ".parquet"), "the per-query table", "ranks.tsv"),
                    ("histogram", (".png",), "the PNG histogram", "ranks.png"))


def evaluate_options(args: argparse.Namespace) -> EvaluateOptions:
    """Check every option of kgtrace evaluate before any work, its output files included (so that a refused
    command writes nothing); ConfigError lists every bad one at once."""
    problems = []
    sides = tuple(x.strip() for x in args.modes.split(",") if x.strip())
    if not sides or set(sides) - {"head", "tail"}:
        problems.append(f"--modes {args.modes!r}: each side must be head or tail; fix: e.g. --modes head,tail")
    items = [x.strip() for x in args.ks.split(",") if x.strip()]
    if not items or not all(x.isdigit() and int(x) >= 1 for x in items):
        problems.append(f"--ks {args.ks!r}: each k of Hits@k must be a whole number, 1 or more; fix: e.g. --ks 1,3,10")
    if args.corruptions < 0:
        problems.append(f"--corruptions {args.corruptions}: must be 0 (all entities) or more")
    budget, budget_problems = memory_budget(args.memory_budget)
    problems += budget_problems + output_problems(args, EVALUATE_OUTPUTS)
    if problems:
        raise ConfigError(problems)
    return EvaluateOptions(sides=sides, ks=tuple(int(x) for x in items), memory_budget=budget)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from kgtrace.compute.compile import compile_default
    from kgtrace.compute.system import resolve_device
    from kgtrace.evaluation.candidates import check_restrict
    from kgtrace.workflows.any_run import load_any_run

    options = evaluate_options(args)
    sides, ks, budget = options.sides, options.ks, options.memory_budget
    device = resolve_device(args.device)
    prover = RunLayout(args.run_dir).kind == "prover"
    if prover and args.world.distributed:
        raise KgtraceError(f"{args.run_dir}: a prover run is evaluated in one process (its overflow counts are "
                           "per process). Fix: run this command without torchrun")
    # A prover run compiles its engine's step and its policy's beam search (--compile, or its own setting);
    # ranking itself runs eagerly.
    run = load_any_run(args.run_dir, args.checkpoint, device, compile=args.compile)
    ds = run.dataset
    layout = RunLayout(args.run_dir)
    check_run_outputs(args.run_dir, run.config.dataset, [*named_output(args.out, "--out"),
                      *named_output(args.per_query, "--per-query"), *named_output(args.histogram, "--histogram")],
                      writes=(layout.test_metrics, layout.test_ranks))  # evaluate writes the run's test metrics
    if not len(getattr(ds, args.split)):
        raise KgtraceError(f"{ds.source}: the dataset has no {args.split} triples (a run imported from PyKEEN without "
                           "--dataset has training triples only). Fix: re-import it with --dataset, or choose --split")
    check_restrict(args.restrict)  # a malformed rule is refused at once (rank_run checks its names, then ranks)
    compile_ = not prover and compile_default(device, args.compile)
    with output_lock(args.out, args.world):
        return evaluate_loaded(args, run, prover, compile_, sides, ks, budget)


def evaluate_loaded(args: argparse.Namespace, run, prover: bool, compile_: bool, sides: tuple, ks: tuple,
                    budget: int) -> int:
    """Rank the loaded run as evaluate's options say, write and print the metrics."""
    from kgtrace.compute.compile import logged_compilation
    from kgtrace.evaluation.run_metrics import rank_run, write_evaluation

    with logged_compilation(compile_stats_path(args.out, Path(args.run_dir) / "evaluate.json"),
                            (compile_ or (prover and run.config.compile)) and args.world.is_main):
        evaluation = rank_run(run, args.split, restrict=args.restrict, corruptions=args.corruptions, seed=args.seed,
                              compile=compile_, sides=sides, ks=ks, memory_budget=budget, world=args.world)
    extra = {}
    if prover:
        from kgtrace.prover.scorer import prover_report

        extra["prover"] = prover_report(run.model).to_dict()
        print(f"prover: {json.dumps(extra['prover'])}")
    if args.world.is_main:
        title = f"{run.path.name}: {args.split}, candidates {candidates_label(evaluation.metrics)}"
        write_evaluation(run, evaluation, out=args.out, per_query=args.per_query, histogram=args.histogram,
                         title=title, extra=extra)
    print_evaluation(evaluation, args.split)
    return 0


def add_predict_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train")
    p.add_argument("--relation", required=True, metavar="REL",
                   help="the query's relation: label or id; for KGX data also the predicate (biolink:treats) or "
                        "its description with qualifiers, when that names one relation")
    anchor = p.add_mutually_exclusive_group(required=True)
    anchor.add_argument("--head", metavar="HEAD", help="rank tails of (HEAD, REL, ?) (label or id)")
    anchor.add_argument("--tail", metavar="TAIL", help="rank heads of (?, REL, TAIL) (label or id)")
    p.add_argument("--top-n", type=int, default=20, help="candidates to list")
    p.add_argument("--new-only", action="store_true", help="hide candidates whose triple is in train, valid or test")
    p.add_argument("--category", help="only candidates of this node category (from the dataset's node categories)")
    add_restrict_arg(p)
    p.add_argument("--checkpoint", default="best", help="best, last, or a checkpoint file")
    p.add_argument("--out", metavar="FILE.json", help="also write the candidates as JSON, with a TSV beside it")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to score")


def cmd_predict(args: argparse.Namespace) -> int:
    from kgtrace.compute.system import resolve_device
    from kgtrace.evaluation.candidates import restriction_note
    from kgtrace.evaluation.predict import predict, write_table
    from kgtrace.runs.embedding import load_run

    if args.out:
        check_json_out(args.out)
    run = load_run(args.run_dir, args.checkpoint, device=resolve_device(args.device))
    check_run_outputs(args.run_dir, run.config.dataset, indexed_outputs(args.out))
    found = predict(run, relation=args.relation, head=args.head, tail=args.tail, top_n=args.top_n,
                    new_only=args.new_only, category=args.category, restrict=args.restrict)
    q = found.query
    relation = q.relation if q.relation_name == q.relation else f"{q.relation_name} ({q.relation})"
    if found.note != restriction_note(None):  # restricted by category: the first line says so
        print(found.note)
    head, tail = named(run.dataset, q.head), named(run.dataset, q.tail)
    print(f"({head}, {relation}, {tail}): best {found.table.height} {q.side}s"
          f"{' (new only)' if args.new_only else ''}")
    width = max([len("category"), *(len(short_category(c)) for c in found.table["categories"])])
    print(f"{'rank':>4}  {'score':>9}  {'known':<5}  {'category':<{width}}  candidate")
    for row in found.table.iter_rows(named=True):
        where = ",".join(s for s in ("train", "valid", "test") if row[f"in_{s}"]) or "-"
        name = f"  ({row['name']})" if row["name"] != row["label"] else ""
        print(f"{row['rank']:>4}  {row['score']:9.4f}  {where:<5}  {short_category(row['categories']):<{width}}  "
              f"{row['label']}{name}")
    if args.out:
        print(f"wrote {args.out} and {write_table(found.table, args.out, {'query': q.to_dict(), 'candidates': found.note})}")
    return 0


def named(dataset, label: str | None) -> str:
    """An entity of a query as people read it: 'metformin (CHEBI:6801)', the label alone without a name, '?' when asked."""
    if label is None:
        return "?"
    name = dataset.entity_name(label)
    return label if name == label else f"{name} ({label})"


def short_category(categories: str) -> str:
    """A candidate's first category without its CURIE prefix (``biolink:Disease`` -> Disease); '-' for none."""
    first = categories.split("|")[0]
    return first.rpartition(":")[2] or "-"


def add_score_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train")
    p.add_argument("--triples", required=True, metavar="FILE",
                   help="labelled triples to score, head<TAB>relation<TAB>tail per line")
    p.add_argument("--checkpoint", default="best", help="best, last, or a checkpoint file")
    p.add_argument("--memory-budget", default="2GB", help="memory for scores while ranking, e.g. 2GB")
    add_restrict_arg(p)
    p.add_argument("--out", metavar="FILE.json", help="JSON to write, with a TSV beside it (default: print only)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to score")


def cmd_score(args: argparse.Namespace) -> int:
    from kgtrace.compute.system import resolve_device
    from kgtrace.evaluation.candidates import restriction_note
    from kgtrace.evaluation.predict import score_triples, write_table
    from kgtrace.runs.embedding import load_run

    budget, problems = memory_budget(args.memory_budget)
    if problems:
        raise ConfigError(problems)
    if args.out:
        check_json_out(args.out)
    run = load_run(args.run_dir, args.checkpoint, device=resolve_device(args.device))
    check_run_outputs(args.run_dir, run.config.dataset, indexed_outputs(args.out), reads=(args.triples,))
    scored = score_triples(run, args.triples, memory_budget=budget, restrict=args.restrict)
    if scored.note != restriction_note(None):  # ranked among a relation's categories: the first line says so
        print(scored.note)
    for skip in scored.skipped[:10]:
        print(f"{args.triples}:{skip.line}: skipped: {skip.problem}", file=sys.stderr)
    if len(scored.skipped) > 10:
        print(f"... {len(scored.skipped) - 10} more skipped lines (all of them in the JSON with --out)", file=sys.stderr)
    print(f"{'line':>6}  {'score':>9}  {'h-rank':>7}  {'t-rank':>7}  {'known':<5}  triple")
    for row in scored.table.head(50).iter_rows(named=True):
        print(f"{row['line']:>6}  {row['score']:9.4f}  {row['head_rank']:7g}  {row['tail_rank']:7g}  "
              f"{'yes' if row['known'] else 'no':<5}  {row['head_name']} --{row['relation_name']}--> {row['tail_name']}")
    if scored.table.height > 50:
        print(f"(showing 50 of {scored.table.height} scored triples; use --out for all of them)")
    print(f"scored {scored.table.height} triples, skipped {len(scored.skipped)} lines with unknown labels")
    if args.out:
        extra = {"candidates": scored.note, "skipped": [skip.to_dict() for skip in scored.skipped]}
        print(f"wrote {args.out} and {write_table(scored.table, args.out, extra)}")
    return 0



def add_summarize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders with config.yaml and a metrics JSON")
    p.add_argument("--out", required=True, metavar="FILE.tsv", help="the table: one row per run")
    p.add_argument("--plot", metavar="FILE.png", help="also a plot of test MRR per dataset and model")
    p.add_argument("--metrics", default="test_metrics.json",
                   help="each run's metrics file, as kgtrace evaluate --out or kgtrace train wrote it")


def cmd_summarize(args: argparse.Namespace) -> int:
    from kgtrace.evaluation.summary import plot_summary, summarize_runs, write_summary

    table = summarize_runs(args.run_dirs, args.metrics)  # reads only: every run has its config and metrics
    check_outputs([Output(Path(args.out), "--out", ".tsv"), *([Output(Path(args.plot), "--plot", ".png")]
                                                              if args.plot else [])],
                  pinned=[p for run in args.run_dirs for p in (*RunLayout(run).pinned(), *run_dataset_inputs(run))],
                  reads=[Path(run) / args.metrics for run in args.run_dirs])
    write_summary(table, args.out)
    if args.plot:
        plot_summary(table, args.plot)
    print(table)
    print(f"wrote {args.out}" + (f" and {args.plot}" if args.plot else ""))
    return 0


