"""Shared fixtures."""

import pytest

from kgtrace.cli import main
from kgtrace.config import TrainConfig
from kgtrace.run import load_run
from kgtrace.training.loop import train


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
    assert main(["explain", str(out), "--triples", str(triples), "--top-k", "3", "--device", "cpu", "--no-progress",
                 "--out", str(out / "explain" / "test.json")]) == 0
    return out
