"""One epoch of training: the state it changes, the loss of a batch, the optimiser step.

The loop (training.loop) runs these epochs; a distributed job (training.sharded) runs its
own epochs out of the same batch loss and step; a compiled run's batch loss goes through
training.compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm import tqdm

from kgtrace.compute.precision import precision_context
from kgtrace.compute.system import bar_disable
from kgtrace.core.config import TrainConfig
from kgtrace.training.batches import Batches
from kgtrace.training.compiled import compiled_batch_loss, step_inputs
from kgtrace.training.loss import kvsall_bce, kvsall_bce_chunked_backward, kvsall_ce, negative_sampling_rows, onevsall_ce


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


def batch_loss(model: nn.Module, batches: Batches, pos: Tensor, config: TrainConfig, device: torch.device, *,
               batch_rows: float | None = None) -> Tensor:
    """Mean loss of the examples at ``pos`` (forward only; chunked KvsAll also runs backward).

    batch_rows: the rows the mean is over (default len(pos)); a process of a distributed job
    holding part of a batch passes a share of the whole batch's rows (see training.sharded).
    """
    if config.compile:
        return compiled_batch_loss(model, batches, pos, config, device, batch_rows=batch_rows)
    if config.training == "negative-sampling":  # the triples and their drawn candidates, as the compiled step's
        inputs = step_inputs(batches, pos, config, model.num_entities, device)
        rows = negative_sampling_rows(model, config.adversarial_temperature, **inputs,
                                      valid=torch.ones(len(pos), dtype=torch.bool, device=device))
        return rows.sum() / (batch_rows if batch_rows is not None else len(pos))
    queries = batches.queries[pos].to(device)
    if batches.index is None:
        return onevsall_ce(model.score_t(queries).float(), batches.answers[pos].to(device), batch_rows)
    rows, cols = batches.index.pairs_at(pos)
    rows, cols = rows.to(device), cols.to(device)
    if config.training == "kvsall-ce":
        return kvsall_ce(model.score_t(queries).float(), rows, cols, config.label_smoothing, batch_rows,
                         config.label_smoothing_style)
    denominator = batch_rows * model.num_entities if batch_rows is not None else None
    if config.entity_chunk:
        return kvsall_bce_chunked_backward(model, queries, rows, cols, config.label_smoothing, config.entity_chunk,
                                           denominator, smoothing_style=config.label_smoothing_style)
    return kvsall_bce(model.score_t(queries).float(), rows, cols, config.label_smoothing, denominator=denominator,
                      smoothing_style=config.label_smoothing_style)


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


def epoch_batches(order: Tensor, config: TrainConfig, model: nn.Module | None = None) -> tuple[Tensor, ...]:
    """An epoch's batches of example positions: ``order`` in batch_size pieces, the first steps_per_epoch if set.

    A last batch of one example is left out of the epoch when ``model`` has batch norm (its
    training-mode statistics need two; the example is in another place of the next epoch's
    shuffle), as PyKEEN drops a model with batch norm's last batch; every other batch is kept.
    """
    batches = order.split(config.batch_size)
    if model is not None and len(batches) > 1 and len(batches[-1]) == 1 and has_batch_norm(model):
        batches = batches[:-1]
    return batches[: config.steps_per_epoch] if config.steps_per_epoch else batches


def has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def run_epoch(state: TrainState, batches: Batches, config: TrainConfig, device: torch.device, progress: bool) -> float:
    """One pass over the shuffled examples; returns the mean batch loss."""
    state.model.train()
    order = torch.randperm(len(batches), generator=state.shuffle)
    autocast = precision_context(config.precision, device)
    total, count = torch.zeros((), device=device), 0
    bar = tqdm(epoch_batches(order, config, state.model), desc=f"epoch {state.epoch + 1}/{config.epochs}",
               leave=False, disable=bar_disable(progress), unit="batch")
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
