"""Choosing a hybrid's prover weight on validation triples: the one-standard-error rule by hand, and the
table path (each scorer scores once, the weights mix its rows) against ranking HybridScorer itself."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from mined import mined

from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.evaluate import evaluate
from kgtrace.models import build_model
from kgtrace.prover.config import HYBRID_WEIGHTS, MAX_WEIGHT
from kgtrace.prover.engine import VectorEngine
from kgtrace.prover.hybrid import ScoreTable, choose_hybrid_weight, choose_weight, reciprocal_ranks
from kgtrace.prover.logic import EngineShapes
from kgtrace.prover.scorer import BfsScorer, HybridScorer


def test_the_smallest_weight_within_one_standard_error_of_the_best():
    rr = {0.0: torch.tensor([1.0, 0.5, 0.5, 1.0]),  # MRR .75: paired differences to the best 0, .5, .5, 0
          1.0: torch.tensor([1.0, 1.0, 0.5, 1.0]),  # MRR .875: differences 0, 0, .5, 0
          2.0: torch.tensor([1.0, 1.0, 1.0, 1.0])}  # MRR 1, the best
    choice = choose_weight(rr)
    assert choice.best == 2.0 and choice.queries == 4
    assert choice.mrr == {0.0: 0.75, 1.0: 0.875, 2.0: 1.0}
    # Weight 1: gap .125; differences' sample std .25, over sqrt(4): SE .125, so the gap is within one SE.
    assert (choice.gap[1.0], choice.se[1.0]) == (0.125, 0.125)
    # Weight 0: gap .25; sample std sqrt(1/12), SE .144: outside, so 1 is the smallest weight kept.
    assert choice.gap[0.0] == 0.25 and choice.se[0.0] == pytest.approx((1 / 12) ** 0.5 / 2)
    assert choice.weight == 1.0
    assert choice.to_dict()["se"] == {0.0: 0.1443, 1.0: 0.125, 2.0: 0.0}


def test_a_weight_validation_tells_apart_is_not_chosen():
    """The best weight wins every query by the same margin: the differences have no spread, so no other
    weight lies within one SE; and among equal MRRs the smallest weight is the best."""
    clear = choose_weight({0.0: torch.full((50,), 0.5), 4.0: torch.full((50,), 0.6)})
    assert (clear.best, clear.weight) == (4.0, 4.0)
    tied = choose_weight({0.0: torch.full((3,), 0.5), 2.0: torch.full((3,), 0.5), 8.0: torch.full((3,), 0.5)})
    assert (tied.best, tied.weight) == (0.0, 0.0)


@pytest.fixture(scope="module")
def hybrid_parts():
    ds, rules = mined("nations", 4)
    prover = BfsScorer(VectorEngine(ds.train, rules, ds.num_entities, EngineShapes(max_atoms=4, max_history=3)), 2)
    torch.manual_seed(0)
    embedding = build_model("distmult", ds.num_entities, ds.num_relations, embedding_dim=8).eval()
    known = AnswerIndex.build(ds.known_triples("valid"), ds.num_relations)
    return ds, prover, embedding, known


def test_table_ranks_equal_the_hybrid_scorers_ranks(hybrid_parts):
    ds, prover, embedding, known = hybrid_parts
    triples = ds.valid[:12]
    proofs, logits = ScoreTable.of(prover, triples), ScoreTable.of(embedding, triples)
    assert proofs.rows.gt(0).any() and proofs.rows.eq(0).any()  # some candidates proved, some not
    choice = choose_hybrid_weight(prover, embedding, triples, known, weights=(0.0, 1.0, 8.0))
    for w in (0.0, 1.0, 8.0):
        reference = reciprocal_ranks(HybridScorer(prover, embedding, w), triples, known)
        table = reciprocal_ranks(logits.with_rows(logits.rows + w * proofs.rows), triples, known)
        assert torch.equal(table, reference)
        mrr = evaluate(HybridScorer(prover, embedding, w), triples, known=known).both.realistic.mrr
        assert choice.mrr[w] == pytest.approx(mrr, abs=1e-12)
    assert choice.queries == 2 * len(triples)
    assert choice.weight <= choice.best


def test_the_default_grid_doubles_while_its_largest_weight_ranks_best(hybrid_parts):
    """Logits thousands of times larger than the proofs' part: weights up to 64 barely move the ranking,
    so the default grid goes on past 64; each added weight's MRR is the hybrid scorer's own, and the
    doubling stops at the first weight that does not rank strictly best. A given grid is taken as it is."""
    ds, prover, embedding, known = hybrid_parts
    loud = copy.deepcopy(embedding)
    with torch.no_grad():
        for p in loud.parameters():
            p.mul_(20.0)  # DistMult's logits grow 8,000-fold
    triples = ds.valid[:12]
    choice = choose_hybrid_weight(prover, loud, triples, known)
    grid = sorted(choice.mrr)
    added = grid[len(HYBRID_WEIGHTS):]
    assert grid[:len(HYBRID_WEIGHTS)] == list(HYBRID_WEIGHTS) and added, "the curve still rose at 64"
    assert added == [64.0 * 2 ** (i + 1) for i in range(len(added))]
    for i, w in enumerate(grid[len(HYBRID_WEIGHTS) - 1:-1]):  # each weight doubled was the strict best so far
        assert all(choice.mrr[w] > choice.mrr[v] for v in grid[:len(HYBRID_WEIGHTS) + i] if v != w)
    last = grid[-1]
    assert last == MAX_WEIGHT or any(choice.mrr[last] <= choice.mrr[v] for v in grid[:-1])
    for w in added:
        mrr = evaluate(HybridScorer(prover, loud, w), triples, known=known).both.realistic.mrr
        assert choice.mrr[w] == pytest.approx(mrr, abs=1e-12)
    assert choice == choose_weight({w: reciprocal_ranks(HybridScorer(prover, loud, w), triples, known) for w in grid})
    given = choose_hybrid_weight(prover, loud, triples, known, weights=HYBRID_WEIGHTS)
    assert sorted(given.mrr) == list(HYBRID_WEIGHTS)


def test_a_score_table_reads_back_what_its_scorer_scored(hybrid_parts):
    ds, _, embedding, _ = hybrid_parts
    hrt = ds.valid[:5]
    table = ScoreTable.of(embedding, hrt)
    with torch.no_grad():
        assert torch.equal(table.score_t(hrt[:, :2]), embedding.score_t(hrt[:, :2]))
        assert torch.equal(table.score_h(hrt[:, 1:]), embedding.score_h(hrt[:, 1:]))
        assert torch.equal(table.score_hrt(hrt), embedding.score_t(hrt[:, :2]).gather(1, hrt[:, 2:]).squeeze(1))
    with pytest.raises(KeyError):
        table.score_t(torch.tensor([[ds.num_entities, 0]]))  # no such query was scored


def test_prove_weigh_sets_the_chosen_weight(tmp_path, capsys, hybrid_parts):
    """kgtrace prove weigh: the weight choose_hybrid_weight picks lands in prover.yaml (the run scores with it)
    and the curve in hybrid-weight.json; a run without an embedding run is refused in one line."""
    from kgtrace.cli import main
    from kgtrace.core.config import TrainConfig, read_yaml
    from kgtrace.prover.run import load_prover_run
    from kgtrace.training.loop import train

    ds = hybrid_parts[0]
    embedding = tmp_path / "distmult"
    train(TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 8}, epochs=2, eval_every=0,
                      threads=1, device="cpu"), embedding, progress=False, log=lambda *_: None)
    run = tmp_path / "hybrid"
    common = ["prove", "bfs", "--dataset", "nations", "--mine", "--max-rules-per-head", "4", "--depth", "2"]
    assert main(common + ["--embedding-run", str(embedding), "--hybrid-weight", "64", "--out", str(run)]) == 0
    assert f"to choose it on validation triples: kgtrace prove weigh {run}" in capsys.readouterr().out
    loaded = load_prover_run(run)
    known = AnswerIndex.build(ds.known_triples("valid"), ds.num_relations)
    expected = choose_hybrid_weight(loaded.model.prover, loaded.model.embedding, ds.valid[:30], known,
                                    weights=(0.0, 0.5, 4.0, 64.0))
    capsys.readouterr()
    assert main(["prove", "weigh", str(run), "--valid-triples", "30", "--weights", "64,0,0.5,4", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "<- chosen" in printed and f"set hybrid_weight {expected.weight:g}" in printed
    assert read_yaml(run / "prover.yaml")["hybrid_weight"] == expected.weight
    assert load_prover_run(run).model.weight == expected.weight
    record = json.loads((run / "hybrid-weight.json").read_text())
    assert record["weight"] == expected.weight and record["previous_weight"] == 64.0 and record["valid_triples"] == 30
    assert record["mrr"] == {f"{w}": round(m, 4) for w, m in expected.mrr.items()}
    # without --weights: the default grid, extended past 64 while its largest weight ranks best
    default = choose_hybrid_weight(loaded.model.prover, loaded.model.embedding, ds.valid[:30], known)
    assert main(["prove", "weigh", str(run), "--valid-triples", "30", "--device", "cpu"]) == 0
    record = json.loads((run / "hybrid-weight.json").read_text())
    assert record["weight"] == default.weight and set(map(float, record["mrr"])) == set(default.mrr)
    plain = tmp_path / "plain"
    assert main(common + ["--out", str(plain)]) == 0
    assert "prove weigh" not in capsys.readouterr().out  # no hint for a run without an embedding run
    assert main(["prove", "weigh", str(plain)]) == 2
    assert "not a hybrid prover run" in capsys.readouterr().err
    assert main(["prove", "weigh", str(run), "--weights", "1,x"]) == 2


class DeviceBound(torch.nn.Module):
    """A scorer whose parameter lives on another device ('meta' stands in for CUDA): it takes queries there only."""

    num_entities, num_relations = 4, 2

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(1, device="meta"))

    def score_t(self, hr):
        assert hr.device == self.weight.device, f"queries on {hr.device}, model on {self.weight.device}"
        return torch.zeros(len(hr), self.num_entities)


def test_score_table_sends_queries_to_the_models_device():
    table = ScoreTable.of(DeviceBound(), torch.tensor([[0, 1, 2], [1, 0, 3]]))
    assert table.rows.shape == (4, 4) and table.rows.device.type == "cpu"
