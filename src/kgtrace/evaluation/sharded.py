"""Filtered ranking split over the processes of a distributed job, with the single process's exact results.

Each side's queries are cut into the chunks one process would score (a BLAS product's
rounding depends on how many rows it multiplies, so a query scored in another chunk could
rank differently when a candidate is within rounding of the true answer). Each process ranks
a run of whole chunks, starting at its queries' global index (sampled corruptions are keyed
by it), and the per-query counts are gathered in order: every process then holds exactly
the counts, and so the metrics, of one process. Gathering counts rather than summing
metrics keeps float sums such as MRR's in the single process's order, bit for bit.

The parallelism is therefore in whole chunks: a split that fits one chunk (a small dataset
under a large ``memory_budget``) is ranked by the first process alone.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kgtrace.compute.distributed import ONE, World, block_split
from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation import candidates as cand
from kgtrace.evaluation.compiled import balanced_batch, rank_side_compiled
from kgtrace.evaluation.evaluate import (
    Candidates,
    Metrics,
    QueryRanks,
    eval_mode,
    metrics_of,
    rank_queries,
    rank_side_with,
    ranking_inputs,
)
from kgtrace.evaluation.ranks import RankCounts
from kgtrace.evaluation.sides import BYTES_PER_SCORE, SIDES, SideQueries, query_chunk_size, side_queries
from kgtrace.models.base import Scorer

__all__ = ["evaluate_sharded", "queries_per_chunk", "rank_queries_sharded"]

# rank_entity_chunked's default query chunk, used when one query's scores exceed the budget.
ENTITY_CHUNKED_QUERIES = 256
ALL_ENTITIES = Candidates()


def queries_per_chunk(model: Scorer, candidates: Candidates, memory_budget: int, num_queries: int) -> int:
    """The query chunk of the path `rank_side_with` takes for these candidates.

    Mirrors its dispatch; every path's chunk depends only on the model and the budget, except
    the compiled path's batch, which the whole side's query count balances.
    """
    if candidates.corruptions:
        return cand.sampled_queries_per_chunk(model, memory_budget)
    if candidates.restriction is not None:
        return cand.restricted_queries_per_chunk(model.num_entities, memory_budget)
    if candidates.compile:
        return balanced_batch(num_queries, query_chunk_size(model.num_entities, memory_budget))
    if model.num_entities * BYTES_PER_SCORE > memory_budget:
        return ENTITY_CHUNKED_QUERIES
    return query_chunk_size(model.num_entities, memory_budget)


def _rank_part(model: Scorer, part: SideQueries, known: AnswerIndex, candidates: Candidates, *, chunk: int,
               memory_budget: int, device: torch.device) -> RankCounts:
    """This process's queries of one side, ranked as the single process ranks them."""
    if not len(part.answers):
        empty = torch.zeros(0, dtype=torch.long)
        return RankCounts(empty, empty, empty)
    if candidates.compile and not candidates.corruptions and candidates.restriction is None:
        # The whole side's batch, not one balanced for this part: the same compiled runs as one process.
        return rank_side_compiled(model, part, known, memory_budget=memory_budget, device=device, batch_size=chunk)
    return rank_side_with(model, part, known, candidates, memory_budget=memory_budget, device=device)


def _gather(counts: RankCounts, sizes: list[int], world: World) -> RankCounts:
    stacked = torch.stack([counts.greater, counts.equal, counts.num_candidates], dim=1)  # [n_rank, 3] long
    everything = world.all_gather_cat(stacked, sizes)  # [n, 3] in query order
    return RankCounts(everything[:, 0].contiguous(), everything[:, 1].contiguous(), everything[:, 2].contiguous())


def rank_queries_sharded(
    model: Scorer,
    triples: Tensor,
    *,
    world: World = ONE,
    known: Tensor | AnswerIndex | None = None,
    sides: tuple[str, ...] = SIDES,
    candidates: Candidates = ALL_ENTITIES,
    memory_budget: int = 2 << 30,
    device: torch.device | str | None = None,
) -> QueryRanks:
    """`rank_queries`, split over ``world``'s processes.

    Every process must call it with the same arguments; every process returns the counts of
    all queries, equal to one process's. With a world of one it is ``rank_queries``.
    """
    if not world.distributed:
        return rank_queries(model, triples, known=known, sides=sides, candidates=candidates,
                            memory_budget=memory_budget, device=device)
    device, known = ranking_inputs(model, triples, known, device)
    counts = {}
    with eval_mode(model):
        for side in sides:
            sq = side_queries(triples, model.num_relations, side)
            chunk = queries_per_chunk(model, candidates, memory_budget, len(sq.answers))
            sizes = block_split(len(sq.answers), chunk, world.size)
            start = sum(sizes[: world.rank])
            stop = start + sizes[world.rank]
            part = SideQueries(side, sq.queries[start:stop], sq.answers[start:stop], offset=start)
            local = _rank_part(model, part, known, candidates, chunk=chunk, memory_budget=memory_budget,
                               device=device)
            counts[side] = _gather(local, sizes, world)
    return QueryRanks(triples, counts, candidates)


def evaluate_sharded(model: Scorer, triples: Tensor, *, world: World = ONE, ks: tuple[int, ...] = (1, 3, 10),
                     **kwargs) -> Metrics:
    """`evaluate` split over ``world``'s processes (the same metrics, exactly)."""
    return metrics_of(rank_queries_sharded(model, triples, world=world, **kwargs), ks)
