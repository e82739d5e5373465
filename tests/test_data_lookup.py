"""Relations named the KGX way (predicate, description, edge_map.json key) on a run trained on a prepared KGX folder."""

import json

import pytest
from badinput import run_cli

from kgtrace.data.lookup import lookup_relation, relation_matches
from kgtrace.runs.embedding import load_run

DRUGS = [f"CHEBI:{i}" for i in range(8)]
DISEASES = [f"MONDO:{i}" for i in range(8)]
PROGRESSION = {"object_aspect_qualifier": "progression"}


@pytest.fixture(scope="module")
def kgx_run(tmp_path_factory):
    """A 1-epoch DistMult run on a KGX graph where biolink:treats comes plain and with a qualifier."""
    root = tmp_path_factory.mktemp("kgx")
    nodes = [{"id": d, "category": ["biolink:ChemicalEntity"], "name": f"drug {d}"} for d in DRUGS]
    nodes += [{"id": m, "category": ["biolink:Disease"]} for m in DISEASES]
    edges = []
    for i, drug in enumerate(DRUGS):
        for j, disease in enumerate(DISEASES):
            kind = (i + j) % 3
            if kind == 0:
                edges.append({"subject": drug, "predicate": "biolink:treats", "object": disease})
            elif kind == 1:
                edges.append({"subject": drug, "predicate": "biolink:treats", "object": disease, **PROGRESSION})
            else:
                edges.append({"subject": disease, "predicate": "biolink:affects", "object": drug})
    (root / "nodes.jsonl").write_text("".join(json.dumps(n) + "\n" for n in nodes))
    (root / "edges.jsonl").write_text("".join(json.dumps(e) + "\n" for e in edges))
    data, run = root / "data", root / "run"
    code, out, err = run_cli(["prepare", "--nodes", root / "nodes.jsonl", "--edges", root / "edges.jsonl",
                              "--out", data, "--seed", "1"])
    assert code == 0, err
    code, out, err = run_cli(["train", "--dataset", data, "--out", run, "--model", "distmult", "--epochs", "1",
                              "--model-arg", "embedding_dim=8", "--eval-every", "0", "--no-progress",
                              "--device", "cpu", "--threads", "1", "--no-compile"])
    assert code == 0, err
    return run


def label_of(run_dir, description):
    ds = load_run(run_dir).dataset
    (label,) = [label for label, text in ds.relation_names.items() if text == description]
    return label


@pytest.mark.parametrize("relation", [
    "biolink:affects",  # a predicate folded into one relation
    "biolink:treats [object_aspect_qualifier=progression]",  # the description kgtrace prints
    json.dumps({"predicate": "biolink:treats", **PROGRESSION}),  # the edge_map.json key
])
def test_predict_accepts_the_kgx_names_of_a_relation(kgx_run, relation):
    code, out, err = run_cli(["predict", kgx_run, "--relation", relation, "--head", "CHEBI:0", "--device", "cpu"])
    assert code == 0, err
    description = (relation if relation.startswith("biolink:treats [") else
                   "biolink:affects" if relation == "biolink:affects" else
                   "biolink:treats [object_aspect_qualifier=progression]")
    label = label_of(kgx_run, description)
    note, query = out.splitlines()[:2]  # the dataset has node categories: its first line says the candidates are restricted
    assert note.startswith("candidates: each relation's heads and tails restricted")
    assert f", {description} ({label}), ?)" in query  # its readable name first, never the label alone


def test_a_predicate_naming_several_relations_lists_them(kgx_run):
    code, out, err = run_cli(["predict", kgx_run, "--relation", "biolink:treats", "--head", "CHEBI:0",
                              "--device", "cpu"])
    assert code == 2 and "Traceback" not in err
    plain, qualified = label_of(kgx_run, "biolink:treats"), \
        label_of(kgx_run, "biolink:treats [object_aspect_qualifier=progression]")
    assert "'biolink:treats' names 2 relations" in err
    assert f"{plain} (biolink:treats)" in err
    assert f"{qualified} (biolink:treats [object_aspect_qualifier=progression])" in err
    assert "--relation predicate:" in err


def test_a_misspelled_predicate_gets_a_close_hint(kgx_run):
    code, out, err = run_cli(["predict", kgx_run, "--relation", "biolink:affect", "--head", "CHEBI:0",
                              "--device", "cpu"])
    assert code == 2 and "did you mean 'biolink:affects'" in err


def test_explain_triple_and_score_file_accept_the_predicate(kgx_run, tmp_path):
    ds = load_run(kgx_run).dataset
    affects = ds.relations.to_id[label_of(kgx_run, "biolink:affects")]
    h, _, t = next(x for x in ds.train.tolist() if x[1] == affects)
    head, tail = ds.entity_label(h), ds.entity_label(t)
    scored = tmp_path / "q.tsv"
    scored.write_text(f"{head}\tbiolink:affects\t{tail}\n{head}\tbiolink:treats\t{tail}\n")
    code, out, err = run_cli(["score", kgx_run, "--triples", scored, "--device", "cpu"])
    assert code == 0, err
    assert "scored 1 triples, skipped 1 lines" in out
    assert f"{scored}:2: skipped: relation 'biolink:treats' names 2 relations" in err
    code, out, err = run_cli(["explain", kgx_run, "--triple", head, "biolink:affects", tail, "--top-k", "2",
                              "--device", "cpu", "--no-progress", "--out", tmp_path / "e.json"])
    assert code == 0, err
    (item,) = json.loads((tmp_path / "e.json").read_text())["explanations"]
    assert item["test"]["relation_name"] == "biolink:affects" and item["test"]["head"] == head


def test_lookup_relation_in_python(kgx_run):
    ds = load_run(kgx_run).dataset
    assert len(relation_matches(ds, "biolink:treats")) == 2
    found, problem = lookup_relation(ds, "biolink:affects")
    assert problem is None and ds.relation_name(ds.relation_label(found)) == "biolink:affects"
    assert lookup_relation(ds, ds.relation_label(0)) == (0, None)  # labels still work
    assert lookup_relation(ds, "0") == (0, None)  # and ids
    assert lookup_relation(ds, "0", allow_ids=False)[0] is None


def test_score_file_takes_labels_not_ids(kgx_run, tmp_path):
    scored = tmp_path / "q.tsv"
    scored.write_text("CHEBI:0\tbiolink:affects\tMONDO:1\n3\t0\tMONDO:1\n")  # ids are for options, not files
    code, out, err = run_cli(["score", kgx_run, "--triples", scored, "--device", "cpu"])
    assert code == 0, err
    assert f"{scored}:2: skipped: head '3': unknown entity" in err and "relation '0': unknown relation" in err


# ----------------------------------------------------------------------------- entities by name


@pytest.mark.parametrize("head", ["drug CHEBI:3", "DRUG chebi:3", "chebi:3", "3"])
def test_an_entity_is_named_by_label_id_or_name_in_any_case(kgx_run, head):
    code, out, err = run_cli(["predict", kgx_run, "--relation", "biolink:affects", "--tail", head, "--device", "cpu"])
    assert code == 0, err
    assert "CHEBI:3" in out


def test_a_near_miss_lists_candidates_with_id_name_and_category(kgx_run):
    code, out, err = run_cli(["predict", kgx_run, "--relation", "biolink:affects", "--tail", "drug CHEBI:33",
                              "--device", "cpu"])
    assert code == 2 and "Traceback" not in err
    assert "did you mean" in err and "'CHEBI:3' (drug CHEBI:3; biolink:ChemicalEntity; id" in err
    code, out, err = run_cli(["explain", kgx_run, "--triple", "drug chebi:99", "biolink:affects", "MONDO:1",
                              "--device", "cpu", "--no-progress"])
    assert code == 2 and "did you mean" in err and "id " in err
