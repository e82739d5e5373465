"""The main job, ``kgtrace run``: train -> evaluate -> explain -> report in one run folder.

Each step writes its outputs atomically and is skipped when they already exist, so that a
re-run (after a kill, or to add a report) redoes only what is missing; once a step has
redone its work, every later step is redone too (its inputs changed). ``overwrite``
starts the run afresh. Outputs, beside what training writes:

    test_metrics.json       filtered test metrics (all entities, the three tie policies)
    test_ranks.tsv          each test query's ranks and true score
    explain/test.json       TracIn explanations of a few well-predicted test triples (+ .tsv)
    explain/predicted.json  ... of the model's best new tails for a few test queries (+ .tsv)
    report.html             everything above on one self-contained page
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from kgtrace.attribution import TracIn
from kgtrace.attribution.explanations import explain_triples, predicted_triples
from kgtrace.compute.system import resolve_device
from kgtrace.core.checkpoint import latest_checkpoint
from kgtrace.core.config import TrainConfig, read_yaml
from kgtrace.core.errors import ConfigError, KgtraceError, option, option_name
from kgtrace.core.layout import RunLayout
from kgtrace.core.owned import contents, folder_lock, read_mark
from kgtrace.evaluation.candidates import check_restrict
from kgtrace.evaluation.run_metrics import write_test_metrics
from kgtrace.report import write_report
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import dataset_source, resume, train

__all__ = ["JobSettings", "run_job"]


@dataclass(frozen=True)
class JobSettings:
    """What ``kgtrace run`` trains and explains; validated by `config`."""

    dataset: str = "umls"
    model: str = "conve"
    epochs: int = 100
    steps_per_epoch: int = 0  # 0: full epochs
    seed: int = 0
    threads: int = 0
    explain_triples: int = 3  # well-predicted test triples explained
    predict_queries: int = 2  # test queries whose best new tails are explained
    top_n: int = 3  # new tails per query
    top_k: int = 10  # proponents and opponents per explained triple
    restrict: tuple[str, ...] = ()  # candidates (--restrict); () or ("auto",): each relation's categories in training

    def plan(self, out: Path) -> str:
        """One line: what the job will do, and where."""
        steps = "" if not self.steps_per_epoch else f" of {self.steps_per_epoch} steps"
        return (f"kgtrace run: train {self.model} on {self.dataset} for {self.epochs} epochs{steps}, evaluate it on "
                f"the test split, explain {self.explain_triples} test triples and the best {self.top_n} new tails of "
                f"{self.predict_queries} test queries with TracIn, and write report.html, all into {out}")

    def config(self) -> TrainConfig:
        """The training config: checkpoints at a fifth of the epochs, so that TracIn has about five."""
        problems = [f"{key}={value}: must be at least 1" for key, value in
                    (("explain_triples", self.explain_triples), ("predict_queries", self.predict_queries),
                     ("top_n", self.top_n), ("top_k", self.top_k)) if value < 1]
        if problems:
            raise ConfigError(problems)
        check_restrict(self.restrict)
        return TrainConfig(dataset=self.dataset, model=self.model, epochs=self.epochs, seed=self.seed,
                           steps_per_epoch=self.steps_per_epoch, threads=self.threads,
                           checkpoint_every=max(1, self.epochs // 5)).validate()


def run_job(settings: JobSettings, out: str | Path, *, overwrite: bool = False, progress: bool = True,
            log: Callable[[str], None] = print) -> Path:
    """Train, evaluate, explain and report into ``out``, reusing finished steps; returns report.html's path."""
    out = Path(out)
    log(settings.plan(out))
    with ExitStack() as hold:  # the run's lock from training to the report: no other process writes between
        redo = _train_step(settings, out, overwrite, progress, log, hold)
        hold.enter_context(folder_lock(out, "run folder"))
        run = load_run(out, device=resolve_device("auto"))
        redo = _evaluate_step(run, settings.restrict, redo, log)
        redo = _explain_step(run, settings, redo, progress, log)
        return _report_step(out, redo, log)


# ----------------------------------------------------------------------------- steps


def _train_step(settings: JobSettings, out: Path, overwrite: bool, progress: bool, log, hold: ExitStack) -> bool:
    """Train, resume or reuse the run, its lock kept in ``hold``; True when weights changed."""

    config = settings.config()
    if overwrite or not contents(out):
        train(config, out, overwrite=overwrite, progress=progress, log=log, hold=hold)
        return True
    saved = _check_same_run(out, config)
    latest = latest_checkpoint(RunLayout(out).checkpoints)
    done = 0 if latest is None else int(latest.stem.split("-")[1])
    if done >= config.epochs:
        log(f"train: reusing {out} ({done} epochs)")
        return False
    log(f"train: resuming {out} at epoch {done} of {config.epochs} (it was set to {saved['epochs']})")
    resume(out, progress=progress, log=log, epochs=config.epochs, hold=hold)
    return True


def _check_same_run(out: Path, config: TrainConfig) -> dict:
    """The saved config of the run in ``out``; refused when kgtrace did not write it, when it was trained on
    other data, with another model or seed, or for more epochs than asked. Reusing the run for fewer epochs
    would report a model other than the one asked for."""
    mark = read_mark(out)
    config_file = RunLayout(out).config
    if mark is None or mark.kind != "run" or not config_file.is_file():
        raise KgtraceError(f"{option('--out', str(out))}: holds no run that kgtrace run wrote "
                           f"({', '.join(contents(out)[:5])}), so it is neither reused nor replaced. Fix: choose another "
                           f"{option_name('--out')}")
    saved = read_yaml(config_file)
    wanted = {**config.to_dict(), "dataset": dataset_source(config.dataset)}  # as training stores it
    differ = [f"{key}: {saved.get(key)!r} there, {wanted[key]!r} asked" for key in ("dataset", "model", "seed")
              if saved.get(key) != wanted[key]]
    if saved.get("steps_per_epoch", 0) != config.steps_per_epoch:
        differ.append(f"steps_per_epoch: {saved.get('steps_per_epoch', 0)} there, {config.steps_per_epoch} asked")
    if isinstance(saved.get("epochs"), int) and saved["epochs"] > config.epochs:
        differ.append(f"epochs: trained for {saved['epochs']} there, {option('--epochs', config.epochs)} asked "
                      f"({option('--epochs', saved['epochs'])} reuses it)")
    if differ:
        raise KgtraceError(f"{out}: holds another run ({'; '.join(differ)}). "
                           f"Fix: pass {option('--overwrite')} to replace it, or choose another {option_name('--out')}")
    return saved


def _evaluate_step(run, restrict: tuple[str, ...], redo: bool, log) -> bool:
    """test_metrics.json and test_ranks.tsv of the run's best checkpoint."""

    layout = RunLayout(run.path)
    if not redo and layout.test_metrics.is_file() and layout.test_ranks.is_file():
        log("evaluate: reusing test_metrics.json and test_ranks.tsv")
        return False
    evaluation = write_test_metrics(run, restrict=restrict)
    if evaluation.unrestricted is not None:
        log(f"evaluate: {evaluation.note}")
    m = evaluation.metrics.both.realistic
    log(f"evaluate: test MRR {m.mrr:.4f}, Hits@1 {m.hits_at[1]:.4f}, Hits@10 {m.hits_at[10]:.4f} (realistic)")
    return True


def _explain_step(run, settings: JobSettings, redo: bool, progress: bool, log) -> bool:
    """TracIn explanations of well-predicted test triples and of the best new tails of a few test queries."""
    folder = RunLayout(run.path).explain
    test_path, predicted_path = folder / "test.json", folder / "predicted.json"
    if not redo and test_path.is_file() and predicted_path.is_file():
        log("explain: reusing explain/test.json and explain/predicted.json")
        return False
    tracin = TracIn(run, params="last", device=next(run.model.parameters()).device)
    chosen = _well_predicted(run, settings.explain_triples)
    queries = chosen[: settings.predict_queries]
    predicted = torch.cat([predicted_triples(run, int(h), int(r), settings.top_n, restrict=settings.restrict)
                           for h, r, _ in queries.tolist()])
    epochs = [c.epoch for c in tracin.checkpoints]
    for triples, path in ((chosen, test_path), (predicted, predicted_path)):
        found = tracin.top_k(triples, settings.top_k, progress=progress)
        explain_triples(run, triples, found, epochs, restrict=settings.restrict).write(path)
    log(f"explain: {len(chosen)} test triples and {len(predicted)} new predictions, {len(epochs)} checkpoints")
    return True


def _well_predicted(run, count: int) -> torch.Tensor:
    """``count`` test triples whose tail the model ranks best (realistic; ties: test order)."""
    import polars as pl

    table = pl.read_csv(RunLayout(run.path).test_ranks, separator="\t")
    tails = table.filter(pl.col("side") == "tail").sort(["rank_realistic", "index"])
    rows = tails["index"].head(count).to_list()
    return run.dataset.test[torch.tensor(rows, dtype=torch.long)]


def _report_step(out: Path, redo: bool, log) -> Path:
    path = RunLayout(out).report
    if not redo and path.is_file():
        log(f"report: reusing {path}")
        return path
    write_report(out, path)
    log(f"report: wrote {path}")
    return path
