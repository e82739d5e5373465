"""One loader for any run folder: an embedding run (``kgtrace train``) or a prover run (``kgtrace prove``).

The folder says which it holds (`kgtrace.core.layout.RunLayout.kind`); only a prover run's loading enters
`kgtrace.prover`. ``kgtrace.load_run`` is this loader.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kgtrace.core.layout import RunLayout
from kgtrace.prover.run import ProverRun, load_prover_run
from kgtrace.runs.embedding import Run, load_run

__all__ = ["load_any_run"]


def load_any_run(run_dir: str | Path, checkpoint: str | Path | None = None, device: torch.device | str = "cpu", *,
                 compile: bool | None = None) -> Run | ProverRun:
    """The run in ``run_dir``: a `Run` (model, dataset, checkpoints) or a
    `ProverRun` (rules, engine, scorer), each with its ``model`` scoring triples.

    checkpoint: None/'best', 'last' or a file (a BFS prover run has none). compile: a prover run's engine step
    and beam search through torch.compile (None: as its config says); an embedding run compiles nothing on load.
    A folder with neither run is refused, naming what it lacks.
    """
    if RunLayout(run_dir).kind == "prover":
        return load_prover_run(run_dir, checkpoint, device, compile=compile)
    return load_run(run_dir, checkpoint, device)
