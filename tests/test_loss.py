"""Tests of the sparse 1-N losses against dense references."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError
from kgtrace.models import build_model
from kgtrace.training.loss import (
    dense_bce_reference,
    dense_ce_reference,
    kvsall_bce,
    kvsall_bce_chunked_backward,
    kvsall_ce,
    onevsall_ce,
    smoothed_label_values,
)

REL = {"rtol": 1e-6, "atol": 0.0}


def sparse_positives(batch: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random unique (row, col) positives: several in some rows, none in others (row 1)."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, classes, generator=generator) < 0.3
    mask[0, :4] = True  # several positives in one row
    mask[1] = False  # a row without positives
    return mask.nonzero(as_tuple=True)


def dense_labels(batch, classes, rows, cols, eps, num_classes=None):
    labels = torch.zeros(batch, classes, dtype=torch.float64)
    labels[rows, cols] = 1.0
    if eps:
        n = num_classes or classes
        labels = labels * (1 - eps) + (1 - labels) * eps / (n - 1)
    return labels


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_kvsall_bce_equals_dense_references(eps):
    batch, classes = 6, 11
    scores = torch.randn(batch, classes, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 4
    rows, cols = sparse_positives(batch, classes)
    labels = dense_labels(batch, classes, rows, cols, eps)
    sparse_scores = scores.clone().requires_grad_()
    dense_scores = scores.clone().requires_grad_()
    loss = kvsall_bce(sparse_scores, rows, cols, eps)
    expected = F.binary_cross_entropy_with_logits(dense_scores, labels)
    torch.testing.assert_close(loss, expected, **REL)
    torch.testing.assert_close(loss, dense_bce_reference(scores, rows, cols, eps), **REL)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(sparse_scores.grad, dense_scores.grad, rtol=1e-6, atol=1e-12)


def test_kvsall_bce_float32_with_custom_num_classes():
    batch, classes, num_classes, eps = 5, 40, 1000, 0.2
    scores = torch.randn(batch, classes, generator=torch.Generator().manual_seed(2)) * 3
    rows, cols = sparse_positives(batch, classes, seed=3)
    labels = dense_labels(batch, classes, rows, cols, eps, num_classes).float()
    loss = kvsall_bce(scores, rows, cols, eps, num_classes=num_classes)
    torch.testing.assert_close(loss, F.binary_cross_entropy_with_logits(scores, labels), **REL)


def test_kvsall_bce_spans_several_softplus_blocks():
    """Large enough that the row-blocked softplus sum runs over many blocks."""
    batch, classes = 40, 3000
    scores = torch.randn(batch, classes, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * 5
    rows, cols = sparse_positives(batch, classes, seed=5)
    for eps in (0.0, 0.05):
        expected = F.binary_cross_entropy_with_logits(scores, dense_labels(batch, classes, rows, cols, eps))
        torch.testing.assert_close(kvsall_bce(scores, rows, cols, eps), expected, **REL)


def test_conve_style_smoothing_is_the_conve_authors_labels():
    """style "conve": y = (1 - eps) * labels + 1 / C (Dettmers et al.'s main.py), dense and sparse alike."""
    batch, classes, eps = 6, 11, 0.1
    scores = torch.randn(batch, classes, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 4
    rows, cols = sparse_positives(batch, classes)
    labels = dense_labels(batch, classes, rows, cols, 0.0) * (1 - eps) + 1.0 / classes
    sparse_scores, dense_scores = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    loss = kvsall_bce(sparse_scores, rows, cols, eps, smoothing_style="conve")
    expected = F.binary_cross_entropy_with_logits(dense_scores, labels)
    torch.testing.assert_close(loss, expected, **REL)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(sparse_scores.grad, dense_scores.grad, rtol=1e-6, atol=1e-12)
    assert not torch.allclose(loss, kvsall_bce(scores, rows, cols, eps))  # not PyKEEN's
    assert smoothed_label_values(0.0, classes, "conve") == (1.0, 0.0)  # no smoothing: 0/1 in either style
    with pytest.raises(ConfigError, match="label_smoothing_style='dettmers'"):
        smoothed_label_values(0.1, classes, "dettmers")
    with pytest.raises(ConfigError, match="label_smoothing_style='dettmers': must be one of pykeen, conve"):
        TrainConfig(label_smoothing_style="dettmers").validate()


def test_training_takes_the_smoothing_style(tmp_path):
    """Eager and compiled training read config.label_smoothing_style (the compiled step through step_static)."""
    from kgtrace.training.compiled import step_static
    from kgtrace.training.loop import train

    model = build_model("distmult", 14, 55, embedding_dim=4)
    assert step_static(model, TrainConfig(label_smoothing_style="conve"))[1:] == smoothed_label_values(0.1, 14, "conve")
    losses = {}
    for style in ("pykeen", "conve"):
        config = TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 8}, epochs=1,
                             eval_every=0, threads=1, device="cpu", label_smoothing_style=style)
        train(config, tmp_path / style, progress=False, log=lambda *_: None)
        losses[style] = json.loads((tmp_path / style / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    assert losses["conve"] != losses["pykeen"]  # same seed, same start: only the labels differ


@pytest.mark.parametrize("eps", [-0.1, 1.0, float("nan")])
def test_kvsall_bce_rejects_bad_label_smoothing(eps):
    with pytest.raises(ConfigError) as info:
        kvsall_bce(torch.zeros(2, 3), torch.tensor([0]), torch.tensor([1]), eps)
    assert info.value.problems[0].startswith("label_smoothing=")


class AllocationRecorder(TorchDispatchMode):
    """Records every tensor an op returns that does not alias ``ignore``.

    ``shapes`` lists (op, shape); ``storages`` maps each distinct storage (in-place ops and
    views return tensors sharing one) to the largest shape seen on it.
    """

    def __init__(self, ignore: torch.Tensor):
        super().__init__()
        self.ignore_ptr = ignore.untyped_storage().data_ptr()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []
        self.storages: dict[int, tuple[int, ...]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().data_ptr() != self.ignore_ptr:
                self.shapes.append((str(func), tuple(leaf.shape)))
                ptr = leaf.untyped_storage().data_ptr()
                if leaf.numel() >= torch.Size(self.storages.get(ptr, ())).numel():
                    self.storages[ptr] = tuple(leaf.shape)
        return out


def test_kvsall_bce_creates_no_dense_tensor():
    batch, classes = 64, 4096
    scores = torch.randn(batch, classes, requires_grad=True)
    rows, cols = sparse_positives(batch, classes)
    recorder = AllocationRecorder(ignore=scores)
    with recorder:
        loss = kvsall_bce(scores, rows, cols, 0.1)
    largest = max(torch.Size(shape).numel() for _, shape in recorder.shapes)
    assert largest < batch * classes, recorder.shapes
    # Backward allocates the [B, C] gradient itself, and nothing else of that size.
    recorder = AllocationRecorder(ignore=scores)
    with recorder:
        loss.backward()
    dense = [shape for shape in recorder.storages.values() if torch.Size(shape).numel() >= batch * classes]
    assert dense == [(batch, classes)], recorder.shapes


def _losses_and_grads(model, queries, rows, cols, eps, chunk_size, style="pykeen"):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)  # same dropout masks in both runs
    if chunk_size is None:
        loss = kvsall_bce(model.score_t(queries), rows, cols, eps, smoothing_style=style)
        loss.backward()
        loss = loss.detach()
    else:
        loss = kvsall_bce_chunked_backward(model, queries, rows, cols, eps, chunk_size, smoothing_style=style)
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss, grads


@pytest.mark.parametrize(
    "name, settings",
    [
        ("conve", {"embedding_dim": 8, "embedding_height": 2, "output_channels": 3}),
        ("distmult", {"embedding_dim": 6}),
        ("complex", {"embedding_dim": 4}),
    ],
)
def test_chunked_backward_gradients_equal_unchunked(name, settings):
    num_entities, num_relations, batch = 23, 4, 9
    torch.manual_seed(0)
    model = build_model(name, num_entities, num_relations, **settings).double().train()
    queries = torch.stack([torch.randint(num_entities, (batch,)), torch.randint(2 * num_relations, (batch,))], 1)
    rows, cols = sparse_positives(batch, num_entities, seed=6)
    for style in ("pykeen", "conve"):
        _chunks_agree(model, queries, rows, cols, style)


def _chunks_agree(model, queries, rows, cols, style):
    full_loss, full_grads = _losses_and_grads(model, queries, rows, cols, 0.1, None, style)
    for chunk_size in (5, 23, 100):
        loss, grads = _losses_and_grads(model, queries, rows, cols, 0.1, chunk_size, style)
        assert not loss.requires_grad
        torch.testing.assert_close(loss, full_loss, **REL)
        assert grads.keys() == full_grads.keys()
        for key in grads:
            torch.testing.assert_close(grads[key], full_grads[key], rtol=1e-6, atol=1e-12, msg=key)


def test_chunked_backward_memory_is_per_chunk():
    num_entities, batch, chunk_size = 1000, 16, 100
    torch.manual_seed(0)
    model = build_model("distmult", num_entities, 3, embedding_dim=8)
    queries = torch.stack([torch.randint(num_entities, (batch,)), torch.randint(6, (batch,))], 1)
    rows, cols = sparse_positives(batch, num_entities)
    param_shapes = {tuple(p.shape) for p in model.parameters()}
    recorder = AllocationRecorder(ignore=queries)
    with recorder:
        kvsall_bce_chunked_backward(model, queries, rows, cols, 0.1, chunk_size)
    activations = [shape for _, shape in recorder.shapes if shape not in param_shapes]
    assert max(torch.Size(shape).numel() for shape in activations) <= max(batch * chunk_size, len(rows))


def test_chunked_backward_rejects_bad_chunk_size():
    model = build_model("distmult", 5, 2, embedding_dim=4)
    with pytest.raises(ConfigError):
        kvsall_bce_chunked_backward(model, torch.tensor([[0, 1]]), torch.tensor([0]), torch.tensor([2]), 0.0, 0)


def test_onevsall_equals_cross_entropy():
    scores = torch.randn(8, 13, dtype=torch.float64, generator=torch.Generator().manual_seed(8)) * 5
    targets = torch.randint(13, (8,), generator=torch.Generator().manual_seed(9))
    ours = scores.clone().requires_grad_()
    reference = scores.clone().requires_grad_()
    loss = onevsall_ce(ours, targets)
    expected = F.cross_entropy(reference, targets)
    torch.testing.assert_close(loss, expected, **REL)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(ours.grad, reference.grad, rtol=1e-6, atol=1e-12)


def test_kvsall_ce_equals_the_cross_entropy_against_spread_answers():
    gen = torch.Generator().manual_seed(10)
    scores = torch.randn(6, 11, dtype=torch.float64, generator=gen) * 4
    mask = torch.rand(6, 11, generator=gen) < 0.3
    mask[torch.arange(6), torch.randint(11, (6,), generator=gen)] = True  # every KvsAll row has an answer
    rows, cols = mask.nonzero(as_tuple=True)
    ours, reference = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    loss, expected = kvsall_ce(ours, rows, cols), dense_ce_reference(reference, rows, cols)
    # by hand for row 0: logsumexp(s_0) - mean of its answers' scores
    row0 = torch.logsumexp(scores[0], 0) - scores[0][mask[0]].mean()
    assert float(kvsall_ce(scores[:1], rows[rows == 0], cols[rows == 0])) == pytest.approx(float(row0), rel=1e-12)
    torch.testing.assert_close(loss, expected, **REL)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(ours.grad, reference.grad, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(kvsall_ce(scores, rows, cols, denominator=12.0), expected.detach() * 6 / 12, **REL)
    for style in ("pykeen", "conve"):  # smoothed: PyKEEN's CrossEntropyLoss, LibKGE's kl
        ours, reference = scores.clone().requires_grad_(), scores.clone().requires_grad_()
        loss = kvsall_ce(ours, rows, cols, 0.1, smoothing_style=style)
        expected = dense_ce_reference(reference, rows, cols, 0.1, style)
        torch.testing.assert_close(loss, expected, **REL)
        loss.backward()
        expected.backward()
        torch.testing.assert_close(ours.grad, reference.grad, rtol=1e-6, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kvsall_bce_on_cuda():
    scores = torch.randn(300, 20000, device="cuda") * 3
    mask = torch.rand(300, 20000, device="cuda") < 0.001
    rows, cols = mask.nonzero(as_tuple=True)
    expected = F.binary_cross_entropy_with_logits(scores, (mask * 0.9 + ~mask * 0.1 / 19999).float())
    torch.testing.assert_close(kvsall_bce(scores, rows, cols, 0.1), expected, rtol=1e-5, atol=0.0)
