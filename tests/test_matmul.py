"""kgtrace.compute.matmul.linear: the oneDNN path and the plain ``@`` give x W^T to float32 rounding, whichever is taken."""

import pytest
import torch

import kgtrace.compute.matmul as matmul
from kgtrace.compute.matmul import ROWS, linear


def operands(rows, inner=300, outputs=70, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, inner, generator=g), torch.randn(outputs, inner, generator=g)


def exact(x, w):
    return (x.double() @ w.double().T).float()


@pytest.mark.parametrize("rows", [1, ROWS - 1, ROWS, ROWS + 1, 3 * ROWS + 17])
@pytest.mark.parametrize("onednn", [True, False])
def test_linear_equals_the_float64_product(rows, onednn):
    """Row counts below, at and across multiples of ROWS (oneDNN's rows and MKL's remainder), with and without oneDNN."""
    if onednn and not matmul.onednn_available():
        pytest.skip("this PyTorch build has no oneDNN linear kernel")
    x, w = operands(rows)
    got = linear(x, w, onednn=onednn)
    assert got.shape == (rows, 70) and got.dtype == torch.float32
    torch.testing.assert_close(got, exact(x, w), rtol=1e-5, atol=1e-4)


def test_oneDNN_is_taken_where_it_applies_and_nowhere_else(monkeypatch):
    if not matmul.onednn_available():
        pytest.skip("this PyTorch build has no oneDNN linear kernel")
    calls = []
    original = torch.ops.mkldnn._linear_pointwise

    def counted(*args):
        calls.append(args[0].shape[0])
        return original(*args)

    x, w = operands(2 * ROWS + 5)
    with monkeypatch.context() as m:
        m.setattr(torch.ops.mkldnn, "_linear_pointwise", counted, raising=False)
        m.setattr(matmul, "_ONEDNN", True)  # as on a processor that prefers it
        linear(x, w)
        assert calls == [2 * ROWS]  # the rows up to a multiple of ROWS; the 5 left over go to MKL
        linear(x[:ROWS - 1], w)  # fewer rows than ROWS: MKL alone
        linear(x.double(), w.double())  # not float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert linear(x, w).dtype == torch.bfloat16  # autocast's product, as ``@`` under autocast
        with torch.enable_grad():
            linear(x.requires_grad_(), w)  # autograd needs the differentiable product
        assert calls == [2 * ROWS]
        linear(x.detach(), w, onednn=False)
        m.setattr(matmul, "_ONEDNN", False)  # as on an Intel processor
        linear(x.detach(), w)
        assert calls == [2 * ROWS]
        linear(x.detach(), w, onednn=True)  # asked for: taken all the same
        assert calls == [2 * ROWS, 2 * ROWS]


CPUINFO = "processor\t: 0\nvendor_id\t: {}\ncpu family\t: 6\nmodel name\t: Some CPU\n\nprocessor\t: 1\n"


def test_oneDNN_is_preferred_on_processors_other_than_intel():
    assert matmul.cpu_vendor(CPUINFO.format("GenuineIntel")) == "GenuineIntel"
    assert matmul.cpu_vendor(CPUINFO.format("AuthenticAMD")) == "AuthenticAMD"
    assert matmul.cpu_vendor("processor\t: 0\n") == ""  # no vendor line (other architectures)
    assert not matmul.prefers_onednn("GenuineIntel")
    assert matmul.prefers_onednn("AuthenticAMD") == matmul.prefers_onednn("") == matmul.onednn_available()


def test_linear_stays_differentiable():
    x, w = operands(2 * ROWS)
    x.requires_grad_()
    w.requires_grad_()
    linear(x, w).sum().backward()
    torch.testing.assert_close(x.grad, w.detach().sum(0).expand_as(x))
    torch.testing.assert_close(w.grad, x.detach().sum(0).expand_as(w))
