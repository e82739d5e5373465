"""The model registry: one `ModelSpec` per model, declared beside the model class.

Each model module (`kgtrace.models`) registers its spec right after its class; every
consumer reads a model's traits here, through `spec_of` (a model or model class,
subclasses included: the nearest registered class on its MRO) or `spec_named` (a
config name). Nothing dispatches on class-name strings, so a subclass or a wrapper class
derived from a registered model keeps that model's fast paths.

The specs hold data only. Where a trait's implementation lives in a later layer (TracIn's
factorisers in `kgtrace.attribution`, PyKEEN's layouts in `kgtrace.interop`), the
spec names its kind and that layer maps kinds to functions.

This module is core (no torch, no other kgtrace import): the config validates model names
against it (`model_names`), and the models package, which comes later in the import
order, fills it when imported (``import kgtrace`` imports every model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["DEFAULT_TRAK_RIDGE", "MODEL_CLASSES", "ModelSpec", "PykeenLayout", "model_names", "register", "spec_named",
           "spec_of"]

#: TRAK's ridge, as a fraction of the mean of its kernel's nonzero eigenvalues, for a model that sets none.
DEFAULT_TRAK_RIDGE = 0.3


@dataclass(frozen=True)
class PykeenLayout:
    """How a model's weights sit in the state dict of PyKEEN's model of the same scoring function (PyKEEN 1.11).

    Data only: `kgtrace.interop.pykeen` reads it. Kind "tables" (every model but ConvE) is read generically: an
    entity and a relation table (PyKEEN's ``entity_representations.0`` and ``relation_representations.0``, the
    relation table's inverse rows interleaved where kgtrace keeps them in a block after the relations), other
    parameters and sub-modules by name. Kind "conve" is ConvE's own mapping (its layers' places depend on batch
    normalisation, and its image height is not in the weights).
    """

    #: PyKEEN's model class name ("TransE").
    name: str
    #: "tables" (generic) or "conve".
    kind: str = "tables"
    #: kgtrace's entity and relation tables (parameter names).
    entity: str = "entity_embeddings"
    relation: str = "relation_embeddings"
    #: How a row of each table is stored: "real" (as is), "complex" (kgtrace [real | imag], PyKEEN (real, imag)
    #: interleaved), "phases" (kgtrace angles theta, PyKEEN the unit complex numbers exp(i theta), interleaved).
    entity_form: str = "real"
    relation_form: str = "real"
    #: Other parameters: (kgtrace name, PyKEEN key, the permutation of kgtrace's axes into PyKEEN's, () for none).
    parameters: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    #: Sub-modules whose state dicts map whole (batch norms): (kgtrace attribute, PyKEEN key prefix); a kgtrace
    #: module that holds no state (an ``nn.Identity`` when switched off) maps to no key.
    modules: tuple[tuple[str, str], ...] = ()
    #: Hyperparameters the weights' shapes fix: (kgtrace argument, "entity" or "relation" table, columns per unit).
    dims: tuple[tuple[str, str, int], ...] = (("embedding_dim", "entity", 1),)
    #: Boolean hyperparameters the weights show: (kgtrace argument, a PyKEEN key prefix present exactly when true).
    flags: tuple[tuple[str, str], ...] = ()
    #: kgtrace argument -> PyKEEN model keyword argument of the same setting.
    kwargs: tuple[tuple[str, str], ...] = (("embedding_dim", "embedding_dim"),)
    #: kgtrace arguments PyKEEN's model implies (its scoring choices): set on import, required on export.
    implied: tuple[tuple[str, object], ...] = ()
    #: kgtrace argument -> the attribute path on a PyKEEN model object that holds it (a pickled model).
    attributes: tuple[tuple[str, str], ...] = ()
    #: Key prefixes that tell this class's state dict apart (regularizers, interaction parameters); () when its
    #: keys are another class's too (then an import names the model).
    marker: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("parameters", "modules", "dims", "flags", "kwargs", "implied", "attributes", "marker"):
            object.__setattr__(self, name, tuple(tuple(x) if isinstance(x, list) else x for x in getattr(self, name)))


@dataclass(frozen=True)
class ModelSpec:
    """What the rest of kgtrace needs to know about one model class."""

    #: The model's name in configs and on the command line ("conve").
    name: str
    #: The model class (an ``nn.Module`` implementing ``FactorisedScorer``).
    model_class: type
    #: TracIn's ``params="last"``: the parameters closest to the score.
    last_layer: tuple[str, ...]
    #: Embedding tables read by a triple's ids: (parameter name, id space "entity" or "relation") pairs,
    #: given as a mapping or pairs. Their per-triple gradients are sparse rows (TracIn's rows and fast paths).
    row_tables: tuple[tuple[str, str], ...] = ()
    #: Kind of TracIn's exact factored gradients (the fast path): "conve" (closed form) or "rows"
    #: (the embedding-row form); None: no fast path.
    factoriser: str | None = None
    #: The relation table holds 2R rows, the inverse relations after the relations (PyKEEN's
    #: model of the same scoring function is created with inverse triples).
    inverse_relations: bool = False
    #: PyKEEN's model of the same scoring function and where its weights sit (they map one to one); None: none.
    pykeen: PykeenLayout | None = None
    #: Scores of every entity are one matrix product of the encoded query with the entity table; False for a
    #: distance model (TransE, RotatE), whose every score is elementwise work on a difference (negative sampling
    #: then scores only the drawn candidates: `kgtrace.training.loss.gathers_rows`).
    decodes_by_product: bool = True
    #: TRAK's default ridge, a fraction of the mean of its kernel's nonzero eigenvalues: the ridge with the
    #: best linear datamodeling score for this model on the bundled graphs (docs/benchmarks.md's sweep).
    trak_ridge: float = DEFAULT_TRAK_RIDGE

    def __post_init__(self):  # immutable (and plain tuples, which torch.compile reads as constants)
        object.__setattr__(self, "row_tables", tuple(dict(self.row_tables).items()))
        object.__setattr__(self, "last_layer", tuple(self.last_layer))


_SPECS: dict[str, ModelSpec] = {}
_CLASSES: dict[str, type] = {}
_BY_CLASS: dict[type, ModelSpec] = {}  # model class -> its spec (`spec_of`, called on every training step)
#: Model name -> model class, live (read-only) view of the registry.
MODEL_CLASSES: Mapping[str, type] = MappingProxyType(_CLASSES)


def register(spec: ModelSpec) -> ModelSpec:
    """Add ``spec`` to the registry (a name or class registered twice is an error); returns it."""
    taken = _SPECS.get(spec.name)
    if taken is not None or spec.model_class in _BY_CLASS:
        raise ValueError(f"model {spec.name!r} ({spec.model_class.__qualname__}) is registered already")
    _SPECS[spec.name] = spec
    _CLASSES[spec.name] = spec.model_class
    _BY_CLASS[spec.model_class] = spec
    return spec


def model_names() -> tuple[str, ...]:
    """The registered models' names, in registration order."""
    return tuple(_SPECS)


def spelling_key(text: str) -> str:
    """A name as it is compared across spellings: lower case, letters and digits only ("FB15k-237" -> "fb15k237")."""
    return "".join(c for c in str(text).casefold() if c.isalnum())


def model_named(text: str) -> str | None:
    """The registered model ``text`` names in any case, dashes and underscores aside (PyKEEN's "ConvE",
    "DistMult", "ComplEx"); None when it names none."""
    return next((name for name in _SPECS if spelling_key(name) == spelling_key(text)), None)


def spec_named(name: str) -> ModelSpec | None:
    """The spec registered as ``name``; None when there is none."""
    return _SPECS.get(name) if isinstance(name, str) else None


def spec_of(model: object) -> ModelSpec | None:
    """The spec of a model instance or class: that of the nearest registered class on its MRO
    (so a subclass of a registered model has its parent's traits); None when there is none."""
    cls = model if isinstance(model, type) else type(model)
    return next((_BY_CLASS[c] for c in cls.__mro__ if c in _BY_CLASS), None)
