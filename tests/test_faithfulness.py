"""kgtrace faithfulness: metric definitions by hand, removal methods, retraining without the removed triples,
resuming, fine-tuning, the CLI and the report section. Runs are tiny (DistMult, a few epochs)."""

import json
import math
import os
import warnings

import numpy as np
import pytest
import torch
from scorers import TableScorer

from kgtrace.cli import main
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError, DataWarning, KgtraceError
from kgtrace.data.answers import AnswerIndex
from kgtrace.faithfulness import METHODS, FaithfulnessSettings, Measures, agreement, changes, check_faithfulness, removal_methods
from kgtrace.faithfulness import summarize as summarize_measures
from kgtrace.faithfulness.experiment import removals
from kgtrace.faithfulness.predictions import measure, rank_first_test, sample_rows
from kgtrace.faithfulness.removals import (
    MethodInputs,
    neighbourhood,
    path_removals,
    proof_facts,
    random_triples,
    tracin_last,
)
from kgtrace.faithfulness.retrain import job_key
from kgtrace.report import build_html
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import train

# A graph small enough to check by hand: the training triples, in file order (index = line).
TRAIN = ["a\tr\tb", "b\tr\tc", "c\ts\td", "d\tr\te", "e\ts\tf", "a\ts\tf", "b\ts\te", "f\tr\td"]
VALID = ["a\tr\tc"]
TEST = ["b\ts\td", "a\tr\te"]


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    data = tmp_path_factory.mktemp("toy-data")
    for name, lines in (("train", TRAIN), ("valid", VALID), ("test", TEST)):
        (data / f"{name}.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path_factory.mktemp("toy-run") / "run"
    config = TrainConfig(dataset=str(data), model="distmult", model_args={"embedding_dim": 8}, epochs=3, lr=0.05,
                         batch_size=4, checkpoint_every=1, eval_every=0, threads=1, device="cpu", seed=1)
    train(config, out, progress=False, log=quiet)
    return out


@pytest.fixture(scope="module")
def nations_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("nations-run") / "run"
    config = TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 16}, epochs=3, lr=0.02,
                         checkpoint_every=1, eval_every=0, threads=1, device="cpu")
    train(config, out, progress=False, log=quiet)
    return out


def ids(run, *triples):
    ds = run.dataset
    return torch.tensor([[ds.entities.to_id[h], ds.relations.to_id[r], ds.entities.to_id[t]] for h, r, t in triples])


def small(**kw):
    base = dict(ks=(1, 2), methods=("tracin-last", "random"), threads=1)
    return FaithfulnessSettings(**{**base, **kw})


# ----------------------------------------------------------------------------- metrics by hand


BEFORE = Measures(score=np.array([2.0, 1.0, 0.5]), prob=np.array([0.5, 0.4, 0.2]),
                  greater=np.array([0, 0, 2]), equal=np.array([0, 0, 1]))  # ranks 1, 1, 3.5; top-1: yes, yes, no
AFTER = Measures(score=np.array([1.0, 1.5, 0.0]), prob=np.array([0.3, 0.45, 0.1]),
                 greater=np.array([1, 0, 4]), equal=np.array([0, 0, 0]))  # ranks 2, 1, 5; top-1: no, yes, no


def test_metric_definitions_on_hand_computed_numbers():
    change = changes(BEFORE, AFTER)
    assert change["score_drop"].tolist() == [1.0, -0.5, 0.5]
    assert change["rank_change"].tolist() == [1.0, 0.0, 1.5]
    assert change["pd"].tolist() == [1.0, 0.0, 1.0]  # probability fell for the first and the third
    assert change["tc"][:2].tolist() == [1.0, 0.0] and math.isnan(change["tc"][2])  # the third was never top-1
    table = summarize_measures(BEFORE, AFTER)
    assert table["n"] == 3 and table["n_top1"] == 2
    assert table["pd"] == pytest.approx(2 / 3) and table["tc"] == pytest.approx(1 / 2)
    assert table["score_drop"] == pytest.approx(1 / 3)
    assert table["prob_drop"] == pytest.approx((0.2 - 0.05 + 0.1) / 3)
    assert table["rank_change"] == pytest.approx(2.5 / 3)
    assert table["mrr_before"] == pytest.approx((1 + 1 + 1 / 3.5) / 3)
    assert table["mrr_after"] == pytest.approx((1 / 2 + 1 + 1 / 5) / 3)
    assert table["mrr_drop"] == pytest.approx(table["mrr_before"] - table["mrr_after"])
    assert (table["hits_at_1_before"], table["hits_at_1_after"]) == (pytest.approx(2 / 3), pytest.approx(1 / 3))


def test_agreement_of_cheap_option_by_hand():
    cheap = Measures(score=np.array([1.5, 0.5, 1.0]), prob=np.array([0.45, 0.5, 0.3]),
                     greater=np.array([0, 0, 1]), equal=np.array([0, 1, 0]))  # top-1: yes, no (tie), no
    result = agreement(BEFORE, cheap, AFTER)
    # pd cheap [1, 0, 0] vs full [1, 0, 1]; tc cheap [0, 1] vs full [1, 0] on the two top-1 predictions
    assert result["pd_agreement"] == pytest.approx(2 / 3) and result["tc_agreement"] == 0.0
    drops_cheap, drops_full = np.array([0.5, 0.5, -0.5]), np.array([1.0, -0.5, 0.5])
    assert result["score_drop_pearson"] == pytest.approx(np.corrcoef(drops_cheap, drops_full)[0, 1])
    assert result["score_drop_mean_abs_diff"] == pytest.approx((0.5 + 1.0 + 1.0) / 3)


def test_measure_scores_probabilities_and_filtered_ranks_by_hand():
    table = torch.zeros(2, 4, 4)
    table[0, 0] = torch.tensor([1.0, 3.0, 3.0, 2.0])  # tails of (0, r0, ?)
    model = TableScorer(table)
    known = AnswerIndex.build(torch.tensor([[0, 0, 1], [0, 0, 3]]), 1)
    found = measure(model, torch.tensor([[0, 0, 1], [0, 0, 3]]), known)
    assert found.score.tolist() == [3.0, 2.0]
    z = math.exp(1) + 2 * math.exp(3) + math.exp(2)
    assert found.prob.tolist() == pytest.approx([math.exp(3) / z, math.exp(2) / z])  # softmax unfiltered
    # (0, r0, 1): entity 2 ties at 3.0 (rank 1.5, not top-1); (0, r0, 3): 1 is filtered, 2 scores higher
    assert found.greater.tolist() == [0, 1] and found.equal.tolist() == [1, 0]
    assert found.rank.tolist() == [1.5, 2.0] and found.top1.tolist() == [False, False]


# ----------------------------------------------------------------------------- methods


def test_method_registry_and_settings_errors():
    assert list(METHODS) == ["tracin-last", "tracin-all", "random", "neighbourhood", "proof", "paths"]
    assert list(removal_methods()) == [*METHODS, "grad-cos", "influence", "influence-fisher", "trak"]
    with pytest.raises(ConfigError, match="unknown method proofs; choose from tracin-last, tracin-all, random"):
        FaithfulnessSettings(methods=("tracin-last", "proofs")).validate()
    with pytest.raises(ConfigError, match="methods=proof: needs the prover run"):
        FaithfulnessSettings(methods=("proof",)).validate()
    with pytest.raises(ConfigError, match="only the proof method uses it"):
        FaithfulnessSettings(methods=("random",), prover_run="somewhere").validate()
    with pytest.raises(ConfigError, match="methods=paths: needs the rules"):
        FaithfulnessSettings(methods=("paths",)).validate()
    with pytest.raises(ConfigError) as error:
        FaithfulnessSettings(ks=(0, 5), mode="cheap", jobs=0).validate()
    assert len(error.value.problems) == 3


def test_neighbourhood_removes_triples_sharing_an_entity(toy_run):
    run = load_run(toy_run, "last")
    prediction = ids(run, ("a", "r", "c"))
    # lines with a or c as head or tail: 0 (a r b), 1 (b r c), 2 (c s d), 5 (a s f); never 3, 4, 6, 7
    everything = neighbourhood(run, prediction, 10, MethodInputs(seed=0))[0]
    assert sorted(everything.tolist()) == [0, 1, 2, 5]
    two = neighbourhood(run, prediction, 2, MethodInputs(seed=0))[0]
    assert two.tolist() == everything[:2].tolist()  # the first k of one seeded order: nested across k
    assert neighbourhood(run, prediction, 10, MethodInputs(seed=0))[0].tolist() == everything.tolist()


def test_random_removal_is_seeded_per_prediction(toy_run):
    run = load_run(toy_run, "last")
    pair = ids(run, ("b", "s", "d"), ("a", "r", "e"))
    both = random_triples(run, pair, 5, MethodInputs(seed=3))
    alone = random_triples(run, pair[1:], 5, MethodInputs(seed=3))
    assert both[1].tolist() == alone[0].tolist()  # the same draw whatever else is explained
    assert len(set(both[0].tolist())) == 5 and all(0 <= i < len(TRAIN) for i in both[0].tolist())
    assert random_triples(run, pair, 5, MethodInputs(seed=4))[0].tolist() != both[0].tolist() or \
        random_triples(run, pair, 5, MethodInputs(seed=5))[0].tolist() != both[0].tolist()


def test_tracin_removes_the_strongest_proponents(toy_run):
    from kgtrace.attribution import TracIn

    run = load_run(toy_run, "last")
    prediction = ids(run, ("a", "r", "c"))
    influence = TracIn(run, params="last").influence(prediction)[0]  # [n_train]
    expected = sorted(range(len(influence)), key=lambda i: (-float(influence[i]), i))[:3]
    assert tracin_last(run, prediction, 3, MethodInputs(seed=0))[0].tolist() == expected


def test_sample_rows_are_nested_across_sizes():
    assert set(sample_rows(50, 5, 0).tolist()) < set(sample_rows(50, 20, 0).tolist())
    assert sample_rows(3, 10, 0).tolist() == [0, 1, 2]


def test_rank_first_test_triples_are_ranked_first(nations_run):
    run = load_run(nations_run, "last")
    known = AnswerIndex.build(run.dataset.all_triples(), run.dataset.num_relations)
    first = rank_first_test(run, known)
    from kgtrace.evaluation.evaluate import rank_queries

    counts = rank_queries(run.model, run.dataset.test, known=known, sides=("tail",)).counts["tail"]
    expected = run.dataset.test[(counts.greater == 0) & (counts.equal == 0)]
    assert 0 < len(first) < len(run.dataset.test) and torch.equal(first, expected)


@pytest.fixture(scope="module")
def toy_prover(toy_run, tmp_path_factory):
    """A BFS prover run on the toy data with one chain rule: s(b, d) <- r(b, c), s(c, d); r(a, e) is unprovable."""
    folder = tmp_path_factory.mktemp("toy-prover")
    (folder / "rules.txt").write_text("0.9  s(X,Y) :- r(X,Z), s(Z,Y)\n")
    data = load_run(toy_run, "last").config.dataset
    assert main(["prove", "bfs", "--dataset", data, "--rules", str(folder / "rules.txt"), "--depth", "3",
                 "--out", str(folder / "run")]) == 0
    return folder / "run"


def test_proof_removes_the_facts_of_the_proof_in_order(toy_run, toy_prover):
    run = load_run(toy_run, "last")
    predictions = ids(run, ("b", "s", "d"), ("a", "r", "e"))
    inputs = MethodInputs(prover_run=str(toy_prover))
    found = proof_facts(run, predictions, 10, inputs)
    assert [f.tolist() for f in found] == [[TRAIN.index("b\tr\tc"), TRAIN.index("c\ts\td")], []]
    assert [f.tolist() for f in proof_facts(run, predictions, 1, inputs)] == [[TRAIN.index("b\tr\tc")], []]


def test_proof_of_a_prover_run_on_other_labels_is_refused(toy_run, tmp_path):
    data = tmp_path / "other"
    data.mkdir()
    for name, lines in (("train", TRAIN), ("valid", VALID), ("test", TEST)):
        (data / f"{name}.txt").write_text("\n".join(line.replace("a\t", "z\t") for line in lines) + "\n")
    (tmp_path / "rules.txt").write_text("0.9  s(X,Y) :- r(X,Z), s(Z,Y)\n")
    assert main(["prove", "bfs", "--dataset", str(data), "--rules", str(tmp_path / "rules.txt"),
                 "--out", str(tmp_path / "prover")]) == 0
    run = load_run(toy_run, "last")
    with pytest.raises(KgtraceError, match="entities differ from those of"):
        proof_facts(run, ids(run, ("b", "s", "d")), 2, MethodInputs(prover_run=str(tmp_path / "prover")))


def test_paths_removes_the_facts_of_the_strongest_paths_then_retrains_without_them(toy_run, tmp_path):
    run = load_run(toy_run, "last")
    rules = tmp_path / "rules.txt"
    rules.write_text('0.9  s(X,Y) :- r(X,Z), s(Z,Y)\n0.5  s(X,"d") :- r(X,Z)\n')
    predictions = ids(run, ("b", "s", "d"), ("a", "r", "e"))
    found = path_removals(run, predictions, 10, MethodInputs(rules=str(rules)))
    # b -r-> c -s-> d (the 0.9 rule's path), then b's r-edges (the 0.5 rule's: c already taken); nothing implies a r e.
    r_edges = [TRAIN.index(line) for line in TRAIN if line.startswith("b\tr\t") and line != "b\tr\tc"]
    assert found[0].tolist() == [TRAIN.index("b\tr\tc"), TRAIN.index("c\ts\td"), *r_edges] and found[1].tolist() == []
    assert path_removals(run, predictions, 1, MethodInputs(rules=str(rules)))[0].tolist() == [TRAIN.index("b\tr\tc")]
    settings = small(methods=("paths",), rules=str(rules))
    summary = check_faithfulness(toy_run, tmp_path / "check", settings, triples=predictions[:1], progress=False,
                                 log=quiet)
    assert {(c.method, c.k): c.removed for c in summary.cells}[("paths", 2)] == tuple(found[0][:2].tolist())
    assert summary.settings.rules == str(rules)


def test_check_with_the_proof_method_retrains_without_the_proof(toy_run, toy_prover, tmp_path):
    run = load_run(toy_run, "last")
    settings = small(methods=("proof", "random"), prover_run=str(toy_prover))
    summary = check_faithfulness(toy_run, tmp_path / "check", settings, triples=ids(run, ("b", "s", "d")),
                                 progress=False, log=quiet)
    removed = {(c.method, c.k): c.removed for c in summary.cells}
    proof = (TRAIN.index("b\tr\tc"), TRAIN.index("c\ts\td"))
    assert removed[("proof", 2)] == proof
    assert summary.settings.prover_run == str(toy_prover)
    assert {r.method for r in summary.table} == {"none", "proof", "random"}


# ----------------------------------------------------------------------------- retraining


def test_retrained_runs_lack_the_removed_triples(toy_run, tmp_path):
    run = load_run(toy_run, "last")
    prediction = ids(run, ("a", "r", "c"))
    out = tmp_path / "check"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = check_faithfulness(toy_run, out, small(keep_runs=True), triples=prediction, progress=False,
                                     log=quiet)
    # a removal may leave a valid entity without training triples: the reduced data's valid split is unused
    assert not [w for w in caught if issubclass(w.category, DataWarning)]
    train_rows = {tuple(t) for t in run.dataset.train.tolist()}
    for cell in summary.cells:
        assert len(cell.removed) == cell.k and list(cell.removed) == sorted(cell.removed)
        trained = load_run(out / "runs" / "retrain" / job_key(cell.removed) / "run", "last")
        kept = {tuple(t) for t in trained.dataset.train.tolist()}
        assert kept == train_rows - {tuple(run.dataset.train[i].tolist()) for i in cell.removed}
        assert trained.config.dataset.endswith("data") and trained.checkpoints[-1].epoch == 3
        assert trained.dataset.entities.labels == run.dataset.entities.labels  # same ids, comparable scores
    # training again with nothing removed gives back the run's own model: every change is the removal's
    assert summary.control_max_abs_score_change == {"retrain": 0.0}
    assert {(r.method, r.k) for r in summary.table} == {("none", 0), ("tracin-last", 1), ("tracin-last", 2),
                                                                 ("random", 1), ("random", 2)}
    for name in ("faithfulness.json", "faithfulness.tsv", "cells.tsv", "faithfulness.png", "removals.json"):
        assert (out / name).is_file(), name


def test_rerun_skips_finished_trainings_and_redoes_only_missing_ones(toy_run, tmp_path):
    run = load_run(toy_run, "last")
    prediction = ids(run, ("a", "r", "c"), ("b", "s", "d"))
    out = tmp_path / "check"
    logged = []
    first = check_faithfulness(toy_run, out, small(), triples=prediction, progress=False, log=logged.append)
    files = sorted((out / "jobs" / "retrain").glob("*.json"))
    stamps = {p: os.stat(p).st_mtime_ns for p in files}
    assert f"{len(files)} still to run" in logged[-1]
    again = check_faithfulness(toy_run, out, small(), triples=prediction, progress=False, log=logged.append)
    assert "0 still to run" in logged[-1]
    assert {p: os.stat(p).st_mtime_ns for p in files} == stamps
    assert again.table == first.table
    files[0].unlink()
    check_faithfulness(toy_run, out, small(), triples=prediction, progress=False, log=logged.append)
    assert "1 still to run" in logged[-1]


def test_process_pool_gives_the_in_process_results(toy_run, tmp_path):
    run = load_run(toy_run, "last")
    prediction = ids(run, ("a", "r", "c"))
    one = check_faithfulness(toy_run, tmp_path / "one", small(methods=("random",)), triples=prediction,
                             progress=False, log=quiet)
    two = check_faithfulness(toy_run, tmp_path / "two", small(methods=("random",), jobs=2), triples=prediction,
                             progress=False, log=quiet)
    strip = [{k: v for k, v in row.to_dict().items() if k != "seconds"} for row in one.table]
    assert [{k: v for k, v in row.to_dict().items() if k != "seconds"} for row in two.table] == strip


def test_finetune_continues_an_early_checkpoint_and_is_compared_with_retraining(toy_run, tmp_path):
    run = load_run(toy_run, "last")
    prediction = ids(run, ("a", "r", "c"))
    out = tmp_path / "check"
    check_faithfulness(toy_run, out, small(), triples=prediction, progress=False, log=quiet)
    summary = check_faithfulness(toy_run, out, small(mode="finetune", keep_runs=True), triples=prediction,
                                 progress=False, log=quiet)
    assert summary.settings.variant == "finetune-from-0001"  # the latest checkpoint at or before epoch 3 // 2
    assert summary.control_max_abs_score_change == {"retrain": 0.0, "finetune-from-0001": 0.0}
    key = job_key(summary.cells[-1].removed)
    tuned = out / "runs" / "finetune-from-0001" / key / "run"
    assert sorted(p.name for p in (tuned / "checkpoints").glob("epoch-*.pt")) == ["epoch-0001.pt", "epoch-0003.pt"]
    assert [json.loads(line)["epoch"] for line in (tuned / "metrics.jsonl").read_text().splitlines()] == [2, 3]
    overall = [row for row in summary.agreement if row.method == "all"]
    assert len(overall) == 1 and overall[0].n == 4  # 2 methods x 2 k, one prediction
    assert {r.variant for r in summary.table} == {"retrain", "finetune-from-0001"}
    with pytest.raises(ConfigError, match="finetune_from=3"):
        check_faithfulness(toy_run, out, small(mode="finetune", finetune_from=3), triples=prediction,
                           progress=False, log=quiet)


def test_output_folder_of_another_run_or_foreign_files_is_refused(toy_run, nations_run, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(KgtraceError, match="not a faithfulness folder"):
        check_faithfulness(toy_run, foreign, small(), progress=False, log=quiet)
    assert (foreign / "notes.txt").read_text() == "mine"
    out = tmp_path / "check"
    check_faithfulness(toy_run, out, small(methods=("random",), ks=(1,)), triples=ids(load_run(toy_run), ("a", "r", "c")),
                       progress=False, log=quiet)
    with pytest.raises(KgtraceError, match="choose another out"):
        check_faithfulness(nations_run, out, small(), progress=False, log=quiet)


# ----------------------------------------------------------------------------- command line and report


@pytest.mark.parametrize("args, says", [
    (["{missing}"], "not a kgtrace run"),
    (["{run}", "--k", "0"], "k=0"),
    (["{run}", "--k", "1,x"], "--k '1,x'"),
    (["{run}", "--methods", "tracin-last,proofs"], "unknown method proofs"),
    (["{run}", "--methods", "proof"], "needs the prover run"),
])
def test_cli_errors_are_one_line_with_exit_2(args, says, toy_run, tmp_path, capsys):
    argv = [a.format(missing=tmp_path / "nothing", run=toy_run) for a in args]
    assert main(["faithfulness", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kgtrace faithfulness: error:") and says in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_writes_the_table_and_the_report_shows_it(nations_run, tmp_path, capsys):
    out = nations_run / "faithfulness"
    assert main(["faithfulness", str(nations_run), "--sample", "2", "--k", "1", "--methods", "random,neighbourhood",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "neighbourhood" in printed and "wrote" in printed
    data = json.loads((out / "faithfulness.json").read_text())
    assert len(data["predictions"]["triples"]) == 2 and data["predictions"]["how"].startswith("2 drawn")
    header = (out / "faithfulness.tsv").read_text().splitlines()[0].split("\t")
    assert {"variant", "method", "k", "pd", "tc", "score_drop", "rank_change", "mrr_drop"} <= set(header)
    page = build_html(nations_run)  # found inside the run folder
    assert "<h2>Faithfulness</h2>" in page and "neighbourhood" in page and "PD %" in page
    moved = tmp_path / "elsewhere"
    out.rename(moved)
    assert "<h2>Faithfulness</h2>" not in build_html(nations_run)
    assert main(["report", str(nations_run), "--faithfulness", str(moved), "--out", str(tmp_path / "r.html")]) == 0
    assert "<h2>Faithfulness</h2>" in (tmp_path / "r.html").read_text()


def test_saved_removals_are_reused_only_under_the_same_formula_and_inputs(toy_run, tmp_path):
    """removals.json keeps each method's ranking per prediction; an attribution method's rows saved under another
    revision or other inputs (here: none recorded, as before revisions) are recomputed, the others reused."""
    run = load_run(toy_run)
    predictions = run.dataset.test[:2]
    settings = small(ks=(1, 3), methods=("grad-cos", "random"))
    cache = tmp_path / "removals.json"
    fresh = removals(run, predictions, settings, cache, progress=False)
    saved = json.loads(cache.read_text())
    assert {row["signature"] for row in saved["methods"]["random"].values()} == {None}
    for name in ("grad-cos", "random"):  # tamper: an older file's rows (no signature), a different ranking
        for row in saved["methods"][name].values():
            row.pop("signature")
            row["ranked"] = [0, 1, 2]
    cache.write_text(json.dumps(saved))
    again = removals(run, predictions, settings, cache, progress=False)
    assert again["grad-cos"] == fresh["grad-cos"] != [[0, 1, 2]] * 2  # recomputed
    assert again["random"] == [[0, 1, 2]] * 2  # reused: no revision, and the file's seed covers its draw


def test_method_inputs_cannot_be_built_invalid():
    with pytest.raises(ConfigError) as error:
        MethodInputs(seed=-3, progress="yes", prover_run=7)
    assert len(error.value.problems) == 3
    assert MethodInputs(seed=5, prover_run="runs/prover").seed == 5
