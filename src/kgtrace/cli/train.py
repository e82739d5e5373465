"""kgtrace run, prepare and train."""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from dataclasses import fields
from pathlib import Path

from kgtrace.cli.common import add_restrict_arg, model_args, print_evaluation, train_help
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="umls", help=train_help("dataset"))
    p.add_argument("--out", help="run folder (default: runs/DATASET-MODEL); an existing one is reused step by step")
    p.add_argument("--model", default="conve", help=train_help("model"))
    p.add_argument("--epochs", type=int, default=100, help=train_help("epochs") + " (a checkpoint every fifth of them)")
    p.add_argument("--steps-per-epoch", type=int, default=0, help=train_help("steps_per_epoch"))
    p.add_argument("--seed", type=int, default=0, help=train_help("seed"))
    p.add_argument("--threads", type=int, default=0, help=train_help("threads"))
    p.add_argument("--explain", type=int, default=3, help="well-predicted test triples to explain")
    p.add_argument("--queries", type=int, default=2, help="test queries whose best new tails are explained")
    p.add_argument("--overwrite", action="store_true", help="start afresh, replacing the run in --out")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide progress bars")
    add_restrict_arg(p)


def cmd_run(args: argparse.Namespace) -> int:
    from kgtrace.workflows.job import JobSettings, run_job

    settings = JobSettings(dataset=args.dataset, model=args.model, epochs=args.epochs,
                           steps_per_epoch=args.steps_per_epoch, seed=args.seed, threads=args.threads,
                           explain_triples=args.explain, predict_queries=args.queries, restrict=tuple(args.restrict))
    out = Path(args.out) if args.out else Path("runs") / f"{Path(args.dataset).name}-{args.model}"
    report = run_job(settings, out, overwrite=args.overwrite, progress=args.progress)
    print(f"open {report} in a browser")
    return 0



def add_prepare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="dataset folder to write (must not exist or be empty)")
    p.add_argument("--triples", help="labelled triples, head<TAB>relation<TAB>tail (alternative to --nodes/--edges)")
    p.add_argument("--nodes", help="KGX nodes file (.tsv or .jsonl, optionally .gz)")
    p.add_argument("--edges", help="KGX edges file (.tsv or .jsonl, optionally .gz)")
    p.add_argument("--category-pair", action="append", default=[], metavar="CAT1,CAT2",
                   help="keep only edges between these node categories, either direction (repeatable)")
    p.add_argument("--drop-predicate", action="append", default=[], metavar="PREDICATE",
                   help="drop edges with this predicate, e.g. biolink:subclass_of (repeatable)")
    p.add_argument("--no-fold-qualifiers", dest="fold_qualifiers", action="store_false",
                   help="use the bare predicate as relation instead of folding qualifiers into it")
    p.add_argument("--split", choices=("random", "predicate"), default="random",
                   help="random train/valid/test split, or hold out the edges of --holdout-predicate as test")
    p.add_argument("--fractions", default="0.8,0.1,0.1", help="train,valid,test fractions for --split random")
    p.add_argument("--holdout-predicate", help="relation whose edges become the test split (--split predicate)")
    p.add_argument("--holdout-fraction", type=float, default=1.0,
                   help="fraction of --holdout-predicate's edges put in test; the rest stay in train so the "
                        "model can learn the relation (1.0: all of them)")
    p.add_argument("--names", help="node-name file (name<TAB>id or id<TAB>name) for --triples input")
    p.add_argument("--seed", type=int, default=0, help="random seed of the split")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset folder")


def cmd_prepare(args: argparse.Namespace) -> int:
    from kgtrace.data.prepare import prepare

    pairs, problems = [], []
    for text in args.category_pair:
        parts = [x.strip() for x in text.split(",")]
        if len(parts) != 2 or not all(parts):
            problems.append(f"--category-pair {text!r}: write two categories separated by a comma, "
                            "e.g. biolink:ChemicalEntity,biolink:Disease")
        pairs.append(tuple(parts))
    try:
        fractions = tuple(float(x) for x in args.fractions.split(","))
    except ValueError:
        problems.append(f"--fractions {args.fractions!r}: write three numbers, e.g. 0.8,0.1,0.1")
        fractions = ()
    if problems:
        raise ConfigError(problems)
    report = prepare(args.out, triples=args.triples, nodes=args.nodes, edges=args.edges, category_pairs=pairs,
                     drop_predicates=args.drop_predicate, fold_qualifiers=args.fold_qualifiers, split=args.split,
                     fractions=fractions, holdout_predicate=args.holdout_predicate,
                     holdout_fraction=args.holdout_fraction, names=args.names,
                     seed=args.seed, overwrite=args.overwrite)
    print(report.summary())
    return 0


def add_train_args(p: argparse.ArgumentParser) -> None:
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        if f.name == "model_args":
            continue
        if str(f.type) in ("bool", "bool | None"):
            default = getattr(defaults, f.name)  # None: the field's help says what unset means
            p.add_argument("--" + f.name.replace("_", "-"), action=argparse.BooleanOptionalAction, default=None,
                           help=train_help(f.name) + ("" if default is None else f" (default: {str(default).lower()})"))
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None,
                       help=f"{train_help(f.name)} (default: {getattr(defaults, f.name)})")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a model constructor argument, e.g. embedding_dim=200 (repeatable; values parsed as YAML)")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--config", help="YAML file of settings; command-line options override it")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest checkpoint (only --epochs, --patience, "
                        "--device, --threads, --compile and --captured-step may change)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bars")
    add_restrict_arg(p)


def cmd_train(args: argparse.Namespace) -> int:
    from kgtrace.core.config import from_sources, read_yaml
    from kgtrace.evaluation.candidates import check_restrict
    from kgtrace.evaluation.run_metrics import write_test_metrics
    from kgtrace.runs.embedding import load_run
    from kgtrace.training.loop import resume, train

    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.name != "model_args"}
    if args.model_arg:
        overrides["model_args"] = model_args(args.model_arg)
    check_restrict(args.restrict)  # before training: a malformed rule would fail only at the end
    if args.resume and args.overwrite:
        raise ConfigError(["--resume with --overwrite: choose one; --resume continues the run in --out, "
                           "--overwrite replaces it with a new one"])
    # The run's lock is held from training to its test metrics: no other process writes between them.
    with ExitStack() as hold:
        if args.resume:
            given = {**(read_yaml(args.config) if args.config else {}),
                     **{k: v for k, v in overrides.items() if v is not None}}
            result = resume(args.out, progress=args.progress, world=args.world, hold=hold, **given)
        else:
            config = from_sources(TrainConfig, args.config, overrides)
            print("config:", json.dumps(config.to_dict()))
            result = train(config, args.out, overwrite=args.overwrite, progress=args.progress, world=args.world,
                           inputs=(args.config,) if args.config else (), hold=hold)
        print(f"trained {result.epochs_completed} epochs into {result.run_dir}"
              + (f"; best validation MRR {result.best_valid_mrr:.4f} at epoch {result.best_epoch}"
                 if result.best_epoch else ""))
        evaluation = write_test_metrics(load_run(result.run_dir), restrict=args.restrict, world=args.world)
    print_evaluation(evaluation, "test")
    return 0


