"""The faithfulness check: remove each prediction's top-k training triples, train again, see what changed.

For every explained prediction, every method and every k, the method's first k triples for
that prediction are removed and the model is trained again without them (retrained from
scratch, or fine-tuned from an early checkpoint: `.retrain`); the new model's score,
probability and filtered rank of the prediction are compared with those of the run's last
checkpoint (`.metrics`). Cells that remove the same set share one training, and every
training is measured on every explained prediction, so nothing is trained twice. A control
training with nothing removed shows what training again alone changes: nothing, or float
rounding (kgtrace's training is reproducible; ConvE's CPU convolution once differed by 1e-7).

Output folder (default RUN_DIR/faithfulness; reruns reuse every finished training)::

    run.json              which run (and checkpoint) the folder belongs to
    removals.json         each method's ranked removals per prediction (reused by reruns)
    jobs/VARIANT/KEY.json one finished training each (VARIANT: retrain or finetune-from-NNNN)
    faithfulness.json     settings, predictions, the table, the agreement of fine-tuning with
                          retraining, and every (variant, prediction, method, k) cell
                          (`.results.FaithfulnessResult`, what `check_faithfulness` returns)
    faithfulness.tsv      the table: one row per (variant, method, k)
    cells.tsv             one row per (variant, prediction, method, k)
    agreement.tsv         fine-tuning against retraining, when both ran in this folder
    faithfulness.png      PD, TC and MRR drop against k, per method

Results of the other variant already in the folder (e.g. retraining of a subset of the
predictions, then fine-tuning of all) are put in the table too, with their own counts, and
fine-tuning is compared with retraining on the cells both have.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from kgtrace.compute.system import threads_problems
from kgtrace.core.errors import ConfigError, KgtraceError, option, option_name
from kgtrace.core.io import atomic_write_text
from kgtrace.core.owned import contents, file_digest, folder_lock
from kgtrace.data.answers import AnswerIndex
from kgtrace.display.plots import save_figure
from kgtrace.evaluation.candidates import CandidateRestriction, check_restrict, restriction_note, restriction_of
from kgtrace.faithfulness import metrics
from kgtrace.faithfulness.metrics import Measures
from kgtrace.faithfulness.plot import faithfulness_figure
from kgtrace.faithfulness.predictions import as_rows, measure, rank_first_test, sample_rows
from kgtrace.faithfulness.removals import MethodInputs, method_signature, removal_methods
from kgtrace.faithfulness.results import (
    AgreementRow,
    CellRow,
    ExplainedPredictions,
    FaithfulnessResult,
    FaithfulnessRow,
    RemovalSettings,
)
from kgtrace.faithfulness.retrain import MODES, Job, job_key, read_result, run_jobs, variant
from kgtrace.runs.embedding import Run, load_run

__all__ = ["FaithfulnessResult", "FaithfulnessSettings", "check_faithfulness"]

CONTROL = "none"  # the method name of the control training (nothing removed, k = 0)
Triple = tuple[int, int, int]


@dataclass(frozen=True)
class FaithfulnessSettings:
    """What to remove and how to train again; `validate` reports every bad value at once."""

    ks: tuple[int, ...] = (1, 5, 10)
    methods: tuple[str, ...] = ("tracin-last", "tracin-all", "random", "neighbourhood")
    mode: str = "retrain"  # retrain | finetune
    finetune_from: int | None = None  # epoch checkpoint fine-tuning starts from; None: the latest at or before half
    sample: int | None = None  # explain this many of the rank-first test triples, drawn at random
    seed: int = 0  # of the random and neighbourhood methods and of the sample
    jobs: int = 1  # trainings in parallel (processes)
    threads: int = 1  # torch threads per training
    device: str = "cpu"
    keep_runs: bool = False  # keep every trained run under OUT/runs/ (to inspect them)
    prover_run: str | None = None  # the prover run (kgtrace prove --out) of the proof method
    rules: str | None = None  # the rule file (kgtrace rules learn --out) of the paths method
    restrict: tuple[str, ...] = ()  # the ranks' candidates (--restrict): (): by category where the data has them

    def __post_init__(self) -> None:
        self.validate()  # a FaithfulnessSettings cannot be built invalid

    def validate(self) -> "FaithfulnessSettings":
        problems = []
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            problems.append(f"k={','.join(map(str, self.ks))}: each k must be a whole number of at least 1, e.g. 1,5,10")
        known = removal_methods()
        unknown = [m for m in self.methods if m not in known]
        if unknown or not self.methods:
            problems.append(f"methods={','.join(self.methods)}: unknown method {', '.join(unknown) or '(none given)'}; "
                            f"choose from {', '.join(known)}")
        if self.mode not in MODES:
            problems.append(f"mode={self.mode!r}: must be one of {', '.join(MODES)}")
        problems += [f"{key}={getattr(self, key)}: must be at least 1" for key in ("jobs", "threads")
                     if getattr(self, key) < 1]
        problems += threads_problems(self.threads)
        if self.sample is not None and self.sample < 1:
            problems.append(f"sample={self.sample}: must be at least 1")
        if "proof" in self.methods and self.prover_run is None:
            problems.append(f"methods=proof: needs the prover run whose proofs to remove; fix: pass "
                            f"{option_name('--prover-run')} (the folder kgtrace prove wrote)")
        if self.prover_run is not None and "proof" not in self.methods:
            problems.append(f"prover_run={self.prover_run}: only the proof method uses it; fix: add proof to methods")
        if "paths" in self.methods and self.rules is None:
            problems.append(f"methods=paths: needs the rules whose paths to remove; fix: pass "
                            f"{option_name('--rules')} (a file kgtrace rules learn wrote)")
        if self.rules is not None and "paths" not in self.methods:
            problems.append(f"rules={self.rules}: only the paths method uses it; fix: add paths to methods")
        if self.finetune_from is not None and self.mode != "finetune":
            problems.append(f"finetune_from={self.finetune_from}: only applies to mode finetune")
        try:
            check_restrict(self.restrict)
        except ConfigError as e:
            problems += e.problems
        if problems:
            raise ConfigError(problems)
        return self


@dataclass(frozen=True)
class Cell:
    """One (prediction, method, k): which triples it removes and the key of the training without them."""

    prediction: int  # row of the predictions
    triple: Triple
    method: str
    k: int
    removed: tuple[int, ...]
    key: str


def check_faithfulness(run_dir: str | Path, out: str | Path | None = None,
                       settings: FaithfulnessSettings = FaithfulnessSettings(), triples: Tensor | None = None,
                       triples_source: str | None = None, progress: bool = True,
                       log: Callable[[str], None] = print) -> FaithfulnessResult:
    """Run the check (module doc) and write its outputs into ``out``; returns what faithfulness.json holds.

    triples: the predictions to explain [N, 3] (ids of the run); None: the run's rank-first
    test triples (`.predictions`), or ``settings.sample`` of them.
    """
    settings.validate()
    run = load_run(run_dir, "last")
    out = Path(out) if out is not None else Path(run_dir) / "faithfulness"
    epochs = run.checkpoints[-1].epoch if run.checkpoints else 0
    start = start_epoch(run, settings, epochs)
    claim_folder(out, run)
    with folder_lock(out, "faithfulness folder"):
        return check_in_folder(run, out, settings, start, epochs, triples, triples_source, progress, log)


def check_in_folder(run: Run, out: Path, settings: FaithfulnessSettings, start: int, epochs: int,
                    triples: Tensor | None, triples_source: str | None, progress: bool,
                    log: Callable[[str], None]) -> FaithfulnessResult:
    """The check's work in its claimed, locked folder ``out``."""
    known = AnswerIndex.build(run.dataset.all_triples(), run.dataset.num_relations)
    restriction = restriction_of(run.dataset, settings.restrict)
    if restriction is not None:
        log(restriction_note(restriction, settings.restrict).replace("candidates:", "candidates of the ranks:", 1))
    predictions, how = choose_predictions(run, known, settings.sample, settings.seed, triples, triples_source,
                                          restriction)
    here = variant(settings.mode, start)
    log(f"explaining {len(predictions)} predictions ({how}); {here}, to epoch {epochs}")
    before = measure(run.model, predictions, known, restriction=restriction)
    ranked = removals(run, predictions, settings, out / "removals.json", progress)
    cells = plan_cells(predictions, ranked, settings.ks)
    jobs = pending_jobs(run, out, here, settings, start, epochs, predictions, cells)
    log(f"{len({c.key for c in cells} | {job_key(())})} trainings, {len(jobs)} still to run, {settings.jobs} at a time")
    run_jobs(jobs, settings.jobs, progress, desc=here)
    result = summarize_folder(run, out, here, settings, predictions, how, before, cells, epochs)
    write_outputs(out, result)
    return result


# ----------------------------------------------------------------------------- inputs


def start_epoch(run: Run, settings: FaithfulnessSettings, epochs: int) -> int:
    """0 for retraining; for fine-tuning the chosen checkpoint, by default the latest at or before half the epochs."""
    if not run.checkpoints:
        raise KgtraceError(f"{run.path}: the run has no epoch checkpoint. Fix: train it (kgtrace train --resume)")
    if settings.mode == "retrain":
        return 0
    available = [c.epoch for c in run.checkpoints if c.epoch < epochs]
    if settings.finetune_from is None:
        early = [e for e in available if e <= epochs // 2]
        if not early:
            raise KgtraceError(f"{run.path}: no checkpoint at or before epoch {epochs // 2} to fine-tune from "
                               f"(checkpoints: {', '.join(str(c.epoch) for c in run.checkpoints)}). "
                               f"Fix: pass {option_name('--finetune-from')} (an epoch), or use "
                               f"{option('--mode', 'retrain')}")
        return max(early)
    if settings.finetune_from not in available:
        raise ConfigError([f"finetune_from={settings.finetune_from}: the run has no such checkpoint before its last; "
                           f"choose one of {', '.join(map(str, available)) or '(none)'}"])
    return settings.finetune_from


def claim_folder(out: Path, run: Run) -> None:
    """Make ``out`` this run's output folder, refusing a foreign folder or one of another run."""
    marker = out / "run.json"
    identity = {"run": str(run.path.resolve()), "checkpoint": run.checkpoint.name, "sha256": file_digest(run.checkpoint)}
    if marker.is_file():
        saved = json.loads(marker.read_text(encoding="utf-8"))
        if saved != identity:
            raise KgtraceError(f"{out}: holds the faithfulness check of {saved.get('run')} ({saved.get('checkpoint')}), "
                               f"not of this run's current last checkpoint. Fix: choose another {option_name('--out')}")
        return
    if contents(out):
        raise KgtraceError(f"{out}: folder is not empty and is not a faithfulness folder (no run.json). "
                           f"Fix: choose another {option_name('--out')}")
    atomic_write_text(marker, json.dumps(identity, indent=2) + "\n")


def choose_predictions(run: Run, known: AnswerIndex, sample: int | None, seed: int, triples: Tensor | None,
                       source: str | None, restriction: CandidateRestriction | None = None) -> tuple[Tensor, str]:
    """The predictions [N, 3] and a sentence saying where they come from (``sample`` of the rank-first
    test triples drawn by ``seed``, all of them, or the given ``triples``)."""
    if triples is not None:
        if sample is not None:
            raise ConfigError(["sample: applies to the rank-first test triples, not to given triples; drop one of them"])
        return triples.long().reshape(-1, 3), f"the triples of {source or 'the caller'}"
    first = rank_first_test(run, known, restriction)
    among = ", among the tails' categories" if restriction is not None else ""
    how = f"the {len(first)} test triples ranked first, tail side, filtered{among}"
    if sample is None or sample >= len(first):
        return first, how
    chosen = first[sample_rows(len(first), sample, seed)]
    return chosen, f"{sample} drawn (seed {seed}) from {how}"


def removals(run: Run, predictions: Tensor, settings: FaithfulnessSettings, cache: Path,
             progress: bool) -> dict[str, list[list[int]]]:
    """Each method's ranked removals per prediction, up to the largest k.

    ``cache`` keeps them per triple (for this seed), so a rerun, or a run on a subset or a
    superset of the predictions, computes only what it has not seen.
    """
    k = max(settings.ks)
    saved = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else {}
    methods = saved.get("methods", {}) if saved.get("seed") == settings.seed else {}
    if saved.get("prover_run") != settings.prover_run:  # proofs of another prover run
        methods.pop("proof", None)
    rules = file_digest(settings.rules) if settings.rules else None
    if saved.get("rules") != rules:  # paths of other rules
        methods.pop("paths", None)
    inputs = MethodInputs(settings.seed, progress, settings.prover_run, settings.rules)
    keys = [",".join(map(str, row)) for row in as_rows(predictions)]
    removers = removal_methods()
    for name in settings.methods:
        signature = method_signature(name, inputs, run)  # rows of an earlier formula or other inputs are not reused
        have = {key: row for key, row in methods.get(name, {}).items()
                if row["k"] >= k and row.get("signature") == signature}  # computed for k or more
        missing = [i for i, key in enumerate(keys) if key not in have]
        if missing:
            found = removers[name](run, predictions[missing], k, inputs)
            have |= {keys[i]: {"k": k, "ranked": [int(x) for x in row], "signature": signature}
                     for i, row in zip(missing, found)}
        methods[name] = {**methods.get(name, {}), **have}
    atomic_write_text(cache, json.dumps({"seed": settings.seed, "prover_run": settings.prover_run, "rules": rules,
                                         "methods": methods}) + "\n")
    return {name: [methods[name][key]["ranked"][:k] for key in keys] for name in settings.methods}


def plan_cells(predictions: Tensor, ranked: dict[str, list[list[int]]], ks: tuple[int, ...]) -> list[Cell]:
    """Every (prediction, method, k) with its removed set (the method's first k) and that set's training key."""
    triples = [tuple(row) for row in as_rows(predictions)]
    cells = []
    for method, rows in ranked.items():
        for i, row in enumerate(rows):
            for k in sorted(set(ks)):
                removed = tuple(sorted(row[:k]))
                cells.append(Cell(i, triples[i], method, k, removed, job_key(removed)))
    return cells


def pending_jobs(run: Run, out: Path, here: str, settings: FaithfulnessSettings, start: int, epochs: int,
                 predictions: Tensor, cells: list[Cell]) -> list[Job]:
    """One job per distinct removed set (and the control, nothing removed) not yet measured on these predictions.

    A training redone because it lacks some predictions measures those it had as well, so
    that no measurement is lost.
    """
    sets = {job_key(()): ()} | {c.key: c.removed for c in cells}
    wanted = [tuple(row) for row in as_rows(predictions)]
    jobs = []
    for key, removed in sets.items():
        result_path = out / "jobs" / here / f"{key}.json"
        result = read_result(result_path)
        had = [tuple(p) for p in result["predictions"]] if result is not None else []
        if set(wanted) <= set(had):
            continue
        keep = str(out / "runs" / here / key) if settings.keep_runs else None
        measured = tuple(dict.fromkeys(wanted + had))
        jobs.append(Job(str(run.path), settings.mode, start, epochs, removed, measured, str(result_path), keep,
                        settings.threads, settings.device, settings.restrict))
    return jobs


# ----------------------------------------------------------------------------- results


class Results:
    """The finished trainings of one variant that the cells need: measures by (removed set, triple)."""

    def __init__(self, folder: Path, keys: set[str]):
        self.found: dict[str, dict] = {}
        self.rows: dict[str, dict[Triple, int]] = {}
        for key in keys:
            result = read_result(folder / f"{key}.json")
            if result is not None:
                self.found[key] = result
                self.rows[key] = {tuple(p): i for i, p in enumerate(result["predictions"])}

    def has(self, cell: Cell) -> bool:
        return cell.triple in self.rows.get(cell.key, {})

    def after(self, cells: list[Cell]) -> Measures:
        """Each cell's prediction as measured by the training without that cell's removed set, [len(cells)]."""
        parts = [Measures.from_dict(self.found[c.key]["measures"]).take(np.array([self.rows[c.key][c.triple]]))
                 for c in cells]
        return Measures(*(np.concatenate([getattr(p, name) for p in parts])
                          for name in ("score", "prob", "greater", "equal")))

    def seconds(self, cells: list[Cell]) -> float:
        return float(np.mean([self.found[c.key]["seconds"] for c in cells]))


def summarize_folder(run: Run, out: Path, here: str, settings: FaithfulnessSettings, predictions: Tensor, how: str,
                     before: Measures, cells: list[Cell], epochs: int) -> FaithfulnessResult:
    """The result: the table over every variant with results in ``out``, the cells, the agreement."""
    control_cells = [Cell(i, t, CONTROL, 0, (), job_key(())) for i, t in enumerate(tuple(r) for r in as_rows(predictions))]
    everything = cells + control_cells
    results = {name: Results(out / "jobs" / name, {c.key for c in everything}) for name in variants_in(out, here)}
    table, rows, control = [], [], {}
    for name, found in results.items():
        done = [c for c in everything if found.has(c)]
        table += table_rows(name, before, done, found)
        rows += cell_rows(run, name, before, [c for c in done if c.method != CONTROL], found)
        control[name] = control_change(before, [c for c in control_cells if found.has(c)], found)
    return FaithfulnessResult(
        run=str(run.path.resolve()), checkpoint=run.checkpoint.name, epochs=epochs,
        settings=RemovalSettings(ks=settings.ks, methods=settings.methods, mode=settings.mode, variant=here,
                                 seed=settings.seed, sample=settings.sample, prover_run=settings.prover_run,
                                 rules=settings.rules,
                                 restrict=settings.restrict),
        predictions=ExplainedPredictions(how, tuple(labels(run, row) for row in as_rows(predictions))),
        control_max_abs_score_change=control,
        table=tuple(table),
        agreement=tuple(agreement_rows(before, cells, results)),
        cells=tuple(rows),
    )


def variants_in(out: Path, here: str) -> list[str]:
    """Every variant with results in this folder and the one just run: retraining first, then fine-tuning variants."""
    found = {p.name for p in (out / "jobs").glob("*") if p.is_dir()} | {here}
    return sorted(found, key=lambda name: (name != "retrain", name))


def control_change(before: Measures, done: list[Cell], found: Results) -> float | None:
    """The largest |score change| that training again with nothing removed caused (0.0: training is reproducible)."""
    if not done:
        return None
    return float(np.max(np.abs(found.after(done).score - before.take(np.array([c.prediction for c in done])).score)))


def table_rows(name: str, before: Measures, done: list[Cell], found: Results) -> list[FaithfulnessRow]:
    """One row per (method, k) over the finished cells, the control (method 'none', k 0) first."""
    groups: dict[tuple[str, int], list[Cell]] = {}
    for cell in sorted(done, key=lambda c: c.method != CONTROL):
        groups.setdefault((cell.method, cell.k), []).append(cell)
    rows = []
    for (method, k), members in groups.items():
        index = np.array([c.prediction for c in members])
        summary = metrics.summarize(before.take(index), found.after(members))
        rows.append(FaithfulnessRow(variant=name, method=method, k=k,
                                    removed=float(np.mean([len(c.removed) for c in members])), **summary,
                                    seconds=found.seconds(members)))
    return rows


def cell_rows(run: Run, name: str, before: Measures, done: list[Cell], found: Results) -> list[CellRow]:
    """One row per finished cell: the triple, what was removed, the prediction before and after."""
    if not done:
        return []
    was, now = before.take(np.array([c.prediction for c in done])), found.after(done)
    change = metrics.changes(was, now)
    rows = []
    for j, cell in enumerate(done):
        head, relation, tail = labels(run, list(cell.triple))
        rows.append(CellRow(variant=name, prediction=cell.prediction, head=head, relation=relation, tail=tail,
                            method=cell.method, k=cell.k, removed=cell.removed,
                            score_before=float(was.score[j]), score_after=float(now.score[j]),
                            prob_before=float(was.prob[j]), prob_after=float(now.prob[j]),
                            rank_before=float(was.rank[j]), rank_after=float(now.rank[j]),
                            pd=bool(change["pd"][j]),
                            tc=None if np.isnan(change["tc"][j]) else bool(change["tc"][j])))
    return rows


def agreement_rows(before: Measures, cells: list[Cell], results: dict[str, Results]) -> list[AgreementRow]:
    """Each fine-tuning variant against retraining, over the cells both have: all of them, then per (method, k)."""
    if "retrain" not in results:
        return []
    rows = []
    for name in (n for n in results if n.startswith("finetune")):
        both = [c for c in cells if results[name].has(c) and results["retrain"].has(c)]
        groups = [("all", 0, both)] + [(m, k, [c for c in both if (c.method, c.k) == (m, k)])
                                       for m, k in dict.fromkeys((c.method, c.k) for c in both)]
        for method, k, members in groups:
            if not members:
                continue
            summary = metrics.agreement(before.take(np.array([c.prediction for c in members])),
                                        results[name].after(members), results["retrain"].after(members))
            rows.append(AgreementRow(cheap=name, method=method, k=k, **summary))
    return rows


def labels(run: Run, row: list[int]) -> tuple[str, str, str]:
    """[h, r, t] ids -> (head, relation, tail) labels."""
    h, r, t = row
    ds = run.dataset
    return ds.entity_label(h), ds.relation_label(r), ds.entity_label(t)


def write_outputs(out: Path, result: FaithfulnessResult) -> None:
    """faithfulness.json, the TSV tables (those with rows) and the plot, each written atomically."""
    atomic_write_text(out / "faithfulness.json", json.dumps(result.to_dict(), indent=1) + "\n")
    for name, table in (("faithfulness.tsv", "table"), ("cells.tsv", "cells"), ("agreement.tsv", "agreement")):
        if getattr(result, table):
            atomic_write_text(out / name, result.to_df(table=table).write_csv(separator="\t", quote_style="never"))
    save_figure(faithfulness_figure(result.table), out / "faithfulness.png")
