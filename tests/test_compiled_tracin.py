"""TracIn(compile=True): influences within 1e-4 of eager, one compilation for every checkpoint and chunk.

ConvE is the session's compiled UMLS run (conftest.py ``compiled_runs``: two epoch checkpoints),
whose band graphs ``kgtrace doctor`` compiles too; DistMult (rows and general paths) is a
small run of its own.
"""

from __future__ import annotations

import pytest
import torch

from kgtrace.attribution import TracIn
from kgtrace.attribution import tracin as tracin_module
from kgtrace.core.config import TrainConfig
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import train


def relative(got, expected):
    return float((got - expected).abs().max() / expected.abs().max())


@pytest.fixture(scope="module")
def conve(compiled_runs):
    runs, _ = compiled_runs
    return load_run(runs[True])


@pytest.fixture(scope="module")
def distmult(tmp_path_factory):
    out = tmp_path_factory.mktemp("distmult")
    config = TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 8}, epochs=2,
                         checkpoint_every=1, eval_every=0, threads=1, device="cpu", lr=0.05)
    train(config, out, progress=False, log=lambda *_: None)
    return load_run(out)


def test_conve_fast_path(conve):
    test = conve.dataset.test[:4]
    eager = TracIn(conve)
    compiled = TracIn(conve, compile=True)
    assert compiled.chunk_size == 4096 and len(compiled.train) == 5216  # two chunks, the last one padded
    expected = eager.influence(test)
    got = compiled.influence(test)
    assert relative(got, expected) < 1e-4
    assert [t.proponents.tolist() for t in compiled.top_k(test, 5)] == [t.proponents.tolist() for t in eager.top_k(test, 5)]
    assert relative(compiled.self_influence(), eager.self_influence()) < 1e-4
    calls = compiled.compiled.calls  # fc's input in bands: per distinct head, pair and relation
    assert [c.name for c in calls] == [f"tracin_conve_band_{k}" for k in ("head", "pair", "relation")]
    for call in calls:
        stats = call.stats
        assert call.batch_size == 128
        if call.name.endswith("relation"):  # every relation id once per checkpoint's model, then reused
            assert stats.calls == 2 and stats.input_sizes == {2 * conve.dataset.num_relations}
            continue
        # Two checkpoints x (test factors + two chunks) x three passes, each with its own number of rows.
        assert stats.calls == 16 and len(stats.input_sizes) > 2
        assert stats.compilations == 1 and stats.recompilations == 0 and stats.graph_breaks == 0


def test_conve_every_parameter_forward_and_reverse(conve, monkeypatch):
    test = conve.dataset.test[:2]
    expected = TracIn(conve, params="all", train_indices=range(0, 5216, 7)).influence(test)
    for forward_mode in (True, False):
        monkeypatch.setattr(tracin_module, "_FORWARD_MODE", forward_mode)
        compiled = TracIn(conve, params="all", train_indices=range(0, 5216, 7), compile=True)
        assert relative(compiled.influence(test), expected) < 1e-4
        names = {c.name for c in compiled.compiled.calls}  # both modes in bands
        assert names == {"tracin_conve_band_head", "tracin_conve_band_pair", "tracin_conve_band_relation"}
        assert all(c.stats.recompilations == 0 for c in compiled.compiled.calls)


@pytest.mark.parametrize("path", ["fast", "general"])
def test_distmult_paths(distmult, path):
    test = distmult.dataset.test[:5]
    eager = TracIn(distmult, params="all", path=path, chunk_size=300)
    compiled = TracIn(distmult, params="all", path=path, chunk_size=300, compile=True)
    assert relative(compiled.influence(test), eager.influence(test)) < 1e-4
    (call,) = compiled.compiled.calls
    assert call.name == ("tracin_rows" if path == "fast" else "tracin_general")
    stats = call.stats
    assert stats.input_sizes == {5, 300, len(distmult.dataset.train) % 300}  # test, chunks, last chunk (padded)
    assert stats.compilations == 1 and stats.recompilations == 0


def test_held_factors_survive_later_calls(distmult):
    """TracIn keeps each checkpoint's test factors for a whole pass: later calls must not change them."""
    tracin = TracIn(distmult, params="all", chunk_size=300, compile=True)
    model, names = tracin._checkpoint_models()[0], tracin.names
    held = tracin.compiled.row_factors(model, distmult.dataset.test[:5], names)
    assert held.dense is None and set(held.rows) == {"entity", "relation"}  # DistMult: tables only
    kept = {space: grads.clone() for space, (_, grads) in held.rows.items()}
    for start in range(0, 900, 300):
        tracin.compiled.row_factors(model, distmult.dataset.train[start:start + 300], names)
    assert all(torch.equal(held.rows[space][1], grads) for space, grads in kept.items())
    assert tracin.compiled.calls[0].stats.recompilations == 0


def test_explain_writes_counters_beside_its_output(conve, tmp_path):
    import json

    from kgtrace.cli import main

    out = tmp_path / "explain.json"
    assert main(["explain", str(conve.path), "--test", "2", "--top-k", "3", "--compile", "--device", "cpu",
                 "--no-progress", "--out", str(out)]) == 0
    entries = json.loads((tmp_path / "explain.compile_stats.json").read_text())["entry_points"]
    assert [e["entry_point"] for e in entries] == [f"tracin_conve_band_{k}" for k in ("head", "pair", "relation")]
    for entry in entries:
        assert entry["compilations"] == 1 and entry["recompilations"] == 0
        # 2 checkpoints x (test + 2 chunks); the relation band once per checkpoint, for every relation id
        assert entry["calls"] == (2 if entry["entry_point"].endswith("relation") else 6)
    eager = tmp_path / "eager.json"
    assert main(["explain", str(conve.path), "--test", "2", "--top-k", "3", "--method", "tracin", "--device", "cpu",
                 "--no-progress", "--out", str(eager)]) == 0
    got, expected = json.loads(out.read_text()), json.loads(eager.read_text())
    assert [[e["train_index"] for e in item["proponents"]] for item in got["explanations"]] == \
        [[e["train_index"] for e in item["proponents"]] for item in expected["explanations"]]
