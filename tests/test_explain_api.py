"""kgtrace.explain from Python: the same explanations as the CLI, typed, named, and as data frames."""

import dataclasses
import json

import polars as pl
import pytest

import kgtrace
from kgtrace.attribution.results import EXPLAIN_COLUMNS, SELF_COLUMNS, Explanations
from kgtrace.cli import main
from kgtrace.core.errors import ConfigError
from kgtrace.runs.embedding import load_run


@pytest.fixture(scope="module")
def run(tiny_conve):
    return load_run(tiny_conve)


def labels(run, triple):
    ds = run.dataset
    return ds.entity_label(triple[0]), ds.relation_label(triple[1]), ds.entity_label(triple[2])


def test_python_answer_equals_the_cli_file(tiny_conve, run, tmp_path):
    """The JSON kgtrace explain writes is the typed answer's to_dict(), and reads back into an equal answer."""
    triple = labels(run, run.dataset.test[0].tolist())
    out = tmp_path / "e.json"
    assert main(["explain", str(tiny_conve), "--triple", *triple, "--method", "tracin", "--top-k", "3",
                 "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    answer = kgtrace.explain(tiny_conve, triple, method="tracin", top_k=3, device="cpu")
    (item,) = answer
    assert item.method == "tracin" and item.method_reason == "method 'tracin' asked"
    written = Explanations.read(out)  # the CLI's reason names its option
    assert written[0].method_reason == "--method tracin"
    assert written == Explanations((dataclasses.replace(item, method_reason="--method tracin"),))
    assert Explanations.from_dict(json.loads(json.dumps(answer.to_dict()))) == answer
    assert len(item.proponents) == len(item.opponents) == 3
    assert item.proponents[0].influence >= item.proponents[-1].influence
    assert item.opponents[0].influence <= item.opponents[-1].influence
    assert "--" in item.triple.text() and item.triple.head == triple[0]


def test_triples_by_ids_labels_or_names_in_any_case(run):
    """One triple, a list of them, or ids: the same explanations; labels in another case name the same entity."""
    first, second = (labels(run, t) for t in run.dataset.test[:2].tolist())
    shouted = (first[0].upper(), first[1], first[2].upper())
    many = kgtrace.explain(run, [shouted, second], method="grad-dot", top_k=2)
    by_ids = kgtrace.explain(run, run.dataset.test[:2], method="grad-dot", top_k=2)
    assert many == by_ids and len(many) == 2 and many[0].triple.head == first[0]
    assert many[1:].items == (many[1],)


def test_unknown_names_are_refused_together_with_close_matches(run):
    head, relation, tail = labels(run, run.dataset.test[0].tolist())
    with pytest.raises(ConfigError) as caught:
        kgtrace.explain(run, [(head[:-1] + "x", relation, tail), (head, "no_such_relation", tail + "zz")])
    assert len(caught.value.problems) == 3 and "did you mean" in str(caught.value)
    with pytest.raises(ConfigError, match="top_k=0: must be at least 1"):
        kgtrace.explain(run, (head, relation, tail), top_k=0)
    with pytest.raises(ConfigError, match="method='nope': unknown"):
        kgtrace.explain(run, (head, relation, tail), method="nope")


def test_to_df_lists_every_influencer(run):
    answer = kgtrace.explain(run, run.dataset.test[:2], method="grad-dot", top_k=3)
    frame = answer.to_df()
    assert isinstance(frame, pl.DataFrame) and tuple(frame.columns) == EXPLAIN_COLUMNS
    assert frame.height == 2 * (3 + 3)
    assert frame.filter(pl.col("kind") == "proponent")["influence"].to_list() == \
        [e.influence for item in answer for e in item.proponents]
    assert Explanations(()).to_df().height == 0
    pandas = pytest.importorskip("pandas")
    table = answer.to_df("pandas")
    assert isinstance(table, pandas.DataFrame) and list(table["train_index"]) == frame["train_index"].to_list()


def test_self_influence_ranks_every_training_triple(run):
    from kgtrace.attribution.explanations import self_influence_ranking

    ranking = self_influence_ranking(run, kgtrace.TracIn(run), top_k=3)
    frame = ranking.to_df()
    assert tuple(frame.columns) == SELF_COLUMNS and frame.height == len(run.dataset.train)
    assert frame["self_influence"].is_sorted(descending=True) and frame["rank"].to_list()[:2] == [1, 2]
    assert [e.train_index for e in ranking.top] == frame["train_index"].head(3).to_list()
    assert ranking.to_dict()["num_train"] == len(run.dataset.train)
