"""Filtered evaluation end to end on a fixed scorer, checked against a naive loop."""

import json

import pytest
import torch
from scorers import TableScorer

from kgtrace.core.errors import KgtraceError
from kgtrace.evaluation.evaluate import Candidates, evaluate


def naive_realistic_ranks(scorer, triples, known):
    known = {tuple(t) for t in known.tolist()}
    ranks = []
    for h, r, t in triples.tolist():
        for side in ("head", "tail"):
            if side == "tail":
                s = scorer.score_t(torch.tensor([[h, r]]))[0]
                true, cand = t, [(h, r, e) for e in range(scorer.num_entities)]
            else:
                s = scorer.score_h(torch.tensor([[r, t]]))[0]
                true, cand = h, [(e, r, t) for e in range(scorer.num_entities)]
            keep = [e for e, c in enumerate(cand) if e == true or c not in known]
            g = sum(1 for e in keep if s[e] > s[true])
            eq = sum(1 for e in keep if e != true and s[e] == s[true])
            ranks.append(1 + g + eq / 2)
    return ranks


def test_matches_naive_loop_with_ties_and_filtering():
    gen = torch.Generator().manual_seed(0)
    table = torch.randint(0, 4, (4, 6, 6), generator=gen).float()  # many ties
    scorer = TableScorer(table)
    triples = torch.tensor([[0, 0, 1], [2, 1, 3], [4, 0, 5], [1, 1, 0]])
    known = torch.cat([triples, torch.tensor([[0, 0, 2], [0, 0, 3], [5, 1, 3]])])
    ranks = naive_realistic_ranks(scorer, triples, known)
    for budget in (6 * 16, 10**9):  # one query (6 entities x 16 bytes) per chunk, and all at once
        result = evaluate(scorer, triples, known=known, memory_budget=budget)
        assert result.both.realistic.mr == pytest.approx(sum(ranks) / len(ranks))
        assert result.both.realistic.mrr == pytest.approx(sum(1 / r for r in ranks) / len(ranks))
        tail = ranks[1::2]
        assert result.sides["tail"].realistic.mr == pytest.approx(sum(tail) / len(tail))
    assert result.num_queries == 4 and result.corruptions == 0 and not result.restricted


TIE_KEYS = ["mrr", "mr", "amr", "amri", "adjusted_mrr",
            "hits_at_1", "adjusted_hits_at_1", "hits_at_5", "adjusted_hits_at_5"]


def test_only_the_answers_of_the_ranked_queries_are_indexed():
    """answering keeps exactly the known triples a query of the ranked triples reads; ranks are unchanged."""
    from kgtrace.data.answers import AnswerIndex, answering

    gen = torch.Generator().manual_seed(1)
    known = torch.randint(0, 8, (300, 3), generator=gen) % torch.tensor([8, 3, 8])
    triples = known[:5]
    kept = answering(known, triples, 3)
    answers = {(h, r, "tail") for h, r, _ in triples.tolist()} | {(t, r, "head") for _, r, t in triples.tolist()}
    expected = [x for x in known.tolist() if (x[0], x[1], "tail") in answers or (x[2], x[1], "head") in answers]
    assert kept.tolist() == expected and 0 < len(kept) < len(known)
    whole, part = AnswerIndex.build(known, 3), AnswerIndex.build(kept, 3)
    queries = torch.cat([triples[:, :2], torch.stack([triples[:, 2], triples[:, 1] + 3], 1)])  # tail and head queries
    for a, b in zip(whole.lookup(queries), part.lookup(queries)):
        assert torch.equal(a, b)
    scorer = TableScorer(torch.randint(0, 3, (6, 8, 8), generator=gen).float())  # [2R, E, E], many ties
    assert evaluate(scorer, triples, known=known).both.realistic.mr == evaluate(scorer, triples, known=whole).both.realistic.mr


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_member_is_isin_and_answering_is_the_same_on_every_device(device):
    from kgtrace.data.answers import answering, member

    gen = torch.Generator().manual_seed(2)
    values = torch.randint(0, 50, (1000,), generator=gen)
    for targets in (torch.randint(0, 50, (7,), generator=gen), torch.tensor([49, 0, 0]), values[:0]):
        assert torch.equal(member(values.to(device), targets.to(device)).cpu(), torch.isin(values, targets))
    known = torch.randint(0, 30, (500, 3), generator=gen) % torch.tensor([30, 4, 30])
    assert torch.equal(answering(known, known[:9], 4, device), answering(known, known[:9], 4))


def test_metrics_to_dict_is_the_json_shape_written_before():
    # The shape kgtrace evaluate --out has always written: sides in the order ranked, then both, then the
    # three counts; each side's tie policies in one order, each policy's metrics in one order.
    gen = torch.Generator().manual_seed(1)
    scorer = TableScorer(torch.randint(0, 3, (4, 8, 8), generator=gen).float())
    triples = torch.tensor([[0, 0, 1], [2, 1, 3], [4, 0, 5]])
    metrics = evaluate(scorer, triples, known=triples, sides=("tail", "head"), ks=(1, 5))
    data = metrics.to_dict()
    assert list(data) == ["tail", "head", "both", "num_queries", "candidates", "restricted"]
    for side in ("tail", "head", "both"):
        assert list(data[side]) == ["realistic", "optimistic", "pessimistic"]
        for ties in ("realistic", "optimistic", "pessimistic"):
            assert list(data[side][ties]) == TIE_KEYS
            assert all(type(v) is float for v in data[side][ties].values())
    assert (data["num_queries"], data["candidates"], data["restricted"]) == (3, "all", False)
    assert metrics.ks == (1, 5)
    assert data["both"]["realistic"]["hits_at_5"] == metrics.both.realistic.hits_at[5]
    assert data["head"]["pessimistic"]["adjusted_hits_at_1"] == metrics.sides["head"].pessimistic.adjusted_hits_at[1]
    assert data["tail"]["optimistic"]["amri"] == metrics.sides["tail"].optimistic.amri
    assert json.loads(json.dumps(data)) == data
    sampled = evaluate(scorer, triples, known=triples, sides=("tail",), candidates=Candidates(3, seed=2))
    assert sampled.corruptions == 3 and sampled.to_dict()["candidates"] == 3 and "head" not in sampled.to_dict()
    assert list(sampled.to_dict()["tail"]["realistic"])[-2:] == ["hits_at_10", "adjusted_hits_at_10"]  # default ks
    # More corruptions asked than any query has: every query is ranked against all of them, and says so.
    every = evaluate(scorer, triples, known=triples, candidates=Candidates(1000, seed=2))
    whole = evaluate(scorer, triples, known=triples)
    assert every.corruptions == 0 and json.dumps(every.to_dict()) == json.dumps(whole.to_dict())  # NaN too


def test_nan_score_names_the_query():
    table = torch.zeros(2, 3, 3)
    table[1, 2, 0] = float("nan")  # head query of (0, r0, 2): anchor 2, inverse relation 1
    with pytest.raises(KgtraceError, match=r"head query #1 \(anchor entity id 2, relation id 1\)"):
        evaluate(TableScorer(table), torch.tensor([[1, 0, 1], [0, 0, 2]]), known=None)


@pytest.mark.parametrize("name,kwargs", [("distmult", {"embedding_dim": 8}),
                                         ("conve", {"embedding_dim": 8, "embedding_height": 2, "output_channels": 3})])
def test_entity_chunked_ranking_equals_whole_rows(name, kwargs):
    from kgtrace.data.answers import AnswerIndex
    from kgtrace.evaluation.sides import rank_side, side_queries
    from kgtrace.models import build_model

    torch.manual_seed(0)
    model = build_model(name, 23, 3, **kwargs).eval()
    with torch.no_grad():  # duplicate entities create exact ties across chunk borders
        model.entity_embeddings[5:9] = model.entity_embeddings[0]
    triples = torch.stack([torch.randint(0, 23, (40,)), torch.randint(0, 3, (40,)), torch.randint(0, 23, (40,))], 1)
    known = AnswerIndex.build(triples, 3)
    for side in ("head", "tail"):
        sq = side_queries(triples[:25], 3, side)
        whole = rank_side(model, sq, known, memory_budget=1 << 30, device=torch.device("cpu"))
        for chunk in (1, 4, 7, 23):
            parts = rank_side(model, sq, known, memory_budget=1 << 30, device=torch.device("cpu"), entity_chunk=chunk)
            assert torch.equal(parts.greater, whole.greater) and torch.equal(parts.equal, whole.equal)
            assert torch.equal(parts.num_candidates, whole.num_candidates)
        tiny = rank_side(model, sq, known, memory_budget=100, device=torch.device("cpu"))  # not one row fits
        assert torch.equal(tiny.greater, whole.greater)


def test_budget_below_one_row_without_entity_chunks_is_an_error():
    with pytest.raises(KgtraceError, match="raise memory_budget"):
        evaluate(TableScorer(torch.zeros(2, 3, 3)), torch.tensor([[0, 0, 1]]), memory_budget=10)
