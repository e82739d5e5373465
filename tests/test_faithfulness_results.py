"""The typed results of kgtrace faithfulness (faithfulness.json) and --lds (lds.json): written, read back, as frames.

The checks run on test_faithfulness's toy run (DistMult on eight triples, three epochs), one prediction, one
removal method: a few trainings of a fraction of a second each.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_faithfulness import ids, quiet, small, toy_run  # noqa: F401 (toy_run: the fixture)

from kgtrace.faithfulness import (
    AgreementRow,
    CellRow,
    ExplainedPredictions,
    FaithfulnessResult,
    FaithfulnessRow,
    LdsResult,
    LdsRow,
    LdsSettings,
    RemovalSettings,
    check_faithfulness,
    check_lds,
)
from kgtrace.faithfulness.lds import write_lds
from kgtrace.runs.embedding import load_run

TABLES = {"table": FaithfulnessRow, "cells": CellRow, "agreement": AgreementRow}


@pytest.fixture(scope="module")
def removal_check(toy_run, tmp_path_factory):  # noqa: F811
    """Retraining, then fine-tuning, into one folder: its faithfulness.json has every table, agreement included."""
    out = tmp_path_factory.mktemp("removal") / "check"
    prediction = ids(load_run(toy_run), ("a", "r", "c"))
    check_faithfulness(toy_run, out, small(methods=("random",), ks=(1,)), triples=prediction, progress=False, log=quiet)
    result = check_faithfulness(toy_run, out, small(methods=("random",), ks=(1,), mode="finetune"), triples=prediction,
                                progress=False, log=quiet)
    return result, out


@pytest.fixture(scope="module")
def lds_check(toy_run, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("lds") / "check"
    triples = ids(load_run(toy_run), ("a", "r", "c"), ("b", "s", "d"))
    result = check_lds(toy_run, out, LdsSettings(subsets=3, methods=("grad-dot", "random"), bootstrap=20),
                       triples=triples, progress=False, log=quiet)
    return result, out


def hand_made_removals() -> FaithfulnessResult:
    """A result with every undefined value the file can hold: a NaN TC and Pearson, a None TC and control change."""
    nan = float("nan")
    row = FaithfulnessRow("retrain", "random", 2, 1.5, 2, 0, 0.5, nan, 0.25, 0.01, 1.5, 0.5, 0.4, 0.1, 0.0, 0.0, 0.3)
    cell = CellRow("retrain", 0, "a", "r", "c", "random", 2, (3, 17), -0.5, -0.75, 0.2, 0.1, 2.0, 3.5, True, None)
    agree = AgreementRow("finetune-from-0001", "all", 0, 1, 1.0, nan, nan, 0.1, nan, 0.01)
    return FaithfulnessResult("/runs/toy", "epoch-0003.pt", 3,
                              RemovalSettings((1, 2), ("random",), "finetune", "finetune-from-0001", 0, None, None),
                              ExplainedPredictions("the triples of the caller", (("a", "r", "c"),)),
                              {"retrain": None, "finetune-from-0001": 0.0}, (row,), (agree,), (cell,))


def hand_made_lds() -> LdsResult:
    """A result with a method whose LDS is undefined everywhere (NaN rows, None per prediction) and a refusal."""
    nan = float("nan")
    rows = (LdsRow("random", "score", nan, nan, nan, 0, 0.5), LdsRow("random", "log_prob", 0.25, -0.5, 1.0, 1, 0.5))
    return LdsResult("/runs/toy", 3, 0.5, 0, (("a", "r", "c"),), rows,
                     {"random": {"score": (None,), "log_prob": (0.25,)}}, {"trak": "too large"}, 0.125, 8,
                     ((0, 0, 2),), {"score": np.array([[1.0], [2.0], [3.0]]), "log_prob": np.log([[0.5], [0.25], [1.0]])})


# ----------------------------------------------------------------------------- faithfulness.json


def test_faithfulness_result_round_trips_and_is_what_the_writer_wrote(removal_check):
    result, out = removal_check
    written = (out / "faithfulness.json").read_text(encoding="utf-8")
    assert FaithfulnessResult.from_dict(result.to_dict()) == result
    assert json.dumps(result.to_dict(), indent=1) + "\n" == written
    assert FaithfulnessResult.read(out / "faithfulness.json") == result
    assert result.settings.variant == "finetune-from-0001" and result.agreement and result.cells
    assert all(isinstance(cell.removed, tuple) and len(cell.removed) == cell.k for cell in result.cells)


def test_undefined_values_survive_the_file():
    result = hand_made_removals()
    text = json.dumps(result.to_dict(), indent=1)
    back = FaithfulnessResult.from_dict(json.loads(text))
    assert back == result and json.dumps(back.to_dict(), indent=1) == text
    assert math.isnan(back.table[0].tc) and back.cells[0].tc is None and back.cells[0].removed == (3, 17)
    assert back.to_dict()["cells"][0]["removed"] == "3 17"
    assert back.control_max_abs_score_change == {"retrain": None, "finetune-from-0001": 0.0}


@pytest.mark.parametrize("table", TABLES)
def test_faithfulness_frames_have_a_row_per_row_and_the_file_columns(removal_check, table):
    result, out = removal_check
    rows = getattr(result, table)
    frame = result.to_df(table=table)
    assert frame.columns == list(rows[0].to_dict()) and len(frame) == len(rows)
    assert json.dumps(frame.to_dicts()) == json.dumps([row.to_dict() for row in rows])  # NaN equals NaN
    tsv = {"table": "faithfulness.tsv", "cells": "cells.tsv", "agreement": "agreement.tsv"}[table]
    assert (out / tsv).read_text().splitlines()[0].split("\t") == frame.columns
    assert len((out / tsv).read_text().splitlines()) == len(rows) + 1


def test_faithfulness_frame_of_an_empty_table_keeps_its_columns():
    result = hand_made_removals()
    empty = FaithfulnessResult.from_dict({**result.to_dict(), "agreement": []})
    assert empty.to_df(table="agreement").columns == list(result.agreement[0].to_dict())
    assert len(empty.to_df(table="agreement")) == 0
    with pytest.raises(ValueError, match="'table', 'cells', 'agreement'"):
        result.to_df(table="rows")


def test_faithfulness_pandas_frame(removal_check):
    pandas = pytest.importorskip("pandas")
    result, _ = removal_check
    frame = result.to_df("pandas", table="cells")
    assert isinstance(frame, pandas.DataFrame) and list(frame.columns) == list(result.cells[0].to_dict())
    assert len(frame) == len(result.cells)


def test_malformed_faithfulness_files_are_refused(tmp_path):
    data = hand_made_removals().to_dict()
    del data["table"][0]["pd"]
    with pytest.raises(KeyError, match="pd"):
        FaithfulnessResult.from_dict(data)
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="not a JSON object"):
        FaithfulnessResult.read(tmp_path / "list.json")


# ----------------------------------------------------------------------------- lds.json


def test_lds_result_round_trips_and_is_what_the_writer_wrote(lds_check):
    result, out = lds_check
    written = (out / "lds.json").read_text(encoding="utf-8")
    assert LdsResult.from_dict(result.to_dict()) == result
    assert json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n" == written
    back = LdsResult.read(out / "lds.json")
    assert back == result and back.outputs["score"].shape == (3, 2) and back.train_size == 8
    assert back.best("score") == result.best("score")


def test_lds_undefined_values_are_null_in_the_file_and_nan_when_read(tmp_path):
    result = hand_made_lds()
    write_lds(tmp_path, result)
    written = (tmp_path / "lds.json").read_text(encoding="utf-8")
    assert json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n" == written
    assert json.loads(written)["rows"][0]["lds"] is None
    back = LdsResult.read(tmp_path / "lds.json")
    assert back == result and math.isnan(back.rows[0].lds) and back.errors == {"trak": "too large"}
    assert (tmp_path / "lds.tsv").read_text().splitlines()[1].startswith("random\tscore\tNaN")


def test_lds_file_without_errors_or_training_seconds_is_read():
    data = hand_made_lds().to_dict()
    del data["errors"], data["training_seconds"]
    back = LdsResult.from_dict(data)
    assert back.errors == {} and back.training_seconds == 0.0


def test_lds_frames(lds_check):
    result, out = lds_check
    frame = result.to_df()
    assert frame.columns == ["method", "output", "lds", "low", "high", "n", "seconds"] and len(frame) == len(result.rows)
    assert frame.write_csv(separator="\t", quote_style="never") == (out / "lds.tsv").read_text()
    per = result.to_df(table="per_prediction")
    assert per.columns == ["method", "output", "prediction", "head", "relation", "tail", "lds"]
    assert len(per) == len(result.rows) * len(result.predictions)  # a row per (method, output, prediction)
    assert per.write_csv(separator="\t", quote_style="never") == (out / "lds-predictions.tsv").read_text()
    with pytest.raises(ValueError, match="'rows' and 'per_prediction'"):
        result.to_df(table="cells")


def test_lds_pandas_frame(lds_check):
    pandas = pytest.importorskip("pandas")
    result, _ = lds_check
    frame = result.to_df("pandas")
    assert isinstance(frame, pandas.DataFrame) and len(frame) == len(result.rows)
    assert frame["method"].tolist() == [r.method for r in result.rows]
