"""The command line: help texts, one-line errors with non-zero exits, the train -> evaluate path."""

import json
import subprocess
import sys

import pytest

from kgtrace.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "kgtrace", *args], capture_output=True, text=True)


@pytest.mark.parametrize("command", ["prepare", "train", "evaluate"])
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
    assert "Adam learning rate (default: 0.001)" in text
    assert "label smoothing of the 1-N BCE loss (default: 0.1)" in text


def test_bad_input_is_one_message_without_traceback(tmp_path):
    bad = tmp_path / "data"
    bad.mkdir()
    (bad / "train.txt").write_text("a\tr\tb\nc\tr\n")
    (bad / "valid.txt").write_text("a\tr\tb\n")
    (bad / "test.txt").write_text("a\tr\tb\n")
    result = run_cli("train", "--dataset", str(bad), "--out", str(tmp_path / "run"), "--epochs", "1")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad / 'train.txt'}:2" in result.stderr
    assert not (tmp_path / "run").exists()


def test_invalid_settings_all_reported(tmp_path):
    result = run_cli("train", "--out", str(tmp_path / "run"), "--epochs", "0", "--precision", "fp8")
    assert result.returncode == 2
    assert "epochs=0" in result.stderr and "precision='fp8'" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_dataset_lists_bundled(tmp_path):
    result = run_cli("train", "--dataset", "nope", "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "umls" in result.stderr and "Traceback" not in result.stderr


def test_train_then_evaluate(tmp_path):
    out = tmp_path / "run"
    result = run_cli("train", "--dataset", "nations", "--model", "distmult", "--epochs", "2", "--eval-every", "1",
                     "--out", str(out), "--no-progress", "--threads", "1", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert "filtered test metrics" in result.stdout
    metrics = json.loads((out / "test_metrics.json").read_text())
    assert metrics["num_queries"] == 201 and 0 < metrics["both"]["realistic"]["mrr"] <= 1
    again = run_cli("evaluate", str(out), "--out", str(tmp_path / "m.json"))
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "m.json").read_text()) == metrics
    refused = run_cli("train", "--dataset", "nations", "--out", str(out), "--epochs", "1")
    assert refused.returncode == 2 and "not empty" in refused.stderr
