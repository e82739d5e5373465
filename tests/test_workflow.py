"""The Snakemake workflow (an optional extra) and kgtrace summarize, the command its summary rule calls."""

import json
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

ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = ROOT / "workflow" / "Snakefile"
BIN = Path(sys.executable).parent
METRICS = ("mrr", "mr", "hits_at_1", "hits_at_3", "hits_at_10")


def snakemake(tmp_path, *args, config=None):
    """Run snakemake in tmp_path with this checkout's kgtrace on PATH; returns the finished process."""
    try:
        import snakemake as _  # noqa: F401
    except ImportError:
        pytest.skip("Snakemake is not installed (an optional extra): pip install -e '.[workflow]'")
    if shutil.which("kgtrace", path=str(BIN)) is None:
        pytest.skip(f"no kgtrace command beside {sys.executable}: pip install -e .")
    if config is not None:
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
        args = (*args, "--configfile", str(tmp_path / "config.yaml"))
    # The kgtrace entry point imports kgtrace; PYTHONPATH makes that this checkout's src.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": pythonpath}
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "--directory", str(tmp_path), *args],
                          capture_output=True, text=True, env=env, timeout=600)


def job_counts(stdout: str) -> dict[str, int]:
    """The dry run's job table: rule name -> count."""
    rules = ("prepare", "train", "evaluate", "explain", "summary", "total")
    return {line.split()[0]: int(line.split()[1]) for line in stdout.splitlines()
            if len(line.split()) == 2 and line.split()[0] in rules and line.split()[1].isdigit()}


def test_dry_run_of_the_default_config(tmp_path):
    done = snakemake(tmp_path, "-n", "--cores", "2")
    assert done.returncode == 0, done.stderr + done.stdout
    # 2 datasets x 2 models x 2 seeds; bundled datasets need no prepare job
    assert job_counts(done.stdout) == {"train": 8, "evaluate": 8, "explain": 8, "summary": 1, "total": 26}


def write_kgx_nations(folder: Path) -> tuple[Path, Path]:
    """Nations' training triples as a KGX export (TSV nodes and edges)."""
    with resources.as_file(resources.files("kgtrace.data.bundled") / "nations" / "train.txt") as p:
        triples = [line.split("\t") for line in p.read_text().splitlines() if line.strip()]
    entities = sorted({t[0] for t in triples} | {t[2] for t in triples})
    nodes, edges = folder / "nodes.tsv", folder / "edges.tsv"
    nodes.write_text("id\tcategory\tname\n" + "".join(f"NAT:{e}\tbiolink:Agent\t{e}\n" for e in entities))
    edges.write_text("subject\tpredicate\tobject\n" + "".join(f"NAT:{h}\tex:{r}\tNAT:{t}\n" for h, r, t in triples))
    return nodes, edges


def test_kgx_source_is_prepared_before_training(tmp_path):
    nodes, edges = write_kgx_nations(tmp_path)
    config = {"datasets": ["nations", "my kg"], "models": ["distmult"], "seeds": [0],
              "sources": {"my kg": {"nodes": str(nodes), "edges": str(edges), "prepare_args": "--seed 1"}}}
    done = snakemake(tmp_path, "-n", "-p", "--cores", "2", config=config)
    assert done.returncode == 0, done.stderr + done.stdout
    assert job_counts(done.stdout) == {"prepare": 1, "train": 2, "evaluate": 2, "explain": 2, "summary": 1, "total": 9}
    assert f"--nodes {nodes} --edges {edges} --seed 1 --out 'results/data/my kg'" in done.stdout
    assert "--dataset 'results/data/my kg'" in done.stdout and "--dataset nations" in done.stdout
    # the prepare rule for real (cheap): a dataset folder from the KGX files
    done = snakemake(tmp_path, "--cores", "1", "results/data/my kg/train.txt", config=config)
    assert done.returncode == 0, done.stderr[-3000:]
    prepared = tmp_path / "results" / "data" / "my kg"
    assert {"train.txt", "valid.txt", "test.txt"} <= {p.name for p in prepared.iterdir()}
    assert "NAT:" in (prepared / "train.txt").read_text()


def test_source_without_files_is_a_clear_error(tmp_path):
    done = snakemake(tmp_path, "-n", "--cores", "1", config={"datasets": ["mine"], "sources": {"mine": {"nodes": "n.tsv"}}})
    assert done.returncode != 0
    assert "'mine' needs nodes and edges (a KGX export) or triples" in done.stderr + done.stdout


@pytest.mark.timeout(900)  # compiles or trains several runs: minutes on a loaded 2-core machine
def test_tiny_real_run_gives_the_summary(tmp_path):
    config = {"datasets": ["nations"], "models": ["distmult"], "seeds": [0, 1], "epochs": 2,
              "checkpoint_every": 1, "explain_test": 2, "top_k": 3, "threads": 1}
    done = snakemake(tmp_path, "--cores", "2", config=config)
    assert done.returncode == 0, done.stderr[-3000:]
    table = pl.read_csv(tmp_path / "results" / "summary.tsv", separator="\t")
    assert table["run"].to_list() == ["nations-distmult-s0", "nations-distmult-s1"]
    assert table["dataset"].to_list() == ["nations"] * 2 and table["seed"].to_list() == [0, 1]
    assert table["epochs"].to_list() == [2, 2]
    for prefix in ("", "head_", "tail_"):
        assert table[prefix + "mrr"].is_between(0, 1).all() and (table[prefix + "mr"] >= 1).all()
    assert (tmp_path / "results" / "summary.png").read_bytes()[:4] == b"\x89PNG"
    run = tmp_path / "results" / "runs" / "nations-distmult-s1"
    assert json.loads((run / "explain" / "test.json").read_text())
    assert (run / "test_ranks.tsv").is_file()
    # the summary's numbers are the ones kgtrace evaluate wrote
    metrics = json.loads((run / "test_metrics.json").read_text())
    assert table["mrr"][1] == pytest.approx(metrics["both"]["realistic"]["mrr"])
    assert table["head_hits_at_10"][1] == pytest.approx(metrics["head"]["realistic"]["hits_at_10"])


# ----------------------------------------------------------------------------- kgtrace summarize


def fake_run(folder: Path, dataset="nations", model="distmult", seed=0, mrr=0.5, metrics=True) -> Path:
    """A run folder as train and evaluate leave it, as far as summarize reads it."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"dataset": dataset, "model": model, "seed": seed, "epochs": 3}))
    if metrics:
        side = {"realistic": {"mrr": mrr, "mr": 2.0, "hits_at_1": 0.25, "hits_at_3": 0.5, "hits_at_10": 1.0}}
        (folder / "test_metrics.json").write_text(json.dumps({"head": side, "tail": side, "both": side}))
    return folder


def test_summarize_writes_one_row_per_run_and_a_plot(tmp_path, capsys):
    runs = [fake_run(tmp_path / "b", seed=1, mrr=0.4), fake_run(tmp_path / "a", seed=0, mrr=0.6),
            fake_run(tmp_path / "c", dataset="/data/my-kg", model="conve")]
    out, plot = tmp_path / "out" / "summary.tsv", tmp_path / "summary.png"
    (tmp_path / "out").mkdir()
    assert main(["summarize", *map(str, runs), "--out", str(out), "--plot", str(plot)]) == 0
    table = pl.read_csv(out, separator="\t")
    assert table.columns[:5] == ["run", "dataset", "model", "seed", "epochs"]
    assert {p + m for p in ("", "head_", "tail_") for m in METRICS} <= set(table.columns)
    assert table.select("dataset", "model", "seed").rows() == [("my-kg", "conve", 0), ("nations", "distmult", 0),
                                                                ("nations", "distmult", 1)]
    assert table["mrr"].to_list() == [0.5, 0.6, 0.4]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {out}" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["summary.tsv"]  # atomic: no temporary left


def test_summarize_missing_metrics_file_exits_2(tmp_path, capsys):
    runs = [fake_run(tmp_path / "done"), fake_run(tmp_path / "trained", metrics=False)]
    assert main(["summarize", *map(str, runs), "--out", str(tmp_path / "s.tsv")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'trained'}: no test_metrics.json" in err and f"{tmp_path / 'done'}:" not in err
    assert "Fix: run kgtrace evaluate RUN --out RUN/test_metrics.json" in err
    assert not (tmp_path / "s.tsv").exists()


def test_summarize_reports_every_missing_run(tmp_path, capsys):
    assert main(["summarize", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "s.tsv")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'a'}: no config.yaml and no test_metrics.json" in err and f"{tmp_path / 'b'}: no config.yaml" in err
    assert not (tmp_path / "s.tsv").exists()


def test_summarize_unreadable_metrics_names_the_file(tmp_path, capsys):
    run = fake_run(tmp_path / "r")
    (run / "test_metrics.json").write_text('{"head": {}}')
    assert main(["summarize", str(run), "--out", str(tmp_path / "s.tsv")]) == 2
    err = capsys.readouterr().err
    assert f"{run}: unreadable" in err and "test_metrics.json" in err and "Fix:" in err
