"""The device a command runs on, and process-level settings that make CPU training and TracIn faster."""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import os
import queue
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from kgtrace.core.errors import KgtraceError, option

T = TypeVar("T")
P = TypeVar("P")

# glibc mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP_BYTES = 32 << 20  # a ConvE step's activations are a few MB; ranking chunks (hundreds of MB) stay mmapped


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed blocks of up to 32 MiB instead of returning them to the OS.

    A training step frees and re-allocates the same few-MB activations every batch; by
    default glibc serves those with mmap and unmaps them on free, so every step pays
    page faults again (about a quarter of a ConvE epoch on UMLS on one thread). This is
    what the PyTorch CPU tuning guide's MALLOC_MMAP_THRESHOLD_ advice does, from inside
    the process. Larger blocks (the score chunks of ranking, hundreds of MB) stay mmapped:
    kept on the heap they fragment it, and ranking FB15k-237's test split with ConvE peaked
    at 2.4 GB instead of 1.8 GB with a 1 GiB limit. Memory freed late in a run is released at exit.
    Returns False (and does nothing) where glibc is not the allocator.
    """
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))


#: Whether this process was forked from one that had imported polars (`polars_usable`).
_FORKED_AFTER_POLARS = False


def _after_fork_in_child() -> None:
    global _FORKED_AFTER_POLARS
    _FORKED_AFTER_POLARS = _FORKED_AFTER_POLARS or "polars" in sys.modules


os.register_at_fork(after_in_child=_after_fork_in_child)


def polars_usable() -> bool:
    """Whether polars can run in this process: False in a child forked after polars was imported.

    polars' thread pool does not survive a fork: in the child, a call that hands work to the pool
    (``read_csv``, ``is_in``, ...) waits forever at 0% CPU. A ``multiprocessing`` pool forks by
    default on Linux, after the parent may have read data. kgtrace's readers then take their
    reference paths (pure Python), and what has none refuses with `forked_polars_error`.
    """
    return not _FORKED_AFTER_POLARS


def forked_polars_error(what: str) -> KgtraceError:
    """The error of work that needs polars in a child forked after polars was imported."""
    return KgtraceError(
        f"{what} needs polars, which cannot run in this process: it was forked from one that had already "
        "started polars' threads, and polars' calls would wait forever. Fix: start the worker processes with "
        "multiprocessing's 'spawn' method (multiprocessing.get_context('spawn')), or read the data in the parent")


def threads_problems(threads: int, key: str = "threads") -> list[str]:
    """Why ``threads`` torch threads cannot be used here: more than the machine's cores (thousands of threads
    starve the machine, and past its limits the process dies). Checked where the threads are set, not where a
    setting is read: a run trained on a larger machine still loads."""
    cores = os.cpu_count() or 1
    if threads > cores:
        return [f"{key}={threads}: this machine has {cores} cores; fix: set {key} to at most {cores} "
                "(--threads), or 0 for torch's default"]
    return []


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise KgtraceError(f"device=cuda: no CUDA device is visible. Fix: use {option('--device', 'cpu')} or "
                           f"{option('--device', 'auto')}")
    return torch.device(name)


def bar_disable(progress: bool) -> bool | None:
    """tqdm's ``disable`` for a progress bar the caller asked for (or not): None lets tqdm draw it only on
    a terminal, so that output redirected to a log holds lines rather than every redraw of the bar."""
    return None if progress else True


#: At most this many chunks of a streaming pass run side by side (`side_by_side`); measured on 2 cores only.
MAX_SIDE_BY_SIDE = 4


def side_by_side(work: Callable[[int, P], T], numbers: Sequence[int], device: torch.device,
                 private: Callable[[], P], enabled: bool = True) -> Iterator[tuple[int, T]]:
    """(n, work(n, own)) for each n of ``numbers``, in order; on a CPU, several at a time in threads of one core each.

    A chunk of a TracIn pass is many small operations, and a thread per core inside each of them
    leaves the cores idle between them; chunks side by side, each on one thread, keep them busy
    (docs/benchmarks.md, the users' scale). ``work`` runs under ``torch.no_grad()`` (grad mode is
    per thread).

    ``own`` is what no two chunks may use at once: ``private()`` makes one per worker (a serial loop
    makes one), and a chunk holds it from its start to its end. Work that changes an object while it
    runs (``torch.func.functional_call`` swaps a module's parameters for the length of a call) must
    change only its ``own``: on a shared module, two threads swap each other's parameters, and a chunk
    computes with another chunk's rows. State shared beyond ``own`` must bear two writers (ConvE's
    relation-band products: both may compute the same values).

    Results come back in ``numbers``' order, so a consumer sees what a serial loop gives it, each
    result as one thread computes it. Torch's intra-op threads are divided among the workers while
    the pass runs and restored after. Serial where it cannot help: not a CPU, one thread, or
    ``enabled`` False (torch.compile, which keeps per-thread state).
    """
    threads = torch.get_num_threads()
    workers = min(threads, MAX_SIDE_BY_SIDE, len(numbers)) if enabled and device.type == "cpu" else 1
    if workers <= 1:
        own = private()
        for n in numbers:
            yield n, work(n, own)
        return
    free: queue.SimpleQueue[P] = queue.SimpleQueue()
    for _ in range(workers):
        free.put(private())

    def run(n: int) -> T:
        own = free.get()  # never waits: at most ``workers`` chunks are in flight, one per private object
        try:
            with torch.no_grad():
                return work(n, own)
        finally:
            free.put(own)

    torch.set_num_threads(max(1, threads // workers))
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="kgtrace-chunk") as pool:
            order = iter(numbers)
            pending = deque((n, pool.submit(run, n)) for n in itertools.islice(order, workers))
            while pending:
                n, future = pending.popleft()
                result = future.result()
                following = next(order, None)
                if following is not None:  # keep every worker busy while the consumer takes this result
                    pending.append((following, pool.submit(run, following)))
                yield n, result
    finally:
        torch.set_num_threads(threads)
