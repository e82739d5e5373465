import gzip
import json

import pytest
from hetionet import EDGES as HETIONET_EDGES
from hetionet import write_hetionet

from kgtrace.core.errors import ConfigError, DataError
from kgtrace.data import kgx
from kgtrace.data.kgx import read_kgx

NODES = [
    {"id": "CHEBI:1", "name": "aspirin", "category": ["biolink:SmallMolecule", "biolink:ChemicalEntity"]},
    {"id": "CHEBI:2", "name": "ibuprofen", "category": ["biolink:ChemicalEntity"]},
    {"id": "MONDO:1", "name": "headache", "category": ["biolink:Disease"]},
    {"id": "NCBIGene:1", "category": ["biolink:Gene"]},
]
EDGES = [
    {"subject": "CHEBI:1", "predicate": "biolink:treats", "object": "MONDO:1"},
    {"subject": "MONDO:1", "predicate": "biolink:related_to", "object": "CHEBI:2"},  # reverse direction
    {"subject": "CHEBI:1", "predicate": "biolink:affects", "object": "NCBIGene:1",
     "object_aspect_qualifier": "activity", "object_direction_qualifier": "decreased"},
    {"subject": "CHEBI:2", "predicate": "biolink:affects", "object": "NCBIGene:1",
     "object_aspect_qualifier": "activity", "object_direction_qualifier": "decreased"},
    {"subject": "CHEBI:2", "predicate": "biolink:affects", "object": "NCBIGene:1"},
    {"subject": "CHEBI:1", "predicate": "biolink:subclass_of", "object": "CHEBI:2"},
    {"subject": "CHEBI:1", "predicate": "biolink:treats", "object": "MONDO:404"},  # unknown node
    {"subject": "CHEBI:1", "predicate": "biolink:treats", "object": "MONDO:1"},  # duplicate
]


def write_jsonl(tmp_path, nodes=NODES, edges=EDGES, gz=False):
    n, e = tmp_path / "nodes.jsonl", tmp_path / ("edges.jsonl.gz" if gz else "edges.jsonl")
    n.write_text("".join(json.dumps(x) + "\n" for x in nodes))
    data = "".join(json.dumps(x) + "\n" for x in edges).encode()
    e.write_bytes(gzip.compress(data) if gz else data)
    return n, e


def write_tsv(tmp_path, nodes=NODES, edges=EDGES):
    n, e = tmp_path / "nodes.tsv", tmp_path / "edges.tsv"
    n.write_text("id\tcategory\tname\n" + "".join(
        f"{x['id']}\t{'|'.join(x['category'])}\t{x.get('name', '')}\n" for x in nodes))
    cols = ["subject", "predicate", "object", "knowledge_source", "object_aspect_qualifier",
            "object_direction_qualifier"]
    e.write_text("\t".join(cols) + "\n" + "".join(
        "\t".join(x.get(c, "infores:x" if c == "knowledge_source" else "") for c in cols) + "\n" for x in edges))
    return n, e


@pytest.fixture(params=["tsv", "tsv-slow", "jsonl", "jsonl-slow", "jsonl.gz"])
def files(request, tmp_path, monkeypatch):
    # "-slow": force the line-by-line parsers, which must give the same results as polars.
    if request.param.endswith("slow"):
        monkeypatch.setattr(kgx, "_parse_tsv_fast", lambda *a: None)
        monkeypatch.setattr(kgx, "_parse_jsonl_fast", lambda *a: None)
    if request.param.startswith("tsv"):
        return write_tsv(tmp_path)
    return write_jsonl(tmp_path, gz=request.param.endswith("gz"))


def test_fast_parsers_used_on_clean_input(tmp_path, monkeypatch):
    def slow(*args):
        raise AssertionError("slow parser used")
    monkeypatch.setattr(kgx, "_parse_tsv_slow", slow)
    monkeypatch.setattr(kgx, "_parse_jsonl_slow", slow)
    assert read_kgx(*write_tsv(tmp_path)).report["kept"] == 6
    assert read_kgx(*write_jsonl(tmp_path)).report["kept"] == 6


def test_fields_first_seen_late_in_a_jsonl_block_are_kept(tmp_path):
    """polars before 1.32 inferred a JSON-lines schema from the first lines only, whatever it was asked: a
    qualifier or a name first seen after them was dropped without a word."""
    genes = [{"id": f"NCBIGene:{i}", "category": ["biolink:Gene"]} for i in range(2, 1002)]
    nodes = [*NODES, *genes, {"id": "NCBIGene:1002", "name": "late", "category": ["biolink:Gene"]}]
    edges = [{"subject": "CHEBI:1", "predicate": "biolink:affects", "object": g["id"]} for g in genes]
    edges.append({"subject": "CHEBI:2", "predicate": "biolink:affects", "object": "NCBIGene:1002",
                  "object_aspect_qualifier": "activity"})
    cut = read_kgx(*write_jsonl(tmp_path, nodes=nodes, edges=edges))
    assert list(cut.edge_map) == ['{"predicate": "biolink:affects"}',
                                  '{"predicate": "biolink:affects", "object_aspect_qualifier": "activity"}']
    assert cut.names["NCBIGene:1002"] == "late"


def test_folding_and_counts(files):
    cut = read_kgx(*files, drop_predicates=["biolink:subclass_of"])
    assert cut.report == {"edges_read": 8, "kept": 5, "dropped_predicate": 1, "dropped_category": 0,
                          "dropped_unknown_node": 1, "duplicates": 1, "nodes_read": 4}
    assert cut.triples.dtype == object and cut.triples.shape == (5, 3)
    relations = cut.triples[:, 1].tolist()
    assert relations == ["predicate:0", "predicate:1", "predicate:2", "predicate:2", "predicate:3"]
    affects = json.dumps({"predicate": "biolink:affects", "object_aspect_qualifier": "activity",
                          "object_direction_qualifier": "decreased"})
    assert cut.edge_map[affects] == "predicate:2"
    assert cut.edge_map[json.dumps({"predicate": "biolink:affects"})] == "predicate:3"
    assert cut.names == {"CHEBI:1": "aspirin", "CHEBI:2": "ibuprofen", "MONDO:1": "headache"}
    assert cut.categories["CHEBI:1"] == ("biolink:SmallMolecule", "biolink:ChemicalEntity")


def test_without_folding(files):
    cut = read_kgx(*files, fold_qualifiers=False)
    assert cut.edge_map == {}
    assert sorted(set(cut.triples[:, 1])) == ["biolink:affects", "biolink:related_to", "biolink:subclass_of",
                                              "biolink:treats"]
    assert cut.report["kept"] == 5  # the two qualified affects edges of CHEBI:2 collapse into one


def test_category_pairs_both_directions(files):
    cut = read_kgx(*files, category_pairs=[("biolink:ChemicalEntity", "biolink:Disease")])
    assert sorted(map(tuple, cut.triples.tolist())) == [
        ("CHEBI:1", "predicate:0", "MONDO:1"), ("MONDO:1", "predicate:1", "CHEBI:2")]
    assert cut.report["dropped_category"] == 4
    assert set(cut.names) == {"CHEBI:1", "CHEBI:2", "MONDO:1"}  # only nodes of kept triples


def test_category_pair_any_of_several(files):
    cut = read_kgx(*files, category_pairs=[("biolink:SmallMolecule", "biolink:Gene")], fold_qualifiers=False)
    assert cut.triples.tolist() == [["CHEBI:1", "biolink:affects", "NCBIGene:1"]]


def test_bad_pairs_config_error(files):
    with pytest.raises(ConfigError, match="--category-pair"):
        read_kgx(*files, category_pairs=[("biolink:Gene",)])


def test_tsv_missing_column(tmp_path):
    n, e = write_tsv(tmp_path)
    e.write_text("subject\tobject\nA\tB\n")
    with pytest.raises(DataError) as err:
        read_kgx(n, e)
    assert err.value.line == 1 and "'predicate'" in str(err.value) and str(e) in str(err.value)


def test_tsv_empty_required_field_line(tmp_path):
    n, e = write_tsv(tmp_path)
    lines = e.read_text().splitlines()
    lines[3] = "CHEBI:1\t\tMONDO:1\tinfores:x\t\t"
    e.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as err:
        read_kgx(n, e)
    assert err.value.line == 4 and "'predicate' is empty" in str(err.value)


def test_tsv_extra_field_and_non_utf8_lines(tmp_path):
    n, e = write_tsv(tmp_path)
    lines = e.read_text().splitlines()
    e.write_text("\n".join([*lines[:2], lines[2] + "\textra", *lines[3:]]) + "\n")
    with pytest.raises(DataError, match=rf"{e}:3: found 7"):
        read_kgx(n, e)
    e.write_bytes(("\n".join(lines[:5]) + "\n").encode() + b"CHEBI:1\tbiolink:treats\tMONDO:\xff1\n")
    with pytest.raises(DataError, match=rf"{e}:6: .*UTF-8"):
        read_kgx(n, e)


def test_tsv_blank_line_and_crlf_accepted(tmp_path):
    n, e = write_tsv(tmp_path)
    e.write_bytes(e.read_bytes().replace(b"\n", b"\r\n").replace(b"\r\n", b"\r\n\r\n", 2))
    cut = read_kgx(n, e, drop_predicates=["biolink:subclass_of"])
    assert cut.report["kept"] == 5


def test_tsv_batches_cross_chunks(tmp_path, monkeypatch):
    # Line numbers must stay right across batch boundaries.
    monkeypatch.setattr(kgx, "BLOCK_BYTES", 60)  # two or three lines a block
    n, e = write_tsv(tmp_path)
    assert read_kgx(n, e).report["edges_read"] == 8
    lines = e.read_text().splitlines()
    lines[7] = "CHEBI:1\tbiolink:treats"  # line 8, third batch
    e.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as err:
        read_kgx(n, e)
    assert err.value.line == 8 and "'object' is empty" in str(err.value)


def test_jsonl_missing_field_and_bad_json(tmp_path):
    n, e = write_jsonl(tmp_path, edges=[EDGES[0], {"subject": "CHEBI:1", "object": "MONDO:1"}])
    with pytest.raises(DataError) as err:
        read_kgx(n, e)
    assert err.value.line == 2 and "'predicate' is missing" in str(err.value)
    e.write_text(json.dumps(EDGES[0]) + "\n\n{not json\n")
    with pytest.raises(DataError, match=rf"{e}:3: invalid JSON"):
        read_kgx(n, e)
    n.write_text(json.dumps({"id": "X:1", "name": "x"}) + "\n")
    with pytest.raises(DataError, match=rf"{n}:1: the required field 'category' is missing"):
        read_kgx(n, e)


def test_unknown_extension(tmp_path):
    n, e = write_tsv(tmp_path)
    other = tmp_path / "edges.csv"
    other.write_text(e.read_text())
    with pytest.raises(DataError, match="extension"):
        read_kgx(n, other)


def test_jsonl_bom_string_category_duplicate_node(tmp_path):
    n, e = write_jsonl(tmp_path)
    nodes = [{**x, "category": "|".join(x["category"])} for x in NODES] + [{"id": "CHEBI:1", "category": "X:Y"}]
    n.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(x) + "\r\n" for x in nodes).encode())
    cut = read_kgx(n, e, category_pairs=[("biolink:ChemicalEntity", "biolink:Gene")])
    assert cut.report["nodes_read"] == 5 and cut.report["kept"] == 3
    assert cut.categories["CHEBI:1"] == ("biolink:SmallMolecule", "biolink:ChemicalEntity")


@pytest.mark.parametrize("edges", ["", "subject\tpredicate\tobject\n"])
def test_empty_edges_file_is_named(tmp_path, edges):
    n, e = write_tsv(tmp_path)
    e.write_text(edges)
    with pytest.raises(DataError) as err:
        read_kgx(n, e)
    assert err.value.path == str(e) and ("no edges" in err.value.problem or err.value.line == 1)


def test_empty_jsonl_edges_and_nodes_files_are_named(tmp_path):
    n, e = write_jsonl(tmp_path)
    e.write_text("\n")
    with pytest.raises(DataError) as err:
        read_kgx(n, e)
    assert err.value.path == str(e) and "no edges" in err.value.problem and "one JSON object per line" in err.value.fix
    n.write_text("")
    with pytest.raises(DataError) as err:
        read_kgx(n, e)
    assert err.value.path == str(n) and "no nodes" in err.value.problem


def test_hetionet_format(tmp_path):
    """Hetionet's files read as KGX: kinds are categories, metaedges the relations, described in edge_map."""
    nodes, edges = write_hetionet(tmp_path)
    cut = read_kgx(nodes, edges)
    assert cut.report["edges_read"] == len(HETIONET_EDGES)
    assert (cut.report["duplicates"], cut.report["dropped_unknown_node"], cut.report["kept"]) == (1, 1, 13)
    assert ["Compound::DB00001", "CtD", "Disease::DOID:1"] in cut.triples.tolist()
    assert cut.names["Disease::DOID:1"] == "scabies"
    assert cut.categories["Side Effect::C1"] == ("Side Effect",)
    assert cut.edge_map[json.dumps({"predicate": "Compound treats Disease"})] == "CtD"
    assert set(cut.edge_map.values()) == {"CtD", "CbG", "DaG", "GiG", "Gr>G", "CcSE", "CrC"}
    restricted = read_kgx(nodes, edges, category_pairs=[("Compound", "Disease")])
    assert sorted(set(restricted.triples[:, 1].tolist())) == ["CtD"] and restricted.report["kept"] == 3


def test_hetionet_header_typo_names_both_layouts(tmp_path):
    nodes, edges = write_hetionet(tmp_path)
    edges.write_bytes(gzip.compress(b"source\tmeta_edge\ttarget\nGene::1\tGiG\tGene::2\n"))
    with pytest.raises(DataError, match=r"sif.gz:1: the header has no 'subject'.*columns: source, meta_edge, target"
                       r".*Hetionet's.*source, metaedge, target"):
        read_kgx(nodes, edges)
