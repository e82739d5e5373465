"""benchmarks/conve_first_protocol.py: the symmetrised graph, and both directions' queries under one relation."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_scripts import benchmark_script

from kgtrace.core.config import TrainConfig
from kgtrace.data.triples import read_labeled_triples
from kgtrace.training.loop import train


@pytest.fixture(scope="module")
def script():
    with benchmark_script("conve_first_protocol") as module:
        yield module


def write(folder: Path, splits: dict[str, list[str]]) -> Path:
    folder.mkdir()
    for split, rows in splits.items():
        (folder / f"{split}.txt").write_bytes("".join(f"{row}\r\n" for row in rows).encode())  # CRLF, as FB15k-237
    return folder


def test_each_triple_and_its_reverse_once_in_the_first_split_that_has_it(script, tmp_path):
    source = write(tmp_path / "source", {"train": ["a\tr\tb", "b\ts\tc", "c\ts\tb"], "valid": ["b\tr\ta"],
                                         "test": ["c\tr\ta", "a\tr\tc"]})
    script.write_symmetrised(source, tmp_path / "sym")
    read = {split: [tuple(x) for x in read_labeled_triples(tmp_path / "sym" / f"{split}.txt").tolist()]
            for split in ("train", "valid", "test")}
    assert read["train"] == [("a", "r", "b"), ("b", "r", "a"), ("b", "s", "c"), ("c", "s", "b")]
    assert read["valid"] == []  # b r a is a training triple already
    assert read["test"] == [("c", "r", "a"), ("a", "r", "c")]


def test_the_protocol_asks_both_directions_under_the_relation(script, tmp_path):
    entities = [f"e{i}" for i in range(12)]
    train_rows = [f"{entities[i]}\tr{i % 2}\t{entities[(i + 1) % 12]}" for i in range(12)]
    train_rows += [f"{entities[i]}\tr{i % 2}\t{entities[(i + 5) % 12]}" for i in range(12)]
    source = write(tmp_path / "source", {"train": train_rows, "valid": ["e0\tr0\te3"],
                                         "test": ["e1\tr1\te4", "e2\tr0\te7", "e3\tr1\tnew"]})
    script.write_symmetrised(source, tmp_path / "sym")
    config = TrainConfig(dataset=str(tmp_path / "sym"), model="distmult", model_args={"embedding_dim": 8},
                         epochs=2, batch_size=16, eval_every=0, threads=1, device="cpu")
    train(config, tmp_path / "run", progress=False, log=lambda *_: None)
    result = script.first_protocol(tmp_path / "run", source)
    assert (result["test_triples"], result["ranked"]) == (3, 2)  # "new" never occurs in training
    both = result["all"]["mrr"]
    assert both == pytest.approx((result["tail_queries"]["mrr"] + result["head_queries"]["mrr"]) / 2)
    assert 0 < both <= 1
