"""TracInCP (Pruthi et al., 2020) over a run's epoch checkpoints.

influence(z, z') = sum over checkpoints c of lr_c * <grad l(theta_c, z), grad l(theta_c, z')>

where l(z) = softplus(-score_hrt(z)) is the triple's own BCE-with-logits loss against
label 1, gradients are taken over a parameter set (see :mod:`kgtrace.attribution.params`)
and the model is in eval mode (BatchNorm on running statistics, dropout off).

Paths, each giving per-triple gradients as :class:`~kgtrace.attribution.factors.Factors`:

* "fast": exact factored gradients of the kind the model's spec names (:mod:`.fast`): ConvE's
  closed form (:mod:`.conve`), the embedding-row form for DistMult and ComplEx (:mod:`.rows`);
* "rows": the embedding-row form for any model whose spec declares embedding tables
  (:func:`~.rows.row_tables`), other parameters materialised per sample;
* "general": every selected parameter materialised per sample (torch.func), any scorer;
* "reference": per-triple autograd in float64, slow, for checking (:mod:`.reference`);
* "auto": fast when the model has a factoriser, else general.

Many test triples at once: the test triples' factors are computed once per checkpoint and
kept; then one pass over the training set, chunk by chunk (sorted by (head, relation) so
that ConvE computes each pair's fc input once), scores every test triple against the chunk
at every checkpoint. :meth:`TracIn.top_k` and :meth:`TracIn.self_influence` keep only what
they return, so their memory does not grow with the training set, and with ``state=FILE``
they save their progress now and then so that a killed run resumes where it stopped. On a CPU
with several threads the chunks run side by side, one thread each, and come back in order
(:func:`kgtrace.system.side_by_side`): the same results, both cores busy.

Checkpoints a group at a time: with a ``memory_budget`` smaller than the checkpoints' models
together, the pass goes over the training set once per group of checkpoints that fits; top-k
keeps the earlier groups' parts on disk (:mod:`.spill`) and ranks in the last group's pass.
Memory then holds one group's models, whatever the number of checkpoints.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from kgtrace.attribution.compiled import CompiledGradients
from kgtrace.attribution.factors import Factors, dot, self_dot
from kgtrace.attribution.fast import fast_path
from kgtrace.attribution.grads import dense_factors
from kgtrace.attribution.params import select_parameters
from kgtrace.attribution.reference import reference_influence
from kgtrace.attribution.rows import row_factors, row_tables
from kgtrace.attribution.spill import Spill
from kgtrace.attribution.topk import RunningTopK, TopK, top_k_results
from kgtrace.distributed import ONE, World
from kgtrace.errors import ConfigError
from kgtrace.io import atomic_open, remove_stale_temporaries
from kgtrace.precision import DTYPES, precision_context, precision_problems
from kgtrace.registry import model_names, spec_named
from kgtrace.run import Run, model_from_checkpoint
from kgtrace.system import bar_disable, keep_freed_memory, side_by_side
from kgtrace.checkpoint import CheckpointInfo, load_checkpoint
from kgtrace.config import parse_size

__all__ = ["TopK", "TracIn"]

PATHS = ("auto", "reference", "general", "rows", "fast")
#: Whether the fast path may switch to forward mode where it pays (tests turn it off to compare both modes).
_FORWARD_MODE = True
SAVE_EVERY_S = 30.0  # how often a streaming pass with ``state`` saves its progress, by default


class TracIn:
    """TracInCP influence of a run's training triples on test triples.

    run: a :class:`kgtrace.run.Run` (``kgtrace.load_run``); its model is copied, not changed.
    params: "last", "all" or a list of parameter names (:func:`select_parameters`).
    checkpoints: "all" or a list of epochs; each is weighed by its recorded lr.
    path: "auto", "fast", "rows", "general" or "reference" (module doc).
    train_indices: restrict the training triples to these rows of ``run.dataset.train``
        (columns of :meth:`influence` follow their order); None: all.
    chunk_size: training triples per chunk (bounds memory); None: for the fast path 4096 on a CPU
        and 65536 on a GPU (FAST_CHUNKS: a GPU's pass is otherwise bound by the launches of its
        many small kernels per chunk); for paths that materialise per-sample gradients, as many as
        keep them near 1 GB (vmap's intermediates measured at ~35x the gradients' own size on CPU),
        at most 4096.
    precision: "fp32"; or "bf16" / "fp16" to compute gradients under autocast and their
        products in that type (faster where the hardware has it, less exact: see docs/benchmarks.md).
    compile: compute the per-triple gradients through torch.compile (:mod:`.compiled`; same
        influences up to float rounding); the counters are in ``compiled.calls``.
    world: the processes of a distributed job (:mod:`kgtrace.distributed`); each streams every
        ``world.size``-th training chunk and results are merged, equal to one process's. Every
        process must make the same calls; each gets the whole result.
    memory_budget: bytes (or a size such as "2GB") for the checkpoints' models held at once; when
        they need more, the pass goes a group of checkpoints at a time (module doc). None: all at once.
    """

    def __init__(
        self,
        run: Run,
        params: str | Sequence[str] = "last",
        checkpoints: Literal["all"] | Sequence[int] = "all",
        device: str | torch.device = "cpu",
        path: Literal["auto", "reference", "general", "rows", "fast"] = "auto",
        train_indices: Tensor | Sequence[int] | None = None,
        chunk_size: int | None = None,
        precision: Literal["fp32", "bf16", "fp16"] = "fp32",
        compile: bool = False,
        world: World = ONE,
        memory_budget: int | str | None = None,
    ):
        self.device = torch.device(device)
        self.world = world
        self._run_model = run.model  # the reference path's template (it copies it); never changed
        self.model = _weightless_copy(run.model)  # the architecture, for shapes and the fast path's choices
        self.names = select_parameters(self.model, params)
        chosen, problems = _choose_checkpoints(run.checkpoints, checkpoints)
        problems += self._path_problems(path, precision, chunk_size)
        budget, budget_problems = _budget(memory_budget)
        if problems or budget_problems:
            raise ConfigError(problems + budget_problems)
        self._fast = fast_path(self.model)  # None: the model has no fast path
        self.path = ("fast" if self._fast is not None else "general") if path == "auto" else path
        self.precision = precision
        self.checkpoints: list[CheckpointInfo] = chosen
        self.chunk_size = chunk_size or self._default_chunk()
        train = run.dataset.train
        self.train_indices = (torch.arange(len(train)) if train_indices is None
                              else torch.as_tensor(train_indices, dtype=torch.long).reshape(-1))
        self.train = (train if train_indices is None else train[self.train_indices]).to(self.device)
        self.groups = _groups(len(chosen), _model_bytes(self.model), budget)
        self._models: list[nn.Module] | None = None
        self.compiled = CompiledGradients(self.chunk_size, self.device) if compile else None

    # ------------------------------------------------------------------ setup

    def _path_problems(self, path: str, precision: str, chunk_size: int | None) -> list[str]:
        kind = type(self.model).__qualname__
        problems = []
        if path not in PATHS:
            problems.append(f"path={path!r}: unknown; fix: use one of {list(PATHS)}")
        elif path == "fast" and fast_path(self.model) is None:
            have = [name for name in model_names() if fast_path(spec_named(name).model_class) is not None]
            problems.append(f"path='fast': no factored gradients for {kind} (have them for models {have}); "
                            "fix: use path='general'")
        elif path == "rows" and not row_tables(self.model):
            problems.append(f"path='rows': {kind} declares no embedding tables; fix: use path='general'")
        problems += precision_problems(precision, self.device)
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            problems.append(f"chunk_size={chunk_size!r}: must be a positive integer")
        return problems

    def _default_chunk(self) -> int:
        if self.path == "fast":
            return FAST_CHUNKS.get(self.device.type, FAST_CHUNKS["cpu"])
        params = dict(self.model.named_parameters())
        tables = row_tables(self.model) if self.path == "rows" else {}
        dense = sum(params[n].numel() for n in self.names if n not in tables)
        return max(1, min(4096, int(1e9 // (max(dense, 1) * 4 * 35))))

    def _checkpoint_models(self) -> list[nn.Module]:
        """One eval-mode copy of the model per checkpoint, loaded once (model weights only, memory-mapped)."""
        if self._models is None:
            self._models = [self._load(info) for info in self.checkpoints]
        return self._models

    def _group_models(self, group: Sequence[int]) -> list[nn.Module]:
        """The models of a group of checkpoints: kept for later calls when one group holds them all."""
        if len(self.groups) == 1:
            return self._checkpoint_models()
        return [self._load(self.checkpoints[i]) for i in group]

    def _load(self, info: CheckpointInfo) -> nn.Module:
        return model_from_checkpoint(load_checkpoint(info.path, map_location=self.device, mmap=True), self.device)

    def _factorise(self, model: nn.Module, triples: Tensor) -> Factors:
        """Per-triple gradient factors of ``triples`` at one checkpoint's weights."""
        if self.path == "fast":
            function = self._fast.factors
        else:
            function = row_factors if self.path == "rows" else dense_factors
        if self.compiled is not None:
            function = self.compiled.wrap(function)
        if self.precision == "fp32":
            return function(model, triples, self.names)
        with precision_context(self.precision, self.device):
            return function(model, triples, self.names).to(DTYPES[self.precision])

    def _forward_plan(self, test: Tensor, triples: Tensor) -> object | None:
        """How this chunk's influence on ``test`` takes some terms in forward mode (fast path, fp32 only); None: the
        factors' products alone."""
        forward = self._fast.forward if self.path == "fast" else None
        if not (_FORWARD_MODE and forward is not None and self.precision == "fp32"):
            return None
        return forward[0](self.model, self.names, len(test), triples, len(self.train) // self.world.size)

    def _reuses_blocks(self) -> bool:
        """Whether the fast path allocates the same large blocks over and over for these parameters."""
        reuses = self._fast.reuses_blocks if self.path == "fast" else None
        return reuses is not None and reuses(self.names)

    def _check_test(self, test: Tensor) -> Tensor:
        test = torch.as_tensor(test, dtype=torch.long, device=self.device)
        if test.dim() == 1:
            test = test.unsqueeze(0)
        if test.dim() != 2 or test.shape[1] != 3:
            raise ConfigError([f"test: shape {tuple(test.shape)}; fix: pass a LongTensor [n, 3] of (h, r, t) ids"])
        return test

    def _chunks(self) -> list[Tensor]:
        """Positions in ``self.train``, sorted by (head, relation) and cut into chunks."""
        num_ids = int(self.train[:, 1].max()) + 1 if len(self.train) else 1
        order = torch.argsort(self.train[:, 0] * num_ids + self.train[:, 1], stable=True)
        # A process of a distributed job takes every world.size-th of one process's chunks: the same
        # chunks, so the same arithmetic, whatever the number of processes.
        return list(order.split(self.chunk_size))[self.world.rank :: self.world.size]

    def _stream(self, test: Tensor | None, desc: str, progress: bool, state: "_State",
                data: Callable[[], dict] | None = None, whole: bool = True) -> Iterator[tuple[slice, Tensor, Tensor]]:
        """(checkpoints, positions [c], their lr-weighted parts [G, n_test, c], or [G, c] with test None).

        Starts at step ``state.next`` (step = group * chunks + chunk) and, after the consumer has
        taken each chunk, lets ``state`` save ``data()``. whole: every yield holds all checkpoints
        (the groups before the last are spilled to disk and joined in the last one's pass); else
        each group's parts come in yields of their own.
        """
        chunks = self._chunks()
        spill = self._spill(state, len(test), chunks) if whole and test is not None and len(self.groups) > 1 else None
        if self._reuses_blocks():
            # Same-sized blocks re-allocated per test triple or per sub-chunk: keeping freed memory saves
            # their page faults (15% of forward mode's time, 25% of the upstream pass's). Not for the other
            # passes, whose chunk-sized blocks vary: kept, they fragment the heap (working memory +20%
            # from 250k to 1M training triples).
            keep_freed_memory()
        bar = tqdm(total=len(chunks) * len(self.groups), initial=state.next, desc=desc, unit="chunk",
                   disable=bar_disable(progress), dynamic_ncols=True)
        done = False
        try:
            with bar, torch.no_grad():
                for g, group in enumerate(self.groups):
                    first = max(state.next - g * len(chunks), 0)
                    if first >= len(chunks):
                        continue
                    models = self._group_models(group)
                    lrs = [self.checkpoints[i].lr for i in group]
                    # kept for the group's whole pass: each checkpoint's test factors, computed once (on the first
                    # worker's copies, before any chunk runs: what a copy caches serves the chunks too), and its memo
                    copies = [_private_copy(m, 0) for m in models]
                    test_factors = None if test is None else [self._factorise(m, test) for m in copies]
                    memos = [{} for _ in models]
                    last = g == len(self.groups) - 1
                    work = partial(self._chunk_parts, chunks, lrs, test_factors, memos, test)
                    # Each worker its own module objects over the same weights: the rows and general paths swap a
                    # module's parameters while they run (functional_call), which on a shared module races.
                    own = _private_maker(models)
                    for number, parts in side_by_side(work, range(first, len(chunks)), self.device, own,
                                                      enabled=self.compiled is None):
                        positions = chunks[number]
                        if spill is not None and not last:
                            spill.write(g, number, parts)
                        elif spill is not None:
                            yield slice(0, len(self.checkpoints)), positions, torch.cat([spill.read(number, self.device), parts])
                        else:
                            yield slice(group[0], group[-1] + 1), positions, parts
                        state.step(g * len(chunks) + number, data)
                        bar.update(1)
                    del models, copies, test_factors, memos, work, own  # a group's models go before the next group's come
            done = True
        finally:
            if spill is not None:
                spill.close(remove=done)

    def _chunk_parts(self, chunks: list[Tensor], lrs: list[float], test_factors: list[Factors] | None,
                     memos: list[dict], test: Tensor | None, number: int, models: list[nn.Module]) -> Tensor:
        """:meth:`_parts` of chunk ``number`` (positions ``chunks[number]`` of the training triples) with
        ``models``, the checkpoints' models that this chunk alone uses while it runs (:func:`_private_maker`)."""
        return self._parts(models, lrs, test_factors, memos, test, self.train.index_select(0, chunks[number]))

    def _parts(self, models: list[nn.Module], lrs: list[float], test_factors: list[Factors] | None,
               memos: list[dict], test: Tensor | None, triples: Tensor) -> Tensor:
        """lr-weighted parts [G, n_test, c] of the checkpoints of ``models`` (self-influence [G, c] with test None).

        memos: one dict per model that the fast path's forward mode keeps values in over the pass.
        """
        if test is None:
            parts = [lr * self_dot(self._factorise(m, triples)) for m, lr in zip(models, lrs)]
        elif (plan := self._forward_plan(test, triples)) is not None:
            influence = self._fast.forward[1]
            influence = influence if self.compiled is None else self.compiled.wrap(influence)
            parts = [lr * influence(m, tf, triples, self.names, plan, memo)
                     for m, lr, tf, memo in zip(models, lrs, test_factors, memos)]
        else:
            parts = [lr * dot(tf, self._factorise(m, triples)) for m, lr, tf in zip(models, lrs, test_factors)]
        return torch.stack(parts)

    def _spill(self, state: "_State", n_test: int, chunks: list[Tensor]) -> Spill:
        """Disk for the parts of the groups before the last: beside the state file, else a temporary folder."""
        folder, stem = (None, "parts") if state.path is None else (state.path.parent, state.path.name)
        return Spill(folder, stem, self.groups, n_test, [len(c) for c in chunks], fresh=state.next == 0)

    # ------------------------------------------------------------------ public

    def influence(self, test: Tensor) -> Tensor:
        """Influence [n_test, n_train] (float32) of each training triple on each test triple."""
        test = self._check_test(test)
        if self.path == "reference":
            states = ((load_checkpoint(c.path, map_location=self.device)["model_state"], c.lr) for c in self.checkpoints)
            return reference_influence(self._run_model, states, test, self.train, self.names).float().cpu()
        # Accumulated as [n_train, n_test]: adding a chunk's rows is ~4x faster on a CPU than scattering its
        # columns into [n_test, n_train] (about a sixth of influence's time with 100 test triples on FB15k-237).
        # With one group of checkpoints each row is written once, its float64 sum over them rounded to float32 as
        # a float64 total would be at the end (and 272,115 x 100 of them accumulate in 0.35 s instead of 0.50 s);
        # several groups add up in float64.
        dtype = torch.float32 if len(self.groups) == 1 else torch.float64
        total = torch.zeros(len(self.train), len(test), dtype=dtype, device=self.device)
        for _, positions, parts in self._stream(test, "influence", False, _State.fresh(), whole=False):
            total.index_add_(0, positions, parts.double().sum(0).T.to(dtype))  # [c, n_test] rows at positions
        total = self.world.all_reduce_sum(total).float()  # each row is non-zero on one process only
        return total.T.contiguous().cpu()  # the float64 sums are freed before the transposed copy

    def top_k(self, test: Tensor, k: int = 10, progress: bool = False, state: str | Path | None = None,
              save_every: float | None = None) -> list[TopK]:
        """Per test triple, the k strongest proponents (descending) and opponents (ascending).

        One streaming pass over the training set: memory holds the test triples' factors and
        the running top-k, not [n_test, n_train]. state: a file to save progress to (and resume
        from, when it holds progress of the same computation); removed when done. save_every:
        seconds between saves (None: SAVE_EVERY_S; 0: after every chunk).
        """
        test = self._check_test(test)
        k = min(int(k), len(self.train))
        if k < 1:
            raise ConfigError([f"k={k}: must be at least 1 (and the training set non-empty)"])
        if self.path == "reference":
            return self._top_k_of(test, self.influence(test).unsqueeze(0), k)
        best = RunningTopK(len(test), k, len(self.checkpoints), largest=True, device=self.device)
        worst = RunningTopK(len(test), k, len(self.checkpoints), largest=False, device=self.device)
        saved = _State.open(self._state_file(state), self._signature("top_k", test, k), save_every)
        if saved.data:
            best.load(saved.data["best"])
            worst.load(saved.data["worst"])
        def data() -> dict:  # what a save of the progress holds
            return {"best": best.state(), "worst": worst.state()}

        for _, positions, parts in self._stream(test, "TracIn top-k", progress, saved, data):
            best.update(parts, positions)
            worst.update(parts, positions)
        self._merge_processes(best, worst)
        saved.finish()
        return top_k_results(test, self.train_indices, best, worst)

    def _merge_processes(self, *running: RunningTopK) -> None:
        """In a distributed job: every process's running top-k merged into each (exact, see RunningTopK.merge)."""
        if not self.world.distributed:
            return
        mine = [{key: value.cpu() for key, value in r.state().items()} for r in running]
        everyone = self.world.all_gather_objects(mine)  # [process][which running top-k]
        for i, r in enumerate(running):
            r.merge([states[i] for rank, states in enumerate(everyone) if rank != self.world.rank])

    def _state_file(self, state: str | Path | None) -> Path | None:
        """Each process of a distributed job saves its own progress beside ``state``."""
        if state is None or not self.world.distributed:
            return None if state is None else Path(state)
        return Path(f"{state}.rank{self.world.rank}-of-{self.world.size}")

    def _top_k_of(self, test: Tensor, parts: Tensor, k: int) -> list[TopK]:
        """Top-k from a full [C, n_test, n_train] (the reference path: one part, the total)."""
        best = RunningTopK(len(test), k, parts.shape[0], largest=True)
        worst = RunningTopK(len(test), k, parts.shape[0], largest=False)
        columns = torch.arange(parts.shape[2])
        best.update(parts, columns)
        worst.update(parts, columns)
        return top_k_results(test, self.train_indices, best, worst)

    def checkpoint_self_influence(self, progress: bool = False, state: str | Path | None = None,
                                  save_every: float | None = None) -> Tensor:
        """Each checkpoint's lr-weighted self-influence term, [C, n_train] float32 (sum over C: self-influence).

        state, save_every: as for :meth:`top_k`.
        """
        if self.path == "reference":
            # Slow: one triple at a time keeps memory at [1, 1] per triple.
            out = torch.zeros(len(self.checkpoints), len(self.train))
            for c, info in enumerate(self.checkpoints):
                one = [(load_checkpoint(info.path, map_location=self.device)["model_state"], info.lr)]
                for j, z in enumerate(self.train):
                    out[c, j] = reference_influence(self._run_model, one, z.view(1, 3), z.view(1, 3), self.names)[0, 0]
            return out
        saved = _State.open(self._state_file(state), self._signature("self", None, 0), save_every)
        out = saved.data["parts"] if saved.data else torch.zeros(len(self.checkpoints), len(self.train),
                                                                 device=self.device)
        for checkpoints, positions, parts in self._stream(None, "TracIn self-influence", progress, saved,
                                                          lambda: {"parts": out}, whole=False):
            out[checkpoints, positions] = parts
        self.world.all_reduce_sum(out)  # each column is non-zero on one process only: the sum is exact
        saved.finish()
        return out.cpu()

    def self_influence(self, progress: bool = False, state: str | Path | None = None,
                       save_every: float | None = None) -> Tensor:
        """Self-influence [n_train] (float32): influence of each training triple on itself."""
        return self.checkpoint_self_influence(progress, state, save_every).double().sum(0).float()

    def _signature(self, kind: str, test: Tensor | None, k: int) -> str:
        """What a saved state must match to be resumed: the same computation on the same inputs."""
        h = hashlib.sha256()
        for c in self.checkpoints:
            stat = c.path.stat()
            h.update(f"{c.path.resolve()}|{c.epoch}|{c.lr!r}|{stat.st_size}|{stat.st_mtime_ns};".encode())
        # The groups too: a step of the saved progress counts the chunks of every group before it.
        h.update(f"{kind}|{self.names}|{self.path}|{self.precision}|{self.chunk_size}|{k}|{self.groups};".encode())
        if self.world.distributed:  # a process's progress is its share of the chunks
            h.update(f"rank {self.world.rank} of {self.world.size};".encode())
        h.update(self.train.cpu().numpy().tobytes())
        if test is not None:
            h.update(test.cpu().numpy().tobytes())
        return h.hexdigest()


#: The fast path's training triples per chunk by device type: on a CPU, chunks that stay in cache; on a GPU,
#: chunks large enough that the kernels' work, not their launches, sets the pace (at 4096 an H200's pass over
#: 10M triples took 40 s for 1.5 s of arithmetic).
FAST_CHUNKS = {"cpu": 4096, "cuda": 65536}


def _weightless_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers live on the meta device: its structure and shapes, no memory."""
    memo = {}
    for t in chain(model.parameters(), model.buffers()):
        empty = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else empty
    return copy.deepcopy(model, memo).eval()


#: model -> its private copies (:func:`_private_maker`), the k-th for the k-th worker of a pass.
_PRIVATE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _private_maker(models: Sequence[nn.Module]) -> Callable[[], list[nn.Module]]:
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
        return [_private_copy(model, k) for model in models]

    return make


def _private_copy(model: nn.Module, k: int) -> nn.Module:
    copies = _PRIVATE.setdefault(model, [])
    while len(copies) <= k:
        memo = {id(t): t for t in chain(model.parameters(), model.buffers())}
        copies.append(copy.deepcopy(model, memo))
    return copies[k]


def _model_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in chain(model.parameters(), model.buffers()))


def _budget(memory_budget: int | str | None) -> tuple[int | None, list[str]]:
    if memory_budget is None:
        return None, []
    try:
        budget = parse_size(memory_budget)
    except ValueError as e:
        return None, [str(e)]
    return (budget, []) if budget >= 1 else (None, [f"memory_budget={memory_budget!r}: must be 1 byte or more"])


def _groups(checkpoints: int, model_bytes: int, budget: int | None) -> list[list[int]]:
    """Checkpoint indices held at once, in order: as many as ``budget`` has room for, at least one."""
    size = checkpoints if budget is None else max(1, min(checkpoints, budget // max(model_bytes, 1)))
    return [list(range(i, min(i + size, checkpoints))) for i in range(0, checkpoints, max(size, 1))]


def _choose_checkpoints(available: list[CheckpointInfo], wanted) -> tuple[list[CheckpointInfo], list[str]]:
    if wanted == "all":
        chosen, problems = list(available), []
    else:
        by_epoch = {c.epoch: c for c in available}
        missing = [e for e in wanted if e not in by_epoch]
        problems = [f"checkpoints: no epoch checkpoint for epoch(s) {missing}; fix: use epochs from "
                    f"{sorted(by_epoch)}"] if missing else []
        chosen = [by_epoch[e] for e in wanted if e in by_epoch]
    if not chosen and not problems:
        problems.append("checkpoints: none selected (the run has no epoch checkpoints?); "
                        "fix: train with checkpoint_every > 0")
    return chosen, problems


class _State:
    """Progress of a streaming pass, saved atomically to a file now and then (weights_only-loadable)."""

    def __init__(self, path: Path | None, signature: str, next_chunk: int, data: dict | None,
                 save_every: float | None = None):
        self.path, self.signature, self.next, self.data = path, signature, next_chunk, data
        self.save_every = SAVE_EVERY_S if save_every is None else float(save_every)
        self.saved_at = time.monotonic()

    @classmethod
    def fresh(cls) -> "_State":
        return cls(None, "", 0, None)

    @classmethod
    def open(cls, path: str | Path | None, signature: str, save_every: float | None = None) -> "_State":
        """Resume from ``path`` if it holds this computation's progress, else start at chunk 0."""
        if save_every is not None and not save_every >= 0:
            raise ConfigError([f"save_every={save_every!r}: must be a number of seconds, 0 or more"])
        if path is not None:  # what saves killed mid-write left (the state file is this pass's alone)
            remove_stale_temporaries(Path(path).parent, [Path(path).name])
        if path is None or not Path(path).is_file():
            return cls(None if path is None else Path(path), signature, 0, None, save_every)
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a foreign or damaged state file: start over (it is ours, and rewritten)
            saved = {}
        if saved.get("signature") != signature:
            return cls(Path(path), signature, 0, None, save_every)
        return cls(Path(path), signature, int(saved["next"]), saved["data"], save_every)

    def step(self, number: int, data: Callable[[], dict] | None) -> None:
        """Step ``number`` is done: save ``data()`` if it is time to (data None: a pass that saves nothing)."""
        if data is not None and self.path is not None and time.monotonic() - self.saved_at >= self.save_every:
            with atomic_open(self.path, "wb") as f:
                torch.save({"signature": self.signature, "next": number + 1, "data": data()}, f)
            self.saved_at = time.monotonic()

    def finish(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)

