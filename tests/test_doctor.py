"""kgtrace doctor: catches what it is meant to catch, and passes a real run's entry points."""

from __future__ import annotations

import torch

from kgtrace.cli import main
from kgtrace.compile import CompiledCall
from kgtrace.doctor import Check, Probe, cuda_graph_problems, format_table, norm_error, relative_error, run_probes

BATCH = 4


def toy(flag, x, valid):
    y = x * 2.0 + 1.0 if flag else x + x + 1.0  # the same values, another graph
    return y * valid.unsqueeze(1)


def toy_probe(compiled=None, flags=(True,)) -> Probe:
    call = CompiledCall("toy", toy, BATCH, {"x": torch.zeros(1, 3)})
    gen = torch.Generator().manual_seed(0)
    calls = iter(range(1000))

    def flag():  # the static argument of each call: changing it forces a recompilation
        return flags[min(next(calls), len(flags) - 1)]

    def run(inputs):
        return call(flag(), **inputs)

    def eager(inputs):
        return (inputs["x"] * 2.0 + 1.0,)

    return Probe(call, compiled(call) if compiled else run, eager, lambda n: {"x": torch.randn(n, 3, generator=gen)},
                 (BATCH, BATCH, 1, BATCH - 1, 2 * BATCH + 1, BATCH), torch.no_grad)


def test_failures_are_caught():
    def off_by_one(call):
        return lambda inputs: tuple(y + 1e-2 for y in call(True, **inputs))

    def reuses_its_output(call):  # what CUDA-graph replays do to outputs not cloned at the boundary
        out = torch.empty(0)

        def run(inputs):
            (y,) = call(True, **inputs)
            return (out.resize_(y.shape).copy_(y),)

        return run

    def wrong_gradient(probe):  # a flat "gradient" as last output, 10% off
        probe.gradient = True
        run, eager = probe.compiled, probe.eager
        probe.compiled = lambda inputs: (*run(inputs), run(inputs)[0].flatten() * 1.1)
        probe.eager = lambda inputs: (*eager(inputs), eager(inputs)[0].flatten())
        return probe

    good, wrong, overwritten, recompiles, gradient = run_probes([
        toy_probe(), toy_probe(off_by_one), toy_probe(reuses_its_output), toy_probe(flags=(True, True, False)),
        wrong_gradient(toy_probe()),
    ])
    assert gradient.max_error < 1e-6 and abs(gradient.gradient_error - 0.1) < 1e-5
    assert gradient.problems == ["gradient differs from eager: relative norm 0.1 > 0.001"]
    assert good.ok and good.calls == 6 and good.sizes == [1, 3, 4, 9] and good.max_error < 1e-6
    assert good.gradient_error is None
    assert wrong.problems == [f"differs from eager: relative error {wrong.max_error:.3g} > 0.0001"]
    assert overwritten.problems == ["an output held from an earlier call was overwritten by a later call"]
    assert recompiles.recompilations == 1 and len(recompiles.problems) == 1
    assert "1 recompilation(s) after warm-up" in recompiles.problems[0]
    table = format_table([good, wrong])
    assert "toy (batch 4): differs from eager" in table and table.endswith("1 of 2 entry points passed; 1 FAILED")


def test_cuda_graph_checks():
    """The CUDA-only checks, on their inputs (the doctor feeds them on CUDA only)."""
    assert cuda_graph_problems(torch.device("cpu"), "default", 3) == []
    assert cuda_graph_problems(torch.device("cuda"), "reduce-overhead", 0) == []
    problems = cuda_graph_problems(torch.device("cuda"), "default", 2)
    assert len(problems) == 2 and "reduce-overhead" in problems[0] and "skipped CUDA graphs 2" in problems[1]


def test_relative_error():
    assert relative_error(torch.tensor([1, 2]), torch.tensor([1, 2])) == 0.0
    assert relative_error(torch.tensor([1, 3]), torch.tensor([1, 2])) == float("inf")
    assert relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])) == 0.2
    assert relative_error(torch.zeros(2), torch.zeros(3)) == float("inf")
    assert norm_error(torch.tensor([3.0, 4.0]), torch.tensor([0.0, 4.0])) == 0.75
    assert norm_error(torch.zeros(2), torch.zeros(3)) == float("inf")
    assert Check("x", 1, 1, [1], 0.0, 0, 0, 0.0).ok


def test_doctor_passes_the_default_run(compiled_runs, capsys):
    """No RUN_DIR: a small ConvE on UMLS; its graphs are the session fixture's, loaded from Inductor's cache."""
    assert main(["doctor", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for entry in ("rank_side", "train_kvsall", "tracin_conve_band_head", "tracin_conve_band_pair",
                  "tracin_conve_band_relation"):
        assert entry in out
    assert "6 of 6 entry points passed" in out
    assert "FAILED" not in out
