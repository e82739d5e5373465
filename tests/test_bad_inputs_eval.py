"""kgtrace evaluate refuses bad input cleanly: one message naming the option or file, the value and the fix,
a non-zero exit, no traceback, and neither the run nor the output folder touched."""

from __future__ import annotations

import pytest
from badinput import refused


@pytest.fixture(scope="module")
def run(tiny_conve):
    """The shared tiny ConvE on Nations (conftest)."""
    return tiny_conve


@pytest.fixture
def outputs(tmp_path):
    folder = tmp_path / "outputs"
    folder.mkdir()
    return folder


def evaluate(run, *options):
    return ["evaluate", run, "--device", "cpu", *options]


@pytest.mark.parametrize("options, mentions", [
    (["--ks", "abc"], ["--ks", "'abc'", "1,3,10"]),
    (["--ks", "0"], ["--ks", "'0'", "1 or more"]),
    (["--ks", "1,-3"], ["--ks", "'1,-3'"]),
    (["--ks", ""], ["--ks", "1,3,10"]),
    (["--modes", "sideways"], ["--modes", "sideways", "head"]),
    (["--corruptions", "-1"], ["--corruptions", "-1"]),
    (["--corruptions", "many"], ["--corruptions", "many"]),
    (["--memory-budget", "lots"], ["--memory-budget", "'lots'", "2GB"]),
    (["--memory-budget", "0"], ["--memory-budget", "'0'"]),
    (["--split", "train"], ["--split", "train"]),
    (["--restrict", "typed"], ["node_categories.tsv", "--restrict"]),
    (["--restrict", "nonsense"], ["--restrict", "nonsense", "RELATION:tail="]),
])
def test_bad_options_are_refused(run, outputs, options, mentions):
    refused(evaluate(run, *options, "--out", outputs / "m.json"), watch=[run, outputs], mentions=mentions)


def test_every_bad_option_is_named_at_once(run, outputs):
    refused(evaluate(run, "--ks", "0", "--corruptions", "-2", "--memory-budget", "lots"), watch=[run, outputs],
            mentions=["--ks", "--corruptions -2", "--memory-budget"])


def test_a_folder_that_is_not_a_run(run, outputs):
    refused(evaluate(outputs), watch=[run, outputs], mentions=[str(outputs), "config.yaml", "kgtrace train"])
    missing = outputs / "nowhere"
    refused(evaluate(missing), watch=[run, outputs], mentions=[str(missing), "kgtrace train"])


def test_a_missing_checkpoint(run, outputs):
    refused(evaluate(run, "--checkpoint", "epoch_99.pt"), watch=[run, outputs], mentions=["epoch_99.pt", "checkpoints"])


@pytest.mark.parametrize("option, name, mentions", [
    ("--out", "metrics.txt", [".json"]),
    ("--per-query", "ranks.csv", [".tsv", ".parquet"]),
    ("--histogram", "ranks.txt", [".png"]),
])
def test_an_output_of_the_wrong_kind_is_refused_before_anything_is_written(run, outputs, option, name, mentions):
    # With --out m.json too: a refused command must not leave the metrics of a half-done run behind.
    others = [] if option == "--out" else ["--out", outputs / "m.json"]
    refused(evaluate(run, option, outputs / name, *others), watch=[run, outputs],
            mentions=[option, name, *mentions])


@pytest.mark.parametrize("option", ["--out", "--per-query", "--histogram"])
def test_an_output_that_is_a_folder_is_refused(run, outputs, option):
    folder = outputs / {"--out": "m.json", "--per-query": "q.tsv", "--histogram": "h.png"}[option]
    folder.mkdir()
    refused(evaluate(run, option, folder), watch=[run, outputs], mentions=[option, str(folder), "folder"])
