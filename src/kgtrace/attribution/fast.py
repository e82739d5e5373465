"""TracIn's fast path per factoriser kind: the implementations behind `ModelSpec.factoriser`.

A model's `ModelSpec` names the kind of its exact factored gradients
("conve", "rows"); `FAST_PATHS` maps each kind to its functions, and `fast_path`
finds a model's (subclasses included, through `spec_of`). A model
whose spec names no kind, or that has no spec, has no fast path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from kgtrace.attribution.conve import band_plan, conve_factors, conve_influence, needs_upstream
from kgtrace.attribution.conve_bands import bands
from kgtrace.attribution.factors import Factors
from kgtrace.attribution.rows import row_factors
from kgtrace.core.specs import spec_of

__all__ = ["FAST_PATHS", "FastPath", "fast_path"]

Factoriser = Callable[[nn.Module, Tensor, Sequence[str]], Factors]


@dataclass(frozen=True)
class FastPath:
    """The fast path of one factoriser kind."""

    #: Exact factored per-triple gradients: (model, triples [n, 3], parameter names) -> Factors.
    factors: Factoriser
    #: The compiled entry points (`ENTRY_POINTS`) it runs: (model, names) -> names.
    entry_points: Callable[[nn.Module, Sequence[str]], list[str]]
    #: Influence on test triples with some terms in forward mode: (the plan for a chunk, or None for the factors
    #: alone; the influence given that plan and a memo kept per checkpoint over a pass); None: never.
    forward: tuple[Callable[..., object], Callable[..., Tensor]] | None = None
    #: Whether it allocates same-sized blocks per sub-chunk or test triple for these parameter names.
    reuses_blocks: Callable[[Sequence[str]], bool] | None = None


def _conve_entry_points(model: nn.Module, names: Sequence[str]) -> list[str]:
    return [f"tracin_conve_band_{key}" for key, _ in bands(model)]


def _rows_entry_points(model: nn.Module, names: Sequence[str]) -> list[str]:
    return ["tracin_rows"]


#: Factoriser kind (ModelSpec.factoriser) -> its fast path.
FAST_PATHS: dict[str, FastPath] = {
    "conve": FastPath(conve_factors, _conve_entry_points, (band_plan, conve_influence), needs_upstream),
    "rows": FastPath(row_factors, _rows_entry_points),
}


def fast_path(model: nn.Module) -> FastPath | None:
    """The model's fast path (from its spec's factoriser kind); None when it has none (or a kind not here)."""
    spec = spec_of(model)
    return None if spec is None or spec.factoriser is None else FAST_PATHS.get(spec.factoriser)
