"""TracIn's pass over the training set: chunk by chunk, a group of checkpoints at a time, chunks side by side.

Many test triples at once: the test triples' factors are computed once per checkpoint and
kept; then one pass over the training set, chunk by chunk (sorted by (head, relation) so
that ConvE computes each pair's fc input once), scores every test triple against the chunk
at every checkpoint. The consumer keeps only what it returns, so its memory does not grow with
the training set, and with a state file (`.progress`) the pass saves its progress now and
then so that a killed run resumes where it stopped. On a CPU with several threads the chunks
run side by side, one thread each, and come back in order (`kgtrace.compute.system.side_by_side`):
the same results, both cores busy.

With several groups of checkpoints (`.checkpoints`) the pass goes over the training set once
per group; a consumer that needs every checkpoint at once (top-k) gets the earlier groups' parts
back from disk (`.spill`) beside the last group's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from kgtrace.attribution.checkpoints import CheckpointModels
from kgtrace.attribution.copies import private_copy, private_maker
from kgtrace.attribution.factors import Factors
from kgtrace.attribution.progress import Progress
from kgtrace.attribution.spill import Spill
from kgtrace.compute.distributed import World
from kgtrace.compute.system import bar_disable, keep_freed_memory, side_by_side

__all__ = ["Factorise", "Score", "Stream", "train_chunks"]

#: Per-triple gradient factors of triples [n, 3] at one checkpoint's model.
Factorise = Callable[[nn.Module, Tensor], Factors]
#: (models, lrs, test factors, memos, test, triples) -> the lr-weighted parts [G, n_test, c] of the checkpoints of
#: ``models`` on the chunk ``triples`` (self-influence [G, c] with test None).
Score = Callable[[list[nn.Module], list[float], list[Factors] | None, list[dict], Tensor | None, Tensor], Tensor]


def train_chunks(train: Tensor, chunk_size: int, world: World) -> list[Tensor]:
    """Positions in ``train``, sorted by (head, relation) and cut into chunks."""
    num_ids = int(train[:, 1].max()) + 1 if len(train) else 1
    order = torch.argsort(train[:, 0] * num_ids + train[:, 1], stable=True)
    # A process of a distributed job takes every world.size-th of one process's chunks: the same
    # chunks, so the same arithmetic, whatever the number of processes.
    return list(order.split(chunk_size))[world.rank :: world.size]


class Stream:
    """Passes over the training triples ``train`` in ``chunks`` (positions in ``train``) with ``models``' checkpoints.

    factorise: the test triples' factors at a checkpoint; score: a chunk's parts (`Score`).
    threaded: chunks may run side by side (not under torch.compile, which keeps per-thread state).
    reuses_blocks: the gradients allocate the same large blocks over and over.
    """

    def __init__(self, train: Tensor, chunks: list[Tensor], models: CheckpointModels, factorise: Factorise,
                 score: Score, device: torch.device, threaded: bool, reuses_blocks: bool):
        self.train, self.chunks, self.models, self.device = train, chunks, models, device
        self.factorise, self.score = factorise, score
        self.threaded, self.reuses_blocks = threaded, reuses_blocks

    def parts(self, test: Tensor | None, desc: str, progress: bool, state: Progress,
              data: Callable[[], dict] | None = None, whole: bool = True) -> Iterator[tuple[slice, Tensor, Tensor]]:
        """(checkpoints, positions [c], their lr-weighted parts [G, n_test, c], or [G, c] with test None).

        Starts at step ``state.next`` (step = group * chunks + chunk) and, after the consumer has
        taken each chunk, lets ``state`` save ``data()``. whole: every yield holds all checkpoints
        (the groups before the last are spilled to disk and joined in the last one's pass); else
        each group's parts come in yields of their own.
        """
        chunks, groups, checkpoints = self.chunks, self.models.groups, self.models.checkpoints
        spill = self._spill(state, len(test)) if whole and test is not None and len(groups) > 1 else None
        if self.reuses_blocks:
            # Same-sized blocks re-allocated per test triple or per sub-chunk: keeping freed memory saves
            # their page faults (15% of forward mode's time, 25% of the upstream pass's). Not for the other
            # passes, whose chunk-sized blocks vary: kept, they fragment the heap (working memory +20%
            # from 250k to 1M training triples).
            keep_freed_memory()
        bar = tqdm(total=len(chunks) * len(groups), initial=state.next, desc=desc, unit="chunk",
                   disable=bar_disable(progress), dynamic_ncols=True)
        done = False
        try:
            with bar, torch.no_grad():
                for g, group in enumerate(groups):
                    first = max(state.next - g * len(chunks), 0)
                    if first >= len(chunks):
                        continue
                    models = self.models.group(group)
                    lrs = [checkpoints[i].lr for i in group]
                    # kept for the group's whole pass: each checkpoint's test factors, computed once (on the first
                    # worker's copies, before any chunk runs: what a copy caches serves the chunks too), and its memo
                    copies = [private_copy(m, 0) for m in models]
                    test_factors = None if test is None else [self.factorise(m, test) for m in copies]
                    memos = [{} for _ in models]
                    last = g == len(groups) - 1
                    work = partial(self._chunk_parts, lrs, test_factors, memos, test)
                    # Each worker its own module objects over the same weights: the rows and general paths swap a
                    # module's parameters while they run (functional_call), which on a shared module races.
                    own = private_maker(models)
                    for number, parts in side_by_side(work, range(first, len(chunks)), self.device, own,
                                                      enabled=self.threaded):
                        positions = chunks[number]
                        if spill is not None and not last:
                            spill.write(g, number, parts)
                        elif spill is not None:
                            yield slice(0, len(checkpoints)), positions, torch.cat([spill.read(number, self.device), parts])
                        else:
                            yield slice(group[0], group[-1] + 1), positions, parts
                        state.step(g * len(chunks) + number, data)
                        bar.update(1)
                    del models, copies, test_factors, memos, work, own  # a group's models go before the next group's come
            done = True
        finally:
            if spill is not None:
                spill.close(remove=done)

    def _chunk_parts(self, lrs: list[float], test_factors: list[Factors] | None, memos: list[dict],
                     test: Tensor | None, number: int, models: list[nn.Module]) -> Tensor:
        """``score`` of chunk ``number`` (positions ``chunks[number]`` of the training triples) with ``models``, the
        checkpoints' models that this chunk alone uses while it runs (`private_maker`)."""
        return self.score(models, lrs, test_factors, memos, test, self.train.index_select(0, self.chunks[number]))

    def _spill(self, state: Progress, n_test: int) -> Spill:
        """Disk for the parts of the groups before the last: beside the state file, else a temporary folder."""
        folder, stem = (None, "parts") if state.path is None else (state.path.parent, state.path.name)
        return Spill(folder, stem, self.models.groups, n_test, [len(c) for c in self.chunks], fresh=state.next == 0)
