"""Explaining predictions by training triples: which ones raised or lowered each prediction, in names.

`explain` is the whole path for a notebook or the CLI: the triples to explain (ids,
labels or names), a method (``auto`` chooses by cost, see
`choose_method`), and the answer as typed
`Explanations`. `explain_triples` turns any method's
top-k (`TopK`) into explanations; `self_influence_ranking`
ranks training triples by self-influence (high: hard to fit, e.g. a mislabelled edge);
`predicted_triples` gives the model's best new tails of a query, to explain them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import torch
from torch import Tensor

from kgtrace.attribution.index import ProjectedIndex
from kgtrace.attribution.methods import (
    AUTO_BUDGET_S,
    METHOD_SPECS,
    AttributionInputs,
    MethodChoice,
    choose_method,
    explain_methods,
    matrix_top_k,
)
from kgtrace.attribution.results import SELF_COLUMNS, Explanation, Explanations, Influencer, NamedTriple, SelfInfluence
from kgtrace.attribution.topk import TopK
from kgtrace.attribution.tracin import TracIn
from kgtrace.compute.system import resolve_device
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.data.dataset import Dataset
from kgtrace.data.lookup import Named, triples_of
from kgtrace.evaluation.candidates import restriction_of
from kgtrace.evaluation.evaluate import Candidates, rank_queries
from kgtrace.evaluation.predict import predict
from kgtrace.runs.embedding import Run, load_run

__all__ = ["explain", "explain_triples", "method_for", "predicted_triples", "self_influence_ranking", "triples_of"]



# ----------------------------------------------------------------------------- targets


def predicted_triples(run: Run, head: str | int, relation: str | int, top_n: int,
                      restrict: Sequence[str] = ()) -> Tensor:
    """The model's ``top_n`` best new tails of (head, relation, ?), as triples [n, 3], best first.

    "New": not a known triple of any split (`predict`
    with ``new_only``); among the candidates ``restrict`` allows (by default the categories the
    relation's tails have in training, where the dataset has categories). Raises when the query
    has no new tail left.
    """
    found = predict(run, head=head, relation=relation, top_n=top_n, new_only=True, restrict=restrict)
    if found.table.height == 0:
        raise KgtraceError(f"({head}, {relation}, ?): every entity is already a known tail; nothing new to explain")
    h, r = run.dataset.entities.to_id[found.query.head], run.dataset.relations.to_id[found.query.relation]
    tails = torch.from_numpy(found.table["id"].to_numpy().astype("int64"))
    return torch.stack([torch.full_like(tails, h), torch.full_like(tails, r), tails], dim=1)


# ----------------------------------------------------------------------------- explanations


def _shares(parts: Tensor) -> list[tuple[float, ...]]:
    """Each checkpoint's fraction of the total, per column of parts [C, k]; sums to 1 (equal when total is 0)."""
    total = parts.sum(0, keepdim=True)
    safe = torch.where(total == 0, torch.ones_like(total), total)
    shares = torch.where(total == 0, torch.full_like(parts, 1.0 / len(parts)), parts / safe)
    return [tuple(row) for row in shares.T.tolist()]


def _shared_entities(test: Tensor, influencer: Tensor) -> str:
    """Which entities of the explained triple [3] the influencer [3] contains, in either of its slots."""
    entities = {int(influencer[0]), int(influencer[2])}
    head, tail = int(test[0]) in entities, int(test[2]) in entities
    return "both" if head and tail else "head" if head else "tail" if tail else "neither"


def _influencers(ds: Dataset, test: Tensor, index: Tensor, values: Tensor, parts: Tensor,
                 epochs: Sequence[int]) -> tuple[Influencer, ...]:
    """The entries of one side of a TopK (parts [k, C]): shares per checkpoint where the parts follow ``epochs``."""
    shares = _shares(parts.T.double()) if parts.shape[1] == len(epochs) else [None] * len(index)
    return tuple(Influencer(int(j), NamedTriple.of(ds, ds.train[j]), float(v), shares[n],
                            _shared_entities(test, ds.train[j]))
                 for n, (j, v) in enumerate(zip(index, values, strict=True)))


def explain_triples(run: Run, test: Tensor, found: list[TopK], epochs: Sequence[int],
                    memory_budget: int = 2 << 30, method: str = "tracin", method_reason: str = "",
                    restrict: Sequence[str] = ()) -> Explanations:
    """Per test triple [n, 3]: the triple, its score and filtered ranks, its proponents and opponents.

    found: each test triple's `TopK` (``TracIn.top_k``, ``ProjectedIndex.top_k`` or
    `matrix_top_k`), whose parts follow the checkpoints
    ``epochs`` (or hold one part, the whole value, for methods not summed over checkpoints).
    memory_budget: bytes for the ranking's scores at once. method, method_reason: the method and
    why it was used, recorded in each explanation. restrict: the candidates of the ranks (by default
    each relation's categories in training, where the dataset has categories; "none": all).
    """
    ds = run.dataset
    test = torch.as_tensor(test, dtype=torch.long).reshape(-1, 3).cpu()
    device = next(run.model.parameters()).device
    run.model.eval()
    with torch.no_grad():
        scores = run.model.score_hrt(test.to(device)).float().cpu()
    candidates = Candidates(restriction=restriction_of(ds, restrict))
    ranks = rank_queries(run.model, test, known=ds.all_triples(), candidates=candidates, memory_budget=memory_budget)
    realistic = {side: c.rank("realistic") for side, c in ranks.counts.items()}
    splits = ds.split_of(test)
    return Explanations(tuple(
        Explanation(tuple(int(x) for x in triple), NamedTriple.of(ds, triple), splits[i], float(scores[i]),
                    float(torch.sigmoid(scores[i])), float(realistic["tail"][i]), float(realistic["head"][i]),
                    tuple(epochs), method, method_reason,
                    _influencers(ds, triple, top.proponents, top.proponent_influence, top.proponent_parts, epochs),
                    _influencers(ds, triple, top.opponents, top.opponent_influence, top.opponent_parts, epochs))
        for i, (triple, top) in enumerate(zip(test, found, strict=True))))


def self_influence_ranking(run: Run, tracin: TracIn, top_k: int, progress: bool = False,
                           state: str | Path | None = None, save_every: float | None = None) -> SelfInfluence:
    """Training triples by self-influence, highest (most suspicious) first (state, save_every: see TracIn.top_k)."""
    if top_k < 1:
        raise ConfigError([f"top_k={top_k}: must be at least 1"])
    ds = run.dataset
    parts = tracin.checkpoint_self_influence(progress=progress, state=state, save_every=save_every).double()  # [C, n]
    values = parts.sum(0)
    order = torch.argsort(values, descending=True, stable=True)
    index = tracin.train_indices[order]  # rows of ds.train, most self-influential first
    k = min(int(top_k), len(order))
    shares = _shares(parts[:, order[:k]])
    top = tuple(Influencer(int(index[j]), NamedTriple.of(ds, ds.train[index[j]]), float(values[order[j]]),
                           shares[j], "both") for j in range(k))
    return SelfInfluence(tuple(c.epoch for c in tracin.checkpoints), top, _ranked(ds, index, values[order]))


def _ranked(ds: Dataset, index: Tensor, values: Tensor) -> pl.DataFrame:
    """Training triples ``index`` [n] with their self-influences [n], in that order, as `SELF_COLUMNS`."""
    named = [NamedTriple.of(ds, ds.train[i]) for i in index.tolist()]
    columns = {"rank": range(1, len(named) + 1), "train_index": index.tolist(),
               **{key: [getattr(t, key) for t in named] for key in SELF_COLUMNS[2:-1]},
               "self_influence": values.tolist()}
    return pl.DataFrame({name: list(columns[name]) for name in SELF_COLUMNS},
                        schema={name: pl.Int64 if name in ("rank", "train_index") else pl.Float64
                                if name == "self_influence" else pl.String for name in SELF_COLUMNS})


# ----------------------------------------------------------------------------- the whole path


def method_for(run: Run, method: str | MethodChoice, index: str | Path | None = None,
               budget: float = AUTO_BUDGET_S) -> MethodChoice:
    """The method to use and why: as given, TracIn with a projected ``index`` (it holds TracIn's gradients), or
    for ``auto`` the cheaper of TRAK and TracIn for this run (`choose_method`)."""
    if isinstance(method, MethodChoice):
        return method
    if method not in ("auto", *explain_methods()):
        raise ConfigError([f"method={method!r}: unknown; choose auto or one of {', '.join(explain_methods())}"])
    if method != "auto":
        return MethodChoice(method, f"method {method!r} asked")
    if index is not None:
        return MethodChoice("tracin", "a projected index holds TracIn's gradients")
    return choose_method(run, budget)


def explain(run: Run | str | Path, triples: Tensor | Named | Sequence[Named], *, method: str | MethodChoice = "auto",
            top_k: int = 10, inputs: AttributionInputs | None = None, tracin: Mapping[str, Any] | None = None,
            index: str | Path | None = None, progress: bool = False, state: str | Path | None = None,
            save_every: float | None = None, memory_budget: int = 2 << 30, restrict: Sequence[str] = (),
            budget: float = AUTO_BUDGET_S, device: str | torch.device = "auto") -> Explanations:
    """The ``top_k`` training triples that most raised (proponents) and most lowered (opponents) each prediction.

    Each explanation records the method and why it was used; ``.to_df()`` lists every influencer.

    Args:
        run: a run, or its folder (loaded from its best checkpoint).
        triples: ids [n, 3], or one (head, relation, tail) or a list of them in ids, labels or names
            (``("metformin", "biolink:treats", "type 2 diabetes mellitus")``).
        method: ``auto`` (the cheaper of TRAK and TracIn for this run), a name of ``kgtrace explain --method``
            (``tracin``, ``trak``, ...) or a `MethodChoice`.
        top_k: proponents and opponents per triple.
        inputs: settings of the methods other than TracIn (damping, TRAK's dimension and ridge).
        tracin: `TracIn`'s keyword arguments (params, checkpoints, precision, ...).
        index: a projected index folder (``kgtrace index``) to answer from instead of a pass over the training
            set (approximate).
        progress: show progress bars.
        state: where TracIn's pass saves its progress, to resume after a kill.
        save_every: seconds between those saves.
        memory_budget: bytes for the ranking's scores at once.
        restrict: the candidates the triples' ranks are among (by default each relation's categories in
            training, where the dataset has categories; ``("none",)``: every entity).
        budget: with ``method="auto"``: seconds TRAK may take on this machine (estimated from two timed pilots);
            over it, TracIn.
        device: TracIn's; the other methods run on the CPU (the run's model moves there).

    Returns:
        One `Explanation` per triple, in the order given.
    """
    if not isinstance(run, Run):
        run = load_run(run, device=resolve_device(device))
    test = triples_of(run.dataset, triples)
    problems = [f"top_k={top_k}: must be at least 1"] if top_k < 1 else []
    if len(test) == 0:
        problems.append("triples: none given; fix: pass (head, relation, tail) or a list of them")
    if problems:
        raise ConfigError(problems)
    choice = method_for(run, method, index, budget)
    found, epochs, run = _top_k(run, test, choice.method, top_k, inputs or AttributionInputs(progress=progress),
                                dict(tracin or {}), index, progress, state, save_every, device)
    return explain_triples(run, test, found, epochs, memory_budget=memory_budget, method=choice.method,
                           method_reason=choice.reason, restrict=restrict)


def _top_k(run: Run, test: Tensor, method: str, k: int, inputs: AttributionInputs, tracin: dict[str, Any],
           index: str | Path | None, progress: bool, state: str | Path | None, save_every: float | None,
           device: str | torch.device) -> tuple[list[TopK], list[int], Run]:
    """Each test triple's top-k by ``method``, the epochs of the checkpoints read, and the run (moved to the CPU for a
    method that scores every training triple at once there)."""
    spec = METHOD_SPECS[method]
    if not spec.streaming:
        run = dataclasses.replace(run, model=run.model.to("cpu"))
        matrix = spec.compute(run, test, inputs)
        return matrix_top_k(matrix.detach(), test, k), spec.used_checkpoints(run), run
    target = next(run.model.parameters()).device if device == "auto" else resolve_device(device)
    if index is not None:
        finder = ProjectedIndex(index, run, device=target)
        return finder.top_k(test, k), [c["epoch"] for c in finder.meta.checkpoints], run
    streaming = TracIn(run, device=target, **tracin)
    found = streaming.top_k(test, k, progress=progress, state=state, save_every=save_every)
    return found, [c.epoch for c in streaming.checkpoints], run
