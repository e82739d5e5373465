"""The ``kgtrace`` command: one subcommand, one function; the work lives in the packages.

One module per family of commands (train: run, prepare, train; evaluate: evaluate, predict, score,
summarize; datasets; explain: explain, index; faithfulness; prove: rules, prove; interop: import-pykeen,
export-pykeen; report: doctor, report), each its options (``add_*_args``) and thin commands
(``cmd_*``: parse, one call into the library, print); `kgtrace.cli.common` holds what they share.

Errors a user can fix print as one message and exit with status 2; an
unexpected error prints one line too (set KGTRACE_DEBUG=1 for its traceback).
Launched by torchrun, evaluate, explain and train split their work over the processes
(kgtrace.compute.distributed); only rank 0 prints and writes, and errors name the rank.

Imports are lazy where they are heavy: ``kgtrace --help`` builds every parser, so the command
modules import only light library modules at the top (config, errors, io, registry, ...) and
import the models, training, evaluation and attribution code inside the command functions.
Keep it so when adding a command.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from kgtrace import __version__
from kgtrace.cli import datasets, evaluate, explain, faithfulness, interop, prove, report, train
from kgtrace.cli.common import HelpFormatter, RawHelpFormatter
from kgtrace.compute.distributed import StoppedByPeer, session
from kgtrace.core.errors import DataWarning, KgtraceError, command_line, os_fault

__all__ = ["HelpFormatter", "RawHelpFormatter", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "command"):
        parser.print_help()
        return 2
    where = ""  # " [rank R/N]" in a distributed job
    try:
        with command_line(), session(args.subcommand) as world:
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
    except BrokenPipeError:  # the reader of the output went away (kgtrace ... | head): nothing to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that exiting does not flush into it
        return 1
    except OSError as e:  # the disk is full, a folder read-only, a name too long: the user's to fix, not a bug
        print(f"kgtrace {args.subcommand}{where}: error: {os_fault(e)}", file=sys.stderr)
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



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kgtrace", description="Link prediction on knowledge graphs that shows why.")
    parser.add_argument("--version", action="version", version=f"kgtrace {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, add, function, summary in (
        ("run", train.add_run_args, train.cmd_run,
         "the whole path: train, evaluate, explain and write report.html into one run folder (reuses finished steps)"),
        ("datasets", datasets.add_datasets_args, datasets.cmd_datasets,
         "the datasets known by name (bundled, or fetched on first use into a cache), and where each one is"),
        ("prepare", train.add_prepare_args, train.cmd_prepare,
         "write a dataset folder from labelled triples or KGX files"),
        ("train", train.add_train_args, train.cmd_train,
         "train a model into a run folder and report filtered test metrics"),
        ("evaluate", evaluate.add_evaluate_args, evaluate.cmd_evaluate,
         "filtered rank metrics of a run on its test or valid split"),
        ("predict", evaluate.add_predict_args, evaluate.cmd_predict,
         "a model's best tails of (HEAD, REL, ?) or heads of (?, REL, TAIL), with names and which are already known"),
        ("score", evaluate.add_score_args, evaluate.cmd_score,
         "score a file of triples, with their filtered head and tail ranks"),
        ("summarize", evaluate.add_summarize_args, evaluate.cmd_summarize,
         "one table (TSV) and plot (PNG) of the test metrics of several runs"),
        ("explain", explain.add_explain_args, explain.cmd_explain,
         "TracIn: the training triples that most support or oppose predictions, or the most self-influential ones"),
        ("report", report.add_report_args, report.cmd_report,
         "one self-contained HTML page of a run: config, training curve, metrics, ranks and explanations"),
        ("index", explain.add_index_args, explain.cmd_index,
         "TracIn: project every training gradient once, for fast repeated queries"),
        ("doctor", report.add_doctor_args, report.cmd_doctor,
         "check every torch.compile entry point of a run: parity with eager, held outputs, no recompilation"),
        ("faithfulness", faithfulness.add_faithfulness_args, faithfulness.cmd_faithfulness,
         "are the explanations true? remove each prediction's top-k training triples, train again, measure the change"),
        ("import-pykeen", interop.add_import_pykeen_args, interop.cmd_import_pykeen,
         "a PyKEEN ConvE, DistMult or ComplEx (pipeline folder or checkpoints) as a kgtrace run with equal scores"),
        ("export-pykeen", interop.add_export_pykeen_args, interop.cmd_export_pykeen,
         "a kgtrace run as files PyKEEN loads (triples factories and state dicts) with equal scores"),
        ("rules", prove.add_rules_args, prove.cmd_rules,
         "Horn rules for the prover: mine them from a dataset's training triples"),
        ("prove", prove.add_prove_args, prove.cmd_prove,
         "a rule prover run (exhaustive search, or a learned policy), ranked by kgtrace evaluate like any run"),
    ):
        sub = commands.add_parser(name, help=summary, description=summary,
                                  formatter_class=HelpFormatter)
        add(sub)
        sub.set_defaults(command=function, subcommand=name)
    return parser
