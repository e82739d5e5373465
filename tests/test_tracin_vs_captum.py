"""benchmarks/tracin_vs_captum.py: Captum's TracInCP over every parameter is timed on two training prefixes,
its seconds extrapolated to the whole training set, and its prefix influences compared with our first columns."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def script():
    with benchmark_script("tracin_vs_captum") as module:
        yield module


def test_tracincp_all_seconds_are_the_larger_run_plus_the_left_out_triples_at_the_marginal_rate(script, monkeypatch):
    seconds = {100: 7.0, 200: 12.0}  # 5 s per 100 triples more: 0.05 s a triple, 2 s fixed
    calls = []

    def one_cell(tool, n, args, run, scratch, train_limit=None):
        calls.append((tool, n, train_limit))
        return {"seconds": seconds[train_limit], "peak_rss_mb": train_limit / 10, "n_train": 1000,
                "shape": [n, train_limit], "scores_file": f"{train_limit}.pt"}

    monkeypatch.setattr(script, "one_cell", one_cell)
    args = argparse.Namespace(cp_all_prefix=100)
    out = script.cell("captum_cp_all", 3, args, Path("run"), Path("scratch"))
    assert calls == [("captum_cp_all", 3, 100), ("captum_cp_all", 3, 200)]
    assert out["seconds_per_train_triple"] == pytest.approx(0.05)
    assert out["seconds_extrapolated"] == pytest.approx(2 + 0.05 * 1000)
    assert out["peak_rss_mb"] == 20 and out["scores_file"] == "200.pt"
    assert out["prefix_runs"] == [{"train_triples": 100, "seconds": 7.0}, {"train_triples": 200, "seconds": 12.0}]


def test_a_failed_prefix_run_is_the_cells_error(script, monkeypatch):
    monkeypatch.setattr(script, "one_cell", lambda *a, train_limit=None: {"error": f"timed out at {train_limit}"})
    out = script.cell("captum_cp_all", 1, argparse.Namespace(cp_all_prefix=8), Path("run"), Path("scratch"))
    assert out == {"error": "timed out at 8"}


def test_prefixes_longer_than_the_training_set_are_refused(script, monkeypatch):
    def one_cell(tool, n, args, run, scratch, train_limit=None):
        return {"seconds": 1.0, "peak_rss_mb": 1.0, "n_train": 150, "shape": [n, min(train_limit, 150)],
                "scores_file": "x.pt"}

    monkeypatch.setattr(script, "one_cell", one_cell)
    out = script.cell("captum_cp_all", 1, argparse.Namespace(cp_all_prefix=100), Path("run"), Path("scratch"))
    assert out == {"error": "fewer than 200 training triples: lower --cp-all-prefix"}


def test_prefix_influences_are_compared_with_our_first_columns(script, tmp_path):
    ours = torch.tensor([[1.0, -2.0, 4.0, 100.0], [0.5, 3.0, -1.0, 7.0]])
    theirs = ours[:, :3].clone()
    theirs[1, 2] += 0.04  # off by 1% of the largest of our first three columns (4.0), the rest exact
    torch.save(ours, tmp_path / "ours.pt")
    torch.save(theirs, tmp_path / "theirs.pt")
    out = script.differences(tmp_path / "theirs.pt", tmp_path / "ours.pt", columns=3)
    assert out["max_rel_diff"] == pytest.approx(0.01, rel=1e-5)
    assert out["max_elementwise_rel_diff"] == pytest.approx(0.04, rel=1e-5)
