"""What a removal did to a prediction, and the set-level numbers of the faithfulness table.

A prediction (h, r, t) is measured by a model as (`Measures`): its score, its
probability ``softmax over every entity e of score(h, r, e)`` taken at t (unfiltered, as
GradRollback turns scores into probabilities), and its filtered tail-side rank counts
(every other known true tail of (h, r, ?) in train, valid or test removed, as kgtrace
evaluate does). It is measured twice: by the run's last checkpoint ("before") and by the
model trained without the removed triples ("after").

Per prediction:

* score drop = score_before - score_after (positive: the removal lowered it);
* probability drop = prob_before - prob_after;
* rank change = rank_after - rank_before, realistic filtered tail ranks (positive: worse);
* pd = prob_after < prob_before (GradRollback's "probability drop" indicator);
* top-1 = no other candidate scores as high or higher (pessimistic filtered rank 1); tc =
  top-1 before and not top-1 after (GradRollback's "top-1 change"); undefined (None) for a
  prediction that was not top-1 before.

Over a set of predictions (one method, one k): PD = mean of pd, TC = mean of tc over the
predictions that were top-1 before (GradRollback, Lawrence et al. 2021: their code counts
``prob_after < prob_before`` and ``top-1 after != top-1 before`` per explained prediction,
and reports the means in percent), MRR drop = MRR_before - MRR_after of the predictions'
realistic filtered tail ranks (the MRR variation of Kelpie, Rossi et al. 2022, and
Bhardwaj et al., EMNLP 2021, here positive when the explanations mattered), and the means
of the per-prediction changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Measures", "agreement", "changes", "summarize"]


@dataclass(frozen=True)
class Measures:
    """A model's view of N predictions; every array has shape [N]."""

    score: np.ndarray  # float, score_hrt
    prob: np.ndarray  # float, softmax over all tails of (h, r, ?) at t
    greater: np.ndarray  # int, unfiltered candidates scoring strictly higher than t
    equal: np.ndarray  # int, other unfiltered candidates scoring exactly as t

    @property
    def rank(self) -> np.ndarray:
        """Realistic filtered tail ranks [N] (1 + higher + tied / 2)."""
        return 1.0 + self.greater + self.equal / 2.0

    @property
    def top1(self) -> np.ndarray:
        """[N] bool: t scores strictly above every other candidate (pessimistic rank 1)."""
        return (self.greater == 0) & (self.equal == 0)

    def to_dict(self) -> dict[str, list]:
        return {"score": self.score.tolist(), "prob": self.prob.tolist(), "greater": self.greater.tolist(),
                "equal": self.equal.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, list]) -> "Measures":
        return cls(np.asarray(data["score"], dtype=np.float64), np.asarray(data["prob"], dtype=np.float64),
                   np.asarray(data["greater"], dtype=np.int64), np.asarray(data["equal"], dtype=np.int64))

    def take(self, rows: np.ndarray) -> "Measures":
        """The measures of the predictions at ``rows`` [M]."""
        return Measures(self.score[rows], self.prob[rows], self.greater[rows], self.equal[rows])


def changes(before: Measures, after: Measures) -> dict[str, np.ndarray]:
    """Per-prediction changes [N] (module doc); ``tc`` is float with NaN where the prediction was not top-1 before."""
    tc = np.where(before.top1, (~after.top1).astype(np.float64), np.nan)
    return {
        "score_drop": before.score - after.score,
        "prob_drop": before.prob - after.prob,
        "rank_change": after.rank - before.rank,
        "pd": (after.prob < before.prob).astype(np.float64),
        "tc": tc,
    }


def summarize(before: Measures, after: Measures) -> dict[str, float | int]:
    """Set-level numbers of N predictions (module doc); PD, TC and Hits@1 as fractions in [0, 1]."""
    change = changes(before, after)
    top1 = before.top1
    mrr_before, mrr_after = float(np.mean(1.0 / before.rank)), float(np.mean(1.0 / after.rank))
    return {
        "n": int(len(before.score)),
        "n_top1": int(top1.sum()),
        "pd": float(np.mean(change["pd"])),
        "tc": float(np.nanmean(change["tc"])) if top1.any() else float("nan"),
        "score_drop": float(np.mean(change["score_drop"])),
        "prob_drop": float(np.mean(change["prob_drop"])),
        "rank_change": float(np.mean(change["rank_change"])),
        "mrr_before": mrr_before,
        "mrr_after": mrr_after,
        "mrr_drop": mrr_before - mrr_after,
        "hits_at_1_before": float(np.mean(before.rank <= 1.0)),
        "hits_at_1_after": float(np.mean(after.rank <= 1.0)),
    }


def agreement(before: Measures, cheap: Measures, full: Measures) -> dict[str, float | int]:
    """How far the cheap option (fine-tuning) agrees with full retraining on the same N removals.

    pd / tc agreement: fraction of removals where the two indicators are equal (tc over the
    predictions top-1 before); score / probability drop: Pearson correlation and mean
    absolute difference of the per-removal drops.
    """
    a, b = changes(before, cheap), changes(before, full)
    top1 = before.top1
    return {
        "n": int(len(before.score)),
        "pd_agreement": float(np.mean(a["pd"] == b["pd"])),
        "tc_agreement": float(np.mean(a["tc"][top1] == b["tc"][top1])) if top1.any() else float("nan"),
        "score_drop_pearson": pearson(a["score_drop"], b["score_drop"]),
        "score_drop_mean_abs_diff": float(np.mean(np.abs(a["score_drop"] - b["score_drop"]))),
        "prob_drop_pearson": pearson(a["prob_drop"], b["prob_drop"]),
        "prob_drop_mean_abs_diff": float(np.mean(np.abs(a["prob_drop"] - b["prob_drop"]))),
    }


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two [N] arrays; NaN when either is constant or N < 2."""
    if len(x) < 2 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])
