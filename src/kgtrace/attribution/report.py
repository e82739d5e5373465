"""Readable TracIn explanations: which training triples support or oppose a prediction.

:func:`explain_triples` turns TracIn influences into JSON-ready dicts (the test triple with
labels and names, its score and filtered realistic ranks, its strongest proponents and
opponents with each checkpoint's share of their influence); :func:`self_influence_ranking`
ranks training triples by self-influence (high: hard to fit, e.g. a mislabelled edge);
:func:`write_explanations` / :func:`write_self_influence` write JSON and a TSV beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from kgtrace.attribution.topk import TopK
from kgtrace.attribution.tracin import TracIn
from kgtrace.data.dataset import Dataset
from kgtrace.errors import ConfigError, KgtraceError
from kgtrace.evaluation.evaluate import rank_queries
from kgtrace.evaluation.predict import predict
from kgtrace.io import atomic_write_text
from kgtrace.owned import retire, write_index
from kgtrace.run import Run

__all__ = ["explain_triples", "predicted_triples", "self_influence_ranking", "write_explanations",
           "write_self_influence"]

EXPLAIN_COLUMNS = ("test_index", "test_head", "test_relation", "test_tail", "test_split", "kind", "rank", "train_index",
                   "head", "relation", "tail", "head_name", "relation_name", "tail_name", "shares", "influence")
ENTRY_COLUMNS = EXPLAIN_COLUMNS[7:]  # the columns an influencer's own dict fills
SELF_COLUMNS = ("rank", "train_index", "head", "relation", "tail", "head_name", "relation_name", "tail_name",
                "self_influence")


# ----------------------------------------------------------------------------- targets


def predicted_triples(run: Run, head: str | int, relation: str | int, top_n: int) -> Tensor:
    """The model's ``top_n`` best new tails of (head, relation, ?), as triples [n, 3], best first.

    "New": not a known triple of any split (:func:`~kgtrace.evaluation.predict.predict`
    with ``new_only``). Raises when the query has no new tail left.
    """
    found = predict(run, head=head, relation=relation, top_n=top_n, new_only=True)
    if found.table.height == 0:
        raise KgtraceError(f"({head}, {relation}, ?): every entity is already a known tail; nothing new to explain")
    h, r = run.dataset.entities.to_id[found.query["head"]], run.dataset.relations.to_id[found.query["relation"]]
    tails = torch.from_numpy(found.table["id"].to_numpy().astype("int64"))
    return torch.stack([torch.full_like(tails, h), torch.full_like(tails, r), tails], dim=1)


# ----------------------------------------------------------------------------- explanations


def _triple_dict(ds: Dataset, triple: Sequence[int]) -> dict:
    h, r, t = (int(x) for x in triple)
    head, relation, tail = ds.entity_label(h), ds.relation_label(r), ds.entity_label(t)
    return {"head": head, "relation": relation, "tail": tail, "head_name": ds.entity_name(head),
            "relation_name": ds.relation_name(relation), "tail_name": ds.entity_name(tail)}


def _shares(parts: Tensor) -> list[list[float]]:
    """Each checkpoint's fraction of the total, per column of parts [C, k]; sums to 1 (equal when total is 0)."""
    total = parts.sum(0, keepdim=True)
    safe = torch.where(total == 0, torch.ones_like(total), total)
    shares = torch.where(total == 0, torch.full_like(parts, 1.0 / len(parts)), parts / safe)
    return shares.T.tolist()


def explain_triples(run: Run, test: Tensor, found: list[TopK], epochs: list[int],
                    memory_budget: int = 2 << 30, method: str = "tracin", method_reason: str = "") -> list[dict]:
    """Per test triple [n, 3]: the triple, its score and filtered ranks, its proponents and opponents.

    found: each test triple's :class:`TopK` (``TracIn.top_k`` or ``ProjectedIndex.top_k``),
    whose parts follow the checkpoints ``epochs``; ``checkpoint_shares`` gives each
    checkpoint's fraction of an influence (signed, summing to 1; None where the parts are not
    per checkpoint, as for the methods of :mod:`.methods`). memory_budget: bytes for the
    ranking's scores at once. method: the attribution method, recorded in each item with
    ``method_reason``, why it was used (explain's ``--method auto`` says why it chose it).

    Each item's ``split`` says where the triple itself is ("train": its strongest proponent is
    then itself, as TracIn's self-influence is large; "valid", "test", or None for a new
    prediction); ``probability`` is sigmoid(score), the model's belief that the triple is true
    (its training loss is binary cross-entropy on that). Each influencer's ``shares`` says which
    of the explained triple's entities it contains: "head", "tail", "both" or "neither".
    """
    ds = run.dataset
    test = torch.as_tensor(test, dtype=torch.long).reshape(-1, 3).cpu()
    device = next(run.model.parameters()).device
    run.model.eval()
    with torch.no_grad():
        scores = run.model.score_hrt(test.to(device)).float().cpu()
    ranks = rank_queries(run.model, test, known=ds.all_triples(), memory_budget=memory_budget)
    realistic = {side: c.rank("realistic") for side, c in ranks.counts.items()}
    splits = ds.split_of(test)
    items = []
    for i, (triple, top) in enumerate(zip(test, found, strict=True)):
        item = {"test": {"ids": [int(x) for x in triple], **_triple_dict(ds, triple)},
                "split": splits[i],
                "score": float(scores[i]),
                "probability": float(torch.sigmoid(scores[i])),
                "rank": {"tail": float(realistic["tail"][i]), "head": float(realistic["head"][i])},
                "checkpoints": epochs,
                "method": method,
                "method_reason": method_reason}
        for kind, index, values, parts in (("proponents", top.proponents, top.proponent_influence, top.proponent_parts),
                                           ("opponents", top.opponents, top.opponent_influence, top.opponent_parts)):
            shares = _shares(parts.T.double()) if parts.shape[1] == len(epochs) else [None] * len(index)
            item[kind] = [_influencer(ds, int(j), float(v), shares[n]) | {"shares": _shared_entities(triple, ds.train[j])}
                          for n, (j, v) in enumerate(zip(index, values))]
        items.append(item)
    return items


def _shared_entities(test: Tensor, influencer: Tensor) -> str:
    """Which entities of the explained triple [3] the influencer [3] contains, in either of its slots."""
    entities = {int(influencer[0]), int(influencer[2])}
    head, tail = int(test[0]) in entities, int(test[2]) in entities
    return "both" if head and tail else "head" if head else "tail" if tail else "neither"


def _influencer(ds: Dataset, index: int, value: float, shares: list[float] | None, key: str = "influence") -> dict:
    """A training triple (``index`` into ``ds.train``) with labels, names, its value and checkpoint shares."""
    return {"train_index": index, **_triple_dict(ds, ds.train[index]), key: value, "checkpoint_shares": shares}


def self_influence_ranking(run: Run, tracin: TracIn, top_k: int, progress: bool = False,
                           state: str | Path | None = None, save_every: float | None = None) -> dict:
    """Training triples by self-influence, highest (most suspicious) first (state, save_every: see TracIn.top_k).

    Returns {"checkpoints", "top": top-k dicts with checkpoint shares, "all": every triple, ranked}.
    """
    if top_k < 1:
        raise ConfigError([f"top_k={top_k}: must be at least 1"])
    ds = run.dataset
    parts = tracin.checkpoint_self_influence(progress=progress, state=state, save_every=save_every).double()  # [C, n]
    values = parts.sum(0)
    order = torch.argsort(values, descending=True, stable=True)
    k = min(int(top_k), len(order))
    shares = _shares(parts[:, order[:k]])
    index = tracin.train_indices
    top = [_influencer(ds, int(index[p]), float(values[p]), shares[j], "self_influence")
           for j, p in enumerate(order[:k])]
    every = [{"train_index": int(index[p]), **_triple_dict(ds, ds.train[index[p]]),
              "self_influence": float(values[p])} for p in order]
    return {"checkpoints": [c.epoch for c in tracin.checkpoints], "top": top, "all": every}


# ----------------------------------------------------------------------------- writing


def _tsv(value) -> str:
    text = f"{value:.9g}" if isinstance(value, float) else str(value)
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def _tsv_path(path_json: str | Path) -> Path:
    return Path(path_json).with_suffix(".tsv")


def write_explanations(items: list[dict], path_json: str | Path) -> Path:
    """Write ``items`` as JSON and a TSV beside it (same stem, .tsv, one row per influencer); returns the TSV path.

    The JSON is written last, with the TSV's sha256 (kgtrace.owned.write_index).
    """
    retire(path_json)
    rows = ["\t".join(EXPLAIN_COLUMNS) + "\n"]
    for i, item in enumerate(items):
        test = item["test"]
        for kind in ("proponents", "opponents"):
            for rank, entry in enumerate(item[kind], 1):
                values = [i, test["head"], test["relation"], test["tail"], item.get("split") or "", kind[:-1], rank] + \
                    [entry.get(c, "") for c in ENTRY_COLUMNS]
                rows.append("\t".join(_tsv(v) for v in values) + "\n")
    tsv = _tsv_path(path_json)
    atomic_write_text(tsv, rows)
    write_index(path_json, {"explanations": items}, [tsv])
    return tsv


def write_self_influence(ranking: dict, path_json: str | Path) -> Path:
    """Write the top of ``ranking`` as JSON and every triple, ranked, as a TSV beside it; returns the TSV path.

    The JSON is written last, with the TSV's sha256 (kgtrace.owned.write_index).
    """
    retire(path_json)
    rows = ["\t".join(SELF_COLUMNS) + "\n"]
    for rank, entry in enumerate(ranking["all"], 1):
        rows.append("\t".join(_tsv(v) for v in [rank] + [entry[c] for c in SELF_COLUMNS[1:]]) + "\n")
    tsv = _tsv_path(path_json)
    atomic_write_text(tsv, rows)
    write_index(path_json, {"self_influence": {k: ranking[k] for k in ("checkpoints", "top")},
                            "num_train": len(ranking["all"])}, [tsv])
    return tsv
