"""Results as data frames for a notebook (as PyKEEN's ``metric_results.to_df()``): polars, or pandas without pyarrow."""

import pytest

import kgtrace
from kgtrace.core.errors import KgtraceError
from kgtrace.display.frames import as_frame


@pytest.fixture(scope="module")
def run(tiny_conve):
    return kgtrace.load_run(tiny_conve)


def test_metrics_to_df_has_a_row_per_side_ties_and_metric(run):
    metrics = kgtrace.evaluate(run.model, run.dataset.test[:20], known=run.dataset.all_triples())
    frame = metrics.to_df()
    document = metrics.to_dict()
    assert frame.columns == ["side", "ties", "metric", "value"]
    assert frame.height == 3 * 3 * len(document["both"]["realistic"])  # head, tail, both x three tie policies
    for side, ties, metric, value in frame.iter_rows():
        assert document[side][ties][metric] == value
    assert "realistic MRR" in repr(metrics) and "to_df" in repr(metrics) and len(repr(metrics)) < 300
    pandas = pytest.importorskip("pandas")
    table = metrics.to_df("pandas")
    assert isinstance(table, pandas.DataFrame) and table.values.tolist() == [list(r) for r in frame.iter_rows()]


def test_predictions_and_scores_to_df(run, tmp_path):
    ds = run.dataset
    found = kgtrace.predict(run, head=ds.entity_label(0), relation=ds.relation_label(0), top_n=4)
    assert found.to_df() is found.table
    pytest.importorskip("pandas")
    table = found.to_df("pandas")
    assert list(table.columns) == found.table.columns and table["label"].tolist() == found.table["label"].to_list()
    triples = tmp_path / "t.tsv"
    triples.write_text(f"{ds.entity_label(0)}\t{ds.relation_label(0)}\t{ds.entity_label(1)}\n")
    scored = kgtrace.score_triples(run, triples)
    assert scored.to_df("pandas")["score"].tolist() == scored.table["score"].to_list()
    with pytest.raises(KgtraceError, match="'polars' or 'pandas'"):
        as_frame(found.table, "excel")


def test_train_returns_its_losses_and_validations(tmp_path):
    config = kgtrace.TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 8}, epochs=3,
                                 eval_every=2, threads=1, device="cpu")
    result = kgtrace.train(config, tmp_path / "run", progress=False, log=lambda *_: None)
    frame = result.to_df()
    assert frame["epoch"].to_list() == [1, 2, 3] and frame["valid_mrr"].null_count() == 1  # validated at 2 and 3
    assert all(loss > 0 for loss in result.losses) and len(result.losses) == 3
    assert result.best_valid_mrr == pytest.approx(max(m for m in result.valid_mrrs if m is not None))
    resumed = kgtrace.resume(tmp_path / "run", progress=False, log=lambda *_: None, epochs=5)
    assert resumed.to_df()["epoch"].to_list() == [4, 5] and len(resumed.losses) == 2
