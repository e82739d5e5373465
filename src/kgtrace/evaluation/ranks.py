"""Ranks with ties handled three ways, and the metrics computed from them.

For a query whose true answer scores s, among n candidates (the true answer
included, filtered entries excluded), with g candidates scoring higher and e
other candidates scoring exactly s:

    optimistic  = 1 + g            (ties broken in the true answer's favour)
    pessimistic = 1 + g + e        (ties broken against it)
    realistic   = 1 + g + e / 2    (the expected rank under random tie-breaking)

These match PyKEEN's RankBasedEvaluator. Adjusted metrics follow Berrendorf et al.
(2020/2022): each metric is compared with its expectation under uniformly random
scores over the same candidate-set sizes, so results over different n compare.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

TIES = ("realistic", "optimistic", "pessimistic")


@dataclass(frozen=True)
class RankCounts:
    """Per-query counts from which all three ranks follow. All tensors [Q]."""

    greater: Tensor  # candidates scoring strictly higher than the true answer (long)
    equal: Tensor  # other candidates scoring exactly as high (long)
    num_candidates: Tensor  # candidates after filtering, the true answer included (long)

    def rank(self, ties: str) -> Tensor:
        """Float ranks [Q] for one tie policy."""
        g, e = self.greater.double(), self.equal.double()
        if ties == "optimistic":
            return 1.0 + g
        if ties == "pessimistic":
            return 1.0 + g + e
        if ties == "realistic":
            return 1.0 + g + e / 2.0
        raise ValueError(f"ties must be one of {TIES}, got {ties!r}")

    def cpu(self) -> "RankCounts":
        return RankCounts(self.greater.cpu(), self.equal.cpu(), self.num_candidates.cpu())

    @staticmethod
    def empty() -> "RankCounts":
        none = torch.zeros(0, dtype=torch.long)
        return RankCounts(none, none, none)

    @staticmethod
    def cat(parts: list["RankCounts"]) -> "RankCounts":
        return RankCounts(
            torch.cat([p.greater for p in parts]),
            torch.cat([p.equal for p in parts]),
            torch.cat([p.num_candidates for p in parts]),
        )


def ranked(scores: Tensor) -> Tensor:
    """Scores as they are ranked: float64 as given (a rule scorer's exact maxplus keys, whose order float32 would
    merge), any other dtype in float32."""
    return scores if scores.dtype == torch.float64 else scores.float()


def count_ranks(scores: Tensor, true_cols: Tensor, filter_rows: Tensor, filter_cols: Tensor) -> RankCounts:
    """Rank counts of one chunk of queries against all their candidates.

    scores: [B, C] float; true_cols: [B] column of each true answer; (filter_rows,
    filter_cols): [P] known answers to exclude (the true answer may be among them;
    it is never excluded from its own ranking). Modifies ``scores`` in place. The counts stay on
    the scores' device (a caller reads them once for many chunks: `RankCounts.cpu`).
    """
    rows = torch.arange(len(true_cols), device=scores.device)
    true_scores = scores[rows, true_cols].clone()  # [B]
    is_other = filter_cols != true_cols[filter_rows]
    # -inf can never beat or tie a finite true score, so filtered entries drop out.
    scores[filter_rows[is_other], filter_cols[is_other]] = float("-inf")
    scores[rows, true_cols] = float("-inf")
    column = true_scores.unsqueeze(1)  # [B, 1]
    width = scores.shape[1]
    # The comparisons land in a buffer laid out for count_true (its padding stays False).
    flags = torch.zeros(len(true_cols), padded_width(width), dtype=torch.bool, device=scores.device)  # [B, W]
    torch.gt(scores, column, out=flags[:, :width])
    greater = count_true(flags)
    torch.eq(scores, column, out=flags[:, :width])
    equal = count_true(flags)
    filtered = torch.bincount(filter_rows[is_other], minlength=len(true_cols))
    return RankCounts(greater, equal, scores.shape[1] - filtered)  # on the scores' device


def padded_width(width: int) -> int:
    """Columns of a flag buffer for `count_true` holding ``width`` flags: whole words of 8 flags, in
    G groups of k <= 255 words each."""
    words = -(-width // 8)
    groups = -(-words // 255)
    return 8 * groups * -(-words // groups)


def count_true(flags: Tensor) -> Tensor:
    """The number of True entries in each row [B] (long) of ``flags`` [B, padded_width(...)] bool.

    Summing booleans one by one costs ten times the comparisons that made them. Here each 8 flags are
    read as one int64 word whose byte i is flag i (0 or 1), and a group's k <= 255 words are added as
    integers: byte i of the sum counts the True flags at position i of the group's words, at most
    255, so it never carries into byte i + 1. The bytes of the G sums are then added one by one.
    """
    words = flags.view(torch.int64)  # [B, G * k]
    groups = -(-words.shape[1] // 255)
    lanes = words.view(len(flags), groups, words.shape[1] // groups).sum(2)  # [B, G]
    shifts = torch.arange(0, 64, 8, device=flags.device)  # [8]
    return ((lanes.unsqueeze(2) >> shifts) & 0xFF).sum((1, 2))  # [B, G, 8] bytes -> [B]


def harmonic(n: Tensor) -> Tensor:
    """Harmonic numbers H_n for a float64 tensor of positive integers (exact sum, via digamma)."""
    return torch.special.digamma(n + 1.0) + 0.5772156649015329


@dataclass(frozen=True)
class TieMetrics:
    """The metrics of some ranks under one tie policy. Hits are keyed by k, in the order asked."""

    mrr: float  # mean reciprocal rank
    mr: float  # mean rank
    amr: float  # adjusted mean rank: mr over its expectation under random scores
    amri: float  # adjusted mean rank index: 1 best, 0 random
    adjusted_mrr: float  # mrr rescaled so that random scores give 0 and perfect ones 1
    hits_at: dict[int, float]  # k -> fraction of ranks <= k
    adjusted_hits_at: dict[int, float]  # k -> Hits@k rescaled like adjusted_mrr

    def to_dict(self) -> dict[str, float]:
        """{"mrr", "mr", "amr", "amri", "adjusted_mrr", then "hits_at_k", "adjusted_hits_at_k" per k}."""
        out = {"mrr": self.mrr, "mr": self.mr, "amr": self.amr, "amri": self.amri, "adjusted_mrr": self.adjusted_mrr}
        for k, hits in self.hits_at.items():
            out[f"hits_at_{k}"] = hits
            out[f"adjusted_hits_at_{k}"] = self.adjusted_hits_at[k]
        return out


@dataclass(frozen=True)
class SideMetrics:
    """The metrics of one side's ranks (or of both sides together) under each tie policy."""

    realistic: TieMetrics
    optimistic: TieMetrics
    pessimistic: TieMetrics

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {ties: getattr(self, ties).to_dict() for ties in TIES}


def summarize(counts: RankCounts, ks: tuple[int, ...] = (1, 3, 10)) -> SideMetrics:
    """The metrics of rank counts [Q] under each tie policy, with Hits@k for each k of ``ks``."""
    n = counts.num_candidates.double()
    expected_rank = (n + 1.0) / 2.0
    expected_rr = harmonic(n) / n
    per_ties = {}
    for ties in TIES:
        ranks = counts.rank(ties)
        # 0-dim float64 tensors, not Python floats: a division by zero gives nan or inf (e.g. adjusted
        # Hits@k when every query has at most k candidates), as the metrics JSON has always had it.
        mr, mrr = ranks.mean(), (1.0 / ranks).mean()
        e_mr, e_mrr = expected_rank.mean(), expected_rr.mean()
        hits, adjusted_hits = {}, {}
        for k in ks:
            hits_k = (ranks <= k).double().mean()
            e_hits = (torch.clamp(n, max=k) / n).mean()
            hits[k], adjusted_hits[k] = float(hits_k), float((hits_k - e_hits) / (1.0 - e_hits))
        per_ties[ties] = TieMetrics(mrr=float(mrr), mr=float(mr), amr=float(mr / e_mr),
                                    amri=float(1.0 - (mr - 1.0) / (e_mr - 1.0)),
                                    adjusted_mrr=float((mrr - e_mrr) / (1.0 - e_mrr)),
                                    hits_at=hits, adjusted_hits_at=adjusted_hits)
    return SideMetrics(**per_ties)
