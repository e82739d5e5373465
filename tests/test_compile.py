"""CompiledCall: parity with eager, static buffers, clone at the boundary, no recompilation, no eager fallback."""

from __future__ import annotations

import pytest
import torch

from kgtrace.compute.compile import CompiledCall
from kgtrace.core.errors import KgtraceError

BATCH = 8


def toy(x, w, valid):
    """Two outputs, one row each per input row; padded rows zeroed through ``valid``."""
    y = (x * 2.0 + w.sum(dim=1, keepdim=True)) * valid.unsqueeze(1)
    return y, w.amax(dim=1)


def eager(x, w):
    return toy(x, w, torch.ones(len(x), dtype=torch.bool))


@pytest.fixture(scope="module")
def call():
    return CompiledCall("toy", toy, BATCH, {"x": torch.zeros(1, 3), "w": torch.zeros(BATCH, 4)})


def test_parity_any_n_without_recompiling(call):
    gen = torch.Generator().manual_seed(0)
    pointers = {key: b.data_ptr() for key, b in call.buffers.items()}
    call(x=torch.randn(2, 3, generator=gen), w=torch.randn(2, 4, generator=gen))  # compiles
    after_first = call.stats
    assert after_first.compilations == 1 and after_first.compile_seconds > 0
    for n in (1, BATCH - 1, BATCH, 2 * BATCH + 1, 0):
        x, w = torch.randn(n, 3, generator=gen), torch.randn(n, 4, generator=gen)
        y, m = call(x=x, w=w)
        ey, em = eager(x, w)
        assert y.shape == (n, 3) and m.shape == (n,)
        torch.testing.assert_close(y, ey)
        assert torch.equal(m, em)
        assert {key: b.data_ptr() for key, b in call.buffers.items()} == pointers  # static buffers
    stats = call.stats
    assert stats.recompilations == 0 and stats.compilations == 1 and stats.graph_breaks == 0
    assert {1, BATCH - 1, BATCH, 2 * BATCH + 1, 0} <= stats.input_sizes
    assert stats.batches >= stats.calls + 2  # 2 * BATCH + 1 rows took three runs


def test_held_output_survives_the_next_call(call):
    first, _ = call(x=torch.ones(BATCH, 3), w=torch.zeros(BATCH, 4))
    held = first.clone()
    second, _ = call(x=torch.full((BATCH, 3), 5.0), w=torch.ones(BATCH, 4))
    assert not torch.equal(second, held)  # the calls' values differ ...
    assert torch.equal(first, held)  # ... and the first output was not overwritten
    assert all(o.data_ptr() != b.data_ptr() for o in (first, second) for b in call.buffers.values())


def test_padding_repeats_the_last_row_and_marks_it_invalid(call):
    call(x=torch.arange(6.0).view(2, 3), w=torch.zeros(2, 4))
    assert torch.equal(call.buffers["x"][2:], torch.tensor([[3.0, 4.0, 5.0]]).expand(BATCH - 2, 3))
    assert call.buffers["valid"].tolist() == [True, True] + [False] * (BATCH - 2)


def test_mark_step_before_every_compiled_run(call, monkeypatch):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    call(x=torch.zeros(1, 3), w=torch.zeros(1, 4))
    assert len(marks) == 1
    call(x=torch.zeros(2 * BATCH + 1, 3), w=torch.zeros(2 * BATCH + 1, 4))
    assert len(marks) == 4  # one per batch


def test_wrong_inputs_are_refused(call):
    with pytest.raises(ValueError, match="expected inputs"):
        call(x=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="input 'w' must be"):
        call(x=torch.zeros(1, 3), w=torch.zeros(1, 5))
    with pytest.raises(ValueError, match="differ in their number of rows"):
        call(x=torch.zeros(1, 3), w=torch.zeros(2, 4))


def data_dependent_branch(x, valid):
    if x.sum().item() > 0:  # Python control flow on a tensor value: a graph break
        return x + 1
    return x - 1


def prints_a_tensor(x, valid):
    print("x is", x)  # a graph break
    return x + 1


@pytest.mark.parametrize("fn", [data_dependent_branch, prints_a_tensor])
def test_graph_break_is_an_error_not_an_eager_fallback(fn, capsys):
    call = CompiledCall("breaks", fn, 4, {"x": torch.zeros(1, 2)})
    with pytest.raises(KgtraceError, match=r"torch\.compile failed for breaks .*compile=False") as caught:
        call(x=torch.ones(2, 2))
    assert caught.value.__cause__ is not None
    assert "x is" not in capsys.readouterr().out  # fn never ran eagerly


def test_each_call_has_its_own_dynamo_cache():
    """Two CompiledCalls of one fn compile separately, even with a recompile limit of 1."""
    with torch._dynamo.config.patch(recompile_limit=1):
        calls = [CompiledCall(f"toy{b}", toy, b, {"x": torch.zeros(1, 3), "w": torch.zeros(1, 4)}) for b in (2, 3)]
        for c in calls:
            y, _ = c(x=torch.ones(3, 3), w=torch.ones(3, 4))
            assert torch.equal(y, torch.full((3, 3), 6.0))
            assert c.stats.compilations == 1 and c.stats.recompilations == 0


def test_static_arguments_pass_through():
    def scaled(scale, x, valid):
        return x * scale.weight

    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(3.0)
    call = CompiledCall("scaled", scaled, 4, {"x": torch.zeros(1, 1)})
    (y,) = call(module, x=torch.ones(2, 1))
    assert torch.equal(y, torch.full((2, 1), 3.0))
    with torch.no_grad():
        module.weight.fill_(5.0)  # parameters are read at run time, not baked in
    (y,) = call(module, x=torch.ones(2, 1))
    assert torch.equal(y, torch.full((2, 1), 5.0)) and call.stats.recompilations == 0
