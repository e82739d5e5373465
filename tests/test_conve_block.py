"""ConvE's hand-differentiated conv block against autograd (VJP) and torch.func (JVP), with and without batch norm."""

import pytest
import torch
from torch.func import functional_call, jvp

from kgtrace.attribution.conve_block import block_jvp, block_vjp, conv_block
from kgtrace.models.conve import ConvE

UPSTREAM = ["bn0.weight", "bn0.bias", "conv.weight", "conv.bias", "bn1.weight", "bn1.bias"]


def eval_model(batch_norm: bool) -> ConvE:
    torch.manual_seed(0)
    model = ConvE(7, 3, embedding_dim=12, embedding_height=3, output_channels=4, kernel_height=2, kernel_width=3,
                  apply_batch_normalization=batch_norm).double()
    if batch_norm:  # non-trivial running statistics and affine terms, so that every factor shows
        for bn in (model.bn0, model.bn1):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)
    with torch.no_grad():
        model.conv.bias.uniform_(-0.2, 0.2)
    return model.eval()


class Maps(torch.nn.Module):
    """functional_call target: head and relation vectors [B, D] -> fc input [B, F]."""

    def __init__(self, model: ConvE):
        super().__init__()
        self.model = model

    def forward(self, h, r):
        return self.model._maps(self.model._stack(h, r))


def names(model: ConvE) -> list[str]:
    present = dict(model.named_parameters())
    return [n for n in UPSTREAM if n in present]


@pytest.mark.parametrize("batch_norm", [True, False])
def test_vjp_equals_autograd_per_triple(batch_norm):
    model = eval_model(batch_norm)
    pairs = torch.tensor([[0, 1], [3, 0], [6, 5]])
    index = torch.tensor([2, 0, 0, 1])  # triples' pairs: one pair shared by two triples
    a = model._features(pairs).detach()
    da = torch.randn(len(index), a.shape[1], dtype=torch.float64)
    grads, head_rows, rel_rows = block_vjp(model, conv_block(model, pairs, a), index, da)
    assert sorted(grads) == sorted(names(model))
    for j, u in enumerate(index):
        model.zero_grad()
        h = model.entity_embeddings[pairs[u, 0]].detach().requires_grad_()
        r = model.relation_embeddings[pairs[u, 1]].detach().requires_grad_()
        out = model._maps(model._stack(h[None], r[None]))[0]
        (out @ da[j]).backward()
        torch.testing.assert_close(head_rows[j], h.grad)
        torch.testing.assert_close(rel_rows[j], r.grad)
        for name, p in model.named_parameters():
            if name in grads:
                torch.testing.assert_close(grads[name][j], p.grad, msg=name)


@pytest.mark.parametrize("batch_norm,gamma0", [(True, None), (True, 0.0), (False, None)])
def test_jvp_equals_torch_func(batch_norm, gamma0):
    model = eval_model(batch_norm)
    if gamma0 is not None:  # bn0's scale at zero: the JVP cannot recover the bn0 part from the patches
        model.bn0.weight.data.fill_(gamma0)
    pairs = torch.tensor([[0, 1], [3, 0], [6, 5]])
    a = model._features(pairs).detach()
    g = torch.Generator().manual_seed(1)
    params = {n: p.detach() for n, p in model.named_parameters() if n in names(model)}
    tangent = {n: torch.randn(p.shape, generator=g, dtype=torch.float64) for n, p in params.items()}
    dh = torch.randn(3, 12, generator=g, dtype=torch.float64)
    dr = torch.randn(3, 12, generator=g, dtype=torch.float64)
    dh[1], dr[1] = 0, 0  # a pair that shares no row with the tangent
    got = block_jvp(model, conv_block(model, pairs, a), tangent, dh, dr)
    h, r = model.entity_embeddings[pairs[:, 0]].detach(), model.relation_embeddings[pairs[:, 1]].detach()

    def maps(p, hh, rr):
        return functional_call(Maps(model), {f"model.{n}": v for n, v in p.items()}, (hh, rr))

    expected = jvp(maps, (params, h, r), (tangent, dh, dr))[1]
    torch.testing.assert_close(got, expected)
    # A tangent that leaves parameters out means zero along them.
    partial = block_jvp(model, conv_block(model, pairs, a), {}, dh, dr)
    zero = {n: torch.zeros_like(t) for n, t in tangent.items()}
    torch.testing.assert_close(partial, jvp(maps, (params, h, r), (zero, dh, dr))[1])
