"""The metrics of a run folder: what kgtrace train, run and evaluate report and write, for the Python API too."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kgtrace.compute.distributed import ONE, World
from kgtrace.core.io import atomic_write_text
from kgtrace.core.layout import RunLayout
from kgtrace.core.owned import retire
from kgtrace.display.plots import rank_histogram
from kgtrace.evaluation.candidates import restriction_note, restriction_of
from kgtrace.evaluation.evaluate import Candidates, Metrics, QueryRanks, metrics_of
from kgtrace.evaluation.output import query_table, write_query_table
from kgtrace.evaluation.sharded import rank_queries_sharded
from kgtrace.evaluation.sides import SIDES
from kgtrace.runs.embedding import Run, load_run

__all__ = ["RunEvaluation", "evaluate_run", "rank_run", "write_evaluation", "write_test_metrics"]


def evaluate_run(run_dir: str | Path, split: str = "test", memory_budget: int = 2 << 30,
                 world: World = ONE) -> Metrics:
    """Filtered all-entity metrics of a run's best checkpoint (eager), every entity a candidate.

    world: split the ranking over a distributed job's processes (the same metrics).
    """
    return rank_run(load_run(run_dir), split, restrict=("none",), memory_budget=memory_budget, world=world).metrics


@dataclass(frozen=True)
class RunEvaluation:
    """A run's split ranked: its ranks and metrics against the candidates asked, and against every entity.

    ranks, metrics: against the candidates (by default, where the dataset has node categories, each
    relation's heads and tails restricted to the categories it takes in training). unrestricted: the
    same queries' metrics against every entity (the figure the field publishes), None when the
    candidates were every entity already. note: what the candidates were, in one line.
    """

    ranks: QueryRanks
    metrics: Metrics
    unrestricted: Metrics | None
    note: str

    def to_dict(self) -> dict[str, Any]:
        """The metrics JSON: ``metrics.to_dict()``, and the unrestricted metrics under "unrestricted" when restricted."""
        extra = {} if self.unrestricted is None else {"unrestricted": self.unrestricted.to_dict()}
        return {**self.metrics.to_dict(), **extra}


def rank_run(run: Run, split: str = "test", *, restrict: Sequence[str] = (), corruptions: int = 0, seed: int = 0,
             compile: bool = False, sides: tuple[str, ...] = SIDES, ks: tuple[int, ...] = (1, 3, 10),
             memory_budget: int = 2 << 30, world: World = ONE) -> RunEvaluation:
    """Filtered ranks and metrics of a loaded run's ``split`` (test: filtered by train + valid + test; valid: by
    train + valid), each query ranked against all entities or ``corruptions`` sampled ones (``seed``), among those
    ``restrict`` allows (`restriction_of`: by default the categories each
    relation takes in training, where the dataset has categories). compile: rank all entities through
    torch.compile. world: a distributed job's processes share the ranking (the same metrics)."""
    ds = run.dataset
    triples, known = getattr(ds, split), ds.known_triples(split)
    restriction = restriction_of(ds, restrict)
    candidates = Candidates(corruptions=corruptions, seed=seed, restriction=restriction, compile=compile)

    def ranked(chosen: Candidates) -> QueryRanks:
        return rank_queries_sharded(run.model, triples, world=world, known=known, sides=sides, candidates=chosen,
                                    memory_budget=memory_budget)

    ranks = ranked(candidates)
    unrestricted = None if restriction is None else metrics_of(ranked(replace(candidates, restriction=None)), ks)
    return RunEvaluation(ranks, metrics_of(ranks, ks), unrestricted, restriction_note(restriction, restrict))


def write_test_metrics(run: Run, *, restrict: Sequence[str] = (), world: World = ONE,
                       memory_budget: int = 2 << 30) -> RunEvaluation:
    """Rank the loaded run's test split (filtered by train + valid + test, eager; candidates as ``restrict`` says,
    by default each relation's categories where the dataset has them) and write its ranks and metrics into the
    run folder: test_ranks.tsv (each query's ranks and true score), then, last, test_metrics.json, which says
    the step finished (an earlier one is removed first, so it is never read beside new ranks). What kgtrace
    train and kgtrace run leave after training.

    world: a distributed job's processes share the ranking; rank 0 writes.
    """
    layout = RunLayout(run.path)
    evaluation = rank_run(run, "test", restrict=restrict, memory_budget=memory_budget, world=world)
    if world.is_main:
        write_evaluation(run, evaluation, out=layout.test_metrics, per_query=layout.test_ranks)
    return evaluation


def write_evaluation(run: Run, evaluation: RunEvaluation, *, out: str | Path | None = None,
                     per_query: str | Path | None = None, histogram: str | Path | None = None, title: str = "",
                     extra: Mapping[str, Any] | None = None) -> None:
    """Write what an evaluation asks for: the per-query table (each query's ranks and true score; .tsv or
    .parquet), the histogram of the realistic ranks (PNG, titled ``title``), then, last, the metrics JSON
    (``evaluation.to_dict()`` and ``extra``'s keys, e.g. a prover's report). An earlier JSON is removed first:
    it is never read beside new companions, and present only once they are written."""
    ranks = evaluation.ranks
    if out:
        retire(out)
    if per_query:
        write_query_table(query_table(ranks, run.model, run.dataset.entities, run.dataset.relations), per_query)
    if histogram:
        rank_histogram({side: c.rank("realistic").numpy() for side, c in ranks.counts.items()}, histogram, title=title)
    if out:
        atomic_write_text(out, json.dumps({**evaluation.to_dict(), **(extra or {})}, indent=2) + "\n")
