"""One table across runs: each run's settings and filtered test metrics, as TSV and a plot.

Reads, per run folder, ``config.yaml`` and the metrics JSON that ``kgtrace evaluate --out``
(or ``kgtrace train``) wrote; the workflow's summary rule calls this through ``kgtrace summarize``.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from kgtrace.core.config import read_yaml
from kgtrace.core.errors import KgtraceError
from kgtrace.core.io import atomic_path
from kgtrace.core.layout import RunLayout

__all__ = ["plot_summary", "summarize_runs", "write_summary"]

METRICS = ("mrr", "mr", "hits_at_1", "hits_at_3", "hits_at_10")


def summarize_runs(run_dirs: list[str | Path], metrics_file: str = "test_metrics.json") -> pl.DataFrame:
    """One row per run: run, dataset, model, seed, epochs and the realistic filtered test metrics.

    Columns ``mrr``, ``mr``, ``hits_at_1/3/10`` are over both sides (head and tail queries together);
    ``head_mrr`` ... and ``tail_mrr`` ... are each side alone.

    Every missing or unreadable file is reported together in one KgtraceError.
    """
    rows, problems = [], []
    for run_dir in map(Path, run_dirs):
        missing = [name for name in ("config.yaml", metrics_file) if not (run_dir / name).is_file()]
        if missing:
            problems.append(f"{run_dir}: no {' and no '.join(missing)}")
            continue
        try:
            config = read_yaml(RunLayout(run_dir).config)
            row = _settings(config)
        except (OSError, ValueError, KeyError, TypeError, KgtraceError) as e:  # not a config.yaml that train writes
            problems.append(f"{run_dir}: unreadable {run_dir / 'config.yaml'} ({type(e).__name__}: {e})")
            continue
        try:
            metrics = json.loads((run_dir / metrics_file).read_text(encoding="utf-8"))
            row.update(_metrics(metrics))
        except (OSError, ValueError, KeyError, TypeError) as e:  # not a metrics JSON that evaluate writes
            problems.append(f"{run_dir}: unreadable {run_dir / metrics_file} ({type(e).__name__}: {e})")
            continue
        rows.append({"run": run_dir.name, **row})
    if problems:
        raise KgtraceError("cannot summarize:\n  - " + "\n  - ".join(problems)
                           + f"\nFix: run kgtrace evaluate RUN --out RUN/{metrics_file} for each run first")
    return pl.DataFrame(rows).sort(["dataset", "model", "seed"])


def _settings(config: dict) -> dict:
    return {"dataset": Path(str(config["dataset"])).name, "model": config["model"],
            "seed": int(config["seed"]), "epochs": int(config["epochs"])}


def _metrics(metrics: dict) -> dict:
    row = {}
    for side, prefix in (("both", ""), ("head", "head_"), ("tail", "tail_")):
        realistic = metrics[side]["realistic"]
        row.update({prefix + m: float(realistic[m]) for m in METRICS})
    return row


def write_summary(table: pl.DataFrame, path: str | Path) -> None:
    """The table as TSV, atomically."""
    with atomic_path(path) as tmp:
        table.write_csv(tmp, separator="\t")


def plot_summary(table: pl.DataFrame, path: str | Path) -> None:
    """Test MRR per dataset and model, one point per seed, the mean as a bar."""
    from kgtrace.display.plots import pyplot, save_figure

    groups = table.group_by(["dataset", "model"], maintain_order=True).agg(pl.col("mrr"))
    fig, ax = pyplot().subplots(figsize=(max(4.0, 1.2 * groups.height + 2), 3.5))
    for i, (_, _, values) in enumerate(groups.iter_rows()):
        ax.bar(i, sum(values) / len(values), color="#9ecae1", width=0.6)
        ax.scatter([i] * len(values), values, color="#08519c", zorder=3, s=18)
    ax.set_xticks(range(groups.height), [f"{d}\n{m}" for d, m, _ in groups.iter_rows()])
    ax.set_ylabel("test MRR (filtered, realistic)")
    ax.set_ylim(0, 1)
    ax.set_title("kgtrace runs: mean over seeds (bars), each seed (points)")
    save_figure(fig, path)
