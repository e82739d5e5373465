"""All-entity filtered ranking under torch.compile, with the eager path's exact results.

Scoring and ranking of a chunk of queries run as one compiled graph through
`CompiledCall` (static buffers: queries [B, 2] long, true answers
[B] long, a dense filter mask [B, E] bool, valid [B] bool). The filter mask is built
eagerly per chunk, on the device, from the known answers a run of chunks sends there at once
(True = a known answer other than the true one, excluded). The graph returns greater, equal,
num_candidates and a non-finite flag [B] each; the flags are read once the side is ranked and
raise the same error as the eager path.

Ranks equal `rank_side` exactly whenever compiled
and eager scores are bitwise equal; where Inductor rounds a model's float arithmetic
differently, a true answer within rounding of another candidate may rank differently.

Compiled calls are kept per model (and batch size, device), so the head and tail sides
and every validation epoch reuse one compilation; they die with the model.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch import Tensor

from kgtrace.compute.compile import CompiledCall
from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.ranks import RankCounts
from kgtrace.evaluation.sides import SideQueries, filter_runs, finite_rows, query_chunk_size, raise_first_non_finite
from kgtrace.models.base import Scorer

__all__ = ["rank_side_compiled"]

# model -> {(batch_size, device): CompiledCall}; the calls take the model as an argument
# (not in a closure), so this cache does not keep the model alive.
_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def rank_chunk(model: Scorer, queries: Tensor, answers: Tensor, filtered: Tensor, valid: Tensor) -> tuple[Tensor, ...]:
    """The compiled body: count_ranks of one chunk, on a dense filter mask.

    queries [B, 2], answers [B], filtered [B, E] bool (known answers, the true one may be
    among them), valid [B] bool. Returns greater, equal, num_candidates (long) and
    nonfinite (bool, False on padded rows), all [B].
    """
    scores = model.score_t(queries).float()  # [B, E]
    nonfinite = ~finite_rows(scores) & valid
    columns = torch.arange(scores.shape[1], device=scores.device)
    is_true = columns.unsqueeze(0) == answers.unsqueeze(1)  # [B, E]
    other = filtered & ~is_true  # known answers other than the true one drop out
    true_scores = scores.gather(1, answers.unsqueeze(1))  # [B, 1]
    # As count_ranks: filtered entries and the true answer itself become -inf.
    masked = scores.masked_fill(other | is_true, float("-inf"))
    greater = (masked > true_scores).sum(dim=1)
    equal = (masked == true_scores).sum(dim=1)
    num_candidates = scores.shape[1] - other.sum(dim=1)
    return greater, equal, num_candidates, nonfinite


def balanced_batch(num_queries: int, chunk: int) -> int:
    """The smallest batch that needs as few runs as ``chunk`` for ``num_queries`` (least padding)."""
    runs = max(1, math.ceil(num_queries / chunk))
    return max(1, math.ceil(num_queries / runs))


def compiled_ranker(model: Scorer, batch_size: int, device: torch.device) -> CompiledCall:
    """The model's compiled ranking call for this batch size and device, compiled on first use."""
    per_model = _CALLS.setdefault(model, {})
    key = (batch_size, str(device))
    if key not in per_model:
        example = {
            "queries": torch.zeros(1, 2, dtype=torch.long, device=device),
            "answers": torch.zeros(1, dtype=torch.long, device=device),
            "filtered": torch.zeros(1, model.num_entities, dtype=torch.bool, device=device),
        }
        per_model[key] = CompiledCall("rank_side", rank_chunk, batch_size, example)
    return per_model[key]


def filter_mask(rows: Tensor, cols: Tensor, num_queries: int, num_entities: int) -> Tensor:
    """Dense [B, E] bool: True at the known (row, answer) pairs of a chunk (the true answer included)."""
    mask = torch.zeros(num_queries, num_entities, dtype=torch.bool, device=rows.device)
    mask[rows, cols] = True
    return mask


@torch.inference_mode()  # as the eager path; the compiled graph is guarded on it, so always the same
def rank_side_compiled(model: Scorer, sq: SideQueries, known: AnswerIndex, *, memory_budget: int,
                       device: torch.device, batch_size: int | None = None) -> RankCounts:
    """Filtered rank counts of every query of one side, as ``rank_side``, scored under torch.compile.

    The model must be in eval mode. batch_size: queries per compiled run; None derives
    it from ``memory_budget`` (as the eager path's chunk), shrunk to the fewest runs'
    least padding so that a small split is not padded to a huge batch. As the eager path, the
    known answers go to the device a run of chunks at a time, and the counts and non-finite flags
    are read once for the whole side.

    Raises:
        KgtraceError: naming the query on a NaN or infinite score, or naming the
            cause when compilation fails (fix: ``--no-compile``).
    """
    if getattr(model, "training", False):
        raise ValueError("rank_side_compiled needs the model in eval mode: call model.eval() first")
    device = torch.device(device)
    num_queries, num_entities = len(sq.answers), model.num_entities
    if batch_size is None:
        batch_size = balanced_batch(num_queries, query_chunk_size(num_entities, memory_budget))
    call = compiled_ranker(model, batch_size, device)
    queries_on, answers_on = sq.queries.to(device), sq.answers.to(device)  # [Q, 2], [Q]
    parts, finite = [], []
    for run_start, run_stop, known_pairs in filter_runs(known, sq, batch_size, device):
        for start in range(run_start, run_stop, batch_size):
            stop = min(start + batch_size, run_stop)
            rows, cols = known_pairs.chunk(start - run_start, stop - run_start)
            greater, equal, num_candidates, nonfinite = call(
                model,
                queries=queries_on[start:stop],  # copied into the call's static buffers
                answers=answers_on[start:stop],
                filtered=filter_mask(rows, cols, stop - start, num_entities),
            )
            finite.append(~nonfinite)
            parts.append(RankCounts(greater, equal, num_candidates))
    raise_first_non_finite(finite, sq)
    return RankCounts.cat(parts).cpu() if parts else RankCounts.empty()
