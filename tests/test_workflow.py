"""The Snakemake workflow (an optional extra) and kgtrace summarize, the command its summary rule calls."""

import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import polars as pl
import pytest
import yaml

from kgtrace.cli import main

SNAKEFILE = Path(__file__).resolve().parents[1] / "workflow" / "Snakefile"
BIN = Path(sys.executable).parent


def snakemake(tmp_path, *args):
    """Run snakemake with this interpreter's kgtrace first on PATH; returns the finished process."""
    if shutil.which("snakemake", path=str(BIN)) is None:
        pytest.skip("Snakemake is not installed: pip install -e '.[workflow]'")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(BIN / "snakemake"), "-s", str(SNAKEFILE), "--directory", str(tmp_path), *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_dry_run_of_the_default_config(tmp_path):
    done = snakemake(tmp_path, "-n", "--cores", "2")
    assert done.returncode == 0, done.stderr + done.stdout
    jobs = {line.split()[0]: int(line.split()[1]) for line in done.stdout.splitlines()
            if line.split()[:1] and line.split()[0] in ("train", "evaluate", "explain", "summary", "total")}
    assert jobs == {"train": 8, "evaluate": 8, "explain": 8, "summary": 1, "total": 26}  # 2 datasets x 2 models x 2 seeds


def test_tiny_run_with_a_prepared_source_gives_the_summary(tmp_path):
    with resources.as_file(resources.files("kgtrace.data.bundled") / "nations" / "train.txt") as p:
        shutil.copy(p, tmp_path / "triples.tsv")
    config = {"datasets": ["nations", "mine"], "models": ["distmult"], "seeds": [0, 1], "epochs": 2,
              "checkpoint_every": 1, "explain_test": 2, "top_k": 3,
              "sources": {"mine": {"triples": str(tmp_path / "triples.tsv"), "prepare_args": "--seed 1"}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = snakemake(tmp_path, "--cores", "2", "--configfile", str(tmp_path / "config.yaml"))
    assert done.returncode == 0, done.stderr[-3000:]
    table = pl.read_csv(tmp_path / "results" / "summary.tsv", separator="\t")
    assert table["run"].to_list() == ["mine-distmult-s0", "mine-distmult-s1", "nations-distmult-s0", "nations-distmult-s1"]
    assert table["mrr"].is_between(0, 1).all() and table["epochs"].to_list() == [2] * 4
    assert (tmp_path / "results" / "summary.png").stat().st_size > 5000
    assert (tmp_path / "results" / "data" / "mine" / "train.txt").is_file()
    assert (tmp_path / "results" / "runs" / "nations-distmult-s1" / "explain" / "test.json").is_file()


def test_summarize_reports_every_missing_run(tmp_path, capsys):
    assert main(["summarize", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "s.tsv")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'a'}: no config.yaml" in err and f"{tmp_path / 'b'}: no config.yaml" in err
    assert "Fix: run kgtrace evaluate" in err and not (tmp_path / "s.tsv").exists()
