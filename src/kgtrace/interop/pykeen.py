"""kgtrace weights as PyKEEN state dicts and back (PyKEEN 1.11), so both tools score with identical weights.

Layouts (see the model modules' docstrings):

* PyKEEN interleaves a relation and its inverse (rows 2r and 2r + 1) where kgtrace's ConvE
  keeps two blocks (r and R + r). PyKEEN's DistMult and ComplEx, trained without inverse
  triples, have R rows like kgtrace's.
* PyKEEN's ConvE entity bias is an [E, 1] embedding; its layers live in ``interaction.hr2d``
  / ``interaction.hr1d``, at indices that depend on whether batch normalisation is on.
* PyKEEN's ComplEx stores a complex [N, D] table as real [N, 2D] with (real, imag)
  interleaved; kgtrace stores [real | imag].

Which PyKEEN class a kgtrace model maps to, and whether it has inverse relations, is the
model's `ModelSpec` (``pykeen``, ``inverse_relations``); the layouts
below are keyed by the spec's name, so a subclass of a model maps as that model.

This module needs torch only; PyKEEN itself is imported by callers that build its models.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from kgtrace.core.errors import KgtraceError
from kgtrace.core.specs import model_names
from kgtrace.models import spec_named, spec_of

ENTITY = "entity_representations.0._embeddings.weight"
ENTITY_BIAS = "entity_representations.1._embeddings.weight"
RELATION = "relation_representations.0._embeddings.weight"
ENTITY_REGULARIZER = "entity_representations.0.regularizer."
RELATION_REGULARIZER = "relation_representations.0.regularizer."

# kgtrace ConvE module -> PyKEEN ConvEInteraction sub-module (with batch normalisation).
CONVE_LAYERS = {"bn0": "interaction.hr2d.0", "conv": "interaction.hr2d.2", "bn1": "interaction.hr2d.3",
                "fc": "interaction.hr1d.0", "bn2": "interaction.hr1d.2"}
# Without batch normalisation PyKEEN's Sequentials hold only dropout, conv, relu / fc, dropout, relu.
CONVE_LAYERS_NO_BN = {"conv": "interaction.hr2d.1", "fc": "interaction.hr1d.0"}
#: kgtrace model name -> PyKEEN model class name, for the registered models that have one.
PYKEEN_NAMES = {name: spec_named(name).pykeen for name in model_names() if spec_named(name).pykeen}
#: PyKEEN ConvE's defaults for what its state dict does not record (they act in training only).
PYKEEN_CONVE_DROPOUTS = {"input_dropout": 0.2, "feature_map_dropout": 0.2, "output_dropout": 0.3}


def conve_layers(batch_norm: bool) -> dict[str, str]:
    return CONVE_LAYERS if batch_norm else CONVE_LAYERS_NO_BN


# ----------------------------------------------------------------------------- layouts


def interleave_inverses(relations: Tensor, num_relations: int) -> Tensor:
    """[2R, D] in kgtrace's block order -> PyKEEN's interleaved order."""
    out = torch.empty_like(relations)
    out[0::2], out[1::2] = relations[:num_relations], relations[num_relations:]
    return out


def block_inverses(relations: Tensor) -> Tensor:
    """[2R, D] in PyKEEN's interleaved order -> kgtrace's blocks (relations, then inverses)."""
    return torch.cat([relations[0::2], relations[1::2]])


def complex_to_pykeen(table: Tensor) -> Tensor:
    """[N, 2D] as [real | imag] -> [N, 2D] with (real, imag) interleaved (view_as_real of [N, D])."""
    rows, width = table.shape
    return table.view(rows, 2, width // 2).transpose(1, 2).reshape(rows, width)  # [N, 2, D] -> [N, D, 2] -> [N, 2D]


def complex_from_pykeen(table: Tensor) -> Tensor:
    """[N, 2D] with (real, imag) interleaved -> [N, 2D] as [real | imag]."""
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)


def has_inverse_relations(name: str, args: dict[str, object]) -> bool:
    """Whether kgtrace model ``name`` built with ``args`` has a relation table of 2R rows (its PyKEEN model is
    created with inverse triples): ConvE always, DistMult and ComplEx with ``inverse_relations``."""
    return spec_named(name).inverse_relations or bool(args.get("inverse_relations", False))


def pykeen_state_dict(model: nn.Module, template: dict[str, Tensor]) -> dict[str, Tensor]:
    """``template`` (a PyKEEN model's state_dict) with kgtrace ``model``'s weights filled in.

    Supports ConvE (PyKEEN created with inverse triples, batch normalisation on or off),
    DistMult and ComplEx (PyKEEN created with inverse triples when the model has
    ``inverse_relations``, else without). Entries kgtrace has no counterpart of (regularizer
    buffers) keep the template's values.
    """
    state = dict(template)
    spec = spec_of(model)
    name = spec.name if spec is not None and spec.name in PYKEEN_NAMES else None
    if name is None:
        raise ValueError(f"no PyKEEN mapping for {type(model).__qualname__}; supported: "
                         f"{', '.join(PYKEEN_NAMES.values())} (and their subclasses)")
    entities, relations = model.entity_embeddings.detach(), model.relation_embeddings.detach()
    if name != "conve" and model.inverse_relations:
        relations = interleave_inverses(relations, model.num_relations)
    if name == "distmult":
        state[ENTITY], state[RELATION] = entities.clone(), relations.clone()
        return state
    if name == "complex":
        state[ENTITY], state[RELATION] = complex_to_pykeen(entities), complex_to_pykeen(relations)
        return state
    state[ENTITY] = entities.clone()
    state[ENTITY_BIAS] = model.entity_bias.detach().clone().unsqueeze(1)  # [E] -> [E, 1]
    state[RELATION] = interleave_inverses(relations, model.num_relations)
    for ours, theirs in conve_layers(model.bn0 is not None).items():
        for key, value in getattr(model, ours).state_dict().items():
            state[f"{theirs}.{key}"] = value.clone()
    return state


def kgtrace_state_dict(name: str, state: dict[str, Tensor], inverse: bool = False) -> dict[str, Tensor]:
    """A PyKEEN state dict -> the state dict of kgtrace model ``name`` (shapes unchecked here); ``inverse``:
    a DistMult's or ComplEx's relation table holds inverse relations (interleaved, as PyKEEN keeps them)."""
    if name in ("distmult", "complex"):
        relations = block_inverses(state[RELATION]) if inverse else state[RELATION]
        if name == "distmult":
            return {"entity_embeddings": state[ENTITY], "relation_embeddings": relations}
        return {"entity_embeddings": complex_from_pykeen(state[ENTITY]),
                "relation_embeddings": complex_from_pykeen(relations)}
    out = {"entity_embeddings": state[ENTITY], "entity_bias": state[ENTITY_BIAS].squeeze(1),  # [E, 1] -> [E]
           "relation_embeddings": block_inverses(state[RELATION])}
    for ours, theirs in conve_layers(has_batch_norm(state)).items():
        prefix = theirs + "."
        out.update({ours + "." + key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)})
    return out


# ----------------------------------------------------------------------------- recognising a state dict


def has_batch_norm(state: dict[str, Tensor]) -> bool:
    return "interaction.hr2d.0.running_mean" in state


def expected_keys(name: str, state: dict[str, Tensor]) -> set[str]:
    """The keys a PyKEEN ``name`` model's state dict has, regularizer buffers aside."""
    if name in ("distmult", "complex"):
        return {ENTITY, RELATION}
    keys = {ENTITY, ENTITY_BIAS, RELATION}
    for ours, theirs in conve_layers(has_batch_norm(state)).items():
        params = ("weight", "bias") if ours in ("conv", "fc") else (
            "weight", "bias", "running_mean", "running_var", "num_batches_tracked")
        keys.update(f"{theirs}.{p}" for p in params)
    return keys


def recognise(state: dict[str, Tensor]) -> str | None:
    """kgtrace's name for the PyKEEN model whose state dict this is; None when DistMult and
    ComplEx cannot be told apart (both store two plain tables, and only their default
    regularizers differ: ComplEx regularizes entities, DistMult relations only).

    Raises:
        KgtraceError: the keys are not those of ConvE, DistMult or ComplEx.
    """
    keys = set(state)
    if any(k.startswith("interaction.") for k in keys):
        name: str | None = "conve"
    elif any(k.startswith(ENTITY_REGULARIZER) for k in keys):
        name = "complex"
    elif any(k.startswith(RELATION_REGULARIZER) for k in keys):
        name = "distmult"
    else:
        name = None
    unknown = sorted(keys - expected_keys(name or "distmult", state) - regularizer_keys(state))
    if unknown or not {ENTITY, RELATION} <= keys:
        raise KgtraceError(
            f"the PyKEEN weights have entries kgtrace does not map ({', '.join(unknown[:6]) or 'no ' + ENTITY}): "
            "not a PyKEEN ConvE, DistMult or ComplEx. Fix: import one of those models; kgtrace supports no other")
    return name


def regularizer_keys(state: dict[str, Tensor]) -> set[str]:
    return {k for k in state if k.startswith((ENTITY_REGULARIZER, RELATION_REGULARIZER))}


def check_keys(name: str, state: dict[str, Tensor]) -> list[str]:
    """Problems with ``state`` as the state dict of PyKEEN model ``name`` (missing or foreign keys)."""
    missing = sorted(expected_keys(name, state) - set(state))
    foreign = sorted(set(state) - expected_keys(name, state) - regularizer_keys(state))
    problems = []
    if missing:
        problems.append(f"it lacks {', '.join(missing[:6])}, which a PyKEEN {PYKEEN_NAMES[name]} has")
    if foreign:
        problems.append(f"it has {', '.join(foreign[:6])}, which a PyKEEN {PYKEEN_NAMES[name]} has not")
    return problems


# ----------------------------------------------------------------------------- hyperparameters from shapes


def shape_args(name: str, state: dict[str, Tensor]) -> dict[str, object]:
    """The hyperparameters that the weights' shapes fix (ConvE's embedding_height aside: see
    `conve_heights`)."""
    dim = state[ENTITY].shape[1]
    if name == "complex":
        return {"embedding_dim": dim // 2}
    if name == "distmult":
        return {"embedding_dim": dim}
    batch_norm = has_batch_norm(state)
    channels, _, kernel_height, kernel_width = state[conve_layers(batch_norm)["conv"] + ".weight"].shape
    return {"embedding_dim": dim, "output_channels": channels, "kernel_height": kernel_height,
            "kernel_width": kernel_width, "apply_batch_normalization": batch_norm}


def conve_input_channels(state: dict[str, Tensor]) -> int:
    return state[conve_layers(has_batch_norm(state))["conv"] + ".weight"].shape[1]


def conve_heights(state: dict[str, Tensor]) -> list[int]:
    """Every image height H that fits ConvE's fc layer: C * (2H - kh + 1) * (D/H - kw + 1) inputs.

    H and D / (2H) give the same count when kh == kw, so more than one may fit (e.g. 4 and 8
    for D = 64); the weights cannot tell those apart.
    """
    args = shape_args("conve", state)
    dim, channels = args["embedding_dim"], args["output_channels"]
    kh, kw = args["kernel_height"], args["kernel_width"]
    features = state[conve_layers(has_batch_norm(state))["fc"] + ".weight"].shape[1]
    return [h for h in range(1, dim + 1) if dim % h == 0 and 2 * h >= kh and dim // h >= kw
            and channels * (2 * h - kh + 1) * (dim // h - kw + 1) == features]


def pykeen_default_height(dim: int) -> int:
    """PyKEEN's embedding_height when none is given: the largest divisor of D up to sqrt(D)."""
    return max(f for f in range(1, math.isqrt(dim) + 1) if dim % f == 0)


def pykeen_model_kwargs(name: str, args: dict[str, object]) -> dict[str, object]:
    """kgtrace hyperparameters -> PyKEEN model keyword arguments of the same model."""
    if name != "conve":
        return {"embedding_dim": args["embedding_dim"]}
    kwargs = {k: args[k] for k in ("embedding_dim", "embedding_height", "output_channels", "kernel_height",
                                   "kernel_width", "input_dropout", "feature_map_dropout", "output_dropout",
                                   "apply_batch_normalization")}
    return kwargs  # PyKEEN derives input_channels=1 and embedding_width=D/H from these (it refuses all three given)
