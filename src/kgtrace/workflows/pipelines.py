"""``kgtrace.pipeline``: train a model and rank its test split in one call, from a notebook (PyKEEN's ``pipeline``).

``pipeline(dataset="umls", model="ConvE", epochs=30)`` trains into a run folder as ``kgtrace train`` does
(checkpoints, metrics.jsonl, the id maps), writes the test metrics beside them (test_ranks.tsv, then
test_metrics.json) and returns a `PipelineResult`: the run folder, the training's losses and
validations, and the filtered test metrics, each with ``to_df()``. The run folder then serves every other
command and function (``kgtrace.load_run``, ``kgtrace.TracIn``, ``kgtrace explain``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError
from kgtrace.display.frames import FrameKind
from kgtrace.evaluation.candidates import check_restrict
from kgtrace.evaluation.evaluate import Metrics
from kgtrace.evaluation.run_metrics import write_test_metrics
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import TrainResult, train

__all__ = ["PipelineResult", "pipeline"]


@dataclass(frozen=True)
class PipelineResult:
    """What `pipeline` did: where the run is, how training went, how the model ranks the test split."""

    run_dir: Path
    training: TrainResult  # epochs, losses and validation MRRs (``training.to_df()``: one row per epoch)
    metrics: Metrics  # filtered test metrics of the best checkpoint (``metrics.to_df()``)
    unrestricted: Metrics | None = None  # against every entity, when the candidates were restricted by category
    candidates: str = "candidates: every entity"  # what the test triples were ranked against

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """The test metrics as a frame (one row per side, tie policy and metric); kind "polars" or "pandas"."""
        return self.metrics.to_df(kind)

    def __repr__(self) -> str:
        m = self.metrics.both.realistic
        return (f"PipelineResult({self.run_dir}: {self.training.epochs_completed} epochs, test MRR {m.mrr:.4f}, "
                f"Hits@10 {m.hits_at[10]:.4f} (filtered, realistic ties))")


def pipeline(*, dataset: str = "umls", model: str = "conve", out: str | Path | None = None, overwrite: bool = False,
             restrict: Sequence[str] = (), progress: bool = False, log=print, **settings: Any) -> PipelineResult:
    """Train ``model`` on ``dataset`` and rank the test split; see the module docstring.

    Args:
        dataset: a registered dataset in any spelling ("umls", "FB15k-237"), or a dataset folder.
        model: a registered model in any spelling ("conve", "ConvE").
        out: the run folder; default ``runs/DATASET-MODEL``.
        overwrite: replace a run kgtrace wrote into ``out`` (never a folder holding anything else).
        restrict: the test ranking's candidates: by default, where the dataset has node categories, each
            relation's categories in training (the metrics against every entity are kept in ``unrestricted``);
            ``("none",)``: every entity.
        progress: show progress bars.
        log: where the epoch lines go (``print``).
        **settings: any other field of `TrainConfig` (``epochs=30``, ``lr=0.003``,
            ``model_args={"embedding_dim": 100}``); an unknown one is refused with the fields' names.

    Returns:
        A `PipelineResult`: the run folder, the training (losses and validation MRRs per epoch), the test
        metrics (``.to_df()``), and, where the candidates were restricted, the metrics against every entity.

    Raises:
        ConfigError: an unknown setting, or settings `TrainConfig` refuses, all listed at once.
    """
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError([f"{name}: not a setting of TrainConfig (settings: {', '.join(sorted(known))})"
                           for name in unknown])
    config = TrainConfig(dataset=dataset, model=model, **settings)
    check_restrict(restrict)  # before training: a malformed rule would fail only at the end
    run_dir = Path(out) if out is not None else Path("runs") / f"{Path(config.dataset).name}-{config.model}"
    with ExitStack() as hold:  # the run stays locked from training to its test metrics, as kgtrace train keeps it
        trained = train(config, run_dir, overwrite=overwrite, progress=progress, log=log, hold=hold)
        evaluation = write_test_metrics(load_run(run_dir), restrict=restrict)
    return PipelineResult(run_dir, trained, evaluation.metrics, evaluation.unrestricted, evaluation.note)
