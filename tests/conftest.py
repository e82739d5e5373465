"""Shared fixtures."""

import pytest
import torch

from kgtrace.cli import main
from kgtrace.core.config import TrainConfig
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import train


@pytest.fixture
def torch_threads():
    """Sets torch's intra-op thread count for the test (call it with a count); the count before comes back after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


TINY_CONVE_ARGS = {"embedding_dim": 16, "embedding_height": 4, "output_channels": 4}


@pytest.fixture(scope="session")
def tiny_conve(tmp_path_factory):
    """The shared tiny ConvE run: Nations, width 16, two epochs, a checkpoint (and a validation) each.

    Read it, never write into it: every test module that needs a small trained ConvE shares it.
    """
    out = tmp_path_factory.mktemp("tiny-conve") / "run"
    config = TrainConfig(dataset="nations", model="conve", model_args=dict(TINY_CONVE_ARGS), epochs=2,
                         checkpoint_every=1, eval_every=1, threads=1, device="cpu", seed=3, lr=0.01)
    train(config, out, progress=False, log=lambda *_: None)
    return out


@pytest.fixture(scope="session")
def full_run(tmp_path_factory):
    """A tiny ConvE run with every input of the report, written by the CLI commands that make them."""
    out = tmp_path_factory.mktemp("report-run")
    config = TrainConfig(dataset="nations", model="conve",
                         model_args={"embedding_dim": 16, "embedding_height": 4, "output_channels": 4}, epochs=2,
                         checkpoint_every=1, eval_every=1, threads=1, device="cpu")
    train(config, out, progress=False, log=lambda *_: None)
    assert main(["evaluate", str(out), "--out", str(out / "test_metrics.json"),
                 "--per-query", str(out / "test_ranks.tsv"), "--device", "cpu", "--no-compile"]) == 0
    ds = load_run(out).dataset
    triples = tmp_path_factory.mktemp("in") / "two.tsv"
    triples.write_text("".join(f"{ds.entity_label(h)}\t{ds.relation_label(r)}\t{ds.entity_label(t)}\n"
                               for h, r, t in ds.test[:2].tolist()))
    assert main(["explain", str(out), "--triples", str(triples), "--top-k", "3", "--method", "tracin", "--device", "cpu",
                 "--no-progress", "--out", str(out / "explain" / "test.json")]) == 0
    return out


@pytest.fixture(scope="session")
def compiled_runs(tmp_path_factory):
    """The doctor's small ConvE on UMLS (dropout and batch norm on), trained twice, eagerly and compiled.

    Batch 128 leaves a last batch of 24 queries per epoch; validation at epoch 2. The graphs
    compiled here are those ``kgtrace doctor`` compiles without RUN_DIR, so later tests load
    them from Inductor's cache instead of compiling again.
    """
    from kgtrace.workflows.doctor import TINY_CONVE

    runs, logs = {}, {}
    for compile_ in (False, True):
        out = tmp_path_factory.mktemp("compiled" if compile_ else "eager")
        config = TrainConfig(dataset="umls", model="conve", model_args=dict(TINY_CONVE), epochs=2, lr=0.01,
                             checkpoint_every=1, eval_every=2, threads=1, device="cpu", compile=compile_)
        logs[compile_] = []
        train(config, out, progress=False, log=logs[compile_].append)
        runs[compile_] = out
    return runs, logs
