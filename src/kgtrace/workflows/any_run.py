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
    """The run in ``run_dir``, each kind with its ``model`` scoring triples.

    Args:
        run_dir: a run folder: an embedding run (``kgtrace train``, `pipeline`) or a prover run
            (``kgtrace prove``).
        checkpoint: ``None`` or ``"best"`` (the best validation MRR), ``"last"``, or a checkpoint file; a BFS
            prover run has none.
        device: where the model goes (``"cpu"``, ``"cuda"``, a `torch.device`).
        compile: a prover run's engine step and beam search through torch.compile (None: as its config
            says); an embedding run compiles nothing on load.

    Returns:
        A `Run` (model, dataset, config, checkpoints) or a `ProverRun` (rules, engine, scorer).

    Raises:
        KgtraceError: the folder holds neither kind of run, naming what it lacks.
    """
    if RunLayout(run_dir).kind == "prover":
        return load_prover_run(run_dir, checkpoint, device, compile=compile)
    return load_run(run_dir, checkpoint, device)
