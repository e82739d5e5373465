"""The model registry: one ModelSpec per model, found for subclasses too, so they keep every fast path."""

import dataclasses

import pytest
import torch
from torch import nn

from kgtrace.attribution import TracIn, select_parameters
from kgtrace.attribution import checkpoints as checkpoints_module
from kgtrace.attribution.compiled import entry_points_for
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import ModelSpec, model_names, register, spec_named, spec_of
from kgtrace.interop import pykeen as layout
from kgtrace.models import MODELS, ComplEx, ConvE, DistMult, Rescal, RotatE, TransE, TuckER, build_model
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import train

CONVE_ARGS = {"embedding_dim": 16, "embedding_height": 4, "output_channels": 4}


class MyConvE(ConvE):
    pass


class MyDistMult(DistMult):
    pass


def as_class(model: nn.Module, cls: type) -> nn.Module:
    model.__class__ = cls
    return model


@pytest.fixture(scope="module")
def conve_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("conve")
    config = TrainConfig(dataset="umls", model="conve", model_args=CONVE_ARGS, epochs=2, checkpoint_every=1,
                         eval_every=0, threads=1, device="cpu", seed=5, lr=0.01, batch_size=256)
    train(config, out, progress=False, log=lambda *_: None)
    return load_run(out)


def test_one_spec_per_model_and_names_derived_from_it():
    assert model_names() == ("conve", "distmult", "complex", "transe", "rotate", "tucker", "rescal")
    assert dict(MODELS) == {"conve": ConvE, "distmult": DistMult, "complex": ComplEx, "transe": TransE,
                            "rotate": RotatE, "tucker": TuckER, "rescal": Rescal}
    assert layout.PYKEEN_NAMES == {"conve": "ConvE", "distmult": "DistMult", "complex": "ComplEx", "transe": "TransE",
                                   "rotate": "RotatE", "tucker": "TuckER", "rescal": "RESCAL"}
    for name in model_names():
        assert spec_named(name).model_class is MODELS[name] and spec_of(MODELS[name]).name == name
    with pytest.raises(ConfigError, match="model='hole': must be one of conve, distmult, complex, transe, rotate, "
                                          "tucker, rescal"):
        TrainConfig(model="hole").validate()
    with pytest.raises(ValueError, match="registered already"):
        register(dataclasses.replace(spec_named("conve"), name="conve2"))


def test_subclasses_have_their_parents_spec():
    assert dict(spec_named("distmult").row_tables) == {"entity_embeddings": "entity", "relation_embeddings": "relation"}
    assert spec_of(MyConvE) is spec_named("conve") and spec_of(MyDistMult(3, 2, embedding_dim=4)).name == "distmult"
    assert spec_of(nn.Linear(2, 2)) is None and spec_of(nn.Linear) is None
    own = ModelSpec("mine", MyConvE, last_layer=("fc.weight",))
    assert own.row_tables == () and own.factoriser is None  # data only; registering would make it MyConvE's


def test_conve_subclass_takes_the_fast_paths(conve_run, monkeypatch):
    """A ConvE subclass, checkpoints included, gets ConvE's last layer, fast path, forward mode and compiled entry points."""
    run = dataclasses.replace(conve_run, model=as_class(conve_run.model, MyConvE))
    built = checkpoints_module.model_from_checkpoint
    monkeypatch.setattr(checkpoints_module, "model_from_checkpoint", lambda *a, **k: as_class(built(*a, **k), MyConvE))
    assert select_parameters(run.model, "last") == ["fc.weight", "fc.bias", "entity_bias"]
    test, rows = run.dataset.test[:2], torch.arange(0, 5216, 50)
    for params in ("last", "all"):
        fast = TracIn(run, params=params, train_indices=rows)
        assert fast.path == "fast" and all(type(m) is MyConvE for m in fast._checkpoint_models())
        reference = TracIn(run, params=params, train_indices=rows, path="reference").influence(test)
        torch.testing.assert_close(fast.influence(test), reference, rtol=1e-4, atol=1e-4 * reference.abs().max().item())
        conve = build_model("conve", run.dataset.num_entities, run.dataset.num_relations, **CONVE_ARGS)
        assert entry_points_for(run.model, "fast", fast.names) == entry_points_for(conve, "fast", fast.names)
    assert "tracin_conve_band_pair" in entry_points_for(run.model, "fast", fast.names)
    assert fast._forward_plan(test, run.dataset.train[:1200])  # ConvE's forward mode, for the subclass too


def test_distmult_subclass_takes_the_rows_fast_path():
    model = MyDistMult(5, 3, embedding_dim=4)
    assert entry_points_for(model, "fast", ["entity_embeddings"]) == ["tracin_rows"]
    assert select_parameters(model, "last") == ["entity_embeddings"]


def test_conve_subclass_exports_to_pykeen_as_conve():
    torch.manual_seed(0)
    conve = build_model("conve", 7, 3, **CONVE_ARGS).eval()
    sub = as_class(build_model("conve", 7, 3, **CONVE_ARGS).eval(), MyConvE)
    sub.load_state_dict(conve.state_dict())
    ours, theirs = layout.pykeen_state_dict(conve, {}), layout.pykeen_state_dict(sub, {})
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert layout.ENTITY_BIAS in theirs and theirs[layout.RELATION].shape[0] == 6  # interleaved inverse relations
    with pytest.raises(ValueError, match="no PyKEEN mapping for Linear"):
        layout.pykeen_state_dict(nn.Linear(2, 2), {})


def test_pykeens_spellings_of_models_and_datasets_are_accepted():
    """"ConvE", "DistMult", "ComplEx" and "FB15k-237", "UMLS" name what "conve", ..., "fb15k237", "umls" name."""
    from kgtrace.core.config import TrainConfig
    from kgtrace.core.specs import model_named
    from kgtrace.data.dataset import load_dataset
    from kgtrace.data.registry import registered_name
    from kgtrace.models import build_model

    assert [model_named(n) for n in ("ConvE", "DistMult", "ComplEx", "TransE", "RotatE", "TuckER", "RESCAL", "HolE")] == [
        "conve", "distmult", "complex", "transe", "rotate", "tucker", "rescal", None]
    assert TrainConfig(model="ConvE").model == "conve"
    assert type(build_model("DistMult", 5, 2, embedding_dim=4)).__name__ == "DistMult"
    assert [registered_name(n) for n in ("FB15k-237", "WN18RR", "UMLS", "Kinships", "nope")] == [
        "fb15k237", "wn18rr", "umls", "kinships", None]
    assert load_dataset("Nations").name == "nations"
