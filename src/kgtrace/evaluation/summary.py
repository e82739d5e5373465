"""One table across runs: each run's settings and filtered test metrics, as TSV and a plot.

Reads, per run folder, ``config.yaml`` and the metrics JSON that ``kgtrace evaluate --out``
(or ``kgtrace train``) wrote; the workflow's summary rule calls this through ``kgtrace summarize``.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from kgtrace.config import read_yaml
from kgtrace.errors import KgtraceError
from kgtrace.io import atomic_path

__all__ = ["plot_summary", "summarize_runs", "write_summary"]

METRICS = ("mrr", "mr", "hits_at_1", "hits_at_3", "hits_at_10")


def summarize_runs(run_dirs: list[str | Path], metrics_file: str = "test_metrics.json") -> pl.DataFrame:
    """One row per run: run, dataset, model, seed, epochs and the realistic metrics of both sides.

    Every missing or unreadable file is reported together in one KgtraceError.
    """
    rows, problems = [], []
    for run_dir in map(Path, run_dirs):
        missing = [name for name in ("config.yaml", metrics_file) if not (run_dir / name).is_file()]
        if missing:
            problems.append(f"{run_dir}: no {' and no '.join(missing)}")
            continue
        try:
            rows.append(_row(run_dir, metrics_file))
        except (ValueError, KeyError, TypeError) as e:  # a file that is not what evaluate and train write
            problems.append(f"{run_dir}: unreadable metrics or config ({type(e).__name__}: {e})")
    if problems:
        raise KgtraceError("cannot summarize:\n  - " + "\n  - ".join(problems)
                           + f"\nFix: run kgtrace evaluate RUN --out RUN/{metrics_file} for each run first")
    return pl.DataFrame(rows).sort(["dataset", "model", "seed"])


def _row(run_dir: Path, metrics_file: str) -> dict:
    config = read_yaml(run_dir / "config.yaml")
    metrics = json.loads((run_dir / metrics_file).read_text(encoding="utf-8"))
    both = metrics["both"]["realistic"]
    return {"run": run_dir.name, "dataset": Path(str(config["dataset"])).name, "model": config["model"],
            "seed": int(config["seed"]), "epochs": int(config["epochs"]), **{m: float(both[m]) for m in METRICS}}


def write_summary(table: pl.DataFrame, path: str | Path) -> None:
    """The table as TSV, atomically."""
    with atomic_path(path) as tmp:
        table.write_csv(tmp, separator="\t")


def plot_summary(table: pl.DataFrame, path: str | Path) -> None:
    """Test MRR per dataset and model, one point per seed, the mean as a bar."""
    from kgtrace.plots import plt, save_figure

    groups = table.group_by(["dataset", "model"], maintain_order=True).agg(pl.col("mrr"))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * groups.height + 2), 3.5))
    for i, (_, _, values) in enumerate(groups.iter_rows()):
        ax.bar(i, sum(values) / len(values), color="#9ecae1", width=0.6)
        ax.scatter([i] * len(values), values, color="#08519c", zorder=3, s=18)
    ax.set_xticks(range(groups.height), [f"{d}\n{m}" for d, m, _ in groups.iter_rows()])
    ax.set_ylabel("test MRR (filtered, realistic)")
    ax.set_ylim(0, 1)
    ax.set_title("kgtrace runs: mean over seeds (bars), each seed (points)")
    save_figure(fig, path)
