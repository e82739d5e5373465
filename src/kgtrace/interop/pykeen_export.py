"""A kgtrace run as files PyKEEN loads: triples factories, state dicts and the model's settings.

Layout written by `export_pykeen`::

    config.json            model (PyKEEN class name), model_kwargs, create_inverse_triples, optimizer
                           settings, and the files below
    training_triples/      TriplesFactory.to_path_binary: id maps (the run's ids) and training triples
    validation_triples/    the same for valid and test, when the run's dataset has them
    testing_triples/
    model_state.pt         {"state_dict", "version": 1, "epoch", "lr"}: the run's model (best, else latest)
    checkpoints/           checkpoint_NNNNNNN.pt per epoch checkpoint, same format, named by the epoch

The state files are the format of ``pykeen.checkpoints.save_model`` (``epoch`` and ``lr`` added),
read with ``torch.load(weights_only=True)``; no pickle of code is written. Loading in PyKEEN::

    config = json.loads(Path(folder, "config.json").read_text())
    training = TriplesFactory.from_path_binary(Path(folder, "training_triples"))
    model = model_resolver.make(config["model"], config["model_kwargs"], triples_factory=training)
    model.load_state_dict(torch.load(Path(folder, "model_state.pt"), weights_only=True)["state_dict"])

(`load_exported` does just that.) ``kgtrace import-pykeen FOLDER`` reads it back.
Building the PyKEEN model needs PyKEEN; the export checks that its scores equal the run's.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from kgtrace.core.checkpoint import load_checkpoint
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.io import atomic_folder, atomic_open, atomic_write_text
from kgtrace.core.owned import check_out_folder, write_mark
from kgtrace.data.dataset import Dataset
from kgtrace.interop import pykeen as layout
from kgtrace.interop.pykeen_source import EXPORT_FORMAT as FORMAT
from kgtrace.models import MODELS
from kgtrace.runs.embedding import Run, load_run, model_from_checkpoint

SPLIT_FOLDERS = {"train": "training_triples", "valid": "validation_triples", "test": "testing_triples"}
TOLERANCE = 1e-4  # largest score difference accepted between the run and the exported PyKEEN model


@dataclass(frozen=True)
class ExportReport:
    out: Path
    model: str  # PyKEEN class name
    model_kwargs: dict[str, Any]
    epochs: list[int]
    max_score_difference: float

    def summary(self) -> str:
        return (f"exported a {self.model} with {json.dumps(self.model_kwargs)} and the checkpoints of epochs "
                f"{', '.join(map(str, self.epochs))} into {self.out}; PyKEEN's scores equal the run's "
                f"(largest difference {self.max_score_difference:.1e})")


def export_pykeen(run_dir: str | Path, out: str | Path, *, checkpoint: str | None = None,
                  overwrite: bool = False) -> ExportReport:
    """Write the run in ``run_dir`` (model of ``checkpoint``: best, last or a file) as PyKEEN files in ``out``."""
    pykeen = require_pykeen()
    out = Path(out)
    check_out_folder(out, kind="pykeen-export", overwrite=overwrite, inputs=[run_dir])
    run = load_run(run_dir, checkpoint)
    name, args = run.config.model, full_args(run.config.model, run.config.model_args)
    if name not in layout.PYKEEN_NAMES:
        raise KgtraceError(f"a {name} run: kgtrace exports {', '.join(layout.PYKEEN_NAMES)} runs to PyKEEN. Fix: "
                           "export a run of one of those models")
    if problems := layout.implied_problems(name, args):
        raise ConfigError(problems)
    factories = triples_factories(pykeen, run.dataset, inverse=layout.has_inverse_relations(name, args))
    kwargs = layout.pykeen_model_kwargs(name, args)
    # The seed only quiets PyKEEN's warning: every weight is overwritten next.
    theirs = pykeen.models.model_resolver.make(layout.PYKEEN_NAMES[name], kwargs, triples_factory=factories["train"],
                                               random_seed=0)
    state = layout.pykeen_state_dict(run.model, theirs.state_dict())
    theirs.load_state_dict(state)
    difference = score_difference(run.model, theirs, probe_triples(run.dataset))
    if not difference <= TOLERANCE:
        raise RuntimeError(f"the exported PyKEEN {layout.PYKEEN_NAMES[name]} scores differ from the run's by "
                           f"{difference:.2e}; this is a bug in kgtrace, please report it")
    with atomic_folder(out) as tmp:
        write_mark(tmp, "pykeen-export")  # first: every file written after it is listed as kgtrace's
        write_export(tmp, run, factories, state, theirs.state_dict(), kwargs)
    return ExportReport(out, layout.PYKEEN_NAMES[name], kwargs, [c.epoch for c in run.checkpoints], difference)


def require_pykeen():
    try:
        import pykeen.models  # noqa: F401
        import pykeen.triples  # noqa: F401
    except ImportError:
        raise KgtraceError("export-pykeen builds the PyKEEN model to check its scores, and PyKEEN is not installed. "
                           "Fix: pip install -e '.[pykeen]'") from None
    import pykeen

    return pykeen


def full_args(name: str, model_args: dict[str, Any]) -> dict[str, Any]:
    """kgtrace model arguments with the model class's defaults filled in (PyKEEN needs them all)."""
    defaults = {p.name: p.default for p in inspect.signature(MODELS[name]).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return {**defaults, **model_args}


def triples_factories(pykeen, dataset: Dataset, inverse: bool) -> dict[str, Any]:
    """PyKEEN TriplesFactory per non-empty split, all with the run's id maps."""
    maps = {"entity_to_id": dict(dataset.entities.to_id), "relation_to_id": dict(dataset.relations.to_id)}
    return {split: pykeen.triples.TriplesFactory(mapped_triples=getattr(dataset, split), create_inverse_triples=inverse,
                                                 **maps)
            for split in SPLIT_FOLDERS if split == "train" or len(getattr(dataset, split))}


def probe_triples(dataset: Dataset, limit: int = 512) -> Tensor:
    """Triples [n, 3] whose head and tail scores are compared: test (else train) triples, at most ``limit``."""
    triples = dataset.test if len(dataset.test) else dataset.train
    return triples[:limit]


@torch.no_grad()
def score_difference(ours: nn.Module, theirs, triples: Tensor) -> float:
    """Largest |difference| of all tail and head scores of ``triples`` [n, 3] (PyKEEN's predict_t / predict_h)."""
    theirs.eval()
    tails = (ours.score_t(triples[:, :2]) - theirs.predict_t(triples[:, :2])).abs().max()
    heads = (ours.score_h(triples[:, 1:]) - theirs.predict_h(triples[:, 1:])).abs().max()
    return float(torch.maximum(tails, heads))


def write_export(folder: Path, run: Run, factories: dict[str, Any], state: dict[str, Tensor],
                 template: dict[str, Tensor], kwargs: dict[str, Any]) -> None:
    for split, factory in factories.items():
        factory.to_path_binary(folder / SPLIT_FOLDERS[split])
    final = load_checkpoint(run.checkpoint)
    save_state({"state_dict": state, "version": 1, "epoch": int(final["epoch"]), "lr": float(final["lr"])},
               folder / "model_state.pt")
    entries = []
    for info in run.checkpoints:
        model = model_from_checkpoint(load_checkpoint(info.path))
        file = f"checkpoints/checkpoint_{info.epoch:07d}.pt"
        save_state({"state_dict": layout.pykeen_state_dict(model, template), "version": 1, "epoch": info.epoch,
                    "lr": info.lr}, folder / file)
        entries.append({"epoch": info.epoch, "lr": info.lr, "file": file})
    config = {
        "format": FORMAT, "version": 1,
        "model": layout.PYKEEN_NAMES[run.config.model], "model_kwargs": kwargs,
        "create_inverse_triples": layout.has_inverse_relations(run.config.model, run.config.model_args),
        "optimizer": "Adam", "optimizer_kwargs": {"lr": run.config.lr, "weight_decay": run.config.weight_decay},
        "model_state": "model_state.pt", "epoch": int(final["epoch"]), "checkpoints": entries,
        "triples": {split: folder_name for split, folder_name in SPLIT_FOLDERS.items() if split in factories},
        "kgtrace_run": str(run.path.resolve()), "kgtrace_checkpoint": str(run.checkpoint.resolve()),
    }
    atomic_write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")


def save_state(state: dict[str, Any], path: Path) -> None:
    with atomic_open(path, "wb") as f:
        torch.save(state, f)


def load_exported(folder: str | Path):
    """The PyKEEN model that ``export_pykeen`` wrote into ``folder``, in eval mode (needs PyKEEN)."""
    pykeen = require_pykeen()
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    training = pykeen.triples.TriplesFactory.from_path_binary(folder / "training_triples")
    model = pykeen.models.model_resolver.make(config["model"], config["model_kwargs"], triples_factory=training)
    model.load_state_dict(torch.load(folder / config["model_state"], weights_only=True)["state_dict"])
    return model.eval()
