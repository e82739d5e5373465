"""Hand-computed ranks: ties three ways, filtered entries, NaN; metric formulas."""

import math

import pytest
import torch

from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.ranks import RankCounts, count_ranks, count_true, padded_width, summarize


def test_ties_and_filtered_entries_by_hand():
    # Query 0: true col 2 scores 0.5; col 0 (0.9) is another known answer -> filtered;
    # col 1 (0.7) beats it; col 3 ties it; col 4 is below. -> g=1, e=1, n=4.
    # Query 1: true col 0 scores 0.1; everything else is higher except col 4 (tie).
    scores = torch.tensor([[0.9, 0.7, 0.5, 0.5, 0.1],
                           [0.1, 0.2, 0.3, 0.4, 0.1]])
    rows = torch.tensor([0, 0, 1])
    cols = torch.tensor([0, 2, 0])  # (0, 2) and (1, 0) are the true answers themselves: never filtered
    counts = count_ranks(scores.clone(), torch.tensor([2, 0]), rows, cols)
    assert counts.greater.tolist() == [1, 3]
    assert counts.equal.tolist() == [1, 1]
    assert counts.num_candidates.tolist() == [4, 5]
    assert counts.rank("optimistic").tolist() == [2.0, 4.0]
    assert counts.rank("pessimistic").tolist() == [3.0, 5.0]
    assert counts.rank("realistic").tolist() == [2.5, 4.5]


def test_metrics_formulas():
    counts = RankCounts(torch.tensor([0, 1, 9]), torch.tensor([0, 0, 0]), torch.tensor([10, 10, 10]))
    m = summarize(counts, ks=(1, 3)).realistic
    ranks = [1, 2, 10]
    assert m.mr == pytest.approx(sum(ranks) / 3)
    assert m.mrr == pytest.approx(sum(1 / r for r in ranks) / 3)
    assert m.hits_at == {1: pytest.approx(1 / 3), 3: pytest.approx(2 / 3)}
    expected_mr = 5.5  # (n + 1) / 2 with n = 10
    assert m.amr == pytest.approx(m.mr / expected_mr)
    assert m.amri == pytest.approx(1 - (m.mr - 1) / (expected_mr - 1))
    expected_mrr = sum(1 / k for k in range(1, 11)) / 10
    assert m.adjusted_mrr == pytest.approx((m.mrr - expected_mrr) / (1 - expected_mrr))
    assert m.adjusted_hits_at[3] == pytest.approx((2 / 3 - 0.3) / 0.7)


def test_answer_index_lookup_both_directions():
    triples = torch.tensor([[0, 0, 1], [0, 0, 2], [3, 1, 1], [0, 0, 1]])  # a duplicate
    index = AnswerIndex.build(triples, num_relations=2)
    rows, cols = index.lookup(torch.tensor([[0, 0], [1, 2], [1, 3], [2, 2], [4, 0]]))
    got = sorted(zip(rows.tolist(), cols.tolist()))
    # (0, r0) -> {1, 2}; (1, r0^-1) -> {0}; (1, r1^-1) -> {3}; (2, r0^-1) -> {0}; (4, r0) -> none
    assert got == [(0, 1), (0, 2), (1, 0), (2, 3), (3, 0)]
    assert index.num_queries == 5


def test_harmonic_numbers():
    from kgtrace.evaluation.ranks import harmonic

    n = torch.tensor([1.0, 2.0, 10.0], dtype=torch.float64)
    assert harmonic(n).tolist() == pytest.approx([1.0, 1.5, sum(1 / k for k in range(1, 11))])
    assert not math.isnan(float(harmonic(n).sum()))


@pytest.mark.parametrize("width", [1, 8, 13, 2040, 2041, 14505])
def test_count_true_adds_eight_flags_a_word(width):
    gen = torch.Generator().manual_seed(width)
    flags = torch.zeros(5, padded_width(width), dtype=torch.bool)
    flags[:, :width] = torch.rand(5, width, generator=gen) < 0.5
    flags[0, :width] = True  # every flag set: the largest byte sums, a group of 255 words full
    flags[1] = False
    assert padded_width(width) % 8 == 0 and padded_width(width) >= width
    assert torch.equal(count_true(flags), flags.sum(1))
