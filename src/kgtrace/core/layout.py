"""The files of a run folder, named once: every module that reads or writes a run asks here.

    .kgtrace, .kgtrace.lock   kgtrace's marker and the writer's lock (kgtrace.core.owned)
    config.yaml               the resolved TrainConfig (a prover run: prover.yaml and rules.txt)
    node_dict, rel_dict       the id maps the run was trained with (label<TAB>id)
    data.json                 each split's digest and the id maps' (kgtrace.data.pinned)
    dataset.cache             a large dataset as reloading the run built it (kgtrace.data.cache)
    pykeen_import.json        where a run imported from PyKEEN came from (such a run has no data.json)
    checkpoints/              epoch-NNNN.pt every checkpoint_every epochs, and best.pt
    metrics.jsonl             one record per epoch
    training_curve.png        loss and validation MRR per epoch
    compile_stats.json        the compile counters of a compiled run
    test_metrics.json         filtered test metrics of the best checkpoint (kgtrace train, kgtrace run)
    test_ranks.tsv            each test query's ranks and true score (kgtrace train, kgtrace run)
    explain/                  test.json and predicted.json, each with its TSV (kgtrace run)
    report.html               the run on one page (kgtrace run, kgtrace report)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

EPOCH_FILE = re.compile(r"epoch-(\d+)\.pt")
PROVER_CONFIG = "prover.yaml"  # a prover run's config (kgtrace.prover.run), in place of config.yaml
RULES = "rules.txt"  # a prover run's rules
IMPORTED = "pykeen_import.json"  # where a run imported from PyKEEN came from (it pins no data.json)


def epoch_file(epoch: int) -> str:
    """The name of the checkpoint after ``epoch`` epochs: epoch-NNNN.pt."""
    return f"epoch-{epoch:04d}.pt"


@dataclass(frozen=True)
class RunLayout:
    """The paths of the run folder ``root`` (an embedding run's, or a prover run's)."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def prover_config(self) -> Path:
        return self.root / PROVER_CONFIG

    @property
    def kind(self) -> str | None:
        """"prover" (its prover.yaml), "embedding" (its config.yaml), or None: the folder holds no run."""
        if self.prover_config.is_file():
            return "prover"
        return "embedding" if self.config.is_file() else None

    @property
    def rules(self) -> Path:
        return self.root / RULES

    @property
    def node_dict(self) -> Path:
        return self.root / "node_dict"

    @property
    def rel_dict(self) -> Path:
        return self.root / "rel_dict"

    @property
    def data(self) -> Path:
        return self.root / "data.json"

    @property
    def dataset_cache(self) -> Path:
        return self.root / "dataset.cache"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def best_checkpoint(self) -> Path:
        return self.checkpoints / "best.pt"

    def epoch_checkpoint(self, epoch: int) -> Path:
        return self.checkpoints / epoch_file(epoch)

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def training_curve(self) -> Path:
        return self.root / "training_curve.png"

    @property
    def compile_stats(self) -> Path:
        return self.root / "compile_stats.json"

    @property
    def test_metrics(self) -> Path:
        return self.root / "test_metrics.json"

    @property
    def test_ranks(self) -> Path:
        return self.root / "test_ranks.tsv"

    @property
    def explain(self) -> Path:
        return self.root / "explain"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    def pinned(self, *, writes: tuple[Path, ...] = ()) -> tuple[Path, ...]:
        """What no command but its own writer may write into: the files the run is read from (config, id maps,
        data pin, checkpoints, metrics, marker and lock) and its products that others read (test metrics and
        ranks, the curve, the report), less ``writes`` (the products this command writes, e.g. evaluate's
        test_metrics.json)."""
        files = (self.config, self.prover_config, self.rules, self.node_dict, self.rel_dict, self.data,
                 self.dataset_cache, self.checkpoints, self.metrics, self.compile_stats, self.root / IMPORTED,
                 self.root / ".kgtrace",
                 self.root / ".kgtrace.lock", self.training_curve, self.test_metrics, self.test_ranks, self.report)
        mine = {p.resolve() for p in writes}
        return tuple(p for p in files if p.resolve() not in mine)

    def training_files(self) -> tuple[str, ...]:
        """The names of the files training writes at the folder's top (its temporaries are cleaned on resume)."""
        return tuple(p.name for p in (self.config, self.node_dict, self.rel_dict, self.data, self.metrics,
                                      self.training_curve, self.compile_stats, self.test_metrics))

    def prover_files(self) -> tuple[str, ...]:
        """The names of the files a prover run's training writes at the folder's top."""
        return tuple(p.name for p in (self.prover_config, self.rules, self.node_dict, self.rel_dict, self.data,
                                      self.metrics, self.compile_stats))
