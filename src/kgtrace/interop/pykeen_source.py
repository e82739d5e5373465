"""What a PyKEEN output holds: weights per epoch, learning rates, id maps, training triples.

Accepted inputs (files, or folders searched recursively), in any combination:

* a pipeline folder (``PipelineResult.save_to_directory``): ``training_triples/`` (id maps and
  the numeric training triples), ``results.json`` (losses per epoch), ``trained_model.pkl``
  (a pickle of the whole model: read only when the caller trusts it);
* training-loop checkpoints (``training_kwargs=dict(checkpoint_name=...)``): the weights,
  optimizer state (its learning rate), epoch, losses and id maps of the latest epoch; the loop
  overwrites its one file, so each copy kept is one epoch of a series;
* model checkpoints of ``CheckpointTrainingCallback`` (``callbacks="checkpoint"``): weights
  only, ``{"state_dict", "version"}``, one file per scheduled epoch;
* a folder of ``kgtrace export-pykeen``: model checkpoints with ``epoch`` and ``lr`` added, and
  a ``config.json`` naming the model class and its ``model_kwargs``.

Every ``.pt`` file is read by `load_weights_only`, which runs
no code from the file (PyKEEN pickles its loop checkpoints with protocol 5, which
``torch.load(weights_only=True)`` alone refuses).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import torch
from torch import Tensor

from kgtrace.core.errors import KgtraceError
from kgtrace.data.vocab import Vocab, read_vocab
from kgtrace.interop.safe_load import UnsafeFileError, load_weights_only

PICKLE_NAME = "trained_model.pkl"
EXPORT_FORMAT = "kgtrace-pykeen-export"  # config.json of kgtrace export-pykeen
#: TriplesFactory.to_path_binary folders: the pipeline writes the first; export-pykeen all three.
SPLIT_FOLDERS = {"training_triples": "train", "validation_triples": "valid", "testing_triples": "test"}
NUMBER = re.compile(r"(\d+)\D*$")
#: PyKEEN 1.11's CheckpointTrainingCallback adds 1 to the training loop's 1-based epoch, so the
#: file written after epoch e is named with e + 1 (checked: 3 epochs give checkpoint_0000002..4).
CALLBACK_NAME_OFFSET = 1


@dataclass
class Snapshot:
    """One set of PyKEEN weights: where it is, which epoch it ends and the learning rate then."""

    path: Path
    kind: str  # "loop checkpoint", "model checkpoint", "best model of a loop checkpoint", "pickled model"
    keys: tuple[str, ...]  # where the state dict sits in the loaded file
    fingerprint: str  # sha256 of the weights: equal weights, equal fingerprints
    epoch: int | None = None
    lr: float | None = None
    number: int | None = None  # the number in a model checkpoint's file name
    loaded: dict[str, Tensor] | None = None  # the state dict, when it is held in memory (a trusted pickle's)

    def state(self) -> dict[str, Tensor]:
        """The PyKEEN state dict (read again from the file unless held)."""
        if self.loaded is not None:
            return self.loaded
        data = load_weights_only(self.path)
        for key in self.keys:
            data = data[key]
        return dict(data)


@dataclass
class LoopInfo:
    """What training-loop checkpoints say beyond their weights."""

    entity_to_id: dict[str, int] | None = None
    relation_to_id: dict[str, int] | None = None
    losses: list[float] | None = None
    scheduler: bool = False  # an lr scheduler ran: the optimizer's rate is not every epoch's
    seed: int | None = None
    path: Path | None = None


@dataclass
class Source:
    """Everything found in the inputs; ``problems`` collects what could not be read."""

    snapshots: list[Snapshot] = field(default_factory=list)
    best: Snapshot | None = None  # early stopping's best model, kept in a loop checkpoint
    pickle: Path | None = None
    splits: dict[str, Path] = field(default_factory=dict)  # "train"/"valid"/"test" -> a triples factory folder
    results: dict[str, Any] | None = None
    loop: LoopInfo = field(default_factory=LoopInfo)
    export_config: Path | None = None  # config.json of kgtrace export-pykeen: model class and model_kwargs
    problems: list[str] = field(default_factory=list)


def read_source(paths: list[str | Path]) -> Source:
    """Find and read (safely) every PyKEEN artefact in ``paths``; raise once, listing all problems."""
    source = Source()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            source.problems.append(f"{path}: no such file or folder. Fix: check the path")
        elif path.is_dir():
            read_folder(source, path)
        else:
            read_file(source, path)
    if not source.problems and not source.snapshots and source.pickle is None:
        source.problems.append(
            f"{', '.join(map(str, paths))}: no PyKEEN weights found (no {PICKLE_NAME}, no checkpoint .pt file). Fix: "
            "pass a pipeline folder (save_to_directory), its checkpoint folder, or checkpoint files")
    if source.problems:
        raise KgtraceError("cannot import from PyKEEN:\n  - " + "\n  - ".join(source.problems))
    return source


def read_folder(source: Source, folder: Path) -> None:
    # kgtrace runs inside the folder (an earlier import's --out, say) are not PyKEEN's: skip them.
    runs = {p.parent for p in folder.rglob("config.yaml") if (p.parent / "node_dict").is_file()}
    for path in sorted(folder.rglob("*")):
        if runs.intersection(path.parents):
            continue
        if path.name == "numeric_triples.tsv.gz" and path.parent.name in SPLIT_FOLDERS:
            split = SPLIT_FOLDERS[path.parent.name]
            if source.splits.setdefault(split, path.parent) != path.parent:
                source.problems.append(f"{path.parent}: a second {path.parent.name}/ besides {source.splits[split]}. "
                                       "Fix: pass the folder of one pipeline run only")
        elif path.name in (PICKLE_NAME, "results.json") or path.suffix == ".pt":
            read_file(source, path)
        elif path.name == "config.json" and is_export_config(path):
            set_once(source, "export_config", path)


def is_export_config(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("format") == EXPORT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_file(source: Source, path: Path) -> None:
    if path.name == PICKLE_NAME:
        set_once(source, "pickle", path)
    elif path.name == "results.json":
        try:
            source.results = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            source.problems.append(f"{path}: not valid JSON ({e}). Fix: restore the file PyKEEN wrote, or remove it")
    else:
        read_checkpoint(source, path)


def set_once(source: Source, name: str, path: Path) -> None:
    """Record a one-of-a-kind artefact; a second one is a problem (which pipeline is meant?)."""
    if getattr(source, name) not in (None, path):
        source.problems.append(f"{path}: a second {path.name} besides {getattr(source, name)}. "
                               "Fix: pass the folder of one pipeline run only")
    setattr(source, name, path)


def read_checkpoint(source: Source, path: Path) -> None:
    try:
        data = load_weights_only(path)
    except UnsafeFileError as e:
        source.problems.append(f"{path}: {e}. Fix: pass PyKEEN checkpoints written by torch.save")
        return
    if isinstance(data, dict) and "model_state_dict" in data and "optimizer_state_dict" in data:
        read_loop_checkpoint(source, path, data)
    elif isinstance(data, dict) and "state_dict" in data and "version" in data:
        source.snapshots.append(model_checkpoint(path, data))
    elif isinstance(data, dict) and data.get("format") == "kgtrace-checkpoint":
        source.problems.append(f"{path}: a kgtrace checkpoint, not a PyKEEN one. Fix: the run is kgtrace's already; "
                               "use its folder directly")
    else:
        source.problems.append(f"{path}: not a PyKEEN checkpoint (neither a training-loop checkpoint with "
                               "model_state_dict nor a model checkpoint with state_dict). Fix: remove it from the input")


def model_checkpoint(path: Path, data: dict[str, Any]) -> Snapshot:
    """A CheckpointTrainingCallback file; kgtrace's exports add ``epoch`` and ``lr``."""
    match = NUMBER.search(path.stem)
    snap = Snapshot(path, "model checkpoint", ("state_dict",), fingerprint(data["state_dict"]),
                    number=int(match.group(1)) if match else None)
    if "epoch" in data:
        snap.epoch, snap.lr = int(data["epoch"]), float(data["lr"]) if data.get("lr") is not None else None
    return snap


def read_loop_checkpoint(source: Source, path: Path, data: dict[str, Any]) -> None:
    groups = data["optimizer_state_dict"].get("param_groups") or [{}]
    lrs = {float(g["lr"]) for g in groups if "lr" in g}
    snap = Snapshot(path, "loop checkpoint", ("model_state_dict",), fingerprint(data["model_state_dict"]),
                    epoch=int(data["epoch"]), lr=lrs.pop() if len(lrs) == 1 else None)
    source.snapshots.append(snap)
    loop = source.loop
    if snap.epoch >= latest_loop_epoch(source):  # the latest loop checkpoint speaks for the run
        best = data.get("best_epoch_model_checkpoint")  # early stopping's best epoch, a whole loop checkpoint
        source.best = Snapshot(path, "best model of a loop checkpoint", ("best_epoch_model_checkpoint", "model_state_dict"),
                               fingerprint(best["model_state_dict"]), epoch=int(best["epoch"])) if (
            isinstance(best, dict) and "model_state_dict" in best) else None
        loop.entity_to_id = data.get("entity_to_id_dict") or loop.entity_to_id
        loop.relation_to_id = data.get("relation_to_id_dict") or loop.relation_to_id
        loop.losses = [float(x) for x in data.get("loss") or []] or loop.losses
        loop.seed = data.get("random_seed") if isinstance(data.get("random_seed"), int) else loop.seed
        loop.path = path
    loop.scheduler = loop.scheduler or data.get("lr_scheduler_state_dict") is not None


def latest_loop_epoch(source: Source) -> int:
    return max((s.epoch for s in source.snapshots if s.kind == "loop checkpoint" and s.epoch is not None), default=-1)


def fingerprint(state: dict[str, Tensor]) -> str:
    digest = hashlib.sha256()
    for key in sorted(state):
        value = state[key]
        digest.update(key.encode())
        if isinstance(value, Tensor):
            digest.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- id maps and training triples


def pykeen_vocabs(source: Source) -> tuple[Vocab, Vocab]:
    """The id maps PyKEEN trained with: training_triples/ and the loop checkpoints must agree."""
    found: list[tuple[str, Vocab, Vocab]] = []
    for folder in source.splits.values():  # the evaluation factories must share the training maps
        found.append((str(folder), read_vocab(folder / "entity_to_id.tsv.gz"),
                      read_vocab(folder / "relation_to_id.tsv.gz")))
    if source.loop.entity_to_id and source.loop.relation_to_id:
        found.append((str(source.loop.path), vocab_of(source.loop.entity_to_id), vocab_of(source.loop.relation_to_id)))
    if not found:
        raise KgtraceError(
            "the PyKEEN input has no id maps (no training_triples/ folder, no training-loop checkpoint with "
            "entity_to_id_dict), so the rows of the weights cannot be matched to labels. Fix: add the pipeline "
            "folder that save_to_directory wrote (its training_triples/), or the training-loop checkpoint")
    where, entities, relations = found[0]
    for other, e, r in found[1:]:
        if (e, r) != (entities, relations):
            raise KgtraceError(f"{other}: its id maps differ from those in {where}. Fix: pass the outputs of one "
                               "PyKEEN run only")
    return entities, relations


def vocab_of(label_to_id: dict[str, int]) -> Vocab:
    labels = sorted(label_to_id, key=label_to_id.__getitem__)
    if [label_to_id[label] for label in labels] != list(range(len(labels))):
        raise KgtraceError("a PyKEEN id map whose ids are not 0..n-1. Fix: export the factory's maps unchanged")
    return Vocab(tuple(labels))


def split_triples(source: Source, split: str) -> Tensor | None:
    """PyKEEN's numeric triples [n, 3] (head, relation, tail) of ``split``, or None when the input has no such folder."""
    if split not in source.splits:
        return None
    frame = pl.read_csv(source.splits[split] / "numeric_triples.tsv.gz", separator="\t")
    return torch.from_numpy(frame.select(frame.columns[:3]).to_numpy().astype("int64"))

