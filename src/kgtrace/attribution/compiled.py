"""TracIn's gradient functions under torch.compile (``TracIn(compile=True)``, ``kgtrace explain --compile``).

Each entry point goes through `CompiledCall` (static buffers, padded
last chunk, mark-step, clone at the boundary, no eager fallback):

* ``tracin_general``: per-triple gradients [B, P] of the general path (``vmap(grad)`` over
  ``functional_call``, `wrapped_gradients`);
* ``tracin_rows``: the embedding-row form (the rows path, and DistMult's and ComplEx's fast
  path): dense gradients and row gradients per id space (`row_gradients`);
* ``tracin_conve_band_head``, ``tracin_conve_band_pair``, ``tracin_conve_band_relation``:
  ConvE's fast path, one band of fc's input and its part of fc's product per distinct head,
  pair or relation (`band_values`, the convolution and the fc layer: the
  factors' costly part); a model whose kernel is taller than an embedding has only the pair
  band. The per-triple closed form, O(D) per triple, stays eager; so do the pull-backs of the
  upstream parameters' gradients (`.conve_block`) and forward mode's JVPs.

Not compiled: the products of factors (`dot`): their shapes follow the data
(distinct pairs, shared ids), which a static graph cannot take.

The model is in eval mode (batch norm on running statistics, no dropout), so rows are
independent: padding the last chunk changes no real row, and the padded rows are dropped at
the boundary. Every checkpoint's model is passed to the same compiled call as an argument:
models of one architecture share one graph (dynamo guards on their structure, not their
identity), so C checkpoints compile once. Results equal the eager functions up to float
rounding (tests/test_compiled_tracin.py: influences within 1e-4 relative).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor, nn

from kgtrace.attribution.conve import conve_factors, conve_influence
from kgtrace.attribution.conve_bands import band_values
from kgtrace.attribution.factors import Factors
from kgtrace.attribution.fast import fast_path
from kgtrace.attribution.grads import ScoreHRT, dense_factors, wrapped_gradients
from kgtrace.attribution.rows import row_factors, row_gradients, rows_to_factors
from kgtrace.compute.compile import CompiledCall

__all__ = ["ENTRY_POINTS", "CompiledGradients", "entry_points_for"]

#: Distinct heads, pairs or relations per compiled run of a band pass: a band has a row per distinct
#: head or relation of a chunk, often tens, which 512 would mostly pad. UMLS, one CPU thread, compiled
#: `last` for 100 test triples (warm): 0.48 s at 512, 0.24 s at 128, 0.22 s at 64 (eager 0.18 s).
BAND_BATCH = 128


def _general(wrapper: ScoreHRT, names: tuple[str, ...], triples: Tensor, valid: Tensor) -> Tensor:
    return wrapped_gradients(wrapper, triples, names)


def _rows(wrapper: ScoreHRT, names: tuple[str, ...], triples: Tensor, valid: Tensor) -> tuple[Tensor, ...]:
    return row_gradients(wrapper, triples, names)


def _band(model: nn.Module, ids: Tensor, valid: Tensor, key: str) -> tuple[Tensor, Tensor]:
    return band_values(model, key, ids)


def entry_points_for(model: nn.Module, path: str, names: Sequence[str]) -> list[str]:
    """The entry points TracIn's resolved ``path`` ("fast", "rows" or "general") compiles for this model and
    parameter set (the fast path's: `.fast.FastPath.entry_points`)."""
    if path == "general":
        return ["tracin_general"]
    fast = fast_path(model) if path == "fast" else None
    return ["tracin_rows"] if fast is None else fast.entry_points(model, names)


class CompiledGradients:
    """Compiled stand-ins for TracIn's gradient functions, each entry point compiled on first use.

    batch_size: triples per compiled run of the general and rows forms (TracIn's chunk size,
    which bounds their memory); ConvE's band passes run `BAND_BATCH` rows at a time.
    """

    def __init__(self, batch_size: int, device: torch.device):
        self.batch_size = batch_size
        self.device = torch.device(device)
        self._calls: dict[str, CompiledCall] = {}

    def wrap(self, function: Callable) -> Callable:
        """The compiled form of one of TracIn's functions (a factoriser, or ConvE's influence in bands)."""
        forms = {
            dense_factors: self.dense_factors,
            row_factors: self.row_factors,
            conve_factors: partial(conve_factors, band_fn=self.band_values),
            conve_influence: partial(conve_influence, band_fn=self.band_values),
        }
        if function not in forms:
            raise ValueError(f"no compiled form of {getattr(function, '__name__', function)!r}")
        return forms[function]

    @property
    def calls(self) -> list[CompiledCall]:
        """The entry points compiled so far."""
        return list(self._calls.values())

    def dense_factors(self, model: nn.Module, triples: Tensor, names: Sequence[str]) -> Factors:
        """As `dense_factors`, compiled."""
        (grads,) = self.call("tracin_general")(ScoreHRT(model), tuple(names), triples=triples)
        return Factors(len(triples), grads)

    def row_factors(self, model: nn.Module, triples: Tensor, names: Sequence[str]) -> Factors:
        """As `row_factors`, compiled."""
        grads = self.call("tracin_rows")(ScoreHRT(model), tuple(names), triples=triples)
        return rows_to_factors(model, triples, names, grads)

    def band_values(self, model: nn.Module, key: str, ids: Tensor) -> tuple[Tensor, Tensor]:
        """As `band_values`, compiled (one entry point per band)."""
        return self.call(f"tracin_conve_band_{key}")(model, ids=ids)

    def call(self, name: str) -> CompiledCall:
        """The compiled call of entry point ``name`` (see `ENTRY_POINTS`), built on first use."""
        if name not in self._calls:
            fn, key, width = ENTRY_POINTS[name]
            batch_size = min(self.batch_size, BAND_BATCH) if key == "ids" else self.batch_size
            example = {key: torch.zeros(1, width, dtype=torch.long, device=self.device)}
            self._calls[name] = CompiledCall(name, fn, batch_size, example)
        return self._calls[name]


#: name -> (compiled function, its input's name, the input's width). The functions take
#: (wrapper, names) or (model) before their input: see CompiledGradients' methods.
ENTRY_POINTS: dict[str, tuple[Callable, str, int]] = {
    "tracin_general": (_general, "triples", 3),
    "tracin_rows": (_rows, "triples", 3),
    "tracin_conve_band_head": (partial(_band, key="head"), "ids", 2),
    "tracin_conve_band_pair": (partial(_band, key="pair"), "ids", 2),
    "tracin_conve_band_relation": (partial(_band, key="relation"), "ids", 2),
}
