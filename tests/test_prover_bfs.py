"""The BFS baseline as a Scorer: hand-computed scores and ranks, agreement with the reference's best proofs,
and prover runs through the command line (prove bfs, evaluate, explain)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from mined import mined

import kgtrace
from kgtrace.cli import main
from kgtrace.core.layout import RunLayout
from kgtrace.data.answers import AnswerIndex
from kgtrace.data.vocab import Vocab
from kgtrace.evaluation.evaluate import Candidates, evaluate, rank_queries
from kgtrace.prover.engine import VectorEngine
from kgtrace.prover.explain import explain_proofs
from kgtrace.prover.logic import EngineShapes, query_state
from kgtrace.prover.proofs import Proofs
from kgtrace.prover.reference import ReferenceEngine, best_proofs, search
from kgtrace.prover.rules import parse_rules
from kgtrace.prover.run import load_prover_run
from kgtrace.prover.scorer import BfsScorer, HybridScorer, prover_report

ANN, BOB, CAT, DAN = range(4)
PARENT, GRANDPARENT = 0, 1
TRAIN = torch.tensor([[ANN, PARENT, BOB], [BOB, PARENT, CAT], [BOB, PARENT, DAN]])
RULES = parse_rules(["0.9  grandparent(X,Y) :- parent(X,Z), parent(Z,Y)"], Vocab(("parent", "grandparent")))


def tiny_scorer(depth: int = 3) -> BfsScorer:
    return BfsScorer(VectorEngine(TRAIN, RULES, 4, EngineShapes(max_atoms=4, max_history=depth + 1)), depth)


def test_scores_are_best_proof_confidences():
    scorer = tiny_scorer()
    triples = torch.tensor([[ANN, GRANDPARENT, CAT], [ANN, GRANDPARENT, BOB], [ANN, PARENT, BOB], [BOB, GRANDPARENT, CAT]])
    assert scorer.score_hrt(triples).tolist() == pytest.approx([0.9, 0.0, 1.0, 0.0])  # a fact proves with confidence 1
    assert scorer.score_t(torch.tensor([[ANN, GRANDPARENT]])).tolist() == [pytest.approx([0.0, 0.0, 0.9, 0.9])]
    assert scorer.score_h(torch.tensor([[GRANDPARENT, DAN]])).tolist() == [pytest.approx([0.9, 0.0, 0.0, 0.0])]
    assert tiny_scorer(depth=2).score_hrt(triples[:1]).tolist() == [0.0]  # the chain needs three steps


def test_ranks_with_realistic_ties():
    # Tail side of grandparent(ann, cat): cat and dan both score 0.9 -> ranks 1 / 1.5 / 2 (optimistic / realistic /
    # pessimistic). Head side: only ann scores -> rank 1.
    test = torch.tensor([[ANN, GRANDPARENT, CAT]])
    metrics = evaluate(tiny_scorer(), test, known=torch.cat([TRAIN, test]))
    tail = metrics.sides["tail"]
    assert tail.realistic.mr == 1.5 and tail.optimistic.mr == 1.0
    assert tail.pessimistic.mr == 2.0 and metrics.sides["head"].realistic.mr == 1.0
    assert metrics.both.realistic.mrr == pytest.approx((1 / 1.5 + 1) / 2)
    # With grandparent(ann, dan) known too, dan is filtered out and cat ranks first.
    filtered = evaluate(tiny_scorer(), test, known=torch.cat([TRAIN, test, torch.tensor([[ANN, GRANDPARENT, DAN]])]))
    assert filtered.sides["tail"].realistic.mr == 1.0


def test_score_hrt_of_a_head_query_is_its_score_t_column():
    # Sampled ranking scores (anchor, r + R, h) by score_hrt when one query's [E] scores do not fit:
    # the prover must read it as the head query of (h, r, anchor), as score_t does.
    scorer = tiny_scorer()
    queries = torch.tensor([[CAT, GRANDPARENT + 2], [BOB, PARENT + 2], [ANN, GRANDPARENT]])  # R = 2
    rows = scorer.score_t(queries)  # [3, 4]
    for entity in range(4):
        hrt = torch.cat([queries, torch.full((3, 1), entity)], 1)
        assert scorer.score_hrt(hrt).tolist() == pytest.approx(rows[:, entity].tolist()), entity
    test = torch.tensor([[ANN, GRANDPARENT, CAT], [BOB, PARENT, DAN]])
    known = torch.cat([TRAIN, test])
    by_score_t = rank_queries(scorer, test, known=known, candidates=Candidates(3, seed=1)).counts
    by_score_hrt = rank_queries(scorer, test, known=known, candidates=Candidates(3, seed=1), memory_budget=1).counts
    for side in ("head", "tail"):
        assert by_score_hrt[side].rank("realistic").tolist() == by_score_t[side].rank("realistic").tolist()


def test_hybrid_adds_the_weighted_prover_score():
    class Constant(torch.nn.Module):
        num_entities, num_relations = 4, 2

        def score_hrt(self, hrt):
            return hrt[:, 2].float()

        def score_t(self, hr):
            return torch.arange(4.0).expand(len(hr), 4)

    hybrid = HybridScorer(tiny_scorer(), Constant(), weight=10.0)
    assert hybrid.score_t(torch.tensor([[ANN, GRANDPARENT]])).tolist() == [pytest.approx([0.0, 1.0, 11.0, 12.0])]
    assert hybrid.score_hrt(torch.tensor([[ANN, GRANDPARENT, CAT]])).tolist() == pytest.approx([11.0])


def test_hybrid_ignores_what_the_prover_does_not_prove():
    """A policy scores a proof 1 + confidence, an unproved triple its value (below 1): the hybrid adds
    weight x confidence for a proof and 0 for the rest, as for BFS."""
    class Guessing(torch.nn.Module):
        proof_line = 1.0

        def score_hrt(self, hrt):
            return torch.tensor([0.9, 1.5, -0.5])[: len(hrt)]

        def score_t(self, hr):
            return torch.tensor([[0.9, 1.5, -0.5, 1.0]]).expand(len(hr), 4)

    class Flat(torch.nn.Module):
        num_entities, num_relations = 4, 2

        def score_hrt(self, hrt):
            return torch.ones(len(hrt))

        def score_t(self, hr):
            return torch.ones(len(hr), 4)

    hybrid = HybridScorer(Guessing(), Flat(), weight=2.0)  # adds 2 x (score - 1) for a proof, else 0
    assert hybrid.score_t(torch.tensor([[0, 0], [1, 1]])).tolist() == [[1.0, 2.0, 1.0, 1.0]] * 2
    assert hybrid.score_hrt(torch.zeros(3, 3, dtype=torch.long)).tolist() == [1.0, 2.0, 1.0]


@pytest.fixture(scope="module")
def nations():
    return mined("nations", 6)


def test_open_queries_equal_ground_queries_and_the_reference(nations):
    ds, rules = nations
    shapes = EngineShapes(max_atoms=6, max_history=4)
    scorer = BfsScorer(VectorEngine(ds.train, rules, ds.num_entities, shapes), 3)
    test = ds.test[:40]
    tails = scorer.score_t(test[:, :2])  # [40, E]
    heads = scorer.score_h(test[:, 1:])
    assert torch.equal(tails.gather(1, test[:, 2:]).squeeze(1), scorer.score_hrt(test))
    assert torch.equal(heads.gather(1, test[:, :1]).squeeze(1), scorer.score_hrt(test))
    reference = ReferenceEngine(ds.train, rules, ds.num_entities, shapes)
    expected = []
    for h, r, t in test[:15].tolist():
        best = best_proofs(search(reference, query_state((h, r, t)), 3)).get(None)
        expected.append(math.exp(best.log_confidence) if best else 0.0)
    assert scorer.score_hrt(test[:15]).tolist() == pytest.approx(expected, abs=1e-6)
    assert 0.0 in expected and max(expected) > 0  # proved and unproved triples: the comparison can fail
    assert scorer.overflow.tolist() == [0, 0, 0]


def test_prove_evaluate_explain_commands(tmp_path, capsys, nations):
    ds, _ = nations
    run = tmp_path / "bfs"
    assert main(["prove", "bfs", "--dataset", "nations", "--mine", "--max-rules-per-head", "6", "--out", str(run)]) == 0
    out = tmp_path / "metrics.json"
    assert main(["evaluate", str(run), "--corruptions", "3", "--out", str(out), "--device", "cpu"]) == 0
    metrics = json.loads(out.read_text())
    assert metrics["prover"]["overflow"] == {"states": 0, "atoms": 0, "facts": 0}
    assert prover_report(load_prover_run(run).model).to_df().to_dicts() == [{"states": 0, "atoms": 0, "facts": 0}]
    loaded = load_prover_run(run)
    # kgtrace.load_run loads either kind of run: the folder says which
    assert RunLayout(run).kind == "prover" and isinstance(kgtrace.load_run(run), kgtrace.ProverRun)
    known = AnswerIndex.build(ds.all_triples(), ds.num_relations)
    direct = evaluate(loaded.model, ds.test, known=known, candidates=Candidates(3))
    assert metrics["both"]["realistic"]["mrr"] == pytest.approx(direct.both.realistic.mrr)
    assert metrics["candidates"] == 3 and 0 < metrics["both"]["realistic"]["mrr"] <= 1
    # explain: the best proof of a test triple the run proves, step by step.
    scores = loaded.model.score_hrt(ds.test[:30])
    proved = ds.test[int(torch.nonzero(scores > 0)[0])]
    h, r, t = (ds.entity_label(proved[0]), ds.relation_label(proved[1]), ds.entity_label(proved[2]))
    capsys.readouterr()
    assert main(["explain", str(run), "--triple", h, r, t, "--out", str(tmp_path / "why.json")]) == 0
    printed = capsys.readouterr().out
    assert f"{r}({h}, {t}): proved in" in printed and "<-  rule" in printed and "none left: proved" in printed
    item = json.loads((tmp_path / "why.json").read_text())["proofs"][0]
    assert item["proved"] and item["confidence"] == pytest.approx(float(scores[int(torch.nonzero(scores > 0)[0])]))
    assert item["steps"][0]["kind"] == "rule" and item["steps"][-1]["goals_after"] == "(proved)"
    # The same proofs, typed: read back from the file, as a table, from Python.
    found = explain_proofs(loaded, proved.view(1, 3))
    assert Proofs.read(tmp_path / "why.json") == found and json.loads(json.dumps(found.to_dict()))["proofs"][0] == item
    table = found.to_df()
    assert table.height == len(item["steps"]) and table["step"].to_list() == list(range(1, table.height + 1))
    assert table["resolved_with"][0].startswith("rule ") and found.lines()[0] == printed.splitlines()[0]


def test_hybrid_prover_run_adds_the_embedding_runs_logit(tmp_path, capsys, nations):
    """prove bfs --embedding-run: the run's model is the embedding logit + weight x the BFS confidence."""
    from kgtrace.core.config import TrainConfig
    from kgtrace.runs.embedding import load_run
    from kgtrace.training.loop import train

    ds, _ = nations
    embedding = tmp_path / "distmult"
    train(TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 8}, epochs=1, eval_every=0,
                      threads=1, device="cpu"), embedding, progress=False, log=lambda *_: None)
    rules = tmp_path / "good.rules"
    rules.write_text("0.5  embassy(X,Y) :- embassy(Y,X)\n")
    hybrid, plain = tmp_path / "hybrid", tmp_path / "plain"
    common = ["prove", "bfs", "--dataset", "nations", "--rules", str(rules)]
    assert main(common + ["--embedding-run", str(embedding), "--hybrid-weight", "3", "--out", str(hybrid)]) == 0
    assert main(common + ["--out", str(plain)]) == 0
    queries = torch.stack([ds.test[:20, 0], ds.test[:20, 1]], 1)  # [20, 2] (head, relation)
    expected = (load_run(embedding).model.score_t(queries).float()
                + 3 * load_prover_run(plain).model.score_t(queries))
    got = load_prover_run(hybrid).model.score_t(queries)
    assert torch.allclose(got, expected, atol=1e-5)
    assert (load_prover_run(plain).model.score_t(queries) > 0).any()  # some proofs: the weight mattered
    assert main(["evaluate", str(hybrid), "--corruptions", "3", "--out", str(tmp_path / "m.json"), "--device", "cpu"]) == 0
    # An embedding run over other id maps is refused in one line.
    other = tmp_path / "umls-run"
    train(TrainConfig(dataset="umls", model="distmult", model_args={"embedding_dim": 8}, epochs=1, eval_every=0,
                      threads=1, device="cpu"), other, progress=False, log=lambda *_: None)
    capsys.readouterr()
    assert main(common + ["--embedding-run", str(other), "--out", str(tmp_path / "bad")]) == 2
    assert "id maps differ" in capsys.readouterr().err


def test_prove_refuses_bad_rules_and_existing_folders(tmp_path, capsys):
    bad = tmp_path / "bad.rules"
    bad.write_text("0.5  embassy(X,Y) :- embassy(Y,X)\n0.5  nosuchrelation(X,Y) :- embassy(X,Y)\n")
    assert main(["prove", "bfs", "--dataset", "nations", "--rules", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err
    good = tmp_path / "good.rules"
    good.write_text("0.5  embassy(X,Y) :- embassy(Y,X)\n")
    assert main(["prove", "bfs", "--dataset", "nations", "--rules", str(good), "--out", str(tmp_path / "r")]) == 0
    assert main(["prove", "bfs", "--dataset", "nations", "--rules", str(good), "--out", str(tmp_path / "r")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["explain", str(tmp_path / "r"), "--self"]) == 2


def test_report_shows_proofs_beside_tracin_explanations(full_run, tmp_path):
    from kgtrace.report.build import build_html

    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    explained = json.loads((run / "explain" / "test.json").read_text())["explanations"]
    triples = tmp_path / "triples.tsv"
    triples.write_text("".join(f"{e['test']['head']}\t{e['test']['relation']}\t{e['test']['tail']}\n" for e in explained))
    prover = tmp_path / "bfs"
    assert main(["prove", "bfs", "--dataset", "nations", "--mine", "--max-rules-per-head", "6", "--out", str(prover)]) == 0
    assert main(["explain", str(prover), "--triples", str(triples), "--out", str(run / "explain" / "proofs.json")]) == 0
    proofs = json.loads((run / "explain" / "proofs.json").read_text())["proofs"]
    html = build_html(run)
    # Each TracIn-explained triple's block holds its proof (or the prover's "no proof") beside the influences.
    blocks = html.split('<div class="triple">')[1:]
    assert len(blocks) == 2 * len(explained)  # the TracIn section and the proofs section
    for block, proof in zip(blocks, proofs):
        assert "<h3>Proof</h3>" in block and "Proponents" in block
        assert ("resolved with" in block) == proof["proved"]
    assert any(p["proved"] for p in proofs) and "Proofs" in html  # a proof table was drawn; the proofs have a section
