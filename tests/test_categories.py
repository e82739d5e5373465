"""Categories by default: on a graph with node categories, a drug's `biolink:treats` candidates are diseases.

The graph (tests/drugs.py) is a small KGX export of drugs, diseases and genes with Biolink
categories; `kgtrace prepare` holds some `treats` edges out. Every command that ranks or lists
candidates restricts a relation's heads and tails to the categories it takes in training, says so
first, and takes `--restrict none`; evaluation keeps the unrestricted figures beside the others.
"""

import json
import shutil

import polars as pl
import pytest
from drugs import DISEASE, prepare_args

import kgtrace
from kgtrace.cli import main
from kgtrace.evaluation.candidates import has_categories
from kgtrace.faithfulness import FaithfulnessResult
from kgtrace.report.build import build_html
from kgtrace.report.drawing import PATH

NOTE = "restricted to the node categories it takes in training"


@pytest.fixture(scope="module")
def drugs(tmp_path_factory):
    """The prepared graph and a DistMult run trained on it (seconds)."""
    root = tmp_path_factory.mktemp("drugs")
    assert main(prepare_args(root / "kgx", root / "data")) == 0
    run = root / "run"
    config = kgtrace.TrainConfig(dataset=str(root / "data"), model="distmult", model_args={"embedding_dim": 16},
                                 epochs=20, checkpoint_every=10, eval_every=0, threads=1, device="cpu", lr=0.02)
    kgtrace.train(config, run, progress=False, log=lambda *_: None)
    return root, run


def categories(run_dir, labels):
    ds = kgtrace.load_run(run_dir).dataset
    return [set(ds.entity_categories.get(label, ())) for label in labels]


def test_predict_lists_only_diseases_for_a_drugs_treats_and_names_work(drugs, capsys):
    _, run = drugs
    capsys.readouterr()
    assert main(["predict", str(run), "--head", "metformin", "--relation", "biolink:treats", "--top-n", "60"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert NOTE in lines[0] and "--restrict none" in lines[0]
    assert lines[1].startswith("(metformin (CHEBI:6801), biolink:treats")
    assert "category" in lines[2] and all(" Disease " in line for line in lines[3:])
    found = kgtrace.predict(kgtrace.load_run(run), head="METFORMIN", relation="biolink:treats", top_n=60)
    assert all(DISEASE in cats for cats in categories(run, found.table["label"].to_list()))
    assert found.note.startswith("candidates: each relation's") and "restrict='none'" in found.note
    every = kgtrace.predict(kgtrace.load_run(run), head="CHEBI:6801", relation="biolink:treats", top_n=60,
                            restrict="none")
    assert every.note == "candidates: every entity"
    assert any(DISEASE not in cats for cats in categories(run, every.table["label"].to_list()))


def test_a_near_miss_lists_candidates_with_names_and_categories(drugs, capsys):
    _, run = drugs
    assert main(["predict", str(run), "--head", "metformn", "--relation", "biolink:treats"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'CHEBI:6801' (metformin; biolink:SmallMolecule" in err and "Traceback" not in err


def test_explain_predict_explains_new_diseases(drugs, tmp_path, capsys):
    _, run = drugs
    out = tmp_path / "why.json"
    assert main(["explain", str(run), "--predict", "metformin", "biolink:treats", "--top-n", "3", "--top-k", "2",
                 "--method", "tracin", "--out", str(out), "--no-progress"]) == 0
    assert NOTE in capsys.readouterr().out.splitlines()[0]
    items = kgtrace.Explanations.read(out)
    assert len(items) == 3 and all(item.triple.head_name == "metformin" for item in items)
    assert all(DISEASE in cats for cats in categories(run, [item.triple.tail for item in items]))


def test_evaluate_restricts_and_keeps_the_unrestricted_figures(drugs, tmp_path, capsys):
    _, run = drugs
    assert has_categories(kgtrace.load_run(run).dataset)
    out, every = tmp_path / "m.json", tmp_path / "every.json"
    assert main(["evaluate", str(run), "--out", str(out), "--device", "cpu", "--no-compile"]) == 0
    printed = capsys.readouterr().out
    assert NOTE in printed.splitlines()[0] and "against every entity" in printed
    restricted = json.loads(out.read_text())
    assert restricted["restricted"] is True and restricted["unrestricted"]["restricted"] is False
    assert main(["evaluate", str(run), "--out", str(every), "--restrict", "none", "--device", "cpu",
                 "--no-compile"]) == 0
    unrestricted = json.loads(every.read_text())
    assert "unrestricted" not in unrestricted and unrestricted["both"] == restricted["unrestricted"]["both"]
    # Fewer candidates: no true answer ranks worse among them than among every entity.
    assert restricted["both"]["realistic"]["mr"] <= unrestricted["both"]["realistic"]["mr"]


def test_run_job_and_faithfulness_rank_among_categories(drugs, tmp_path, capsys):
    root, _ = drugs
    out = tmp_path / "job"
    assert main(["run", "--dataset", str(root / "data"), "--model", "distmult", "--epochs", "10", "--explain", "1",
                 "--queries", "1", "--out", str(out), "--no-progress"]) == 0
    assert NOTE in capsys.readouterr().out
    predicted = kgtrace.Explanations.read(out / "explain" / "predicted.json")
    assert len(predicted) and all(DISEASE in cats for cats in categories(out, [i.triple.tail for i in predicted]))
    assert json.loads((out / "test_metrics.json").read_text())["restricted"] is True
    assert "by category" in (out / "report.html").read_text()
    check = tmp_path / "faith"
    assert main(["faithfulness", str(out), "--sample", "2", "--k", "1", "--methods", "random", "--out", str(check),
                 "--no-progress"]) == 0
    result = FaithfulnessResult.read(check / "faithfulness.json")
    assert "among the tails' categories" in result.predictions.how and result.settings.restrict == ()
    assert pl.read_csv(check / "faithfulness.tsv", separator="\t").height == 2


def test_score_ranks_among_categories_and_says_so(drugs, tmp_path, capsys):
    root, run = drugs
    held_out = (root / "data" / "test.txt").read_text().splitlines()
    triples = tmp_path / "t.tsv"
    triples.write_text("\n".join(held_out) + "\n")
    out, every = tmp_path / "s.json", tmp_path / "every.json"
    capsys.readouterr()
    assert main(["score", str(run), "--triples", str(triples), "--out", str(out)]) == 0
    assert NOTE in capsys.readouterr().out.splitlines()[0]
    assert main(["score", str(run), "--triples", str(triples), "--out", str(every), "--restrict", "none"]) == 0
    restricted, unrestricted = json.loads(out.read_text()), json.loads(every.read_text())
    assert NOTE in restricted["candidates"] and unrestricted["candidates"] == "candidates: every entity"
    ranks = [(a["tail_rank"], b["tail_rank"]) for a, b in zip(restricted["rows"], unrestricted["rows"], strict=True)]
    # Fewer candidates: no triple ranks worse among its relation's categories, and genes no longer crowd out diseases.
    assert all(among <= every for among, every in ranks) and any(among < every for among, every in ranks)
    python = kgtrace.score_triples(kgtrace.load_run(run), triples)
    assert python.table["tail_rank"].to_list() == [row["tail_rank"] for row in restricted["rows"]]


def test_explain_with_rules_shows_paths_in_names(drugs, tmp_path, capsys):
    root, run = drugs
    rules = tmp_path / "rules.txt"
    assert main(["rules", "learn", "--dataset", str(root / "data"), "--out", str(rules), "--rounds", "5"]) == 0
    out = tmp_path / "why.json"
    assert main(["explain", str(run), "--triple", "metformin", "biolink:treats", "type 2 diabetes mellitus",
                 "--method", "tracin", "--top-k", "2", "--rules", str(rules), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "paths in the graph that imply it" in printed
    assert "(metformin, biolink:treats, type 2 diabetes mellitus): " in printed
    assert "metformin -biolink:affects-> " in printed or "metformin -biolink:treats-> " in printed
    paths = json.loads(out.with_name("why.paths.json").read_text())
    [triple] = paths["triples"]
    assert triple["head_name"] == "metformin" and triple["rules"]
    first = triple["rules"][0]
    assert first["groundings"] and all(f["relation_name"].startswith("biolink:") for f in first["groundings"][0])
    # The report draws them beside the attributions of the same triple, and alone where they are all there is.
    folder = tmp_path / "report" / "explain"
    folder.mkdir(parents=True)
    shutil.copy(out, folder / "why.json")
    shutil.copy(out.with_name("why.paths.json"), folder / "why.paths.json")
    html = build_html(folder.parent)
    assert html.count("Paths in the graph that imply it") == 1 and "Why: paths in the graph" not in html
    assert html.count(f'stroke="{PATH}"') >= len(first["groundings"][0]) and "rule 1 (confidence" in html
    (folder / "why.json").unlink()
    html = build_html(folder.parent)
    assert "Why: paths in the graph" in html and f'stroke="{PATH}"' in html and "rule(s) predict it" in html
