import json
from pathlib import Path

import numpy as np
import pytest
from hetionet import write_hetionet

from kgtrace.cli import main
from kgtrace.core.errors import ConfigError, DataError
from kgtrace.data.dataset import load_dataset
from kgtrace.data.prepare import prepare
from kgtrace.data.triples import read_labeled_triples

UMLS_TRAIN = str(Path(__file__).parents[1] / "src/kgtrace/data/bundled/umls/train.txt")


def test_prepare_triples_roundtrip(tmp_path):
    src = tmp_path / "kg.tsv"
    rows = read_labeled_triples(UMLS_TRAIN)
    src.write_text("subject\tpredicate\tobject\n" + "".join("\t".join(r) + "\n" for r in rows) + "\t".join(rows[0]) + "\n")
    out = tmp_path / "out"
    report = prepare(out, triples=str(src), drop_predicates=["isa"], seed=5)
    n_isa = int((rows[:, 1] == "isa").sum())
    assert report.read == len(rows) + 1 and report.duplicates == (0 if rows[0][1] == "isa" else 1)
    assert report.dropped_predicate == n_isa + (1 if rows[0][1] == "isa" else 0)
    ds = load_dataset(out)
    assert (len(ds.train), len(ds.valid), len(ds.test)) == (report.train, report.valid, report.test)
    assert report.train + report.valid + report.test == len(rows) - n_isa
    assert "isa" not in ds.relations.labels
    assert (ds.num_entities, ds.num_relations) == (report.entities, report.relations)
    assert set(ds.valid[:, 0].tolist()) <= set(ds.train[:, 0].tolist()) | set(ds.train[:, 2].tolist())
    assert "prepared" in report.summary() and str(out.resolve()) in report.summary()
    # Same seed, same folder contents.
    again = tmp_path / "again"
    prepare(again, triples=str(src), drop_predicates=["isa"], seed=5)
    assert (again / "test.txt").read_bytes() == (out / "test.txt").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_prepare_refuses_non_empty_folder(tmp_path):
    src = tmp_path / "kg.tsv"
    src.write_text("a\tr\tb\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(ConfigError, match="not empty"):
        prepare(out, triples=str(src))
    assert (out / "keep.txt").read_text() == "user data"


def test_prepare_overwrite_replaces_only_its_own_folder(tmp_path):
    src = tmp_path / "kg.tsv"
    src.write_text("".join(f"e{i}\tr\te{(i + 1) % 30}\ne{i}\ts\te{(i + 7) % 30}\n" for i in range(30)))
    out = tmp_path / "out"
    prepare(out, triples=str(src), fractions=(0.5, 0.25, 0.25))
    (out / "old.txt").write_text("x")  # a file the user put into kgtrace's folder stays
    (out / "node_dict").unlink()  # one of kgtrace's, gone: written again
    report = prepare(out, triples=str(src), overwrite=True)
    assert (out / "old.txt").read_text() == "x" and (out / "node_dict").is_file() and (out / ".kgtrace").is_file()
    assert report.kept == ("old.txt",)
    assert len(load_dataset(out).all_triples()) == 60
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "old.txt").write_text("x")
    with pytest.raises(ConfigError, match="not written by kgtrace"):
        prepare(mine, triples=str(src), overwrite=True)
    assert (mine / "old.txt").read_text() == "x"


def test_prepare_collects_all_problems(tmp_path):
    with pytest.raises(ConfigError) as e:
        prepare(tmp_path / "o", nodes="missing_nodes.tsv", split="weird", fractions=(0.5, 0.5), seed="x")
    problems = e.value.problems
    assert any("input:" in p for p in problems)
    assert any("nodes:" in p and "not found" in p for p in problems)
    assert any("split:" in p for p in problems)
    assert any("seed:" in p for p in problems)
    assert len(problems) >= 4
    with pytest.raises(ConfigError, match="holdout_predicate"):  # from Python: the keyword argument
        prepare(tmp_path / "o", triples=UMLS_TRAIN, split="predicate")
    with pytest.raises(ConfigError, match="no triples left"):
        prepare(tmp_path / "o", triples=UMLS_TRAIN, drop_predicates=list(set(read_labeled_triples(UMLS_TRAIN)[:, 1])))
    assert not (tmp_path / "o").exists()


def test_prepare_kgx_predicate_holdout(tmp_path):
    nodes = [{"id": f"D:{i}", "category": ["biolink:Drug"], "name": f"drug {i}"} for i in range(12)]
    nodes += [{"id": f"M:{i}", "category": ["biolink:Disease"]} for i in range(12)]
    nodes += [{"id": "G:1", "category": ["biolink:Gene"]}]
    edges = []
    for i in range(12):
        edges.append({"subject": f"D:{i}", "predicate": "biolink:treats", "object": f"M:{(i * 5) % 12}"})
        edges.append({"subject": f"D:{i}", "predicate": "biolink:related_to", "object": f"M:{i}"})
        edges.append({"subject": f"M:{i}", "predicate": "biolink:related_to", "object": f"D:{(i + 1) % 12}"})
        edges.append({"subject": f"D:{i}", "predicate": "biolink:affects", "object": "G:1",
                      "object_aspect_qualifier": "activity"})
    (tmp_path / "nodes.jsonl").write_text("".join(json.dumps(n) + "\n" for n in nodes))
    (tmp_path / "edges.jsonl").write_text("".join(json.dumps(e) + "\n" for e in edges))
    names = tmp_path / "names.txt"
    names.write_text("M:0\tmigraine\n")
    out = tmp_path / "out"
    report = prepare(out, nodes=str(tmp_path / "nodes.jsonl"), edges=str(tmp_path / "edges.jsonl"),
                     category_pairs=[("biolink:Drug", "biolink:Disease")], split="predicate",
                     holdout_predicate="biolink:treats", names=str(names), seed=1)
    assert report.dropped_category == 12 and report.read == 48
    ds = load_dataset(out)
    assert report.test == len(ds.test) > 0
    treats = [label for label, text in ds.relation_names.items() if text == "biolink:treats"]
    assert len(treats) == 1
    assert set(ds.test[:, 1].tolist()) == {ds.relations.to_id[treats[0]]}
    assert ds.relations.to_id[treats[0]] not in set(ds.train[:, 1].tolist())
    assert ds.entity_name("D:3") == "drug 3" and ds.entity_name("M:0") == "migraine"
    assert ds.entity_categories["M:1"] == ("biolink:Disease",)
    assert (out / "edge_map.json").is_file() and (out / "node_categories.tsv").is_file()
    test_labels = np.array([[ds.entity_label(h), ds.entity_label(t)] for h, _, t in ds.test.tolist()])
    assert all(lab.startswith("D:") for lab in test_labels[:, 0])


def test_prepare_input_folder_and_empty_file_are_named(tmp_path):
    folder = tmp_path / "kg"
    folder.mkdir()
    with pytest.raises(ConfigError) as e:
        prepare(tmp_path / "o", triples=str(folder))
    assert "is a folder" in str(e.value) and "not found" not in str(e.value) and "labelled triples" in str(e.value)
    empty = tmp_path / "empty.tsv"
    empty.write_text("# nothing yet\n")
    with pytest.raises(DataError) as e:
        prepare(tmp_path / "o", triples=str(empty))
    assert e.value.path == str(empty) and "no triples" in e.value.problem
    assert not (tmp_path / "o").exists()


def test_prepare_hetionet_holding_out_treats(tmp_path, capsys):
    """`kgtrace prepare` reads Hetionet's own files; --holdout-predicate takes a metaedge abbreviation."""
    nodes, edges = write_hetionet(tmp_path / "in")
    out = tmp_path / "het"
    assert main(["prepare", "--nodes", str(nodes), "--edges", str(edges), "--out", str(out), "--split", "predicate",
                 "--holdout-predicate", "CtD", "--fractions", "0.8,0.0,0.2", "--holdout-fraction", "0.5"]) == 0
    assert "read 15 edges" in capsys.readouterr().out
    ds = load_dataset(out)
    treats = ds.relations.to_id["CtD"]
    assert set(ds.test[:, 1].tolist()) == {treats} and len(ds.test) >= 1
    assert ds.relation_name("CtD") == "Compound treats Disease"
    assert ds.entity_name("Compound::DB00001") == "permethrin"
    assert ds.entity_categories["Disease::DOID:1"] == ("Disease",)
