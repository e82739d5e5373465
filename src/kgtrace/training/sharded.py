"""Training over the processes of a distributed job: DistributedDataParallel on parts of each global batch.

Every process shuffles the queries with the same generator, so all agree on each global batch
of ``batch_size`` queries; process r takes rows r, r + N, r + 2N, ... of it (DistributedSampler's
interleaving, applied per batch), so the parts together are exactly one process's batch.

The loss. One process minimises the mean over its batch, sum / (B * E) for KvsAll (sum / B for
1vsAll). Process r divides its part's sum by the whole batch's count over N, B * E / N: DDP
averages the N gradients, so the step follows the gradient of sum_r sum_r / (B * E), which is
one process's. (Dividing by the part's own rows would weigh the rows of a smaller part more.)
The loss reported is that same global mean, summed over processes once per epoch.

A batch with fewer than 2 rows per process (a short last batch) is not cut: every process
computes all of it, and the average of N equal gradients is that gradient (batch norm needs
2 rows in training mode).

What still differs from one process: ConvE's batch normalisation normalises with each part's
statistics (as plain DDP does; torch's SyncBatchNorm runs on CUDA only, and ConvE folds bn1
into its convolution), and dropout masks are drawn per process from a generator seeded by
(seed, epoch, rank), so that a resumed job draws the same ones. DistMult and ComplEx have
neither: their losses follow one process's to float rounding (tests/test_distributed.py).

entity_chunk: the chunked KvsAll loss runs one backward pass per entity chunk, which DDP cannot
follow (it expects one backward per forward), so its gradients are averaged by one explicit
all-reduce after the step's backward passes instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from kgtrace.compute.distributed import World
from kgtrace.compute.precision import precision_context
from kgtrace.compute.system import bar_disable
from kgtrace.core.config import TrainConfig
from kgtrace.training.batches import Batches
from kgtrace.training.step import TrainState, backward_and_step, batch_loss, epoch_batches

__all__ = ["BatchLoss", "all_reduce_gradients", "part_of_batch", "sharded_epochs"]

MIN_ROWS_PER_PROCESS = 2  # batch normalisation in training mode needs two rows


class BatchLoss(nn.Module):
    """A process's part of a batch loss as a module: DDP runs its gradient hooks around forward."""

    def __init__(self, model: nn.Module, batches: Batches, config: TrainConfig, device: torch.device):
        super().__init__()
        self.model = model
        self.batches, self.config, self.device = batches, config, device

    def forward(self, pos: Tensor, batch_rows: float) -> Tensor:
        return batch_loss(self.model, self.batches, pos, self.config, self.device, batch_rows=batch_rows)


def part_of_batch(pos: Tensor, world: World) -> tuple[Tensor, int]:
    """This process's rows of the global batch ``pos`` [B], and the number of parts it is cut into (1: not cut)."""
    if len(pos) < MIN_ROWS_PER_PROCESS * world.size:
        return pos, 1
    return pos[world.rank :: world.size], world.size


def all_reduce_gradients(model: nn.Module, world: World) -> None:
    """Average every parameter's gradient over the processes in one flat all-reduce (DDP's job, unbucketed)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:  # every process must send the same layout
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # [total parameters]
    world.all_reduce_sum(flat).div_(world.size)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()


def dropout_seed(seed: int, epoch: int, rank: int) -> int:
    """A seed per (run seed, epoch, process): independent dropout masks per process, repeated on resume."""
    return (seed * 1_000_003 + epoch) * 65_537 + rank


def sharded_epochs(state: TrainState, batches: Batches, config: TrainConfig, device: torch.device,
                   world: World) -> Callable[..., float]:
    """An epoch function with `run_epoch`'s signature for this process of ``world``."""
    ddp = None
    if not config.entity_chunk:
        device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else None
        ddp = DistributedDataParallel(BatchLoss(state.model, batches, config, device), device_ids=device_ids)

    def epoch(state: TrainState, batches: Batches, config: TrainConfig, device: torch.device, progress: bool) -> float:
        return run_sharded_epoch(state, batches, config, device, progress, world, ddp)

    return epoch


def run_sharded_epoch(state: TrainState, batches: Batches, config: TrainConfig, device: torch.device, progress: bool,
                      world: World, ddp: DistributedDataParallel | None) -> float:
    """One pass over the shuffled examples, this process taking its part of each batch; returns the mean batch loss."""
    state.model.train()
    torch.manual_seed(dropout_seed(config.seed, state.epoch, world.rank))
    order = torch.randperm(len(batches), generator=state.shuffle)  # the same on every process
    autocast = precision_context(config.precision, device)
    total, count = torch.zeros((), device=device), 0
    bar = tqdm(epoch_batches(order, config, state.model), desc=f"epoch {state.epoch + 1}/{config.epochs}",
               leave=False, disable=bar_disable(progress), unit="batch")
    for pos in bar:
        part, parts = part_of_batch(pos, world)
        rows = len(pos) / parts  # the batch's rows over the parts: see the module docstring
        state.optimizer.zero_grad(set_to_none=True)
        with autocast:
            if ddp is not None:
                loss = ddp(part, rows)
            else:
                loss = batch_loss(state.model, batches, part, config, device, batch_rows=rows)
        # Under DDP its backward pass all-reduces the gradients; without, they are all-reduced here.
        backward_and_step(state, loss, None if ddp is not None else lambda: all_reduce_gradients(state.model, world))
        total, count = total + loss.detach().float(), count + 1
        if progress and count % 10 == 0:
            bar.set_postfix(loss=f"{float(total) / count:.4f}")
    # DDP gives rank 0's buffers (batch-norm statistics) to the others at each forward; after the
    # last one they differ again, and validation and checkpoints must see rank 0's.
    for buffer in state.model.buffers():
        world.broadcast_tensor(buffer)
    # Each process's terms are its share of the batch mean times N: the sum over processes is N times the mean.
    return float(world.all_reduce_sum(total)) / world.size / max(count, 1)
