"""An embedding run folder loaded for use: `Run` (model, dataset, checkpoints) and `load_run`.

A prover run's counterpart is `kgtrace.prover.run`; `kgtrace.load_run` loads either.
"""

from kgtrace.runs.embedding import Run, load_run

__all__ = ["Run", "load_run"]
