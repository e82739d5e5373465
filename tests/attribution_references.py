"""Slow references of the attribution methods for the tests: plain autograd per triple, dense matrices, float64."""

import copy

import torch
import torch.nn.functional as F
from torch.func import functional_call

from kgtrace.attribution.rows import row_tables
from kgtrace.training.batches import Batches
from kgtrace.training.loss import dense_bce_reference


def reference_hessian(run):
    """Reference: autograd's Hessian of the whole KvsAll objective (dense labels, one batch), float64."""
    model = copy.deepcopy(run.model).double().eval()
    names = [n for n, _ in model.named_parameters()]
    shapes = [(n, p.shape, p.numel()) for n, p in model.named_parameters()]
    batches = Batches.build(run.dataset.train, run.dataset.num_relations, "kvsall")
    rows, cols = batches.index.pairs_at(torch.arange(len(batches)))

    def loss(flat):
        weights, offset = {}, 0
        for name, shape, size in shapes:
            weights[name] = flat[offset:offset + size].view(shape)
            offset += size
        scores = functional_call(ScoreT(model), {f"model.{k}": v for k, v in weights.items()},
                                            (batches.queries,))
        return dense_bce_reference(scores, rows, cols, run.config.label_smoothing)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return model, names, torch.autograd.functional.hessian(loss, flat)


class ScoreT(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, queries):
        return self.model.score_t(queries)


def fisher_reference(model, train, test, names, damping):
    """Reference: the dense empirical Fisher from autograd gradients, every entry outside the blocks zeroed."""
    params = dict(model.named_parameters())
    g_train = loss_gradients(model, train, names)  # [n, P]
    fisher = g_train.T @ g_train / len(train)  # [P, P]
    # Block labels per flat coordinate: (space, row) for table entries, a unique label otherwise.
    tables, labels, offset = row_tables(model), [], 0
    for n in names:
        p = params[n]
        if n in tables:
            width = p[0].numel()
            labels += [(tables[n], i) for i in range(p.shape[0]) for _ in range(width)]
        else:
            labels += [("dense", offset + i) for i in range(p.numel())]
        offset += p.numel()
    same = torch.tensor([[a == b for b in labels] for a in labels])
    blocks = torch.where(same, fisher, torch.zeros_like(fisher))
    lam = damping * blocks.diagonal().mean() + 1e-12
    g_test = loss_gradients(model, test, names)
    return g_test @ torch.linalg.solve(blocks + lam * torch.eye(len(blocks), dtype=torch.float64), g_train.T)


def loss_gradients(model, triples, names):
    """Reference: d softplus(-score_hrt(z)) / d params of each triple z [n, 3] by plain autograd, [n, P] in
    ``names`` order."""
    params = dict(model.named_parameters())

    def one(z):
        loss = F.softplus(-model.score_hrt(z.view(1, 3))).sum()
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, [params[n] for n in names])])

    return torch.stack([one(z) for z in triples])


def score_gradient(model, triple, names):
    """Reference: d score_hrt(triple) / d params, by plain autograd, flattened in ``names`` order."""
    params = dict(model.named_parameters())
    score = model.score_hrt(triple.view(1, 3)).sum()
    grads = torch.autograd.grad(score, [params[n] for n in names])
    return torch.cat([g.reshape(-1) for g in grads])
