"""kgtrace predict and score: candidates ranked with names and membership, triples scored with filtered ranks."""

import json
import shutil
from importlib import resources

import pytest
import torch

from kgtrace.cli import main
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError, DataError
from kgtrace.data.names import write_categories, write_names
from kgtrace.evaluation.evaluate import rank_queries
from kgtrace.evaluation.predict import predict, score_triples
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """DistMult on a copy of Nations with readable names and two node categories (even / odd entity ids)."""
    data = tmp_path_factory.mktemp("nations")
    for split in ("train", "valid", "test"):
        with resources.as_file(resources.files("kgtrace.data.bundled") / "nations" / f"{split}.txt") as p:
            shutil.copy(p, data / f"{split}.txt")
    labels = sorted({x for split in ("train", "valid", "test")
                     for line in (data / f"{split}.txt").read_text().splitlines() for x in line.split("\t")[::2]})
    write_names({label: f"The {label}" for label in labels}, data / "node_names.txt")
    write_categories({label: (f"cat:{'even' if i % 2 == 0 else 'odd'}",) for i, label in enumerate(labels)},
                     data / "node_categories.tsv")
    out = tmp_path_factory.mktemp("run")
    config = TrainConfig(dataset=str(data), model="distmult", model_args={"embedding_dim": 16}, epochs=2,
                         eval_every=0, threads=1, device="cpu", seed=0, lr=0.01)
    train(config, out, progress=False, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def run(run_dir):
    return load_run(run_dir)


def known_answers(ds, split, anchor, relation, side):
    a, b = (0, 2) if side == "tail" else (2, 0)
    return {int(t[b]) for t in getattr(ds, split) if int(t[a]) == anchor and int(t[1]) == relation}


def test_tail_candidates_are_score_t_sorted_with_membership(run):
    ds = run.dataset
    h, r, t = ds.test[0].tolist()
    found = predict(run, head=ds.entity_label(h), relation=ds.relation_label(r), top_n=ds.num_entities)
    table = found.table
    assert found.query.to_dict() == {"head": ds.entity_label(h), "relation": ds.relation_label(r),
                                     "relation_name": ds.relation_name(ds.relation_label(r)), "tail": None,
                                     "side": "tail"}
    expected = run.model.score_t(torch.tensor([[h, r]]))[0].detach()
    assert sorted(table["id"].to_list()) == list(range(ds.num_entities))
    torch.testing.assert_close(torch.tensor(table["score"].to_list()), expected[table["id"].to_list()])
    assert table["score"].to_list() == sorted(table["score"].to_list(), reverse=True)
    assert table["rank"].to_list() == list(range(1, ds.num_entities + 1))
    for split in ("train", "valid", "test"):
        answers = known_answers(ds, split, h, r, "tail")
        assert {i for i, flag in zip(table["id"], table[f"in_{split}"]) if flag} == answers
    row = table.row(table["id"].to_list().index(t), named=True)
    assert row["in_test"] and row["known"] and row["label"] == ds.entity_label(t)
    assert row["name"] == f"The {row['label']}" and row["categories"] in ("cat:even", "cat:odd")


def test_head_candidates_are_score_h(run):
    ds = run.dataset
    h, r, t = ds.test[1].tolist()
    found = predict(run, relation=r, tail=t, top_n=5)  # ids work as well as labels
    expected = run.model.score_h(torch.tensor([[r, t]]))[0].detach()
    top = torch.topk(expected, 5)
    assert found.query.side == "head" and found.query.head is None
    assert found.table["id"].to_list() == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(found.table["score"].to_list()), top.values)


def test_new_only_and_category(run):
    ds = run.dataset
    h, r, _ = ds.train[0].tolist()
    every = predict(run, head=h, relation=r, top_n=ds.num_entities)
    new = predict(run, head=h, relation=r, top_n=ds.num_entities, new_only=True)
    known = set().union(*(known_answers(ds, s, h, r, "tail") for s in ("train", "valid", "test")))
    assert set(new.table["id"]) == set(range(ds.num_entities)) - known and not any(new.table["known"])
    assert new.table["id"].to_list() == [i for i in every.table["id"] if i not in known]  # same order
    odd = predict(run, head=h, relation=r, top_n=3, category="cat:odd")
    assert odd.table.height == 3 and set(odd.table["categories"]) == {"cat:odd"}
    assert odd.table["id"].to_list() == [i for i in every.table["id"] if i % 2 == 1][:3]


def test_ties_keep_the_lower_id_first(run):
    model = run.model
    saved = model.entity_embeddings.detach().clone()
    try:
        with torch.no_grad():  # entities 5, 2 and 9 get the same embedding: tied scores for any query
            model.entity_embeddings[[5, 9]] = model.entity_embeddings[2].clone()
        ids = predict(run, head=0, relation=0, top_n=run.dataset.num_entities).table["id"].to_list()
        assert [i for i in ids if i in (2, 5, 9)] == [2, 5, 9]
    finally:
        with torch.no_grad():
            model.entity_embeddings.copy_(saved)


def test_bad_queries_are_reported_together(run):
    with pytest.raises(ConfigError) as e:
        predict(run, head="usaa", relation="no-such-relation", top_n=0)
    text = str(e.value)
    assert "'usa'" in text and "unknown relation" in text and "top_n=0" in text
    with pytest.raises(ConfigError, match="exactly one"):
        predict(run, head="usa", tail="uk", relation=0)
    with pytest.raises(ConfigError, match="did you mean 'cat:odd'"):
        predict(run, head="usa", relation=0, category="cat:od")


def test_score_file_with_unknown_labels(run, tmp_path):
    ds = run.dataset
    triples = ds.test[:3]
    lines = ["# a comment", "head\trelation\ttail"]
    for i, (h, r, t) in enumerate(triples.tolist()):
        lines.append("\t".join([ds.entity_label(h), ds.relation_label(r), ds.entity_label(t)]))
        if i == 0:
            lines.append(f"usaa\t{ds.relation_label(r)}\tmars")
    path = tmp_path / "q.tsv"
    path.write_text("\n".join(lines) + "\n")
    scored = score_triples(run, path)
    table = scored.table
    assert table["line"].to_list() == [3, 5, 6]
    torch.testing.assert_close(torch.tensor(table["score"].to_list()), run.model.score_hrt(triples).detach())
    ranks = rank_queries(run.model, triples, known=ds.all_triples())
    assert table["head_rank"].to_list() == ranks.counts["head"].rank("realistic").tolist()
    assert table["tail_rank"].to_list() == ranks.counts["tail"].rank("realistic").tolist()
    assert all(table["in_test"]) and not any(table["in_train"])
    assert table["head_name"][0] == f"The {table['head'][0]}"
    (skip,) = scored.skipped
    assert skip.line == 4 and "head 'usaa'" in skip.problem and "'usa'" in skip.problem
    assert "tail 'mars'" in skip.problem
    path.write_text("usaa\tx\tmars\n")
    with pytest.raises(DataError, match="no triple to score"):
        score_triples(run, path)


def test_cli_predict_and_score_write_json_and_tsv(run_dir, run, tmp_path, capsys):
    ds = run.dataset
    h, r, t = (ds.test[0, 0].item(), ds.test[0, 1].item(), ds.test[0, 2].item())
    head, rel = ds.entity_label(h), ds.relation_label(r)
    out = tmp_path / "p.json"
    assert main(["predict", str(run_dir), "--head", head, "--relation", rel, "--top-n", "4", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["query"]["head"] == head and len(data["rows"]) == 4
    tsv = out.with_suffix(".tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:4] == ["rank", "id", "label", "name"] and len(tsv) == 5
    named = head if ds.entity_name(head) == head else f"{ds.entity_name(head)} ({head})"
    assert f"({named}, {rel}, ?)" in capsys.readouterr().out
    query = tmp_path / "q.tsv"
    query.write_text(f"{head}\t{rel}\t{ds.entity_label(t)}\nnope\t{rel}\tusa\n")
    assert main(["score", str(run_dir), "--triples", str(query), "--out", str(tmp_path / "s.json")]) == 0
    captured = capsys.readouterr()
    assert "q.tsv:2: skipped: head 'nope'" in captured.err and "scored 1 triples" in captured.out
    assert json.loads((tmp_path / "s.json").read_text())["skipped"][0]["line"] == 2
    # --out q.json would write q.tsv beside it: the input. Refused, the input untouched.
    before = query.read_text()
    assert main(["score", str(run_dir), "--triples", str(query), "--out", str(tmp_path / "q.json")]) == 2
    assert query.read_text() == before and "is a file this command reads" in capsys.readouterr().err
