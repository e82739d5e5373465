"""The metrics of a run folder: what kgtrace train reports and writes after training, for the Python API too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kgtrace.compute.distributed import ONE, World
from kgtrace.core.io import atomic_write_text
from kgtrace.core.layout import RunLayout
from kgtrace.core.owned import retire
from kgtrace.display.plots import rank_histogram
from kgtrace.evaluation.evaluate import Metrics, QueryRanks, metrics_of
from kgtrace.evaluation.output import query_table, write_query_table
from kgtrace.evaluation.sharded import evaluate_sharded, rank_queries_sharded
from kgtrace.runs.embedding import Run, load_run

__all__ = ["evaluate_run", "write_evaluation", "write_test_metrics"]


def evaluate_run(run_dir: str | Path, split: str = "test", memory_budget: int = 2 << 30,
                 world: World = ONE) -> Metrics:
    """Filtered all-entity metrics of a run's best checkpoint (eager): what kgtrace train reports.

    world: split the ranking over a distributed job's processes (the same metrics).
    """
    run = load_run(run_dir)
    ds = run.dataset
    return evaluate_sharded(run.model, getattr(ds, split), world=world, known=ds.known_triples(split),
                            memory_budget=memory_budget)


def write_test_metrics(run: Run, *, world: World = ONE, memory_budget: int = 2 << 30) -> Metrics:
    """Rank the loaded run's test split (filtered by train + valid + test, all entities, eager) and write its
    ranks and metrics into the run folder: test_ranks.tsv (each query's ranks and true score), then, last,
    test_metrics.json, which says the step finished (an earlier one is removed first, so it is never read
    beside new ranks). What kgtrace train and kgtrace run leave after training.

    world: a distributed job's processes share the ranking; rank 0 writes. Returns the metrics.
    """
    layout, ds = RunLayout(run.path), run.dataset
    ranks = rank_queries_sharded(run.model, ds.test, world=world, known=ds.known_triples("test"),
                                 memory_budget=memory_budget)
    metrics = metrics_of(ranks)
    if world.is_main:
        write_evaluation(run, ranks, metrics, out=layout.test_metrics, per_query=layout.test_ranks)
    return metrics


def write_evaluation(run: Run, ranks: QueryRanks, metrics: Metrics, *, out: str | Path | None = None,
                     per_query: str | Path | None = None, histogram: str | Path | None = None, title: str = "",
                     extra: Mapping[str, Any] | None = None) -> None:
    """Write what an evaluation asks for: the per-query table (each query's ranks and true score; .tsv or
    .parquet), the histogram of the realistic ranks (PNG, titled ``title``), then, last, the metrics JSON
    (``metrics.to_dict()`` and ``extra``'s keys, e.g. a prover's report). An earlier JSON is removed first: it
    is never read beside new companions, and present only once they are written."""
    if out:
        retire(out)
    if per_query:
        write_query_table(query_table(ranks, run.model, run.dataset.entities, run.dataset.relations), per_query)
    if histogram:
        rank_histogram({side: c.rank("realistic").numpy() for side, c in ranks.counts.items()}, histogram, title=title)
    if out:
        atomic_write_text(out, json.dumps({**metrics.to_dict(), **(extra or {})}, indent=2) + "\n")
