"""TRAK, the influence function and its Fisher approximation, for every registered model, against their slow
references (plain autograd per triple, dense matrices, float64).

TracIn's paths are compared for every model in test_tracin_threads.py; here each other gradient method runs on a
tiny run of each model (Nations, two checkpoints), so a model added to the registry without an entry in ARGS
fails the test that says so.
"""

from dataclasses import replace

import pytest
import torch
from attribution_references import fisher_reference, loss_gradients, reference_hessian, score_gradient

from kgtrace.attribution.fisher import fisher_influence
from kgtrace.attribution.influence import InfluenceFunction
from kgtrace.attribution.trak import trak
from kgtrace.core.checkpoint import load_checkpoint
from kgtrace.core.config import TrainConfig
from kgtrace.core.specs import model_names
from kgtrace.runs.embedding import load_run, model_from_checkpoint
from kgtrace.training.loop import train

#: Tiny settings per model (a few hundred parameters: the references build dense [P, P] matrices).
ARGS = {
    "conve": {"embedding_dim": 6, "embedding_height": 2, "output_channels": 2},
    "distmult": {"embedding_dim": 4},
    "complex": {"embedding_dim": 2},
    "transe": {"embedding_dim": 4, "scoring_norm": 2},
    "rotate": {"embedding_dim": 2, "margin": 3.0},
    "tucker": {"embedding_dim": 4, "relation_dim": 2},
    "rescal": {"embedding_dim": 3},
}


def test_every_registered_model_is_covered():
    assert set(model_names()) <= set(ARGS), "add the new model's tiny settings to ARGS"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny KvsAll run per model: Nations, 4 epochs, checkpoints after 2 and 4."""
    out = {}
    for name, args in ARGS.items():
        folder = tmp_path_factory.mktemp(name) / "run"
        config = TrainConfig(dataset="nations", model=name, model_args=args, epochs=4, lr=0.05, checkpoint_every=2,
                             eval_every=0, threads=1, device="cpu", label_smoothing=0.1, seed=3)
        train(config, folder, progress=False, log=lambda *_: None)
        out[name] = folder
    return out


@pytest.mark.parametrize("model", ARGS)
def test_trak_equals_its_formula_computed_triple_by_triple(runs, model):
    run = load_run(runs[model])
    train_triples, test, dim, seed, ridge = run.dataset.train[:150], run.dataset.test[:3], 12, 5, 0.5
    run.dataset = replace(run.dataset, train=train_triples)
    expected = torch.zeros(len(test), len(train_triples), dtype=torch.float64)
    for c, info in enumerate(run.checkpoints):
        weights = model_from_checkpoint(load_checkpoint(info.path)).double()
        names = [n for n, _ in weights.named_parameters()]
        size = sum(p.numel() for p in weights.parameters())
        projection = torch.randn(size, dim, generator=torch.Generator().manual_seed(seed * 1_000_003 + c)) / dim ** 0.5
        phi = torch.stack([score_gradient(weights, z, names) for z in train_triples]) @ projection.double()  # [n, k]
        phi_test = torch.stack([score_gradient(weights, z, names) for z in test]) @ projection.double()  # [3, k]
        kernel = phi.T @ phi  # [k, k]
        mean_eigenvalue = float(torch.linalg.eigvalsh(kernel).sum()) / min(phi.shape)
        kernel = kernel + (ridge * mean_eigenvalue + 1e-12) * torch.eye(dim, dtype=torch.float64)
        expected += (phi_test @ torch.linalg.solve(kernel, phi.T)).detach()  # KvsAll: q_j = 1
    expected /= len(run.checkpoints)
    got = trak(run, test, dim=dim, seed=seed, ridge=ridge)
    assert torch.allclose(got, expected, rtol=1e-3, atol=1e-4 * expected.abs().max()), model


@pytest.mark.parametrize("model", ARGS)
def test_influence_equals_the_damped_inverse_hessian_product(runs, model):
    run = load_run(runs[model])
    run.dataset = replace(run.dataset, train=run.dataset.train[:400])  # the Hessian of a part: P passes over it
    weights, names, hessian = reference_hessian(run)
    test = run.dataset.test[:2]
    found = InfluenceFunction(run, damping=1e-3)
    damped = hessian + found.damping * torch.eye(len(hessian), dtype=torch.float64)
    g_train = loss_gradients(weights, run.dataset.train, names)  # [n, P]
    g_test = loss_gradients(weights, test, names)  # [2, P]
    expected = g_test @ torch.linalg.solve(damped, g_train.T)  # [2, n]
    got = found.influence(test)
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-9 * expected.abs().max()), model


@pytest.mark.parametrize("model", ARGS)
def test_fisher_influence_equals_the_dense_block_diagonal_solve(runs, model):
    run = load_run(runs[model])
    weights = model_from_checkpoint(load_checkpoint(run.checkpoints[-1].path)).double().eval()
    names = [n for n, p in weights.named_parameters() if p.requires_grad]
    test = run.dataset.test[:3]
    expected = fisher_reference(weights, run.dataset.train, test, names, 1e-3)
    got = fisher_influence(run, test, damping=1e-3)
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-9 * expected.abs().max()), model
