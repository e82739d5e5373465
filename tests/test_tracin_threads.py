"""TracIn's chunks side by side (kgtrace.compute.system.side_by_side) give the serial pass, for every model,
parameter set and path.

Every model of the registry is trained here (a model added later without an entry in ARGS fails the test that
says so). On a training set of many chunks, the pass on 2 and 4 threads (two and four chunks at once, one
thread each) must give the very floats of the one-thread pass, repeatedly (a race shows as different rows or
an error in some runs, not all), and agree with the naive float64 loop.
"""

import threading

import pytest
import torch

from kgtrace.attribution import TracIn
from kgtrace.attribution.fast import fast_path
from kgtrace.attribution.rows import row_tables
from kgtrace.attribution.stream import Stream
from kgtrace.core.config import TrainConfig
from kgtrace.core.specs import model_names, spec_of
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import train

#: Small settings per model: add a model's here when it joins the registry.
ARGS = {
    "conve": {"embedding_dim": 16, "embedding_height": 4, "output_channels": 4},
    "distmult": {"embedding_dim": 16},
    "complex": {"embedding_dim": 8},
    "transe": {"embedding_dim": 16},
    "rotate": {"embedding_dim": 8, "margin": 6.0},
    "tucker": {"embedding_dim": 16, "relation_dim": 8, "input_dropout": 0.0, "hidden_dropout1": 0.0,
               "hidden_dropout2": 0.0},
    "rescal": {"embedding_dim": 8},
}
THREADS = (2, 4)
REPEATS = 3
CHUNK = 41  # 625 training rows: 16 chunks, so that every worker takes several


def paths_of(model):
    """The TracIn paths this model has: the fast one, the embedding-row one (unless the fast one is that same
    computation, as for every table model but ConvE), the general one."""
    row_form_fast = spec_of(model).factoriser == "rows"
    return [p for p, has in (("fast", fast_path(model) is not None),
                             ("rows", bool(row_tables(model)) and not row_form_fast), ("general", True)) if has]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name in model_names():
        folder = tmp_path_factory.mktemp(name)
        config = TrainConfig(dataset="umls", model=name, model_args=dict(ARGS.get(name, {})), epochs=2,
                             checkpoint_every=1, eval_every=0, threads=1, device="cpu", seed=7, lr=0.01,
                             batch_size=256)
        train(config, folder, progress=False, log=lambda *_: None)
        out[name] = load_run(folder)
    return out


def test_every_registered_model_is_covered():
    assert set(model_names()) <= set(ARGS), "add the new model's small settings to ARGS"


def cases():
    return [(m, p) for m in ARGS for p in ("last", "all")]


@pytest.mark.parametrize("model,params", cases())
def test_side_by_side_equals_serial_and_the_reference(runs, model, params, torch_threads):
    run = runs[model]
    rows = torch.arange(0, 5000, 8)  # 625 rows from all over the training set
    test = torch.cat([run.dataset.test[:3], run.dataset.train[rows[:1]]])  # one test triple is a training triple
    torch_threads(1)
    ref = TracIn(run, params=params, path="reference", train_indices=rows[::10]).influence(test)
    for path in paths_of(run.model):
        torch_threads(1)
        serial = TracIn(run, params=params, path=path, train_indices=rows, chunk_size=CHUNK)
        influence, top = serial.influence(test), serial.top_k(test, k=5)
        self_influence = serial.self_influence()
        scale = ref.abs().max().item()
        torch.testing.assert_close(influence[:, ::10], ref.float(), rtol=1e-4, atol=1e-4 * scale)
        for threads in THREADS:
            torch_threads(threads)
            side = TracIn(run, params=params, path=path, train_indices=rows, chunk_size=CHUNK)
            where = f"{model} {params} {path} on {threads} threads"
            for _ in range(REPEATS):  # a race shows in some runs, not all
                assert torch.equal(side.influence(test), influence), where
            for got, want in zip(side.top_k(test, k=5), top, strict=True):
                assert torch.equal(got.proponents, want.proponents), where
                assert torch.equal(got.opponents, want.opponents), where
                assert torch.equal(got.proponent_influence, want.proponent_influence), where
            assert torch.equal(side.self_influence(), self_influence), where


def test_chunks_run_in_the_pool_each_with_models_of_its_own(runs, torch_threads, monkeypatch):
    """The test above has teeth: its passes do run in several threads, and no two chunks share module objects."""
    run = runs["distmult"]
    seen, chunk_parts = [], Stream._chunk_parts

    def recorded(self, *args):
        models = args[-1]
        seen.append((threading.current_thread().name, tuple(id(m) for m in models)))
        return chunk_parts(self, *args)

    torch_threads(2)
    monkeypatch.setattr(Stream, "_chunk_parts", recorded)
    tracin = TracIn(run, params="all", path="general", train_indices=torch.arange(1000), chunk_size=CHUNK)
    tracin.influence(run.dataset.test[:2])
    assert {name.startswith("kgtrace-chunk") for name, _ in seen} == {True}
    # Two sets of models, one per worker, none of them the pass's own (which computed the test factors).
    assert len({models for _, models in seen}) == 2
    shared = {id(m) for m in tracin._checkpoint_models()}
    assert not shared & {i for _, models in seen for i in models}
