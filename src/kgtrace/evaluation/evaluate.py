"""Filtered rank evaluation over all entities, chunked to a memory budget.

The same function serves ``kgtrace evaluate``, the Python API and validation
during training, so reported numbers never depend on which door was used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kgtrace.data.answers import AnswerIndex
from kgtrace.errors import KgtraceError
from kgtrace.evaluation.ranks import RankCounts, count_ranks, summarize
from kgtrace.models.base import Scorer

SIDES = ("head", "tail")
# Bytes per candidate score kept alive while ranking one chunk: the float32
# score, two boolean comparison masks and headroom for the model's output.
BYTES_PER_SCORE = 16


@dataclass(frozen=True)
class SideQueries:
    """The queries of one side: (anchor, relation in [0, 2R)) [Q, 2] and true answers [Q]."""

    side: str
    queries: Tensor
    answers: Tensor


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
    bad = ~torch.isfinite(scores).all(dim=1)
    if bool(bad.any()):
        i = start + int(torch.nonzero(bad)[0])
        anchor, relation = (int(x) for x in sq.queries[i])
        raise KgtraceError(
            f"non-finite score for {sq.side} query #{i} (anchor entity id {anchor}, relation id {relation}): "
            "a NaN or infinite score has no rank. Fix: check the checkpoint (a diverged run), "
            "or retrain with --precision fp32 or a lower learning rate"
        )


@torch.inference_mode()
def rank_side(model: Scorer, sq: SideQueries, known: AnswerIndex, *, memory_budget: int, device: torch.device) -> RankCounts:
    """Filtered rank counts of every query of one side, scored against all entities."""
    chunk = query_chunk_size(model.num_entities, memory_budget)
    parts = []
    for start in range(0, len(sq.answers), chunk):
        queries = sq.queries[start : start + chunk]
        scores = model.score_t(queries.to(device)).float()  # [B, E]
        check_finite(scores, sq, start)
        rows, cols = known.lookup(queries)
        parts.append(count_ranks(scores, sq.answers[start : start + chunk].to(device), rows.to(device), cols.to(device)))
    return RankCounts.cat(parts)


def evaluate(
    model: Scorer,
    triples: Tensor,
    *,
    known: Tensor | AnswerIndex | None = None,
    sides: tuple[str, ...] = SIDES,
    ks: tuple[int, ...] = (1, 3, 10),
    memory_budget: int = 2 << 30,
    device: torch.device | str | None = None,
) -> dict:
    """Filtered rank metrics of ``triples`` [n, 3] against all entities.

    known: triples (or a prebuilt index) whose other answers are filtered out; the
    caller decides (train+valid+test for test, train+valid for validation); None
    ranks unfiltered. Returns {"both"|"head"|"tail": {"realistic"|"optimistic"|
    "pessimistic": {metric: value}}, "num_queries": n, "candidates": "all"}.
    """
    if device is None:
        device = next(iter(model.parameters())).device if hasattr(model, "parameters") else torch.device("cpu")
    device = torch.device(device)
    if not isinstance(known, AnswerIndex):
        filter_triples = known if known is not None else triples[:0]
        known = AnswerIndex.build(filter_triples, model.num_relations)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        counts = {s: rank_side(model, side_queries(triples, model.num_relations, s), known,
                               memory_budget=memory_budget, device=device) for s in sides}
    finally:
        if was_training:
            model.train()
    result: dict = {s: summarize(c, ks) for s, c in counts.items()}
    result["both"] = summarize(RankCounts.cat(list(counts.values())), ks)
    result["num_queries"] = len(triples)
    result["candidates"] = "all"
    return result
