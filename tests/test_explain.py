"""kgtrace explain: TracIn explanations of triples and self-influence rankings, written as JSON + TSV."""

import json
import math
import subprocess
import sys

import pytest
import torch
from badinput import refused

from kgtrace.attribution import TracIn
from kgtrace.attribution.results import Influencer
from kgtrace.cli import main
from kgtrace.cli.explain import sign_note
from kgtrace.core.errors import KgtraceError
from kgtrace.data.lookup import parse_triple
from kgtrace.runs.embedding import load_run

K = 4


@pytest.fixture(scope="module")
def run_dir(tiny_conve):
    return tiny_conve


@pytest.fixture(scope="module")
def run(run_dir):
    return load_run(run_dir)


@pytest.fixture(scope="module")
def influence(run):
    """Influence [n_test, n_train] of the first two test triples, as the CLI computes it (defaults)."""
    return TracIn(run, params="last", checkpoints="all").influence(run.dataset.test[:2])


def explain(run_dir, tmp_path, *args, name="e.json"):
    out = tmp_path / name
    code = main(["explain", str(run_dir), *args, "--top-k", str(K), "--method", "tracin", "--out", str(out),
                 "--device", "cpu"])
    assert code == 0
    return json.loads(out.read_text()), out.with_suffix(".tsv").read_text().splitlines()


def labels(run, triple):
    ds = run.dataset
    return [ds.entity_label(triple[0]), ds.relation_label(triple[1]), ds.entity_label(triple[2])]


def test_explain_one_triple_by_labels(run_dir, run, influence, tmp_path, capsys):
    triple = run.dataset.test[0]
    data, tsv = explain(run_dir, tmp_path, "--triple", *labels(run, triple))
    (item,) = data["explanations"]
    assert item["test"]["ids"] == triple.tolist()
    assert [item["test"][k] for k in ("head", "relation", "tail")] == labels(run, triple)
    assert item["checkpoints"] == [c.epoch for c in run.checkpoints] == [1, 2]
    assert set(item["rank"]) == {"head", "tail"} and all(1 <= r <= run.dataset.num_entities for r in item["rank"].values())
    with torch.no_grad():
        assert item["score"] == pytest.approx(float(run.model.score_hrt(triple.view(1, 3))[0]), rel=1e-5)

    row = influence[0]
    pro = [e["influence"] for e in item["proponents"]]
    opp = [e["influence"] for e in item["opponents"]]
    assert len(pro) == len(opp) == K
    assert pro == sorted(pro, reverse=True) and opp == sorted(opp)
    assert torch.allclose(torch.tensor(pro), torch.topk(row, K).values, rtol=1e-6, atol=0)
    assert torch.allclose(torch.tensor(opp), torch.topk(row, K, largest=False).values, rtol=1e-6, atol=0)
    for entry in item["proponents"] + item["opponents"]:
        assert entry["influence"] == pytest.approx(float(row[entry["train_index"]]), rel=1e-6)
        assert [entry[k] for k in ("head", "relation", "tail")] == labels(run, run.dataset.train[entry["train_index"]])
        shares = entry["checkpoint_shares"]
        assert len(shares) == len(run.checkpoints) and sum(shares) == pytest.approx(1, abs=1e-9)

        h, t = int(triple[0]), int(triple[2])
        ends = set(run.dataset.train[entry["train_index"]][[0, 2]].tolist())
        assert entry["shares"] == {(True, True): "both", (True, False): "head", (False, True): "tail",
                                   (False, False): "neither"}[(h in ends, t in ends)]
    assert item["split"] == "test" and item["probability"] == pytest.approx(1 / (1 + math.exp(-item["score"])))

    header = tsv[0].split("\t")
    assert header[:7] == ["test_index", "test_head", "test_relation", "test_tail", "test_split", "kind", "rank"]
    assert len(tsv) == 1 + 2 * K
    rows = [dict(zip(header, r.split("\t"))) for r in tsv[1:]]
    assert [r["kind"] for r in rows] == ["proponent"] * K + ["opponent"] * K
    assert {r["test_split"] for r in rows} == {"test"}
    assert [r["shares"] for r in rows] == [e["shares"] for e in item["proponents"] + item["opponents"]]
    printed = capsys.readouterr().out
    assert "proponents" in printed and "opponents" in printed and item["test"]["head_name"] in printed
    assert "training triple: its strongest proponent is itself" not in printed
    assert f"probability {item['probability']:.3f}" in printed and "training row (train_index)" in printed


def test_a_training_triple_says_so(run_dir, run, tmp_path, capsys):
    triple = run.dataset.train[7]
    data, tsv = explain(run_dir, tmp_path, "--triple", *labels(run, triple))
    (item,) = data["explanations"]
    assert item["split"] == "train"
    assert item["proponents"][0]["train_index"] == 7 and item["proponents"][0]["shares"] == "both"  # itself
    assert tsv[1].split("\t")[4] == "train"
    assert "(a training triple: its strongest proponent is itself)" in capsys.readouterr().out


def test_a_list_that_runs_past_its_sign_says_how_many_triples_have_it():
    def entries(*values):
        return [Influencer.from_dict({"head": "h", "relation": "r", "tail": "t", "influence": v}) for v in values]

    assert sign_note("proponents", entries(3.0, 1.0, 0.5)) == ""
    assert sign_note("opponents", entries(-3.0, -1.0)) == ""
    assert sign_note("opponents", entries(-2.0, 0.0, 1.0)) == "; only 1 training triple lowered the score"
    assert sign_note("opponents", entries(-2.0, -1.0, 4.0)) == "; only 2 training triples lowered the score"
    assert sign_note("opponents", entries(1e-4, 2e-4)) == "; no training triple lowered the score"
    assert sign_note("proponents", entries(2.0, -1.0)) == "; only 1 training triple raised the score"
    assert sign_note("proponents", entries(0.0, -1.0)) == "; no training triple raised the score"
    assert sign_note("opponents", []) == ""


def test_checkpoint_shares_match_per_epoch_tracin(run_dir, run, tmp_path):
    triple = run.dataset.test[0]
    data, _ = explain(run_dir, tmp_path, "--triple", *labels(run, triple))
    entry = data["explanations"][0]["proponents"][0]
    parts = torch.tensor([float(TracIn(run, checkpoints=[e]).influence(triple)[0, entry["train_index"]])
                          for e in (1, 2)], dtype=torch.float64)
    assert entry["checkpoint_shares"] == pytest.approx((parts / parts.sum()).tolist(), abs=1e-5)


def test_ids_work_as_well_as_labels(run_dir, run, tmp_path):
    triple = run.dataset.test[0]
    by_labels, _ = explain(run_dir, tmp_path, "--triple", *labels(run, triple), name="a.json")
    by_ids, _ = explain(run_dir, tmp_path, "--triple", *map(str, triple.tolist()), name="b.json")
    assert by_ids["explanations"] == by_labels["explanations"]
    assert by_ids["files"] == {"b.tsv": by_labels["files"]["a.tsv"]}  # the same table, named beside each JSON
    assert parse_triple(run.dataset, *triple.tolist()).tolist() == triple.tolist()


def test_unknown_label_exits_2_with_suggestion(run_dir, run, tmp_path):
    head, relation, tail = labels(run, run.dataset.test[0])
    result = subprocess.run([sys.executable, "-m", "kgtrace", "explain", str(run_dir), "--triple", head[:-1] + "x",
                             relation, tail, "--out", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and head[:-1] + "x" in result.stderr and repr(head) in result.stderr
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(KgtraceError, match="unknown relation"):
        parse_triple(run.dataset, head, "no-such-relation", tail)


def test_triples_file_gives_one_entry_per_line(run_dir, run, influence, tmp_path):
    file = tmp_path / "q.tsv"
    file.write_text("".join("\t".join(labels(run, t)) + "\n" for t in run.dataset.test[:2]))
    data, tsv = explain(run_dir, tmp_path, "--triples", str(file))
    items = data["explanations"]
    assert [i["test"]["ids"] for i in items] == run.dataset.test[:2].tolist()
    for item, row in zip(items, influence):
        assert torch.allclose(torch.tensor([e["influence"] for e in item["proponents"]]), torch.topk(row, K).values,
                              rtol=1e-6, atol=0)
    assert len(tsv) == 1 + 2 * 2 * K


def test_self_influence_ranking(run_dir, run, tmp_path, capsys):
    data, tsv = explain(run_dir, tmp_path, "--self")
    expected = TracIn(run).self_influence()
    top = data["self_influence"]["top"]
    values = [e["self_influence"] for e in top]
    assert len(top) == K and values == sorted(values, reverse=True)
    assert torch.allclose(torch.tensor(values), torch.topk(expected, K).values, rtol=1e-6, atol=0)
    for e in top:
        assert sum(e["checkpoint_shares"]) == pytest.approx(1, abs=1e-9)
        assert all(s >= 0 for s in e["checkpoint_shares"])  # self-influence is a sum of non-negative terms
    rows = [r.split("\t") for r in tsv[1:]]
    assert len(rows) == len(run.dataset.train) == data["num_train"]
    column = torch.tensor([float(r[-1]) for r in rows])
    assert bool((column[:-1] >= column[1:]).all())
    got = torch.zeros(len(rows))
    got[[int(r[1]) for r in rows]] = column
    assert torch.allclose(got, expected, rtol=1e-6, atol=0)
    assert "most self-influential" in capsys.readouterr().out


def test_predict_explains_the_best_new_tails(run_dir, run, tmp_path):
    head, relation = labels(run, run.dataset.test[0])[:2]
    data, tsv = explain(run_dir, tmp_path, "--predict", head, relation, "--top-n", "3")
    items = data["explanations"]
    assert len(items) == 3 and len(tsv) == 1 + 3 * 2 * K
    scores = [i["score"] for i in items]
    assert scores == sorted(scores, reverse=True)
    known = {tuple(t) for t in run.dataset.all_triples().tolist()}
    h, r = run.dataset.entities.to_id[head], run.dataset.relations.to_id[relation]
    assert all(i["test"]["ids"][:2] == [h, r] and tuple(i["test"]["ids"]) not in known for i in items)
    with torch.no_grad():
        row = run.model.score_t(torch.tensor([[h, r]]))[0]
    new = [e for e in torch.argsort(row, descending=True).tolist() if (h, r, e) not in known]
    assert [i["test"]["ids"][2] for i in items] == new[:3]
    assert [i["split"] for i in items] == [None] * 3  # new predictions: in no split


def test_out_dir_writes_one_file_per_triple(run_dir, run, tmp_path):
    file = tmp_path / "q.tsv"
    file.write_text("".join("\t".join(labels(run, t)) + "\n" for t in run.dataset.test[:3]))
    folder = tmp_path / "each"
    assert main(["explain", str(run_dir), "--triples", str(file), "--top-k", "2", "--method", "tracin", "--out-dir", str(folder),
                 "--device", "cpu", "--no-progress"]) == 0
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"triple-{i:04d}.{ext}" for i in range(3) for ext in ("json", "tsv")]
    one = json.loads((folder / "triple-0001.json").read_text())["explanations"]
    assert len(one) == 1 and one[0]["test"]["ids"] == run.dataset.test[1].tolist()
    assert not (tmp_path / "each.state").exists()  # progress file removed once done


def test_explain_from_an_index(run_dir, run, tmp_path, capsys):
    index = tmp_path / "index"
    assert main(["index", str(run_dir), "--out", str(index), "--dim", "64", "--device", "cpu", "--no-progress"]) == 0
    assert (index / "index.json").is_file() and "indexed" in capsys.readouterr().out
    data, _ = explain(run_dir, tmp_path, "--triple", *labels(run, run.dataset.test[0]), "--index", str(index))
    assert len(data["explanations"][0]["proponents"]) == K
    # A second build into the same folder is refused, not overwritten.
    assert main(["index", str(run_dir), "--out", str(index), "--device", "cpu"]) == 2


def test_chunk_size_and_save_every(run_dir, tmp_path):
    default, _ = explain(run_dir, tmp_path, "--test", "2", "--no-progress", name="default.json")
    chunked, _ = explain(run_dir, tmp_path, "--test", "2", "--no-progress", "--chunk-size", "100", "--save-every", "0",
                         name="chunked.json")
    for a, b in zip(default["explanations"], chunked["explanations"], strict=True):
        assert [e["train_index"] for e in a["proponents"]] == [e["train_index"] for e in b["proponents"]]
        assert [e["influence"] for e in a["proponents"]] == pytest.approx([e["influence"] for e in b["proponents"]])
    assert not (tmp_path / "chunked.json.state").exists()
    # A checkpoint at a time (a budget of one byte): the same explanations, and nothing left beside the output.
    grouped, _ = explain(run_dir, tmp_path, "--test", "2", "--no-progress", "--memory-budget", "1", name="grouped.json")
    assert grouped["explanations"] == default["explanations"]
    assert not list(tmp_path.glob("grouped.json.state*"))
    refused(["explain", run_dir, "--test", "2", "--chunk-size", "0", "--save-every", "-1", "--budget", "nan",
             "--device", "cpu", "--out", tmp_path / "bad.json"], watch=tmp_path,
            mentions=["--chunk-size 0", "--save-every -1.0", "--budget nan: must be a number of seconds, 0 or more"])
    refused(["explain", run_dir, "--test", "2", "--memory-budget", "lots", "--device", "cpu", "--out",
             tmp_path / "bad.json"], watch=tmp_path, mentions=["--memory-budget 'lots'"])
