"""The metrics of a run folder: what kgtrace train reports after training, for the Python API too."""

from __future__ import annotations

from pathlib import Path

from kgtrace.distributed import ONE, World
from kgtrace.evaluation.evaluate import Metrics
from kgtrace.evaluation.sharded import evaluate_sharded
from kgtrace.run import load_run

__all__ = ["evaluate_run"]


def evaluate_run(run_dir: str | Path, split: str = "test", memory_budget: int = 2 << 30,
                 world: World = ONE) -> Metrics:
    """Filtered all-entity metrics of a run's best checkpoint (eager): what kgtrace train reports.

    world: split the ranking over a distributed job's processes (the same metrics).
    """
    run = load_run(run_dir)
    ds = run.dataset
    return evaluate_sharded(run.model, getattr(ds, split), world=world, known=ds.known_triples(split),
                            memory_budget=memory_budget)
