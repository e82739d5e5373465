"""TracIn's paths to per-triple gradients: which ones a model may take, and their chunk sizes.

Paths, each giving per-triple gradients as `Factors`:

* "fast": exact factored gradients of the kind the model's spec names (`.fast`): ConvE's
  closed form (`.conve`), the embedding-row form for DistMult and ComplEx (`.rows`);
* "rows": the embedding-row form for any model whose spec declares embedding tables
  (`row_tables`), other parameters materialised per sample;
* "general": every selected parameter materialised per sample (torch.func), any scorer;
* "reference": per-triple autograd in float64, slow, for checking (`.reference`);
* "auto": fast when the model has a factoriser, else general.
"""

from __future__ import annotations

import torch
from torch import nn

from kgtrace.attribution.fast import fast_path
from kgtrace.attribution.rows import row_tables
from kgtrace.compute.precision import precision_problems
from kgtrace.core.specs import model_names, spec_named, spec_of

__all__ = ["FAST_CHUNKS", "PATHS", "default_chunk_size", "path_problems"]

PATHS = ("auto", "reference", "general", "rows", "fast")

#: The fast path's training triples per chunk by device type: on a CPU, chunks that stay in cache; on a GPU,
#: chunks large enough that the kernels' work, not their launches, sets the pace (at 4096 an H200's pass over
#: 10M triples took 40 s for 1.5 s of arithmetic).
FAST_CHUNKS = {"cpu": 4096, "cuda": 65536}


def path_problems(model: nn.Module, path: str, precision: str, chunk_size: int | None,
                  device: torch.device) -> list[str]:
    """What is wrong with asking ``model`` for ``path`` at ``precision`` on ``device`` in chunks of ``chunk_size``."""
    kind = type(model).__qualname__
    problems = []
    if path not in PATHS:
        problems.append(f"path={path!r}: unknown; fix: use one of {list(PATHS)}")
    elif path == "fast" and fast_path(model) is None:
        have = [name for name in model_names() if fast_path(spec_named(name).model_class) is not None]
        problems.append(f"path='fast': no factored gradients for {kind} (have them for models {have}); "
                        "fix: use path='general'")
    elif path == "rows" and not row_tables(model):
        problems.append(f"path='rows': {kind} declares no embedding tables; fix: use path='general'")
    problems += precision_problems(precision, device)
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        problems.append(f"chunk_size={chunk_size!r}: must be a positive integer")
    return problems


def default_chunk_size(model: nn.Module, names: list[str], path: str, device: torch.device) -> int:
    """Training triples per chunk when none is given (TracIn's ``chunk_size``): `FAST_CHUNKS` for factored
    gradients; where each triple's gradient holds the selected parameters outside the embedding tables densely
    (the rows and general paths, and the fast path of a model whose factoriser is the row form, such as TuckER's
    core tensor), as many as keep those gradients near 1 GB."""
    fast = FAST_CHUNKS.get(device.type, FAST_CHUNKS["cpu"])
    spec = spec_of(model)
    row_form = path == "rows" or (path == "fast" and spec is not None and spec.factoriser == "rows")
    if path == "fast" and not row_form:
        return fast
    params = dict(model.named_parameters())
    tables = row_tables(model) if row_form else {}
    dense = sum(params[n].numel() for n in names if n not in tables)
    if path == "fast" and dense == 0:
        return fast
    return max(1, min(4096, int(1e9 // (max(dense, 1) * 4 * 35))))
