"""Filtered rank evaluation: against all entities, sampled corruptions or a type restriction; metrics.

The same function serves ``kgtrace evaluate``, the Python API and validation
during training, so reported numbers never depend on which door was used. The
ranking paths themselves live below it: all entities eagerly (evaluation.sides),
compiled (evaluation.compiled), sampled or restricted (evaluation.candidates).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import polars as pl
import torch
from torch import Tensor

from kgtrace.data.answers import AnswerIndex, answering
from kgtrace.display.frames import FrameKind, as_frame
from kgtrace.evaluation.candidates import CandidateRestriction, rank_side_restricted, rank_side_sampled
from kgtrace.evaluation.compiled import rank_side_compiled
from kgtrace.evaluation.ranks import RankCounts, SideMetrics, summarize
from kgtrace.evaluation.sides import SIDES, SideQueries, rank_side, side_queries
from kgtrace.models.base import Scorer


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
    restriction: CandidateRestriction | None = None
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
    if candidates.corruptions:
        return rank_side_sampled(model, sq, known, num_corruptions=candidates.corruptions, seed=candidates.seed,
                                 memory_budget=memory_budget, device=device, allowed=candidates.restriction)
    if candidates.restriction is not None:
        return rank_side_restricted(model, sq, known, candidates.restriction, memory_budget=memory_budget,
                                    device=device)
    if candidates.compile:
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
    """Filtered rank counts of every query of ``triples`` [n, 3]; see `evaluate`."""
    device, known = ranking_inputs(model, triples, known, device)
    with eval_mode(model):
        counts = {side: rank_side_with(model, side_queries(triples, model.num_relations, side), known, candidates,
                                       memory_budget=memory_budget, device=device) for side in sides}
    return QueryRanks(triples, counts, candidates)


def ranking_inputs(model: Scorer, triples: Tensor, known: Tensor | AnswerIndex | None,
                   device: torch.device | str | None) -> tuple[torch.device, AnswerIndex]:
    """The device to rank on (None: the model's) and the known triples as an index (None: none); of known
    triples given as a tensor, only those that answer a query of ``triples`` are indexed (`answering`)."""
    device = model_device(model) if device is None else torch.device(device)
    if not isinstance(known, AnswerIndex):
        known = triples[:0] if known is None else answering(known, triples, model.num_relations, device)
        known = AnswerIndex.build(known, model.num_relations)
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
    """Filtered rank metrics of one evaluation; `to_dict` is the JSON ``kgtrace evaluate --out`` writes."""

    sides: dict[str, SideMetrics]  # "head" and/or "tail", in the order they were ranked
    both: SideMetrics  # the queries of every side ranked, together
    ks: tuple[int, ...]  # k of each Hits@k, in order, each once
    num_queries: int  # triples ranked (each asks one query per side)
    corruptions: int  # K sampled corruptions per query; 0: ranked against all (eligible) entities
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

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """One row per side ("head", "tail", "both"), tie policy and metric: columns side, ties, metric, value
        (as PyKEEN's ``metric_results.to_df()``); kind "polars" or "pandas"."""
        rows = [(side, ties, metric, value)
                for side, metrics in [*self.sides.items(), ("both", self.both)]
                for ties, values in metrics.to_dict().items() for metric, value in values.items()]
        table = pl.DataFrame(rows, schema=["side", "ties", "metric", "value"], orient="row")
        return as_frame(table, kind)

    def __repr__(self) -> str:
        r = self.both.realistic
        hits = ", ".join(f"Hits@{k} {r.hits_at[k]:.4f}" for k in self.ks)
        return (f"Metrics({self.num_queries} triples, {'/'.join(self.sides)}, candidates {self.corruptions or 'all'}"
                f"{', restricted' if self.restricted else ''}: realistic MRR {r.mrr:.4f}, MR {r.mr:.2f}, {hits}; "
                ".to_df() for every metric)")


def metrics_of(ranks: QueryRanks, ks: tuple[int, ...] = (1, 3, 10)) -> Metrics:
    """The metrics of per-query ranks; see `evaluate`."""
    ks = tuple(dict.fromkeys(ks))  # a k asked twice is one Hits@k, as one JSON key
    counts = RankCounts.cat(list(ranks.counts.values()))
    corruptions = ranks.candidates.corruptions
    if corruptions and len(counts.num_candidates) and int(counts.num_candidates.max()) - 1 < corruptions:
        # No query had K eligible corruptions, so each was ranked against all of them: say "all", not K.
        corruptions = 0
    return Metrics(
        sides={side: summarize(counts, ks) for side, counts in ranks.counts.items()},
        both=summarize(counts, ks),
        ks=ks,
        num_queries=len(ranks.triples),
        corruptions=corruptions,
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

    Args:
        model: any scorer (`Scorer`): a run's ``model``, a prover's, a hybrid.
        triples: the ranked triples [n, 3], ids of the model's dataset.
        known: triples (or a prebuilt index) whose other answers are filtered out; the caller decides
            (train+valid+test for test, train+valid for validation); None ranks unfiltered.
        sides: the sides ranked: ``("head", "tail")`` or one of them.
        ks: the k of each Hits@k.
        candidates: all entities (default), K sampled corruptions, a type restriction, compiled or eager.
        memory_budget: bytes for the scores held at once.
        device: where to rank; None: the model's.

    Returns:
        `Metrics`, e.g. ``evaluate(...).both.realistic.mrr``; ``.to_dict()`` for JSON, ``.to_df()`` for a table.
    """
    ranks = rank_queries(model, triples, known=known, sides=sides, candidates=candidates,
                         memory_budget=memory_budget, device=device)
    return metrics_of(ranks, ks)
