"""A run's dataset cache: a hit equals parsing the files, and any change to them is a miss."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest
import torch
from test_data_registry import make_archive, register

from kgtrace.core.errors import DataWarning, KgtraceError
from kgtrace.core.layout import RunLayout
from kgtrace.data import cache, pinned
from kgtrace.data.dataset import Dataset, load_dataset
from kgtrace.data.pinned import load_pinned_dataset, pin_splits
from kgtrace.data.vocab import write_vocab

pytestmark = pytest.mark.filterwarnings("ignore::kgtrace.core.errors.DataWarning")  # make_dataset's valid.txt, on purpose

TRAIN = [("aspirin", "treats", "pain"), ("aspirin", "interacts", "warfarin"), ("warfarin", "treats", "clot"),
         ("ibuprofen", "treats", "pain"), ("ibuprofen", "interacts", "aspirin"), ("clot", "causes", "pain")]


def make_dataset(folder: Path) -> Path:
    """A dataset folder with names, categories, an edge map, and a valid triple whose entity train lacks."""
    folder.mkdir()
    (folder / "train.txt").write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in TRAIN))
    (folder / "valid.txt").write_text("aspirin\ttreats\tclot\nnewdrug\ttreats\tpain\n")
    (folder / "test.txt").write_text("ibuprofen\ttreats\tclot\n")
    (folder / "node_names.txt").write_text("aspirin\tAspirin\nwarfarin\tWarfarin\npain\tPain\n")
    (folder / "node_categories.tsv").write_text(
        "aspirin\tbiolink:NamedThing|biolink:ChemicalEntity\nwarfarin\tbiolink:NamedThing|biolink:ChemicalEntity\n"
        "pain\tbiolink:NamedThing|biolink:Disease\n")
    (folder / "edge_map.json").write_text('{"{\\"predicate\\": \\"biolink:treats\\"}": "treats"}')
    return folder


def make_run(tmp_path: Path, source: str | None = None) -> tuple[Path, str]:
    """A run folder as training leaves it (id maps, pins), for ``source`` (default: the folder of make_dataset)."""
    source = source or str(make_dataset(tmp_path / "data"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        dataset = load_dataset(source)
    run = tmp_path / "run"
    run.mkdir()
    write_vocab(dataset.entities, RunLayout(run).node_dict)
    write_vocab(dataset.relations, RunLayout(run).rel_dict)
    pin_splits(run, dataset)
    return run, source


@pytest.fixture
def cached_anything(monkeypatch):
    """Cache every dataset, however small or freshly written."""
    monkeypatch.setattr(cache, "MIN_BYTES", 0)
    monkeypatch.setattr(cache, "RACY_NS", 0)


def no_parsing(monkeypatch):
    def fail(*_):
        raise AssertionError("parsed the files although the cache holds them")
    monkeypatch.setattr(pinned, "_parse", fail)


def assert_same(a: Dataset, b: Dataset) -> None:
    assert (a.name, a.source, a.entities, a.relations) == (b.name, b.source, b.entities, b.relations)
    for split in ("train", "valid", "test"):
        assert torch.equal(getattr(a, split), getattr(b, split))
    assert list(a.entity_names.items()) == list(b.entity_names.items())
    assert list(a.entity_categories.items()) == list(b.entity_categories.items())
    assert (a.relation_names, a.edge_map) == (b.relation_names, b.edge_map)


def test_a_hit_equals_the_parsed_dataset_and_gives_its_warnings_again(tmp_path, monkeypatch, cached_anything):
    run, source = make_run(tmp_path)
    with pytest.warns(DataWarning, match="left out 1 of 2 triples") as parsed_warnings:
        parsed = load_pinned_dataset(run, source)
    assert RunLayout(run).dataset_cache.is_file()
    no_parsing(monkeypatch)
    with pytest.warns(DataWarning) as hit_warnings:
        hit = load_pinned_dataset(run, source)
    assert_same(parsed, hit)
    assert hit.entity_categories["aspirin"] == ("biolink:NamedThing", "biolink:ChemicalEntity")
    assert hit.entity_name("pain") == "Pain" and hit.relation_name("treats") == "biolink:treats"
    data = [str(w.message) for w in parsed_warnings if w.category is DataWarning]
    assert [str(w.message) for w in hit_warnings] == data


@pytest.mark.parametrize("edit", ["append", "same size"])
def test_an_edited_file_misses_the_cache(tmp_path, cached_anything, edit):
    run, source = make_run(tmp_path)
    load_pinned_dataset(run, source)
    names = Path(source) / "node_names.txt"
    text = names.read_text()
    time.sleep(0.01)  # past the file system's clock tick, so that the edit gets a new change time
    names.write_text(text + "clot\tBlood clot\n" if edit == "append" else text.replace("Pain", "Ache"))
    dataset = load_pinned_dataset(run, source)
    assert dataset.entity_name("clot" if edit == "append" else "pain") == ("Blood clot" if edit == "append" else "Ache")


def test_an_edited_split_is_still_refused_by_the_pins(tmp_path, cached_anything):
    run, source = make_run(tmp_path)
    load_pinned_dataset(run, source)
    with open(Path(source) / "test.txt", "a") as f:
        f.write("aspirin\ttreats\twarfarin\n")
    with pytest.raises(KgtraceError, match=r"test \(1 triples then, 2 now\)"):
        load_pinned_dataset(run, source)


def test_a_cache_under_another_name_of_the_same_file_misses(tmp_path, monkeypatch, cached_anything):
    run, source = make_run(tmp_path)
    load_pinned_dataset(run, source)
    os.rename(Path(source) / "test.txt", Path(source) / "test.tsv")  # another file now holds the split
    no_parsing(monkeypatch)
    with pytest.raises(AssertionError, match="parsed the files"):
        load_pinned_dataset(run, source)


def test_freshly_written_files_are_not_cached(tmp_path):
    run, source = make_run(tmp_path)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cache, "MIN_BYTES", 0)  # RACY_NS as shipped: the files are younger than it
        load_pinned_dataset(run, source)
    assert not RunLayout(run).dataset_cache.exists()


def test_small_datasets_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "RACY_NS", 0)
    run, source = make_run(tmp_path)
    load_pinned_dataset(run, source)
    assert not RunLayout(run).dataset_cache.exists()


def test_a_file_of_that_name_kgtrace_did_not_write_is_never_replaced(tmp_path, cached_anything):
    run, source = make_run(tmp_path)
    mine = RunLayout(run).dataset_cache
    mine.write_text("my notes\n")
    with pytest.warns(DataWarning):
        dataset = load_pinned_dataset(run, source)
    assert len(dataset.train) == len(TRAIN)
    assert mine.read_text() == "my notes\n"


def test_a_stale_cache_is_replaced(tmp_path, cached_anything):
    run, source = make_run(tmp_path)
    load_pinned_dataset(run, source)
    first = RunLayout(run).dataset_cache.stat().st_ino
    time.sleep(0.01)
    (Path(source) / "node_names.txt").write_text("aspirin\tASA\n")
    load_pinned_dataset(run, source)
    state = torch.load(RunLayout(run).dataset_cache, weights_only=True)
    assert RunLayout(run).dataset_cache.stat().st_ino != first and '"ASA"' in state["entity_names"]
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp") or p.name.endswith(".lock")]


def test_a_fetched_dataset_is_cached_under_its_name(tmp_path, monkeypatch, cached_anything):
    register(make_archive(tmp_path / "mirror"), tmp_path, monkeypatch)
    run, source = make_run(tmp_path, "tiny")
    parsed = load_pinned_dataset(run, source)
    no_parsing(monkeypatch)
    assert_same(parsed, load_pinned_dataset(run, source))


def test_bundled_datasets_are_not_cached(tmp_path, cached_anything):
    run, source = make_run(tmp_path, "nations")
    load_pinned_dataset(run, source)
    assert not RunLayout(run).dataset_cache.exists()
