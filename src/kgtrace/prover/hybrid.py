"""A hybrid's prover weight, chosen on validation triples.

A hybrid scores a triple by ``embedding logit + w x proof part`` (`HybridScorer`). This module
picks w from a grid (``HYBRID_WEIGHTS``, doubled past its end while its largest weight ranks best) by the
one-standard-error rule (Hastie, Tibshirani and Friedman,
*The Elements of Statistical Learning*, 2nd ed., section 7.10): the smallest weight whose validation
MRR lies within one standard error of the best weight's. The standard error is that of the mean
paired difference of reciprocal ranks (the same validation queries under both weights), so it says
whether the validation set can tell the two weights apart at all.

Why not the best weight outright: over a few hundred validation queries the MRR curve is flat within
noise from some weight on, and its maximum lands anywhere on that plateau. Among weights that validation
cannot tell apart, the rule keeps the smallest: the one that leaves the most of the ranking to the
embedding model, the simpler of the two components (weight 0 is the embedding model alone).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from kgtrace.core.config import write_yaml
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.io import atomic_write_text
from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.evaluate import model_device, rank_queries
from kgtrace.evaluation.sides import side_queries
from kgtrace.models.base import Scorer, inverse_queries
from kgtrace.prover.config import HYBRID_WEIGHTS, MAX_WEIGHT
from kgtrace.prover.run import CONFIG_FILE, load_prover_run
from kgtrace.prover.scorer import proof_part

__all__ = ["ScoreTable", "WeightChoice", "choose_hybrid_weight", "choose_weight", "distinct_queries", "reciprocal_ranks",
           "weigh_prover_run"]


@dataclass(frozen=True)
class WeightChoice:
    """The one-standard-error choice of a hybrid weight, with the validation curve it was read from."""

    weight: float  # the smallest weight within one standard error of the best
    best: float  # the weight of the highest validation MRR (the smallest of equals)
    mrr: dict[float, float]  # validation MRR of each weight
    gap: dict[float, float]  # best's MRR minus this weight's: the mean paired difference of reciprocal ranks
    se: dict[float, float]  # the standard error of that mean difference
    queries: int  # validation queries (both sides of each triple)

    def to_dict(self, digits: int = 4) -> dict:
        """JSON-shaped, weights as keys, values rounded to ``digits``."""
        curve = {key: {w: round(v, digits) for w, v in getattr(self, key).items()} for key in ("mrr", "gap", "se")}
        return {"weight": self.weight, "best": self.best, "queries": self.queries, "rule": "one standard error",
                **curve}


def choose_weight(reciprocal_ranks: dict[float, Tensor]) -> WeightChoice:
    """The one-standard-error choice among weights, from each weight's reciprocal ranks [Q] of the same
    validation queries in the same order."""
    weights = sorted(reciprocal_ranks)
    sizes = {len(reciprocal_ranks[w]) for w in weights}
    assert weights and len(sizes) == 1 and 0 not in sizes, "one non-empty [Q] of reciprocal ranks per weight"
    rr = {w: reciprocal_ranks[w].double() for w in weights}
    mrr = {w: float(rr[w].mean()) for w in weights}
    best = max(weights, key=lambda w: mrr[w])  # max() keeps the first, the smallest, of equals
    gap, se = {}, {}
    for w in weights:
        diff = rr[best] - rr[w]  # [Q] paired: the same query under both weights
        gap[w] = float(diff.mean())
        se[w] = float(diff.std()) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
    weight = next(w for w in weights if gap[w] <= se[w])  # the best itself qualifies: gap 0
    return WeightChoice(weight, best, mrr, gap, se, sizes.pop())


def distinct_queries(triples: Tensor, num_relations: int) -> Tensor:
    """The distinct (anchor, relation-or-inverse) tail queries of both sides of ``triples`` [n, 3]: [Q, 2], sorted."""
    sides = [side_queries(triples, num_relations, side).queries for side in ("tail", "head")]
    return torch.unique(torch.cat(sides), dim=0)


class ScoreTable(nn.Module):
    """A Scorer reading precomputed rows: ``rows[i]`` [E] scores every entity for ``queries[i]``, an
    (anchor, relation-or-inverse) tail query, as ``score_t`` would."""

    def __init__(self, queries: Tensor, rows: Tensor, num_entities: int, num_relations: int):
        super().__init__()
        assert rows.shape == (len(queries), num_entities), "one [E] row per query"
        self.queries, self.rows = queries, rows
        self.num_entities, self.num_relations = num_entities, num_relations
        self._index = {(a, r): i for i, (a, r) in enumerate(queries.tolist())}

    @staticmethod
    @torch.no_grad()
    def of(scorer: Scorer, triples: Tensor, chunk: int = 64) -> "ScoreTable":
        """Every distinct query of both sides of ``triples`` [n, 3], scored over all entities by ``scorer``."""
        queries = distinct_queries(triples, scorer.num_relations)
        device = model_device(scorer)  # a model loaded on CUDA takes its queries there; the table stays on the CPU
        rows = torch.cat([scorer.score_t(part.to(device)).float().cpu() for part in queries.split(chunk)])  # [Q, E]
        return ScoreTable(queries, rows, scorer.num_entities, scorer.num_relations)

    def with_rows(self, rows: Tensor) -> "ScoreTable":
        """The same queries with other rows [Q, E]."""
        return ScoreTable(self.queries, rows, self.num_entities, self.num_relations)

    def score_t(self, hr: Tensor) -> Tensor:
        """Rows of the queries [B, 2]: [B, E]; a query not in the table raises KeyError."""
        return self.rows[[self._index[(a, r)] for a, r in hr.tolist()]]

    def score_h(self, rt: Tensor) -> Tensor:
        return self.score_t(inverse_queries(rt, self.num_relations))

    def score_hrt(self, hrt: Tensor) -> Tensor:
        return self.score_t(hrt[:, :2]).gather(1, hrt[:, 2:]).squeeze(1)


def reciprocal_ranks(scorer: Scorer, triples: Tensor, known: AnswerIndex) -> Tensor:
    """Filtered reciprocal ranks (realistic ties) against all entities: [2n], the tail queries of
    ``triples`` [n, 3] then their head queries."""
    ranks = rank_queries(scorer, triples, known=known)
    return torch.cat([1.0 / counts.rank("realistic") for counts in ranks.counts.values()])


def choose_hybrid_weight(prover: Scorer, embedding: Scorer, triples: Tensor, known: AnswerIndex,
                         weights: tuple[float, ...] | None = None) -> WeightChoice:
    """The weight of ``embedding logit + w x proof_part(prover score)`` (HybridScorer's score) chosen on
    ``triples`` [n, 3] (validation triples; ``known`` filters them) by the one-standard-error rule.

    weights: the grid, exactly; None: ``HYBRID_WEIGHTS``, doubled past 64 while its largest weight ranks
    strictly best (up to ``MAX_WEIGHT``). Rule scores can sit on another scale than a model's logits, so
    the best weight may lie past any fixed grid, and a curve still rising at the grid's end says nothing
    of where it peaks.

    Each scorer scores every query once; the weights mix those rows.
    """
    proofs, logits = ScoreTable.of(prover, triples), ScoreTable.of(embedding, triples)
    part = proof_part(proofs.rows, prover.proof_line)  # [Q, E]

    def at(w: float) -> Tensor:  # [2n] reciprocal ranks of the hybrid with weight w
        return reciprocal_ranks(logits.with_rows(logits.rows + w * part), triples, known)

    rr = {w: at(w) for w in (HYBRID_WEIGHTS if weights is None else weights)}
    choice = choose_weight(rr)
    # choose_weight's best is the smallest of equal MRRs: the largest weight is best only when strictly so
    while weights is None and choice.best == max(rr) < MAX_WEIGHT:
        rr[2 * max(rr)] = at(2 * max(rr))
        choice = choose_weight(rr)
    return choice


WEIGHT_FILE = "hybrid-weight.json"


def weigh_prover_run(run_dir: str | Path, valid_triples: int = 200, weights: tuple[float, ...] | None = None,
                     device: torch.device | str = "cpu") -> WeightChoice:
    """Choose a hybrid prover run's weight on its first ``valid_triples`` validation triples (0: all;
    filtered by train + valid) and set it: ``hybrid_weight`` in prover.yaml, the curve in hybrid-weight.json.
    ``weights``: the grid (None: the default one, extended as `choose_hybrid_weight` says).

    Both files are written whole or not at all; prover.yaml last, so a run whose config holds the new
    weight also holds the curve that chose it.
    """
    problems = [f"weight {w}: must be 0 or more" for w in weights or () if not w >= 0]
    if valid_triples < 0:
        problems.append(f"valid_triples={valid_triples}: must be 0 (all) or more")
    if weights is not None and not weights:
        problems.append("weights: give at least one")
    if problems:
        raise ConfigError(problems)
    run = load_prover_run(run_dir, device=device)
    if not run.config.hybrid():
        raise KgtraceError(f"{run.path}: not a hybrid prover run (no embedding_run or link_weight in {CONFIG_FILE}), "
                           "so it has no weight to choose. Fix: write the run with kgtrace prove ... --embedding-run RUN, "
                           "or kgtrace prove train ... --link-weight W")
    ds = run.dataset
    triples = ds.valid[:valid_triples] if valid_triples else ds.valid
    if not len(triples):
        raise KgtraceError(f"{run.path}: the dataset {run.config.dataset} has no validation triples to choose the "
                           "weight on. Fix: use a dataset with a validation split")
    known = AnswerIndex.build(ds.known_triples("valid"), ds.num_relations)
    grid = None if weights is None else tuple(sorted(weights))
    choice = choose_hybrid_weight(run.model.prover, run.model.embedding, triples, known, grid)
    record = {**choice.to_dict(), "valid_triples": len(triples), "previous_weight": run.config.hybrid_weight}
    atomic_write_text(run.path / WEIGHT_FILE, json.dumps(record, indent=2) + "\n")
    write_yaml(dataclasses.replace(run.config, hybrid_weight=choice.weight).to_dict(), run.path / CONFIG_FILE)
    return choice
