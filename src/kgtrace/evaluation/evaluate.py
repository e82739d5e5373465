"""Filtered rank evaluation over all entities, chunked to a memory budget.

The same function serves ``kgtrace evaluate``, the Python API and validation
during training, so reported numbers never depend on which door was used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from kgtrace.data.answers import AnswerIndex
from kgtrace.errors import KgtraceError
from kgtrace.evaluation.ranks import RankCounts, SideMetrics, count_ranks, summarize
from kgtrace.models.base import FactorisedScorer, Scorer

if TYPE_CHECKING:
    from kgtrace.evaluation.candidates import CandidateRestriction

SIDES = ("head", "tail")
# Bytes per candidate score kept alive while ranking one chunk: the float32
# score, two boolean comparison masks and headroom for the model's output.
BYTES_PER_SCORE = 16


@dataclass(frozen=True)
class SideQueries:
    """The queries of one side: (anchor, relation in [0, 2R)) [Q, 2] and true answers [Q].

    offset: index of the first query among all queries of its side (a process of a
    distributed job ranks a slice): sampled corruptions are keyed and errors named by it.
    """

    side: str
    queries: Tensor
    answers: Tensor
    offset: int = 0


def side_queries(triples: Tensor, num_relations: int, side: str) -> SideQueries:
    """Tail side asks (h, r, ?) for t; head side asks (t, r + R, ?) for h (the inverse query)."""
    h, r, t = triples.long().unbind(1)
    if side == "tail":
        return SideQueries(side, torch.stack([h, r], 1), t)
    if side == "head":
        return SideQueries(side, torch.stack([t, r + num_relations], 1), h)
    raise KgtraceError(f"side must be 'head' or 'tail', got {side!r}")


def query_chunk_size(num_entities: int, memory_budget: int) -> int:
    """How many queries to score at once so that their [B, E] scores fit ``memory_budget`` bytes."""
    return max(1, min(65536, memory_budget // (num_entities * BYTES_PER_SCORE)))


def check_finite(scores: Tensor, sq: SideQueries, start: int) -> None:
    """Raise naming the first query whose scores contain NaN or infinity."""
    if bool(torch.isfinite(scores.sum())):  # NaN and inf propagate: a finite sum proves every score finite
        return
    bad = ~torch.isfinite(scores).all(dim=1)
    if bool(bad.any()):
        i = start + int(torch.nonzero(bad)[0])
        anchor, relation = (int(x) for x in sq.queries[i])
        i += sq.offset
        raise KgtraceError(
            f"non-finite score for {sq.side} query #{i} (anchor entity id {anchor}, relation id {relation}): "
            "a NaN or infinite score has no rank. Fix: check the checkpoint (a diverged run), "
            "or retrain with --precision fp32 or a lower learning rate"
        )


@torch.inference_mode()
def rank_side(model: Scorer, sq: SideQueries, known: AnswerIndex, *, memory_budget: int, device: torch.device,
              entity_chunk: int = 0) -> RankCounts:
    """Filtered rank counts of every query of one side, scored against all entities.

    Queries are chunked so that their [B, E] scores fit ``memory_budget``; when not even one
    row fits (or ``entity_chunk`` is given), entities are chunked too (see rank_entity_chunked).
    """
    if entity_chunk or model.num_entities * BYTES_PER_SCORE > memory_budget:
        if not isinstance(model, FactorisedScorer):
            raise KgtraceError(f"memory_budget={memory_budget} bytes cannot hold one query's {model.num_entities} "
                               "scores, and this model cannot score entities in chunks. Fix: raise --memory-budget")
        return rank_entity_chunked(model, sq, known, memory_budget=memory_budget, device=device,
                                   entity_chunk=entity_chunk)
    chunk = query_chunk_size(model.num_entities, memory_budget)
    parts = []
    for start in range(0, len(sq.answers), chunk):
        queries = sq.queries[start : start + chunk]
        scores = model.score_t(queries.to(device)).float()  # [B, E]
        check_finite(scores, sq, start)
        rows, cols = known.lookup(queries)
        parts.append(count_ranks(scores, sq.answers[start : start + chunk].to(device), rows.to(device), cols.to(device)))
    return RankCounts.cat(parts)


def rank_entity_chunked(model: FactorisedScorer, sq: SideQueries, known: AnswerIndex, *, memory_budget: int,
                        device: torch.device, entity_chunk: int = 0, query_chunk: int = 256) -> RankCounts:
    """All-entity ranking for graphs where one query's scores exceed the budget.

    Each query chunk is encoded once and decoded entity chunk by entity chunk, twice: the
    first pass reads each true answer's score from the chunk that holds it, the second
    counts higher and tied candidates. Both passes decode the same chunks, so the true
    score is compared with candidates computed by exactly the same arithmetic.
    """
    num_entities = model.num_entities
    entity_chunk = entity_chunk or max(1, memory_budget // (query_chunk * BYTES_PER_SCORE))
    bounds = list(range(0, num_entities, entity_chunk)) + [num_entities]
    parts = []
    for start in range(0, len(sq.answers), query_chunk):
        queries = sq.queries[start : start + query_chunk]
        answers = sq.answers[start : start + query_chunk].to(device)
        q = model.encode_query(queries.to(device))  # [B, D]
        rows, cols = (x.to(device) for x in known.lookup(queries))
        other = cols != answers[rows]  # known answers other than the true one are filtered
        rows, cols = rows[other], cols[other]
        true_scores = torch.empty(len(answers), device=device)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            scores = model.decode(q, lo, hi).float()  # [B, hi - lo]
            check_finite(scores, sq, start)
            inside = (answers >= lo) & (answers < hi)
            true_scores[inside] = scores[inside, answers[inside] - lo]
        greater = torch.zeros(len(answers), dtype=torch.long, device=device)
        equal = torch.zeros_like(greater)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            scores = model.decode(q, lo, hi).float()  # [B, hi - lo]
            drop = (cols >= lo) & (cols < hi)
            scores[rows[drop], cols[drop] - lo] = float("-inf")
            inside = torch.nonzero((answers >= lo) & (answers < hi)).squeeze(1)
            scores[inside, answers[inside] - lo] = float("-inf")  # the true answer does not rank against itself
            column = true_scores.unsqueeze(1)  # [B, 1]
            greater += (scores > column).sum(1)
            equal += (scores == column).sum(1)
        filtered = torch.bincount(rows, minlength=len(answers))
        parts.append(RankCounts(greater.cpu(), equal.cpu(), (num_entities - filtered).cpu()))
    return RankCounts.cat(parts)


@dataclass(frozen=True)
class Candidates:
    """Against what each true answer is ranked.

    corruptions: 0 ranks against all entities; K > 0 against K sampled filtered
    corruptions per query (deterministic given ``seed``). restriction: only entities
    of allowed categories may answer (None: all). compile: run the all-entity path
    through torch.compile (sampled and restricted ranking run eagerly).
    """

    corruptions: int = 0
    seed: int = 0
    restriction: "CandidateRestriction | None" = None
    compile: bool = False


@dataclass(frozen=True)
class QueryRanks:
    """Per-query results of one evaluation: rank counts per side, in the order of the triples."""

    triples: Tensor  # [n, 3] the ranked triples
    counts: dict[str, RankCounts]  # side -> counts [n]
    candidates: Candidates


def rank_side_with(model: Scorer, sq: SideQueries, known: AnswerIndex, candidates: Candidates, *,
                   memory_budget: int, device: torch.device) -> RankCounts:
    """Rank one side against the chosen candidates."""
    # Imported here: those modules build on this one.
    if candidates.corruptions:
        from kgtrace.evaluation import candidates as cand

        return cand.rank_side_sampled(model, sq, known, num_corruptions=candidates.corruptions,
                                      seed=candidates.seed, memory_budget=memory_budget, device=device,
                                      allowed=candidates.restriction)
    if candidates.restriction is not None:
        from kgtrace.evaluation import candidates as cand

        return cand.rank_side_restricted(model, sq, known, candidates.restriction, memory_budget=memory_budget,
                                         device=device)
    if candidates.compile:
        from kgtrace.evaluation.compiled import rank_side_compiled

        return rank_side_compiled(model, sq, known, memory_budget=memory_budget, device=device)
    return rank_side(model, sq, known, memory_budget=memory_budget, device=device)


def rank_queries(
    model: Scorer,
    triples: Tensor,
    *,
    known: Tensor | AnswerIndex | None = None,
    sides: tuple[str, ...] = SIDES,
    candidates: Candidates = Candidates(),
    memory_budget: int = 2 << 30,
    device: torch.device | str | None = None,
) -> QueryRanks:
    """Filtered rank counts of every query of ``triples`` [n, 3]; see :func:`evaluate`."""
    device, known = ranking_inputs(model, triples, known, device)
    with eval_mode(model):
        counts = {side: rank_side_with(model, side_queries(triples, model.num_relations, side), known, candidates,
                                       memory_budget=memory_budget, device=device) for side in sides}
    return QueryRanks(triples, counts, candidates)


def ranking_inputs(model: Scorer, triples: Tensor, known: Tensor | AnswerIndex | None,
                   device: torch.device | str | None) -> tuple[torch.device, AnswerIndex]:
    """The device to rank on (None: the model's) and the known triples as an index (None: none)."""
    device = model_device(model) if device is None else torch.device(device)
    if not isinstance(known, AnswerIndex):
        known = AnswerIndex.build(known if known is not None else triples[:0], model.num_relations)
    return device, known


@contextmanager
def eval_mode(model: Scorer) -> Iterator[None]:
    """The model in eval mode for the block (BatchNorm on running statistics, no dropout); its mode restored after."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def model_device(model: Scorer) -> torch.device:
    parameters = getattr(model, "parameters", None)
    first = next(iter(parameters()), None) if parameters else None
    return first.device if first is not None else torch.device("cpu")


@dataclass(frozen=True)
class Metrics:
    """Filtered rank metrics of one evaluation; :meth:`to_dict` is the JSON ``kgtrace evaluate --out`` writes."""

    sides: dict[str, SideMetrics]  # "head" and/or "tail", in the order they were ranked
    both: SideMetrics  # the queries of every side ranked, together
    ks: tuple[int, ...]  # k of each Hits@k, in order, each once
    num_queries: int  # triples ranked (each asks one query per side)
    corruptions: int  # K sampled corruptions per query; 0: ranked against all entities
    restricted: bool  # candidates restricted by node category

    def to_dict(self) -> dict:
        """{side: ..., "both": {"realistic"|"optimistic"|"pessimistic": {metric: value}}, "num_queries": n,
        "candidates": "all" or K, "restricted": bool}, keys in that order."""
        out: dict = {side: metrics.to_dict() for side, metrics in self.sides.items()}
        out["both"] = self.both.to_dict()
        out["num_queries"] = self.num_queries
        out["candidates"] = self.corruptions or "all"
        out["restricted"] = self.restricted
        return out


def metrics_of(ranks: QueryRanks, ks: tuple[int, ...] = (1, 3, 10)) -> Metrics:
    """The metrics of per-query ranks; see :func:`evaluate`."""
    ks = tuple(dict.fromkeys(ks))  # a k asked twice is one Hits@k, as one JSON key
    return Metrics(
        sides={side: summarize(counts, ks) for side, counts in ranks.counts.items()},
        both=summarize(RankCounts.cat(list(ranks.counts.values())), ks),
        ks=ks,
        num_queries=len(ranks.triples),
        corruptions=ranks.candidates.corruptions,
        restricted=ranks.candidates.restriction is not None,
    )


def evaluate(
    model: Scorer,
    triples: Tensor,
    *,
    known: Tensor | AnswerIndex | None = None,
    sides: tuple[str, ...] = SIDES,
    ks: tuple[int, ...] = (1, 3, 10),
    candidates: Candidates = Candidates(),
    memory_budget: int = 2 << 30,
    device: torch.device | str | None = None,
) -> Metrics:
    """Filtered rank metrics of ``triples`` [n, 3].

    known: triples (or a prebuilt index) whose other answers are filtered out; the
    caller decides (train+valid+test for test, train+valid for validation); None
    ranks unfiltered. candidates: all entities (default), K sampled corruptions, a
    type restriction, compiled or eager. Returns :class:`Metrics`, e.g.
    ``evaluate(...).both.realistic.mrr``; ``.to_dict()`` for JSON.
    """
    ranks = rank_queries(model, triples, known=known, sides=sides, candidates=candidates,
                         memory_budget=memory_budget, device=device)
    return metrics_of(ranks, ks)
