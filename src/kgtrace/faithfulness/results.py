"""The typed results of the faithfulness checks: what faithfulness.json and lds.json hold.

`FaithfulnessResult` is what ``kgtrace faithfulness`` (`.check_faithfulness`) returns and
writes as faithfulness.json; `LdsResult` what ``kgtrace faithfulness --lds`` (`.check_lds`)
returns and writes as lds.json. Each has ``to_dict()`` (the file's JSON, keys in the file's order),
``from_dict(data)`` and ``read(path)`` (a written file back into the object) and ``to_df()`` (a table
as a polars or pandas frame, one row per table row, the columns of the file's rows).

Two results are equal when they write the same JSON (so NaN equals NaN and arrays compare by value).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

from kgtrace.display.frames import FrameKind, as_frame

__all__ = ["AgreementRow", "CellRow", "ExplainedPredictions", "FaithfulnessResult", "FaithfulnessRow", "LdsResult",
           "LdsRow", "RemovalSettings"]

Labels = tuple[str, str, str]  # (head, relation, tail) labels of a prediction

# A field's annotation -> its frame column; a tuple of ints is written as its space-separated string.
_POLARS = {"str": pl.String, "int": pl.Int64, "float": pl.Float64, "bool": pl.Boolean, "tuple[int, ...]": pl.String}


def _schema(row_type: type) -> dict[str, Any]:
    """The polars column types of a row dataclass, one per field in order (``X | None``: nullable X)."""
    return {f.name: _POLARS[f.type.removesuffix(" | None")] for f in fields(row_type)}


def _frame(rows: tuple, row_type: type, kind: FrameKind) -> Any:
    """One row per record (its JSON values), one column per field of ``row_type``; typed even when empty."""
    return as_frame(pl.DataFrame([row.to_dict() for row in rows], schema=_schema(row_type)), kind)


def _fields_of(row_type: type, data: dict) -> dict[str, Any]:
    """``data``'s value of each field of ``row_type`` (KeyError naming a missing one; other keys ignored)."""
    return {f.name: data[f.name] for f in fields(row_type)}


def _plain(record: Any) -> dict[str, Any]:
    """A flat dataclass as {field: value}, in field order (no deep copy)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _nan_as_none(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each NaN float as None (lds.json's null: JSON has no NaN)."""
    return {key: None if isinstance(v, float) and np.isnan(v) else v for key, v in values.items()}


def _read_json(path: str | Path) -> dict:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: holds {type(data).__name__}, not a JSON object")
    return data


def _same_json(self: Any, other: object) -> bool:
    """Equality by the JSON a result writes (NaN equals NaN, arrays by value): a result class's ``__eq__``."""
    if type(other) is not type(self):
        return NotImplemented
    return json.dumps(self.to_dict()) == json.dumps(other.to_dict())


def _json_hash(self: Any) -> int:
    """The hash that goes with `_same_json`."""
    return hash(json.dumps(self.to_dict()))


# ----------------------------------------------------------------------------- faithfulness.json


@dataclass(frozen=True)
class RemovalSettings:
    """The settings a removal check ran with (faithfulness.json "settings")."""

    ks: tuple[int, ...]  # numbers of training triples removed per prediction
    methods: tuple[str, ...]  # removal methods, in the order given
    mode: str  # "retrain" (from scratch) | "finetune" (from an early checkpoint)
    variant: str  # the variant this call ran: "retrain" or "finetune-from-NNNN" (the epoch fine-tuning started from)
    seed: int  # of the random and neighbourhood methods and of the sample
    sample: int | None  # how many rank-first test triples were drawn; None: all of them (or given triples)
    prover_run: str | None  # the prover run folder of the proof method; None: no proof method
    restrict: tuple[str, ...] = ()  # --restrict: the ranks' candidates; (): by category where the data has them
    rules: str | None = None  # the rule file of the paths method; None: no paths method

    def to_dict(self) -> dict[str, Any]:
        return {**_plain(self), "ks": list(self.ks), "methods": list(self.methods), "restrict": list(self.restrict)}

    @classmethod
    def from_dict(cls, data: dict) -> RemovalSettings:
        values = _fields_of(cls, {"restrict": (), "rules": None, **data})  # files written before them: defaults
        return cls(**{**values, "ks": tuple(values["ks"]), "methods": tuple(values["methods"]),
                      "restrict": tuple(values["restrict"])})


@dataclass(frozen=True)
class ExplainedPredictions:
    """The predictions the check explained (faithfulness.json "predictions")."""

    how: str  # a sentence saying where they come from (rank-first test triples, a sample of them, a file)
    triples: tuple[Labels, ...]  # (head, relation, tail) labels, in the order of the cells' "prediction" index

    def to_dict(self) -> dict[str, Any]:
        return {"how": self.how, "triples": [list(t) for t in self.triples]}

    @classmethod
    def from_dict(cls, data: dict) -> ExplainedPredictions:
        return cls(data["how"], tuple(tuple(t) for t in data["triples"]))


@dataclass(frozen=True)
class FaithfulnessRow:
    """One (variant, method, k) of the table over its finished predictions (faithfulness.json "table").

    Method "none" with k 0 is the control: trained again with nothing removed. PD, TC and Hits@1
    are fractions in [0, 1]; scores are the model's raw scores (logits); ranks are realistic
    filtered tail ranks (`.metrics`).
    """

    variant: str  # "retrain" or "finetune-from-NNNN"
    method: str  # removal method, or "none" (the control)
    k: int  # triples asked to be removed per prediction
    removed: float  # mean number really removed per prediction (a method may find fewer than k)
    n: int  # predictions measured
    n_top1: int  # of them, those top-1 before the removal (TC's denominator)
    pd: float  # fraction whose probability dropped
    tc: float  # fraction of the top-1 ones no longer top-1; NaN when none was top-1
    score_drop: float  # mean score before - after
    prob_drop: float  # mean probability before - after
    rank_change: float  # mean rank after - before (positive: worse)
    mrr_before: float  # MRR of the predictions by the run's last checkpoint
    mrr_after: float  # MRR by the models trained again without the removed triples
    mrr_drop: float  # mrr_before - mrr_after
    hits_at_1_before: float
    hits_at_1_after: float
    seconds: float  # mean seconds of one training of this row

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_dict(cls, data: dict) -> FaithfulnessRow:
        return cls(**_fields_of(cls, data))


@dataclass(frozen=True)
class AgreementRow:
    """How far a fine-tuning variant agrees with retraining on the removals both ran (faithfulness.json "agreement").

    Agreements are fractions in [0, 1]; ``method`` "all" with k 0 is every shared removal together.
    """

    cheap: str  # the fine-tuning variant, "finetune-from-NNNN"
    method: str  # removal method, or "all"
    k: int  # triples removed per prediction; 0 with method "all"
    n: int  # removals (prediction, method, k) compared
    pd_agreement: float  # fraction where both say the same about the probability dropping
    tc_agreement: float  # same about losing top-1, over the predictions top-1 before; NaN when none was
    score_drop_pearson: float  # Pearson correlation of the score drops; NaN when either is constant or n < 2
    score_drop_mean_abs_diff: float  # mean |score drop by fine-tuning - score drop by retraining|
    prob_drop_pearson: float  # the same of the probability drops
    prob_drop_mean_abs_diff: float

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_dict(cls, data: dict) -> AgreementRow:
        return cls(**_fields_of(cls, data))


@dataclass(frozen=True)
class CellRow:
    """One finished (variant, prediction, method, k): the prediction before and after (faithfulness.json "cells")."""

    variant: str  # "retrain" or "finetune-from-NNNN"
    prediction: int  # index into the explained predictions
    head: str  # the prediction's labels
    relation: str
    tail: str
    method: str  # removal method
    k: int  # triples asked to be removed
    removed: tuple[int, ...]  # rows of the run's training split removed, ascending (JSON: "3 17 40")
    score_before: float  # score by the run's last checkpoint
    score_after: float  # score by the model trained again without the removed triples
    prob_before: float  # probability among all tails (softmax of the scores)
    prob_after: float
    rank_before: float  # realistic filtered tail rank
    rank_after: float
    pd: bool  # the probability dropped
    tc: bool | None  # top-1 before and no longer after; None: it was not top-1 before

    def to_dict(self) -> dict[str, Any]:
        return {**_plain(self), "removed": " ".join(map(str, self.removed))}

    @classmethod
    def from_dict(cls, data: dict) -> CellRow:
        values = _fields_of(cls, data)
        return cls(**{**values, "removed": tuple(int(i) for i in values["removed"].split())})


FaithfulnessTable = Literal["table", "cells", "agreement"]


@dataclass(frozen=True, eq=False)
class FaithfulnessResult:
    """What a removal check measured: faithfulness.json, with the results of every variant in its folder."""

    run: str  # the run's folder, absolute
    checkpoint: str  # file name of the run's checkpoint measured before removals (its last)
    epochs: int  # epochs every training ran to
    settings: RemovalSettings
    predictions: ExplainedPredictions
    control_max_abs_score_change: dict[str, float | None]  # variant -> largest |score change| with nothing removed
    table: tuple[FaithfulnessRow, ...]  # per variant, the control first, then per (method, k)
    agreement: tuple[AgreementRow, ...]  # empty unless retraining and fine-tuning both ran in the folder
    cells: tuple[CellRow, ...]  # every finished (variant, prediction, method, k), control excluded

    __eq__, __hash__ = _same_json, _json_hash  # equal when they write the same JSON

    def to_dict(self) -> dict[str, Any]:
        """faithfulness.json's content, keys in its order."""
        return {"run": self.run, "checkpoint": self.checkpoint, "epochs": self.epochs,
                "settings": self.settings.to_dict(), "predictions": self.predictions.to_dict(),
                "control_max_abs_score_change": dict(self.control_max_abs_score_change),
                "table": [row.to_dict() for row in self.table],
                "agreement": [row.to_dict() for row in self.agreement],
                "cells": [row.to_dict() for row in self.cells]}

    @classmethod
    def from_dict(cls, data: dict) -> FaithfulnessResult:
        """The result of faithfulness.json's content (KeyError on a missing key)."""
        return cls(data["run"], data["checkpoint"], data["epochs"], RemovalSettings.from_dict(data["settings"]),
                   ExplainedPredictions.from_dict(data["predictions"]), dict(data["control_max_abs_score_change"]),
                   tuple(FaithfulnessRow.from_dict(r) for r in data["table"]),
                   tuple(AgreementRow.from_dict(r) for r in data["agreement"]),
                   tuple(CellRow.from_dict(r) for r in data["cells"]))

    @classmethod
    def read(cls, path: str | Path) -> FaithfulnessResult:
        """A faithfulness.json written by ``kgtrace faithfulness``."""
        return cls.from_dict(_read_json(path))

    def to_df(self, kind: FrameKind = "polars", table: FaithfulnessTable = "table") -> Any:
        """One of the tables as a frame, one row per row: "table" (faithfulness.tsv), "cells" (cells.tsv) or
        "agreement" (agreement.tsv); columns the rows' fields; kind "polars" or "pandas"."""
        row_types = {"table": FaithfulnessRow, "cells": CellRow, "agreement": AgreementRow}
        if table not in row_types:
            raise ValueError(f"table={table!r}: a faithfulness result's tables are {', '.join(map(repr, row_types))}")
        return _frame(getattr(self, table), row_types[table], kind)

    def __repr__(self) -> str:
        return (f"FaithfulnessResult({len(self.predictions.triples)} predictions, {self.settings.variant}, "
                f"{len(self.table)} table rows, {len(self.cells)} cells; .to_df() for the table)")


# ----------------------------------------------------------------------------- lds.json


@dataclass(frozen=True)
class LdsRow:
    """One method's linear datamodeling score on one output, over the predictions (lds.json "rows")."""

    method: str  # attribution method
    output: str  # "score" (the prediction's score) | "log_prob" (its log-probability among all tails)
    lds: float  # mean Spearman correlation over the predictions, in [-1, 1]; NaN when none is defined
    low: float  # bootstrap interval of the mean (2.5 and 97.5 percentiles); NaN as lds
    high: float
    n: int  # predictions with a defined LDS
    seconds: float  # computing the method's attributions

    def to_dict(self) -> dict[str, Any]:
        """The row's fields; NaN stays NaN (lds.json writes it as null, `LdsResult.to_dict`)."""
        return _plain(self)

    @classmethod
    def from_dict(cls, data: dict) -> LdsRow:
        """The row of a dict; a null lds, low or high is NaN."""
        values = _fields_of(cls, data)
        return cls(**{**values, **{key: float("nan") for key in ("lds", "low", "high") if values[key] is None}})


LdsTable = Literal["rows", "per_prediction"]


@dataclass(frozen=True, eq=False)
class LdsResult:
    """What an LDS check measured: lds.json; ``rows`` is the table, ``errors`` the methods that refused, with why."""

    run: str  # the run's folder, absolute
    subsets: int  # M, random training subsets, one model trained on each
    fraction: float  # of the training triples in each subset
    seed: int  # of the subsets, the sample and the random methods
    predictions: tuple[Labels, ...]  # (head, relation, tail) labels of the N predictions
    rows: tuple[LdsRow, ...]  # per method, its "score" then its "log_prob" row
    per_prediction: dict[str, dict[str, tuple[float | None, ...]]]  # method -> output -> [N] LDS (None: undefined)
    errors: dict[str, str]  # method -> why it was not scored
    training_seconds: float  # mean seconds of one subset training
    train_size: int  # training triples of the run (the subsets' masks are [subsets, train_size])
    prediction_ids: tuple[tuple[int, int, int], ...]  # (head, relation, tail) ids of the predictions
    outputs: dict[str, np.ndarray]  # output name -> [subsets, N] float64: each subset model's output per prediction

    def best(self, output: str = "score") -> LdsRow:
        """The row with the highest mean LDS on ``output``."""
        return max((r for r in self.rows if r.output == output), key=lambda r: r.lds)

    __eq__, __hash__ = _same_json, _json_hash  # equal when they write the same JSON

    def to_dict(self) -> dict[str, Any]:
        """lds.json's content, keys in its order (an undefined LDS or interval: None)."""
        return {"run": self.run, "subsets": self.subsets, "fraction": self.fraction, "seed": self.seed,
                "predictions": [list(t) for t in self.predictions], "rows": [_nan_as_none(row.to_dict()) for row in self.rows],
                "per_prediction": {method: {output: list(values) for output, values in by_output.items()}
                                   for method, by_output in self.per_prediction.items()},
                "errors": dict(self.errors), "training_seconds": self.training_seconds, "train_size": self.train_size,
                "prediction_ids": [list(t) for t in self.prediction_ids],
                "outputs": {name: values.tolist() for name, values in self.outputs.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> LdsResult:
        """The result of lds.json's content (KeyError on a missing key; errors and training_seconds may be absent)."""
        return cls(data["run"], data["subsets"], data["fraction"], data["seed"],
                   tuple(tuple(t) for t in data["predictions"]), tuple(LdsRow.from_dict(r) for r in data["rows"]),
                   {method: {output: tuple(values) for output, values in by_output.items()}
                    for method, by_output in data["per_prediction"].items()},
                   dict(data.get("errors", {})), data.get("training_seconds", 0.0), data["train_size"],
                   tuple(tuple(t) for t in data["prediction_ids"]),
                   {name: np.asarray(values, dtype=np.float64) for name, values in data["outputs"].items()})

    @classmethod
    def read(cls, path: str | Path) -> LdsResult:
        """An lds.json written by ``kgtrace faithfulness --lds``."""
        return cls.from_dict(_read_json(path))

    def to_df(self, kind: FrameKind = "polars", table: LdsTable = "rows") -> Any:
        """A table as a frame: "rows" (lds.tsv: one row per method and output; NaN where undefined) or
        "per_prediction" (lds-predictions.tsv: method, output, prediction, head, relation, tail, lds; null where
        undefined); kind "polars" or "pandas"."""
        if table == "rows":
            return _frame(self.rows, LdsRow, kind)
        if table != "per_prediction":
            raise ValueError(f"table={table!r}: an LDS result's tables are 'rows' and 'per_prediction'")
        return as_frame(pl.DataFrame(self._prediction_rows(), schema=_PER_PREDICTION), kind)

    def _prediction_rows(self) -> list[dict[str, Any]]:
        return [{"method": method, "output": output, "prediction": i, "head": t[0], "relation": t[1], "tail": t[2],
                 "lds": value}
                for method, by_output in self.per_prediction.items() for output, values in by_output.items()
                for i, (t, value) in enumerate(zip(self.predictions, values))]

    def __repr__(self) -> str:
        return (f"LdsResult({len(self.predictions)} predictions, {self.subsets} subsets of {self.fraction:g}, "
                f"{len(self.rows)} rows, {len(self.errors)} errors; .to_df() for the table)")


_PER_PREDICTION = {"method": pl.String, "output": pl.String, "prediction": pl.Int64, "head": pl.String,
                   "relation": pl.String, "tail": pl.String, "lds": pl.Float64}
