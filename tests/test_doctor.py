"""kgtrace doctor: catches what it is meant to catch, and passes a real run's entry points."""

from __future__ import annotations

import torch

from kgtrace.cli import main
from kgtrace.compute.compile import CompiledCall
from kgtrace.runs.embedding import load_run
from kgtrace.training import graphed
from kgtrace.workflows.doctor import (
    Check,
    Probe,
    captured_step_check,
    cuda_graph_problems,
    format_table,
    near_candidates,
    norm_error,
    rank_parity,
    relative_error,
    run_probes,
)

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


# Two rows of 5 entities. Row 0: the true answer 0 scores 10; entities 1 and 2 lie within the band
# (1e-4 x 10.0005 = 1.00005e-3) of it, entity 3 outside it, entity 4 (also within it) is filtered out.
# Row 1: the true answer 2 scores 4; the nearest candidate is 0.5 away (band 4e-4), none within it.
SCORES = torch.tensor([[10.0, 10.0005, 9.9995, 9.99, 10.0], [1.0, -2.0, 4.0, 3.5, 0.0]])
ANSWERS = torch.tensor([0, 2])
FILTERED = torch.tensor([[False, False, False, False, True], [False, False, True, False, False]])


def eager_counts(near=None):
    """Eager's greater, equal, num_candidates, nonfinite [2] for SCORES, then the near candidates [2]."""
    greater, equal, candidates = torch.tensor([1, 1]), torch.tensor([0, 0]), torch.tensor([4, 5])
    near = near_candidates(SCORES, ANSWERS, FILTERED) if near is None else near
    return greater, equal, candidates, torch.tensor([False, False]), near


def test_near_candidates_counts_the_unfiltered_within_the_band():
    assert near_candidates(SCORES, ANSWERS, FILTERED).tolist() == [2, 0]
    ties = torch.zeros(1, 4)  # a band of width 0 still holds the exact ties
    assert near_candidates(ties, torch.tensor([1]), torch.tensor([[True, False, False, False]])).tolist() == [2]


def test_rank_difference_within_the_band_is_accepted():
    """Row 0 has two candidates within rounding of its true score: greater and equal may each move by up to 2."""
    greater, equal, candidates, nonfinite, _ = eager_counts()
    parity = rank_parity((greater + torch.tensor([1, 0]), equal + torch.tensor([1, 0]), candidates, nonfinite),
                         eager_counts())
    assert parity.beyond == {} and parity.problems() == [] and parity.error == 0.0
    assert parity.rounding == 1
    parity = rank_parity((greater + torch.tensor([-2, 0]), equal, candidates, nonfinite), eager_counts())
    assert parity.problems() == [] and parity.rounding == 1
    exact = rank_parity(eager_counts()[:4], eager_counts())
    assert exact.problems() == [] and exact.rounding == 0 and exact.error == 0.0


def test_rank_difference_beyond_the_band_is_rejected():
    """The same one-count difference on row 1, which has no candidate in the band; 3 on row 0 (2 in the band)."""
    greater, equal, candidates, nonfinite, _ = eager_counts()
    parity = rank_parity((greater + torch.tensor([0, 1]), equal, candidates, nonfinite), eager_counts())
    assert parity.beyond == {"greater": (1, 1)} and parity.error == 1.0 and parity.rounding == 0
    (problem,) = parity.problems()
    assert problem.startswith("greater differs from eager on 1 row(s), by up to 1 more than")
    parity = rank_parity((greater, equal + torch.tensor([3, 0]), candidates, nonfinite), eager_counts())
    assert parity.beyond == {"equal": (1, 1)} and parity.problems()[0].startswith("equal differs from eager on 1 row(s)")
    # the same difference is accepted where eager had a candidate in row 1's band
    shifted = rank_parity((greater + torch.tensor([0, 1]), equal, candidates, nonfinite), eager_counts(torch.tensor([0, 1])))
    assert shifted.problems() == [] and shifted.rounding == 1


def test_filter_counts_must_be_equal():
    """num_candidates and nonfinite depend only on the filter: no band, even with candidates near the true score."""
    greater, equal, candidates, nonfinite, _ = eager_counts()
    wide = eager_counts(torch.tensor([5, 5]))
    parity = rank_parity((greater, equal, candidates + torch.tensor([1, 0]), nonfinite), wide)
    assert parity.beyond == {"num_candidates": (1, 1)} and parity.error == 1.0
    assert parity.problems() == ["num_candidates differs from eager on 1 row(s), by up to 1, where it must be equal"]
    parity = rank_parity((greater, equal, candidates, torch.tensor([False, True])), wide)
    assert parity.problems() == ["nonfinite differs from eager on 1 row(s), by up to 1, where it must be equal"]
    parity = rank_parity((greater[:1], equal, candidates, nonfinite), wide)
    assert parity.error == float("inf") and parity.problems() == ["greater differs from eager: shape [1], eager [2]"]


def test_rank_probe_reports_rounding_and_failures():
    """run_probes on hand-made ranking probes (no compilation): the row's number, the problems and the note."""

    def rank_probe(moved: torch.Tensor) -> Probe:
        call = CompiledCall("rank_side", toy, BATCH, {"x": torch.zeros(1, 3)})  # never called: compiles nothing

        def compiled(inputs):
            greater, equal, candidates, nonfinite, _ = eager_counts()
            return greater + moved, equal, candidates, nonfinite

        return Probe(call, compiled, lambda inputs: eager_counts(), lambda n: {}, (2, 2, 2), torch.no_grad, ranks=True)

    rounded, wrong = run_probes([rank_probe(torch.tensor([1, 0])), rank_probe(torch.tensor([3, 2]))])
    assert rounded.ok and rounded.max_error == 0.0 and rounded.rounding_rows == 3
    assert not wrong.ok and wrong.max_error == 2.0 and wrong.rounding_rows == 0
    assert wrong.problems == ["greater differs from eager on 6 row(s), by up to 2 more than the row's candidates within "
                              "0.0001 x its largest |score| of the true answer's score"]
    table = format_table([rounded, wrong])
    assert "rank_side (batch 4): note: greater/equal differed from eager on 3 row(s)" in table
    assert "rank_side (batch 4): greater differs from eager on 6 row(s)" in table
    assert table.count("note:") == 1 and table.endswith("1 of 2 entry points passed; 1 FAILED")


def test_doctor_passes_the_default_run(compiled_runs, capsys):
    """No RUN_DIR: a small ConvE on UMLS; its graphs are the session fixture's, loaded from Inductor's cache."""
    assert main(["doctor", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for entry in ("rank_side", "train_kvsall", "tracin_conve_band_head", "tracin_conve_band_pair",
                  "tracin_conve_band_relation", "captured_step"):
        assert entry in out
    assert "7 of 7 entry points passed" in out
    assert "FAILED" not in out


def test_captured_step_check_passes_and_catches_a_wrong_step(compiled_runs, monkeypatch):
    runs, _ = compiled_runs
    run = load_run(runs[False], device="cpu")  # trained without compile: the captured step runs its loss as is
    check = captured_step_check(run, torch.device("cpu"))
    assert check.ok, check.problems
    assert check.entry_point == "captured_step" and check.calls == 12 and check.sizes == [128]
    assert check.max_error < 1e-5 and check.gradient_error < 1e-2

    def no_positives(rows, answers, used, batch, num_entities):  # a step that loses the labels
        return torch.zeros(batch, num_entities, dtype=torch.bool)

    monkeypatch.setattr(graphed, "label_mask", no_positives)
    wrong = captured_step_check(run, torch.device("cpu"))
    assert not wrong.ok and "an epoch's loss differs from the step by step loop's" in wrong.problems[0]
