import json

import pytest

from kgtrace.core.errors import DataError
from kgtrace.data import names
from kgtrace.data.names import (
    describe_predicate,
    read_categories,
    read_edge_map,
    read_edge_map_json,
    read_names,
    write_categories,
    write_edge_map,
    write_names,
)
from kgtrace.data.vocab import Vocab


def test_names_id_first_by_curie(tmp_path):
    p = tmp_path / "names.txt"
    p.write_text("MONDO:0005148\ttype 2 diabetes\nCHEBI:6801\tmetformin\n")
    assert read_names(p) == {"MONDO:0005148": "type 2 diabetes", "CHEBI:6801": "metformin"}


def test_names_name_first_by_curie(tmp_path):
    p = tmp_path / "names.txt"
    p.write_text("type 2 diabetes\tMONDO:0005148\r\nmetformin\tCHEBI:6801\r\n")
    assert read_names(p) == {"MONDO:0005148": "type 2 diabetes", "CHEBI:6801": "metformin"}


def test_names_detected_by_entities_and_filtered(tmp_path):
    # Labels without a colon: only the vocabulary can tell which column is the id.
    p = tmp_path / "names.txt"
    p.write_text("Aspirin\tdrug_1\nIbuprofen\tdrug_2\nOther\tnot_in_graph\n")
    ents = Vocab(("drug_1", "drug_2"))
    assert read_names(p, ents) == {"drug_1": "Aspirin", "drug_2": "Ibuprofen"}
    with pytest.raises(DataError, match="neither column"):
        read_names(p, Vocab(("zzz",)))


def test_names_header(tmp_path):
    p = tmp_path / "names.txt"
    p.write_text("name\tid\nfoo\tx1\n")
    assert read_names(p) == {"x1": "foo"}


def test_names_errors(tmp_path):
    p = tmp_path / "names.txt"
    p.write_text("A:1\tone\nA:2\ttwo\tthree\n")
    with pytest.raises(DataError, match=rf"{p}:2: expected 2"):
        read_names(p)
    p.write_text("A:1\tone\n\nA:1\tuno\n")
    with pytest.raises(DataError, match=rf"{p}:3: 'A:1' already has name 'one' on line 1"):
        read_names(p)


def test_names_roundtrip(tmp_path):
    names = {"drug_1": "Aspirin", "drug_2": "two words"}
    write_names(names, tmp_path / "n.txt")
    assert read_names(tmp_path / "n.txt", Vocab(("drug_1", "drug_2"))) == names


def test_edge_map_inverted(tmp_path):
    key = json.dumps({"predicate": "biolink:affects", "object_aspect_qualifier": "activity"})
    edge_map = {key: "predicate:28", json.dumps({"predicate": "biolink:treats"}): "predicate:0"}
    p = tmp_path / "edge_map.json"
    write_edge_map(edge_map, p)
    assert read_edge_map_json(p) == edge_map
    assert read_edge_map(p) == {
        "predicate:28": "biolink:affects [object_aspect_qualifier=activity]",
        "predicate:0": "biolink:treats",
    }


def test_describe_predicate_plain_key():
    assert describe_predicate("biolink:treats") == "biolink:treats"


def test_edge_map_malformed_line(tmp_path):
    p = tmp_path / "edge_map.json"
    p.write_text('{\n  "a": "predicate:0",\n  "b" "predicate:1"\n}\n')
    with pytest.raises(DataError) as e:
        read_edge_map(p)
    assert e.value.line == 3 and str(e.value).startswith(f"{p}:3: invalid JSON")


def test_edge_map_duplicate_label_line(tmp_path):
    p = tmp_path / "edge_map.json"
    p.write_text('{\n  "a": "predicate:0",\n  "b": "predicate:0"\n}\n')
    with pytest.raises(DataError, match=rf"{p}:3: relation label 'predicate:0'"):
        read_edge_map(p)


def test_categories_roundtrip(tmp_path):
    cats = {"A:1": ("biolink:Gene", "biolink:NamedThing"), "B:2": ("biolink:Disease",)}
    write_categories(cats, tmp_path / "c.tsv")
    assert (tmp_path / "c.tsv").read_text().splitlines()[0] == "A:1\tbiolink:Gene|biolink:NamedThing"
    assert read_categories(tmp_path / "c.tsv") == cats


@pytest.mark.parametrize("text", [
    "CHEBI:1\taspirin\nMONDO:2\theadache\nCHEBI:1\taspirin\n",  # a repeat of the same pair
    "aspirin\tCHEBI:1\nheadache\tMONDO:2\n",  # name first
    "CHEBI:1\tbiolink:SmallMolecule|biolink:ChemicalEntity\nMONDO:2\tbiolink:Disease||\n",
])
def test_polars_reader_equals_line_reader(tmp_path, monkeypatch, text):
    """Clean two-column files are read by polars; the result equals the line-by-line reader's."""
    path = tmp_path / "pairs.txt"
    path.write_text(text)
    entities = Vocab(("CHEBI:1", "MONDO:2"))
    fast = (read_names(path), read_names(path, entities), read_categories(path))
    assert names._pairs_fast(path) is not None
    monkeypatch.setattr(names, "_pairs_fast", lambda _: None)
    assert (read_names(path), read_names(path, entities), read_categories(path)) == fast
