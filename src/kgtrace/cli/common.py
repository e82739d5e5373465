"""What the command modules share: the help formatters, option parsing, output files and the metrics table.

Torch-free at import (the command modules import it at the top; ``kgtrace --help`` stays fast).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import yaml

from kgtrace.compute.distributed import World
from kgtrace.core.config import TrainConfig, help_of, parse_size, read_yaml
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.layout import RunLayout
from kgtrace.core.owned import Output, check_outputs
from kgtrace.core.specs import DEFAULT_TRAK_RIDGE, model_names, spec_named
from kgtrace.data.dataset import dataset_inputs

if TYPE_CHECKING:
    from kgtrace.evaluation.evaluate import Metrics
    from kgtrace.evaluation.run_metrics import RunEvaluation


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


def train_help(name: str) -> str:
    """The help of a training option: the TrainConfig field's own (kgtrace.core.config), written once."""
    return help_of(TrainConfig, name)


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


def memory_budget(text: str) -> tuple[int, list[str]]:
    """--memory-budget as bytes, and the problem with it (CLI terms) when it is not a size of 1 byte or more."""
    try:
        budget = parse_size(text)
    except ValueError:
        budget = 0
    if budget >= 1:
        return budget, []
    return 0, [f"--memory-budget {text!r}: not a size of 1 byte or more; "
               "fix: e.g. --memory-budget 2GB (or 512MB, or a byte count)"]


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


def named_output(path: str | Path | None, option: str) -> list[Output]:
    """The output the user named with ``option`` (its own suffix; output_problems checked which are accepted)."""
    return [] if path is None else [Output(Path(path), option, Path(path).suffix.lower())]


def indexed_outputs(path_json: str | Path | None, option: str = "--out") -> list[Output]:
    """``--out x.json`` and the TSV kgtrace writes beside it (a companion: replaced only when x.json lists it)."""
    if path_json is None:
        return []
    index = Path(path_json)
    return [Output(index, option, ".json"), Output(index.with_suffix(".tsv"), option, ".tsv", index=index)]


def check_run_outputs(run_dir: str | Path, dataset: str, outputs: list[Output], *,
                      reads: tuple[str | Path | None, ...] = (), writes: tuple[Path, ...] = ()) -> None:
    """`check_outputs` for a command on the run ``run_dir`` trained on ``dataset``: nothing
    written among the run's pinned files (but its products in ``writes``) or in its dataset's folder."""
    pinned = (*RunLayout(run_dir).pinned(writes=writes), *dataset_inputs(dataset))
    check_outputs(outputs, reads=reads, pinned=pinned)


def run_dataset_inputs(run_dir: str | Path) -> list[str]:
    """The folder the run's dataset is read from (`dataset_inputs` of its config's
    dataset; [] where the config cannot be read)."""
    try:
        dataset = read_yaml(RunLayout(run_dir).config)["dataset"]
    except (OSError, ValueError, KeyError, TypeError, KgtraceError):
        return []
    return dataset_inputs(str(dataset))


def output_lock(path: str | Path | None, world: World):
    """The lock of a result file rank 0 writes (nothing to hold without one, or in the other processes)."""
    from kgtrace.core.owned import file_lock

    return file_lock(path) if path and world.is_main else contextlib.nullcontext()


def compile_stats_path(out: str | Path | None, default: Path) -> Path:
    """Where a command's compile counters go: beside its JSON output (OUT.compile_stats.json)."""
    out = Path(out) if out else default
    return out.with_name(out.stem + ".compile_stats.json")


def write_json(data: dict, path: str | Path) -> None:
    from kgtrace.core.io import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def candidates_label(metrics: Metrics) -> str:
    """What each query was ranked against, as the metrics JSON names it: all, or the number of corruptions."""
    return str(metrics.corruptions) if metrics.corruptions else "all"


def print_metrics(metrics: Metrics, split: str) -> None:
    """A small table: filtered realistic MRR, MR and Hits@k per side, one column per k computed."""
    allowed = " allowed by category" if metrics.restricted else ""
    print(f"filtered {split} metrics ({metrics.num_queries} triples, realistic ties, candidates: "
          f"{candidates_label(metrics)}{allowed})")
    print(f"{'side':<6} {'MRR':>7} {'MR':>8}" + "".join(f" {f'H@{k}':>7}" for k in metrics.ks))
    rows = [(side, metrics.sides[side]) for side in ("head", "tail") if side in metrics.sides]
    for side, m in [*rows, ("both", metrics.both)]:
        r = m.realistic
        print(f"{side:<6} {r.mrr:7.4f} {r.mr:8.2f}" + "".join(f" {r.hits_at[k]:7.4f}" for k in metrics.ks))


def print_evaluation(evaluation: RunEvaluation, split: str) -> None:
    """What the candidates were (when restricted), the metrics table, and then the unrestricted figures."""
    if evaluation.unrestricted is not None:
        print(evaluation.note)
    print_metrics(evaluation.metrics, split)
    if evaluation.unrestricted is not None:
        r, ks = evaluation.unrestricted.both.realistic, evaluation.unrestricted.ks
        print(f"against every entity (the figure the field publishes): MRR {r.mrr:.4f}, MR {r.mr:.2f}, "
              + ", ".join(f"H@{k} {r.hits_at[k]:.4f}" for k in ks))


def add_restrict_arg(p: argparse.ArgumentParser) -> None:
    """--restrict, as every command that ranks or lists candidates takes it."""
    p.add_argument("--restrict", action="append", default=[], metavar="RULE",
                   help="candidates by node category: auto (default): where the dataset has node categories, each "
                        "relation's heads and tails only among the categories it takes in training (a drug's "
                        "treats answers are diseases), else every entity; none: every entity; typed: as auto, "
                        "refused without categories; or RELATION:tail=CAT1|CAT2 (repeatable). Restricted metrics "
                        "keep the unrestricted ones beside them")


def field_defaults(config_class: type) -> SimpleNamespace:
    """A settings dataclass's field defaults, for the help of its options: read from the class, so that building a
    parser runs none of the class's code (``kgtrace evaluate`` calls nothing in the prover)."""
    return SimpleNamespace(**{f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                              for f in dataclasses.fields(config_class)})


def trak_ridges() -> str:
    """The registered models' TRAK ridges for --trak-ridge's help: "0.3; ConvE 1" (the default, then the others)."""
    specs = [spec_named(name) for name in model_names()]
    others = [f"{spec.model_class.__name__} {spec.trak_ridge:g}" for spec in specs
              if spec.trak_ridge != DEFAULT_TRAK_RIDGE]
    return "; ".join([f"{DEFAULT_TRAK_RIDGE:g}", *others])
