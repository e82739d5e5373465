"""kgtrace run: train -> evaluate -> explain -> report in one folder, finished steps reused."""

import json

import pytest

from kgtrace.cli import main
from kgtrace.core.errors import KgtraceError
from kgtrace.workflows.job import JobSettings, run_job

SETTINGS = JobSettings(dataset="nations", model="distmult", epochs=5, threads=1)
OUTPUTS = ("test_metrics.json", "test_ranks.tsv", "explain/test.json", "explain/predicted.json", "report.html")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("job") / "run"
    lines = []
    report = run_job(SETTINGS, out, progress=False, log=lines.append)
    return out, report, lines


def test_every_step_writes_its_outputs(job):
    out, report, lines = job
    assert report == out / "report.html"
    for name in OUTPUTS:
        assert (out / name).is_file(), name
    assert len(list((out / "checkpoints").glob("epoch-*.pt"))) == 5  # a checkpoint every fifth of the epochs
    explained = json.loads((out / "explain/test.json").read_text())["explanations"]
    assert len(explained) == 3 and all(item["rank"]["tail"] <= 2 for item in explained)  # well-predicted ones
    predicted = json.loads((out / "explain/predicted.json").read_text())["explanations"]
    assert len(predicted) == 6  # 2 queries x 3 new tails
    assert any(line.startswith("evaluate: test MRR") for line in lines)


def test_a_rerun_reuses_every_step(job):
    out, _, _ = job
    before = {name: (out / name).stat().st_mtime_ns for name in OUTPUTS}
    lines = []
    run_job(SETTINGS, out, progress=False, log=lines.append)
    assert lines[0] == SETTINGS.plan(out) and lines[0].startswith("kgtrace run: train") and str(out) in lines[0]
    assert [line.split(":")[0] for line in lines[1:]] == ["train", "evaluate", "explain", "report"]
    assert all("reusing" in line for line in lines[1:])
    assert {name: (out / name).stat().st_mtime_ns for name in OUTPUTS} == before


def test_more_epochs_resume_and_redo_later_steps(tmp_path):
    out = tmp_path / "run"
    run_job(JobSettings(dataset="nations", model="distmult", epochs=2, threads=1), out, progress=False,
            log=lambda _: None)
    metrics = (out / "test_metrics.json").read_text()
    lines = []
    run_job(JobSettings(dataset="nations", model="distmult", epochs=3, threads=1), out, progress=False,
            log=lines.append)
    assert lines[1].startswith("train: resuming") and not any("reusing" in line for line in lines)
    assert (out / "checkpoints/epoch-0003.pt").is_file() and (out / "test_metrics.json").read_text() != metrics


def test_another_run_in_the_folder_is_refused(job):
    out, _, _ = job
    with pytest.raises(KgtraceError, match="holds another run.*dataset"):
        run_job(JobSettings(dataset="umls", model="distmult", epochs=5), out, progress=False, log=lambda _: None)


def test_capped_epochs_are_another_run(job):
    """A run trained with whole epochs is not reused for --steps-per-epoch (nor the other way round)."""
    out, _, _ = job
    capped = JobSettings(dataset="nations", model="distmult", epochs=5, threads=1, steps_per_epoch=3)
    assert capped.config().steps_per_epoch == 3
    with pytest.raises(KgtraceError, match="steps_per_epoch: 0 there, 3 asked"):
        run_job(capped, out, progress=False, log=lambda _: None)


def test_cli_run(tmp_path, capsys):
    out = tmp_path / "cli-run"
    assert main(["run", "--dataset", "nations", "--model", "distmult", "--epochs", "2", "--threads", "1",
                 "--out", str(out), "--no-progress"]) == 0
    assert f"open {out / 'report.html'}" in capsys.readouterr().out
    assert main(["run", "--dataset", "nations", "--epochs", "0", "--out", str(tmp_path / "x")]) == 2
    assert "epochs" in capsys.readouterr().err
