"""Explanations as typed results: which training triples raised or lowered a prediction, in names.

`Explanations` holds one `Explanation` per explained triple (the triple in labels
and names, its score, probability and filtered ranks, its proponents and opponents as
`Influencer` s); `SelfInfluence` ranks the training triples by self-influence.
Each has ``to_dict()`` (the JSON ``kgtrace explain`` writes), ``to_df()`` (one row per
influencer or ranked triple, polars or pandas), ``write(path)`` (the JSON and a TSV beside it)
and ``read(path)`` (a written JSON back; the report reads explanations this way).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from kgtrace.core.io import atomic_write_text
from kgtrace.core.owned import retire, write_index
from kgtrace.data.lookup import NamedTriple
from kgtrace.display.frames import FrameKind, as_frame

__all__ = ["EXPLAIN_COLUMNS", "SELF_COLUMNS", "Explanation", "Explanations", "Influencer", "NamedTriple",
           "SelfInfluence"]

EXPLAIN_COLUMNS = ("test_index", "test_head", "test_relation", "test_tail", "test_split", "kind", "rank", "train_index",
                   "head", "relation", "tail", "head_name", "relation_name", "tail_name", "shares", "influence")
SELF_COLUMNS = ("rank", "train_index", "head", "relation", "tail", "head_name", "relation_name", "tail_name",
                "self_influence")



@dataclass(frozen=True)
class Influencer:
    """A training triple's attribution to one prediction.

    train_index: its row in the run's training split. influence: the method's value (positive:
    training on it raised the prediction's score). checkpoint_shares: each checkpoint's signed
    fraction of ``influence`` (summing to 1), or None where the method's value is not a sum over
    checkpoints. shares: which of the prediction's entities it contains: "head", "tail", "both"
    or "neither".
    """

    train_index: int
    triple: NamedTriple
    influence: float
    checkpoint_shares: tuple[float, ...] | None
    shares: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Influencer:
        shares = data.get("checkpoint_shares")
        return cls(int(data.get("train_index", -1)), NamedTriple.from_dict(data), float(data["influence"]),
                   None if shares is None else tuple(shares), data.get("shares", "?"))

    def to_dict(self) -> dict[str, Any]:
        shares = None if self.checkpoint_shares is None else list(self.checkpoint_shares)
        return {"train_index": self.train_index, **self.triple.to_dict(), "influence": self.influence,
                "checkpoint_shares": shares, "shares": self.shares}


@dataclass(frozen=True)
class Explanation:
    """One explained triple.

    ids: its (head, relation, tail) ids in the run. split: the split holding it ("train": its
    strongest proponent is then itself; "valid", "test"), None for a new prediction, "" where a
    file did not record it. score: the model's logit; probability: sigmoid(score), the model's
    belief that the triple is true. rank_tail, rank_head: its filtered realistic ranks among all
    candidate tails and heads. checkpoints: the epochs whose checkpoints the method read.
    method: the attribution method (``kgtrace explain --method``); method_reason: why it was used.
    proponents: the training triples of highest influence, highest first; opponents: of lowest,
    lowest first.
    """

    ids: tuple[int, int, int]
    triple: NamedTriple
    split: str | None
    score: float
    probability: float
    rank_tail: float
    rank_head: float
    checkpoints: tuple[int, ...]
    method: str
    method_reason: str
    proponents: tuple[Influencer, ...]
    opponents: tuple[Influencer, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Explanation:
        """From a written record; files written before a field was recorded get its earlier meaning (method:
        TracIn; probability: sigmoid(score); split: '' for not recorded)."""
        test, rank, score = data["test"], data.get("rank", {}), float(data["score"])
        probability = data.get("probability")
        return cls(tuple(test.get("ids", (-1, -1, -1))), NamedTriple.from_dict(test), data.get("split", ""), score,
                   1 / (1 + math.exp(-score)) if probability is None else float(probability),
                   float(rank.get("tail", math.nan)), float(rank.get("head", math.nan)),
                   tuple(data.get("checkpoints", ())), data.get("method", "tracin"), data.get("method_reason", ""),
                   tuple(map(Influencer.from_dict, data.get("proponents", ()))),
                   tuple(map(Influencer.from_dict, data.get("opponents", ()))))

    def to_dict(self) -> dict[str, Any]:
        return {"test": {"ids": list(self.ids), **self.triple.to_dict()}, "split": self.split, "score": self.score,
                "probability": self.probability, "rank": {"tail": self.rank_tail, "head": self.rank_head},
                "checkpoints": list(self.checkpoints), "method": self.method, "method_reason": self.method_reason,
                "proponents": [e.to_dict() for e in self.proponents],
                "opponents": [e.to_dict() for e in self.opponents]}

    def influencers(self) -> Iterator[tuple[str, int, Influencer]]:
        """(kind, rank from 1, influencer): the proponents, then the opponents."""
        for kind, entries in (("proponent", self.proponents), ("opponent", self.opponents)):
            for rank, entry in enumerate(entries, 1):
                yield kind, rank, entry


@dataclass(frozen=True)
class Explanations:
    """The explained triples of one ``kgtrace explain`` (or `kgtrace.explain`), in the order asked."""

    items: tuple[Explanation, ...]

    def __getitem__(self, i):  # an int gives one Explanation, a slice the Explanations it selects
        return Explanations(self.items[i]) if isinstance(i, slice) else self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Explanation]:
        return iter(self.items)

    def __repr__(self) -> str:
        method = self.items[0].method if self.items else "no method"
        return f"Explanations({len(self)} triples, {method}; .to_df() lists every influencer)"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Explanations:
        return cls(tuple(map(Explanation.from_dict, data["explanations"])))

    @classmethod
    def read(cls, path: str | Path) -> Explanations:
        """The explanations of a JSON written by ``kgtrace explain`` (or `write`)."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_dict(self) -> dict[str, Any]:
        return {"explanations": [item.to_dict() for item in self.items]}

    def rows(self) -> Iterator[list[Any]]:
        """One row per influencer, in `EXPLAIN_COLUMNS`' order."""
        for i, item in enumerate(self.items):
            t = item.triple
            for kind, rank, e in item.influencers():
                yield [i, t.head, t.relation, t.tail, item.split or "", kind, rank, e.train_index, e.triple.head,
                       e.triple.relation, e.triple.tail, e.triple.head_name, e.triple.relation_name,
                       e.triple.tail_name, e.shares, e.influence]

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """Every influencer of every explained triple, one row each (the TSV ``write`` puts beside the JSON)."""
        columns = list(zip(*self.rows(), strict=True)) or [()] * len(EXPLAIN_COLUMNS)
        schema = {name: pl.Float64 if name == "influence" else pl.Int64 if name in ("test_index", "rank", "train_index")
                  else pl.String for name in EXPLAIN_COLUMNS}
        return as_frame(pl.DataFrame(dict(zip(EXPLAIN_COLUMNS, map(list, columns), strict=True)), schema=schema), kind)

    def write(self, path_json: str | Path) -> Path:
        """Write the JSON and a TSV beside it (same stem, .tsv, one row per influencer); returns the TSV path.

        The JSON is written last, with the TSV's sha256 (kgtrace.core.owned.write_index).
        """
        retire(path_json)
        tsv = Path(path_json).with_suffix(".tsv")
        atomic_write_text(tsv, _tsv_lines(EXPLAIN_COLUMNS, self.rows()))
        write_index(path_json, self.to_dict(), [tsv])
        return tsv


@dataclass(frozen=True)
class SelfInfluence:
    """Training triples ranked by self-influence, highest (hardest to fit, e.g. a mislabelled edge) first.

    checkpoints: the epochs summed over. top: the first ranked triples with each checkpoint's share
    (their ``influence`` is the self-influence; ``shares`` is "both"). ranked: every training
    triple, highest first: a frame of `SELF_COLUMNS` (rank from 1).
    """

    checkpoints: tuple[int, ...]
    top: tuple[Influencer, ...]
    ranked: pl.DataFrame

    def __repr__(self) -> str:
        return f"SelfInfluence({self.ranked.height} training triples ranked; .top: the first {len(self.top)})"

    def to_dict(self) -> dict[str, Any]:
        top = [{"train_index": e.train_index, **e.triple.to_dict(), "self_influence": e.influence,
                "checkpoint_shares": None if e.checkpoint_shares is None else list(e.checkpoint_shares)}
               for e in self.top]
        return {"self_influence": {"checkpoints": list(self.checkpoints), "top": top}, "num_train": self.ranked.height}

    def to_df(self, kind: FrameKind = "polars") -> Any:
        return as_frame(self.ranked, kind)

    def write(self, path_json: str | Path) -> Path:
        """Write the top as JSON and every triple, ranked, as a TSV beside it; returns the TSV path.

        The JSON is written last, with the TSV's sha256 (kgtrace.core.owned.write_index).
        """
        retire(path_json)
        tsv = Path(path_json).with_suffix(".tsv")
        atomic_write_text(tsv, _tsv_lines(SELF_COLUMNS, self.ranked.iter_rows()))
        write_index(path_json, self.to_dict(), [tsv])
        return tsv


def _tsv(value: Any) -> str:
    text = f"{value:.9g}" if isinstance(value, float) else str(value)
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def _tsv_lines(columns: Sequence[str], rows: Iterator[Sequence[Any]]) -> Iterator[str]:
    yield "\t".join(columns) + "\n"
    for row in rows:
        yield "\t".join(map(_tsv, row)) + "\n"
