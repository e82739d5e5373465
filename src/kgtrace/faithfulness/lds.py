"""The linear datamodeling score (LDS): how well summed attributions predict retrained models.

Park et al. (TRAK, 2023) judge a training-data attribution method tau by retraining: draw M
random subsets S_1 .. S_M of the training triples, each a fraction alpha of them, train one
model on each, and measure every explained prediction z with each model, f_m(z). The method
predicts that output by summing its attributions over the subset, g_m(z) = sum_{j in S_m}
tau(z, j). Then, per prediction,

    LDS(z) = Spearman( (f_1(z), ..., f_M(z)), (g_1(z), ..., g_M(z)) )

and the method's LDS is the mean over predictions, with a bootstrap interval over the
predictions (percentile, ``bootstrap`` resamples). A method that knows which triples raise a
prediction scores near 1; one that guesses scores near 0.

Outputs f: the prediction's score (``score_hrt``, a logit) and its log-probability among all
tails, log softmax_t score(h, r, .), from the probability the retraining jobs record (float64).
Attributions follow kgtrace's sign: positive means the triple raises the prediction's score.

The subsets are drawn from ``seed`` (each m its own generator seeded by (seed, m)), so that
adding subsets keeps the first ones. Each subset model is a retraining from scratch with the
run's config and seed without the other triples (`.retrain`: the same jobs, folder and
resumption as the removal check: ``jobs/retrain/KEY.json``). Attribution matrices [N, n_train]
are saved per method in ``lds/`` and reused when the predictions are the same.

Output folder (default RUN_DIR/faithfulness, shared with ``kgtrace faithfulness``)::

    lds.json              settings, predictions, subsets, outputs, per-method LDS and seconds
                          (`.results.LdsResult`, what `check_lds` returns)
    lds.tsv               one row per (method, output): mean LDS, interval, seconds
    lds-predictions.tsv   one row per (method, output, prediction): its LDS
    lds/METHOD.pt         the method's attribution matrix (float64) and what it was computed for
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import Tensor

from kgtrace.attribution.methods import METHOD_SPECS, AttributionInputs, attribution_signature, lds_methods
from kgtrace.attribution.methods import attributions as matrix_methods  # lds.attributions is this module's own
from kgtrace.compute.system import threads_problems
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.io import atomic_path, atomic_write_text
from kgtrace.core.owned import folder_lock
from kgtrace.data.answers import AnswerIndex
from kgtrace.faithfulness.experiment import choose_predictions, claim_folder, labels
from kgtrace.faithfulness.predictions import as_rows
from kgtrace.faithfulness.results import LdsResult, LdsRow
from kgtrace.faithfulness.retrain import Job, job_key, read_result, run_jobs
from kgtrace.runs.embedding import Run, load_run

__all__ = ["LdsInputs", "LdsResult", "LdsRow", "LdsSettings", "check_lds", "draw_subsets", "lds_scores",
           "load_lds_inputs", "spearman_rows", "summarize_lds"]

OUTPUTS = ("score", "log_prob")


@dataclass(frozen=True)
class LdsSettings:
    """How many subsets, how large, which methods; `validate` reports every bad value at once."""

    subsets: int = 50
    fraction: float = 0.5
    methods: tuple[str, ...] = field(default_factory=lds_methods)  # the methods whose specs say lds
    sample: int | None = None  # explain this many of the rank-first test triples, drawn at random
    seed: int = 0  # of the subsets, the sample and the random methods
    bootstrap: int = 1000  # resamples of the predictions for the interval
    jobs: int = 1  # trainings in parallel (processes)
    threads: int = 1  # torch threads per training
    device: str = "cpu"
    damping: float = 1e-3  # influence functions: the first damping tried
    trak_dim: int | None = None  # TRAK: projection dimension; None: the exact gradients
    trak_ridge: float | None = None  # TRAK: the ridge, a fraction of its kernel's mean nonzero eigenvalue; None: the model's

    def __post_init__(self) -> None:
        self.validate()  # a LdsSettings cannot be built invalid

    def validate(self) -> "LdsSettings":
        problems = []
        if self.subsets < 3:
            problems.append(f"subsets={self.subsets}: must be at least 3 (a rank correlation over fewer says nothing)")
        if not 0 < self.fraction < 1:
            problems.append(f"fraction={self.fraction}: must lie strictly between 0 and 1, e.g. 0.5")
        known = matrix_methods()
        unknown = [m for m in self.methods if m not in known]
        if unknown or not self.methods:
            problems.append(f"methods={','.join(self.methods)}: unknown method {', '.join(unknown) or '(none given)'}; "
                            f"choose from {', '.join(known)}")
        problems += [f"{key}={getattr(self, key)}: must be at least 1" for key in ("jobs", "threads", "bootstrap",
                                                                                    "trak_dim")
                     if getattr(self, key) is not None and getattr(self, key) < 1]
        problems += threads_problems(self.threads)
        if self.sample is not None and self.sample < 1:
            problems.append(f"sample={self.sample}: must be at least 1")
        problems += [f"{key}={getattr(self, key)}: must be positive" for key in ("damping", "trak_ridge")
                     if getattr(self, key) is not None and not getattr(self, key) > 0]
        if problems:
            raise ConfigError(problems)
        return self


@dataclass(frozen=True)
class MethodScores:
    """What scoring the methods gave: the table, each method's LDS per prediction, the methods that refused."""

    rows: tuple[LdsRow, ...]  # per method, its "score" then its "log_prob" row
    per_prediction: dict[str, dict[str, tuple[float | None, ...]]]  # method -> output -> [N] LDS (None: undefined)
    errors: dict[str, str]  # method -> why it was not scored


@dataclass(frozen=True)
class LdsInputs:
    """What the LDS of any method needs: the predictions, the subsets and the retrained outputs."""

    predictions: Tensor  # [N, 3] ids
    masks: np.ndarray  # [M, n_train] bool: True where training triple j is in subset m
    outputs: dict[str, np.ndarray]  # output name -> [M, N]
    training_seconds: float = 0.0  # mean seconds of one subset training


# ----------------------------------------------------------------------------- the arithmetic


def draw_subsets(n_train: int, subsets: int, fraction: float, seed: int) -> np.ndarray:
    """[subsets, n_train] bool: each row keeps round(fraction * n_train) triples, drawn by (seed, row)."""
    size = max(1, round(fraction * n_train))
    masks = np.zeros((subsets, n_train), dtype=bool)
    for m in range(subsets):
        generator = torch.Generator().manual_seed(seed * 1_000_003 + m)
        masks[m, torch.randperm(n_train, generator=generator)[:size].numpy()] = True
    return masks


def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman correlation of each column of ``a`` [M, N] with the same column of ``b`` [M, N] -> [N].

    Average ranks for ties; NaN where a column is constant (no order to agree with).
    """
    ra = _column_ranks(a)  # [M, N]
    rb = _column_ranks(b)  # [M, N]
    ra = ra - ra.mean(axis=0)
    rb = rb - rb.mean(axis=0)
    norm = np.sqrt((ra ** 2).sum(axis=0) * (rb ** 2).sum(axis=0))  # [N]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, (ra * rb).sum(axis=0) / np.where(norm > 0, norm, 1.0), np.nan)


def _column_ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based, ties share their mean rank) within each column of ``x`` [M, N] -> [M, N] float."""
    frame = pl.DataFrame(np.asarray(x, dtype=np.float64), orient="row")  # one column per prediction
    return frame.select(pl.all().rank("average")).to_numpy().astype(np.float64)


def lds_scores(outputs: np.ndarray, masks: np.ndarray, attributions: np.ndarray) -> np.ndarray:
    """LDS [N] of one method: outputs [M, N], masks [M, n_train], attributions [N, n_train] (module doc)."""
    predicted = masks.astype(np.float64) @ attributions.T.astype(np.float64)  # [M, N] summed over each subset
    return spearman_rows(outputs, predicted)


def summarize_lds(values: np.ndarray, bootstrap: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of the defined values and its percentile bootstrap interval (2.5, 97.5) over them."""
    defined = values[~np.isnan(values)]
    if not len(defined):
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = defined[rng.integers(0, len(defined), size=(bootstrap, len(defined)))].mean(axis=1)  # [bootstrap]
    return float(defined.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


# ----------------------------------------------------------------------------- the check


def check_lds(run_dir: str | Path, out: str | Path | None = None, settings: LdsSettings = LdsSettings(),
              triples: Tensor | None = None, triples_source: str | None = None, progress: bool = True,
              log: Callable[[str], None] = print) -> LdsResult:
    """Train the subset models, attribute with each method, score (module doc); writes into ``out``."""
    settings.validate()
    run = load_run(run_dir, "last")
    if not run.checkpoints:
        raise KgtraceError(f"{run.path}: the run has no epoch checkpoint. Fix: train it (kgtrace train --resume)")
    out = Path(out) if out is not None else Path(run_dir) / "faithfulness"
    claim_folder(out, run)
    with folder_lock(out, "faithfulness folder"):
        known = AnswerIndex.build(run.dataset.all_triples(), run.dataset.num_relations)
        predictions, how = choose_predictions(run, known, settings.sample, settings.seed, triples, triples_source)
        log(f"LDS of {len(predictions)} predictions ({how}) over {settings.subsets} subsets of "
            f"{settings.fraction:g} of the {len(run.dataset.train)} training triples")
        inputs = train_subsets(run, out, settings, predictions, progress)
        result = lds_result(run, settings, inputs, score_methods(run, out, settings, inputs, progress, log))
        write_lds(out, result)
        return result


def train_subsets(run: Run, out: Path, settings: LdsSettings, predictions: Tensor, progress: bool) -> LdsInputs:
    """Train (or reuse) one model per subset and read its outputs on the predictions."""
    masks = draw_subsets(len(run.dataset.train), settings.subsets, settings.fraction, settings.seed)
    epochs = run.checkpoints[-1].epoch
    wanted = [tuple(row) for row in as_rows(predictions)]
    jobs, paths = [], []
    for mask in masks:
        removed = tuple(int(j) for j in np.flatnonzero(~mask))
        path = out / "jobs" / "retrain" / f"{job_key(removed)}.json"
        paths.append(path)
        result = read_result(path)
        had = [tuple(p) for p in result["predictions"]] if result is not None else []
        if not set(wanted) <= set(had):
            jobs.append(Job(str(run.path), "retrain", 0, epochs, removed, tuple(dict.fromkeys(wanted + had)),
                            str(path), None, settings.threads, settings.device))
    run_jobs(jobs, settings.jobs, progress, desc="LDS subsets")
    outputs = {name: np.zeros((len(masks), len(wanted))) for name in OUTPUTS}
    seconds = []
    for m, path in enumerate(paths):
        result = read_result(path)
        seconds.append(result["seconds"])
        rows = {tuple(p): i for i, p in enumerate(result["predictions"])}
        at = np.array([rows[t] for t in wanted])
        outputs["score"][m] = np.asarray(result["measures"]["score"])[at]
        prob = np.asarray(result["measures"]["prob"], dtype=np.float64)
        outputs["log_prob"][m] = np.log(np.maximum(prob, np.finfo(np.float64).tiny))[at]  # an underflow: the floor
    return LdsInputs(predictions, masks, outputs, float(np.mean(seconds)))


def score_methods(run: Run, out: Path, settings: LdsSettings, inputs: LdsInputs, progress: bool,
                  log: Callable[[str], None]) -> MethodScores:
    """Each method's attributions (computed or reused), its LDS per prediction and the table."""
    extra = AttributionInputs(seed=settings.seed, progress=progress, damping=settings.damping,
                              trak_dim=settings.trak_dim, trak_ridge=settings.trak_ridge)
    rows, per_prediction, errors = [], {}, {}
    for method in settings.methods:
        try:
            matrix, seconds = attributions(run, out, method, inputs.predictions, extra)
        except KgtraceError as e:  # e.g. the exact Hessian of a model too large for it: say so, go on
            errors[method] = str(e)
            log(f"{method}: skipped: {e}")
            continue
        per_prediction[method] = {}
        for output in OUTPUTS:
            values = lds_scores(inputs.outputs[output], inputs.masks, matrix.numpy())
            mean, low, high = summarize_lds(values, settings.bootstrap, settings.seed)
            rows.append(LdsRow(method, output, mean, low, high, int((~np.isnan(values)).sum()), seconds))
            per_prediction[method][output] = tuple(None if np.isnan(v) else float(v) for v in values)
    return MethodScores(tuple(rows), per_prediction, errors)


def lds_result(run: Run, settings: LdsSettings, inputs: LdsInputs, scores: MethodScores) -> LdsResult:
    """What lds.json holds: the settings, the predictions, the scores and the subset models' outputs."""
    rows = as_rows(inputs.predictions)
    return LdsResult(run=str(run.path.resolve()), subsets=settings.subsets, fraction=settings.fraction,
                     seed=settings.seed, predictions=tuple(labels(run, row) for row in rows), rows=scores.rows,
                     per_prediction=scores.per_prediction, errors=scores.errors,
                     training_seconds=inputs.training_seconds, train_size=int(inputs.masks.shape[1]),
                     prediction_ids=tuple(tuple(row) for row in rows), outputs=dict(inputs.outputs))


def attributions(run: Run, out: Path, method: str, predictions: Tensor,
                 extra: AttributionInputs) -> tuple[Tensor, float]:
    """The method's [N, n_train] float64 attributions and the seconds they took (reused from ``lds/`` when saved)."""
    path = out / "lds" / f"{method}.pt"
    signature = {"method": method, "predictions": as_rows(predictions), **attribution_signature(method, extra, run)}
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        if saved["signature"] == json.dumps(signature):
            return saved["matrix"].detach(), float(saved["seconds"])
    start = time.perf_counter()
    matrix = METHOD_SPECS[method].compute(run, predictions, extra).detach().double()
    seconds = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save({"signature": json.dumps(signature), "matrix": matrix, "seconds": seconds}, tmp)
    return matrix, seconds


def load_lds_inputs(out: str | Path) -> LdsInputs:
    """The predictions, subsets and outputs that `check_lds` wrote into ``out`` (for peers' attributions)."""
    path = Path(out) / "lds.json"
    if not path.is_file():
        raise KgtraceError(f"{path}: no LDS results there. Fix: run kgtrace faithfulness RUN_DIR --lds --out {out}")
    saved = LdsResult.read(path)
    masks = draw_subsets(saved.train_size, saved.subsets, saved.fraction, saved.seed)
    return LdsInputs(torch.tensor(saved.prediction_ids, dtype=torch.long).reshape(-1, 3), masks, saved.outputs,
                     saved.training_seconds)


def write_lds(out: Path, result: LdsResult) -> None:
    """lds.json and the two TSV tables, each written atomically; nothing scored: lds.tsv one empty line,
    lds-predictions.tsv empty."""
    atomic_write_text(out / "lds.json", json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n")
    for name, table, empty in (("lds.tsv", "rows", "\n"), ("lds-predictions.tsv", "per_prediction", "")):
        frame = result.to_df(table=table)
        atomic_write_text(out / name, frame.write_csv(separator="\t", quote_style="never") if len(frame) else empty)
