"""kgtrace report: one self-contained HTML page of a run folder, built from the files other commands write."""

import json
import re
import shutil

import numpy as np
import pytest

from kgtrace.attribution.results import Explanation
from kgtrace.cli import main
from kgtrace.core.errors import KgtraceError
from kgtrace.report import build_html, write_report
from kgtrace.report.drawing import UNIT, layout, subgraph_svg
from kgtrace.report.sections import label

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
        assert label(item["test"]["head_name"]) in page
        for entry in item["proponents"] + item["opponents"]:
            assert f"{entry['influence']:.5f}" in page
    assert page.count('class="bar pro"') == sum(len(i["proponents"]) for i in items)
    assert page.count('class="bar opp"') == sum(len(i["opponents"]) for i in items)
    metrics = json.loads((full_run / "test_metrics.json").read_text())
    assert f"{metrics['both']['realistic']['mrr']:.4f}" in page
    assert page.count("<tr") >= 1 + 3  # metrics: header + a row per side at least (three when the ties differ)
    for item in items:  # the self-explaining parts: probability, where the triple is, what influence means
        assert f"probability <b>{item['probability']:.3f}</b>" in page
        assert "a test triple (never trained on)" in page and "TracIn influence of a training triple" in page
    assert "That is why validation MRR sits below the test MRR" in page
    # How good the model is: each metric defined, and the model against a random ranking of the same candidates.
    assert "<dt>MRR</dt><dd>mean reciprocal rank" in page and "<dt>Hits@k</dt>" in page
    both = metrics["both"]["realistic"]
    chance = (both["mrr"] - both["adjusted_mrr"]) / (1 - both["adjusted_mrr"])
    assert f"against <b>{chance:.4f}</b> for a random ranking of the same candidates" in page
    assert 0 < chance < 1 and f"adjusted MRR <b>{both['adjusted_mrr']:.4f}</b>" in page
    # The settings come last, folded away.
    assert re.findall(r"<h2>([^<]*)</h2>", page)[-1] == "Configuration" and "<details><summary>the " in page


def test_tie_policies_show_one_row_per_side_when_they_agree(tmp_path, full_run):
    run = tmp_path / "ties"
    shutil.copytree(full_run, run)
    metrics = json.loads((run / "test_metrics.json").read_text())
    for side in ("head", "tail", "both"):
        for ties in ("optimistic", "pessimistic"):
            metrics[side][ties] = dict(metrics[side]["realistic"])
    metrics["tail"]["optimistic"]["mrr"] += 0.125  # a tie moved a tail rank
    (run / "test_metrics.json").write_text(json.dumps(metrics))
    page = build_html(run)
    body = page[page.index('<section id="metrics"'):page.index('<section id="ranks"')]
    rows = re.findall(r"<tr[^>]*><td>(\w+)</td><td>([\w ]+)</td>", body)
    assert rows == [("head", "all three agree"), ("tail", "realistic"), ("tail", "optimistic"),
                    ("tail", "pessimistic"), ("both", "all three agree")]


def test_ranks_print_as_integers_when_whole(tmp_path, full_run):
    run = tmp_path / "ranks"
    shutil.copytree(full_run, run)
    data = json.loads((run / "explain" / "test.json").read_text())
    data["explanations"][0]["rank"] = {"tail": 1068390.0, "head": 3.5}
    (run / "explain" / "test.json").write_text(json.dumps(data))
    page = build_html(run)
    assert "tail <b>1,068,390</b>, head <b>3.5</b>" in page and "1.06839e+06" not in page


def test_images_are_embedded_and_nothing_is_fetched(page):
    assert page.count('src="data:image/png;base64,') == 2  # training curve, rank histogram
    assert page.count('<svg class="subgraph"') == 2  # a drawing per explained triple, inline
    assert re.findall(r'src="(?!data:image/png;base64,)', page) == []
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    assert "<link" not in page and "@import" not in page and re.findall(r"url\((?!#)", page) == []  # url(#marker) only


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
    assert titles[-4:] == ["Test triples", "Best new predictions", "Evil &lt;B&gt;", "Configuration"]  # settings last


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
    assert page.count("data:image/png") == 0 and "<svg class" not in page


def test_cli_writes_the_page_and_refuses_what_a_user_can_fix(tmp_path, full_run, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(full_run), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>") and str(out) in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "Fix:" in capsys.readouterr().err
    with pytest.raises(KgtraceError, match="Fix: name it .html"):
        write_report(full_run, tmp_path / "r.txt")


def rects(svg, kind):
    """The boxes (x0, y0, x1, y1) of one kind of label in a drawing."""
    found = re.findall(rf'<g class="{kind}"><title>[^<]*</title><rect x="([-\d.]+)" y="([-\d.]+)" '
                       r'width="([\d.]+)" height="([\d.]+)"', svg)
    return [(float(x), float(y), float(x) + float(w), float(y) + float(h)) for x, y, w, h in found]


def overlapping(boxes):
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]]


def crowded_item(n=6):
    """An explanation whose influencers all touch the test triple's two entities, with long snake_case names."""
    entry = {"relation": "experimental_model_of_disease", "influence": 0.5}
    names = [f"entity_with_a_rather_long_name_{i}" for i in range(n)]
    return drawn({"test": {"head": "h", "relation": "location_of", "tail": "t", "head_name": "acquired_abnormality",
                     "tail_name": "experimental_model_of_disease"},
            "proponents": [{**entry, "head": "h", "tail": names[i], "influence": 1.0 / (i + 1)} for i in range(n)]
            + [{**entry, "head": "h", "tail": "t", "relation": "co-occurs_with"}],
            "opponents": [{**entry, "head": f"other_{name}", "tail": "t", "influence": -0.1 * (i + 1)}
                          for i, name in enumerate(names)]})


def drawn(record):
    """An explanation as a written file holds it; the drawing reads no score."""
    return Explanation.from_dict({"score": 0.0, **record})


def test_drawing_keeps_labels_apart_and_the_test_edge_readable():
    item = crowded_item()
    svg = subgraph_svg(item)
    assert svg == subgraph_svg(item)  # deterministic
    nodes, test_label = rects(svg, "node-label"), rects(svg, "test-label")
    assert len(nodes) == 2 + 5 + 6 and len(test_label) == 1  # the 6 strongest proponents: 5 reach a new entity
    assert overlapping(nodes + test_label + rects(svg, "edge-label")) == []
    assert ">location_of</text>" in svg  # the test edge's relation, whole
    assert "<title>acquired_abnormality (h)</title>" in svg  # full names on hover
    assert "<title>proponent: acquired_abnormality \u2014co-occurs_with\u2192 experimental_model_of_disease" in svg
    # Cut to its content: the box is as large as what it holds, no larger.
    width, height = (float(v) for v in re.search(r'width="([\d.]+)" height="([\d.]+)" viewBox', svg).groups())
    boxes = nodes + test_label
    assert width <= max(b[2] for b in boxes) - min(b[0] for b in boxes) + 2 * UNIT
    assert height <= max(b[3] for b in boxes) - min(b[1] for b in boxes) + 60
    pos = layout("h", "t", [("h", "x"), ("x", "t")])
    assert pos["h"] == (-UNIT, 0.0) and pos["t"] == (UNIT, 0.0) and set(pos) == {"h", "t", "x"}
    apart = layout("h", "t", [("x", "y"), ("p", "q")])  # edges touching neither entity stay beside the triple
    assert max(abs(x) + abs(y) for x, y in apart.values()) < 3 * UNIT


def test_drawing_survives_odd_graphs():
    entry = {"relation": "r", "influence": 0.5}
    item = drawn({"test": {"head": "a", "relation": "r", "tail": "a", "head_name": "$x$", "tail_name": "$x$"},
                  "proponents": [{**entry, "head": "a", "tail": "a"}, {**entry, "head": "a", "tail": "b"},
                                 {**entry, "head": "a", "tail": "b", "tail_name": "$\\frac{"}],
                  "opponents": [{**entry, "head": "b", "tail": "a", "influence": 0.0}]})
    svg = subgraph_svg(item)
    assert svg.startswith('<svg class="subgraph"') and svg == subgraph_svg(item)
    assert overlapping(rects(svg, "node-label") + rects(svg, "edge-label")) == []
    lonely = subgraph_svg(drawn({"test": {"head": "a", "relation": "r", "tail": "b"}, "proponents": [], "opponents": []}))
    assert len(rects(lonely, "node-label")) == 2 and len(rects(lonely, "test-label")) == 1


def crossings(svg):
    """Where an edge of a drawing passes through a node it does not join, or through a label other than its own:
    read from the drawn coordinates (each path's quadratic curve, sampled; the circles; the label boxes)."""
    import html as html_module

    paths = [(float(x0), float(y0), float(cx), float(cy), float(x1), float(y1), html_module.unescape(title))
             for x0, y0, cx, cy, x1, y1, title in re.findall(
                 r'<path d="M([-\d.]+),([-\d.]+) Q([-\d.]+),([-\d.]+) ([-\d.]+),([-\d.]+)"[^>]*><title>([^<]*)</title>',
                 svg)]
    nodes = [(float(x), float(y), float(r)) for x, y, r in re.findall(r'<circle cx="([-\d.]+)" cy="([-\d.]+)" '
                                                                       r'r="([\d.]+)"', svg)]
    labels = [(html_module.unescape(title), (float(x), float(y), float(x) + float(w), float(y) + float(h)))
              for title, x, y, w, h in re.findall(r'<g class="[a-z-]+"><title>([^<]*)</title><rect x="([-\d.]+)" '
                                                  r'y="([-\d.]+)" width="([\d.]+)" height="([\d.]+)"', svg)]
    found = []
    for x0, y0, cx, cy, x1, y1, title in paths:
        points = [((1 - s) ** 2 * x0 + 2 * (1 - s) * s * cx + s * s * x1, (1 - s) ** 2 * y0 + 2 * (1 - s) * s * cy
                   + s * s * y1) for s in np.linspace(0, 1, 200)]
        ends = {min(range(len(nodes)), key=lambda i: np.hypot(x - nodes[i][0], y - nodes[i][1])) for x, y in
                (points[0], points[-1])}
        found += [(title, "node", i) for i, (nx, ny, r) in enumerate(nodes) if i not in ends
                  and any(np.hypot(x - nx, y - ny) < r for x, y in points)]
        found += [(title, "label", own) for own, (bx0, by0, bx1, by1) in labels if own != title
                  and any(bx0 <= x <= bx1 and by0 <= y <= by1 for x, y in points)]
    return found


def test_no_edge_crosses_a_node_or_a_label_it_does_not_touch(page):
    drawings = [crowded_item(), crowded_item(3)]
    svgs = [subgraph_svg(item) for item in drawings] + re.findall(r'<svg class="subgraph".*?</svg>', page, re.S)
    assert len(svgs) == 4
    for svg in svgs:
        assert "<path" in svg and crossings(svg) == []
