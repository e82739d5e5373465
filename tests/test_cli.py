"""The command line: help texts, one-line errors with non-zero exits, the train -> evaluate path."""

import argparse
import json
import subprocess
import sys

import badinput
import pytest

import kgtrace
from kgtrace.cli import build_parser, main


def run_cli(*args, process: bool = False) -> subprocess.CompletedProcess:
    """``kgtrace ARGS``: through main() in this process (seconds faster), or with ``process`` through the installed
    entry point in a process of its own (``python -m kgtrace``: the exit status and stderr a shell sees)."""
    if process:
        return subprocess.run([sys.executable, "-m", "kgtrace", *args], capture_output=True, text=True)
    code, out, err = badinput.run_cli(list(args))
    return subprocess.CompletedProcess(args, code, out, err)


@pytest.mark.parametrize("command", ["prepare", "train", "evaluate", "predict", "score", "explain", "index"])
def test_help_documents_every_option_with_default(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--" in text and "default" in text


def test_train_help_shows_config_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "learning rate (default: 0.001)" in text
    assert "adam, or adagrad (LibKGE's default) (default: adam)" in text
    assert "label smoothing of the KvsAll labels (either loss; 1vsall has none) (default: 0.1)" in text


def test_train_options_take_their_help_from_the_config_fields():
    """One place for a training option's help: the TrainConfig field's metadata (no second table in the CLI)."""
    from dataclasses import fields

    from kgtrace.core.config import TrainConfig, help_of

    assert all(f.metadata.get("help") for f in fields(TrainConfig))
    assert help_of(TrainConfig, "model").startswith("model: conve | ")
    train = next(p for p in _parsers(build_parser()) if p.prog == "kgtrace train")
    helps = {action.dest: action.help for action in train._actions}
    assert helps["lr"].startswith(help_of(TrainConfig, "lr"))


def test_compile_default_is_cuda_only_unless_asked():
    import torch

    from kgtrace.compute.compile import compile_default

    assert compile_default(torch.device("cpu"), None) is False
    assert compile_default(torch.device("cuda"), None) is True
    assert compile_default(torch.device("cuda"), False) is False
    assert compile_default(torch.device("cpu"), True) is True


def _parsers(parser):
    """The parser and every subcommand's, nested ones included (prove bfs, rules mine, ...)."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_help_never_shows_a_misleading_default():
    """No "(default: None)" where a config file supplies the value, no "(default: True)" on --no-progress."""
    texts = {parser.prog: " ".join(parser.format_help().split()) for parser in _parsers(build_parser())}
    assert len(texts) > 20
    for prog, text in texts.items():
        assert "(default: None)" not in text, prog
        assert "(default: True)" not in text, prog  # only a store_false flag such as --no-progress defaults to True
        assert "(default: 100) (default" not in text, prog
    assert "--epochs EPOCHS number of epochs (default: 100)" in texts["kgtrace train"]
    assert "--overwrite replace an existing run in --out --no-progress hide the progress bars" in texts["kgtrace train"]


def test_bad_input_is_one_message_without_traceback(tmp_path):
    bad = tmp_path / "data"
    bad.mkdir()
    (bad / "train.txt").write_text("a\tr\tb\nc\tr\n")
    (bad / "valid.txt").write_text("a\tr\tb\n")
    (bad / "test.txt").write_text("a\tr\tb\n")
    result = run_cli("train", "--dataset", str(bad), "--out", str(tmp_path / "run"), "--epochs", "1", process=True)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad / 'train.txt'}:2" in result.stderr
    assert not (tmp_path / "run").exists()


def test_invalid_settings_all_reported(tmp_path):
    result = run_cli("train", "--out", str(tmp_path / "run"), "--epochs", "0", "--precision", "fp8")
    assert result.returncode == 2
    assert "epochs=0" in result.stderr and "precision='fp8'" in result.stderr
    assert "Traceback" not in result.stderr


def test_version():
    result = run_cli("--version", process=True)
    assert result.returncode == 0 and result.stdout.strip() == f"kgtrace {kgtrace.__version__}"


def test_unknown_dataset_lists_bundled(tmp_path):
    result = run_cli("train", "--dataset", "nope", "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "umls" in result.stderr and "Traceback" not in result.stderr


def test_train_then_evaluate(tmp_path):
    out = tmp_path / "run"
    result = run_cli("train", "--dataset", "nations", "--model", "distmult", "--epochs", "2", "--eval-every", "1",
                     "--out", str(out), "--threads", "1", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert "filtered test metrics" in result.stdout
    assert "\r" not in result.stderr and "batch/s" not in result.stderr  # no progress bar into a pipe
    metrics = json.loads((out / "test_metrics.json").read_text())
    assert metrics["num_queries"] == 201 and 0 < metrics["both"]["realistic"]["mrr"] <= 1
    assert len((out / "test_ranks.tsv").read_text().splitlines()) == 1 + 2 * 201  # a header, then both sides
    again = run_cli("evaluate", str(out), "--out", str(tmp_path / "m.json"))
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "m.json").read_text()) == metrics
    refused = run_cli("train", "--dataset", "nations", "--out", str(out), "--epochs", "1")
    assert refused.returncode == 2 and "not empty" in refused.stderr


def test_evaluate_prints_a_column_per_k(tmp_path, capsys):
    from kgtrace.core.config import TrainConfig
    from kgtrace.training.loop import train

    out = tmp_path / "run"
    config = TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 8}, epochs=1,
                         eval_every=1, threads=1, device="cpu")
    train(config, out, progress=False, log=lambda *_: None)
    capsys.readouterr()
    assert main(["evaluate", str(out), "--ks", "1,5", "--out", str(tmp_path / "m.json"), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("side"))
    assert header.split() == ["side", "MRR", "MR", "H@1", "H@5"]
    rows = [line.split() for line in lines if line.split()[:1] in (["head"], ["tail"], ["both"])]
    assert [row[0] for row in rows] == ["head", "tail", "both"] and all(len(row) == 5 for row in rows)
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert float(rows[2][4]) == pytest.approx(metrics["both"]["realistic"]["hits_at_5"], abs=5e-5)


def test_config_file_and_flags_layer(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("dataset: nations\nmodel: distmult\nepochs: 5\nlr: 0.01\nmodel_args:\n  embedding_dim: 8\n")
    out = tmp_path / "run"
    result = run_cli("train", "--config", str(config), "--epochs", "1", "--out", str(out), "--no-progress",
                     "--device", "cpu")
    assert result.returncode == 0, result.stderr
    import yaml

    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["epochs"] == 1 and saved["lr"] == 0.01 and saved["model_args"] == {"embedding_dim": 8}


def test_unknown_config_key_is_reported(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("learning_rate: 0.01\n")
    result = run_cli("train", "--config", str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "learning_rate: unknown setting" in result.stderr


def test_prepare_from_kgx_then_train(tmp_path):
    nodes = tmp_path / "nodes.tsv"
    edges = tmp_path / "edges.tsv"
    drugs = [f"CHEBI:{i}" for i in range(6)]
    diseases = [f"MONDO:{i}" for i in range(6)]
    nodes.write_text("id\tcategory\tname\n" + "".join(
        f"{n}\tbiolink:ChemicalEntity|biolink:NamedThing\tdrug {n}\n" for n in drugs) + "".join(
        f"{n}\tbiolink:Disease\tdisease {n}\n" for n in diseases))
    rows = ["subject\tpredicate\tobject"]
    for i, d in enumerate(drugs):
        for j, s in enumerate(diseases):
            if (i + j) % 2 == 0:
                rows.append(f"{d}\tbiolink:treats\t{s}")
            else:
                rows.append(f"{s}\tbiolink:has_phenotype\t{d}")
    rows.append(f"{drugs[0]}\tbiolink:subclass_of\t{drugs[1]}")
    edges.write_text("\n".join(rows) + "\n")
    data = tmp_path / "data"
    result = run_cli("prepare", "--nodes", str(nodes), "--edges", str(edges), "--out", str(data),
                     "--category-pair", "biolink:ChemicalEntity,biolink:Disease",
                     "--drop-predicate", "biolink:subclass_of", "--seed", "1")
    assert result.returncode == 0, result.stderr
    assert {"train.txt", "valid.txt", "test.txt", "node_dict", "rel_dict"} <= {p.name for p in data.iterdir()}
    assert "subclass_of" not in (data / "train.txt").read_text()
    again = run_cli("prepare", "--nodes", str(nodes), "--edges", str(edges), "--out", str(data))
    assert again.returncode == 2 and "Traceback" not in again.stderr
    trained = run_cli("train", "--dataset", str(data), "--model", "distmult", "--epochs", "1", "--out",
                      str(tmp_path / "run"), "--no-progress", "--device", "cpu")
    assert trained.returncode == 0, trained.stderr


@pytest.mark.timeout(900)  # compiles or trains several runs: minutes on a loaded 2-core machine
def test_evaluate_options_per_query_histogram_and_compile(tmp_path):
    out = tmp_path / "run"
    trained = run_cli("train", "--dataset", "nations", "--model", "distmult", "--epochs", "1", "--out", str(out),
                      "--no-progress", "--device", "cpu", "--model-arg", "embedding_dim=8")
    assert trained.returncode == 0, trained.stderr
    eager = run_cli("evaluate", str(out), "--no-compile", "--out", str(tmp_path / "eager.json"),
                    "--per-query", str(tmp_path / "q.tsv"), "--histogram", str(tmp_path / "h.png"))
    assert eager.returncode == 0, eager.stderr
    compiled = run_cli("evaluate", str(out), "--compile", "--out", str(tmp_path / "compiled.json"))
    assert compiled.returncode == 0, compiled.stderr
    assert json.loads((tmp_path / "eager.json").read_text()) == json.loads((tmp_path / "compiled.json").read_text())
    rows = (tmp_path / "q.tsv").read_text().splitlines()
    assert rows[0].split("\t") == ["index", "head", "relation", "tail", "side", "rank_optimistic", "rank_pessimistic",
                                   "rank_realistic", "true_score", "num_candidates"]
    assert len(rows) == 1 + 2 * 201
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sampled = run_cli("evaluate", str(out), "--corruptions", "5", "--modes", "tail", "--out", str(tmp_path / "s.json"))
    assert sampled.returncode == 0, sampled.stderr
    metrics = json.loads((tmp_path / "s.json").read_text())
    assert metrics["candidates"] == 5 and "head" not in metrics and metrics["tail"]["realistic"]["mr"] <= 6
    untyped = run_cli("evaluate", str(out), "--restrict", "typed")
    assert untyped.returncode == 2 and "categor" in untyped.stderr  # Nations has no node categories
    bad = run_cli("evaluate", str(out), "--per-query", str(tmp_path / "q.csv"), "--modes", "up")
    assert bad.returncode == 2 and "--modes" in bad.stderr and "Traceback" not in bad.stderr
