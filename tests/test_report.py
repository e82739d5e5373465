"""kgtrace report: one self-contained HTML page of a run folder, built from the files other commands write."""

import json
import re
import shutil

import pytest

from kgtrace.cli import main
from kgtrace.errors import KgtraceError
from kgtrace.report import build_html, write_report
from kgtrace.report.drawing import layout, subgraph_png
from kgtrace.report.sections import breakable

SECTIONS = ("Configuration", "Training", "Test metrics", "Rank histogram", "Test triples")


@pytest.fixture(scope="module")
def page(full_run):
    return write_report(full_run).read_text(encoding="utf-8")


def test_every_section_is_present(page, full_run):
    for title in SECTIONS:
        assert f"<h2>{title}</h2>" in page
    assert "class=\"missing\"" not in page
    assert "<code>model_args.embedding_dim</code></td><td><b>16</b>" in page  # nested settings, dotted
    items = json.loads((full_run / "explain" / "test.json").read_text())["explanations"]
    for item in items:  # each explained triple's readable names and its influencers
        assert breakable(item["test"]["head_name"]) in page
        for entry in item["proponents"] + item["opponents"]:
            assert f"{entry['influence']:.5f}" in page
    assert page.count('class="bar pro"') == sum(len(i["proponents"]) for i in items)
    assert page.count('class="bar opp"') == sum(len(i["opponents"]) for i in items)
    metrics = json.loads((full_run / "test_metrics.json").read_text())
    assert f"{metrics['both']['realistic']['mrr']:.4f}" in page
    assert page.count("<tr") >= 1 + 9  # metrics: header + 3 sides x 3 tie policies


def test_images_are_embedded_and_nothing_is_fetched(page):
    # training curve, rank histogram, one drawing per explained triple (two)
    assert page.count('src="data:image/png;base64,') == 4
    assert re.findall(r'src="(?!data:image/png;base64,)', page) == []
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    assert "<link" not in page and "@import" not in page and "url(" not in page


def test_user_labels_are_escaped(tmp_path, full_run):
    run = tmp_path / "evil"
    shutil.copytree(full_run, run)
    evil = "<script>alert(1)</script>"
    data = json.loads((run / "explain" / "test.json").read_text())
    item = data["explanations"][0]
    item["test"]["head_name"] = evil
    item["proponents"][0]["relation_name"] = evil + "&"
    item["proponents"][0]["tail_name"] = '"><img src=x onerror=alert(2)>'
    (run / "explain" / "test.json").write_text(json.dumps(data))
    (run / "explain" / "evil_<b>.json").write_text(json.dumps(data))
    page = build_html(run)
    assert evil not in page and "evil_<b>" not in page and "Evil <B>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;/script&gt;&amp;" in page
    assert page.count("<script>") == 1  # the page's own image check only
    assert "<h2>Evil &lt;B&gt;</h2>" in page
    (run / "explain" / "predicted.json").write_text(json.dumps(data))
    titles = re.findall(r"<h2>([^<]*)</h2>", build_html(run))
    assert titles[-3:] == ["Test triples", "Best new predictions", "Evil &lt;B&gt;"]


def test_missing_inputs_say_which_command_makes_them(tmp_path, full_run):
    run = tmp_path / "bare"
    run.mkdir()
    (run / "config.yaml").write_text((full_run / "config.yaml").read_text())
    (run / "metrics.jsonl").write_text("{not json\n")
    page = build_html(run)
    for title in ("Configuration", "Training", "Test metrics", "Rank histogram", "Explanations"):
        assert f"<h2>{title}</h2>" in page
    assert "metrics.jsonl could not be read (JSONDecodeError" in page
    assert f"test_metrics.json is missing. Make it with <code>kgtrace evaluate {run} --out {run / 'test_metrics.json'}" in page
    assert f"test_ranks.tsv is missing. Make it with <code>kgtrace evaluate {run} --per-query" in page
    assert f"no triple was explained. Make it with <code>kgtrace explain {run}" in page
    assert page.count("data:image/png") == 0


def test_cli_writes_the_page_and_refuses_what_a_user_can_fix(tmp_path, full_run, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(full_run), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>") and str(out) in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "Fix:" in capsys.readouterr().err
    with pytest.raises(KgtraceError, match="Fix: name it .html"):
        write_report(full_run, tmp_path / "r.txt")


def test_drawing_is_deterministic_and_survives_odd_graphs():
    pos = layout("a", "b", ["c", "a", "d", "c"])
    assert pos["a"] == (-0.6, 0.0) and pos["b"] == (0.6, 0.0) and list(pos) == ["a", "b", "c", "d"]
    entry = {"relation": "r", "influence": 0.5}
    item = {"test": {"head": "a", "relation": "r", "tail": "a", "head_name": "$x$", "tail_name": "$x$"},
            "proponents": [{**entry, "head": "a", "tail": "a"}, {**entry, "head": "a", "tail": "b"},
                           {**entry, "head": "a", "tail": "b", "tail_name": "$\\frac{"}],
            "opponents": [{**entry, "head": "b", "tail": "a", "influence": 0.0}]}
    png = subgraph_png(item)
    assert png.startswith(b"\x89PNG") and png == subgraph_png(item)
