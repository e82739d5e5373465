"""One retraining without a set of training triples, and the pool that runs many of them.

A `Job` names a run, a set of removed training triples and how to train without them:

* ``retrain``: from scratch with the run's config and seed (same initial weights, same
  learning-rate schedule) for as many epochs as the run's last checkpoint has;
* ``finetune``: the cheaper option: continue the run's checkpoint of epoch ``start_epoch``
  (weights, optimizer, scheduler and random states) on the reduced training set for the
  remaining epochs. With nothing removed both reproduce the run's last checkpoint.

Neither validates (eval_every 0) nor stops early: the model compared is the last epoch's.
The reduced training set is written as a dataset folder with the run's own id maps, so that
ids, and so scores, compare. The job measures every explained prediction on the new model
(`measure`) and writes the result atomically to
``Job.result``; a result file that exists is a finished job, which is how reruns resume.
Jobs are independent: `run_jobs` runs them in spawned processes, each with its own
torch threads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from kgtrace.compute.system import bar_disable
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import DataWarning
from kgtrace.core.io import atomic_write_text
from kgtrace.core.layout import RunLayout
from kgtrace.data.answers import AnswerIndex
from kgtrace.data.dataset import Dataset, load_dataset, save_dataset
from kgtrace.evaluation.candidates import restriction_of
from kgtrace.faithfulness.predictions import measure
from kgtrace.runs.embedding import Run, load_run
from kgtrace.training.loop import resume, train, write_run_files

__all__ = ["MODES", "Job", "job_key", "read_result", "reduced_dataset", "run_job", "run_jobs"]

MODES = ("retrain", "finetune")
_RUNS: dict[str, Run] = {}  # per process: runs already loaded by earlier jobs


@dataclass(frozen=True)
class Job:
    """One training without ``removed`` (indices into the run's training triples), measured on ``predictions``."""

    run_dir: str
    mode: str  # "retrain" | "finetune"
    start_epoch: int  # finetune: the checkpoint continued; retrain: 0
    epochs: int  # train up to this epoch (the run's last checkpoint)
    removed: tuple[int, ...]  # sorted
    predictions: tuple[tuple[int, int, int], ...]  # [N, 3] as nested tuples
    result: str  # the JSON file this job writes
    keep_run: str | None = None  # keep the trained run in this folder (else a temporary one)
    threads: int = 1
    device: str = "cpu"
    restrict: tuple[str, ...] = ()  # the ranks' candidates (--restrict), rebuilt from the run's dataset


def job_key(removed: tuple[int, ...]) -> str:
    """A file name for a removed set: the same set always gets the same key."""
    return hashlib.sha256(",".join(map(str, sorted(removed))).encode()).hexdigest()[:20]


def variant(mode: str, start_epoch: int) -> str:
    """The folder (and table label) of a way of training: 'retrain' or 'finetune-from-NNNN'."""
    return "retrain" if mode == "retrain" else f"finetune-from-{start_epoch:04d}"


def reduced_dataset(dataset: Dataset, removed: tuple[int, ...] | list[int]) -> Dataset:
    """``dataset`` without the training triples at ``removed``; ids and other splits unchanged."""
    keep = torch.ones(len(dataset.train), dtype=torch.bool)
    keep[torch.as_tensor(list(removed), dtype=torch.long)] = False
    return dataclasses.replace(dataset, train=dataset.train[keep])


def read_result(path: str | Path) -> dict | None:
    """A finished job's result, or None when there is none yet."""
    path = Path(path)
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- one job


def run_job(job: Job) -> str:
    """Train without ``job.removed``, measure the predictions, write ``job.result``; returns its path."""
    torch.set_num_threads(job.threads)
    run = _load(job.run_dir)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kgtrace-faithfulness-") as tmp:
        folder = Path(job.keep_run) if job.keep_run else Path(tmp)
        if job.keep_run:  # a folder of our own, left half-written by an interrupted attempt
            shutil.rmtree(folder, ignore_errors=True)
        data = folder / "data"
        save_dataset(reduced_dataset(run.dataset, job.removed), data)
        trained = folder / "run"
        with warnings.catch_warnings():
            # Removing training triples may leave a valid/test entity with none; the reduced data's
            # valid and test splits are never used (no validation, predictions measured below).
            warnings.simplefilter("ignore", DataWarning)
            TRAINERS[job.mode](run, data, trained, job)
            model = load_run(trained, "last", device=job.device).model
        known = AnswerIndex.build(run.dataset.all_triples(), run.dataset.num_relations)
        measures = measure(model, torch.tensor(job.predictions, dtype=torch.long).reshape(-1, 3), known,
                           restriction=restriction_of(run.dataset, job.restrict))
    record = {"mode": job.mode, "start_epoch": job.start_epoch, "epochs": job.epochs, "removed": list(job.removed),
              "train_size": len(run.dataset.train) - len(job.removed), "seconds": time.perf_counter() - start,
              "predictions": [list(p) for p in job.predictions], "measures": measures.to_dict()}
    atomic_write_text(job.result, json.dumps(record) + "\n")
    return job.result


def _load(run_dir: str) -> Run:
    if run_dir not in _RUNS:
        _RUNS[run_dir] = load_run(run_dir, "last")
    return _RUNS[run_dir]


def _config(run: Run, data: Path, job: Job) -> TrainConfig:
    """The run's config on the reduced data: same seed and schedule, no validation, one final checkpoint."""
    return TrainConfig(**{**run.config.to_dict(), "dataset": str(data), "epochs": job.epochs, "eval_every": 0,
                          "patience": 0, "checkpoint_every": job.epochs, "threads": job.threads,
                          "device": job.device}).validate()


def _quiet(*_args) -> None:
    """Training's per-epoch log lines, dropped: a progress bar counts whole jobs."""


def retrain(run: Run, data: Path, out: Path, job: Job) -> None:
    train(_config(run, data, job), out, progress=False, log=_quiet)


def finetune(run: Run, data: Path, out: Path, job: Job) -> None:
    """Continue the run's checkpoint of ``job.start_epoch`` on the reduced data (training's own resume)."""
    config = _config(run, data, job)
    out.mkdir(parents=True)
    dataset = load_dataset(data, entities=run.dataset.entities, relations=run.dataset.relations)
    write_run_files(out, config, dataset)
    shutil.copyfile(RunLayout(run.path).epoch_checkpoint(job.start_epoch),
                    RunLayout(out).epoch_checkpoint(job.start_epoch))
    resume(out, progress=False, log=_quiet)


#: How each mode trains without the removed triples (module doc).
TRAINERS: dict[str, Callable[[Run, Path, Path, Job], None]] = {"retrain": retrain, "finetune": finetune}


# ----------------------------------------------------------------------------- many jobs


def run_jobs(jobs: list[Job], workers: int = 1, progress: bool = True, desc: str = "retraining") -> None:
    """Run ``jobs``: in this process when ``workers`` is 1, else in a pool of spawned processes.

    Each finished job has written its result before the bar moves, so an interrupted call
    loses only the jobs in flight. The first failing job stops the rest (its error is raised).
    """
    if not jobs:
        return
    with tqdm(total=len(jobs), desc=desc, unit="job", disable=bar_disable(progress), smoothing=0.1) as bar:
        if workers == 1:
            for job in jobs:
                _in_process(job)
                bar.update()
            return
        context = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools and locks
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
            pending = {pool.submit(run_job, job) for job in jobs}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        future.result()  # raises the job's error
                        bar.update()
            except BaseException:
                for future in pending:
                    future.cancel()
                raise


def _in_process(job: Job) -> None:
    """Run a job here, leaving the caller's torch threads and random state as they were."""
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):
            run_job(job)
    finally:
        torch.set_num_threads(threads)
