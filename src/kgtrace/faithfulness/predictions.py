"""Which predictions are explained, and how a model is measured on them.

Test predictions are the run's test triples that its last checkpoint ranks first on the
tail side (filtered realistic rank 1: (h, r, ?) answered by t, every other known true tail
removed, no other candidate scoring as high), in test-file order; ``sample`` keeps N of them
drawn at random (seeded). A file of triples (``--triples``) is taken as it is, whatever its
ranks: TC is then counted over those that were top-1 before.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from kgtrace.core.errors import KgtraceError, option_name
from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.candidates import CandidateRestriction
from kgtrace.evaluation.evaluate import Candidates, model_device, rank_queries
from kgtrace.evaluation.output import true_scores
from kgtrace.faithfulness.metrics import Measures
from kgtrace.runs.embedding import Run

__all__ = ["measure", "rank_first_test", "sample_rows"]


@torch.inference_mode()
def measure(model, predictions: Tensor, known: AnswerIndex, memory_budget: int = 1 << 30,
            restriction: CandidateRestriction | None = None) -> Measures:
    """Score, probability and filtered tail-rank counts of ``predictions`` [N, 3] (metrics module doc); the ranks
    among the entities ``restriction`` allows (None: all). The probability stays a softmax over every tail."""
    model.eval()
    device = model_device(model)
    scores = true_scores(model, predictions[:, :2], predictions[:, 2])  # [N]
    probs = torch.cat([torch.softmax(model.score_t(chunk[:, :2].to(device)).double(), dim=1)
                       .gather(1, chunk[:, 2:].to(device)).squeeze(1).cpu()
                       for chunk in predictions.split(1024)]) if len(predictions) else torch.zeros(0)  # [N]
    counts = rank_queries(model, predictions, known=known, sides=("tail",), candidates=Candidates(restriction=restriction),
                          memory_budget=memory_budget).counts["tail"]
    return Measures(scores.double().numpy(), probs.numpy(), counts.greater.numpy(), counts.equal.numpy())


def rank_first_test(run: Run, known: AnswerIndex, restriction: CandidateRestriction | None = None) -> Tensor:
    """The test triples [M, 3] that the run's model ranks first on the tail side (module doc), among the
    candidates ``restriction`` allows (None: all)."""
    test = run.dataset.test
    if not len(test):
        raise KgtraceError(f"{run.path}: the run's dataset has no test split, so there are no test predictions. "
                           f"Fix: pass {option_name('--triples')}, the triples to explain")
    top1 = measure(run.model, test, known, restriction=restriction).top1
    if not top1.any():
        raise KgtraceError(f"{run.path}: the model ranks no test triple first (tail side), so there is no test "
                           f"prediction to explain. Fix: train the run longer, or pass {option_name('--triples')}, the "
                           "triples to explain")
    return test[torch.from_numpy(top1)]


def sample_rows(n: int, size: int, seed: int) -> Tensor:
    """``size`` of the rows 0..n-1 drawn without replacement by ``seed``, in increasing order (all when size >= n)."""
    if size >= n:
        return torch.arange(n)
    generator = torch.Generator().manual_seed(seed)
    return torch.sort(torch.randperm(n, generator=generator)[:size]).values


def as_rows(triples: Tensor) -> list[list[int]]:
    """[N, 3] ids -> a JSON-friendly list of [h, r, t]."""
    return np.asarray(triples, dtype=np.int64).tolist()
