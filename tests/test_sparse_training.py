"""Sparse gradients (``--sparse``): the rows a step read, equal to the dense gradient; Adagrad's sparse update
trains to the dense one's weights."""

from __future__ import annotations

import copy

import pytest
import torch
from test_negative_sampling import config as sampled_config

from kgtrace.cli import main
from kgtrace.compute.distributed import World
from kgtrace.core.checkpoint import load_checkpoint
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError
from kgtrace.models import ComplEx, ConvE, DistMult
from kgtrace.training import loss
from kgtrace.training.loop import setup_device, train
from kgtrace.training.loss import draw_candidates, negative_sampling_rows

E, R = 40, 3
TABLES = {"entity_embeddings", "relation_embeddings", "entity_bias"}


def models():
    torch.manual_seed(1)
    return [DistMult(E, R, embedding_dim=6, entity_dropout=0.3, relation_dropout=0.2),
            ComplEx(E, R, embedding_dim=3, inverse_relations=True, entity_dropout=0.3),
            ConvE(E, R, embedding_dim=8, embedding_height=2, output_channels=2)]


@pytest.mark.parametrize("index", range(3))
def test_sparse_gradients_hold_the_rows_read_and_equal_the_dense_ones(index):
    gen = torch.Generator().manual_seed(0)
    hrt = torch.stack([torch.randint(0, E, (6,), generator=gen), torch.randint(0, R, (6,), generator=gen),
                       torch.randint(0, E, (6,), generator=gen)], dim=1)
    torch.manual_seed(2)
    tails, heads = draw_candidates(hrt, 4, 3, E)
    dense = models()[index].double().train()
    sparse = copy.deepcopy(dense)
    sparse.sparse_grad = True
    for model in (dense, sparse):  # the same dropout draws in both
        torch.manual_seed(5)
        negative_sampling_rows(model, 0.0, hrt, tails, heads, torch.ones(len(hrt), dtype=torch.bool)).mean().backward()
    read = torch.cat([hrt[:, 0], hrt[:, 2], tails.flatten(), heads.flatten()]).unique()
    for (name, p), q in zip(sparse.named_parameters(), dense.parameters()):
        assert p.grad.is_sparse == (name in TABLES), name
        torch.testing.assert_close(p.grad.to_dense(), q.grad, rtol=1e-12, atol=1e-14, msg=name)
        if name in {"entity_embeddings", "entity_bias"}:
            assert set(p.grad.coalesce().indices()[0].tolist()) <= set(read.tolist())


def config(**kw):
    """test_negative_sampling's Nations run, 3 epochs with one checkpoint and no validation."""
    return sampled_config(**{"epochs": 3, "checkpoint_every": 3, "eval_every": 0, **kw})


@pytest.mark.parametrize("model, model_args", [
    ("distmult", {"embedding_dim": 16, "inverse_relations": True, "entity_dropout": 0.2}),
    ("conve", {"embedding_dim": 16, "embedding_height": 4, "output_channels": 4}),
])
def test_sparse_adagrad_trains_to_the_dense_weights(tmp_path, monkeypatch, model, model_args):
    """Adagrad leaves a row without gradient as it is, so updating only the rows read is its dense update; the
    two runs differ by the order in which repeated rows' gradients are summed."""
    monkeypatch.setattr(loss, "gathers_rows", lambda *_: True)  # the dense run scores gathered rows too
    for sparse in (False, True):
        train(config(model=model, model_args=model_args, sparse=sparse), tmp_path / str(sparse), progress=False,
              log=lambda *_: None)
    dense, sparse = (load_checkpoint(tmp_path / f"{s}/checkpoints/epoch-0003.pt") for s in (False, True))
    for name, weights in dense["model_state"].items():
        torch.testing.assert_close(sparse["model_state"][name], weights, rtol=1e-5, atol=1e-6, msg=name)
    assert dense["step"] == sparse["step"] > 0


def test_sparse_is_refused_where_it_would_not_equal_the_dense_step():
    with pytest.raises(ConfigError) as refused:
        TrainConfig(sparse=True, optimizer="adam", weight_decay=0.1, compile=True).validate()
    problems = str(refused.value)
    for expected in ("scores every entity", "needs optimizer adagrad", "SparseAdam", "weight_decay=0.1",
                     "not compiled"):
        assert expected in problems
    config(sparse=True).validate()


def test_sparse_is_refused_under_torchrun():
    """setup_device, the first thing train and resume do on every process, before the run folder is made."""
    with pytest.raises(ConfigError, match="all-reduces dense gradients"):
        setup_device(config(sparse=True), World(rank=0, size=2))
    setup_device(config(sparse=True), World())


def test_train_takes_sparse_on_the_command_line(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "nations", "--model", "conve", "--training", "negative-sampling",
                 "--negatives-tail", "4", "--negatives-head", "4", "--optimizer", "adagrad", "--lr", "0.05",
                 "--sparse", "--epochs", "1", "--eval-every", "0", "--device", "cpu", "--no-progress",
                 "--out", str(out)]) == 0
    state = load_checkpoint(out / "checkpoints/epoch-0001.pt")
    assert state["config"]["sparse"] is True and state["step"] > 0
