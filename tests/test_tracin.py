"""TracIn attribution: every path agrees with the per-triple autograd reference."""

import pytest
import torch
import torch.nn.functional as F

from kgtrace.attribution import TracIn, select_parameters
from kgtrace.attribution.reference import triple_gradient
from kgtrace.config import TrainConfig
from kgtrace.errors import ConfigError
from kgtrace.run import load_run
from kgtrace.training.loop import train

N_TRAIN = 120
ARGS = {
    "conve": {"embedding_dim": 16, "embedding_height": 4, "output_channels": 4},
    "distmult": {"embedding_dim": 16},
}


def _train(tmp_path_factory, model):
    out = tmp_path_factory.mktemp(model)
    config = TrainConfig(dataset="nations", model=model, model_args=ARGS[model], epochs=3, checkpoint_every=1,
                         eval_every=0, threads=1, device="cpu", seed=5, lr=0.01, lr_decay=0.7)
    train(config, out, progress=False, log=lambda *_: None)
    return load_run(out)


@pytest.fixture(scope="module")
def conve_run(tmp_path_factory):
    return _train(tmp_path_factory, "conve")


@pytest.fixture(scope="module")
def distmult_run(tmp_path_factory):
    return _train(tmp_path_factory, "distmult")


def assert_agrees(got, ref):
    assert got.dtype == torch.float32 and got.shape == ref.shape
    ref = ref.float()
    scale = ref.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * scale)


def test_select_parameters(conve_run, distmult_run):
    assert select_parameters(conve_run.model, "last") == ["fc.weight", "fc.bias", "entity_bias"]
    assert select_parameters(distmult_run.model, "last") == ["entity_embeddings"]
    assert select_parameters(distmult_run.model, "all") == ["entity_embeddings", "relation_embeddings"]
    assert select_parameters(conve_run.model, ["fc.bias"]) == ["fc.bias"]
    with pytest.raises(ConfigError, match="nope.*fc.weight"):
        select_parameters(conve_run.model, ["fc.bias", "nope"])
    with pytest.raises(ConfigError, match="unknown parameter set"):
        select_parameters(conve_run.model, "first")


def test_options_are_checked(conve_run, distmult_run):
    with pytest.raises(ConfigError, match="epoch"):
        TracIn(conve_run, checkpoints=[99])
    with pytest.raises(ConfigError, match="path='fast'"):
        TracIn(distmult_run, path="fast")
    with pytest.raises(ConfigError, match="path='fast'"):
        TracIn(conve_run, params="all", path="fast")
    assert TracIn(conve_run).path == "fast"
    assert TracIn(conve_run, params="all").path == "general"
    assert TracIn(distmult_run).path == "general"


@pytest.mark.parametrize("model,params,paths", [
    ("conve", "last", ["fast", "general"]),
    ("conve", "all", ["general"]),
    ("conve", ["fc.weight"], ["fast", "general"]),
    ("conve", ["entity_bias", "conv.weight"], ["general"]),
    ("distmult", "last", ["general"]),
    ("distmult", "all", ["general"]),
])
def test_paths_agree_with_reference(request, model, params, paths):
    run = request.getfixturevalue(f"{model}_run")
    subset = torch.arange(N_TRAIN)
    test = run.dataset.test[:3]
    ref = TracIn(run, params=params, path="reference", train_indices=subset).influence(test)
    assert ref.abs().max() > 0
    for path in paths:
        got = TracIn(run, params=params, path=path, train_indices=subset, chunk_size=50).influence(test)
        assert_agrees(got, ref)


def test_checkpoints_weighed_by_lr(conve_run):
    subset = torch.arange(30)
    test = conve_run.dataset.test[:2]
    lrs = [c.lr for c in conve_run.checkpoints]
    assert len(lrs) == 3 and lrs[0] > lrs[1] > lrs[2]  # lr_decay recorded per checkpoint
    parts = [TracIn(conve_run, checkpoints=[c.epoch], train_indices=subset).influence(test)
             for c in conve_run.checkpoints]
    both = TracIn(conve_run, checkpoints=[1, 3], train_indices=subset).influence(test)
    torch.testing.assert_close(both, parts[0] + parts[2])
    # The reference applies the same weights.
    ref = TracIn(conve_run, checkpoints=[2], path="reference", train_indices=subset).influence(test)
    assert_agrees(parts[1], ref)


def test_eval_mode_is_used(conve_run):
    """Gradients are taken in eval mode, even when the run's model was left in train mode."""
    conve_run.model.train()
    try:
        tracin = TracIn(conve_run, params="all", path="general", train_indices=torch.arange(10))
        got = tracin.influence(conve_run.dataset.test[:1])
    finally:
        conve_run.model.eval()
    ref = TracIn(conve_run, params="all", path="reference", train_indices=torch.arange(10)).influence(
        conve_run.dataset.test[:1])
    assert_agrees(got, ref)
    # The check has teeth: in train mode (dropout, batch statistics) the gradients differ.
    model, names = tracin.model, tracin.names
    pair = conve_run.dataset.train[:2]
    model.eval()
    eval_grad = triple_gradient(model, pair[0], names)
    model.train()
    torch.manual_seed(0)
    params = dict(model.named_parameters())
    loss = F.softplus(-model.score_hrt(pair)).sum()  # batch of two: train-mode BatchNorm needs > 1
    train_grad = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    model.eval()
    assert not torch.allclose(eval_grad, torch.cat([
        (torch.zeros_like(params[n]) if g is None else g).reshape(-1) for n, g in zip(names, train_grad)]))


def test_batch_of_one(conve_run):
    got = TracIn(conve_run, train_indices=[5]).influence(conve_run.dataset.test[0])
    assert got.shape == (1, 1)


@pytest.mark.parametrize("model,params", [("conve", "last"), ("conve", "all"), ("distmult", "last")])
def test_self_influence_is_the_diagonal(request, model, params):
    run = request.getfixturevalue(f"{model}_run")
    subset = torch.arange(40, 100)
    tracin = TracIn(run, params=params, train_indices=subset, chunk_size=25)
    diagonal = tracin.influence(run.dataset.train[subset]).diagonal()
    self_inf = tracin.self_influence()
    assert self_inf.shape == (60,) and self_inf.dtype == torch.float32 and (self_inf > 0).all()
    torch.testing.assert_close(self_inf, diagonal, rtol=1e-4, atol=1e-4 * diagonal.abs().max().item())


def test_top_k(conve_run):
    subset = torch.arange(200, 200 + N_TRAIN)
    tracin = TracIn(conve_run, train_indices=subset)
    test = conve_run.dataset.test[:2]
    scores = tracin.influence(test)
    results = tracin.top_k(test, k=5)
    assert len(results) == 2
    for row, res, triple in zip(scores, results, test):
        assert torch.equal(res.test, triple)
        assert (res.proponent_influence[:-1] >= res.proponent_influence[1:]).all()
        assert (res.opponent_influence[:-1] <= res.opponent_influence[1:]).all()
        assert res.proponent_influence[0] == row.max() and res.opponent_influence[0] == row.min()
        # Indices are into dataset.train, not into the subset.
        assert ((res.proponents >= 200) & (res.proponents < 200 + N_TRAIN)).all()
        torch.testing.assert_close(row[res.proponents - 200], res.proponent_influence)
        torch.testing.assert_close(row[res.opponents - 200], res.opponent_influence)
