"""The dataset registry: remote datasets by name, fetched from a mirror into a cache, checked, reused.

Each test builds a tiny archive of the same layout as the ConvE authors' (train/valid/test.txt with
CRLF line ends at the top of a .tar.gz) and registers it as a temporary entry; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from hetionet import write_hetionet

from kgtrace.cli import main
from kgtrace.cli.common import train_help
from kgtrace.core.errors import KgtraceError
from kgtrace.data import registry
from kgtrace.data.dataset import load_dataset
from kgtrace.data.registry import DATASETS, DatasetEntry, cached, fetch

SPLITS = {
    "train": "a\tr\tb\r\nb\tr\tc\r\nc\ts\ta\r\n",
    "valid": "a\tr\tc\r\n",
    "test": "b\ts\tc\r\n",
}


def make_archive(folder: Path, name: str = "Tiny.tar.gz", nested: str = "", kind: str = "tar") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            for split, text in SPLITS.items():
                z.writestr(f"{nested}{split}.txt", text)
        return path
    with tarfile.open(path, "w:gz") as tar:
        for split, text in SPLITS.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{nested}{split}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def register(archive: Path, tmp_path: Path, monkeypatch) -> DatasetEntry:
    """Register ``archive`` (in the mirror folder tmp_path/mirror) as the remote dataset 'tiny'; cache in tmp_path."""
    entry = DatasetEntry("tiny", "Tiny", "a test graph", "CC0", "nobody", registry._counts(3, 2, 3, 1, 1),
                         url=f"https://example.org/data/{archive.name}", sha256=sha256(archive),
                         members={split: f"{split}.txt" for split in SPLITS})
    monkeypatch.setitem(DATASETS, "tiny", entry)
    monkeypatch.setenv("KGTRACE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(registry.MIRROR_ENV, str(tmp_path / "mirror"))
    return entry


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A registered remote dataset 'tiny' whose archive sits in a mirror folder; the cache is in tmp_path."""
    return register(make_archive(tmp_path / "mirror"), tmp_path, monkeypatch)


def test_loads_by_name_from_the_mirror_and_unpacks_into_the_cache(tiny, tmp_path):
    assert cached("tiny") is None
    ds = load_dataset("tiny")
    assert (ds.name, ds.source) == ("tiny", "tiny")
    assert (len(ds.train), len(ds.valid), len(ds.test)) == (3, 1, 1)
    assert list(ds.entities.labels) == ["a", "b", "c"]
    folder = cached("tiny")
    assert folder == tmp_path / "home" / "datasets" / "tiny"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        "Tiny.tar.gz", "test.txt", "train.txt", "unpacked.sha256", "valid.txt"]
    assert (folder / "train.txt").read_bytes() == SPLITS["train"].encode()  # the member's bytes, as published


def test_a_cached_dataset_is_reused_without_the_mirror(tiny, tmp_path, monkeypatch):
    fetch("tiny")
    monkeypatch.setenv(registry.MIRROR_ENV, str(tmp_path / "gone"))
    assert len(load_dataset("tiny").train) == 3


def test_a_file_url_mirror_works(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv(registry.MIRROR_ENV, (tmp_path / "mirror").as_uri())
    assert fetch("tiny") == tmp_path / "home" / "datasets" / "tiny"


def test_a_wrong_checksum_is_refused_and_the_download_removed(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(DATASETS, "tiny", DatasetEntry(**{**tiny.__dict__, "sha256": "0" * 64}))
    with pytest.raises(KgtraceError, match="has sha256 .* but the registry expects 0000"):
        fetch("tiny")
    folder = tmp_path / "home" / "datasets" / "tiny"
    assert not list(folder.glob("Tiny.tar.gz*"))
    assert cached("tiny") is None
    assert (tmp_path / "mirror" / "Tiny.tar.gz").is_file()  # the mirror is the user's: untouched


def test_a_missing_archive_names_the_url_and_the_mirror_setting(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv(registry.MIRROR_ENV, str(tmp_path / "empty"))
    with pytest.raises(KgtraceError, match=r"could not download .*empty/Tiny.tar.gz.*KGTRACE_DATASETS_MIRROR"):
        fetch("tiny")


def test_an_interrupted_unpack_is_redone(tiny, tmp_path):
    folder = fetch("tiny")
    (folder / "unpacked.sha256").unlink()  # as a kill before the last write leaves it
    (folder / "test.txt").write_text("half")
    assert cached("tiny") is None
    assert fetch("tiny") == folder
    assert (folder / "test.txt").read_bytes() == SPLITS["test"].encode()


@pytest.mark.parametrize("kind,nested", [("tar", "Tiny/"), ("zip", ""), ("zip", "Tiny/")])
def test_archive_layouts(tmp_path, monkeypatch, kind, nested):
    register(make_archive(tmp_path / "mirror", "Tiny.archive", nested, kind), tmp_path, monkeypatch)
    assert len(load_dataset("tiny").train) == 3


def test_the_real_entries_are_complete():
    for name, entry in DATASETS.items():
        assert entry.name == name and entry.citation and entry.licence
        assert set(entry.counts) == {"entities", "relations", "train", "valid", "test"}
        if not entry.bundled:
            assert entry.url.startswith("https://") and len(entry.sha256) == 64
            if entry.graph is None:
                assert set(entry.members) == {"train", "valid", "test"}
            else:
                assert not entry.members and entry.graph.nodes_url.startswith("https://")
                assert len(entry.graph.nodes_sha256) == 64 and sum(entry.graph.fractions) == pytest.approx(1)


def test_datasets_command_lists_bundled_cached_and_fetchable(tiny, capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "umls" in out and "bundled" in out
    assert "fb15k237" in out and "272,115" in out
    assert "tiny" in out and "not fetched yet" in out
    assert main(["datasets", "--fetch", "tiny"]) == 0
    assert "cached in" in capsys.readouterr().out


def test_datasets_fetch_refuses_an_unknown_name(tiny, capsys):
    assert main(["datasets", "--fetch", "umls"]) == 2
    assert "--fetch 'umls': each value must be one of" in capsys.readouterr().err


def test_a_run_records_the_name_not_the_cache_path(tiny, tmp_path):
    from kgtrace.core.config import TrainConfig, read_yaml
    from kgtrace.runs.embedding import load_run
    from kgtrace.training.loop import train

    config = TrainConfig(dataset="tiny", model="distmult", model_args={"embedding_dim": 4}, epochs=1,
                         eval_every=1, device="cpu")
    train(config, tmp_path / "run", progress=False, log=lambda *_: None)
    assert read_yaml(tmp_path / "run" / "config.yaml")["dataset"] == "tiny"
    assert load_run(tmp_path / "run").dataset.num_entities == 3


def test_a_remote_datasets_cache_is_an_input_that_overwrite_spares(tiny, tmp_path):
    from kgtrace.data.dataset import dataset_inputs

    assert dataset_inputs("tiny") == [str(tmp_path / "home" / "datasets" / "tiny")]
    assert dataset_inputs("umls") == []


def register_graph(tmp_path: Path, monkeypatch, nodes_sha256: str | None = None,
                   fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> tuple[Path, Path]:
    """Register tests/hetionet.py's graph (in the mirror folder tmp_path/mirror) as the graph entry 'tinyhet'."""
    nodes, edges = write_hetionet(tmp_path / "mirror")
    graph = registry.GraphFiles(f"https://example.org/het/{nodes.name}", nodes_sha256 or sha256(nodes), fractions)
    entry = DatasetEntry("tinyhet", "Tiny Hetionet", "a test graph", "CC0", "nobody", registry._counts(8, 7, 9, 2, 2),
                         url=f"https://example.org/het/{edges.name}", sha256=sha256(edges), graph=graph)
    monkeypatch.setitem(DATASETS, "tinyhet", entry)
    monkeypatch.setenv("KGTRACE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(registry.MIRROR_ENV, str(tmp_path / "mirror"))
    return nodes, edges


def test_graph_entry_is_split_on_first_use(tmp_path, monkeypatch):
    """A graph published as Hetionet's nodes and edges files: both fetched and checked, split with the entry's seed,
    names, kinds and relation descriptions written beside the splits; a second load reads the cache."""
    nodes, edges = register_graph(tmp_path, monkeypatch, fractions=(0.6, 0.2, 0.2))
    ds = load_dataset("tinyhet")
    folder = cached("tinyhet")
    assert folder is not None and (folder / nodes.name).is_file() and (folder / edges.name).is_file()
    assert len(ds.train) + len(ds.valid) + len(ds.test) == 13  # 15 edges less a duplicate and an unknown node
    assert ds.relation_name("CtD") == "Compound treats Disease"
    assert ds.entity_name("Disease::DOID:1") == "scabies"
    assert ds.entity_categories["Gene::1"] == ("Gene",)
    monkeypatch.delenv(registry.MIRROR_ENV)
    again = load_dataset("tinyhet")
    assert again.train.tolist() == ds.train.tolist() and again.test.tolist() == ds.test.tolist()


def test_graph_entry_wrong_nodes_checksum(tmp_path, monkeypatch):
    nodes, edges = register_graph(tmp_path, monkeypatch, nodes_sha256="0" * 64)
    with pytest.raises(KgtraceError, match="hetionet-v1.0-nodes.tsv has sha256 .* expects 0000"):
        fetch("tinyhet")
    assert nodes.is_file()  # the mirror's file is never removed
    assert not (registry.cache_folder("tinyhet") / nodes.name).exists()


def test_the_dataset_option_names_every_registered_dataset():
    assert all(name in train_help("dataset") for name in DATASETS)
