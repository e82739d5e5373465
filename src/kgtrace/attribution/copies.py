"""Copies of a model's module objects for TracIn: one without weights, and private ones per worker thread.

A weightless copy holds the model's structure and shapes on the meta device (TracIn's template
for its choices, no memory). A private copy is a new module object over the model's own tensors:
each worker of a pass side by side (`kgtrace.compute.system.side_by_side`) computes with copies of
its own, so that what one worker's call swaps on a module no other worker sees.
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Callable, Sequence
from itertools import chain

import torch
from torch import nn

__all__ = ["private_copy", "private_maker", "weightless_copy"]


def weightless_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers live on the meta device: its structure and shapes, no memory."""
    memo = {}
    for t in chain(model.parameters(), model.buffers()):
        empty = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else empty
    return copy.deepcopy(model, memo).eval()


#: model -> its private copies (`private_maker`), the k-th for the k-th worker of a pass.
_PRIVATE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def private_maker(models: Sequence[nn.Module]) -> Callable[[], list[nn.Module]]:
    """``side_by_side``'s maker of private models: its k-th call gives the k-th copies of ``models``.

    A copy is a new module object over the model's own parameter and buffer tensors (no memory
    copied). ``functional_call`` swaps a module's attributes for the length of a call; on a copy of
    one's own, it swaps only that copy's, whatever other threads do with the same weights. Copies are
    kept while their model lives, so that what is cached per module (ConvE's relation band, once per
    checkpoint) outlives a pass.
    """
    calls = itertools.count()

    def make() -> list[nn.Module]:
        k = next(calls)
        return [private_copy(model, k) for model in models]

    return make


def private_copy(model: nn.Module, k: int) -> nn.Module:
    """The k-th private copy of ``model`` (`private_maker`), made the first time it is asked for."""
    copies = _PRIVATE.setdefault(model, [])
    while len(copies) <= k:
        memo = {id(t): t for t in chain(model.parameters(), model.buffers())}
        copies.append(copy.deepcopy(model, memo))
    return copies[k]
