"""The documentation site builds, and its API reference renders every docstring: no raw reStructuredText role
or field left as text, parameters as tables, dataclass fields listed."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAW = re.compile(r":(class|func|meth|mod|data|attr|exc|obj|param|returns?|raises?|type|rtype):")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)], cwd=ROOT,
                           capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert built.returncode == 0, built.stderr
    return out


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_no_raw_role_is_left_in_the_api_pages(site):
    pages = sorted((site / "api").rglob("*.html"))
    assert len(pages) >= 8
    left = {str(p.relative_to(site)): sorted(set(RAW.findall(text_of(p.read_text())))) for p in pages}
    assert {page: roles for page, roles in left.items() if roles} == {}


def test_parameters_are_tables_and_dataclass_fields_are_listed(site):
    page = (site / "api" / "kgtrace" / "index.html").read_text()
    pipeline = text_of(page[page.index('id="kgtrace.pipeline"'):page.index('id="kgtrace.PipelineResult"')])
    assert "Parameters: Name Type Description Default" in pipeline and "dataset str a registered dataset" in pipeline
    config = text_of(page[page.index('id="kgtrace.TrainConfig"'):page.index('id="kgtrace.train"')])
    assert all(f" {field} = " in config for field in ("dataset", "model", "epochs", "batch_size", "lr"))
    explain = text_of(page[page.index('id="kgtrace.explain"'):page.index('id="kgtrace.Explanations"')])
    assert "Parameters: Name Type Description Default" in explain and "Returns:" in explain
    assert "triples Tensor | Named | Sequence [ Named ] ids [n, 3]" in explain
    # Every function of the front page, and TracIn's constructor: a parameter table and what it returns.
    functions = ["kgtrace.pipeline", "kgtrace.load_run", "kgtrace.train", "kgtrace.resume", "kgtrace.evaluate",
                 "kgtrace.predict", "kgtrace.score_triples", "kgtrace.explain", "kgtrace.load_dataset",
                 "kgtrace.prepare", "kgtrace.build_model"]
    starts = sorted((page.index(f'id="{name}"'), name) for name in [*functions, "kgtrace.TracIn"])
    ends = dict(zip([name for _, name in starts], [start for start, _ in starts[1:]] + [len(page)], strict=True))
    for start, name in starts:
        section = text_of(page[start:ends[name]])
        assert "Parameters: Name Type Description Default" in section, name
        assert name == "kgtrace.TracIn" or "Returns:" in section, name
