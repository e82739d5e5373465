"""Everyday questions to a trained model: its best candidates for a query, and scores of given triples.

`predict` ranks every entity as the tail of (head, relation, ?) or the head of
(?, relation, tail), like PyKEEN's ``predict_target``: candidates with labels, readable
names, scores and where each candidate triple is already known (train, valid or test),
optionally only new ones or only entities of one category. `score_triples` scores
a labelled file's triples with their filtered realistic head and tail ranks; lines with
unknown labels are reported and skipped, the rest still scored. Both return tables
(polars) that `write_table` writes as JSON with a TSV beside it.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from torch import Tensor

from kgtrace.core.errors import ConfigError, DataError
from kgtrace.core.io import atomic_write_text, check_json_out
from kgtrace.core.owned import retire, write_index
from kgtrace.data.dataset import Dataset
from kgtrace.data.lookup import find_ids, lookup_problem, lookup_relation, relation_ids, relation_matches
from kgtrace.data.triples import FIELDS, read_labeled_triples_with_lines
from kgtrace.display.frames import FrameKind, as_frame
from kgtrace.evaluation.candidates import restriction_note, restriction_of
from kgtrace.evaluation.evaluate import Candidates, model_device, rank_queries
from kgtrace.evaluation.output import true_scores
from kgtrace.runs.embedding import Run

__all__ = ["Predictions", "Query", "ScoredTriples", "SkippedLine", "predict", "score_triples", "write_table"]

SPLITS = ("train", "valid", "test")
HINTS = 20  # unknown labels get close-match hints up to this many lines (difflib is slow on big vocabularies)


@dataclass(frozen=True)
class Query:
    """The query `predict` answered, in the run's labels: the asked side is None and ``side`` names it."""

    head: str | None
    relation: str
    relation_name: str  # the relation's readable name (its label where it has none)
    tail: str | None
    side: str  # "tail" for (head, relation, ?), "head" for (?, relation, tail)

    def to_dict(self) -> dict:
        """JSON-ready: ``{"head", "relation", "relation_name", "tail", "side"}`` (the asked side null)."""
        return asdict(self)


@dataclass(frozen=True)
class SkippedLine:
    """A line `score_triples` could not score: its 1-based number in the file and why (each unknown label)."""

    line: int
    problem: str

    def to_dict(self) -> dict:
        """JSON-ready: ``{"line", "problem"}``."""
        return asdict(self)


@dataclass
class Predictions:
    """Candidates of one query, best first: columns rank, id, label, name, categories, score, known, in_<split>."""

    query: Query
    table: pl.DataFrame
    note: str = "candidates: every entity"  # what the candidates were (restricted by category or not)

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """The candidates as a data frame: "polars" or "pandas"."""
        return as_frame(self.table, kind)


@dataclass
class ScoredTriples:
    """Scored triples (columns line, head, relation, tail, names, score, head_rank, tail_rank, known, in_<split>)
    and the lines skipped for an unknown label."""

    table: pl.DataFrame
    skipped: list[SkippedLine] = field(default_factory=list)
    note: str = "candidates: every entity"  # what the ranks were among (restricted by category or not)

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """The scored triples as a data frame: "polars" or "pandas"."""
        return as_frame(self.table, kind)


def predict(run: Run, *, relation: str | int, head: str | int | None = None, tail: str | int | None = None,
            top_n: int = 20, new_only: bool = False, category: str | None = None,
            restrict: str | Sequence[str] = ()) -> Predictions:
    """The ``top_n`` best tails of (head, relation, ?), or heads of (?, relation, tail): give exactly one of head, tail.

    Ties keep the lower entity id first.

    Args:
        run: a loaded run (``kgtrace.load_run``).
        relation: a label, an id or (KGX) a predicate such as ``biolink:treats``.
        head: the query's head as a label, an id or a name in any case (``"metformin"``); asks for tails.
        tail: the query's tail, likewise; asks for heads.
        top_n: candidates returned.
        new_only: drop candidates whose triple is in any split.
        category: keep only entities of this node category (node_categories.tsv).
        restrict: the candidates, as `restriction_of` reads them: by default, where the dataset has node
            categories, only entities of the categories the relation takes on that side in training (a
            drug's ``treats`` tails are diseases); ``"none"``: every entity.

    Returns:
        `Predictions`: the query, a table of candidates with names, categories, scores and splits
        (``.to_df()``), and what the candidates were (``.note``).
    """
    ds = run.dataset
    ids, problems = find_ids(ds, head=head, relation=relation, tail=tail)
    problems += _query_problems(head, tail, top_n)
    if problems:
        raise ConfigError(problems)
    side = "tail" if tail is None else "head"
    scores = _query_scores(run, ids, side)  # [E]
    known = {split: _known_answers(getattr(ds, split), ids, side, ds.num_entities) for split in SPLITS}  # [E] bool each
    keep = torch.isfinite(scores)
    if new_only:
        keep &= ~(known["train"] | known["valid"] | known["test"])
    if category is not None:
        keep &= _category_mask(ds, category)
    rules = [restrict] if isinstance(restrict, str) else list(restrict)
    restriction = restriction_of(ds, rules)
    if restriction is not None:  # row r: tails of r; row r + R: its heads
        row = ids["relation"] + (0 if side == "tail" else ds.num_relations)
        keep &= restriction.mask(torch.tensor([row]))[0]
    order = torch.sort(scores, descending=True, stable=True).indices  # ties: lower id first
    chosen = order[keep[order]][:top_n]
    relation_label = ds.relation_label(ids["relation"])
    query = Query(head=_label(ds, ids["head"]), relation=relation_label, relation_name=ds.relation_name(relation_label),
                  tail=_label(ds, ids["tail"]), side=side)
    return Predictions(query, _candidate_table(ds, chosen, scores, known), restriction_note(restriction, rules))


def score_triples(run: Run, path: str | Path, memory_budget: int = 2 << 30,
                  restrict: str | Sequence[str] = ()) -> ScoredTriples:
    """Score every triple of a labelled file, with filtered realistic head and tail ranks against all splits.

    Args:
        run: a loaded run (``kgtrace.load_run``).
        path: a file of ``head<TAB>relation<TAB>tail`` lines, in the labels of the run's id maps (or, for KGX data,
            its predicates).
        memory_budget: bytes for the ranking's scores at once.
        restrict: the ranks' candidates, as in `predict`: by default, where the dataset has node categories,
            the categories each relation takes on each side in training; ``"none"``: every entity.

    Returns:
        `ScoredTriples`: a row per scored line (names, score, head and tail ranks, known or not; ``.to_df()``),
        the lines skipped for a label the run does not know, each with the line and why, and ``.note``.

    Raises:
        DataError: the file has no line that can be scored, naming its first problem.
    """
    labeled, lines = read_labeled_triples_with_lines(path)
    ds = run.dataset
    ids = np.stack([ds.entities.lookup(labeled[:, 0]), relation_ids(ds, labeled[:, 1]),
                    ds.entities.lookup(labeled[:, 2])], axis=1).reshape(-1, 3)  # [n, 3], -1 where unknown
    good = (ids >= 0).all(axis=1)
    skipped = [_skip_reason(ds, labeled[i], ids[i], int(lines[i]), hint=n < HINTS)
               for n, i in enumerate(np.flatnonzero(~good))]
    if not good.any():
        first = f" (first: line {skipped[0].line}: {skipped[0].problem})" if skipped else ""
        raise DataError(path, None, f"no triple to score{first}",
                        "write head<TAB>relation<TAB>tail per line with labels from the run's node_dict and rel_dict")
    triples = torch.from_numpy(ids[good].astype(np.int64))
    model = run.model.eval()
    scores = true_scores(model, triples[:, :2], triples[:, 2])  # [n]
    rules = [restrict] if isinstance(restrict, str) else list(restrict)
    restriction = restriction_of(ds, rules)
    ranks = rank_queries(model, triples, known=ds.all_triples(), candidates=Candidates(restriction=restriction),
                         memory_budget=memory_budget)
    table = pl.DataFrame({
        "line": lines[good],
        **_labelled_columns(ds, triples),
        "score": scores.numpy(),
        "head_rank": ranks.counts["head"].rank("realistic").numpy(),
        "tail_rank": ranks.counts["tail"].rank("realistic").numpy(),
        **_membership(ds, triples),
    })
    return ScoredTriples(table, skipped, restriction_note(restriction, rules))


def write_table(table: pl.DataFrame, path_json: str | Path, extra: dict) -> Path:
    """Write ``{**extra, "rows": [...]}`` as JSON and the table as a TSV beside it (same stem); returns the TSV path.

    The JSON is written last, with the TSV's sha256 (kgtrace.core.owned.write_index).
    """
    path_json = Path(path_json)
    check_json_out(path_json)
    retire(path_json)
    tsv = path_json.with_suffix(".tsv")
    atomic_write_text(tsv, table.write_csv(separator="\t", quote_style="never"))
    write_index(path_json, {**extra, "rows": table.to_dicts()}, [tsv])
    return tsv


# ----------------------------------------------------------------------------- predict


def _query_problems(head, tail, top_n: int) -> list[str]:
    problems = []
    if (head is None) == (tail is None):
        problems.append(f"head={head!r}, tail={tail!r}: give exactly one of them (head for tails, tail for heads)")
    if top_n < 1:
        problems.append(f"top_n={top_n}: must be at least 1")
    return problems


def _query_scores(run: Run, ids: dict, side: str) -> Tensor:
    """Scores [E] of every entity as the asked side of the query."""
    model = run.model.eval()
    device = model_device(model)
    with torch.no_grad():
        if side == "tail":
            scores = model.score_t(torch.tensor([[ids["head"], ids["relation"]]], device=device))
        else:
            scores = model.score_h(torch.tensor([[ids["relation"], ids["tail"]]], device=device))
    return scores[0].float().cpu()


def _known_answers(triples: Tensor, ids: dict, side: str, num_entities: int) -> Tensor:
    """[E] bool: entities that answer the query in ``triples`` [n, 3]."""
    anchor, answer = (0, 2) if side == "tail" else (2, 0)
    match = (triples[:, 1] == ids["relation"]) & (triples[:, anchor] == ids["head" if side == "tail" else "tail"])
    mask = torch.zeros(num_entities, dtype=torch.bool)
    mask[triples[match, answer]] = True
    return mask


def _category_mask(ds: Dataset, category: str) -> Tensor:
    """[E] bool: entities listed with ``category`` in the dataset's node categories."""
    if not ds.entity_categories:
        raise ConfigError([f"category={category!r}: the run's dataset has no node categories; fix: prepare it from "
                           "KGX nodes (kgtrace prepare --kgx-nodes ...) or add node_categories.tsv, or drop --category"])
    labels = [label for label, cats in ds.entity_categories.items() if category in cats]
    if not labels:
        every = sorted({c for cats in ds.entity_categories.values() for c in cats})
        close = difflib.get_close_matches(category, every, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(map(repr, close))}?" if close else f"known: {', '.join(every[:20])}"
        raise ConfigError([f"category={category!r}: no entity has it; {hint}"])
    ids = ds.entities.lookup(labels)
    mask = torch.zeros(ds.num_entities, dtype=torch.bool)
    mask[torch.from_numpy(ids[ids >= 0])] = True
    return mask


def _candidate_table(ds: Dataset, chosen: Tensor, scores: Tensor, known: dict[str, Tensor]) -> pl.DataFrame:
    labels = [ds.entity_label(i) for i in chosen.tolist()]
    flags = {f"in_{split}": known[split][chosen].numpy() for split in SPLITS}
    return pl.DataFrame({
        "rank": np.arange(1, len(chosen) + 1),
        "id": chosen.numpy(),
        "label": labels,
        "name": [ds.entity_name(label) for label in labels],
        "categories": ["|".join(ds.entity_categories.get(label, ())) for label in labels],
        "score": scores[chosen].numpy(),
        "known": flags["in_train"] | flags["in_valid"] | flags["in_test"],
        **flags,
    }, schema_overrides={"label": pl.String, "name": pl.String, "categories": pl.String})


def _label(ds: Dataset, entity: int | None) -> str | None:
    return None if entity is None else ds.entity_label(entity)


# ----------------------------------------------------------------------------- score


def _skip_reason(ds: Dataset, labeled: np.ndarray, ids: np.ndarray, line: int, hint: bool) -> SkippedLine:
    """Why a line was skipped: each unknown label, with close labels for the first few lines."""
    problems = []
    for column, role in enumerate(FIELDS):
        if ids[column] >= 0:
            continue
        kind = "relation" if role == "relation" else "entity"
        if role == "relation" and (hint or len(relation_matches(ds, labeled[column])) > 1):
            problems.append(lookup_relation(ds, labeled[column], role, allow_ids=False)[1])
        elif hint:
            problems.append(lookup_problem(ds.entities, labeled[column], role, kind, allow_ids=False)[1])
        else:
            problems.append(f"{role} {labeled[column]!r}: unknown {kind}")
    return SkippedLine(line, "; ".join(problems))


def _labelled_columns(ds: Dataset, triples: Tensor) -> dict[str, list[str]]:
    h, r, t = ([labels[i] for i in triples[:, c].tolist()] for c, labels in
               ((0, ds.entities.labels), (1, ds.relations.labels), (2, ds.entities.labels)))
    return {"head": h, "relation": r, "tail": t, "head_name": [ds.entity_name(x) for x in h],
            "relation_name": [ds.relation_name(x) for x in r], "tail_name": [ds.entity_name(x) for x in t]}


def _membership(ds: Dataset, triples: Tensor) -> dict[str, np.ndarray]:
    """known and in_<split> [n] bool: whether each triple is in each split."""
    flags = {f"in_{split}": _contains(getattr(ds, split), triples, ds) for split in SPLITS}
    return {"known": flags["in_train"] | flags["in_valid"] | flags["in_test"], **flags}


def _contains(split: Tensor, triples: Tensor, ds: Dataset) -> np.ndarray:
    """[n] bool: which triples [n, 3] occur in ``split`` [m, 3] (one int64 key per triple, sorted search)."""
    def key(x: Tensor) -> Tensor:
        return (x[:, 0] * ds.num_relations + x[:, 1]) * ds.num_entities + x[:, 2]

    keys = torch.sort(key(split)).values
    wanted = key(triples)
    at = torch.searchsorted(keys, wanted).clamp(max=max(len(keys) - 1, 0))
    return ((keys[at] == wanted) if len(keys) else torch.zeros(len(wanted), dtype=torch.bool)).numpy()
