"""Reproduce published link-prediction results: one named recipe per (model, dataset); prints JSON.

    python benchmarks/reproduce.py --list
    python benchmarks/reproduce.py conve-paper-fb15k237 [--device auto] [--threads 1] [--hours 2.5]

A recipe is the published training setup, as kgtrace settings. The script trains it into
``benchmarks/runs/NAME`` with validation-MRR early stopping, ranks the test split with the best
checkpoint (filtered, head, tail and both; realistic ties) and writes
``benchmarks/results/NAME.json``: the recipe, the command, the machine, the epochs and wall time,
the validation curve per epoch, and the test metrics against the published MRR.

Runs are resumable: with ``--hours`` training pauses at the first epoch boundary after that
budget (checkpointed), the result file records the best checkpoint so far with
``"status": "paused"``, and running the same command again continues the same run, with the same
result as one uninterrupted run. A kill loses at most the epochs since the last checkpoint.
``--snapshot`` writes the result of a run as it stands without training it: ``"in progress"`` while
another process trains it, else ``"paused"`` or ``"finished"`` as its latest checkpoint says (for a
run whose own invocation stopped before writing its result).

Remote datasets come through kgtrace's dataset registry; offline, point it at a mirror:
``KGTRACE_DATASETS_MIRROR=../shared/datasets/benchmarks``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import processor_name

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Recipe:
    """A published setup: kgtrace TrainConfig settings, and the filtered test MRR it reached there."""

    name: str
    dataset: str
    settings: dict[str, Any]
    published_mrr: float  # the target: filtered test MRR, head and tail
    source: str
    goal_mrr: float | None = None  # a better published figure to aim for, where there is one
    notes: str = ""
    model_args: dict[str, Any] = field(default_factory=dict)


# Dettmers et al. 2018, section 5.1 and the authors' main.py: Adam lr .003, batch 128, label
# smoothing .1, dropouts .2 (input) .2 (feature map) .3 (hidden), embedding 200 (10 x 20), 1-N
# scoring with reciprocal relations (KvsAll), BCE. They report the best validation epoch.
CONVE_PAPER = {"model": "conve", "lr": 0.003, "batch_size": 128, "label_smoothing": 0.1, "training": "kvsall",
               "epochs": 1000, "eval_every": 5, "patience": 6}

# The same with the authors' code's label smoothing (labels (1 - eps) y + 1/E, not PyKEEN's eps/(E - 1) for the
# negatives): what kgtrace's first FB15k-237 run (.300 against .325) did not reproduce.
CONVE_CODE = {**CONVE_PAPER, "label_smoothing_style": "conve"}

# Ruffinelli et al. 2020 (LibKGE, ICLR): the best configuration per (model, dataset) of their search,
# from the kge-iclr20 repository's best-trial dumps. LibKGE's common parts: Adagrad or Adam,
# ReduceLROnPlateau on validation MRR (factor .95, relative threshold 1e-4), validation every 5
# epochs, early stopping after 10 validations without improvement, at most 400 epochs.
LIBKGE = {"eval_every": 5, "patience": 10, "epochs": 400, "lr_decay": 0.95, "label_smoothing": 0.0}
# LibKGE's WN18RR DistMult and ComplEx also drop out embeddings (.37/.50 and .36/.31), draw them from U(a, 1.0)
# and (DistMult) smooth KvsAll labels by .074 with reciprocal relations; their runs here began before kgtrace had
# these options and keep their first settings (a run resumes with its own).
LEFT_OUT = ("this recipe leaves out LibKGE's embedding dropout, uniform initialisation and weighted Lp penalty "
            "(tiny weights){}: its run began without them, and a run resumes with its own settings")

# Sun et al. 2019, the authors' best_config.sh: self-adversarial negative sampling, Adam, double entity
# embeddings (-de: complex entities of the hidden size). Their steps train one side a batch (head or tail
# corruptions in turn) where kgtrace's step trains both sides of each triple, so an epoch here is two of their
# passes: epochs = steps x batch / (2 x training triples). Their learning rate drops tenfold halfway, which a
# constant rate here leaves out.
ROTATE = {"model": "rotate", "training": "negative-sampling", "optimizer": "adam", "lr": 0.00005, "eval_every": 10,
          "label_smoothing": 0.0}

# Balazevic et al. 2019, the authors' README: 1-N scoring of every query and its reciprocal with BCE and their
# code's label smoothing ((1 - eps) y + 1/E), Adam, batch 128, 500 epochs, batch norm and three dropouts.
TUCKER = {"model": "tucker", "training": "kvsall", "optimizer": "adam", "batch_size": 128, "epochs": 500,
          "label_smoothing": 0.1, "label_smoothing_style": "conve", "eval_every": 10}

RECIPES = {r.name: r for r in (
    Recipe("conve-paper-fb15k237", "fb15k237", CONVE_PAPER, 0.325, "Dettmers et al. 2018, table 3", goal_mrr=0.339),
    Recipe("conve-paper-wn18rr", "wn18rr", CONVE_PAPER, 0.43, "Dettmers et al. 2018, table 3", goal_mrr=0.442),
    Recipe("conve-code-fb15k237", "fb15k237", CONVE_CODE, 0.325, "Dettmers et al. 2018, table 3 (their code's "
           "label smoothing)", goal_mrr=0.339),
    Recipe("conve-authors-fb15k237", "fb15k237", CONVE_CODE, 0.325, "Dettmers et al. 2018, table 3 (their code's "
           "label smoothing and 20 x 10 reshaping)", goal_mrr=0.339, model_args={"embedding_height": 20},
           notes="the authors' code (model.py, main.py) views each embedding as 20 rows of 10 (--embedding-shape1 20): "
                 "a 40 x 10 image and fc 32 x 38 x 8 = 9,728 -> 200 (their --hidden-size), where kgtrace's and "
                 "PyKEEN's default 10 x 20 gives a 20 x 20 image and fc 10,368 -> 200"),
    Recipe("conve-authors-hd05-fb15k237", "fb15k237", CONVE_CODE, 0.325, "Dettmers et al. 2018, table 3 (their "
           "code with --hidden-drop 0.5, TimDettmers/ConvE issue 52)", goal_mrr=0.339,
           model_args={"embedding_height": 20, "output_dropout": 0.5},
           notes="in the authors' issue 52 their code with the README's settings reached .309 (Hits@10 .484) on "
                 "FB15k-237, and the author replicated .325 only with --hidden-drop 0.5 (dropout after fc); "
                 "otherwise conve-authors-fb15k237"),
    Recipe("conve-libkge-fb15k237", "fb15k237",
           {**LIBKGE, "model": "conve", "training": "1vsall", "optimizer": "adagrad", "lr": 0.004277,
            "batch_size": 1024, "lr_patience": 9}, 0.339, "Ruffinelli et al. 2020, conve-1vsAll-kl-bo-best",
           model_args={"embedding_dim": 288, "embedding_height": 12, "input_dropout": 0.118,
                       "feature_map_dropout": 0.488, "output_dropout": 0.5},
           notes="LibKGE's 2D aspect ratio 2 views 288 values as 12 x 24; LibKGE drops out the relation embedding "
                 "only (.118), where kgtrace's input dropout drops the stacked head and relation image at that "
                 "rate; LibKGE has no bn0, bn1 and bn2 without affine weights, and keeps each entity's bias as "
                 "an extra embedding column"),
    Recipe("distmult-libkge-fb15k237", "fb15k237",
           {**LIBKGE, "model": "distmult", "training": "negative-sampling", "negatives_tail": 402,
            "negatives_head": 255, "optimizer": "adagrad", "lr": 0.1595, "batch_size": 1024, "lr_patience": 6},
           0.343, "Ruffinelli et al. 2020, distmult-negative_sampling-kl-bo-best",
           model_args={"embedding_dim": 256, "inverse_relations": True, "entity_dropout": 0.4197,
                       "relation_dropout": 0.4097, "init_uniform": [-0.9352, 1.0]},
           notes="LibKGE's reciprocal relations model, negative sampling with kl, embedding dropout and uniform "
                 "init as kgtrace's options; its weighted L3 penalty (weights 1e-9 and 4e-15) is left out"),
    Recipe("complex-libkge-fb15k237", "fb15k237",
           {**LIBKGE, "model": "complex", "training": "negative-sampling", "negatives_tail": 1000,
            "negatives_head": 529, "optimizer": "adagrad", "lr": 0.1826, "batch_size": 1024, "lr_patience": 7},
           0.348, "Ruffinelli et al. 2020, complex-negative_sampling-kl-bo-best",
           model_args={"embedding_dim": 128, "inverse_relations": True, "entity_dropout": 0.5,
                       "relation_dropout": 0.2268, "init_uniform": [-0.8328, 1.0]},
           notes="256 reals = 128 complex dimensions; LibKGE's reciprocal relations model, negative sampling with "
                 "kl, embedding dropout and uniform init as kgtrace's options; its weighted L3 penalty (weights 7e-9 "
                 "and 4e-14) is left out"),
    Recipe("conve-libkge-wn18rr", "wn18rr",
           {**LIBKGE, "model": "conve", "training": "kvsall-ce", "optimizer": "adam", "lr": 0.001623,
            "batch_size": 1024, "lr_patience": 1}, 0.442, "Ruffinelli et al. 2020, conve-KvsAll-kl-bo-best",
           model_args={"embedding_dim": 512, "embedding_height": 16, "input_dropout": 0.227},
           notes="LibKGE's KvsAll with kl is kgtrace's kvsall-ce"),
    Recipe("distmult-libkge-wn18rr", "wn18rr",
           {**LIBKGE, "model": "distmult", "training": "kvsall-ce", "optimizer": "adagrad", "lr": 0.3313,
            "batch_size": 1024, "lr_patience": 7}, 0.452, "Ruffinelli et al. 2020, distmult-KvsAll-kl-bo-best",
           model_args={"embedding_dim": 512},
           notes="LibKGE's KvsAll with kl is kgtrace's kvsall-ce; " + LEFT_OUT.format(
               ", reciprocal relations and label smoothing .074")),
    Recipe("complex-libkge-wn18rr", "wn18rr",
           {**LIBKGE, "model": "complex", "training": "1vsall", "optimizer": "adagrad", "lr": 0.5256,
            "batch_size": 512, "lr_patience": 5}, 0.475, "Ruffinelli et al. 2020, complex-1vsAll-kl-bo-best",
           model_args={"embedding_dim": 64}, notes="128 reals = 64 complex dimensions; " + LEFT_OUT.format("")),
    Recipe("transe-libkge-fb15k237", "fb15k237",
           {**LIBKGE, "model": "transe", "training": "negative-sampling", "negatives_tail": 192, "negatives_head": 61,
            "optimizer": "adam", "lr": 0.0003, "batch_size": 128, "lr_patience": 5}, 0.313,
           "Ruffinelli et al. 2020, transe-negative_sampling-kl-bo-best",
           model_args={"embedding_dim": 128, "scoring_norm": 2, "inverse_relations": True,
                       "init_uniform": [-1e-05, 1.0]},
           notes="LibKGE's reciprocal relations model with the L2 distance, negative sampling with kl; its dropouts "
                 "are negative in the dump (none); its weighted L2 penalty (weights 4e-12 and 9e-8) is left out"),
    Recipe("transe-libkge-wn18rr", "wn18rr",
           {**LIBKGE, "model": "transe", "training": "negative-sampling", "negatives_tail": 158, "negatives_head": 70,
            "optimizer": "adagrad", "lr": 0.2533, "batch_size": 128, "lr_patience": 5}, 0.228,
           "Ruffinelli et al. 2020, transe-negative_sampling-kl-bo-best",
           model_args={"embedding_dim": 512, "scoring_norm": 2, "inverse_relations": True, "entity_dropout": 0.2519},
           notes="LibKGE's reciprocal relations model with the L2 distance, negative sampling with kl, Xavier-normal "
                 "init; its relation dropout is negative in the dump (none); its weighted L2 penalty (weights 1e-7 "
                 "and 4e-13) is left out"),
    Recipe("rescal-libkge-fb15k237", "fb15k237",
           {**LIBKGE, "model": "rescal", "training": "1vsall", "optimizer": "adam", "lr": 0.000739, "batch_size": 512,
            "lr_patience": 1}, 0.356, "Ruffinelli et al. 2020, rescal-1vsAll-kl-bo-best",
           model_args={"embedding_dim": 128, "entity_dropout": 0.4267, "relation_dropout": 0.1594,
                       "init_normal": 0.1225},
           notes="no reciprocal relations (the dump's model is rescal): 1vsall trains the tail and head queries of "
                 "each triple; LibKGE's normal_ initialisation (std .1225); its weighted L2 penalty (weights 5e-11 "
                 "and 7e-13) is left out"),
    Recipe("rescal-libkge-wn18rr", "wn18rr",
           {**LIBKGE, "model": "rescal", "training": "kvsall-ce", "optimizer": "adam", "lr": 0.000854, "batch_size": 128,
            "lr_patience": 8, "label_smoothing": 0.3, "label_smoothing_style": "conve"}, 0.467,
           "Ruffinelli et al. 2020, rescal-KvsAll-kl-bo-best",
           model_args={"embedding_dim": 128, "inverse_relations": True, "relation_dropout": 0.2378,
                       "init_uniform": [-0.4064, 1.0]},
           notes="LibKGE's KvsAll with kl and label smoothing .3 is kgtrace's kvsall-ce with the conve smoothing "
                 "style; its entity dropout is negative in the dump (none); its weighted L3 penalty (weights 1e-14 "
                 "and 3e-15) is left out"),
    Recipe("rotate-authors-fb15k237", "fb15k237",
           {**ROTATE, "batch_size": 1024, "negatives_tail": 256, "negatives_head": 256, "adversarial_temperature": 1.0,
            "epochs": 188}, 0.338, "Sun et al. 2019, table 5 (best_config.sh: 100,000 steps of 1,024)",
           model_args={"embedding_dim": 1000, "margin": 9.0},
           notes="100,000 one-sided steps of 1,024 triples = 188 epochs of both sides; the halfway tenfold lr drop "
                 "is left out"),
    Recipe("rotate-authors-wn18rr", "wn18rr",
           {**ROTATE, "batch_size": 512, "negatives_tail": 1024, "negatives_head": 1024, "adversarial_temperature": 0.5,
            "epochs": 236}, 0.476, "Sun et al. 2019, table 5 (best_config.sh: 80,000 steps of 512)",
           model_args={"embedding_dim": 500, "margin": 6.0},
           notes="80,000 one-sided steps of 512 triples = 236 epochs of both sides; the halfway tenfold lr drop "
                 "is left out"),
    Recipe("tucker-authors-fb15k237", "fb15k237", {**TUCKER, "lr": 0.0005}, 0.358,
           "Balazevic et al. 2019, table 3 (README: lr .0005, decay 1.0)",
           model_args={"embedding_dim": 200, "relation_dim": 200, "input_dropout": 0.3, "hidden_dropout1": 0.4,
                       "hidden_dropout2": 0.5}),
    Recipe("tucker-authors-wn18rr", "wn18rr", {**TUCKER, "lr": 0.003}, 0.470,
           "Balazevic et al. 2019, table 3 (README: lr .003, decay 1.0)",
           model_args={"embedding_dim": 200, "relation_dim": 30, "input_dropout": 0.2, "hidden_dropout1": 0.2,
                       "hidden_dropout2": 0.3}),
)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recipe", nargs="?", choices=sorted(RECIPES), help="the recipe to run")
    p.add_argument("--list", action="store_true", help="print the recipes as JSON and exit")
    p.add_argument("--table", action="store_true", help="print the results in --results as a Markdown table and exit")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--precision", default="fp32", help="fp32, or bf16 autocast (recorded in the result)")
    p.add_argument("--hours", type=float, default=None, help="pause training after this long (resume: run again)")
    p.add_argument("--runs", type=Path, default=HERE / "runs", help="where the run folders go")
    p.add_argument("--results", type=Path, default=HERE / "results", help="where NAME.json goes")
    p.add_argument("--name", default=None, help="run and result name (default: the recipe's; e.g. for a bf16 twin)")
    p.add_argument("--seed", type=int, default=0, help="random seed of a new run (weights, query order, dropout); "
                   "give another seed a --name of its own")
    p.add_argument("--snapshot", action="store_true",
                   help="train nothing: write the result of the run as it stands (status 'in progress' while another "
                        "process trains it, else 'paused' or 'finished')")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        print(results_table(args.results))
        return 0
    if args.list or not args.recipe:
        print(json.dumps({name: recipe_json(r) for name, r in RECIPES.items()}, indent=1))
        return 0
    recipe = RECIPES[args.recipe]
    name = args.name or recipe.name
    run_dir = args.runs / name
    if args.snapshot:
        if args.threads:  # the evaluation's threads, recorded as the machine's
            import torch

            torch.set_num_threads(args.threads)
        summary = summarize(recipe, args, run_dir, status=snapshot_status(run_dir))
    else:
        started = time.monotonic()
        deadline = started + args.hours * 3600 if args.hours else None
        result = train_or_resume(recipe, args, run_dir, deadline)
        record_session(run_dir, started, result.epochs_completed)
        summary = summarize(recipe, args, run_dir, status="paused" if result.stopped_at_deadline else "finished")
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"{name}.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("recipe", "status", "epochs", "best_epoch", "test", "target")}, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


def train_or_resume(recipe: Recipe, args: argparse.Namespace, run_dir: Path, deadline: float | None):
    from kgtrace.core.config import TrainConfig
    from kgtrace.core.layout import RunLayout
    from kgtrace.training.loop import resume, train

    if RunLayout(run_dir).config.is_file():
        check_run_is_recipe(recipe, run_dir, args.seed)
        return resume(run_dir, progress=False, deadline=deadline, device=args.device, threads=args.threads)
    config = TrainConfig(dataset=recipe.dataset, device=args.device, threads=args.threads, seed=args.seed,
                         precision=args.precision, model_args=dict(recipe.model_args), **recipe.settings)
    return train(config, run_dir, progress=False, deadline=deadline)


def snapshot_status(run_dir: Path) -> str:
    """"in progress" while a process trains the run (it holds the run folder's lock); else "finished" when its
    latest checkpoint reached the last epoch or early stopping's patience, and "paused" when it did not."""
    from kgtrace.core.checkpoint import latest_checkpoint, load_checkpoint
    from kgtrace.core.errors import KgtraceError
    from kgtrace.core.layout import RunLayout
    from kgtrace.core.owned import folder_lock

    try:
        with folder_lock(run_dir, "run folder"):
            pass
    except KgtraceError:
        return "in progress"
    saved = load_checkpoint(latest_checkpoint(RunLayout(run_dir).checkpoints), mmap=True)
    config, early = saved["config"], saved["early_stopping"]
    patience = config.get("patience") or 0
    done = saved["epoch"] >= config["epochs"] or (patience and early["bad_validations"] >= patience)
    return "finished" if done else "paused"


def check_run_is_recipe(recipe: Recipe, run_dir: Path, seed: int) -> None:
    """Refuse to resume a run folder trained with other settings than the recipe's (an earlier recipe's run), or
    from another seed."""
    from kgtrace.core.config import read_yaml
    from kgtrace.core.layout import RunLayout

    saved = read_yaml(RunLayout(run_dir).config)
    wanted = {**recipe.settings, "dataset": recipe.dataset, "model_args": dict(recipe.model_args), "seed": seed}
    differ = [f"{key}: run {saved.get(key)!r}, recipe {value!r}" for key, value in wanted.items()
              if saved.get(key) != value]
    if differ:
        raise SystemExit(f"{run_dir} was trained with other settings than recipe {recipe.name} "
                         f"({'; '.join(differ)}). Fix: move that folder away, or pass --name for a new run")


def record_session(run_dir: Path, started: float, epochs: int) -> None:
    """One line per invocation in the run folder: the wall time of the whole reproduction sums them."""
    import torch

    with open(run_dir / "reproduce_sessions.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"seconds": time.monotonic() - started, "epochs_reached": epochs,
                            "threads": torch.get_num_threads(), "ended": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")


def trained_threads(sessions: list[dict[str, Any]], config: dict[str, Any], current: int) -> int:
    """The threads the run last trained with: its last session's, else its configuration's (a run whose
    sessions were killed before they recorded one), else ``current`` (0 in the configuration: torch's default)."""
    recorded = [s["threads"] for s in sessions if "threads" in s]
    return recorded[-1] if recorded else config.get("threads") or current


def summarize(recipe: Recipe, args: argparse.Namespace, run_dir: Path, status: str) -> dict[str, Any]:
    import torch

    from kgtrace.compute.system import resolve_device
    from kgtrace.core.config import read_yaml
    from kgtrace.core.layout import RunLayout
    from kgtrace.evaluation.run_metrics import evaluate_run
    from kgtrace.report.sections import read_records

    layout = RunLayout(run_dir)
    records = read_records(layout.metrics)
    log = run_dir / "reproduce_sessions.jsonl"
    sessions = read_records(log) if log.is_file() else []
    config = read_yaml(layout.config)
    device = resolve_device(config.get("device", "auto"))
    metrics = evaluate_run(run_dir).to_dict()
    realistic = {side: metrics[side]["realistic"] for side in ("head", "tail", "both")}
    curve = [{k: r[k] for k in ("epoch", "loss", "seconds", "valid_mrr", "valid_head_mrr", "valid_tail_mrr")
              if k in r} for r in records]
    validated = [r for r in records if "valid_mrr" in r]
    best = max(validated, key=lambda r: r["valid_mrr"]) if validated else None
    mrr = realistic["both"]["mrr"]
    return {
        "recipe": recipe.name,
        "recipe_settings": recipe_json(recipe),
        "status": status,
        "command": " ".join(["python", "benchmarks/reproduce.py", *sys.argv[1:]]),
        "config": config,
        "machine": {"platform": platform.platform(), "processor": processor_name(),
                    "cpus": os.cpu_count(), "torch": torch.__version__,
                    "threads": trained_threads(sessions, config, torch.get_num_threads()),
                    "device": device.type, **({"gpu": torch.cuda.get_device_name(device)} if device.type == "cuda" else {})},
        "epochs": records[-1]["epoch"] if records else 0,
        "best_epoch": best["epoch"] if best else None,
        "wall_seconds": sum(s["seconds"] for s in sessions),
        "train_seconds": sum(r["seconds"] for r in records),
        "curve": curve,
        "test": realistic,
        "test_all_ties": {side: metrics[side] for side in ("head", "tail", "both")},
        "target": {"published_mrr": recipe.published_mrr, "goal_mrr": recipe.goal_mrr, "mrr": mrr,
                   "reached": mrr >= recipe.published_mrr,
                   "goal_reached": recipe.goal_mrr is not None and mrr >= recipe.goal_mrr},
    }


def run_hours(result: dict[str, Any]) -> float:
    """The hours a result's run took: its sessions' wall time, or its epochs' where that is longer (a session
    killed before it paused recorded no wall time, but its epochs are in the curve)."""
    return max(result["wall_seconds"] or 0.0, result["train_seconds"]) / 3600


def processor_label(machine: dict[str, Any]) -> str:
    """"CPU", or the processor's short name where the result recorded one ("Intel Xeon"; earlier results kept
    only the architecture)."""
    name = machine.get("processor", "")
    if name in ("", platform.machine(), "x86_64", "aarch64", "arm64"):
        return "CPU"
    return " ".join(name.replace("(R)", "").replace("(TM)", "").replace(" Processor", "").split())


def results_table(folder: Path) -> str:
    """One Markdown row per result file of a recipe: status, epochs, time, test MRR per side against the target."""
    rows = ["| recipe | machine | status | epochs (best) | hours | test MRR | head | tail | H@10 | published | reached |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json"), key=lambda p: p.stem):  # a recipe before its -seed1 or -bf16 twin
        r = json.loads(path.read_text())
        if "recipe_settings" not in r:
            continue  # another benchmark's result
        test, target = r["test"], r["target"]
        hours = run_hours(r)
        machine = r["machine"]
        cpu = f"{processor_label(machine)}, {machine['threads']} thread(s)"
        where = machine.get("gpu", "a GPU") if machine["device"] == "cuda" else cpu
        best = "–" if r["best_epoch"] is None else r["best_epoch"]  # paused before its first validation
        rows.append(f"| {path.stem} | {where} | {r['status']} | {r['epochs']} ({best}) | {hours:.2f} | "
                    f"{test['both']['mrr']:.3f} | {test['head']['mrr']:.3f} | {test['tail']['mrr']:.3f} | "
                    f"{test['both']['hits_at_10']:.3f} | {target['published_mrr']:.3f} | "
                    f"{'yes' if target['reached'] else 'no'} |")
    return "\n".join(rows)


def recipe_json(recipe: Recipe) -> dict[str, Any]:
    return {"dataset": recipe.dataset, "settings": recipe.settings, "model_args": recipe.model_args,
            "published_mrr": recipe.published_mrr, "goal_mrr": recipe.goal_mrr, "source": recipe.source,
            "notes": recipe.notes}


if __name__ == "__main__":
    sys.exit(main())
