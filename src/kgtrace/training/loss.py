"""1-N training losses that never build a dense [B, E] label tensor.

KvsAll scores every candidate entity of each (anchor, relation) query and takes
binary cross-entropy against the (sparse) set of true answers. With smoothed labels
``y`` the summed loss decomposes as::

    sum_k BCE(s_k, y_k) = sum_k softplus(s_k) - sum_k y_k s_k
    sum_k y_k s_k       = n * sum_k s_k + (p - n) * sum_{k positive} s_k

with ``p`` the positive and ``n`` the negative label value, so only the positives'
scores need to be gathered ([P] values) and the dense label matrix is never formed.
KvsAll with cross-entropy (``kvsall-ce``) and 1vsAll gather the same way: a logsumexp per row
less a weighted sum of its scores (without smoothing, the mean of its answers' scores).
Negative sampling gathers each row's answer and its sampled entities and takes the same
cross-entropy over just those columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kgtrace.core.config import SMOOTHING_STYLES
from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import spec_of
from kgtrace.models.base import FactorisedScorer

__all__ = [
    "candidate_scores",
    "ce_target_weights",
    "dense_bce_reference",
    "dense_ce_reference",
    "draw_candidates",
    "gathers_rows",
    "kvsall_bce",
    "kvsall_bce_chunked_backward",
    "kvsall_ce",
    "negative_sampling_reference",
    "negative_sampling_rows",
    "onevsall_ce",
    "sampled_adversarial_rows",
    "sampled_ce_rows",
    "smoothed_label_values",
]

# Elements of scores turned into softplus values at a time. On CPU a block this size
# (128 KiB of float32) stays in cache; accelerators prefer few, large kernels.
_CPU_BLOCK_ELEMENTS = 1 << 15
_ACCELERATOR_BLOCK_ELEMENTS = 1 << 22


def smoothed_label_values(label_smoothing: float, num_classes: int, style: str = "pykeen") -> tuple[float, float]:
    """(positive, negative) label values after label smoothing.

    style "pykeen": PyKEEN's ``apply_label_smoothing`` computes, for 0/1 labels and ``eps > 0``::

        y = labels * (1 - eps) + (1 - labels) * eps / (num_classes - 1)

    so a positive becomes ``1 - eps`` and a negative ``eps / (num_classes - 1)``. style "conve":
    the ConvE authors' code (Dettmers et al. 2018, ``main.py``) computes
    ``y = (1 - eps) * labels + 1 / num_classes``: a positive ``1 - eps + 1 / num_classes``, a
    negative ``1 / num_classes``, which for FB15k-237's 14,541 entities is eps / (E - 1) times
    about ten. With ``eps == 0`` the labels stay 0/1 in either style.
    """
    problems = []
    if (
        isinstance(label_smoothing, bool)
        or not isinstance(label_smoothing, (int, float))
        or not (0.0 <= label_smoothing < 1.0)
    ):
        problems.append(
            f"label_smoothing={label_smoothing!r}: must be a number in [0, 1); fix: use e.g. 0.1, or 0 to disable"
        )
    elif label_smoothing > 0 and num_classes < 2:
        problems.append(
            f"label_smoothing={label_smoothing!r}: needs at least 2 classes but num_classes={num_classes}; "
            "fix: set label_smoothing to 0 or score more candidates"
        )
    if style not in SMOOTHING_STYLES:
        problems.append(f"label_smoothing_style={style!r}: must be one of {', '.join(SMOOTHING_STYLES)}")
    if problems:
        raise ConfigError(problems)
    if label_smoothing == 0:
        return 1.0, 0.0
    if style == "conve":
        return 1.0 - label_smoothing + 1.0 / num_classes, 1.0 / num_classes
    return 1.0 - label_smoothing, label_smoothing / (num_classes - 1)


def _block_rows(scores: Tensor) -> int:
    """Rows per softplus block, so a block holds about the device's block budget."""
    budget = _CPU_BLOCK_ELEMENTS if scores.device.type == "cpu" else _ACCELERATOR_BLOCK_ELEMENTS
    return max(1, budget // max(1, scores.shape[1]))


def _softplus_sum(scores: Tensor, acc_dtype: torch.dtype) -> Tensor:
    """sum(softplus(scores)) over row blocks; no temporary exceeds one block [rows, C]."""
    partials = [F.softplus(block).sum(dtype=acc_dtype) for block in scores.split(_block_rows(scores))]
    return torch.stack(partials).sum()


class _KvsAllBCESum(torch.autograd.Function):
    """sum_k BCE(s_k, y_k) / denominator for sparse smoothed labels.

    Forward allocates no [B, C] tensor, only softplus blocks of about the block budget
    (one block of all B rows when B * C is below it); backward allocates exactly one
    [B, C] tensor, the gradient (sigmoid(s) - y) * g / denominator, built in place.
    """

    @staticmethod
    def forward(
        scores: Tensor,
        pos_rows: Tensor,
        pos_cols: Tensor,
        pos_label: float,
        neg_label: float,
        denominator: int,
    ) -> Tensor:
        acc_dtype = torch.promote_types(scores.dtype, torch.float32)
        total = _softplus_sum(scores, acc_dtype)
        if neg_label:
            total = total - neg_label * scores.sum(dtype=acc_dtype)
        positives = scores[pos_rows, pos_cols]  # [P]
        total = total - (pos_label - neg_label) * positives.sum(dtype=acc_dtype)
        return total / denominator

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        scores, pos_rows, pos_cols, pos_label, neg_label, denominator = inputs
        ctx.save_for_backward(scores, pos_rows, pos_cols)
        ctx.labels = (pos_label, neg_label)
        ctx.denominator = denominator

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        scores, pos_rows, pos_cols = ctx.saved_tensors
        pos_label, neg_label = ctx.labels
        grad = torch.sigmoid(scores)  # the one [B, C] allocation: d loss / d s = sigmoid(s) - y
        if neg_label:
            grad.sub_(neg_label)
        step = grad.new_full((), neg_label - pos_label)
        grad.index_put_((pos_rows, pos_cols), step, accumulate=True)
        grad.mul_((grad_output / ctx.denominator).to(grad.dtype))
        return grad, None, None, None, None, None


def kvsall_bce(
    scores: Tensor,
    pos_rows: Tensor,
    pos_cols: Tensor,
    label_smoothing: float = 0.0,
    *,
    num_classes: int | None = None,
    denominator: float | None = None,
    smoothing_style: str = "pykeen",
) -> Tensor:
    """Mean binary cross-entropy (with logits) of KvsAll scores against sparse positives.

    Equals PyKEEN's ``BCEWithLogitsLoss`` with label smoothing, i.e.
    ``F.binary_cross_entropy_with_logits(scores, y)`` averaged over all B * C elements,
    where ``y = labels * (1 - eps) + (1 - labels) * eps / (num_classes - 1)`` and
    ``labels`` is 1 at the positive (row, col) pairs and 0 elsewhere.

    Args:
        scores: logits [B, C] over C candidate entities.
        pos_rows: LongTensor [P], row of each positive (< B).
        pos_cols: LongTensor [P], column of each positive (< C); (row, col) pairs unique.
        label_smoothing: eps in [0, 1).
        num_classes: the smoothing's class count; defaults to C.
        smoothing_style: "pykeen" (above) or "conve" (`smoothed_label_values`).
        denominator: what the summed loss is divided by; defaults to B * C (the mean). A process
            holding part of a distributed batch passes the whole batch's count (see training.sharded).
    Returns:
        scalar loss. Extra memory is O(B + P) plus one softplus block of at most
            max(C, block budget) elements; the backward pass allocates only the [B, C] gradient.
    """
    pos_label, neg_label = smoothed_label_values(label_smoothing, num_classes or scores.shape[1], smoothing_style)
    return _KvsAllBCESum.apply(scores, pos_rows, pos_cols, pos_label, neg_label, denominator or scores.numel())


def _group_by_chunk(pos_rows: Tensor, pos_cols: Tensor, bounds: list[int]) -> tuple[Tensor, Tensor, list[int]]:
    """Sort positives by column; return them with the offsets where each entity chunk starts."""
    order = torch.argsort(pos_cols)
    rows, cols = pos_rows[order], pos_cols[order]
    edges = torch.tensor(bounds, device=cols.device, dtype=cols.dtype)
    # One host sync for all chunks instead of one per chunk.
    offsets = torch.searchsorted(cols, edges).tolist()
    return rows, cols, offsets


def kvsall_bce_chunked_backward(
    model: FactorisedScorer,
    queries: Tensor,
    pos_rows: Tensor,
    pos_cols: Tensor,
    label_smoothing: float,
    chunk_size: int,
    denominator: float | None = None,
    smoothing_style: str = "pykeen",
) -> Tensor:
    """KvsAll BCE over all E entities, scored and back-propagated one entity chunk at a time.

    Equivalent to ``kvsall_bce(model.score_t(queries), pos_rows, pos_cols,
    label_smoothing).backward()`` (same loss, same parameter gradients) but peaks at
    O(B * chunk_size) memory: the query encoding runs once, each chunk's decoder scores
    are back-propagated into the decoder and a detached copy of the query, and the summed
    query gradient is finally pushed through the encoder.

    Args:
        model: a factorised scorer; gradients accumulate into its parameters' ``.grad``.
        queries: LongTensor [B, 2] of (anchor, relation-or-inverse) ids.
        pos_rows: LongTensor [P], query row of each positive.
        pos_cols: LongTensor [P], entity id of each positive; (row, col) pairs unique.
        label_smoothing: eps in [0, 1), smoothing over E classes.
        chunk_size: entities scored at once (>= 1).
        denominator: what the summed loss is divided by; defaults to B * E (as `kvsall_bce`).
        smoothing_style: as for `kvsall_bce`.
    Returns:
        the loss, a detached scalar tensor.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError([f"chunk_size={chunk_size!r}: must be an integer >= 1; fix: use e.g. 4096"])
    num_entities = model.num_entities
    pos_label, neg_label = smoothed_label_values(label_smoothing, num_entities, smoothing_style)
    q = model.encode_query(queries)  # [B, D]
    qd = q.detach().requires_grad_()
    denominator = denominator or q.shape[0] * num_entities
    bounds = list(range(0, num_entities, chunk_size)) + [num_entities]
    rows, cols, offsets = _group_by_chunk(pos_rows, pos_cols, bounds)
    total = q.new_zeros((), dtype=torch.promote_types(q.dtype, torch.float32))
    for start, stop, lo, hi in zip(bounds[:-1], bounds[1:], offsets[:-1], offsets[1:]):
        scores = model.decode(qd, start, stop)  # [B, stop - start]
        part = _KvsAllBCESum.apply(scores, rows[lo:hi], cols[lo:hi] - start, pos_label, neg_label, denominator)
        part.backward()
        total += part.detach()
    if q.requires_grad:
        q.backward(qd.grad)
    return total


def onevsall_ce(scores: Tensor, targets: Tensor, denominator: float | None = None) -> Tensor:
    """1vsAll: mean over B of the cross-entropy logsumexp(s) - s[target].

    Args:
        scores: logits [B, C].
        targets: LongTensor [B] of the true column of each row.
        denominator: divide the summed loss by this instead of B (a part of a distributed batch).
    Returns:
        scalar loss, equal to ``F.cross_entropy(scores, targets)``.
    """
    # logsumexp keeps no [B, C] log-softmax around for backward, unlike F.cross_entropy.
    true_scores = scores.gather(1, targets.unsqueeze(1)).squeeze(1)  # [B]
    losses = torch.logsumexp(scores, dim=1) - true_scores  # [B]
    return losses.mean() if denominator is None else losses.sum() / denominator


def ce_target_weights(label_smoothing: float, num_classes: int, answers: Tensor,
                      style: str = "pykeen") -> tuple[Tensor, Tensor]:
    """kvsall-ce's target per row as (alpha, beta) [B] each: w_bk = alpha_b at the row's answers, + beta_b at
    every column (sum 1), for rows of ``answers`` [B] answers each.

    style "pykeen": PyKEEN's CrossEntropyLoss for LCWA, the 0/1 labels normalised to 1/n, then torch's
    ``label_smoothing``: w = (1 - eps) y / n + eps / C. style "conve": LibKGE's KvsAll with its kl loss, the
    ConvE authors' labels (1 - eps) y + 1/C normalised: w = ((1 - eps) y + 1/C) / ((1 - eps) n + 1).
    Without smoothing both are 1/n at each answer.
    """
    smoothed_label_values(label_smoothing, num_classes, style)  # the same checks of eps and style
    kept, n = 1.0 - label_smoothing, answers.double()
    if style == "conve":
        total = kept * n + 1.0  # [B] the smoothed labels' sum
        return kept / total, (1.0 / num_classes) / total
    return kept / n, torch.full_like(n, label_smoothing / num_classes)


def kvsall_ce(scores: Tensor, pos_rows: Tensor, pos_cols: Tensor, label_smoothing: float = 0.0,
              denominator: float | None = None, smoothing_style: str = "pykeen") -> Tensor:
    """KvsAll with cross-entropy: mean over B of the cross-entropy of softmax(s) against a target spread over
    the row's answers (PyKEEN's LCWA with CrossEntropyLoss; LibKGE's KvsAll with its kl loss)::

        loss_b = -sum_k w_bk log softmax(s_b)_k = logsumexp(s_b) - alpha_b sum_{answers} s_bk - beta_b sum_k s_bk

    with (alpha, beta) from `ce_target_weights` (1/n_b and 0 without smoothing), so only the
    answers' scores are gathered and no [B, C] target is formed.

    Args:
        scores: logits [B, C].
        pos_rows: LongTensor [P], row of each positive (every KvsAll row has at least one).
        pos_cols: LongTensor [P], column of each positive.
        denominator: divide the summed loss by this instead of B (a part of a distributed batch).
    Returns:
        scalar loss.
    """
    rows, classes = scores.shape
    answers = torch.bincount(pos_rows, minlength=rows)  # [B] n_b
    alpha, beta = ce_target_weights(label_smoothing, classes, answers, smoothing_style)  # [B] each
    answer_sums = scores.new_zeros(rows).index_add_(0, pos_rows, scores[pos_rows, pos_cols])  # [B]
    losses = torch.logsumexp(scores, dim=1) - alpha.to(scores.dtype) * answer_sums - beta.to(scores.dtype) * scores.sum(1)
    return losses.mean() if denominator is None else losses.sum() / denominator


def dense_ce_reference(scores: Tensor, pos_rows: Tensor, pos_cols: Tensor, label_smoothing: float = 0.0,
                       style: str = "pykeen") -> Tensor:
    """REFERENCE ONLY (tests): `kvsall_ce` with a dense target: "pykeen" as PyKEEN's CrossEntropyLoss
    computes it for LCWA (labels normalised, then ``F.cross_entropy(label_smoothing=eps)``), "conve" as LibKGE's
    KvsAll with kl (the ConvE authors' smoothed labels, normalised)."""
    labels = torch.zeros_like(scores)
    labels[pos_rows, pos_cols] = 1.0
    if style == "conve":
        labels = (1.0 - label_smoothing) * labels + 1.0 / scores.shape[1]
        return F.cross_entropy(scores, labels / labels.sum(dim=1, keepdim=True))
    return F.cross_entropy(scores, labels / labels.sum(dim=1, keepdim=True), label_smoothing=label_smoothing)


def dense_bce_reference(scores: Tensor, pos_rows: Tensor, pos_cols: Tensor, label_smoothing: float) -> Tensor:
    """REFERENCE ONLY (tests): the same loss as `kvsall_bce`, with dense labels.

    Builds the [B, C] label tensor, smooths it exactly as PyKEEN's
    ``apply_label_smoothing`` (num_classes = C) and calls
    ``F.binary_cross_entropy_with_logits``. Never use it for training.
    """
    labels = torch.zeros_like(scores)
    labels[pos_rows, pos_cols] = 1.0
    if label_smoothing:
        num_classes = scores.shape[1]
        labels = labels * (1.0 - label_smoothing) + (1.0 - labels) * label_smoothing / (num_classes - 1)
    return F.binary_cross_entropy_with_logits(scores, labels)


def draw_candidates(triples: Tensor, negatives_tail: int, negatives_head: int,
                    num_entities: int) -> tuple[Tensor, Tensor]:
    """Negative sampling's candidates of ``triples`` [B, 3]: tails [B, 1 + negatives_tail] (each triple's tail
    in column 0, then the entities drawn against it) and heads [B, 1 + negatives_head] (its head, then draws).

    Uniform over all entities, with replacement and unfiltered (LibKGE's sampler by default, PyKEEN's
    basic sampler without a filterer): a draw may repeat, be a true answer, or be the answer itself.
    Drawn from torch's global generator on the triples' device, which checkpoints save.
    """
    def side(answers: Tensor, negatives: int) -> Tensor:
        drawn = torch.randint(num_entities, (len(answers), negatives), device=answers.device)  # [B, n]
        return torch.cat([answers.unsqueeze(1), drawn], dim=1)

    return side(triples[:, 2], negatives_tail), side(triples[:, 0], negatives_head)


def sampled_ce_rows(picked: Tensor) -> Tensor:
    """Per-row cross-entropy [B] of each row's answer among its candidates::

        loss_b = logsumexp_j s[b, c_bj] - s[b, c_b0]

    Args:
        picked: the candidates' scores [B, 1 + n], the answer's first (`candidate_scores`); with
            n = 0 the loss is 0 (a softmax over one candidate).
    Returns:
        losses [B], as PyKEEN's ``CrossEntropyLoss.process_slcwa_scores`` per row.
    """
    return torch.logsumexp(picked, dim=1) - picked[:, 0]


def sampled_adversarial_rows(picked: Tensor, temperature: float) -> Tensor:
    """Per-row self-adversarial loss [B] of each row's answer against its drawn candidates (Sun et al. 2019,
    RotatE's code)::

        loss_b = (-log sigmoid(s[b, c_b0]) - sum_{j >= 1} w_bj log sigmoid(-s[b, c_bj])) / 2,
        w_b = softmax_j(temperature * s[b, c_bj]) over the drawn candidates, held constant (no gradient)

    so the negatives a model scores highest weigh most. The halving is theirs (the mean of the positive and
    the negative part). A model's margin (RotatE's gamma) is inside its scores.

    Args:
        picked: the candidates' scores [B, 1 + n], the answer's first (`candidate_scores`), n >= 1.
        temperature: alpha > 0.
    Returns:
        losses [B].
    """
    negatives = picked[:, 1:]  # [B, n]
    weights = torch.softmax(temperature * negatives.detach(), dim=1)  # [B, n], constants
    return -(F.logsigmoid(picked[:, 0]) + (weights * F.logsigmoid(-negatives)).sum(1)) / 2


def gathers_rows(num_candidates: int, dim: int, num_entities: int, decodes_by_product: bool = True) -> bool:
    """Whether each query scores its own candidates' gathered rows ([B, C, D] values) rather than every
    entity ([B, E] scores, then a gather).

    A model that scores every entity by one matrix product (``ModelSpec.decodes_by_product``) gathers when
    C * D < E: FB15k-237 with LibKGE's 403 candidates of 256 dimensions scores all 14,541 entities; a graph
    of a million entities gathers. A distance model (TransE, RotatE) pays E x D elementwise work for every
    entity, and in training keeps as many differences for the backward pass (RotatE's FB15k-237 recipe: a
    [1,024, 14,541, 2,000] tensor), so it gathers whenever C < E."""
    return num_candidates * (dim if decodes_by_product else 1) < num_entities


def candidate_scores(model: nn.Module, q: Tensor, candidates: Tensor) -> Tensor:
    """Scores [B, 1 + n] of each encoded query q [B, D] against its candidates [B, 1 + n] (`gathers_rows`;
    always gathered for a model with sparse gradients, whose step reads only the candidates' rows)."""
    spec = spec_of(model)
    by_product = spec is None or spec.decodes_by_product
    if getattr(model, "sparse_grad", False) or gathers_rows(candidates.shape[1], q.shape[1], model.num_entities,
                                                            by_product):
        return model.decode_ids(q, candidates)
    return model.decode(q).gather(1, candidates)


def negative_sampling_rows(model: nn.Module, temperature: float, triples: Tensor, tail_candidates: Tensor,
                           head_candidates: Tensor, valid: Tensor) -> Tensor:
    """Per-triple loss [B] of negative sampling (0 on rows not ``valid``): the tail side's
    `sampled_ce_rows` plus the head side's, the head side asked as the query (t, r + R); with a
    ``temperature`` > 0, `sampled_adversarial_rows` in their place (RotatE's self-adversarial loss).

    LibKGE's negative_sampling with its kl loss sums the two sides' losses and divides by the
    batch's triples: the mean of these rows. Both sides' queries are encoded in one call (one
    pass of batch norm over both); a side without negatives (candidates [B, 1]) adds 0 and is
    not scored. Each side's candidates are scored by `candidate_scores`, the answer among them: one
    dropout mask for a query and all its candidates, where LibKGE and PyKEEN score the positive in a pass
    of its own (docs/training.md).

    Args:
        temperature: 0 for the softmax cross-entropy; alpha > 0 for the self-adversarial loss.
        triples: LongTensor [B, 3] of (head, relation, tail), relation in [0, R).
        tail_candidates: LongTensor [B, 1 + n_t]: the tail, then the entities drawn against it.
        head_candidates: LongTensor [B, 1 + n_h]: the head, then the entities drawn against it.
        valid: BoolTensor [B].
    """
    h, r, t = triples.unbind(1)
    sides = []  # (queries [B, 2], candidates [B, 1 + n]) of the sides that draw negatives
    if tail_candidates.shape[1] > 1:
        sides.append((torch.stack([h, r], dim=1), tail_candidates))
    if head_candidates.shape[1] > 1:
        sides.append((torch.stack([t, r + model.num_relations], dim=1), head_candidates))
    q = model.encode_query(torch.cat([queries for queries, _ in sides]))  # [len(sides) * B, D]
    rows = 0
    for q_side, (_, candidates) in zip(q.chunk(len(sides)), sides):
        picked = candidate_scores(model, q_side, candidates)  # [B, 1 + n]
        picked = picked.to(torch.promote_types(picked.dtype, torch.float32))  # fp32 under autocast
        rows = rows + (sampled_adversarial_rows(picked, temperature) if temperature else sampled_ce_rows(picked))
    return torch.where(valid, rows, 0.0)


def negative_sampling_reference(model: nn.Module, triples: Tensor, tail_candidates: Tensor,
                                head_candidates: Tensor, temperature: float = 0.0) -> Tensor:
    """REFERENCE ONLY (tests): the mean of `negative_sampling_rows`, one triple and one candidate at a
    time through ``score_hrt`` (the head side's candidates c scored as (t, r + R, c)), then PyKEEN's formula:
    ``F.cross_entropy`` of [positive, negatives] against class 0; with a ``temperature``, RotatE's code's
    formula: the mean of ``-logsigmoid(positive)`` and ``-(softmax(temperature * negatives) *
    logsigmoid(-negatives)).sum()``."""
    total = torch.zeros((), dtype=torch.float64)
    for (h, r, t), tails, heads in zip(triples.tolist(), tail_candidates.tolist(), head_candidates.tolist()):
        for anchor, relation, candidates in ((h, r, tails), (t, r + model.num_relations, heads)):
            if len(candidates) == 1:
                continue
            hrt = torch.tensor([[anchor, relation, c] for c in candidates])  # [1 + n, 3]
            scores = model.score_hrt(hrt).double().unsqueeze(0)  # [1, 1 + n]
            if temperature:
                negative = (torch.softmax(temperature * scores[0, 1:].detach(), 0) * F.logsigmoid(-scores[0, 1:])).sum()
                total = total + (-F.logsigmoid(scores[0, 0]) - negative) / 2
            else:
                total = total + F.cross_entropy(scores, torch.zeros(1, dtype=torch.long))
    return total / len(triples)
