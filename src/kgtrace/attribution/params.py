"""Which parameters TracIn differentiates: named parameter sets of a model.

``select_parameters(model, spec)``:

* ``"last"``: the decoder side, the parameters closest to the score, as the model's
  `ModelSpec` declares them (``last_layer``):

  - ConvE: ``fc.weight``, ``fc.bias``, ``entity_bias`` (the fully connected layer that
    makes the query vector, and the per-entity score bias). Entity embeddings are *not*
    included: they are shared with the input side (the head's image).
  - DistMult / ComplEx (and any other model without a dedicated output layer):
    ``entity_embeddings`` (the tail side of the score; it is also the head side, as both
    models share one entity table). ``relation_embeddings`` is not "last".

* ``"all"``: every parameter with ``requires_grad``, in ``named_parameters`` order.
* a list (or tuple) of parameter names: exactly those, in the given order; an unknown
  name raises `kgtrace.core.errors.ConfigError` listing the valid names.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import spec_of

__all__ = ["last_layer", "select_parameters"]


def last_layer(model: nn.Module) -> tuple[str, ...]:
    """The parameters of ``params="last"``: the model spec's ``last_layer``; ("entity_embeddings",)
    for a model without a spec."""
    spec = spec_of(model)
    return ("entity_embeddings",) if spec is None else spec.last_layer


def select_parameters(model: nn.Module, spec: str | Sequence[str]) -> list[str]:
    """Names of the parameters ``spec`` selects ("last", "all" or a list of names); see the module doc."""
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    if isinstance(spec, str):
        if spec == "all":
            return trainable
        if spec == "last":
            names = list(last_layer(model))
            missing = [n for n in names if n not in trainable]
            if missing:
                raise ConfigError([f"params='last': {type(model).__qualname__} has no trainable parameter(s) "
                                   f"{missing}; fix: pass a list of names from {trainable}"])
            return names
        raise ConfigError([f"params={spec!r}: unknown parameter set; fix: use 'last', 'all' or a list of "
                           f"parameter names from {trainable}"])
    names = list(spec)
    problems = []
    if not names:
        problems.append(f"params=[]: no parameters selected; fix: name at least one of {trainable}")
    unknown = [n for n in names if n not in trainable]
    if unknown:
        problems.append(f"params: unknown parameter name(s) {unknown}; fix: use names from {trainable}")
    if len(set(names)) != len(names):
        problems.append(f"params={names}: a name is repeated; fix: name each parameter once")
    if problems:
        raise ConfigError(problems)
    return names
