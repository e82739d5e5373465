"""Compiled all-entity ranking gives exactly the eager path's rank counts.

Models are small (compilation dominates the time) and compiled once per (model, batch
size): the module-scoped models keep their compiled calls across the tests.
"""

from __future__ import annotations

import pytest
import torch

from kgtrace.core.errors import KgtraceError
from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.compiled import balanced_batch, compiled_ranker, rank_side_compiled
from kgtrace.evaluation.sides import SIDES, query_chunk_size, rank_side, side_queries
from kgtrace.models import ComplEx, ConvE, DistMult

E, R, Q = 64, 3, 1021  # 1021 = 2 * 510 + 1: batch 510 leaves a last chunk of one query
CPU = torch.device("cpu")
BUDGET = 1 << 30


@pytest.fixture(scope="module")
def data():
    gen = torch.Generator().manual_seed(0)
    # Few anchors and relations, so that queries repeat and many have other known answers.
    triples = torch.stack([torch.randint(0, 12, (Q,), generator=gen), torch.randint(0, R, (Q,), generator=gen),
                           torch.randint(0, E, (Q,), generator=gen)], dim=1)
    extra = torch.stack([torch.randint(0, E, (400,), generator=gen), torch.randint(0, R, (400,), generator=gen),
                         torch.randint(0, E, (400,), generator=gen)], dim=1)
    return triples, AnswerIndex.build(torch.cat([triples, extra]), R)


def integer_distmult() -> DistMult:
    """Integer-valued weights: exact scores, many exact ties."""
    gen = torch.Generator().manual_seed(1)
    model = DistMult(E, R, embedding_dim=8)
    with torch.no_grad():
        model.entity_embeddings.copy_(torch.randint(-2, 3, (E, 8), generator=gen))
        model.relation_embeddings.copy_(torch.randint(-1, 2, (R, 8), generator=gen))
    return model.eval()


def tied_conve() -> ConvE:
    """Entities 2k and 2k+1 share embedding and bias: exact ties under any rounding."""
    torch.manual_seed(2)
    model = ConvE(E, R, embedding_dim=16, embedding_height=4, output_channels=4)
    with torch.no_grad():
        model.entity_embeddings[1::2] = model.entity_embeddings[0::2]
        model.entity_bias.normal_()
        model.entity_bias[1::2] = model.entity_bias[0::2]
        for bn in (model.bn0, model.bn1, model.bn2):
            bn.running_mean.normal_(0, 0.3)
            bn.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.fixture(scope="module")
def models():
    return {"distmult": integer_distmult(), "conve": tied_conve()}


def assert_same(compiled, eager):
    assert torch.equal(compiled.greater, eager.greater)
    assert torch.equal(compiled.equal, eager.equal)
    assert torch.equal(compiled.num_candidates, eager.num_candidates)


@pytest.mark.parametrize("batch_size", [509, 510, 511])
@pytest.mark.parametrize("name", ["distmult", "conve"])
def test_identical_to_eager(models, data, name, batch_size):
    model, (triples, known) = models[name], data
    for side in SIDES:
        sq = side_queries(triples, R, side)
        eager = rank_side(model, sq, known, memory_budget=BUDGET, device=CPU)
        assert eager.equal.sum() > 0 and (eager.num_candidates < E).any()  # ties and filtering happen
        compiled = rank_side_compiled(model, sq, known, memory_budget=BUDGET, device=CPU, batch_size=batch_size)
        assert_same(compiled, eager)
        # A prefix: fewer queries than one batch, padded.
        head = side_queries(triples[:37], R, side)
        assert_same(rank_side_compiled(model, head, known, memory_budget=BUDGET, device=CPU, batch_size=batch_size),
                    rank_side(model, head, known, memory_budget=BUDGET, device=CPU))
    stats = compiled_ranker(model, batch_size, CPU).stats
    assert stats.compilations == 1 and stats.recompilations == 0
    assert stats.input_sizes == {Q - (Q // batch_size) * batch_size, batch_size, 37} - {0}


def test_batch_from_memory_budget_reuses_the_compiled_call(models, data):
    model, (triples, known) = models["distmult"], data
    budget = 511 * E * 16  # query_chunk_size 511 -> two runs of 511 (the batch compiled above)
    assert query_chunk_size(E, budget) == 511 and balanced_batch(Q, 511) == 511
    calls_before = compiled_ranker(model, 511, CPU).stats.calls
    sq = side_queries(triples, R, "tail")
    assert_same(rank_side_compiled(model, sq, known, memory_budget=budget, device=CPU),
                rank_side(model, sq, known, memory_budget=budget, device=CPU))
    assert compiled_ranker(model, 511, CPU).stats.calls == calls_before + 2


def test_balanced_batch():
    assert balanced_batch(661, 65536) == 661  # a small split is not padded to the budget's chunk
    assert balanced_batch(1021, 510) == 341  # three runs either way, least padding
    assert balanced_batch(1020, 510) == 510
    assert balanced_batch(0, 100) == 1


def test_nan_names_the_query_as_the_eager_path(models, data):
    model, (triples, known) = models["distmult"], data
    sq = side_queries(triples, R, "head")  # relations R..2R-1 reuse r's vector in DistMult
    with pytest.raises(KgtraceError) as eager:
        poisoned = integer_distmult()
        with torch.no_grad():
            poisoned.relation_embeddings[2, 0] = float("nan")
        rank_side(poisoned, sq, known, memory_budget=BUDGET, device=CPU)
    saved = model.relation_embeddings[2, 0].item()
    with torch.no_grad():
        model.relation_embeddings[2, 0] = float("nan")  # in place: the compiled call reads it at run time
    try:
        with pytest.raises(KgtraceError, match=r"non-finite score for head query #\d+") as compiled:
            rank_side_compiled(model, sq, known, memory_budget=BUDGET, device=CPU, batch_size=510)
    finally:
        with torch.no_grad():
            model.relation_embeddings[2, 0] = saved
    assert str(compiled.value) == str(eager.value)
    assert compiled_ranker(model, 510, CPU).stats.recompilations == 0


def test_complex_and_training_mode(data):
    triples, known = data
    torch.manual_seed(3)
    model = ComplEx(E, R, embedding_dim=8).eval()
    sq = side_queries(triples[:300], R, "head")
    assert_same(rank_side_compiled(model, sq, known, memory_budget=BUDGET, device=CPU),
                rank_side(model, sq, known, memory_budget=BUDGET, device=CPU))
    with pytest.raises(ValueError, match="eval mode"):
        rank_side_compiled(model.train(), sq, known, memory_budget=BUDGET, device=CPU)
