"""The ``kgtrace`` command: one subcommand, one function; the work lives in the packages.

Errors a user can fix print as one message and exit with status 2; an
unexpected error prints one line too (set KGTRACE_DEBUG=1 for its traceback).
Launched by torchrun, evaluate, explain and train split their work over the processes
(kgtrace.distributed); only rank 0 prints and writes, and errors name the rank.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kgtrace.config import PRECISIONS, TrainConfig, parse_size
from kgtrace.distributed import ONE, StoppedByPeer, World, session
from kgtrace.errors import ConfigError, DataWarning, KgtraceError
from kgtrace.io import check_json_out, check_outputs_spare_inputs
from kgtrace.registry import model_names, spec_named

if TYPE_CHECKING:  # torch is imported lazily: --help stays fast
    from torch import Tensor

    from kgtrace.evaluation.evaluate import Metrics
    from kgtrace.prover.config import ProverConfig

TRAIN_HELP = {
    "dataset": "bundled dataset (umls, kinships, nations) or a dataset folder",
    "model": "model: " + " | ".join(model_names()),
    "epochs": "number of epochs",
    "batch_size": "queries per optimizer step",
    "lr": "Adam learning rate",
    "lr_decay": "multiply the learning rate by this after each epoch (1.0: constant)",
    "weight_decay": "Adam weight decay",
    "label_smoothing": "label smoothing of the 1-N BCE loss",
    "training": "kvsall (all known answers of a query are positives) or 1vsall (softmax per triple)",
    "entity_chunk": "compute the KvsAll loss in entity chunks of this size to bound memory (0: off)",
    "seed": "random seed (weights, query order, dropout)",
    "device": "auto (CUDA when available), cpu or cuda",
    "precision": "fp32, bf16 (autocast) or fp16 (autocast with a gradient scaler, CUDA only)",
    "checkpoint_every": "save a checkpoint every K epochs (the last epoch is always saved)",
    "eval_every": "validate every K epochs (0: never)",
    "patience": "stop after this many validations without improvement (0: never)",
    "threads": "CPU threads for torch (0: torch's default)",
    "memory_budget": "memory for ranking during validation, e.g. 2GB",
    "compile": "run the training step and validation ranking through torch.compile (same results as eager; "
               "counters in RUN_DIR/compile_stats.json); --no-compile runs eagerly",
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "command"):
        parser.print_help()
        return 2
    where = ""  # " [rank R/N]" in a distributed job
    try:
        with session(args.subcommand) as world:
            where = f" [{world.label()}]" if world.distributed else ""
            args.world = world
            if not world.is_main and hasattr(args, "progress"):
                args.progress = False
            with data_warnings_as_lines(f"kgtrace {args.subcommand}{where}", show=world.is_main):
                return args.command(args) or 0
    except StoppedByPeer as e:  # another process failed and reports why
        print(f"kgtrace {args.subcommand}{where}: {e}", file=sys.stderr)
        return 2
    except KgtraceError as e:
        print(f"kgtrace {args.subcommand}{where}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kgtrace {args.subcommand}{where}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not a user error: one line unless asked for more
        if os.environ.get("KGTRACE_DEBUG"):
            raise
        hint = " If another process of the job failed first, its error is printed above." if where else ""
        print(f"kgtrace {args.subcommand}{where}: internal error: {type(e).__name__}: {e} "
              f"(set KGTRACE_DEBUG=1 to see the traceback, and please report it).{hint}", file=sys.stderr)
        return 1


@contextmanager
def data_warnings_as_lines(prefix: str, *, show: bool = True) -> Iterator[None]:
    """Print each DataWarning once, as one line like an error (not Python's file:line warning format).

    Once: a command may load the same dataset twice (train, then the test evaluation of the
    best checkpoint). ``show`` False (ranks other than 0) drops them: rank 0 reads the same data.
    """
    with warnings.catch_warnings():
        python_show = warnings.showwarning
        shown: set[str] = set()

        def show_warning(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, DataWarning):
                python_show(message, category, filename, lineno, file, line)
            elif show and str(message) not in shown:
                shown.add(str(message))
                print(f"{prefix}: warning: {message}", file=sys.stderr)

        warnings.showwarning = show_warning
        yield


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after each option's help, except where it would mislead or repeat.

    Left out when the help already states its default, when the default is None (the value
    then comes from a config file or the option's own help), and for on/off flags, whose
    stored default is the opposite of what the flag does (--no-progress would read "default: True").
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        flag = action.nargs == 0 and isinstance(action.const, bool)  # store_true / store_false (not --x/--no-x)
        if action.default in (None, argparse.SUPPRESS) or flag or "default" in text:
            return text
        return super()._get_help_string(action)


class RawHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """HelpFormatter with the epilog printed as written (lists and paths keep their lines)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kgtrace", description="Link prediction on knowledge graphs that shows why.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, add, function, summary in (
        ("run", add_run_args, cmd_run,
         "the whole path: train, evaluate, explain and write report.html into one run folder (reuses finished steps)"),
        ("prepare", add_prepare_args, cmd_prepare, "write a dataset folder from labelled triples or KGX files"),
        ("train", add_train_args, cmd_train, "train a model into a run folder and report filtered test metrics"),
        ("evaluate", add_evaluate_args, cmd_evaluate, "filtered rank metrics of a run on its test or valid split"),
        ("predict", add_predict_args, cmd_predict,
         "a model's best tails of (HEAD, REL, ?) or heads of (?, REL, TAIL), with names and which are already known"),
        ("score", add_score_args, cmd_score, "score a file of triples, with their filtered head and tail ranks"),
        ("summarize", add_summarize_args, cmd_summarize,
         "one table (TSV) and plot (PNG) of the test metrics of several runs"),
        ("explain", add_explain_args, cmd_explain,
         "TracIn: the training triples that most support or oppose predictions, or the most self-influential ones"),
        ("report", add_report_args, cmd_report,
         "one self-contained HTML page of a run: config, training curve, metrics, ranks and explanations"),
        ("index", add_index_args, cmd_index, "TracIn: project every training gradient once, for fast repeated queries"),
        ("doctor", add_doctor_args, cmd_doctor,
         "check every torch.compile entry point of a run: parity with eager, held outputs, no recompilation"),
        ("faithfulness", add_faithfulness_args, cmd_faithfulness,
         "are the explanations true? remove each prediction's top-k training triples, train again, measure the change"),
        ("import-pykeen", add_import_pykeen_args, cmd_import_pykeen,
         "a PyKEEN ConvE, DistMult or ComplEx (pipeline folder or checkpoints) as a kgtrace run with equal scores"),
        ("export-pykeen", add_export_pykeen_args, cmd_export_pykeen,
         "a kgtrace run as files PyKEEN loads (triples factories and state dicts) with equal scores"),
        ("rules", add_rules_args, cmd_rules, "Horn rules for the prover: mine them from a dataset's training triples"),
        ("prove", add_prove_args, cmd_prove,
         "a rule prover run (exhaustive search, or a learned policy), ranked by kgtrace evaluate like any run"),
    ):
        sub = commands.add_parser(name, help=summary, description=summary,
                                  formatter_class=HelpFormatter)
        add(sub)
        sub.set_defaults(command=function, subcommand=name)
    return parser


# ----------------------------------------------------------------------------- run


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="umls", help=TRAIN_HELP["dataset"])
    p.add_argument("--out", help="run folder (default: runs/DATASET-MODEL); an existing one is reused step by step")
    p.add_argument("--model", default="conve", help=TRAIN_HELP["model"])
    p.add_argument("--epochs", type=int, default=100, help=TRAIN_HELP["epochs"] + " (a checkpoint every fifth of them)")
    p.add_argument("--seed", type=int, default=0, help=TRAIN_HELP["seed"])
    p.add_argument("--threads", type=int, default=0, help=TRAIN_HELP["threads"])
    p.add_argument("--explain", type=int, default=3, help="well-predicted test triples to explain")
    p.add_argument("--queries", type=int, default=2, help="test queries whose best new tails are explained")
    p.add_argument("--overwrite", action="store_true", help="start afresh, replacing the run in --out")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide progress bars")


def cmd_run(args: argparse.Namespace) -> int:
    from kgtrace.job import JobSettings, run_job

    settings = JobSettings(dataset=args.dataset, model=args.model, epochs=args.epochs, seed=args.seed,
                           threads=args.threads, explain_triples=args.explain, predict_queries=args.queries)
    out = Path(args.out) if args.out else Path("runs") / f"{Path(args.dataset).name}-{args.model}"
    report = run_job(settings, out, overwrite=args.overwrite, progress=args.progress)
    print(f"open {report} in a browser")
    return 0


# ----------------------------------------------------------------------------- prepare


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


# ----------------------------------------------------------------------------- train


def add_train_args(p: argparse.ArgumentParser) -> None:
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        if f.name == "model_args":
            continue
        if str(f.type) == "bool":
            p.add_argument("--" + f.name.replace("_", "-"), action=argparse.BooleanOptionalAction, default=None,
                           help=f"{TRAIN_HELP[f.name]} (default: {str(getattr(defaults, f.name)).lower()})")
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None,
                       help=f"{TRAIN_HELP[f.name]} (default: {getattr(defaults, f.name)})")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a model constructor argument, e.g. embedding_dim=200 (repeatable; values parsed as YAML)")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--config", help="YAML file of settings; command-line options override it")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest checkpoint (only --epochs, --patience, "
                        "--device, --threads and --compile may change)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bars")


def model_args(pairs: list[str]) -> dict[str, Any]:
    parsed, problems = {}, []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            problems.append(f"--model-arg {pair!r}: write KEY=VALUE, e.g. embedding_dim=200")
            continue
        parsed[key.strip()] = yaml.safe_load(value)
    if problems:
        raise ConfigError(problems)
    return parsed


def cmd_train(args: argparse.Namespace) -> int:
    from kgtrace.config import from_sources, read_yaml
    from kgtrace.owned import folder_lock
    from kgtrace.training.loop import resume, train

    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.name != "model_args"}
    if args.model_arg:
        overrides["model_args"] = model_args(args.model_arg)
    if args.resume:
        if args.overwrite:
            raise ConfigError(["--resume with --overwrite: choose one; --resume continues the run in --out, "
                               "--overwrite replaces it with a new one"])
        given = {**(read_yaml(args.config) if args.config else {}), **{k: v for k, v in overrides.items() if v is not None}}
        result = resume(args.out, progress=args.progress, world=args.world, **given)
    else:
        config = from_sources(TrainConfig, args.config, overrides)
        print("config:", json.dumps(config.to_dict()))
        result = train(config, args.out, overwrite=args.overwrite, progress=args.progress, world=args.world,
                       inputs=(args.config,) if args.config else ())
    print(f"trained {result.epochs_completed} epochs into {result.run_dir}"
          + (f"; best validation MRR {result.best_valid_mrr:.4f} at epoch {result.best_epoch}"
             if result.best_epoch else ""))
    metrics = evaluate_run(result.run_dir, "test", world=args.world)
    if args.world.is_main:
        with folder_lock(result.run_dir, "run folder"):
            write_json(metrics.to_dict(), Path(result.run_dir) / "test_metrics.json")
    print_metrics(metrics, "test")
    return 0


# ----------------------------------------------------------------------------- evaluate


def add_evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train")
    p.add_argument("--checkpoint", default="best", help="best, last, or a checkpoint file")
    p.add_argument("--split", choices=("test", "valid"), default="test",
                   help="which split to rank (test is filtered by train+valid+test, valid by train+valid)")
    p.add_argument("--corruptions", type=int, default=0, metavar="K",
                   help="rank against K sampled filtered corruptions per query instead of all entities (0: all)")
    p.add_argument("--modes", default="head,tail", help="sides to rank: head, tail or head,tail")
    p.add_argument("--restrict", action="append", default=[], metavar="RULE",
                   help="restrict candidates by node category: 'typed' infers each relation's domain and range "
                        "from training, or RELATION:tail=CAT1|CAT2 (repeatable)")
    p.add_argument("--ks", default="1,3,10", help="k of Hits@k, comma-separated")
    p.add_argument("--memory-budget", default="2GB", help="memory for scores while ranking, e.g. 2GB")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled corruptions")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="rank all entities through torch.compile with static buffers (default: on CUDA only; "
                        "on a CPU it costs seconds of compiling for no gain). A failed compilation is an error, "
                        "never a silent fallback")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="rank eagerly")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to score")
    p.add_argument("--per-query", metavar="FILE", help="write each query's ranks and true score (.tsv or .parquet)")
    p.add_argument("--histogram", metavar="FILE.png", help="write a histogram of the realistic ranks")
    p.add_argument("--out", help="write the metrics as JSON to this file")


def parse_list(text: str, key: str, convert=str, allowed: tuple = ()) -> tuple:
    items = [x.strip() for x in text.split(",") if x.strip()]
    try:
        values = tuple(convert(x) for x in items)
    except ValueError:
        raise ConfigError([f"{key} {text!r}: write comma-separated values, e.g. 1,3,10"]) from None
    bad = [v for v in values if allowed and v not in allowed]
    if not values or bad:
        raise ConfigError([f"{key} {text!r}: each value must be one of {', '.join(map(str, allowed))}"])
    return values


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
    try:
        budget = parse_size(args.memory_budget)
    except ValueError:
        budget = 0
    if budget < 1:
        problems.append(f"--memory-budget {args.memory_budget!r}: not a size of 1 byte or more; "
                        "fix: e.g. --memory-budget 2GB (or 512MB, or a byte count)")
    problems += output_problems(args, EVALUATE_OUTPUTS)
    if problems:
        raise ConfigError(problems)
    return EvaluateOptions(sides=sides, ks=tuple(int(x) for x in items), memory_budget=budget)


def output_problems(args: argparse.Namespace, outputs: tuple) -> list[str]:
    """Output files given as folders, or with a suffix that does not say what they hold."""
    problems = []
    for name, suffixes, what, example in outputs:
        path = getattr(args, name)
        option = "--" + name.replace("_", "-")
        if path is None:
            continue
        if Path(path).is_dir():
            problems.append(f"{option} {path}: is a folder; fix: name a file for {what}, e.g. "
                            f"{option} {Path(path) / example}")
        elif Path(path).suffix.lower() not in suffixes:
            problems.append(f"{option} {path}: {what} needs a file name ending in {' or '.join(suffixes)}; "
                            f"fix: e.g. {option} {example}")
    return problems


def cmd_evaluate(args: argparse.Namespace) -> int:
    from kgtrace.evaluation.evaluate import Candidates
    from kgtrace.prover.run import is_prover_run, load_prover_run
    from kgtrace.run import load_run
    from kgtrace.system import resolve_device

    options = evaluate_options(args)
    sides, ks, budget = options.sides, options.ks, options.memory_budget
    device = resolve_device(args.device)
    prover = is_prover_run(args.run_dir)
    if prover and args.world.distributed:
        raise KgtraceError(f"{args.run_dir}: a prover run is evaluated in one process (its overflow counts are "
                           "per process). Fix: run this command without torchrun")
    # A prover run compiles its engine's step and its policy's beam search (--compile, or its own setting);
    # ranking itself runs eagerly.
    run = (load_prover_run(args.run_dir, args.checkpoint, device, compile=args.compile) if prover
           else load_run(args.run_dir, args.checkpoint, device=device))
    ds = run.dataset
    if not len(getattr(ds, args.split)):
        raise KgtraceError(f"{ds.source}: the dataset has no {args.split} triples (a run imported from PyKEEN without "
                           "--dataset has training triples only). Fix: re-import it with --dataset, or choose --split")
    compile_ = not prover and (device.type == "cuda" if args.compile is None else args.compile)
    candidates = Candidates(args.corruptions, args.seed, restriction_of(ds, args.restrict), compile_)
    with output_lock(args.out, args.world):
        return evaluate_loaded(args, run, prover, candidates, sides, ks, budget)


def output_lock(path: str | Path | None, world: World):
    """The lock of a result file rank 0 writes (nothing to hold without one, or in the other processes)."""
    from kgtrace.owned import file_lock

    return file_lock(path) if path and world.is_main else contextlib.nullcontext()


def evaluate_loaded(args: argparse.Namespace, run, prover: bool, candidates, sides: tuple, ks: tuple,
                    budget: int) -> int:
    """Rank the loaded run as evaluate's options say, write and print the metrics."""
    from kgtrace.compile import logged_compilation
    from kgtrace.evaluation.evaluate import metrics_of
    from kgtrace.evaluation.sharded import rank_queries_sharded

    ds = run.dataset
    compile_ = candidates.compile
    known = ds.known_triples(args.split)
    with logged_compilation(compile_stats_path(args.out, Path(args.run_dir) / "evaluate.json"),
                            (compile_ or (prover and run.config.compile)) and args.world.is_main):
        ranks = rank_queries_sharded(run.model, getattr(ds, args.split), world=args.world, known=known, sides=sides,
                                     candidates=candidates, memory_budget=budget)
    metrics = metrics_of(ranks, ks)
    document = metrics.to_dict()
    if prover:
        from kgtrace.prover.scorer import prover_report

        document["prover"] = prover_report(run.model)
        print(f"prover: {json.dumps(document['prover'])}")
    if args.world.is_main:
        write_outputs(args, run, ranks, metrics, document)
    print_metrics(metrics, args.split)
    return 0


def compile_stats_path(out: str | Path | None, default: Path) -> Path:
    """Where a command's compile counters go: beside its JSON output (OUT.compile_stats.json)."""
    out = Path(out) if out else default
    return out.with_name(out.stem + ".compile_stats.json")


def restriction_of(dataset, rules: list[str]):
    """None, the inferred ('typed') restriction, or explicit RELATION:side=CATS rules."""
    if not rules:
        return None
    from kgtrace.evaluation import candidates as cand

    if rules == ["typed"]:
        return cand.infer_restriction(dataset)
    return cand.explicit_restriction(dataset, cand.parse_restrict(rules))


def write_outputs(args: argparse.Namespace, run, ranks, metrics: Metrics, document: dict) -> None:
    """The per-query table and the histogram, then the metrics JSON (``document``: metrics.to_dict() and, for a
    prover, its report), last: present only beside its companions."""
    from kgtrace.owned import retire

    if args.out:
        retire(args.out)  # first: the old JSON is never read beside new companions
    if args.per_query:
        from kgtrace.evaluation.output import query_table, write_query_table

        write_query_table(query_table(ranks, run.model, run.dataset.entities, run.dataset.relations), args.per_query)
    if args.histogram:
        from kgtrace.plots import rank_histogram

        rank_histogram({side: c.rank("realistic").numpy() for side, c in ranks.counts.items()}, args.histogram,
                       title=f"{run.path.name}: {args.split}, candidates {candidates_label(metrics)}")
    if args.out:
        write_json(document, args.out)


# ----------------------------------------------------------------------------- report


def add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (with test_metrics.json, test_ranks.tsv and "
                                                     "explain/*.json where written)")
    p.add_argument("--out", metavar="FILE.html", help="the page to write (default: RUN_DIR/report.html)")
    p.add_argument("--faithfulness", action="append", default=[], metavar="DIR",
                   help="also show this kgtrace faithfulness --out folder (repeatable; folders inside RUN_DIR are "
                        "always shown)")


def cmd_report(args: argparse.Namespace) -> int:
    from kgtrace.report import write_report

    print(f"wrote {write_report(args.run_dir, args.out, args.faithfulness)}")
    return 0


# ----------------------------------------------------------------------------- predict and score


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
    p.add_argument("--checkpoint", default="best", help="best, last, or a checkpoint file")
    p.add_argument("--out", metavar="FILE.json", help="also write the candidates as JSON, with a TSV beside it")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to score")


def cmd_predict(args: argparse.Namespace) -> int:
    from kgtrace.evaluation.predict import predict, write_table
    from kgtrace.run import load_run
    from kgtrace.system import resolve_device

    if args.out:
        check_json_out(args.out)
    run = load_run(args.run_dir, args.checkpoint, device=resolve_device(args.device))
    found = predict(run, relation=args.relation, head=args.head, tail=args.tail, top_n=args.top_n,
                    new_only=args.new_only, category=args.category)
    q = found.query
    print(f"({q['head'] or '?'}, {q['relation']}, {q['tail'] or '?'}): best {found.table.height} {q['side']}s"
          f"{' (new only)' if args.new_only else ''}")
    print(f"{'rank':>4}  {'score':>9}  {'known':<5}  candidate")
    for row in found.table.iter_rows(named=True):
        where = ",".join(s for s in ("train", "valid", "test") if row[f"in_{s}"]) or "-"
        name = f"  ({row['name']})" if row["name"] != row["label"] else ""
        print(f"{row['rank']:>4}  {row['score']:9.4f}  {where:<5}  {row['label']}{name}")
    if args.out:
        print(f"wrote {args.out} and {write_table(found.table, args.out, {'query': q})}")
    return 0


def add_score_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train")
    p.add_argument("--triples", required=True, metavar="FILE",
                   help="labelled triples to score, head<TAB>relation<TAB>tail per line")
    p.add_argument("--checkpoint", default="best", help="best, last, or a checkpoint file")
    p.add_argument("--memory-budget", default="2GB", help="memory for scores while ranking, e.g. 2GB")
    p.add_argument("--out", metavar="FILE.json", help="JSON to write, with a TSV beside it (default: print only)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to score")


def cmd_score(args: argparse.Namespace) -> int:
    from kgtrace.evaluation.predict import score_triples, write_table
    from kgtrace.run import load_run
    from kgtrace.system import resolve_device

    try:
        budget = parse_size(args.memory_budget)
    except ValueError as e:
        raise ConfigError([str(e)]) from None
    if args.out:
        check_json_out(args.out)
        check_outputs_spare_inputs([args.out, Path(args.out).with_suffix(".tsv")], [args.triples])
    run = load_run(args.run_dir, args.checkpoint, device=resolve_device(args.device))
    scored = score_triples(run, args.triples, memory_budget=budget)
    for skip in scored.skipped[:10]:
        print(f"{args.triples}:{skip['line']}: skipped: {skip['problem']}", file=sys.stderr)
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
        print(f"wrote {args.out} and {write_table(scored.table, args.out, {'skipped': scored.skipped})}")
    return 0


# ----------------------------------------------------------------------------- summarize


def add_summarize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders with config.yaml and a metrics JSON")
    p.add_argument("--out", required=True, metavar="FILE.tsv", help="the table: one row per run")
    p.add_argument("--plot", metavar="FILE.png", help="also a plot of test MRR per dataset and model")
    p.add_argument("--metrics", default="test_metrics.json",
                   help="each run's metrics file, as kgtrace evaluate --out or kgtrace train wrote it")


def cmd_summarize(args: argparse.Namespace) -> int:
    from kgtrace.evaluation.summary import plot_summary, summarize_runs, write_summary

    table = summarize_runs(args.run_dirs, args.metrics)
    write_summary(table, args.out)
    if args.plot:
        plot_summary(table, args.plot)
    print(table)
    print(f"wrote {args.out}" + (f" and {args.plot}" if args.plot else ""))
    return 0


# ----------------------------------------------------------------------------- explain


def add_explain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train (with epoch checkpoints)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--triple", nargs=3, metavar=("HEAD", "REL", "TAIL"),
                      help="explain one triple, given by labels or integer ids")
    what.add_argument("--triples", metavar="FILE",
                      help="explain every triple of a labelled file, head<TAB>relation<TAB>tail per line")
    what.add_argument("--test", type=int, metavar="N", help="explain the first N triples of the run's test split")
    what.add_argument("--predict", nargs=2, metavar=("HEAD", "REL"),
                      help="explain the model's best new tails of (HEAD, REL, ?) (see --top-n)")
    what.add_argument("--self", dest="self_influence", action="store_true",
                      help="rank every training triple by self-influence, highest (most suspicious) first")
    p.add_argument("--top-n", type=int, default=10, help="with --predict: how many new tails to explain")
    p.add_argument("--top-k", type=int, default=10,
                   help="proponents and opponents per triple (with --self: triples shown and detailed in the JSON)")
    p.add_argument("--params", default="last",
                   help="parameters whose gradients are compared: last (the model's last layer), all, or NAME,NAME")
    p.add_argument("--checkpoints", default="all",
                   help="epoch checkpoints summed over, each weighed by its learning rate: all or EPOCH,EPOCH")
    p.add_argument("--checkpoint", default="best",
                   help="checkpoint of the model that scores and ranks the triples: best, last or a file")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="gradients and their products in this type (bf16/fp16: faster, about 1e-2 relative error)")
    p.add_argument("--index", metavar="FOLDER",
                   help="answer from a projected index built by kgtrace index (approximate; fast for many queries)")
    p.add_argument("--chunk-size", type=int, metavar="N",
                   help="training triples per chunk of the pass (bounds memory; default: 4096, less for gradients "
                        "materialised per triple)")
    p.add_argument("--save-every", type=float, default=30.0, metavar="SECONDS",
                   help="how often a long pass saves its progress to OUT.json.state (or FOLDER.state with "
                        "--out-dir), which rerunning the same command resumes from (0: after every chunk)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                   help="compute per-triple gradients through torch.compile (same influences up to rounding; counters "
                        "in OUT.compile_stats.json). A failed compilation is an error, never a silent fallback")
    p.add_argument("--out", metavar="FILE.json",
                   help="JSON to write; a TSV with every row goes beside it (default: RUN_DIR/explain.json, "
                        "or RUN_DIR/self_influence.json with --self)")
    p.add_argument("--out-dir", metavar="FOLDER",
                   help="instead of one combined file, write one JSON + TSV per explained triple into FOLDER")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where to compute (auto: CUDA when available)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")


def cmd_explain(args: argparse.Namespace) -> int:
    from kgtrace.attribution import TracIn
    from kgtrace.compile import logged_compilation
    from kgtrace.prover.run import is_prover_run
    from kgtrace.run import load_run
    from kgtrace.system import resolve_device

    if is_prover_run(args.run_dir):
        if args.world.distributed:
            raise KgtraceError(f"{args.run_dir}: a prover run's proofs are found in one process. "
                               "Fix: run this command without torchrun")
        return explain_prover_run(args)
    check_explain_options(args)
    options = tracin_options(args)  # parsed before the run loads: a bad --params fails at once
    out = Path(args.out) if args.out else Path(args.run_dir) / (
        "self_influence.json" if args.self_influence else "explain.json")
    check_json_out(out)
    outputs = [Path(args.out_dir)] if args.out_dir else [out, out.with_suffix(".tsv")]
    check_outputs_spare_inputs(outputs, [args.triples], "--out-dir" if args.out_dir else "--out")
    device = resolve_device(args.device)
    run = load_run(args.run_dir, args.checkpoint, device=device)
    compiled = logged_compilation(Path(args.out_dir) / "compile_stats.json" if args.out_dir
                                  else compile_stats_path(out, out), args.compile and args.world.is_main)
    with output_lock(args.out_dir or out, args.world):  # also keeps a second process off the saved state
        if args.self_influence:
            return explain_self_influence(args, run, TracIn(run, device=device, **options), compiled, out)
        return explain_test_triples(args, run, device, options, compiled, out)


def check_explain_options(args: argparse.Namespace) -> None:
    """Every conflict among explain's options, raised at once."""
    counts = {"top-k": args.top_k, "top-n": args.top_n, "chunk-size": args.chunk_size}
    problems = [f"--{key} {value}: must be at least 1" for key, value in counts.items() if value is not None and value < 1]
    if not args.save_every >= 0:  # also NaN
        problems.append(f"--save-every {args.save_every}: must be a number of seconds, 0 or more")
    if args.out_dir and (args.self_influence or args.out):
        problems.append("--out-dir: writes one file per explained triple; fix: drop --out, and use it without --self")
    if args.index and args.self_influence:
        problems.append("--index with --self: the index answers queries, not self-influence; fix: drop --index")
    if args.index and args.world.distributed:
        problems.append("--index: queries of a projected index run in one process; fix: run it without torchrun")
    if problems:
        raise ConfigError(problems)


def tracin_options(args: argparse.Namespace) -> dict:
    """TracIn's keyword arguments from explain's --params, --checkpoints, --precision and --compile."""
    params = args.params if args.params in ("last", "all") else list(parse_list(args.params, "--params"))
    checkpoints = "all" if args.checkpoints == "all" else list(parse_list(args.checkpoints, "--checkpoints", int))
    return {"params": params, "checkpoints": checkpoints, "precision": args.precision, "compile": args.compile,
            "chunk_size": args.chunk_size, "world": args.world}


def explain_state(args: argparse.Namespace, out: Path) -> Path:
    """Where a long pass saves its progress now and then; rerunning the same command resumes from it."""
    return Path(str(args.out_dir or out) + ".state")


def explain_self_influence(args: argparse.Namespace, run, tracin, compiled, out: Path) -> int:
    from kgtrace.attribution import report

    with compiled:
        ranking = report.self_influence_ranking(run, tracin, args.top_k, progress=args.progress,
                                                state=explain_state(args, out), save_every=args.save_every)
    if not args.world.is_main:
        return 0
    print_self_influence(ranking)
    print(f"wrote {out} and {report.write_self_influence(ranking, out)}")
    return 0


def explain_test_triples(args: argparse.Namespace, run, device, options: dict, compiled, out: Path) -> int:
    from kgtrace.attribution import TracIn, report

    test = explain_targets(args, run)
    if args.index:
        from kgtrace.attribution.index import ProjectedIndex

        finder = ProjectedIndex(args.index, run, device=device)
        found, epochs = finder.top_k(test, args.top_k), [c["epoch"] for c in finder.meta.checkpoints]
    else:
        tracin = TracIn(run, device=device, **options)
        with compiled:
            found = tracin.top_k(test, args.top_k, progress=args.progress, state=explain_state(args, out),
                                 save_every=args.save_every)
        epochs = [c.epoch for c in tracin.checkpoints]
    if not args.world.is_main:  # every process holds the merged result; rank 0 reports it
        return 0
    items = report.explain_triples(run, test, found, epochs)
    print_explanations(items)
    if args.out_dir:
        for i, item in enumerate(items):
            report.write_explanations([item], Path(args.out_dir) / f"triple-{i:04d}.json")
        print(f"wrote {len(items)} explanations (JSON + TSV each) into {args.out_dir}")
    else:
        print(f"wrote {out} and {report.write_explanations(items, out)}")
    return 0


def explain_prover_run(args: argparse.Namespace) -> int:
    """kgtrace explain on a prover run: each triple's proof, step by step (the TracIn options do not apply)."""
    from kgtrace.prover.explain import explain_proofs, proof_lines
    from kgtrace.prover.run import load_prover_run
    from kgtrace.system import resolve_device

    if args.self_influence or args.predict or args.index or args.out_dir:
        raise ConfigError(["a prover run explains triples by their proofs; fix: use --triple, --triples or --test "
                           "(--self, --predict, --index and --out-dir are for embedding runs)"])
    out = Path(args.out) if args.out else Path(args.run_dir) / "explain.json"
    check_json_out(out)
    run = load_prover_run(args.run_dir, args.checkpoint, resolve_device(args.device))
    items = explain_proofs(run, explain_targets(args, run))
    for line in proof_lines(items):
        print(line)
    write_json({"proofs": items}, out)
    print(f"wrote {out}")
    return 0


def explain_targets(args: argparse.Namespace, run) -> Tensor:
    """The test triples [n, 3] that --triple, --triples, --test or --predict name."""
    from kgtrace.attribution import report
    from kgtrace.data.lookup import parse_triple

    if args.triple:
        return parse_triple(run.dataset, *args.triple).view(1, 3)
    if args.predict:
        return report.predicted_triples(run, *args.predict, args.top_n)
    if args.test is not None:
        if args.test < 1 or not len(run.dataset.test):
            raise ConfigError([f"--test {args.test}: must be at least 1, and the run's dataset needs a test split"])
        return run.dataset.test[: args.test]
    from kgtrace.data.lookup import encode_named_triples

    test = encode_named_triples(run.dataset, args.triples)
    if len(test) == 0:
        raise KgtraceError(f"{args.triples}: no triples. Fix: write head<TAB>relation<TAB>tail per line")
    return test


# ----------------------------------------------------------------------------- index


def add_index_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train (with epoch checkpoints)")
    p.add_argument("--out", metavar="FOLDER", help="index folder to write (default: RUN_DIR/tracin-index); "
                                                    "an interrupted build in it resumes")
    p.add_argument("--dim", type=int, default=1024,
                   help="numbers per training gradient and checkpoint (error falls as 1/sqrt(dim))")
    p.add_argument("--params", default="last", help="parameters: last, all, or NAME,NAME (as kgtrace explain)")
    p.add_argument("--dtype", default="float16", choices=("float16", "float32"), help="storage type of the index")
    p.add_argument("--seed", type=int, default=0, help="seed of the random projection")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to compute")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")


def cmd_index(args: argparse.Namespace) -> int:
    from kgtrace.attribution.index import build_index
    from kgtrace.run import load_run
    from kgtrace.system import resolve_device

    params = args.params if args.params in ("last", "all") else list(parse_list(args.params, "--params"))
    device = resolve_device(args.device)
    run = load_run(args.run_dir, device=device)
    out = Path(args.out) if args.out else Path(args.run_dir) / "tracin-index"
    index = build_index(run, out, params=params, dim=args.dim, seed=args.seed, dtype=args.dtype, device=device,
                        progress=args.progress)
    meta = index.meta
    print(f"indexed {meta.num_train} training triples x {len(meta.checkpoints)} checkpoints at dim {meta.dim} "
          f"({', '.join(meta.params)}) in {meta.seconds:.1f} s into {out}; "
          f"query with: kgtrace explain {args.run_dir} --index {out} --triple HEAD REL TAIL")
    return 0


# ----------------------------------------------------------------------------- doctor


def add_doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                   help="a run folder written by kgtrace train (default: a small ConvE trained for one epoch on UMLS "
                        "in a temporary folder)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where to compile and run (auto: CUDA when available, where CUDA graphs are checked too)")


def cmd_doctor(args: argparse.Namespace) -> int:
    from kgtrace.doctor import doctor, format_table

    checks = doctor(args.run_dir, args.device)
    print(format_table(checks))
    return 0 if all(c.ok for c in checks) else 1


# ----------------------------------------------------------------------------- faithfulness


FAITHFULNESS_EPILOG = """\
Predictions explained: the run's test triples that its last checkpoint ranks first (tail side,
filtered), all of them or --sample N of them drawn at random; or the triples of --triples FILE.
For each prediction, method and k, the method's top k training triples are removed and the model
is trained again (--mode retrain: from scratch with the run's config and seed; --mode finetune:
from the checkpoint of --finetune-from, default the latest at or before half the epochs, for the
remaining epochs). Measured against the run's last checkpoint: score drop, filtered tail-rank
change, PD (fraction whose probability, softmax over all tails, drops), TC (fraction no longer
top-1) and the MRR drop of the set. Finished trainings are kept in --out, so a rerun resumes;
running both modes into one --out also reports how far fine-tuning agrees with retraining.
"""


def add_faithfulness_args(p: argparse.ArgumentParser) -> None:
    from kgtrace.faithfulness.methods import METHODS

    p.epilog = FAITHFULNESS_EPILOG
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train (with epoch checkpoints)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--triples", metavar="FILE", help="explain these labelled triples (head<TAB>relation<TAB>tail) "
                                                        "instead of the rank-first test triples")
    what.add_argument("--sample", type=int, metavar="N", help="explain N of the rank-first test triples, drawn at "
                                                              "random; unset: all of them")
    p.add_argument("--k", default="1,5,10", help="numbers of training triples removed, comma-separated")
    p.add_argument("--methods", default=",".join(m for m in METHODS if m != "proof"),
                   help=f"removal methods, comma-separated: {', '.join(METHODS)} (proof needs --prover-run)")
    p.add_argument("--prover-run", metavar="DIR", help="a kgtrace prove --out folder on the same dataset: the proof "
                                                       "method removes the facts of its proof of each prediction")
    p.add_argument("--out", metavar="DIR", help="output folder, unset: RUN_DIR/faithfulness; a rerun resumes in it")
    p.add_argument("--mode", choices=("retrain", "finetune"), default="retrain",
                   help="train again from scratch, or continue an early checkpoint without the removed triples")
    p.add_argument("--finetune-from", type=int, metavar="EPOCH",
                   help="with --mode finetune: the checkpoint to continue; unset: the latest at or before half "
                        "the epochs")
    p.add_argument("--jobs", type=int, default=1, help="trainings run in parallel, each in its own process")
    p.add_argument("--threads", type=int, default=1, help="torch threads per training process")
    p.add_argument("--seed", type=int, default=0, help="seed of the random and neighbourhood methods and of --sample")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the trainings run")
    p.add_argument("--keep-runs", action="store_true", help="keep every trained run under OUT/runs/ to inspect it")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bars")


def cmd_faithfulness(args: argparse.Namespace) -> int:
    from kgtrace.faithfulness import FaithfulnessSettings, check_faithfulness
    from kgtrace.run import load_run

    problems = []
    try:
        ks = tuple(int(x) for x in args.k.split(",") if x.strip())
    except ValueError:
        problems.append(f"--k {args.k!r}: write whole numbers separated by commas, e.g. 1,5,10")
        ks = (1,)  # a placeholder, so that the other settings are still checked
    methods = tuple(x.strip() for x in args.methods.split(",") if x.strip())
    settings = FaithfulnessSettings(ks=ks, methods=methods, mode=args.mode, finetune_from=args.finetune_from,
                                    sample=args.sample, seed=args.seed, jobs=args.jobs, threads=args.threads,
                                    device=args.device, keep_runs=args.keep_runs, prover_run=args.prover_run)
    try:
        settings.validate()
    except ConfigError as e:
        problems += e.problems
    if problems:
        raise ConfigError(problems)
    triples = None
    if args.triples:
        from kgtrace.data.lookup import encode_named_triples

        triples = encode_named_triples(load_run(args.run_dir, "last").dataset, args.triples)
        if len(triples) == 0:
            raise KgtraceError(f"{args.triples}: no triples. Fix: write head<TAB>relation<TAB>tail per line")
    summary = check_faithfulness(args.run_dir, args.out, settings, triples=triples, triples_source=args.triples,
                                 progress=args.progress)
    print_faithfulness(summary)
    out = Path(args.out) if args.out else Path(args.run_dir) / "faithfulness"
    print(f"wrote {out / 'faithfulness.tsv'}, {out / 'faithfulness.json'}, {out / 'cells.tsv'} and "
          f"{out / 'faithfulness.png'}" + (f" and {out / 'agreement.tsv'}" if summary["agreement"] else ""))
    return 0


def print_faithfulness(summary: dict) -> None:
    """The table: per variant, method and k, PD, TC, mean score drop and rank change, MRR drop."""
    print(f"{'variant':<20} {'method':<14} {'k':>3} {'n':>4} {'PD %':>6} {'TC %':>6} {'score drop':>10} "
          f"{'rank +':>7} {'MRR drop':>8}")
    for row in summary["table"]:
        print(f"{row['variant']:<20} {row['method']:<14} {row['k']:>3} {row['n']:>4} {100 * row['pd']:6.1f} "
              f"{100 * row['tc']:6.1f} {row['score_drop']:10.4f} {row['rank_change']:7.2f} {row['mrr_drop']:8.4f}")
    for row in summary["agreement"]:
        if row["method"] == "all":
            print(f"{row['cheap']} against retrain over {row['n']} removals: PD agrees {100 * row['pd_agreement']:.1f}%, "
                  f"TC {100 * row['tc_agreement']:.1f}%, score drops correlate {row['score_drop_pearson']:.3f}")


# ----------------------------------------------------------------------------- PyKEEN interop


IMPORT_PYKEEN_EPILOG = """\
SOURCE forms (any mix; folders are searched): a pipeline folder written by save_to_directory (its
training_triples/ gives the id maps and training triples, results.json the losses); training-loop
checkpoints (training_kwargs checkpoint_name=...; PyKEEN overwrites that file each epoch, so keep a copy
per epoch for a series); model checkpoints of callbacks='checkpoint' (one file per epoch, weights only).
Each checkpoint becomes an epoch checkpoint of the run, weighed by its learning rate in kgtrace explain;
checkpoints are read without running code. trained_model.pkl is a pickle and is read only with
--trust-pickle. Evaluation splits: --dataset names the data PyKEEN was trained on (its labels are
re-mapped to PyKEEN's ids; its train split must be PyKEEN's training triples); without it the run gets a
dataset folder of PyKEEN's training triples (plus validation_triples/ and testing_triples/ where SOURCE has
them, as export-pykeen writes), enough for kgtrace explain; evaluate needs a test split.
What came from where is recorded in RUN_DIR/pykeen_import.json.
"""


def add_import_pykeen_args(p: argparse.ArgumentParser) -> None:
    p.epilog = IMPORT_PYKEEN_EPILOG
    p.formatter_class = RawHelpFormatter
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="PyKEEN pipeline folder, checkpoint folder or checkpoint file (see below)")
    p.add_argument("--out", required=True, help="run folder to write (must not exist or be empty)")
    p.add_argument("--dataset", metavar="umls|PATH",
                   help="bundled dataset or dataset folder with the valid and test splits (default: none; the run "
                        "keeps PyKEEN's training triples only)")
    p.add_argument("--model", choices=[name for name in model_names() if spec_named(name).pykeen],
                   help="the PyKEEN model class, when the weights cannot tell (default: from the weights)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a hyperparameter the weights do not fix, e.g. embedding_height=8 for ConvE (repeatable)")
    p.add_argument("--lr", type=float, help="learning rate of every checkpoint (default: the training-loop "
                                            "checkpoint's optimizer rate)")
    p.add_argument("--trust-pickle", action="store_true",
                   help="also read trained_model.pkl, which runs code named in the file when loaded")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")


def cmd_import_pykeen(args: argparse.Namespace) -> int:
    from kgtrace.interop.pykeen_import import import_pykeen

    report = import_pykeen(args.sources, args.out, dataset=args.dataset, model=args.model,
                           model_args=model_args(args.model_arg), lr=args.lr, trust_pickle=args.trust_pickle,
                           overwrite=args.overwrite)
    print(report.summary())
    return 0


def add_export_pykeen_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Write a kgtrace run as files PyKEEN loads: training_triples/ (and validation_triples/, "
                     "testing_triples/) via TriplesFactory.to_path_binary, model_state.pt and checkpoints/ as "
                     "{'state_dict', 'version'} files, config.json with the model class and model_kwargs. Load with "
                     "TriplesFactory.from_path_binary, model_resolver.make(config['model'], config['model_kwargs'], "
                     "triples_factory=...) and load_state_dict (docs/pykeen.md). Needs PyKEEN installed.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a kgtrace run folder")
    p.add_argument("--out", required=True, help="folder to write (must not exist or be empty)")
    p.add_argument("--checkpoint", default="best", help="the model written as model_state.pt: best, last or a file")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")


def cmd_export_pykeen(args: argparse.Namespace) -> int:
    from kgtrace.interop.pykeen_export import export_pykeen

    print(export_pykeen(args.run_dir, args.out, checkpoint=args.checkpoint, overwrite=args.overwrite).summary())
    return 0


# ----------------------------------------------------------------------------- rules (the prover's)


def add_rules_args(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(title="actions", metavar="ACTION", dest="action", required=True)
    mine = actions.add_parser("mine", formatter_class=HelpFormatter,
                              help="mine implication, inverse and length-2 chain rules (AMIE's measures)",
                              description="Mine r(X,Y) :- s(X,Y), r(X,Y) :- s(Y,X) and r(X,Y) :- s(.,.), t(.,.) "
                                          "(every direction) from the training triples, with support, head coverage, "
                                          "standard and PCA confidence; write them best first, one per line: "
                                          "CONFIDENCE  HEAD :- BODY  # measures")
    mine.add_argument("--dataset", default="umls", help=TRAIN_HELP["dataset"])
    mine.add_argument("--out", required=True, metavar="FILE", help="rule file to write")
    add_mining_args(mine)
    mine.add_argument("--overwrite", action="store_true", help="replace an existing --out file")


def add_mining_args(p: argparse.ArgumentParser) -> None:
    from kgtrace.prover.config import MiningConfig

    defaults = MiningConfig()
    p.add_argument("--min-support", type=int, default=defaults.min_support,
                   help="distinct (x, y) pairs a rule must predict correctly")
    p.add_argument("--min-head-coverage", type=float, default=defaults.min_head_coverage,
                   help="support / facts of the head relation")
    p.add_argument("--min-confidence", type=float, default=defaults.min_confidence, help="standard confidence")
    p.add_argument("--min-pca-confidence", type=float, default=defaults.min_pca_confidence,
                   help="PCA confidence (AMIE's partial completeness assumption)")
    p.add_argument("--confidence", choices=("std", "pca"), default=defaults.confidence,
                   help="the measure written as each rule's confidence")
    p.add_argument("--confidence-offset", type=float, default=defaults.confidence_offset,
                   help="written confidence = support / (denominator + offset), damping rules with rare bodies "
                        "(AnyBURL's default 5; 0: AMIE's measure itself)")
    p.add_argument("--max-rules-per-head", type=int, default=defaults.max_rules_per_head,
                   help="keep each head relation's best N rules (0: all); bounds the prover's branching")
    p.add_argument("--no-chains", dest="chains", action="store_false", help="mine implications and inverses only")


def mining_config(args: argparse.Namespace):
    from kgtrace.prover.config import MiningConfig

    return MiningConfig(args.min_support, args.min_head_coverage, args.min_confidence, args.min_pca_confidence,
                        args.confidence, args.confidence_offset, args.max_rules_per_head, args.chains).validate()


def cmd_rules(args: argparse.Namespace) -> int:
    from kgtrace.data.dataset import load_dataset
    from kgtrace.prover.mining import mine_rules
    from kgtrace.prover.rules import write_rules

    config = mining_config(args)
    if Path(args.out).exists() and not args.overwrite:
        raise KgtraceError(f"--out {args.out}: the file exists. Fix: pass --overwrite, or choose another name")
    ds = load_dataset(args.dataset)
    mined = mine_rules(ds.train, ds.num_entities, ds.num_relations, config)
    header = [f"kgtrace rules mine --dataset {args.dataset}: {len(mined)} rules from {len(ds.train)} training triples",
              "settings: " + json.dumps(config.__dict__), "CONFIDENCE  HEAD :- BODY  # measures"]
    write_rules(args.out, [m.rule for m in mined], ds.relations.labels, [m.note() for m in mined], header)
    heads = len({m.rule.head for m in mined})
    print(f"wrote {len(mined)} rules for {heads} of {ds.num_relations} relations into {args.out}")
    return 0


# ----------------------------------------------------------------------------- prove


def add_prove_args(p: argparse.ArgumentParser) -> None:
    from kgtrace.prover.config import HYBRID_WEIGHTS

    actions = p.add_subparsers(title="actions", metavar="ACTION", dest="action", required=True)
    bfs = actions.add_parser("bfs", formatter_class=HelpFormatter,
                             help="the non-learned prover: a triple's score is its best proof's confidence",
                             description="Write a prover run that scores a triple by exhaustive proof search to "
                                         "--depth steps: the product of the confidences of the rules of its best "
                                         "proof, 0 without one. Rank it with kgtrace evaluate RUN.")
    add_prover_args(bfs)
    train = actions.add_parser("train", formatter_class=HelpFormatter,
                               help="learn a proof policy with PPO over training triples and sampled false ones",
                               description="Write a prover run and train its policy (PPO: clipped objective, GAE, "
                                           "entropy bonus) to prove training triples (each without itself as a "
                                           "fact) and not their sampled corruptions; --depth is the steps of an "
                                           "episode. A triple's score is the best proof its policy-guided beam "
                                           "search finds. --resume continues the run in --out.")
    add_prover_args(train, resumable=True)
    add_policy_args(train)
    weigh = actions.add_parser("weigh", formatter_class=HelpFormatter,
                               help="choose a hybrid prover run's --hybrid-weight on validation triples",
                               description="Rank validation triples by a hybrid prover run (one written with "
                                           "--embedding-run or --link-weight) at each weight of a grid, and set "
                                           "the run's weight to the smallest one whose validation MRR lies within "
                                           "one standard error of the best (paired over queries): among weights "
                                           "validation cannot tell apart, the one that leaves the most to the "
                                           "embedding model. Prints the curve and writes it to RUN/hybrid-weight.json.")
    weigh.add_argument("run", help="a prover run written with --embedding-run or --link-weight")
    weigh.add_argument("--valid-triples", type=int, default=200, help="rank the first N validation triples (0: all)")
    weigh.add_argument("--weights", default=",".join(f"{w:g}" for w in HYBRID_WEIGHTS),
                       help="the grid of weights, comma-separated")
    weigh.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to score")


def add_policy_args(p: argparse.ArgumentParser) -> None:
    from kgtrace.prover.config import ProverConfig

    defaults = ProverConfig()
    for key, help_text in (
        ("epochs", "passes over the training triples"),
        ("chunk_queries", "training triples per rollout batch"),
        ("corruptions", "sampled false triples per training triple (K)"),
        ("lr", "Adam learning rate"),
        ("embedding_dim", "width of the policy's embeddings"),
        ("beam_width", "partial proofs the policy keeps per triple when scoring"),
        ("proof_score", "a proved triple's tie-break: confidence (best proof's rules), noisy_or or probability"),
        ("entropy", "entropy bonus"),
        ("negative_reward", "penalty for proving a false triple"),
        ("ppo_epochs", "optimisation passes over each batch of episodes"),
        ("eval_triples", "validation triples ranked after each epoch"),
        ("eval_corruptions", "sampled corruptions each validation triple is ranked against"),
        ("seed", "random seed"),
        ("threads", "CPU threads for torch (0: torch's default)"),
        ("link_weight", "NTP-lambda's link head: the weight of a ComplEx loss on the policy's own embeddings, added "
                        "to PPO's; > 0 also scores a triple by its logit + --hybrid-weight x the proof (0: no head)"),
        ("link_epochs", "passes of the link head's loss alone before PPO"),
        ("link_lr", "Adagrad learning rate of those passes"),
        ("link_init", "std the link head's entity and relation embeddings start from, as in Lacroix et al.'s "
                      "ComplEx-N3 (0, or with --init-from: as they are)"),
        ("link_n3", "weight of the N3 regulariser in the link head's loss"),
    ):
        default = getattr(defaults, key)
        p.add_argument("--" + key.replace("_", "-"), type=type(default), default=None,
                       help=f"{help_text} (default: {default})")
    p.add_argument("--init-from", default="", metavar="RUN",
                   help="start the policy's entity and relation embeddings from this embedding run")
    p.add_argument("--entity-embeddings", action="store_true",
                   help="learn one embedding per entity (default: entities share one; set by --init-from and "
                        "--link-weight)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")


POLICY_KEYS = ("epochs", "chunk_queries", "corruptions", "lr", "embedding_dim", "beam_width", "proof_score",
               "entropy", "negative_reward", "ppo_epochs", "eval_triples", "eval_corruptions", "seed", "threads",
               "link_weight", "link_epochs", "link_lr", "link_n3", "link_init")


def add_prover_args(p: argparse.ArgumentParser, resumable: bool = False) -> None:
    from kgtrace.prover.config import ProverConfig

    defaults = ProverConfig()
    p.add_argument("--dataset", default="umls", help=TRAIN_HELP["dataset"])
    p.add_argument("--out", required=True, help="run folder to write")
    rules = p.add_mutually_exclusive_group(required=not resumable)
    rules.add_argument("--rules", metavar="FILE", help="rule file (CONFIDENCE  HEAD :- BODY, or the prototype's lines)")
    rules.add_argument("--mine", action="store_true", help="mine the rules from the training triples (options below)")
    p.add_argument("--depth", type=int, default=defaults.depth, help="resolution steps a proof may take")
    p.add_argument("--max-atoms", type=int, default=defaults.max_atoms, help="atoms a proof state may hold")
    p.add_argument("--max-states", type=int, default=defaults.max_states,
                   help="derived states kept per step (0: all); more are counted as overflow")
    p.add_argument("--max-facts", type=int, default=defaults.max_facts,
                   help="facts read per goal (0: the most any goal with a constant matches)")
    p.add_argument("--compile", action="store_true", help="run the engine's step through torch.compile")
    p.add_argument("--embedding-run", default="", metavar="RUN",
                   help="hybrid: add this embedding run's logit to --hybrid-weight x the prover's score")
    p.add_argument("--hybrid-weight", type=float, default=defaults.hybrid_weight,
                   help="the prover's weight (hybrid); kgtrace prove weigh RUN chooses it on validation triples")
    p.add_argument("--overwrite", action="store_true", help="replace an existing prover run in --out")
    if resumable:
        rules.add_argument("--resume", action="store_true",
                           help="continue the run in --out from its latest checkpoint (only --epochs may change)")
    add_mining_args(p)


def prover_config(args: argparse.Namespace, method: str, **more: Any):
    """(ProverConfig, RuleSet, notes, dataset) from the prove options; rules read or mined."""
    from kgtrace.data.dataset import load_dataset
    from kgtrace.prover.mining import mine_rules, rule_set
    from kgtrace.prover.rules import read_rules
    from kgtrace.prover.config import ProverConfig
    from kgtrace.training.loop import dataset_source

    ds = load_dataset(args.dataset)
    if args.mine:
        mining = mining_config(args)
        mined = mine_rules(ds.train, ds.num_entities, ds.num_relations, mining)
        rules, notes, source = rule_set(mined, ds.num_relations), [m.note() for m in mined], "mined"
    else:
        mining, rules = None, read_rules(args.rules, ds.relations)
        notes, source = None, str(Path(args.rules).resolve())
    config = ProverConfig(dataset=dataset_source(args.dataset), method=method, rules=source,
                          mining=dict(mining.__dict__) if mining else {}, depth=args.depth, max_atoms=args.max_atoms,
                          max_states=args.max_states, max_facts=args.max_facts, compile=args.compile,
                          embedding_run=str(Path(args.embedding_run).resolve()) if args.embedding_run else "",
                          hybrid_weight=args.hybrid_weight, **more).validate()
    return config, rules, notes, ds


def cmd_prove(args: argparse.Namespace) -> int:
    from kgtrace.prover.run import load_prover_run, write_prover_run

    if args.action == "train":
        return prove_train(args)
    if args.action == "weigh":
        return prove_weigh(args)
    config, rules, notes, ds = prover_config(args, args.action)
    if config.embedding_run:
        from kgtrace.prover.embedding import embedding_model

        embedding_model(config.embedding_run, ds, "cpu")  # refuse a run over other ids before writing anything
    out = write_prover_run(args.out, config, ds, rules, notes=notes, overwrite=args.overwrite)
    print("config:", json.dumps(config.to_dict()))
    load_prover_run(out)  # the folder reads back
    print(f"wrote the {config.method} prover run {out} ({len(rules)} rules); rank it with: kgtrace evaluate {out}")
    print_weigh_hint(config, out)
    return 0


def print_weigh_hint(config: "ProverConfig", out: Path) -> None:
    """A hybrid run scores with the weight in its config; say how to choose it on validation triples."""
    if config.hybrid():
        print(f"hybrid weight {config.hybrid_weight:g}; to choose it on validation triples: kgtrace prove weigh {out}")


def prove_train(args: argparse.Namespace) -> int:
    from kgtrace.prover.ppo import resume_policy, train_policy
    from kgtrace.prover.run import read_config

    if args.resume:
        result = resume_policy(args.out, epochs=args.epochs, progress=args.progress)
    else:
        more = {key: getattr(args, key) for key in POLICY_KEYS if getattr(args, key) is not None}
        init_from = str(Path(args.init_from).resolve()) if args.init_from else ""
        config, rules, notes, ds = prover_config(args, "policy", init_from=init_from,
                                                 entity_embeddings=args.entity_embeddings or bool(init_from)
                                                 or bool(args.link_weight), **more)
        print("config:", json.dumps(config.to_dict()))
        result = train_policy(config, ds, rules, args.out, notes=notes, overwrite=args.overwrite,
                              progress=args.progress)
    print(f"trained {result.epochs_completed} epochs into {result.run_dir}; best validation MRR "
          f"{result.best_valid_mrr:.4f} at epoch {result.best_epoch}; rank it with: kgtrace evaluate {result.run_dir}")
    print_weigh_hint(read_config(Path(result.run_dir)), result.run_dir)
    return 0


def prove_weigh(args: argparse.Namespace) -> int:
    from kgtrace.prover.hybrid import WEIGHT_FILE, weigh_prover_run
    from kgtrace.prover.run import CONFIG_FILE
    from kgtrace.system import resolve_device

    weights = parse_list(args.weights, "--weights", float)
    choice = weigh_prover_run(args.run, args.valid_triples, weights, resolve_device(args.device))
    print(f"validation MRR by hybrid weight ({choice.queries} queries; gap and standard error against the best, "
          f"weight {choice.best:g}):")
    for w in sorted(choice.mrr):
        mark = "  <- chosen" if w == choice.weight else ""
        print(f"  {w:>8g}  MRR {choice.mrr[w]:.4f}  gap {choice.gap[w]:.4f}  SE {choice.se[w]:.4f}{mark}")
    print(f"set hybrid_weight {choice.weight:g} in {Path(args.run) / CONFIG_FILE}; the curve is in "
          f"{Path(args.run) / WEIGHT_FILE}")
    return 0


def print_explanations(items: list[dict], shown: int = 5, triples: int = 20) -> None:
    """Per test triple (the first ``triples``): names, score and ranks, then the strongest proponents and opponents."""
    if len(items) > triples:
        print(f"(showing {triples} of {len(items)} explained triples; all of them are in the files written)")
    for item in items[:triples]:
        t = item["test"]
        print(f"{t['head_name']} --{t['relation_name']}--> {t['tail_name']}   score {item['score']:.4f}   "
              f"filtered rank: tail {item['rank']['tail']:g}, head {item['rank']['head']:g}")
        for kind in ("proponents", "opponents"):
            print(f"  {kind} (top {min(shown, len(item[kind]))} of {len(item[kind])}):")
            for e in item[kind][:shown]:
                print(f"    {e['influence']:+.4e}  #{e['train_index']:<6} {e['head_name']} --{e['relation_name']}--> "
                      f"{e['tail_name']}")


def print_self_influence(ranking: dict) -> None:
    print(f"most self-influential training triples (of {len(ranking['all'])}; all of them in the TSV):")
    for rank, e in enumerate(ranking["top"], 1):
        print(f"  {rank:>3}. {e['self_influence']:.4e}  #{e['train_index']:<6} {e['head_name']} "
              f"--{e['relation_name']}--> {e['tail_name']}")


def evaluate_run(run_dir: str | Path, split: str = "test", memory_budget: int = 2 << 30,
                 world: World = ONE) -> Metrics:
    """Filtered all-entity metrics of a run's best checkpoint (eager): what kgtrace train reports.

    world: split the ranking over a distributed job's processes (the same metrics).
    """
    from kgtrace.evaluation.sharded import evaluate_sharded
    from kgtrace.run import load_run

    run = load_run(run_dir)
    ds = run.dataset
    return evaluate_sharded(run.model, getattr(ds, split), world=world, known=ds.known_triples(split),
                            memory_budget=memory_budget)


def write_json(data: dict, path: str | Path) -> None:
    from kgtrace.io import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def candidates_label(metrics: Metrics) -> str:
    """What each query was ranked against, as the metrics JSON names it: all, or the number of corruptions."""
    return str(metrics.corruptions) if metrics.corruptions else "all"


def print_metrics(metrics: Metrics, split: str) -> None:
    """A small table: filtered realistic MRR, MR and Hits@k per side, one column per k computed."""
    print(f"filtered {split} metrics ({metrics.num_queries} triples, realistic ties, candidates: "
          f"{candidates_label(metrics)})")
    print(f"{'side':<6} {'MRR':>7} {'MR':>8}" + "".join(f" {f'H@{k}':>7}" for k in metrics.ks))
    rows = [(side, metrics.sides[side]) for side in ("head", "tail") if side in metrics.sides]
    for side, m in [*rows, ("both", metrics.both)]:
        r = m.realistic
        print(f"{side:<6} {r.mrr:7.4f} {r.mr:8.2f}" + "".join(f" {r.hits_at[k]:7.4f}" for k in metrics.ks))
