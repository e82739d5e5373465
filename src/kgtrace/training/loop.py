"""Training: a short loop you can read top to bottom.

``train(config, out)`` builds the model, then for each epoch: shuffles the
queries with its own generator, takes Adam (or Adagrad) steps on the 1-N loss, validates every
``eval_every`` epochs (keeping the best checkpoint, stopping early after
``patience`` validations without improvement; with ``lr_patience``, decaying the learning
rate when validation stalls) and checkpoints every
``checkpoint_every`` epochs. Everything that influences the next epoch (weights,
optimizer, scheduler, scaler, both RNGs, early-stopping counters) is in the
checkpoint, so a resumed run ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import torch

from kgtrace.compute.compile import compile_default, logged_compilation
from kgtrace.compute.distributed import ONE, World
from kgtrace.compute.precision import matmul_mode, precision_problems
from kgtrace.compute.system import keep_freed_memory, resolve_device, threads_problems
from kgtrace.core.checkpoint import check_digests, latest_checkpoint, load_checkpoint, save_checkpoint
from kgtrace.core.config import TrainConfig, parse_size, read_yaml, unknown_keys, write_yaml
from kgtrace.core.errors import ConfigError, DataError, KgtraceError, on_command_line, option_name
from kgtrace.core.io import append_line, atomic_open, remove_stale_temporaries
from kgtrace.core.layout import RunLayout
from kgtrace.core.owned import check_out_folder, claim_out_folder, folder_lock, kept_note
from kgtrace.data.answers import AnswerIndex
from kgtrace.data.dataset import Dataset, dataset_inputs, load_dataset, split_path
from kgtrace.data.pinned import load_pinned_dataset, pin_splits
from kgtrace.data.registry import DATASETS, registered_name
from kgtrace.data.vocab import write_vocab
from kgtrace.display.frames import FrameKind, as_frame
from kgtrace.evaluation.evaluate import Candidates
from kgtrace.evaluation.sharded import evaluate_sharded
from kgtrace.models import build_model
from kgtrace.training.batches import Batches
from kgtrace.training.graphed import GraphedTraining, plain_optimizer_state
from kgtrace.training.sharded import sharded_epochs
from kgtrace.training.step import TrainState, run_epoch


@dataclass(frozen=True)
class TrainResult:
    """What a call of `train` or `resume` did; ``to_df()`` gives its epochs' losses and validations."""

    run_dir: Path
    epochs_completed: int
    best_epoch: int
    best_valid_mrr: float
    stopped_early: bool
    stopped_at_deadline: bool = False  # paused by ``deadline``: resume continues exactly where it stopped
    losses: tuple[float, ...] = ()  # mean training loss of each epoch this call trained, in order
    valid_mrrs: tuple[float | None, ...] = ()  # beside each: the validation MRR, None where none was taken

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """One row per epoch this call trained: epoch, loss, valid_mrr; kind "polars" or "pandas"."""
        first = self.epochs_completed - len(self.losses) + 1
        table = pl.DataFrame({"epoch": list(range(first, self.epochs_completed + 1)), "loss": list(self.losses),
                              "valid_mrr": list(self.valid_mrrs)}, schema={"epoch": pl.Int64, "loss": pl.Float64,
                                                                          "valid_mrr": pl.Float64})
        return as_frame(table, kind)


# ----------------------------------------------------------------------------- state and checkpoints


def new_state(config: TrainConfig, dataset: Dataset, device: torch.device) -> TrainState:
    torch.manual_seed(config.seed)
    model = build_model(config.model, dataset.num_entities, dataset.num_relations, **config.model_args).to(device)
    model.sparse_grad = config.sparse  # the tables' gradients: the rows read (kgtrace.models._tables.rows)
    optimizer = make_optimizer(config, model)
    scheduler = make_scheduler(config, optimizer)
    # Loss scaling guards fp16 gradients from underflow; bf16 and fp32 do not need it.
    scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
    shuffle = torch.Generator().manual_seed(config.seed + 1)
    return TrainState(model, optimizer, scheduler, scaler, shuffle)


# Where torch has a fused kernel for each optimizer: fused Adagrad is CPU-only (on CUDA its first step raises).
FUSED_DEVICES = {torch.optim.Adam: ("cpu", "cuda"), torch.optim.Adagrad: ("cpu",)}


def make_optimizer(config: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    # fused: one kernel per step instead of a handful per parameter, where the device has one (not for sparse
    # gradients, which only the unfused Adagrad takes).
    kind = torch.optim.Adagrad if config.optimizer == "adagrad" else torch.optim.Adam
    fused = next(model.parameters()).device.type in FUSED_DEVICES[kind] and not config.sparse
    if config.sparse:  # torch leaves its checks of sparse tensors off unless asked, and warns until told so
        torch.sparse.check_sparse_tensor_invariants.disable()
    return kind(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, fused=fused)


def make_scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """lr_decay after every epoch; with lr_patience, once validation MRR has not improved for more than
    lr_patience validations (ReduceLROnPlateau with LibKGE's settings: relative threshold 1e-4)."""
    if config.lr_patience:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=config.lr_decay,
                                                          patience=config.lr_patience, threshold=1e-4)
    return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=config.lr_decay)


def state_dict(state: TrainState, config: TrainConfig, dataset: Dataset, lr: float) -> dict[str, Any]:
    rng = {"torch": torch.get_rng_state(), "shuffle": state.shuffle.get_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    return {
        "model": {"name": config.model, "args": dict(config.model_args),
                  "num_entities": dataset.num_entities, "num_relations": dataset.num_relations},
        "entity_digest": dataset.entities.digest(),
        "relation_digest": dataset.relations.digest(),
        "model_state": state.model.state_dict(),
        "optimizer_state": plain_optimizer_state(state.optimizer),
        "scheduler_state": plain_scheduler_state(state.scheduler),
        "scaler_state": state.scaler.state_dict(),
        "epoch": state.epoch,
        "step": state.step,
        "lr": lr,
        "rng": rng,
        "config": config.to_dict(),
        "early_stopping": {"best_mrr": state.best_mrr, "best_epoch": state.best_epoch,
                           "bad_validations": state.bad_validations},
    }


def plain_scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler) -> dict[str, Any]:
    """The scheduler's state_dict with its last learning rates as floats (a captured run's are device tensors)."""
    saved = scheduler.state_dict()
    if "_last_lr" in saved:
        saved["_last_lr"] = [float(lr) for lr in saved["_last_lr"]]
    return saved


def restore_state(state: TrainState, saved: dict[str, Any]) -> None:
    state.model.load_state_dict(saved["model_state"])
    state.optimizer.load_state_dict(saved["optimizer_state"])
    state.scheduler.load_state_dict(saved["scheduler_state"])
    state.scaler.load_state_dict(saved["scaler_state"])
    state.epoch, state.step = int(saved["epoch"]), int(saved["step"])
    early = saved["early_stopping"]
    state.best_mrr, state.best_epoch = float(early["best_mrr"]), int(early["best_epoch"])
    state.bad_validations = int(early["bad_validations"])
    torch.set_rng_state(saved["rng"]["torch"])
    state.shuffle.set_state(saved["rng"]["shuffle"])
    if "cuda" in saved["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(saved["rng"]["cuda"])


# ----------------------------------------------------------------------------- run folder


def resume_hints() -> tuple[str, ...]:
    """How to continue a run found in the output folder, as its reader does it."""
    if on_command_line():
        return ("pass --resume to continue that run",)
    return ("call kgtrace.resume(out) to continue that run",)


def check_resumable(out: Path) -> None:
    """Refuse to resume a folder that holds no run (before anything is written into it)."""
    if not RunLayout(out).config.is_file():
        raise KgtraceError(f"{out}: no run to resume (config.yaml missing). Fix: drop {option_name('--resume')} to "
                           "start a new run")


RESUMABLE = ("epochs", "patience", "device", "threads", "compile", "captured_step")


def resume_config(out: Path, overrides: dict[str, Any]) -> TrainConfig:
    """The run's own config, with only the settings in RESUMABLE changed.

    Any other setting may be given again with the run's own value (the training command
    repeated with --resume); a different value is refused.
    """
    saved = read_yaml(RunLayout(out).config)
    given = {k: v for k, v in overrides.items() if v is not None}
    if "dataset" in given:
        given["dataset"] = dataset_source(given["dataset"])  # as training recorded it
    problems = unknown_keys(TrainConfig, given) + unknown_keys(TrainConfig, saved, f"{out / 'config.yaml'}: ")
    refused = sorted(k for k, v in given.items() if k in saved and k not in RESUMABLE and saved[k] != v)
    problems += [f"{k}={given[k]!r}: the run was trained with {saved[k]!r}; a resumed run keeps its settings (only "
                 f"{', '.join(RESUMABLE)} may change). Fix: drop --{k.replace('_', '-')}, or train a new run into "
                 "another --out" for k in refused]
    if problems:
        raise ConfigError(problems)
    return TrainConfig(**{**saved, **given}).validate()


def dataset_source(name: str) -> str:
    """Registered names (umls, fb15k237, ...) stay as they are (they win over a folder of the same
    name), and are recorded as registered in any other spelling ("FB15k-237"); folders as absolute paths."""
    path = Path(name)
    if name not in DATASETS and path.exists():
        return str(path.resolve())
    return registered_name(name) or name


def check_splits(dataset: Dataset, config: TrainConfig) -> None:
    """Refuse, before the first epoch, a split a run would need but that holds no triple (an empty train
    split is already refused by load_dataset)."""
    needed = {"test": "kgtrace train and kgtrace run rank the test split after training"}
    if config.eval_every:
        needed["valid"] = "validation every eval_every epochs ranks it (--eval-every 0 turns validation off)"
    empty = [f"{split_path(dataset, split)}: no triples (empty, or a header line only); {why}"
             for split, why in needed.items() if not len(getattr(dataset, split))]
    if empty:
        raise ConfigError([f"{line}. Fix: add triples (head<TAB>relation<TAB>tail per line), or split a triple file "
                           "with kgtrace prepare --triples FILE --out FOLDER" for line in empty])


def append_metrics(out: Path, record: dict[str, Any]) -> None:
    append_line(RunLayout(out).metrics, json.dumps(record))


def truncate_metrics(out: Path, epoch: int) -> None:
    """Keep the records of epochs up to the resumed checkpoint; later ones will be redone.

    A last line cut short (no newline, or not a JSON record) is what a kill during its append
    leaves: it is dropped, as the record of an epoch after the checkpoint. A bad line before the
    last is no kill's doing and is refused (DataError naming the file and line).
    """
    path = RunLayout(out).metrics
    if not path.is_file():
        return
    lines = path.read_bytes().split(b"\n")
    complete = lines[:-1]  # the part after the last newline is empty, or a torn append
    numbered = [(i, ln) for i, ln in enumerate(complete, 1) if ln.strip()]
    kept = []
    for position, (number, line) in enumerate(numbered):
        record = _metrics_record(line)
        if record is None:
            if position == len(numbered) - 1 and not lines[-1].strip():
                break  # the last line, written in part before a kill
            raise DataError(path, number, "not a JSON record with an integer 'epoch', and not the last line "
                            "(which a kill may leave half written)", "repair or delete that line, then resume again")
        if record["epoch"] <= epoch:
            kept.append(line.decode("utf-8") + "\n")
    with atomic_open(path) as f:
        f.write("".join(kept))


def _metrics_record(line: bytes) -> dict[str, Any] | None:
    """The record on a line of metrics.jsonl, or None when the line is not one."""
    try:
        record = json.loads(line.decode("utf-8"))
    except ValueError:  # also UnicodeDecodeError: a multi-byte character cut in two
        return None
    if not isinstance(record, dict) or not isinstance(record.get("epoch"), int):
        return None
    return record


# ----------------------------------------------------------------------------- the loop


def train(config: TrainConfig, out: str | Path, *, overwrite: bool = False, progress: bool = True,
          log=print, world: World = ONE, inputs: tuple[str | Path, ...] = (),
          deadline: float | None = None, hold: ExitStack | None = None) -> TrainResult:
    """Train a model as ``config`` says into a new run folder ``out``; see the module docstring.

    Args:
        config: the run's settings (`TrainConfig`), validated here again.
        out: the run folder to write.
        overwrite: replace ``out`` if it holds a run kgtrace wrote (see kgtrace.core.owned); never a folder
            holding the dataset or one of ``inputs`` (other files the run is made from, e.g. its config file).
        world: the processes of a distributed job (every one calls train alike; see training.sharded);
            only rank 0 writes into ``out``, holding its lock, and logs.
        deadline: a ``time.monotonic()`` value; the first epoch that ends after it is checkpointed and
            training pauses there (``resume`` goes on with the same result as one uninterrupted run).
        hold: the caller's stack to keep the run folder's lock in after training returns (until the caller
            has written what follows, e.g. the test metrics); None: released on return.
        progress: show progress bars.
        log: where the epoch lines go (``print``).
        inputs: other files the run is made from (e.g. its config file): never replaced.

    Returns:
        The epochs completed, the losses and validation MRRs per epoch, the best epoch (``.to_df()``).
    """
    out = Path(out)
    config = TrainConfig(**{**config.validate().to_dict(), "dataset": dataset_source(config.dataset)})
    inputs = (*dataset_inputs(config.dataset), *inputs)
    hints = resume_hints() if RunLayout(out).config.is_file() else ()
    world.on_main(lambda: check_out_folder(out, kind="run", overwrite=overwrite, inputs=inputs, hints=hints))
    device = setup_device(config, world)
    config = decided(config, device, world)
    dataset = load_dataset(config.dataset)
    check_splits(dataset, config)
    state = new_state(config, dataset, device)  # before the folder: a model that cannot be built leaves none
    with ExitStack() as held:
        def make_run_dir() -> None:
            out.mkdir(parents=True, exist_ok=True)
            (held if hold is None else hold).enter_context(folder_lock(out, "run folder"))
            note = kept_note(out, claim_out_folder(out, kind="run", overwrite=overwrite, inputs=inputs))
            if note:
                log(note)
            write_run_files(out, config, dataset)

        world.on_main(make_run_dir)
        with logged_compilation(RunLayout(out).compile_stats, config.compile and world.is_main, log):
            return fit(state, config, dataset, out, device, progress, log, world, deadline)


def resume(out: str | Path, *, progress: bool = True, log=print, world: World = ONE, deadline: float | None = None,
           hold: ExitStack | None = None, **overrides: Any) -> TrainResult:
    """Continue the run in ``out`` from its latest checkpoint, holding its lock.

    The result equals one uninterrupted run's: the model, the optimizer, the batches' order and the
    random state come back from the checkpoint.

    Args:
        out: the run folder (``kgtrace train`` or `train` wrote it).
        progress: show progress bars.
        log: where the epoch lines go (``print``).
        world: the processes of a distributed job, as in `train`.
        deadline: a ``time.monotonic()`` value at which training pauses again, as in `train`.
        hold: the caller's stack to keep the lock in after returning, as in `train`.
        **overrides: settings to change: only ``epochs``, ``patience``, ``device``, ``threads``, ``compile``
            and ``captured_step`` (``RESUMABLE``; e.g. ``epochs=200`` to train further); any other setting
            may be given with the run's own value, and a different one is refused.

    Returns:
        As `train`: the epochs completed, the losses and validation MRRs per epoch, the best epoch.
    """
    out = Path(out)
    check_resumable(out)
    with ExitStack() as held:
        world.on_main(lambda: (held if hold is None else hold).enter_context(folder_lock(out, "run folder")))
        config = resume_config(out, overrides)
        device = setup_device(config, world)
        config = with_captured_step(config, device, world)
        dataset = load_run_dataset(out, config)
        state = new_state(config, dataset, device)
        resume_from_latest(state, out, dataset, log if world.is_main else _quiet, writes=world.is_main)
        with logged_compilation(RunLayout(out).compile_stats, config.compile and world.is_main, log):
            return fit(state, config, dataset, out, device, progress, log, world, deadline)


def _quiet(*_: Any) -> None:
    """The log of a process other than rank 0."""


def setup_device(config: TrainConfig, world: World = ONE) -> torch.device:
    device = resolve_device(config.device)
    problems = precision_problems(config.precision, device) + threads_problems(config.threads)
    if world.distributed and config.sparse:  # its all-reduce sums dense gradients of the same layout
        problems.append("sparse=true: a distributed job all-reduces dense gradients; train on one process "
                        "(without torchrun), or set sparse false")
    if problems:
        raise ConfigError(problems)
    if config.threads:
        torch.set_num_threads(config.threads)
    if device.type == "cpu":
        keep_freed_memory()
    return device


def decided(config: TrainConfig, device: torch.device, world: World = ONE) -> TrainConfig:
    """A new run's captured_step and compile, decided for ``device`` where unset (a run records them).

    compile follows the one rule (compile_default), except that the chunked loss runs its own backward and
    sparse gradients are not compiled (both run eagerly), and that the captured step, one CUDA graph
    already, compiles its loss inside only when asked: its eager kernels are what was measured on a GPU.
    """
    config = with_captured_step(config, device, world)
    if config.compile is None:
        config = dataclasses.replace(config, compile=compile_default(device, None) and not config.entity_chunk
                                     and not config.sparse and not config.captured_step)
    return config


def with_captured_step(config: TrainConfig, device: torch.device, world: World = ONE) -> TrainConfig:
    """captured_step decided: as asked (a distributed job refused: it all-reduces every step), or unset: on CUDA,
    on one process, where the settings allow it (TrainConfig.captured_step_problems)."""
    if config.captured_step and world.distributed:
        raise ConfigError(["captured_step=true: a distributed job all-reduces the gradients every step; set "
                           "captured_step false (--no-captured-step)"])
    if config.captured_step is None:
        allowed = device.type == "cuda" and not world.distributed and not config.captured_step_problems()
        config = dataclasses.replace(config, captured_step=allowed)
    return config


def load_run_dataset(out: Path, config: TrainConfig) -> Dataset:
    """The run's dataset through the run's own id maps, refused if it changed since the run was trained."""
    return load_pinned_dataset(out, config.dataset)


def write_run_files(out: Path, config: TrainConfig, dataset: Dataset) -> None:
    layout = RunLayout(out)
    write_vocab(dataset.entities, layout.node_dict)
    write_vocab(dataset.relations, layout.rel_dict)
    pin_splits(out, dataset)
    write_yaml(config.to_dict(), layout.config)
    layout.checkpoints.mkdir(exist_ok=True)


#: What training writes into the run folder (checkpoints/ holds nothing else but training's files).
def remove_stale_run_temporaries(out: Path, log, run_files: tuple[str, ...] | None = None) -> None:
    """Remove what killed writes of a run left: checkpoints/'s temporary files, and the run folder's for ``run_files``
    (default: the files training writes there).

    The run folder's others may be those of a live ``kgtrace explain`` writing beside the run; they stay.
    """
    layout = RunLayout(out)
    removed = remove_stale_temporaries(layout.checkpoints) + remove_stale_temporaries(
        out, layout.training_files() if run_files is None else run_files)
    if removed:
        log(f"{out}: removed {len(removed)} temporary file(s) left by killed writes")


def resume_from_latest(state: TrainState, out: Path, dataset: Dataset, log, writes: bool = True) -> None:
    if writes:  # only this process trains the run (train and resume lock it): no other write is under way
        remove_stale_run_temporaries(out, log)
    path = latest_checkpoint(RunLayout(out).checkpoints)
    if path is None:
        log(f"{out}: no checkpoint yet; starting from epoch 0")
        if writes:
            truncate_metrics(out, 0)
        return
    saved = load_checkpoint(path)
    check_digests(saved, dataset.entities.digest(), dataset.relations.digest(), path)
    if "optimizer_state" not in saved:
        raise KgtraceError(f"{path}: holds weights only ({saved.get('imported_from', {}).get('tool', 'imported')} "
                           "checkpoint), no optimizer or random state to continue from. Fix: continue training where "
                           "the model came from, or train a new kgtrace run")
    restore_state(state, saved)
    if writes:
        truncate_metrics(out, state.epoch)
    log(f"resuming {out} from {path.name} (epoch {state.epoch}, step {state.step})")


def fit(state: TrainState, config: TrainConfig, dataset: Dataset, out: Path, device: torch.device,
        progress: bool, log, world: World = ONE, deadline: float | None = None) -> TrainResult:
    layout = RunLayout(out)
    batches = Batches.build(dataset.train, dataset.num_relations, config.training)
    known_valid = AnswerIndex.build(dataset.known_triples("valid"), dataset.num_relations)
    epoch = GraphedTraining(batches, device) if config.captured_step else run_epoch
    if world.distributed:  # every process takes its part of each batch; only rank 0 writes and logs
        epoch = sharded_epochs(state, batches, config, device, world)
        progress, log = progress and world.is_main, log if world.is_main else _quiet
    stopped_early = paused = False
    losses, valid_mrrs = [], []
    while state.epoch < config.epochs and not stopped_early and not paused:
        lr = float(state.optimizer.param_groups[0]["lr"])  # a device tensor in a captured run: read once an epoch
        start = time.perf_counter()
        with matmul_mode(config.precision):  # forward and backward alike (tf32; fp32 means IEEE float32)
            loss = epoch(state, batches, config, device, progress)
        state.epoch += 1
        if not config.lr_patience:
            state.scheduler.step()
        record = {"epoch": state.epoch, "step": state.step, "loss": loss, "lr": lr,
                  "seconds": time.perf_counter() - start}
        if config.eval_every and (state.epoch % config.eval_every == 0 or state.epoch == config.epochs):
            record.update(validate(state, config, dataset, known_valid, device, world))
            if config.lr_patience:
                state.scheduler.step(record["valid_mrr"])
            stopped_early = bool(config.patience) and state.bad_validations >= config.patience
            if record["valid_improved"] and world.is_main:
                save_checkpoint(state_dict(state, config, dataset, lr), layout.best_checkpoint)
        last = state.epoch == config.epochs or stopped_early
        # Every process takes the same decision (rank 0's clock), or the others would wait for it forever.
        paused = not last and deadline is not None and bool(world.broadcast_object(time.monotonic() > deadline))
        if world.is_main:
            # The record first: a kill between the two leaves a record that resume truncates, never a gap.
            append_metrics(out, record)
            if state.epoch % config.checkpoint_every == 0 or last or paused:
                save_checkpoint(state_dict(state, config, dataset, lr), layout.epoch_checkpoint(state.epoch))
        log(format_record(record))
        losses.append(float(loss))
        valid_mrrs.append(record.get("valid_mrr"))
    if world.is_main:
        plot_training_curve(out)
    world.barrier()  # the others may read the run (e.g. to evaluate it) once rank 0 has written it
    if paused:
        log(f"paused after epoch {state.epoch} (deadline); continue with kgtrace train --resume {out}")
    return TrainResult(out, state.epoch, state.best_epoch, state.best_mrr, stopped_early, paused, tuple(losses),
                       tuple(valid_mrrs))


def validate(state: TrainState, config: TrainConfig, dataset: Dataset, known: AnswerIndex,
             device: torch.device, world: World = ONE) -> dict[str, Any]:
    """Filtered validation metrics (never filtered with test) and the early-stopping bookkeeping."""
    result = evaluate_sharded(state.model, dataset.valid, world=world, known=known,
                              candidates=Candidates(compile=config.compile),
                              memory_budget=parse_size(config.memory_budget), device=device)
    metrics = result.both.realistic
    improved = metrics.mrr > state.best_mrr
    if improved:
        state.best_mrr, state.best_epoch, state.bad_validations = metrics.mrr, state.epoch, 0
    else:
        state.bad_validations += 1
    return {"valid_mrr": metrics.mrr, "valid_hits_at_1": metrics.hits_at[1],
            "valid_hits_at_10": metrics.hits_at[10], "valid_improved": improved,
            **{f"valid_{side}_mrr": m.realistic.mrr for side, m in result.sides.items()}}


def format_record(record: dict[str, Any]) -> str:
    text = f"epoch {record['epoch']:>4}  loss {record['loss']:.5f}  lr {record['lr']:.2e}  {record['seconds']:.2f}s"
    if "valid_mrr" in record:
        text += f"  valid MRR {record['valid_mrr']:.4f}" + ("  (best)" if record["valid_improved"] else "")
    return text


def plot_training_curve(out: Path) -> None:
    """training_curve.png: loss per epoch, validation MRR on a second axis."""
    from kgtrace.display.plots import training_curve

    layout = RunLayout(out)
    records = [json.loads(ln) for ln in layout.metrics.read_text(encoding="utf-8").splitlines() if ln]
    training_curve(records, layout.training_curve)
