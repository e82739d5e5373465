"""A PyKEEN ConvE, DistMult or ComplEx as a kgtrace run: same scores, one checkpoint per epoch kept.

``import_pykeen(sources, out)`` reads the PyKEEN outputs (see
`kgtrace.interop.pykeen_source` for the accepted forms), converts every epoch's weights
to kgtrace's layout and writes a run folder that ``kgtrace.load_run``, ``kgtrace evaluate``
and ``kgtrace explain`` (TracIn, each checkpoint weighed by its learning rate) accept.

Where each piece comes from:

* weights: the checkpoints; ``trained_model.pkl`` only with ``trust_pickle`` (it is a pickle
  of the model object, and loading it runs code named in the file);
* id maps: ``training_triples/`` or the training-loop checkpoint; the run keeps PyKEEN's ids;
* hyperparameters: the weights' shapes, ``model_args``, the trusted pickle or the config.json
  of ``kgtrace export-pykeen``; what none of them records (ConvE's dropout rates, which act in
  training only) takes PyKEEN's defaults;
* learning rate of each epoch: ``lr``, else the training-loop checkpoint's optimizer;
* evaluation splits: ``dataset`` (its labels re-mapped through PyKEEN's ids); without it the
  run gets a dataset folder of PyKEEN's training triples, with the validation and testing
  factories' triples when the input has them (export-pykeen writes them), else empty.

``pykeen_import.json`` in the run records each of these choices.
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from kgtrace.core.checkpoint import save_checkpoint
from kgtrace.core.config import TrainConfig, write_yaml
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.io import atomic_folder, atomic_write_text
from kgtrace.core.layout import IMPORTED, RunLayout
from kgtrace.core.owned import check_out_folder, write_mark
from kgtrace.data.dataset import Dataset, dataset_inputs, load_dataset, save_dataset
from kgtrace.data.registry import DATASETS
from kgtrace.data.vocab import Vocab, write_vocab
from kgtrace.interop import pykeen as layout
from kgtrace.interop.pykeen_source import (
    CALLBACK_NAME_OFFSET,
    PICKLE_NAME,
    Snapshot,
    Source,
    fingerprint,
    pykeen_vocabs,
    read_source,
    split_triples,
)
from kgtrace.models import MODELS, build_model, hyperparameter_names, spec_named

PROVENANCE = IMPORTED
DATASET_FOLDER = "dataset"


@dataclass
class Plan:
    """Everything decided before anything is written."""

    name: str  # kgtrace model name
    args: dict[str, Any]
    origins: dict[str, str]  # hyperparameter -> where its value came from
    entities: Vocab
    relations: Vocab
    series: list[Snapshot]  # one per epoch, oldest first, each with epoch and lr
    best: Snapshot | None
    dataset: str  # the run's config.dataset
    own_dataset: Dataset | None  # written into the run when no dataset was given
    losses: list[float] | None
    seed: int
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ImportReport:
    out: Path
    model: str
    args: dict[str, Any]
    epochs: list[tuple[int, float]]  # (epoch, lr) per checkpoint
    dataset: str
    notes: list[str]

    def summary(self) -> str:
        epochs = ", ".join(f"{e} (lr {lr:g})" for e, lr in self.epochs)
        lines = [f"imported a PyKEEN {layout.PYKEEN_NAMES[self.model]} into {self.out}",
                 f"  hyperparameters: {json.dumps(self.args)}", f"  checkpoints of epochs {epochs}",
                 f"  dataset: {self.dataset}"]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def import_pykeen(sources: list[str | Path], out: str | Path, *, dataset: str | None = None, model: str | None = None,
                  model_args: dict[str, Any] | None = None, lr: float | None = None, trust_pickle: bool = False,
                  overwrite: bool = False) -> ImportReport:
    """Write the PyKEEN model in ``sources`` as a kgtrace run in ``out``; see the module docstring."""
    out = Path(out)
    check_out_folder(out, kind="run", overwrite=overwrite, inputs=[*sources, *(dataset_inputs(dataset) if dataset else [])])
    if lr is not None and not lr > 0:
        raise ConfigError([f"lr={lr}: must be positive, e.g. 0.001"])
    plan = make_plan(read_source(sources), out, dataset, model, dict(model_args or {}), lr, trust_pickle)
    with atomic_folder(out) as tmp:
        write_mark(tmp, "run")  # first: every file written after it is listed as kgtrace's
        write_run(plan, tmp, sources)
    return ImportReport(out, plan.name, plan.args, [(s.epoch, s.lr) for s in plan.series], plan.dataset, plan.notes)


def make_plan(source: Source, out: Path, dataset: str | None, model: str | None, given: dict[str, Any],
              lr: float | None, trust_pickle: bool) -> Plan:
    pickled = trusted_pickle(source, trust_pickle)
    recorded = pickled.recorded if pickled else export_record(source.export_config)
    notes = [f"{source.pickle} was not read (a pickle runs code when loaded); the checkpoints were"] if (
        source.pickle and not pickled) else []
    series, best = epoch_series(source, pickled, lr, notes)
    state = series[-1].state()
    name = model_name(model, recorded, state)
    args, origins = hyperparameters(name, state, recorded, given)
    entities, relations = pykeen_vocabs(source)
    if has_option(name) and state[layout.RELATION].shape[0] == 2 * len(relations) and "inverse_relations" not in given:
        args["inverse_relations"] = True
        origins["inverse_relations"] = "the weights' shapes (PyKEEN's inverse triples)"
    check_sizes(name, args, state, entities, relations)
    run_dataset, own = evaluation_data(dataset, entities, relations, source, out)
    losses = source.loop.losses or (source.results or {}).get("losses")
    plan = Plan(name, args, origins, entities, relations, series, best, run_dataset, own, losses,
                source.loop.seed or 0, notes)
    kgtrace_model(plan, state)  # every setting checked before anything is written
    return plan


def has_option(name: str) -> bool:
    """Whether model ``name`` has inverse relations as an option (``inverse_relations``), not always (ConvE, TuckER)."""
    return not spec_named(name).inverse_relations and "inverse_relations" in hyperparameter_names(MODELS[name])


# ----------------------------------------------------------------------------- the pickle


@dataclass
class Recorded:
    """The model class and the hyperparameters a file beside the weights records."""

    name: str  # kgtrace model name
    args: dict[str, Any]  # kgtrace model arguments the weights' shapes do not show
    where: str  # the file


@dataclass
class Pickled:
    snapshot: Snapshot
    recorded: Recorded


def kgtrace_name(pykeen_name: str, path: Path) -> str:
    name = {v: k for k, v in layout.PYKEEN_NAMES.items()}.get(pykeen_name)
    if name is None:
        raise KgtraceError(f"{path}: a PyKEEN {pykeen_name}; kgtrace imports {', '.join(layout.PYKEEN_NAMES.values())} only. "
                           "Fix: train one of those in PyKEEN")
    return name


def export_record(path: Path | None) -> Recorded | None:
    """What the config.json of kgtrace export-pykeen records."""
    if path is None:
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    name = kgtrace_name(str(config.get("model")), path)
    return Recorded(name, layout.recorded_args(name, config.get("model_kwargs") or {}), path.name)


def trusted_pickle(source: Source, trust: bool) -> Pickled | None:
    """The pipeline's trained_model.pkl, read only when trusted; without trust, refuse it if it is all there is."""
    if source.pickle is None:
        return None
    if not trust:
        if not source.snapshots:
            raise KgtraceError(
                f"{source.pickle}: the only weights here are in {PICKLE_NAME}, a pickle of the model object, and "
                "loading a pickle runs code named in the file. Fix: pass --trust-pickle if you trust where the file "
                "comes from, or import PyKEEN's checkpoints instead (training_kwargs checkpoint_name=..., or "
                "callbacks='checkpoint'), which are read without running code")
        return None
    return read_pickle(source.pickle, source)


def read_pickle(path: Path, source: Source) -> Pickled:
    try:
        import pykeen.models  # the pickle names PyKEEN's classes
    except ImportError:
        raise KgtraceError(f"{path}: reading {PICKLE_NAME} needs PyKEEN. Fix: pip install -e '.[pykeen]'") from None
    model = torch.load(path, map_location="cpu", weights_only=False)
    # The nearest PyKEEN class kgtrace maps on the model's MRO (a subclass of PyKEEN's ConvE is a ConvE).
    mapped = {getattr(pykeen.models, theirs): theirs for theirs in layout.PYKEEN_NAMES.values()}
    name = kgtrace_name(next((mapped[c] for c in type(model).__mro__ if c in mapped), type(model).__qualname__), path)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    losses = (source.results or {}).get("losses")
    snap = Snapshot(path, "pickled model", (), fingerprint(state), epoch=len(losses) if losses else None, loaded=state)
    return Pickled(snap, Recorded(name, pickled_args(name, model), PICKLE_NAME))


def pickled_args(name: str, model: nn.Module) -> dict[str, Any]:
    """The hyperparameters a PyKEEN model object knows and its weights do not show (the layout's ``attributes``;
    ConvE's image height and dropouts)."""
    if layout.layout_of(name).kind != "conve":
        return {ours: operator.attrgetter(path)(model) for ours, path in layout.layout_of(name).attributes}
    interaction = model.interaction
    args = {"embedding_height": interaction.shape_info.image_height,
            "apply_batch_normalization": any(isinstance(m, nn.BatchNorm2d) for m in interaction.hr2d)}
    for key, sequence, kind in (("input_dropout", interaction.hr2d, nn.Dropout),
                                ("feature_map_dropout", interaction.hr2d, nn.Dropout2d),
                                ("output_dropout", interaction.hr1d, nn.Dropout)):
        args[key] = next(float(m.p) for m in sequence if type(m) is kind)
    return args


# ----------------------------------------------------------------------------- the series of checkpoints


def epoch_series(source: Source, pickled: Pickled | None, lr: float | None,
                 notes: list[str]) -> tuple[list[Snapshot], Snapshot | None]:
    """One snapshot per epoch (oldest first) with its learning rate, and the best model if it differs from the last."""
    problems: list[str] = []
    snapshots = list(source.snapshots)
    number_callback_files(snapshots, problems, notes)
    by_epoch: dict[int, Snapshot] = {}
    for snap in sorted((s for s in snapshots if s.epoch is not None), key=lambda s: (s.epoch, s.lr is None)):
        kept = by_epoch.setdefault(snap.epoch, snap)
        if kept.fingerprint != snap.fingerprint:
            problems.append(f"{kept.path} and {snap.path}: both hold epoch {snap.epoch}, with different weights. "
                            "Fix: pass the checkpoints of one training run only")
    if not by_epoch and pickled is not None:
        epoch = pickled.snapshot.epoch or 1
        if pickled.snapshot.epoch is None:
            notes.append(f"no results.json with losses: the number of epochs is unknown; the model is recorded as epoch {epoch}")
        by_epoch[epoch] = pickled.snapshot
    series = [by_epoch[e] for e in sorted(by_epoch)]
    best = best_model(source, pickled, series[-1], problems) if series else None
    assign_learning_rates(series + ([best] if best else []), source, lr, problems, notes)
    if problems:
        raise KgtraceError("cannot import the PyKEEN checkpoints:\n  - " + "\n  - ".join(problems))
    return series, best


def number_callback_files(snapshots: list[Snapshot], problems: list[str], notes: list[str]) -> None:
    """Epochs of CheckpointTrainingCallback files, which record none: the number in the file name
    minus PyKEEN's offset, measured on a loop checkpoint with equal weights where there is one."""
    loops = {s.fingerprint: s.epoch for s in snapshots if s.kind == "loop checkpoint"}
    unnumbered = [s for s in snapshots if s.epoch is None]
    offsets = {s.number - loops[s.fingerprint] for s in unnumbered if s.number is not None and s.fingerprint in loops}
    if len(offsets) > 1:
        problems.append(f"the model checkpoints' file numbers do not follow the loop checkpoints' epochs "
                        f"(offsets {sorted(offsets)}). Fix: pass the checkpoints of one training run only")
    offset = offsets.pop() if len(offsets) == 1 else CALLBACK_NAME_OFFSET
    if unnumbered and not loops.keys() & {s.fingerprint for s in unnumbered}:
        notes.append(f"model checkpoints record no epoch: the file numbered n is taken as epoch n - {offset}, as "
                     "PyKEEN 1.11's CheckpointTrainingCallback names them (no loop checkpoint to check against)")
    for snap in unnumbered:
        if snap.number is None:
            problems.append(f"{snap.path}: a model checkpoint without a number in its name, so its epoch is unknown. "
                            "Fix: keep PyKEEN's names (checkpoint_{epoch:07d}.pt)")
        else:
            snap.epoch = snap.number - offset


def best_model(source: Source, pickled: Pickled | None, last: Snapshot, problems: list[str]) -> Snapshot | None:
    """The model PyKEEN finished with when it is not the last epoch's: early stopping restores its best
    epoch's weights, which the loop checkpoint keeps, and the pipeline pickles."""
    best = source.best
    if pickled is not None and pickled.snapshot is not last and pickled.snapshot.fingerprint != last.fingerprint:
        best_epoch = ((source.results or {}).get("stopper") or {}).get("best_epoch")
        if best_epoch is None:
            problems.append(f"{pickled.snapshot.path}: its weights are not those of the latest checkpoint ({last.path}), "
                            "and results.json names no early-stopping best epoch. Fix: pass the checkpoints of the "
                            "pipeline run that wrote it")
            return None
        best = pickled.snapshot
        best.epoch = int(best_epoch)
    return None if best is None or best.fingerprint == last.fingerprint else best


def assign_learning_rates(snapshots: list[Snapshot], source: Source, lr: float | None, problems: list[str],
                          notes: list[str]) -> None:
    """Each snapshot's rate: ``lr`` if given, else the optimizer's (constant without a scheduler)."""
    if lr is not None:
        for snap in snapshots:
            snap.lr = lr
        return
    if source.loop.scheduler:
        problems.append("PyKEEN ran an lr scheduler, and its checkpoints keep only the rate after the last step, not "
                        "the rate each epoch used. Fix: pass --lr RATE to weigh every checkpoint by RATE")
        return
    rates = {s.lr for s in source.snapshots if s.lr is not None}
    if len(rates) == 1:
        rate = rates.pop()
        for snap in snapshots:
            snap.lr = rate if snap.lr is None else snap.lr
        return
    missing = [s for s in snapshots if s.lr is None]
    if missing and not rates:
        problems.append(f"no learning rate: {missing[0].path} records none, and no training-loop checkpoint is "
                        "there to read the optimizer's from. Fix: pass --lr RATE (the optimizer_kwargs lr of the "
                        "pipeline; TracIn weighs each checkpoint by it)")
    elif missing:
        problems.append(f"the training-loop checkpoints record different learning rates ({sorted(rates)}), so the "
                        f"rate of {missing[0].path} is unknown. Fix: pass --lr RATE")
    if len({s.lr for s in snapshots}) > 1:
        notes.append("the learning rate changed between checkpoints; each keeps its own")


# ----------------------------------------------------------------------------- model and hyperparameters


def model_name(given: str | None, recorded: Recorded | None, state: dict[str, Tensor]) -> str:
    by_keys = layout.recognise(state)
    name = given or (recorded.name if recorded else None) or by_keys
    if name is None:
        plain = layout.plain_models()
        raise KgtraceError(f"the PyKEEN weights are two plain tables, which {', '.join(layout.PYKEEN_NAMES[n] for n in plain)} "
                           "share (the default regularizers that tell some apart are absent). Fix: pass --model NAME, "
                           f"one of {', '.join(plain)}")
    if name not in layout.PYKEEN_NAMES:
        raise ConfigError([f"model={name!r}: must be one of {', '.join(layout.PYKEEN_NAMES)}"])
    problems = layout.check_keys(name, state)
    if by_keys not in (None, name) or problems:
        found = f"those of a PyKEEN {layout.PYKEEN_NAMES[by_keys]}" if by_keys else "; ".join(problems)
        raise KgtraceError(f"the weights are not a PyKEEN {layout.PYKEEN_NAMES[name]}'s: {found}. "
                           "Fix: drop --model, or pass the model they belong to")
    return name


def hyperparameters(name: str, state: dict[str, Tensor], recorded: Recorded | None,
                    given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """kgtrace model arguments and where each came from: the shapes, ``given``, a record, PyKEEN's defaults."""
    args = layout.shape_args(name, state)
    origins = dict.fromkeys(args, "the weights' shapes")
    problems = [f"{key}={value!r} (--model-arg): the weights have {key}={args[key]!r}. Fix: drop it"
                for key, value in given.items() if key in args and value != args[key]]
    if layout.layout_of(name).kind == "conve":
        problems += conve_arguments(state, recorded or Recorded(name, {}, ""), given, args, origins)
    elif recorded:
        for key, value in recorded.args.items():
            args[key], origins[key] = value, recorded.where
    for key, value in layout.layout_of(name).implied:
        if key in given and given[key] != value:
            problems.append(f"{key}={given[key]!r} (--model-arg): PyKEEN's {layout.PYKEEN_NAMES[name]} scores as "
                            f"{key}={value!r}. Fix: drop it")
        args[key], origins[key] = value, f"PyKEEN's {layout.PYKEEN_NAMES[name]} (how it scores)"
    for key, value in given.items():
        args[key], origins[key] = value, "--model-arg"
    if problems:
        raise ConfigError(problems)
    return args, origins


def conve_arguments(state: dict[str, Tensor], recorded: Recorded, given: dict[str, Any],
                    args: dict[str, Any], origins: dict[str, str]) -> list[str]:
    """ConvE's image height (the weights may fit more than one) and dropout rates (not in the weights)."""
    if layout.conve_input_channels(state) != 1:
        return [f"input_channels={layout.conve_input_channels(state)}: kgtrace's ConvE has one input channel. "
                "Fix: train the PyKEEN ConvE with input_channels=1"]
    heights = layout.conve_heights(state)
    height = given.get("embedding_height", recorded.args.get("embedding_height"))
    dim = args["embedding_dim"]
    if height is not None and height not in heights:
        return [f"embedding_height={height}: does not fit the weights, which fit {heights or 'no height'}"]
    if height is None and len(heights) != 1:
        return [f"embedding_height: the weights fit {heights} alike (PyKEEN's default for embedding_dim={dim} is "
                f"{layout.pykeen_default_height(dim)}). Fix: pass --model-arg embedding_height=H with the height "
                "the model was trained with, or --trust-pickle with its trained_model.pkl"]
    args["embedding_height"] = heights[0] if height is None else height
    origins["embedding_height"] = "the weights' shapes" if height is None else (
        "--model-arg" if "embedding_height" in given else recorded.where)
    for key, default in layout.PYKEEN_CONVE_DROPOUTS.items():
        if key in recorded.args:
            args[key], origins[key] = recorded.args[key], recorded.where
        else:
            args[key] = default
            origins[key] = "PyKEEN's default (checkpoints do not record it; it acts in training only)"
    return []


def check_sizes(name: str, args: dict[str, Any], state: dict[str, Tensor], entities: Vocab, relations: Vocab) -> None:
    """The tables' rows must match the id maps; ConvE needs PyKEEN's inverse relations, DistMult and ComplEx have
    them exactly when ``args`` ask for inverse_relations."""
    problems = []
    rows, num = state[layout.ENTITY].shape[0], len(relations)
    if rows != len(entities):
        problems.append(f"the entity table has {rows} rows but entity_to_id {len(entities)} labels. "
                        "Fix: pass the id maps of the run that wrote these weights")
    have = state[layout.RELATION].shape[0]
    inverse = layout.has_inverse_relations(name, args)
    want = 2 * num if inverse else num
    if have != want:
        fix = (f"train the PyKEEN {layout.PYKEEN_NAMES[name]} with create_inverse_triples=True (kgtrace answers head "
               "queries through inverse relations)") if inverse else (
            f"train the PyKEEN {layout.PYKEEN_NAMES[name]} with create_inverse_triples=False (kgtrace's answers head "
            "queries with the relation itself)")
        if has_option(name):
            fix += ", or pass --model-arg inverse_relations=" + ("false" if inverse else "true")
        problems.append(f"the relation table has {have} rows for {num} relations; expected {want}. Fix: {fix}")
    if problems:
        raise KgtraceError("the PyKEEN weights do not fit:\n  - " + "\n  - ".join(problems))


def kgtrace_model(plan: Plan, state: dict[str, Tensor]) -> nn.Module:
    """A kgtrace model with PyKEEN weights ``state``, in eval mode."""
    model = build_model(plan.name, len(plan.entities), len(plan.relations), **plan.args)
    try:
        model.load_state_dict(layout.kgtrace_state_dict(plan.name, state, layout.has_inverse_relations(plan.name,
                                                                                                    plan.args)))
    except RuntimeError as e:
        raise KgtraceError(f"the PyKEEN weights do not fit a kgtrace {plan.name} with {json.dumps(plan.args)}: "
                           f"{str(e).splitlines()[-1].strip()}. Fix: check --model-arg") from None
    return model.eval()


# ----------------------------------------------------------------------------- evaluation data


def evaluation_data(dataset: str | None, entities: Vocab, relations: Vocab, source: Source,
                    out: Path) -> tuple[str, Dataset | None]:
    """The run's config.dataset, and the dataset to write into the run when none was given: PyKEEN's
    training triples, with validation_triples/ and testing_triples/ when the input has them."""
    train = split_triples(source, "train")
    if dataset is None:
        if train is None:
            raise KgtraceError("no training triples: the input has no training_triples/ folder. Fix: pass "
                               "--dataset umls|PATH (the data PyKEEN was trained on), or the pipeline folder")
        empty = torch.empty(0, 3, dtype=torch.long)
        valid, test = (split_triples(source, split) for split in ("valid", "test"))
        folder = str(out.resolve() / DATASET_FOLDER)
        return folder, Dataset(DATASET_FOLDER, folder, entities, relations, train,
                               empty if valid is None else valid, empty if test is None else test)
    check_labels(dataset, entities, relations)
    remapped = load_dataset(dataset, entities=entities, relations=relations)
    if train is not None:
        check_same_train(dataset, remapped.train, train, len(entities), len(relations))
    return (dataset if dataset in DATASETS else str(Path(dataset).resolve())), None


def check_labels(dataset: str, entities: Vocab, relations: Vocab) -> None:
    """Every label the dataset's triples use must be in PyKEEN's id maps."""
    ds = load_dataset(dataset)
    triples = ds.all_triples()
    used_entities = {ds.entities.labels[i] for i in torch.cat([triples[:, 0], triples[:, 2]]).unique().tolist()}
    used_relations = {ds.relations.labels[i] for i in triples[:, 1].unique().tolist()}
    problems = []
    for what, used, vocab in (("entity", used_entities, entities), ("relation", used_relations, relations)):
        missing = sorted(used - set(vocab.labels))
        if missing:
            problems.append(f"{len(missing)} {what} label(s) of the dataset are not in PyKEEN's {what}_to_id: "
                            f"{', '.join(map(repr, missing[:8]))}{' ...' if len(missing) > 8 else ''}")
    if problems:
        raise KgtraceError(f"--dataset {dataset}: its labels do not match the PyKEEN model's:\n  - "
                           + "\n  - ".join(problems) + "\nFix: pass the dataset the PyKEEN model was trained on")


def check_same_train(dataset: str, ours: Tensor, theirs: Tensor, num_entities: int, num_relations: int) -> None:
    """TracIn needs the real training set: the dataset's train split must be PyKEEN's training triples."""
    def keys(t: Tensor) -> Tensor:  # one int64 per triple
        return ((t[:, 0] * num_relations + t[:, 1]) * num_entities + t[:, 2]).unique()

    ours_k, theirs_k = keys(ours), keys(theirs)
    only_ours = int((~torch.isin(ours_k, theirs_k)).sum())
    only_theirs = int((~torch.isin(theirs_k, ours_k)).sum())
    if only_ours or only_theirs:
        raise KgtraceError(
            f"--dataset {dataset}: its train split is not the set of triples PyKEEN trained on ({only_ours} only in "
            f"the dataset, {only_theirs} only in PyKEEN's training_triples/), and kgtrace explain needs the real "
            "training set. Fix: pass the dataset PyKEEN was trained on, or drop --dataset to keep PyKEEN's training "
            "triples (the run then has no valid or test split)")


# ----------------------------------------------------------------------------- writing the run


def write_run(plan: Plan, folder: Path, sources: list[str | Path]) -> None:
    config = TrainConfig(dataset=plan.dataset, model=plan.name, model_args=plan.args, epochs=max(plan.series[-1].epoch, 1),
                         lr=plan.series[-1].lr, checkpoint_every=1, eval_every=0, seed=plan.seed).validate()
    layout = RunLayout(folder)
    write_vocab(plan.entities, layout.node_dict)
    write_vocab(plan.relations, layout.rel_dict)
    write_yaml(config.to_dict(), layout.config)
    if plan.own_dataset is not None:
        save_dataset(plan.own_dataset, folder / DATASET_FOLDER)
    for snap in plan.series:
        save_checkpoint(checkpoint(plan, snap, config), layout.epoch_checkpoint(snap.epoch))
    if plan.best is not None:
        save_checkpoint(checkpoint(plan, plan.best, config), layout.best_checkpoint)
    if plan.losses:
        lrs = {s.epoch: s.lr for s in plan.series}
        atomic_write_text(layout.metrics, (json.dumps({"epoch": i, "loss": loss, "lr": lrs.get(i)}) + "\n"
                                                     for i, loss in enumerate(plan.losses, 1)))
    atomic_write_text(folder / PROVENANCE, json.dumps(provenance(plan, sources), indent=2) + "\n")


def checkpoint(plan: Plan, snap: Snapshot, config: TrainConfig) -> dict[str, Any]:
    """A kgtrace checkpoint of ``snap``'s weights. It holds no optimizer state, so the run cannot be resumed."""
    model = kgtrace_model(plan, snap.state())
    return {
        "model": {"name": plan.name, "args": dict(plan.args), "num_entities": len(plan.entities),
                  "num_relations": len(plan.relations)},
        "entity_digest": plan.entities.digest(),
        "relation_digest": plan.relations.digest(),
        "model_state": model.state_dict(),
        "epoch": snap.epoch,
        "lr": snap.lr,
        "config": config.to_dict(),
        "imported_from": {"tool": "pykeen", "file": str(snap.path), "kind": snap.kind},
    }


def provenance(plan: Plan, sources: list[str | Path]) -> dict[str, Any]:
    return {
        "sources": [str(Path(s).resolve()) for s in sources],
        "model": layout.PYKEEN_NAMES[plan.name],
        "hyperparameters": {k: {"value": plan.args[k], "from": plan.origins.get(k, "")} for k in plan.args},
        "checkpoints": [{"epoch": s.epoch, "lr": s.lr, "file": str(s.path), "kind": s.kind} for s in plan.series],
        "best": None if plan.best is None else {"epoch": plan.best.epoch, "file": str(plan.best.path)},
        "dataset": plan.dataset,
        "config_not_from_pykeen": "config.yaml's training settings other than model, model_args, epochs, lr and "
                                  "seed are kgtrace's defaults, not PyKEEN's",
        "notes": plan.notes,
    }
