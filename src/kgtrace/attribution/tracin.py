"""TracInCP (Pruthi et al., 2020) over a run's epoch checkpoints.

influence(z, z') = sum over checkpoints c of lr_c * <grad l(theta_c, z), grad l(theta_c, z')>

where l(z) = softplus(-score_hrt(z)) is the triple's own BCE-with-logits loss against
label 1, gradients are taken over a parameter set (see `kgtrace.attribution.params`)
and the model is in eval mode (BatchNorm on running statistics, dropout off).

`TracIn` wires together the parts of the computation, each in a module of its own:

* `.paths`: the paths to per-triple gradients ("fast", "rows", "general", "reference", "auto")
  and their chunk sizes;
* `.checkpoints`: which checkpoints, and their models held a group at a time within a
  ``memory_budget``;
* `.stream`: the pass over the training set, chunk by chunk, chunks side by side in threads
  (their private module objects: `.copies`);
* `.progress`: the progress a pass with ``state=FILE`` saves, so that a killed run resumes.

`TracIn.top_k` and `TracIn.self_influence` keep only what they return, so their
memory does not grow with the training set.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn

from kgtrace.attribution.checkpoints import CheckpointModels, checkpoint_groups, choose_checkpoints, model_bytes, parse_budget
from kgtrace.attribution.compiled import CompiledGradients
from kgtrace.attribution.copies import weightless_copy
from kgtrace.attribution.factors import Factors, dot, self_dot
from kgtrace.attribution.fast import fast_path
from kgtrace.attribution.grads import dense_factors
from kgtrace.attribution.params import select_parameters

# FAST_CHUNKS and PATHS are re-exported: kgtrace.attribution.tracin has always offered them.
from kgtrace.attribution.paths import FAST_CHUNKS as FAST_CHUNKS
from kgtrace.attribution.paths import PATHS as PATHS
from kgtrace.attribution.paths import default_chunk_size, path_problems
from kgtrace.attribution.progress import Progress, signature, state_file
from kgtrace.attribution.reference import reference_influence
from kgtrace.attribution.rows import row_factors
from kgtrace.attribution.stream import Stream, train_chunks
from kgtrace.attribution.topk import RunningTopK, TopK, top_k_results
from kgtrace.compute.distributed import ONE, World
from kgtrace.compute.precision import DTYPES, precision_context
from kgtrace.core.checkpoint import CheckpointInfo, load_checkpoint
from kgtrace.core.errors import ConfigError
from kgtrace.runs.embedding import Run

__all__ = ["TopK", "TracIn"]

#: Whether the fast path may switch to forward mode where it pays (tests turn it off to compare both modes).
_FORWARD_MODE = True
SAVE_EVERY_S = 30.0  # how often a streaming pass with ``state`` saves its progress, by default


class TracIn:
    """TracInCP influence of a run's training triples on test triples.

    Args:
        run: a `kgtrace.runs.embedding.Run` (``kgtrace.load_run``); its model is copied, not changed.
        params: "last", "all" or a list of parameter names (`select_parameters`).
        checkpoints: "all" or a list of epochs; each is weighed by its recorded lr.
        path: "auto", "fast", "rows", "general" or "reference" (`.paths`).
        train_indices: restrict the training triples to these rows of ``run.dataset.train``
            (columns of `influence` follow their order); None: all.
        chunk_size: training triples per chunk (bounds memory); None: for the fast path 4096 on a CPU
            and 65536 on a GPU (FAST_CHUNKS: a GPU's pass is otherwise bound by the launches of its
            many small kernels per chunk); for paths that materialise per-sample gradients, as many as
            keep them near 1 GB (vmap's intermediates measured at ~35x the gradients' own size on CPU),
            at most 4096.
        precision: "fp32"; or "bf16" / "fp16" to compute gradients under autocast and their
            products in that type (faster where the hardware has it, less exact: see docs/benchmarks.md).
        compile: compute the per-triple gradients through torch.compile (`.compiled`; same
            influences up to float rounding); the counters are in ``compiled.calls``.
        world: the processes of a distributed job (`kgtrace.compute.distributed`); each streams every
            ``world.size``-th training chunk and results are merged, equal to one process's. Every
            process must make the same calls; each gets the whole result.
        memory_budget: bytes (or a size such as "2GB") for the checkpoints' models held at once; when
            they need more, the pass goes a group of checkpoints at a time (`.checkpoints`). None: all at once.
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
        self.model = weightless_copy(run.model)  # the architecture, for shapes and the fast path's choices
        self.names = select_parameters(self.model, params)
        chosen, problems = choose_checkpoints(run.checkpoints, checkpoints)
        problems += path_problems(self.model, path, precision, chunk_size, self.device)
        budget, budget_problems = parse_budget(memory_budget)
        if problems or budget_problems:
            raise ConfigError(problems + budget_problems)
        self._fast = fast_path(self.model)  # None: the model has no fast path
        self.path = ("fast" if self._fast is not None else "general") if path == "auto" else path
        self.precision = precision
        self.checkpoints: list[CheckpointInfo] = chosen
        self.chunk_size = chunk_size or default_chunk_size(self.model, self.names, self.path, self.device)
        train = run.dataset.train
        self.train_indices = (torch.arange(len(train)) if train_indices is None
                              else torch.as_tensor(train_indices, dtype=torch.long).reshape(-1))
        self.train = (train if train_indices is None else train[self.train_indices]).to(self.device)
        self.groups = checkpoint_groups(len(chosen), model_bytes(self.model), budget)
        self._models = CheckpointModels(chosen, self.groups, self.device)
        self.compiled = CompiledGradients(self.chunk_size, self.device) if compile else None

    # ------------------------------------------------------------------ gradients

    def _checkpoint_models(self) -> list[nn.Module]:
        """One eval-mode copy of the model per checkpoint, loaded once (model weights only, memory-mapped)."""
        return self._models.all()

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

    # ------------------------------------------------------------------ wiring

    def _check_test(self, test: Tensor) -> Tensor:
        test = torch.as_tensor(test, dtype=torch.long, device=self.device)
        if test.dim() == 1:
            test = test.unsqueeze(0)
        if test.dim() != 2 or test.shape[1] != 3:
            raise ConfigError([f"test: shape {tuple(test.shape)}; fix: pass a LongTensor [n, 3] of (h, r, t) ids"])
        return test

    def _chunks(self) -> list[Tensor]:
        """Positions in ``self.train``, sorted by (head, relation) and cut into chunks (this process's)."""
        return train_chunks(self.train, self.chunk_size, self.world)

    def _stream(self) -> Stream:
        """A pass over the training chunks with this TracIn's gradients, bound now (tests swap ``_factorise``)."""
        reuses = self._fast.reuses_blocks if self.path == "fast" else None
        return Stream(self.train, self._chunks(), self._models, self._factorise, self._parts, self.device,
                      threaded=self.compiled is None, reuses_blocks=reuses is not None and reuses(self.names))

    def _progress(self, state: str | Path | None, save_every: float | None, kind: str, test: Tensor | None,
                  k: int) -> Progress:
        """The saved progress of this computation in ``state`` (or a start afresh)."""
        # The groups too: a step of the saved progress counts the chunks of every group before it.
        settings = (kind, self.names, self.path, self.precision, self.chunk_size, k, self.groups)
        computation = signature(self.checkpoints, settings, self.world, self.train, test)
        every = SAVE_EVERY_S if save_every is None else save_every  # read at the call: tests set SAVE_EVERY_S
        return Progress.open(state_file(state, self.world), computation, every)

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
        for _, positions, parts in self._stream().parts(test, "influence", False, Progress.fresh(), whole=False):
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
            return _top_k_of(test, self.train_indices, self.influence(test).unsqueeze(0), k)
        best = RunningTopK(len(test), k, len(self.checkpoints), largest=True, device=self.device)
        worst = RunningTopK(len(test), k, len(self.checkpoints), largest=False, device=self.device)
        saved = self._progress(state, save_every, "top_k", test, k)
        if saved.data:
            best.load(saved.data["best"])
            worst.load(saved.data["worst"])
        def data() -> dict:  # what a save of the progress holds
            return {"best": best.state(), "worst": worst.state()}

        for _, positions, parts in self._stream().parts(test, "TracIn top-k", progress, saved, data):
            best.update(parts, positions)
            worst.update(parts, positions)
        _merge_processes(self.world, best, worst)
        saved.finish()
        return top_k_results(test, self.train_indices, best, worst)

    def checkpoint_self_influence(self, progress: bool = False, state: str | Path | None = None,
                                  save_every: float | None = None) -> Tensor:
        """Each checkpoint's lr-weighted self-influence term, [C, n_train] float32 (sum over C: self-influence).

        state, save_every: as for `top_k`.
        """
        if self.path == "reference":
            # Slow: one triple at a time keeps memory at [1, 1] per triple.
            out = torch.zeros(len(self.checkpoints), len(self.train))
            for c, info in enumerate(self.checkpoints):
                one = [(load_checkpoint(info.path, map_location=self.device)["model_state"], info.lr)]
                for j, z in enumerate(self.train):
                    out[c, j] = reference_influence(self._run_model, one, z.view(1, 3), z.view(1, 3), self.names)[0, 0]
            return out
        saved = self._progress(state, save_every, "self", None, 0)
        out = saved.data["parts"] if saved.data else torch.zeros(len(self.checkpoints), len(self.train),
                                                                 device=self.device)
        for checkpoints, positions, parts in self._stream().parts(None, "TracIn self-influence", progress, saved,
                                                                  lambda: {"parts": out}, whole=False):
            out[checkpoints, positions] = parts
        self.world.all_reduce_sum(out)  # each column is non-zero on one process only: the sum is exact
        saved.finish()
        return out.cpu()

    def self_influence(self, progress: bool = False, state: str | Path | None = None,
                       save_every: float | None = None) -> Tensor:
        """Self-influence [n_train] (float32): influence of each training triple on itself."""
        return self.checkpoint_self_influence(progress, state, save_every).double().sum(0).float()


def _merge_processes(world: World, *running: RunningTopK) -> None:
    """In a distributed job: every process's running top-k merged into each (exact, see RunningTopK.merge)."""
    if not world.distributed:
        return
    mine = [{key: value.cpu() for key, value in r.state().items()} for r in running]
    everyone = world.all_gather_objects(mine)  # [process][which running top-k]
    for i, r in enumerate(running):
        r.merge([states[i] for rank, states in enumerate(everyone) if rank != world.rank])


def _top_k_of(test: Tensor, train_indices: Tensor, parts: Tensor, k: int) -> list[TopK]:
    """Top-k from a full [C, n_test, n_train] (the reference path: one part, the total)."""
    best = RunningTopK(len(test), k, parts.shape[0], largest=True)
    worst = RunningTopK(len(test), k, parts.shape[0], largest=False)
    columns = torch.arange(parts.shape[2])
    best.update(parts, columns)
    worst.update(parts, columns)
    return top_k_results(test, train_indices, best, worst)
