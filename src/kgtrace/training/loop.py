"""Training: a short loop you can read top to bottom.

``train(config, out)`` builds the model, then for each epoch: shuffles the
queries with its own generator, takes Adam steps on the 1-N loss, validates every
``eval_every`` epochs (keeping the best checkpoint, stopping early after
``patience`` validations without improvement) and checkpoints every
``checkpoint_every`` epochs. Everything that influences the next epoch (weights,
optimizer, scheduler, scaler, both RNGs, early-stopping counters) is in the
checkpoint, so a resumed run ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from kgtrace.compile import logged_compilation
from kgtrace.config import TrainConfig, parse_size, read_yaml, write_yaml
from kgtrace.data.answers import AnswerIndex, reciprocal_queries
from kgtrace.data.dataset import Dataset, load_dataset
from kgtrace.data.vocab import write_vocab
from kgtrace.distributed import ONE, World
from kgtrace.errors import ConfigError, KgtraceError
from kgtrace.evaluation.evaluate import Candidates
from kgtrace.evaluation.sharded import evaluate_sharded
from kgtrace.io import atomic_open
from kgtrace.models import build_model
from kgtrace.system import keep_freed_memory
from kgtrace.training.checkpoint import (check_digests, epoch_path, latest_checkpoint, load_checkpoint,
                                         save_checkpoint)
from kgtrace.training.loss import kvsall_bce, kvsall_bce_chunked_backward, onevsall_ce

@dataclass
class TrainState:
    """What one epoch reads and changes."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    shuffle: torch.Generator  # orders the queries; separate from the global RNG used by dropout
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken
    best_mrr: float = -1.0
    best_epoch: int = 0
    bad_validations: int = 0


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    epochs_completed: int
    best_epoch: int
    best_valid_mrr: float
    stopped_early: bool


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise KgtraceError("device=cuda: no CUDA device is visible. Fix: use --device cpu or --device auto")
    return torch.device(name)


# ----------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class Batches:
    """The training examples of one epoch: (anchor, relation) queries and their positives.

    kvsall: one example per distinct query, positives from ``index``; 1vsall: one
    example per (triple, direction), its single answer in ``answers``.
    """

    queries: Tensor  # [N, 2]
    answers: Tensor | None  # [N] for 1vsall
    index: AnswerIndex | None  # for kvsall

    @classmethod
    def build(cls, train: Tensor, num_relations: int, mode: str) -> "Batches":
        if mode == "kvsall":
            index = AnswerIndex.build(train, num_relations)
            return cls(index.queries(), None, index)
        queries, answers = reciprocal_queries(train, num_relations)
        return cls(queries, answers, None)

    def __len__(self) -> int:
        return len(self.queries)


def batch_loss(model: nn.Module, batches: Batches, pos: Tensor, config: TrainConfig, device: torch.device, *,
               batch_rows: float | None = None) -> Tensor:
    """Mean loss of the examples at ``pos`` (forward only; chunked KvsAll also runs backward).

    batch_rows: the rows the mean is over (default len(pos)); a process of a distributed job
    holding part of a batch passes a share of the whole batch's rows (see training.sharded).
    """
    if config.compile:
        from kgtrace.training.compiled import compiled_batch_loss

        return compiled_batch_loss(model, batches, pos, config, device, batch_rows=batch_rows)
    queries = batches.queries[pos].to(device)
    if batches.index is None:
        return onevsall_ce(model.score_t(queries).float(), batches.answers[pos].to(device), batch_rows)
    rows, cols = batches.index.pairs_at(pos)
    rows, cols = rows.to(device), cols.to(device)
    denominator = batch_rows * model.num_entities if batch_rows is not None else None
    if config.entity_chunk:
        return kvsall_bce_chunked_backward(model, queries, rows, cols, config.label_smoothing, config.entity_chunk,
                                           denominator)
    return kvsall_bce(model.score_t(queries).float(), rows, cols, config.label_smoothing, denominator=denominator)


def backward_and_step(state: TrainState, loss: Tensor, sync: Callable[[], None] | None = None) -> None:
    """The loss's backward pass (unless the chunked loss already ran it), ``sync`` (a distributed job's
    gradient all-reduce), then one optimiser step."""
    if loss.requires_grad:
        state.scaler.scale(loss).backward()
    if sync is not None:
        sync()
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.step += 1


def run_epoch(state: TrainState, batches: Batches, config: TrainConfig, device: torch.device, progress: bool) -> float:
    """One pass over the shuffled examples; returns the mean batch loss."""
    state.model.train()
    order = torch.randperm(len(batches), generator=state.shuffle)
    autocast = precision_context(config.precision, device)
    total, count = torch.zeros((), device=device), 0
    bar = tqdm(order.split(config.batch_size), desc=f"epoch {state.epoch + 1}/{config.epochs}",
               leave=False, disable=not progress, unit="batch")
    for pos in bar:
        state.optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = batch_loss(state.model, batches, pos, config, device)
        backward_and_step(state, loss)
        # Summed on the device: reading the loss every step would stall a GPU.
        total, count = total + loss.detach().float(), count + 1
        if progress and count % 10 == 0:
            bar.set_postfix(loss=f"{float(total) / count:.4f}")
    return float(total) / max(count, 1)


def precision_context(precision: str, device: torch.device):
    """Autocast for bf16/fp16; fp32 runs as is."""
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


# ----------------------------------------------------------------------------- state and checkpoints


def new_state(config: TrainConfig, dataset: Dataset, device: torch.device) -> TrainState:
    torch.manual_seed(config.seed)
    model = build_model(config.model, dataset.num_entities, dataset.num_relations, **config.model_args).to(device)
    # fused: one kernel per step instead of a handful per parameter (CPU and CUDA alike).
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=config.lr_decay)
    # Loss scaling guards fp16 gradients from underflow; bf16 and fp32 do not need it.
    scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
    shuffle = torch.Generator().manual_seed(config.seed + 1)
    return TrainState(model, optimizer, scheduler, scaler, shuffle)


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
        "optimizer_state": state.optimizer.state_dict(),
        "scheduler_state": state.scheduler.state_dict(),
        "scaler_state": state.scaler.state_dict(),
        "epoch": state.epoch,
        "step": state.step,
        "lr": lr,
        "rng": rng,
        "config": config.to_dict(),
        "early_stopping": {"best_mrr": state.best_mrr, "best_epoch": state.best_epoch,
                           "bad_validations": state.bad_validations},
    }


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


def prepare_run_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber: a non-empty folder needs --resume (a run) or --overwrite (a run, replaced)."""
    if resume and overwrite:
        raise ConfigError(["resume and overwrite: choose one; --resume continues the run, --overwrite replaces it"])
    existing = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if resume:
        if not (out / "config.yaml").is_file():
            raise KgtraceError(f"{out}: no run to resume (config.yaml missing). Fix: drop --resume to start a new run")
        return
    if not existing:
        out.mkdir(parents=True, exist_ok=True)
        return
    if not overwrite:
        raise KgtraceError(f"{out}: folder is not empty ({', '.join(existing[:5])}). "
                           "Fix: pass --resume to continue that run, --overwrite to replace it, or choose another --out")
    if not (out / "config.yaml").is_file():
        raise KgtraceError(f"{out}: --overwrite only replaces a kgtrace run folder, and this one has no "
                           "config.yaml. Fix: choose another --out")
    shutil.rmtree(out)
    out.mkdir(parents=True)


RESUMABLE = ("epochs", "patience", "device", "threads", "compile")


def resume_config(out: Path, overrides: dict[str, Any]) -> TrainConfig:
    """The run's own config, with only the settings in RESUMABLE changed."""
    refused = sorted(k for k, v in overrides.items() if v is not None and k not in RESUMABLE)
    if refused:
        raise ConfigError([f"{k}: a resumed run keeps its settings; only {', '.join(RESUMABLE)} may change"
                           for k in refused])
    saved = read_yaml(out / "config.yaml")
    return TrainConfig(**{**saved, **{k: v for k, v in overrides.items() if v is not None}}).validate()


def dataset_source(name: str) -> str:
    """Bundled names stay as they are; folders are recorded as absolute paths."""
    path = Path(name)
    return str(path.resolve()) if path.exists() else name


def append_metrics(out: Path, record: dict[str, Any]) -> None:
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def truncate_metrics(out: Path, epoch: int) -> None:
    """Keep the records of epochs up to the resumed checkpoint; later ones will be redone."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and json.loads(ln)["epoch"] <= epoch]
    with atomic_open(path) as f:
        f.write("".join(ln + "\n" for ln in lines))


# ----------------------------------------------------------------------------- the loop


def train(config: TrainConfig, out: str | Path, *, overwrite: bool = False, progress: bool = True,
          log=print, world: World = ONE) -> TrainResult:
    """Train a model as ``config`` says into a new run folder ``out``; see the module docstring.

    world: the processes of a distributed job (every one calls train alike; see training.sharded);
    only rank 0 writes into ``out`` and logs.
    """
    out = Path(out)
    config = TrainConfig(**{**config.validate().to_dict(), "dataset": dataset_source(config.dataset)})
    device = setup_device(config)
    dataset = load_dataset(config.dataset)

    def make_run_dir() -> None:
        prepare_run_dir(out, resume=False, overwrite=overwrite)
        write_run_files(out, config, dataset)

    world.on_main(make_run_dir)
    state = new_state(config, dataset, device)
    with logged_compilation(out / "compile_stats.json", config.compile and world.is_main, log):
        return fit(state, config, dataset, out, device, progress, log, world)


def resume(out: str | Path, *, progress: bool = True, log=print, world: World = ONE, **overrides: Any) -> TrainResult:
    """Continue the run in ``out`` from its latest checkpoint (``overrides``: see RESUMABLE)."""
    out = Path(out)
    prepare_run_dir(out, resume=True, overwrite=False)
    config = resume_config(out, overrides)
    device = setup_device(config)
    dataset = load_run_dataset(out, config)
    state = new_state(config, dataset, device)
    resume_from_latest(state, out, dataset, log if world.is_main else _quiet, writes=world.is_main)
    with logged_compilation(out / "compile_stats.json", config.compile and world.is_main, log):
        return fit(state, config, dataset, out, device, progress, log, world)


def _quiet(*_: Any) -> None:
    """The log of a process other than rank 0."""


def setup_device(config: TrainConfig) -> torch.device:
    device = resolve_device(config.device)
    if config.precision == "fp16" and device.type != "cuda":
        raise ConfigError(["precision='fp16': needs a CUDA device; use bf16 on the CPU"])
    if config.threads:
        torch.set_num_threads(config.threads)
    if device.type == "cpu":
        keep_freed_memory()
    return device


def load_run_dataset(out: Path, config: TrainConfig) -> Dataset:
    from kgtrace.data.vocab import read_vocab

    return load_dataset(config.dataset, entities=read_vocab(out / "node_dict"), relations=read_vocab(out / "rel_dict"))


def write_run_files(out: Path, config: TrainConfig, dataset: Dataset) -> None:
    write_vocab(dataset.entities, out / "node_dict")
    write_vocab(dataset.relations, out / "rel_dict")
    write_yaml(config.to_dict(), out / "config.yaml")
    (out / "checkpoints").mkdir(exist_ok=True)


def resume_from_latest(state: TrainState, out: Path, dataset: Dataset, log, writes: bool = True) -> None:
    path = latest_checkpoint(out / "checkpoints")
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
        progress: bool, log, world: World = ONE) -> TrainResult:
    batches = Batches.build(dataset.train, dataset.num_relations, config.training)
    known_valid = AnswerIndex.build(dataset.known_triples("valid"), dataset.num_relations)
    epoch = run_epoch
    if world.distributed:  # every process takes its part of each batch; only rank 0 writes and logs
        from kgtrace.training.sharded import sharded_epochs

        epoch = sharded_epochs(state, batches, config, device, world)
        progress, log = progress and world.is_main, log if world.is_main else _quiet
    stopped_early = False
    while state.epoch < config.epochs and not stopped_early:
        lr = state.optimizer.param_groups[0]["lr"]
        start = time.perf_counter()
        loss = epoch(state, batches, config, device, progress)
        state.epoch += 1
        state.scheduler.step()
        record = {"epoch": state.epoch, "step": state.step, "loss": loss, "lr": lr,
                  "seconds": time.perf_counter() - start}
        if config.eval_every and (state.epoch % config.eval_every == 0 or state.epoch == config.epochs):
            record.update(validate(state, config, dataset, known_valid, device, world))
            stopped_early = bool(config.patience) and state.bad_validations >= config.patience
            if record["valid_improved"] and world.is_main:
                save_checkpoint(state_dict(state, config, dataset, lr), out / "checkpoints" / "best.pt")
        last = state.epoch == config.epochs or stopped_early
        if world.is_main:
            # The record first: a kill between the two leaves a record that resume truncates, never a gap.
            append_metrics(out, record)
            if state.epoch % config.checkpoint_every == 0 or last:
                save_checkpoint(state_dict(state, config, dataset, lr), epoch_path(out / "checkpoints", state.epoch))
        log(format_record(record))
    if world.is_main:
        plot_training_curve(out)
    world.barrier()  # the others may read the run (e.g. to evaluate it) once rank 0 has written it
    return TrainResult(out, state.epoch, state.best_epoch, state.best_mrr, stopped_early)


def validate(state: TrainState, config: TrainConfig, dataset: Dataset, known: AnswerIndex,
             device: torch.device, world: World = ONE) -> dict[str, Any]:
    """Filtered validation metrics (never filtered with test) and the early-stopping bookkeeping."""
    metrics = evaluate_sharded(state.model, dataset.valid, world=world, known=known,
                               candidates=Candidates(compile=config.compile),
                               memory_budget=parse_size(config.memory_budget), device=device).both.realistic
    improved = metrics.mrr > state.best_mrr
    if improved:
        state.best_mrr, state.best_epoch, state.bad_validations = metrics.mrr, state.epoch, 0
    else:
        state.bad_validations += 1
    return {"valid_mrr": metrics.mrr, "valid_hits_at_1": metrics.hits_at[1],
            "valid_hits_at_10": metrics.hits_at[10], "valid_improved": improved}


def format_record(record: dict[str, Any]) -> str:
    text = f"epoch {record['epoch']:>4}  loss {record['loss']:.5f}  lr {record['lr']:.2e}  {record['seconds']:.2f}s"
    if "valid_mrr" in record:
        text += f"  valid MRR {record['valid_mrr']:.4f}" + ("  (best)" if record["valid_improved"] else "")
    return text


def plot_training_curve(out: Path) -> None:
    """training_curve.png: loss per epoch, validation MRR on a second axis."""
    from kgtrace.plots import training_curve

    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if ln]
    training_curve(records, out / "training_curve.png")
