"""The one door to torch.compile: a function compiled once for a fixed batch.

Every compiled entry point of kgtrace (ranking, and later training steps, TracIn
gradients, the rule prover) goes through `CompiledCall`, which keeps these
invariants so that no caller has to think about them:

* Static buffers. Inputs are ``copy_``-ed into buffers allocated once, of shape
  [batch_size, *row_shape]; a buffer's address never changes. The compiled graph sees
  the same shapes every call (no recompilation, whatever n the caller passes) and a
  CUDA graph (``mode="reduce-overhead"``) replays on the addresses it recorded. Rows past
  the caller's n repeat the last valid row (zeros when n == 0), so indices stay valid,
  and the ``valid`` [batch_size] bool buffer tells ``fn`` which rows are real.
* Mark-step. ``torch.compiler.cudagraph_mark_step_begin()`` runs before each compiled
  call, telling CUDA-graph trees that the previous call's outputs are dead (a no-op on CPU).
* Clone at the boundary. Outputs are sliced to the first n rows and cloned before they
  leave ``__call__``: a CUDA-graph replay overwrites the previous replay's outputs. This
  is the only place that clones; callers never add ad-hoc clones.
* No silent fallback. ``fullgraph=True`` makes a graph break an error, and any failure to
  compile raises `KgtraceError` naming the entry point, the cause
  and the fix (``--no-compile``); nothing ever quietly runs eagerly instead.
* One cache per entry point. Dynamo caches compiled code (and counts recompilations
  against ``recompile_limit``) per Python code object, so each CompiledCall compiles its
  own copy of a small wrapper, named after the entry point: two CompiledCalls of one
  ``fn`` (other batch sizes, other models) never evict or count against each other, and
  the name shows up in ``TORCH_LOGS`` output.

Gradients are the caller's business: run under ``torch.no_grad()`` for inference; the
static buffers are plain data, so no gradient flows back into the caller's inputs. A
differentiated call (``training=True``, the training step) is compiled with its backward
graph at once (AOTAutograd otherwise compiles it lazily on the first ``backward()``, outside
these counters), and with inductor's ``fallback_random``, so that dropout draws its masks from
the same generator and in the same way as eager: compiled training equals eager training up
to float rounding. Its graph may keep the static buffers for the backward pass (embedding
indices): run each call's backward before the same call runs again (one forward per backward,
as a training step or a gradient-accumulation micro-batch). Otherwise the refilled buffer
makes autograd refuse the earlier backward ("modified by an inplace operation"), loudly.

Counters. Each call keeps `CompileStats`; `compile_log` collects the calls that
ran inside it, so that a command logs and writes them at its end (``compile_stats.json``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from kgtrace.core.errors import KgtraceError, option_off
from kgtrace.core.io import atomic_write_text

__all__ = ["CompileLog", "CompileStats", "CompiledCall", "compile_log", "logged_compilation"]

VALID = "valid"  # the name under which fn receives the [batch_size] bool mask of real rows


@dataclass
class CompileStats:
    """What one entry point cost. Counter deltas are taken around this entry point's calls only."""

    calls: int = 0  # __call__ invocations
    batches: int = 0  # compiled runs (an input larger than batch_size takes several)
    input_sizes: set[int] = field(default_factory=set)  # distinct n passed to __call__
    compile_seconds: float = 0.0  # the first compiled run: compilation (a training call's backward too) plus one run
    run_seconds: float = 0.0  # every other second spent in __call__ (copies and clones included; not backward)
    compilations: int = 0  # graphs dynamo compiled (1 after the first call)
    recompilations: int = 0  # compilations after the first call (0 while guards hold)
    graph_breaks: int = 0  # always 0 with fullgraph=True: a break raises instead

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: input sizes sorted, seconds rounded to the microsecond."""
        data = asdict(self)
        data["input_sizes"] = sorted(self.input_sizes)
        data["compile_seconds"], data["run_seconds"] = round(self.compile_seconds, 6), round(self.run_seconds, 6)
        return data


def _dynamo_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def _compile_errors() -> tuple[type[BaseException], ...]:
    from torch._dynamo.exc import TorchDynamoException
    from torch._inductor.exc import InductorError

    return TorchDynamoException, InductorError


class CompiledCall:
    """``fn`` compiled once for a fixed batch; inputs copied into static buffers; outputs cloned.

    fn(*static, **buffers, valid=mask) must return a tensor or a tuple of tensors, each
    with leading dimension batch_size (one row per input row).

    Args:
        name: the entry point, named in errors and logs (e.g. "rank_side").
        batch_size: rows per compiled run.
        example: name -> tensor [m, *row_shape] for any m >= 1 (one row or a full
            batch); only the row shape, dtype and device are taken, to size the buffers.
        mode: torch.compile mode; None picks "reduce-overhead" (CUDA graphs) on CUDA
            and "default" on CPU.
        training: fn's outputs will be differentiated: compile its backward graph with
            the forward, and draw random numbers as eager does (module docstring).
    """

    def __init__(
        self,
        name: str,
        fn: Callable[..., Tensor | tuple[Tensor, ...]],
        batch_size: int,
        example: dict[str, Tensor],
        *,
        mode: str | None = None,
        dynamic: bool = False,
        fullgraph: bool = True,
        training: bool = False,
    ):
        if batch_size < 1:
            raise ValueError(f"{name}: batch_size must be >= 1, got {batch_size}")
        if not example or VALID in example:
            raise ValueError(f"{name}: example needs at least one input and none named {VALID!r}")
        devices = {t.device for t in example.values()}
        if len(devices) != 1:
            raise ValueError(f"{name}: all example inputs must be on one device, got {sorted(map(str, devices))}")
        self.name = name
        self.batch_size = batch_size
        self.device = devices.pop()
        self.mode = mode if mode is not None else ("reduce-overhead" if self.device.type == "cuda" else "default")
        with torch.inference_mode(False):  # normal tensors even if built inside inference mode
            self.buffers: dict[str, Tensor] = {
                key: torch.zeros((batch_size, *t.shape[1:]), dtype=t.dtype, device=self.device)
                for key, t in example.items()
            }
            self.buffers[VALID] = torch.zeros(batch_size, dtype=torch.bool, device=self.device)
        for buffer in self.buffers.values():
            # CUDA-graph trees then read the buffers in place instead of copying them in.
            torch._dynamo.mark_static_address(buffer)
        self._stats = CompileStats()
        self.training = training
        self._compiled = torch.compile(_entry_point(name, fn), mode=self.mode, dynamic=dynamic, fullgraph=fullgraph)

    @property
    def stats(self) -> CompileStats:
        """A snapshot of this entry point's statistics."""
        s = self._stats
        return CompileStats(s.calls, s.batches, set(s.input_sizes), s.compile_seconds, s.run_seconds,
                            s.compilations, s.recompilations, s.graph_breaks)

    def __call__(self, *static: object, **inputs: Tensor) -> tuple[Tensor, ...]:
        """Run fn on inputs [n, *row_shape] (any n, split into batches); outputs [n, ...] each.

        static: non-tensor arguments passed to fn unchanged (e.g. the model); dynamo guards
        on them, so passing another object may recompile (counted in ``stats``).
        """
        n = self._check(inputs)
        for log in _OPEN_LOGS:
            log.add(self)
        self._stats.calls += 1
        self._stats.input_sizes.add(n)
        started, compiling = time.perf_counter(), self._stats.compile_seconds
        parts = [self._run_batch(static, inputs, start, min(start + self.batch_size, n))
                 for start in range(0, max(n, 1), self.batch_size)]
        outputs = parts[0] if len(parts) == 1 else tuple(torch.cat(p) for p in zip(*parts))
        compiling = self._stats.compile_seconds - compiling  # nonzero on the first call only
        self._stats.run_seconds += time.perf_counter() - started - compiling
        return outputs

    def _check(self, inputs: dict[str, Tensor]) -> int:
        expected = set(self.buffers) - {VALID}
        if set(inputs) != expected:
            raise ValueError(f"{self.name}: expected inputs {sorted(expected)}, got {sorted(inputs)}")
        sizes = {len(t) for t in inputs.values()}
        if len(sizes) != 1:
            raise ValueError(f"{self.name}: inputs differ in their number of rows: {sorted(sizes)}")
        for key, t in inputs.items():
            buffer = self.buffers[key]
            if t.shape[1:] != buffer.shape[1:] or t.dtype != buffer.dtype:
                raise ValueError(f"{self.name}: input {key!r} must be [n, {', '.join(map(str, buffer.shape[1:]))}] "
                                 f"{buffer.dtype}, got {list(t.shape)} {t.dtype}")
        return sizes.pop()

    def _fill(self, inputs: dict[str, Tensor], start: int, stop: int) -> None:
        """Copy rows start..stop-1 into the static buffers; pad with the last row (zeros if none)."""
        n = stop - start
        for key, t in inputs.items():
            buffer = self.buffers[key]
            buffer[:n].copy_(t[start:stop])
            if n == 0:
                buffer.zero_()
            elif n < self.batch_size:
                buffer[n:].copy_(t[stop - 1 : stop].expand_as(buffer[n:]))
        valid = self.buffers[VALID]
        valid[:n].fill_(True)
        valid[n:].fill_(False)

    def _run_batch(self, static: tuple, inputs: dict[str, Tensor], start: int, stop: int) -> tuple[Tensor, ...]:
        first = self._stats.batches == 0
        self._fill(inputs, start, stop)
        graphs_before, breaks_before = _dynamo_counts()
        began = time.perf_counter()
        torch.compiler.cudagraph_mark_step_begin()
        try:
            with torch._dynamo.config.patch(suppress_errors=False), self._settings():
                outputs = self._compiled(*static, **self.buffers)
        except Exception as error:
            if first or isinstance(error, _compile_errors()):
                raise self._error(error) from error
            raise
        graphs, breaks = _dynamo_counts()
        s = self._stats
        s.batches += 1
        s.compilations += graphs - graphs_before
        s.graph_breaks += breaks - breaks_before
        if first:
            s.compile_seconds = time.perf_counter() - began
            if s.compilations == 0:
                raise self._error(RuntimeError("dynamo compiled nothing (is torch._dynamo disabled?)"))
        else:
            s.recompilations += graphs - graphs_before
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        if first:
            for i, out in enumerate(outputs):
                if not isinstance(out, Tensor) or out.dim() == 0 or len(out) != self.batch_size:
                    raise ValueError(f"{self.name}: output {i} must be a tensor with leading dimension "
                                     f"batch_size={self.batch_size}")
        # Clone at the boundary: the next replay of a CUDA graph overwrites these outputs.
        return tuple(out[: stop - start].clone() for out in outputs)

    @contextmanager
    def _settings(self) -> Iterator[None]:
        """Compiler settings in force while this call runs (and so while it compiles)."""
        if not self.training:
            yield
            return
        from torch._functorch import config as functorch_config
        from torch._inductor import config as inductor_config

        with functorch_config.patch(force_non_lazy_backward_lowering=True), \
                inductor_config.patch(fallback_random=True):
            yield

    def _error(self, error: BaseException) -> KgtraceError:
        cause = (str(error).strip().splitlines() or [""])[0]
        return KgtraceError(
            f"torch.compile failed for {self.name} ({type(error).__name__}: {cause}). "
            f"Fix: run without compilation ({option_off('--compile')}), and report the error with "
            "TORCH_LOGS=graph_breaks"
        )


def _entry_point(name: str, fn: Callable) -> Callable:
    """A wrapper around fn with its own code object, named after the entry point (see the module docstring)."""

    def entry(*static, **buffers):
        return fn(*static, **buffers)

    label = "compiled_" + re.sub(r"\W", "_", name) + f"_{next(_serial)}"
    entry.__code__ = entry.__code__.replace(co_name=label, co_qualname=label)
    entry.__name__ = entry.__qualname__ = label
    return entry


_serial = iter(range(1, 1 << 62))


# ----------------------------------------------------------------------------- counters of a run


class CompileLog:
    """The compiled calls that ran while the log was open (see `compile_log`), in order of first run."""

    def __init__(self):
        self.calls: list[CompiledCall] = []

    def add(self, call: CompiledCall) -> None:
        if not any(c is call for c in self.calls):
            self.calls.append(call)

    def entries(self) -> list[dict[str, object]]:
        """One record per call: entry point, batch size, device, mode and its `CompileStats`."""
        return [{"entry_point": c.name, "batch_size": c.batch_size, "device": str(c.device), "mode": c.mode,
                 **c.stats.to_dict()} for c in self.calls]

    def lines(self) -> list[str]:
        """One readable line per call, for the end of a command's output."""
        return [f"compiled {e['entry_point']} (batch {e['batch_size']}, {e['device']}, {e['mode']}): "
                f"{e['calls']} calls, input sizes {_sizes(e['input_sizes'])}, {e['compilations']} compilation(s), "
                f"{e['recompilations']} recompilation(s), {e['graph_breaks']} graph break(s), "
                f"{e['compile_seconds']:.1f} s compiling, {e['run_seconds']:.2f} s running"
                for e in self.entries()]

    def write(self, path: str | Path) -> Path:
        """Write the entries as JSON, atomically; returns the path."""
        data = {"torch": torch.__version__, "entry_points": self.entries()}
        atomic_write_text(path, json.dumps(data, indent=2) + "\n")
        return Path(path)


def _sizes(sizes: list[int], shown: int = 6) -> str:
    text = ", ".join(map(str, sizes[:shown]))
    return "{" + text + (f", ... ({len(sizes)} sizes)" if len(sizes) > shown else "") + "}"


_OPEN_LOGS: list[CompileLog] = []


@contextmanager
def compile_log() -> Iterator[CompileLog]:
    """Collect every `CompiledCall` run inside the block (nested logs each see them)."""
    log = CompileLog()
    _OPEN_LOGS.append(log)
    try:
        yield log
    finally:
        _OPEN_LOGS.remove(log)


@contextmanager
def logged_compilation(path: str | Path, enabled: bool, log: Callable[[str], object] = print) -> Iterator[None]:
    """A command's counters: collect the calls run inside; at the end (an error too) log them and write ``path``.

    Nothing is logged or written when ``enabled`` is false or nothing was compiled.
    """
    if not enabled:
        yield
        return
    with compile_log() as compiled:
        try:
            yield
        finally:
            for line in compiled.lines():
                log(line)
            if compiled.calls:
                compiled.write(path)


def compile_default(device: torch.device, asked: bool | None) -> bool:
    """The one rule of every command's --compile / --no-compile: as asked; unset (``asked`` None), on CUDA
    only, where it pays off (on a CPU it costs seconds of compiling, repaid only on large graphs)."""
    return device.type == "cuda" if asked is None else asked
