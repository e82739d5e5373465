"""TracInCP (Pruthi et al., 2020) over a run's epoch checkpoints.

influence(z, z') = sum over checkpoints c of lr_c * <grad l(theta_c, z), grad l(theta_c, z')>

where l(z) = softplus(-score_hrt(z)) is the triple's own BCE-with-logits loss against
label 1, gradients are taken over a parameter set (see :mod:`kgtrace.attribution.params`)
and the model is in eval mode (BatchNorm on running statistics, dropout off).

Paths: "reference" (per-triple autograd, float64; slow, for checking), "general"
(torch.func per-sample gradients, chunked), "fast" (exact ConvE last-layer factorisation,
see :mod:`kgtrace.attribution.fast`), "auto" (fast when available, else general).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from kgtrace.attribution.fast import fast_available, fast_influence, fast_self_influence
from kgtrace.attribution.grads import general_influence, general_self_influence
from kgtrace.attribution.params import select_parameters
from kgtrace.attribution.reference import reference_influence
from kgtrace.errors import ConfigError
from kgtrace.run import Run
from kgtrace.training.checkpoint import CheckpointInfo, load_checkpoint

__all__ = ["TopK", "TracIn"]

PATHS = ("auto", "reference", "general", "fast")


@dataclass
class TopK:
    """The most influential training triples for one test triple.

    proponents: train indices (into ``run.dataset.train``) with the largest influences,
    descending; opponents: those with the smallest (most negative), ascending.
    """

    test: Tensor  # [3] (head, relation, tail)
    proponents: Tensor  # LongTensor [k], indices into run.dataset.train
    proponent_influence: Tensor  # [k], descending
    opponents: Tensor  # LongTensor [k]
    opponent_influence: Tensor  # [k], ascending


class TracIn:
    """TracInCP influence of a run's training triples on test triples.

    run: a :class:`kgtrace.run.Run` (``kgtrace.load_run``); its model is copied, not changed.
    params: "last", "all" or a list of parameter names (:func:`select_parameters`).
    checkpoints: "all" or a list of epochs; each is weighed by its recorded lr.
    path: "auto", "reference", "general" or "fast" (fast: ConvE with a subset of
        fc.weight, fc.bias, entity_bias only).
    train_indices: restrict the training triples to these rows of ``run.dataset.train``
        (columns of :meth:`influence` follow their order); None: all.
    chunk_size: training triples per chunk (bounds memory); None: 4096 for the fast path,
        and for the general path as many as keep per-sample gradients near 1 GB (vmap's
        intermediates measured at ~35x the gradients' own size on CPU), at most 256.
    """

    def __init__(
        self,
        run: Run,
        params: str | Sequence[str] = "last",
        checkpoints: Literal["all"] | Sequence[int] = "all",
        device: str | torch.device = "cpu",
        path: Literal["auto", "reference", "general", "fast"] = "auto",
        train_indices: Tensor | Sequence[int] | None = None,
        chunk_size: int | None = None,
    ):
        problems = []
        self.device = torch.device(device)
        self.model = copy.deepcopy(run.model).to(self.device).eval()
        self.names = select_parameters(self.model, params)
        if checkpoints == "all":
            chosen = list(run.checkpoints)
        else:
            by_epoch = {c.epoch: c for c in run.checkpoints}
            missing = [e for e in checkpoints if e not in by_epoch]
            if missing:
                problems.append(f"checkpoints: no epoch checkpoint for epoch(s) {missing}; "
                                f"fix: use epochs from {sorted(by_epoch)}")
            chosen = [by_epoch[e] for e in checkpoints if e in by_epoch]
        if not chosen and not problems:
            problems.append("checkpoints: none selected (the run has no epoch checkpoints?); "
                            "fix: train with checkpoint_every > 0")
        if path not in PATHS:
            problems.append(f"path={path!r}: unknown; fix: use one of {list(PATHS)}")
        elif path == "fast" and not fast_available(self.model, self.names):
            problems.append(f"path='fast': only for ConvE with parameters among fc.weight, fc.bias, entity_bias "
                            f"(have {type(self.model).__name__}, {self.names}); fix: use path='general'")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            problems.append(f"chunk_size={chunk_size!r}: must be a positive integer")
        if problems:
            raise ConfigError(problems)
        if path == "auto":
            path = "fast" if fast_available(self.model, self.names) else "general"
        self.path = path
        self.checkpoints: list[CheckpointInfo] = chosen
        if chunk_size is None:
            n_params = sum(dict(self.model.named_parameters())[n].numel() for n in self.names)
            chunk_size = 4096 if path == "fast" else max(1, min(256, int(1e9 // (n_params * 4 * 35))))
        self.chunk_size = chunk_size
        train = run.dataset.train
        if train_indices is None:
            self.train_indices = torch.arange(len(train))
        else:
            self.train_indices = torch.as_tensor(train_indices, dtype=torch.long).reshape(-1)
        self.train = train[self.train_indices].to(self.device)

    def _states(self):
        for info in self.checkpoints:
            yield load_checkpoint(info.path, map_location=self.device)["model_state"], info.lr

    def _check_test(self, test: Tensor) -> Tensor:
        test = torch.as_tensor(test, dtype=torch.long, device=self.device)
        if test.dim() == 1:
            test = test.unsqueeze(0)
        if test.dim() != 2 or test.shape[1] != 3:
            raise ConfigError([f"test: shape {tuple(test.shape)}; fix: pass a LongTensor [n, 3] of (h, r, t) ids"])
        return test

    def influence(self, test: Tensor) -> Tensor:
        """Influence [n_test, n_train] (float32) of each training triple on each test triple."""
        test = self._check_test(test)
        if self.path == "reference":
            return reference_influence(self.model, self._states(), test, self.train, self.names).float().cpu()
        step = fast_influence if self.path == "fast" else general_influence
        total = torch.zeros(len(test), len(self.train), dtype=torch.float64, device=self.device)
        for state, lr in self._states():
            self.model.load_state_dict(state)
            self.model.eval()
            total += lr * step(self.model, test, self.train, self.names, self.chunk_size).double()
        return total.float().cpu()

    def self_influence(self) -> Tensor:
        """Self-influence [n_train] (float32): influence of each training triple on itself."""
        if self.path == "reference":
            # Slow: one row at a time keeps memory at [1, n_train] per triple.
            return torch.stack([reference_influence(self.model, self._states(), z.view(1, 3), z.view(1, 3),
                                                    self.names)[0, 0] for z in self.train]).float().cpu()
        step = fast_self_influence if self.path == "fast" else general_self_influence
        total = torch.zeros(len(self.train), dtype=torch.float64, device=self.device)
        for state, lr in self._states():
            self.model.load_state_dict(state)
            self.model.eval()
            total += lr * step(self.model, self.train, self.names, self.chunk_size).double()
        return total.float().cpu()

    def top_k(self, test: Tensor, k: int = 10) -> list[TopK]:
        """Per test triple, the k strongest proponents (descending) and opponents (ascending)."""
        test = self._check_test(test)
        scores = self.influence(test)
        k = min(int(k), scores.shape[1])
        out = []
        for row, triple in zip(scores, test.cpu()):
            top = torch.topk(row, k, largest=True, sorted=True)
            bottom = torch.topk(row, k, largest=False, sorted=True)
            out.append(TopK(triple, self.train_indices[top.indices], top.values,
                            self.train_indices[bottom.indices], bottom.values))
        return out
