"""benchmarks/make_graph.py: a small ROBOKOP-shaped graph reads back through kgtrace's KGX reader and prepare.

(The Hetionet-shaped graph needs the real node file in ../shared, which no test reads; its format is tested
with tests/hetionet.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from benchmark_scripts import benchmark_script

from kgtrace.data.dataset import load_dataset
from kgtrace.data.kgx import read_kgx
from kgtrace.data.prepare import prepare


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    out = tmp_path_factory.mktemp("robokop")
    with benchmark_script("make_graph") as module:
        summary = module.robokop(out, seed=0, exponent=0.9, num_nodes=3000, num_edges=20_000, tsv=True)
    return out, summary


def test_jsonl_and_tsv_hold_the_same_graph(graph):
    out, summary = graph
    jsonl = read_kgx(out / "nodes.jsonl", out / "edges.jsonl")
    tsv = read_kgx(out / "nodes.tsv", out / "edges.tsv")
    # An edge type whose touched nodes hold fewer distinct pairs than its share gets all of them.
    assert 19_000 < summary["edges"] <= 20_000 and jsonl.report["edges_read"] == summary["edges"]
    assert jsonl.report["duplicates"] == 0 and jsonl.report["dropped_unknown_node"] == 0  # distinct, known nodes
    assert np.array_equal(jsonl.triples, tsv.triples) and jsonl.edge_map == tsv.edge_map
    affects = [key for key in jsonl.edge_map if '"biolink:affects"' in key]
    assert len(affects) == 8  # 4 aspects x 2 directions, one qualified predicate
    some_disease = next(node for node, cats in jsonl.categories.items() if "biolink:Disease" in cats)
    assert jsonl.categories[some_disease][0] == "biolink:NamedThing"  # the lineage, root first


def test_prepare_holds_out_treats(graph, tmp_path):
    out, _ = graph
    report = prepare(tmp_path / "ds", nodes=str(out / "edges.jsonl").replace("edges", "nodes"),
                     edges=str(out / "edges.jsonl"), split="predicate", holdout_predicate="biolink:treats",
                     holdout_fraction=0.5, category_pairs=[("biolink:ChemicalEntity", "biolink:Disease")])
    ds = load_dataset(tmp_path / "ds")
    assert report.test == len(ds.test) > 0
    assert {ds.relation_name(ds.relations.labels[r]) for r in ds.test[:, 1].tolist()} == {"biolink:treats"}
