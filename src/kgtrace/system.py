"""The device a command runs on, and process-level settings that make CPU training and TracIn faster."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

from kgtrace.errors import KgtraceError

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


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise KgtraceError("device=cuda: no CUDA device is visible. Fix: use --device cpu or --device auto")
    return torch.device(name)


def bar_disable(progress: bool) -> bool | None:
    """tqdm's ``disable`` for a progress bar the caller asked for (or not): None lets tqdm draw it only on
    a terminal, so that output redirected to a log holds lines rather than every redraw of the bar."""
    return None if progress else True
