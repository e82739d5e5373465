"""kgtrace weights as PyKEEN state dicts and back (PyKEEN 1.11), so both tools score with identical weights.

Layouts (see the model modules' docstrings):

* PyKEEN interleaves a relation and its inverse (rows 2r and 2r + 1) where kgtrace keeps two
  blocks (r and R + r). A model trained without inverse triples has R rows in both.
* PyKEEN stores a complex [N, D] table as real [N, 2D] with (real, imag) interleaved; kgtrace
  stores [real | imag]. RotatE's relations are unit complex numbers there, angles here.
* PyKEEN's ConvE entity bias is an [E, 1] embedding; its layers live in ``interaction.hr2d``
  / ``interaction.hr1d``, at indices that depend on whether batch normalisation is on.

Which PyKEEN class a kgtrace model maps to, and where each weight sits, is the model's
`ModelSpec` (``pykeen``, a `kgtrace.core.specs.PykeenLayout`, and ``inverse_relations``): every
function here reads it, so a model declares its mapping once, beside its class, and a subclass
maps as its model. Layouts of kind "tables" are read generically; ConvE's ("conve") has its own
functions below.

This module needs torch only; PyKEEN itself is imported by callers that build its models.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from kgtrace.core.errors import KgtraceError
from kgtrace.core.specs import PykeenLayout, model_names
from kgtrace.models import build_model, spec_named, spec_of

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
PYKEEN_NAMES = {name: spec_named(name).pykeen.name for name in model_names() if spec_named(name).pykeen}
#: Key prefixes some layout declares as telling its class apart (`recognise`).
MARKERS = tuple(dict.fromkeys(m for name in PYKEEN_NAMES for m in spec_named(name).pykeen.marker))
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


def layout_of(name: str) -> PykeenLayout:
    """The PyKEEN layout of registered model ``name`` (one that has one: `PYKEEN_NAMES`)."""
    return spec_named(name).pykeen


def has_inverse_relations(name: str, args: dict[str, object]) -> bool:
    """Whether kgtrace model ``name`` built with ``args`` has a relation table of 2R rows (its PyKEEN model is
    created with inverse triples): always where its spec says so (ConvE, TuckER), else with ``inverse_relations``."""
    return spec_named(name).inverse_relations or bool(args.get("inverse_relations", False))


def table_to_pykeen(table: Tensor, form: str) -> Tensor:
    """A kgtrace table [N, W] of ``form`` (`PykeenLayout`) as PyKEEN stores it."""
    if form == "complex":
        return complex_to_pykeen(table)
    if form == "phases":  # angles [N, D] -> exp(i theta) as (cos, sin) interleaved, [N, 2D]
        return complex_to_pykeen(torch.cat([torch.cos(table), torch.sin(table)], dim=1))
    return table.clone()


def table_from_pykeen(table: Tensor, form: str) -> Tensor:
    """A PyKEEN table as kgtrace's table of ``form``; unit complex numbers back to their angles."""
    if form == "complex":
        return complex_from_pykeen(table)
    if form == "phases":
        real, imag = complex_from_pykeen(table).chunk(2, dim=1)  # [N, D] each
        return torch.atan2(imag, real)
    return table


def inverse_permutation(order: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(range(len(order)), key=order.__getitem__))


def pykeen_state_dict(model: nn.Module, template: dict[str, Tensor]) -> dict[str, Tensor]:
    """``template`` (a PyKEEN model's state_dict) with kgtrace ``model``'s weights filled in, as its spec's
    `PykeenLayout` places them (PyKEEN created with inverse triples where the model has inverse relations).
    Entries kgtrace has no counterpart of (regularizer buffers) keep the template's values."""
    spec = spec_of(model)
    if spec is None or spec.pykeen is None:
        raise ValueError(f"no PyKEEN mapping for {type(model).__qualname__}; supported: "
                         f"{', '.join(PYKEEN_NAMES.values())} (and their subclasses)")
    if spec.pykeen.kind == "conve":
        return conve_state_dict(model, template)
    layout, state = spec.pykeen, dict(template)
    relations = getattr(model, layout.relation).detach()
    if spec.inverse_relations or getattr(model, "inverse_relations", False):
        relations = interleave_inverses(relations, model.num_relations)
    state[ENTITY] = table_to_pykeen(getattr(model, layout.entity).detach(), layout.entity_form)
    state[RELATION] = table_to_pykeen(relations, layout.relation_form)
    for ours, theirs, order in layout.parameters:
        value = getattr(model, ours).detach()
        state[theirs] = (value.permute(order) if order else value).contiguous().clone()
    for ours, theirs in layout.modules:
        state.update({f"{theirs}.{key}": value.clone() for key, value in getattr(model, ours).state_dict().items()})
    return state


def conve_state_dict(model: nn.Module, template: dict[str, Tensor]) -> dict[str, Tensor]:
    """`pykeen_state_dict` of a ConvE (PyKEEN created with inverse triples, batch normalisation on or off)."""
    state = dict(template)
    state[ENTITY] = model.entity_embeddings.detach().clone()
    state[ENTITY_BIAS] = model.entity_bias.detach().clone().unsqueeze(1)  # [E] -> [E, 1]
    state[RELATION] = interleave_inverses(model.relation_embeddings.detach(), model.num_relations)
    for ours, theirs in conve_layers(model.bn0 is not None).items():
        for key, value in getattr(model, ours).state_dict().items():
            state[f"{theirs}.{key}"] = value.clone()
    return state


def kgtrace_state_dict(name: str, state: dict[str, Tensor], inverse: bool = False) -> dict[str, Tensor]:
    """A PyKEEN state dict -> the state dict of kgtrace model ``name`` (shapes unchecked here); ``inverse``: its
    relation table holds inverse relations (interleaved, as PyKEEN keeps them)."""
    layout = layout_of(name)
    if layout.kind == "conve":
        return conve_kgtrace_state_dict(state)
    relations = block_inverses(state[RELATION]) if inverse else state[RELATION]
    out = {layout.entity: table_from_pykeen(state[ENTITY], layout.entity_form),
           layout.relation: table_from_pykeen(relations, layout.relation_form)}
    for ours, theirs, order in layout.parameters:
        out[ours] = state[theirs].permute(inverse_permutation(order)).contiguous() if order else state[theirs]
    for ours, theirs in layout.modules:
        prefix = theirs + "."
        out.update({ours + "." + key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)})
    return out


def conve_kgtrace_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
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
    """The keys a PyKEEN ``name`` model's state dict has, regularizer buffers aside (a layout's sub-modules: the
    keys of theirs that ``state`` has, batch norms being optional)."""
    layout = layout_of(name)
    if layout.kind == "conve":
        keys = {ENTITY, ENTITY_BIAS, RELATION}
        for ours, theirs in conve_layers(has_batch_norm(state)).items():
            params = ("weight", "bias") if ours in ("conv", "fc") else (
                "weight", "bias", "running_mean", "running_var", "num_batches_tracked")
            keys.update(f"{theirs}.{p}" for p in params)
        return keys
    modules = tuple(theirs + "." for _, theirs in layout.modules)
    return {ENTITY, RELATION, *(theirs for _, theirs, _ in layout.parameters),
            *(key for key in state if modules and key.startswith(modules))}


def fits(name: str, state: dict[str, Tensor]) -> bool:
    """Whether ``state``, read as a PyKEEN ``name``, gives the tensors' shapes of a kgtrace ``name`` of the sizes its
    shapes fix (built on the meta device: no memory)."""
    spec = spec_named(name)
    rows = state[RELATION].shape[0]
    try:
        ours = kgtrace_state_dict(name, state, inverse=False)
        with torch.device("meta"):
            model = build_model(name, state[ENTITY].shape[0], rows // 2 if spec.inverse_relations else rows,
                                **shape_args(name, state))
    except (KeyError, ValueError, RuntimeError, KgtraceError):
        return False
    shapes = {key: value.shape for key, value in model.state_dict().items()}
    return all(key in shapes and value.shape == shapes[key] for key, value in ours.items())


def plain_models() -> list[str]:
    """The models whose PyKEEN state dicts are an entity and a relation table alone (told apart, if at all, by
    their default regularizers)."""
    return [name for name in PYKEEN_NAMES if layout_of(name).kind == "tables" and not layout_of(name).parameters
            and not layout_of(name).modules]


def recognise(state: dict[str, Tensor]) -> str | None:
    """kgtrace's name for the PyKEEN model whose state dict this is, by the key prefixes its layout declares as
    its own (`PykeenLayout.marker`); None when no layout's marker matches (plain tables without regularizers:
    DistMult, ComplEx, TransE, RotatE and RESCAL store the same two tables).

    Raises:
        KgtraceError: the keys are not those of a model kgtrace maps.
    """
    keys = set(state)
    present = {m for m in MARKERS if any(k.startswith(m) for k in keys)}
    matches = [name for name in PYKEEN_NAMES if layout_of(name).marker and set(layout_of(name).marker) == present]
    if len(matches) > 1:  # the same regularizers (ComplEx's and RESCAL's): the one whose tables' shapes fit
        matches = [name for name in matches if fits(name, state)]
    name = matches[0] if len(matches) == 1 else None
    unknown = sorted(keys - (expected_keys(name, state) if name else {ENTITY, RELATION}) - regularizer_keys(state))
    if unknown or not {ENTITY, RELATION} <= keys:
        raise KgtraceError(
            f"the PyKEEN weights have entries kgtrace does not map ({', '.join(unknown[:6]) or 'no ' + ENTITY}): "
            f"not a PyKEEN {', '.join(PYKEEN_NAMES.values())}. Fix: import one of those models; kgtrace supports "
            "no other")
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
    """The hyperparameters that the weights' shapes fix (the layout's ``dims`` and ``flags``; ConvE's
    embedding_height aside: see `conve_heights`)."""
    layout = layout_of(name)
    if layout.kind == "conve":
        batch_norm = has_batch_norm(state)
        channels, _, kernel_height, kernel_width = state[conve_layers(batch_norm)["conv"] + ".weight"].shape
        return {"embedding_dim": state[ENTITY].shape[1], "output_channels": channels, "kernel_height": kernel_height,
                "kernel_width": kernel_width, "apply_batch_normalization": batch_norm}
    tables = {"entity": state[ENTITY], "relation": state[RELATION]}
    args: dict[str, object] = {arg: tables[table].shape[1] // per for arg, table, per in layout.dims}
    args.update({arg: any(key.startswith(prefix) for key in state) for arg, prefix in layout.flags})
    return args


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
    layout = layout_of(name)
    if layout.kind == "conve":  # PyKEEN derives input_channels=1 and embedding_width=D/H (it refuses all three given)
        return {k: args[k] for k in ("embedding_dim", "embedding_height", "output_channels", "kernel_height",
                                     "kernel_width", "input_dropout", "feature_map_dropout", "output_dropout",
                                     "apply_batch_normalization")}
    return {theirs: args[ours] for ours, theirs in layout.kwargs}


def implied_problems(name: str, args: dict[str, object]) -> list[str]:
    """kgtrace settings that PyKEEN's model of ``name`` cannot express (`PykeenLayout.implied`), each with its fix."""
    layout = layout_of(name)
    return [f"{key}={args.get(key)!r}: PyKEEN's {layout.name} scores as {key}={value!r}; fix: export a run trained "
            f"with --model-arg {key}={value}" for key, value in layout.implied if args.get(key) != value]


def recorded_args(name: str, kwargs: dict[str, object]) -> dict[str, object]:
    """kgtrace arguments from PyKEEN model keyword arguments (an export's config.json) that the weights' shapes do
    not show."""
    layout = layout_of(name)
    if layout.kind == "conve":
        return {k: kwargs[k] for k in ("embedding_height", *PYKEEN_CONVE_DROPOUTS) if k in kwargs}
    fixed = {arg for arg, _, _ in layout.dims} | {arg for arg, _ in layout.flags}
    return {ours: kwargs[theirs] for ours, theirs in layout.kwargs if theirs in kwargs and ours not in fixed}
