"""The training step under torch.compile (``kgtrace train --compile``), with eager training's results.

What is compiled: the model's forward and the loss of each row, as one graph through
`CompiledCall` (``training=True``). AOTAutograd traces the backward
of that graph with it and Inductor compiles both at the first step, so ``loss.backward()``
replays compiled code into the parameters' ``.grad``. What is not:

* the mean over rows (a sum and a division by the batch's true size, n or n * E, so that
  the graph does not depend on n) and the ``backward()`` call itself: eager, a few scalars;
* the optimizer step: fused Adam is already one kernel per step, and compiling it would
  put the optimizer state and learning-rate schedule under dynamo's guards for no gain;
* compiled autograd (``torch._dynamo.compiled_autograd``) is not used: nothing runs between
  the compiled forward and its backward (no hooks, no eager ops on the path from parameters
  to loss), so AOTAutograd's backward graph is already the whole backward pass, while
  compiled autograd would trace the autograd graph again at run time.

This split is also the one CUDA graphs take (``mode="reduce-overhead"`` on CUDA): the graph's
inputs are the static buffers and the parameters, whose addresses never change (the
optimizer updates them in place); its outputs are per-row losses [B], cloned at the
boundary; the backward graph writes fresh gradients that ``zero_grad(set_to_none=True)``
releases before the next step, whose ``cudagraph_mark_step_begin`` starts a new generation.
The graph keeps its input buffers for backward (the embedding indices), so each step's
backward runs before the next step's forward, as the training loop does (and gradient
accumulation would: forward and backward per micro-batch).

Batches are never padded. Batch normalisation in training mode normalises every row by
statistics over the whole batch, so a padded row changes the real rows' loss and gradients
whatever mask the loss applies (and dropout would draw masks for it). Instead each distinct
batch size gets its own compiled call: an epoch has at most two, ``batch_size`` and the
remainder ``N mod batch_size``, the same every epoch, so a run compiles at most two graphs
and never recompiles. (The per-row losses are still masked by ``valid``, as every compiled
function is: a call run with fewer rows than its batch counts none of its padded rows.)

Randomness and parity: ``training=True`` compiles with Inductor's ``fallback_random``, so
dropout draws the same masks as eager from the same generator, and a compiled run equals the
eager run up to float rounding (tests/test_compiled_train.py). ``compile`` may therefore be
switched on or off when a run is resumed.

Losses: KvsAll positives become a dense [B, E] bool label mask, one byte per score next to the
scores' four (the sparse pairs have a varying count, which a static graph cannot take); the
per-row BCE sum uses the decomposition of `kgtrace.training.loss`. 1vsAll takes the
true answers [B]. Negative sampling takes the triples [B, 3] and the candidates drawn for them
outside the graph (the draws are inputs, so eager and compiled steps see the same ones). The
entity-chunked loss runs its own backward passes and is not compiled (``compile`` with
``entity_chunk`` is a configuration error).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kgtrace.compute.compile import CompiledCall
from kgtrace.core.config import TrainConfig
from kgtrace.training.batches import Batches
from kgtrace.training.loss import ce_target_weights, draw_candidates, negative_sampling_rows, smoothed_label_values

__all__ = ["ROWS", "compiled_batch_loss", "kvsall_ce_rows", "kvsall_rows", "mean_of_rows", "onevsall_rows", "step_inputs",
           "step_static", "train_call"]

# model -> {(training mode, batch size, device): CompiledCall}; the calls take the model as an
# argument (not in a closure), so this cache does not keep the model alive.
_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def kvsall_rows(model: nn.Module, pos_label: float, neg_label: float, queries: Tensor, labels: Tensor,
                valid: Tensor) -> Tensor:
    """Per-row KvsAll BCE sums [B] (0 on padded rows): sum_k BCE(s_k, y_k) with smoothed labels y.

    queries [B, 2], labels [B, E] bool (True at the positives), valid [B] bool. As
    `kvsall_bce`: sum softplus(s) - n sum s - (p - n) sum_pos s.
    """
    scores = model.score_t(queries).float()  # [B, E]
    positives = scores.masked_fill(~labels, 0.0).sum(dim=1)  # [B]
    rows = F.softplus(scores).sum(dim=1) - neg_label * scores.sum(dim=1) - (pos_label - neg_label) * positives
    return torch.where(valid, rows, 0.0)


def kvsall_ce_rows(model: nn.Module, label_smoothing: float, smoothing_style: str, queries: Tensor, labels: Tensor,
                   valid: Tensor) -> Tensor:
    """Per-row KvsAll cross-entropy [B] (0 on padded rows) against the target of
    `ce_target_weights`, as `kvsall_ce`.
    queries [B, 2], labels [B, E] bool, valid [B] bool."""
    scores = model.score_t(queries).float()  # [B, E]
    alpha, beta = ce_target_weights(label_smoothing, scores.shape[1], labels.sum(dim=1).clamp_min(1), smoothing_style)
    targeted = alpha.float() * scores.masked_fill(~labels, 0.0).sum(dim=1) + beta.float() * scores.sum(dim=1)  # [B]
    return torch.where(valid, torch.logsumexp(scores, dim=1) - targeted, 0.0)


def onevsall_rows(model: nn.Module, queries: Tensor, answers: Tensor, valid: Tensor) -> Tensor:
    """Per-row cross-entropy [B] (0 on padded rows): logsumexp(s) - s[answer], as onevsall_ce."""
    scores = model.score_t(queries).float()  # [B, E]
    true_scores = scores.gather(1, answers.unsqueeze(1)).squeeze(1)  # [B]
    return torch.where(valid, torch.logsumexp(scores, dim=1) - true_scores, 0.0)


# The per-row loss of each training mode (TrainConfig.training), compiled by train_call.
ROWS = {"kvsall": kvsall_rows, "kvsall-ce": kvsall_ce_rows, "1vsall": onevsall_rows,
        "negative-sampling": negative_sampling_rows}


def train_call(model: nn.Module, training: str, batch_size: int, device: torch.device,
               negatives: tuple[int, int] = (0, 0), mode: str | None = None) -> CompiledCall:
    """The model's compiled loss of ``training`` (a key of ROWS) for this batch size, compiled on first use;
    negative-sampling's call also per (negatives_tail, negatives_head). mode: torch.compile's (None: CUDA
    graphs on CUDA; the captured step, itself one CUDA graph, asks for "default")."""
    per_model = _CALLS.setdefault(model, {})
    key = (training, batch_size, str(device), negatives, mode)
    if key not in per_model:
        queries = torch.zeros(1, 2, dtype=torch.long, device=device)
        if training == "negative-sampling":
            example = {"triples": torch.zeros(1, 3, dtype=torch.long, device=device),
                       "tail_candidates": torch.zeros(1, 1 + negatives[0], dtype=torch.long, device=device),
                       "head_candidates": torch.zeros(1, 1 + negatives[1], dtype=torch.long, device=device)}
        elif training == "1vsall":
            example = {"queries": queries, "answers": torch.zeros(1, dtype=torch.long, device=device)}
        else:
            example = {"queries": queries, "labels": torch.zeros(1, model.num_entities, dtype=torch.bool, device=device)}
        name = "train_" + training.replace("-", "_")
        per_model[key] = CompiledCall(name, ROWS[training], batch_size, example, training=True, mode=mode)
    return per_model[key]


def step_inputs(batches: "Batches", pos: Tensor, config: TrainConfig, num_entities: int,
                device: torch.device) -> dict[str, Tensor]:
    """The compiled call's inputs for the examples at ``pos`` [n]: queries [n, 2] and labels [n, E] bool
    (KvsAll, either loss) or answers [n] (1vsAll); negative-sampling: the triples [n, 3] and their
    candidates, drawn here (eager training takes its inputs from here too)."""
    if config.training == "negative-sampling":
        triples = batches.triples(pos).to(device)
        tails, heads = draw_candidates(triples, config.negatives_tail, config.negatives_head, num_entities)
        return {"triples": triples, "tail_candidates": tails, "head_candidates": heads}
    queries = batches.queries[pos]  # [n, 2], copied into the call's static buffer
    if batches.index is None:
        return {"queries": queries, "answers": batches.answers[pos]}
    pos_rows, pos_cols = batches.index.pairs_at(pos)
    labels = torch.zeros(len(pos), num_entities, dtype=torch.bool, device=device)
    labels[pos_rows.to(device), pos_cols.to(device)] = True
    return {"queries": queries, "labels": labels}


def step_static(model: nn.Module, config: TrainConfig) -> tuple:
    """The compiled call's leading arguments: the model, and its loss's label smoothing (KvsAll's BCE: the
    smoothed label values; kvsall-ce: eps and the style) or negative sampling's adversarial temperature."""
    if config.training == "kvsall-ce":
        return model, config.label_smoothing, config.label_smoothing_style
    if config.training == "kvsall":
        return (model, *smoothed_label_values(config.label_smoothing, model.num_entities,
                                              config.label_smoothing_style))
    if config.training == "negative-sampling":
        return model, config.adversarial_temperature
    return (model,)


def mean_of_rows(rows: Tensor, config: TrainConfig, num_entities: int, mean_over: float) -> Tensor:
    """The batch's loss from its per-row losses [n]: their mean over ``mean_over`` rows (KvsAll's BCE: over
    rows x entities, as kvsall_bce)."""
    return rows.sum() / (mean_over * num_entities if config.training == "kvsall" else mean_over)


def compiled_batch_loss(model: nn.Module, batches: "Batches", pos: Tensor, config: TrainConfig,
                        device: torch.device, *, batch_rows: float | None = None) -> Tensor:
    """Mean loss of the examples at ``pos``, as ``batch_loss``, through the compiled call of len(pos) rows.

    batch_rows: the rows the mean is over (default len(pos)), as in ``batch_loss``.
    Returns a scalar whose ``backward()`` runs the compiled backward graph.
    """
    n = len(pos)
    call = train_call(model, config.training, n, device, (config.negatives_tail, config.negatives_head))
    (rows,) = call(*step_static(model, config), **step_inputs(batches, pos, config, model.num_entities, device))
    return mean_of_rows(rows, config, model.num_entities, n if batch_rows is None else batch_rows)
