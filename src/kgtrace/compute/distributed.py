"""Several processes, one job: torch.distributed as launched by torchrun.

torchrun starts one process per device (``--nproc-per-node``) on each machine (``--nnodes``)
and tells every process who it is in environment variables: RANK (0 .. WORLD_SIZE-1 over all
machines), WORLD_SIZE, LOCAL_RANK (its device on this machine), MASTER_ADDR and MASTER_PORT.
`session` reads them, joins the process group and yields a `World`; without
them (a plain ``kgtrace ...``) it yields the world of one process and nothing else changes.

Backend: gloo for CPU tensors, and NCCL for CUDA tensors where CUDA is available (each
process then works on ``cuda:LOCAL_RANK``). Collectives time out after
``KGTRACE_DIST_TIMEOUT`` seconds (default 1800), so a process whose partner died stops with
an error instead of waiting for ever; torchrun also stops the other processes as soon as one
exits with an error, and a process that fails aborts the group so that its partners'
pending collectives fail at once.

Evaluation and TracIn results are exact, not merely close: work is split so that every
process computes exactly what one process would compute for its part (whole chunks of the
single-process plan), and parts are gathered, never summed in a different order
(`kgtrace.evaluation.sharded`, `World.all_gather_cat`, ``RunningTopK.merge``).
Training follows one process to float rounding where the model has no batch statistics or
dropout (DistMult, ComplEx; see `kgtrace.training.sharded`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from kgtrace.core.errors import ConfigError, KgtraceError

__all__ = ["DISTRIBUTED_COMMANDS", "ONE", "LostPeer", "StoppedByPeer", "World", "block_split", "current", "session",
           "world_from_env"]

ENV_TIMEOUT = "KGTRACE_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800
#: The commands that split their work over torchrun's processes; the others run in one process.
DISTRIBUTED_COMMANDS = ("evaluate", "explain", "train")

T = TypeVar("T")


class StoppedByPeer(KgtraceError):
    """This process stops because another one failed (that one reports the error)."""


class LostPeer(StoppedByPeer):
    """A collective failed: another process went away (it failed, or was stopped), or the timeout passed."""


@contextlib.contextmanager
def _collective(what: str) -> Iterator[None]:
    """Say what happened when a collective fails; gloo raises a bare RuntimeError when a partner's socket closes."""
    try:
        yield
    except RuntimeError as e:  # torch.distributed.DistError is one too
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LostPeer(f"stopped: lost contact with the other processes during {what}, most likely because one "
                       f"of them failed first (its error is printed by it) or the {ENV_TIMEOUT} timeout passed "
                       f"({type(e).__name__}: {first_line})") from e


@dataclass(frozen=True)
class World:
    """This process's place among the job's processes: rank in [0, size), local_rank on its machine."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that prints and writes outputs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def label(self) -> str:
        """'' alone, 'rank R/N' among several: prefixes messages."""
        return f"rank {self.rank}/{self.size}" if self.distributed else ""

    # ------------------------------------------------------------------ collectives (no-ops in a world of one)

    def barrier(self) -> None:
        if self.distributed:
            with _collective("a barrier"):
                dist.barrier()

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """Sum ``tensor`` over processes, in place; returns it."""
        if self.distributed:
            with _collective("a sum over processes"):
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_tensor(self, tensor: Tensor) -> Tensor:
        """Rank 0's ``tensor`` on every process, in place; returns it."""
        if self.distributed:
            with _collective("a broadcast"):
                dist.broadcast(tensor, src=0)
        return tensor

    def all_gather_cat(self, tensor: Tensor, sizes: list[int]) -> Tensor:
        """Every process's ``tensor`` (rows ``sizes[rank]`` along dim 0) concatenated in rank order, on every process.

        Collectives need equal shapes, so parts are padded to the largest and trimmed.
        """
        if not self.distributed:
            return tensor
        assert len(sizes) == self.size and tensor.shape[0] == sizes[self.rank], (sizes, tuple(tensor.shape))
        longest = max(sizes)
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        with _collective("a gather"):
            dist.all_gather(parts, padded)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)])

    def all_gather_objects(self, obj: Any) -> list[Any]:
        """Every process's picklable ``obj``, in rank order (keep them small, and on the CPU)."""
        if not self.distributed:
            return [obj]
        gathered: list[Any] = [None] * self.size
        with _collective("a gather"):
            dist.all_gather_object(gathered, obj)
        return gathered

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        with _collective("a broadcast"):
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def on_main(self, function: Callable[[], T]) -> T | None:
        """Run ``function`` on rank 0 only (e.g. preparing an output folder); the others wait for it.

        An error there is raised on rank 0 as it is and on the others as `StoppedByPeer`
        carrying its message, so that every process stops and says why. Returns the result on rank 0,
        None elsewhere.
        """
        if not self.distributed:
            return function()
        result, error = None, None
        if self.is_main:
            try:
                result = function()
            except Exception as e:  # told to the others, then raised here as it is
                error = e
        told = f"{error}" if isinstance(error, KgtraceError) else f"{type(error).__name__}: {error}"
        message = self.broadcast_object(None if error is None else told)
        if error is not None:
            raise error
        if message is not None:
            raise StoppedByPeer(f"stopped because rank 0 failed: {message}")
        return result


ONE = World()


def block_split(num_items: int, block: int, parts: int) -> list[int]:
    """Items per part when ``num_items`` are cut into blocks of ``block`` and parts take whole blocks, in order.

    Blocks are spread as evenly as possible (the first parts take one more); a part may get none.
    """
    blocks = math.ceil(num_items / block) if num_items else 0
    per_part = [blocks // parts + (1 if p < blocks % parts else 0) for p in range(parts)]
    sizes, start = [], 0
    for count in per_part:
        stop = min(num_items, start + count * block)
        sizes.append(stop - start)
        start = stop
    return sizes


def world_from_env(environ: dict[str, str] | None = None) -> World:
    """The World torchrun describes in RANK, WORLD_SIZE and LOCAL_RANK (one process when unset)."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return ONE
    problems = []
    values = {}
    for key, default in (("RANK", None), ("WORLD_SIZE", None), ("LOCAL_RANK", "0")):
        text = env.get(key, default)
        try:
            values[key] = int(text) if text is not None else None
        except ValueError:
            values[key] = None
        if values[key] is None or values[key] < 0:
            problems.append(f"environment variable {key}={text!r}: must be a non-negative integer, as torchrun sets it; "
                            "fix: launch with torchrun, or unset WORLD_SIZE to run in one process")
    if not problems and values["RANK"] >= values["WORLD_SIZE"]:
        problems.append(f"RANK={values['RANK']} is not below WORLD_SIZE={values['WORLD_SIZE']}; fix: launch with torchrun")
    if problems:
        raise ConfigError(problems)
    return World(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])


def current() -> World:
    """The World of the initialised default process group (one process when there is none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ONE
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def timeout_seconds() -> float:
    text = os.environ.get(ENV_TIMEOUT, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError([f"{ENV_TIMEOUT}={text!r}: must be a positive number of seconds, e.g. 1800"])
    return seconds


@contextlib.contextmanager
def session(command: str) -> Iterator[World]:
    """Join torchrun's process group for the length of one command (a no-op world of one without torchrun).

    Only rank 0 prints: the others' standard output is discarded (errors still go to standard
    error). On success every process waits at a barrier for the others to finish, then destroys
    the group, which then holds no pending work and no threads at exit. On an exception the group
    is aborted, so that partners blocked in a collective fail at once instead of waiting for the
    timeout.
    """
    world = world_from_env()
    if not world.distributed:
        yield world
        return
    if command not in DISTRIBUTED_COMMANDS:
        raise ConfigError([f"kgtrace {command} runs in one process, but it was launched as {world.size} processes "
                           f"(WORLD_SIZE={world.size}); fix: run it without torchrun (torchrun runs: "
                           f"{', '.join(DISTRIBUTED_COMMANDS)})"])
    if not dist.is_available():
        raise KgtraceError("this torch build has no torch.distributed; fix: install a torch build with it, "
                           "or run without torchrun")
    timeout = timedelta(seconds=timeout_seconds())
    if torch.cuda.is_available():
        if world.local_rank >= torch.cuda.device_count():
            raise ConfigError([f"LOCAL_RANK={world.local_rank}, but this machine shows {torch.cuda.device_count()} "
                               "CUDA device(s) and each process needs its own; fix: --nproc-per-node at most the "
                               "number of GPUs, or CUDA_VISIBLE_DEVICES= (empty) to run on the CPUs with gloo"])
        torch.cuda.set_device(world.local_rank)  # "cuda" now means this process's own device
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    _import_group_holders()
    dist.init_process_group(backend, rank=world.rank, world_size=world.size, timeout=timeout)
    quiet = open(os.devnull, "w") if not world.is_main else None  # noqa: SIM115 (closed below)
    try:
        with contextlib.redirect_stdout(quiet) if quiet else contextlib.nullcontext():
            yield world
        # Rank 0 may still write outputs: no process closes its connections before all have finished.
        world.barrier()
    except BaseException:
        _abort()
        raise
    else:
        dist.destroy_process_group()
    finally:
        if quiet:
            quiet.close()


def _import_group_holders() -> None:
    """Import, while no process group exists, the torch modules that bind the default group when imported.

    torch.distributed.fsdp's ShardedGradScaler takes ``process_group=dist.group.WORLD`` as a default
    argument, evaluated at import. torch._dynamo imports it, and kgtrace imports torch._dynamo
    mid-command (the first ``normal_`` on a meta tensor, as when a checkpoint's ConvE is built;
    torch.compile). Imported with the group alive, it kept the group for good: destroy_process_group
    could not free it, its gloo threads were torn down with the interpreter, and a process now and
    then aborted at exit ("terminate called without an active exception", SIGABRT). Imported here,
    the default is None. tests/test_distributed.py checks that a command frees its group.
    """
    import torch.distributed.fsdp.sharded_grad_scaler  # noqa: F401


def _abort() -> None:
    """Tear the process group down without waiting for partners (they see their collectives fail)."""
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    try:
        if abort is not None:
            abort()
        else:
            dist.destroy_process_group()
    except Exception:  # already broken: the process is about to exit with the original error anyway
        pass
