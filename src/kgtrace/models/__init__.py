"""Knowledge-graph scoring models and their registry.

Every model implements `FactorisedScorer` and declares its traits
once, as the ``SPEC`` (a `kgtrace.core.specs.ModelSpec`) of its module; importing this
package registers them, in the order below. Read a model's traits with
`kgtrace.core.specs.spec_of` (subclasses included).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import MODEL_CLASSES, ModelSpec, model_named, register, spec_named, spec_of
from kgtrace.models.base import FactorisedScorer, Scorer, inverse_queries
from kgtrace.models.complex import SPEC as COMPLEX_SPEC
from kgtrace.models.complex import ComplEx
from kgtrace.models.conve import SPEC as CONVE_SPEC
from kgtrace.models.conve import ConvE
from kgtrace.models.distmult import SPEC as DISTMULT_SPEC
from kgtrace.models.distmult import DistMult
from kgtrace.models.rescal import SPEC as RESCAL_SPEC
from kgtrace.models.rescal import Rescal
from kgtrace.models.rotate import SPEC as ROTATE_SPEC
from kgtrace.models.rotate import RotatE
from kgtrace.models.transe import SPEC as TRANSE_SPEC
from kgtrace.models.transe import TransE
from kgtrace.models.tucker import SPEC as TUCKER_SPEC
from kgtrace.models.tucker import TuckER

__all__ = [
    "MODELS",
    "ComplEx",
    "ConvE",
    "DistMult",
    "FactorisedScorer",
    "ModelSpec",
    "Rescal",
    "RotatE",
    "Scorer",
    "TransE",
    "TuckER",
    "build_model",
    "hyperparameter_names",
    "inverse_queries",
    "spec_named",
    "spec_of",
]

# The order in which names are listed.
for _spec in (CONVE_SPEC, DISTMULT_SPEC, COMPLEX_SPEC, TRANSE_SPEC, ROTATE_SPEC, TUCKER_SPEC, RESCAL_SPEC):
    register(_spec)

#: Model name -> model class (a read-only view of the registry).
MODELS = MODEL_CLASSES


def hyperparameter_names(model_class: type[nn.Module]) -> list[str]:
    """The keyword-only constructor arguments of a model class, in signature order."""
    parameters = inspect.signature(model_class).parameters.values()
    return [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]


def build_model(name: str, num_entities: int, num_relations: int, **kwargs: object) -> nn.Module:
    """Build the registered model ``name`` with hyperparameters ``kwargs``.

    Args:
        name: a registered model in kgtrace's or PyKEEN's spelling (``"conve"``, ``"ConvE"``; `MODELS`).
        num_entities: the entities scored (``dataset.num_entities``).
        num_relations: the relations, likewise.
        **kwargs: the model's hyperparameters (``embedding_dim=200``, ...); docs/training.md lists each
            model's.

    Returns:
        The model, scoring triples through `score_hrt` and all tails at once through `score_t`.

    Raises:
        ConfigError: listing every problem at once: an unknown model name, unknown
            hyperparameter keys (with the valid keys) and invalid values.
    """
    spec = spec_named(name) or spec_named(model_named(name) or "")  # PyKEEN's spelling ("ConvE") too
    if spec is None:
        raise ConfigError([f"model={name!r}: unknown model; fix: use one of {', '.join(sorted(MODELS))}"])
    model_class = spec.model_class
    valid = hyperparameter_names(model_class)
    problems = [
        f"{key}={value!r}: not a hyperparameter of model {name!r}; fix: remove it or use one of {', '.join(valid)}"
        for key, value in kwargs.items()
        if key not in valid
    ]
    known = {key: value for key, value in kwargs.items() if key in valid}
    if not problems:
        return model_class(num_entities, num_relations, **known)
    try:
        # Only to collect the known keys' value problems as well: on the meta device
        # the parameters take no memory, however large the model.
        with torch.device("meta"):
            model_class(num_entities, num_relations, **known)
    except ConfigError as error:
        problems.extend(error.problems)
    raise ConfigError(problems)
