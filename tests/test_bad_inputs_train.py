"""Bad inputs to prepare --overwrite, train, run and the commands that read a run: each refused cleanly.

Every case goes through the real CLI (tests/badinput.py): a non-zero exit, no traceback, a
message naming the file or option, and no user file created, changed or removed.
"""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from badinput import refused, run_cli

from kgtrace.data.dataset import load_dataset, save_dataset

TINY = ["--model-arg", "embedding_dim=8", "--model-arg", "embedding_height=2", "--model-arg", "output_channels=2",
        "--threads", "1", "--device", "cpu", "--no-progress", "--batch-size", "256"]


def train_args(dataset, out, *more):
    return ["train", "--dataset", dataset, "--out", out, "--epochs", "1", *TINY, *more]


@pytest.fixture()
def data(tmp_path):
    """A user's folder holding a copy of Nations as a dataset folder (data/nations)."""
    folder = tmp_path / "data"
    save_dataset(load_dataset("nations"), folder / "nations")
    (folder / "notes.txt").write_text("my notes\n")
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-epoch run on a copy of Nations: (run folder, dataset folder)."""
    root = tmp_path_factory.mktemp("trained")
    save_dataset(load_dataset("nations"), root / "nations")
    code, out, err = run_cli(train_args(root / "nations", root / "run"))
    assert code == 0, err
    return root / "run", root / "nations"


# ----------------------------------------------------------------------------- --overwrite deletes nothing foreign


def test_prepare_overwrite_into_its_own_input_folder(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "all.txt").write_text("".join(f"e{i}\tr\te{i + 1}\n" for i in range(40)))
    (folder / "readme.md").write_text("mine\n")
    refused(["prepare", "--triples", folder / "all.txt", "--out", folder, "--overwrite"], watch=tmp_path,
            mentions=[str(folder), "holds an input of this command", "Nothing was deleted"])


def test_prepare_overwrite_of_a_marked_dataset_holding_the_input(tmp_path):
    src = tmp_path / "all.txt"
    src.write_text("".join(f"e{i}\tr\te{(i + 1) % 40}\ne{i}\ts\te{(i + 3) % 40}\n" for i in range(40)))
    assert run_cli(["prepare", "--triples", src, "--out", tmp_path / "d"])[0] == 0
    moved = tmp_path / "d" / "all.txt"
    src.rename(moved)
    refused(["prepare", "--triples", moved, "--out", tmp_path / "d", "--overwrite"], watch=tmp_path,
            mentions=["holds an input of this command", str(moved)])


def test_train_overwrite_of_a_folder_with_a_config_yaml(data, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.yaml").write_text("epochs: 3\n")
    (project / "thesis.tex").write_text("\\chapter{}\n")
    refused(train_args("nations", project, "--overwrite"), watch=tmp_path,
            mentions=[str(project), "not written by kgtrace", "thesis.tex"])


def test_train_overwrite_of_a_run_holding_its_dataset(tmp_path):
    run = tmp_path / "run"
    assert run_cli(train_args("nations", run))[0] == 0
    save_dataset(load_dataset("nations"), run / "mydata")
    refused(train_args(run / "mydata", run, "--overwrite"), watch=tmp_path,
            mentions=["holds an input of this command", "mydata"])


def test_train_overwrite_of_the_working_directory(tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert run_cli(train_args("nations", run))[0] == 0
    monkeypatch.chdir(run / "checkpoints")
    refused(train_args("nations", "..", "--overwrite"), watch=tmp_path,
            mentions=["the working directory or one of its parents"])


def test_train_overwrite_of_a_prepared_dataset(tmp_path):
    src = tmp_path / "all.txt"
    src.write_text("".join(f"e{i}\tr\te{(i + 1) % 40}\ne{i}\ts\te{(i + 3) % 40}\n" for i in range(40)))
    assert run_cli(["prepare", "--triples", src, "--out", tmp_path / "d"])[0] == 0
    refused(train_args("nations", tmp_path / "d", "--overwrite"), watch=tmp_path,
            mentions=["is a dataset folder, not a run folder"])


def test_train_overwrite_with_its_config_file_inside(tmp_path):
    run = tmp_path / "run"
    assert run_cli(train_args("nations", run))[0] == 0
    (run / "mine.yaml").write_text("epochs: 1\n")
    refused(train_args("nations", run, "--overwrite", "--config", run / "mine.yaml"), watch=tmp_path,
            mentions=["holds an input of this command", "mine.yaml"])


def test_train_into_a_users_non_empty_folder(data):
    err = refused(train_args("nations", data), watch=data, mentions=[str(data), "not empty", "notes.txt"])
    assert "--resume" not in err and "--overwrite" not in err  # neither would help with a user's folder


def test_train_into_an_existing_run(trained):
    run, dataset = trained
    refused(train_args(dataset, run), watch=run.parent,
            mentions=["not empty", "pass --resume to continue that run", "pass --overwrite to replace it"])


def test_train_overwrite_replaces_its_own_run(tmp_path):
    run = tmp_path / "run"
    assert run_cli(train_args("nations", run, "--seed", "1"))[0] == 0
    code, _, err = run_cli(train_args("nations", run, "--seed", "2", "--overwrite"))
    assert code == 0, err
    assert "seed: 2" in (run / "config.yaml").read_text() and (run / ".kgtrace").is_file()


# ----------------------------------------------------------------------------- splits and config values


def test_empty_train_split(data):
    (data / "nations" / "train.txt").write_text("")
    refused(train_args(data / "nations", data / "run"), watch=data, mentions=["train.txt", "no triples"])


def test_header_only_test_split(data):
    (data / "nations" / "test.txt").write_text("head\trelation\ttail\n")
    refused(train_args(data / "nations", data / "run"), watch=data, mentions=["test.txt", "no triples"])


def test_empty_valid_split_with_validation(data):
    (data / "nations" / "valid.txt").write_text("")
    err = refused(train_args(data / "nations", data / "run"), watch=data, mentions=["valid.txt", "--eval-every 0"])
    assert "train.txt" not in err


@pytest.mark.parametrize("yaml_text, mentions", [
    ("epochs: 1.5\n", ["epochs=1.5", "whole number"]),
    ('epochs: "ten"\nlr: "abc"\nmodel_args: 5\n', ["epochs='ten'", "lr='abc'", "model_args=5"]),
    ("epoch: 3\n", ["epoch: unknown setting", "did you mean epochs?"]),
    ("compile: maybe\n", ["compile='maybe'", "true or false"]),
    ("- epochs\n- 3\n", ["must be a mapping"]),
    ("epochs: [1\n", ["not valid YAML"]),
])
def test_bad_config_file(data, yaml_text, mentions):
    config = data / "train.yaml"
    config.write_text(yaml_text)
    refused(["train", "--config", config, "--out", data / "run", "--no-progress"], watch=data,
            mentions=[str(config), *mentions])


def test_resume_with_a_different_setting(trained):
    run, dataset = trained
    refused(train_args(dataset, run, "--resume", "--lr", "0.5"), watch=run.parent,
            mentions=["lr=0.5", "the run was trained with 0.001", "drop --lr"])


def test_resume_with_overwrite(trained):
    run, dataset = trained
    refused(train_args(dataset, run, "--resume", "--overwrite"), watch=run.parent,
            mentions=["--resume with --overwrite"])


def test_resume_of_a_folder_without_a_run(data):
    refused(["train", "--out", data, "--resume"], watch=data, mentions=[str(data), "no run to resume"])


def test_run_with_fewer_epochs_than_the_run_has(tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(["run", "--dataset", "nations", "--epochs", "2", "--out", run, "--threads", "1",
                            "--explain", "1", "--queries", "1", "--no-progress"])
    assert code == 0, err
    refused(["run", "--dataset", "nations", "--epochs", "1", "--out", run, "--no-progress"], watch=tmp_path,
            mentions=["epochs: trained for 2 there, --epochs 1 asked", "--epochs 2 reuses it"])


# ----------------------------------------------------------------------------- a run's data, pinned


def test_evaluate_after_a_test_line_was_added(trained, tmp_path):
    run, dataset = trained
    edited = tmp_path / "nations"
    save_dataset(load_dataset(dataset), edited)
    with open(edited / "test.txt", "a") as f:  # a training triple, also put in test: known labels, one more line
        f.write((edited / "train.txt").read_text().splitlines()[0] + "\n")
    copy = tmp_path / "run"
    _copy_run(run, copy, dataset_to=edited)
    refused(["evaluate", copy, "--device", "cpu"], watch=tmp_path,
            mentions=["changed since this run was trained", "test (201 triples then, 202 now)"])


def test_explain_after_the_train_split_gained_a_label(trained, tmp_path):
    run, dataset = trained
    edited = tmp_path / "nations"
    save_dataset(load_dataset(dataset), edited)
    with open(edited / "train.txt", "a") as f:
        f.write("atlantis\tembassy\tusa\n")
    copy = tmp_path / "run"
    _copy_run(run, copy, dataset_to=edited)
    refused(["explain", copy, "--test", "1", "--device", "cpu", "--no-progress"], watch=tmp_path,
            mentions=["changed since this run was trained", "train.txt", "atlantis", "kgtrace train --dataset"])


def test_checkpoint_of_another_run(trained, tmp_path):
    run, _ = trained
    other = tmp_path / "other"
    assert run_cli(train_args("umls", other))[0] == 0
    err = refused(["evaluate", run, "--checkpoint", other / "checkpoints" / "epoch-0001.pt", "--device", "cpu"],
                  watch=[run.parent, tmp_path], mentions=["id map differs from this run's", "RUN_DIR/checkpoints"])
    assert "load_run" not in err and "kgtrace." not in err


def _copy_run(run: Path, copy: Path, dataset_to: Path) -> None:
    """The run's files in ``copy``, its config pointing at ``dataset_to``."""
    import shutil

    shutil.copytree(run, copy)
    config = (copy / "config.yaml").read_text().splitlines()
    (copy / "config.yaml").write_text("\n".join(f"dataset: {dataset_to}" if ln.startswith("dataset:") else ln
                                                for ln in config) + "\n")


# ----------------------------------------------------------------------------- locks


HOLD = textwrap.dedent("""
    import sys
    from kgtrace.core.owned import {function}
    with {function}(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.read()
""")


def hold(function: str, path: Path) -> subprocess.Popen:
    """Another process holding kgtrace's lock of ``path`` until its standard input closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(function=function), str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_resume_while_another_process_trains(trained):
    run, dataset = trained
    holder = hold("folder_lock", run)
    try:
        refused(train_args(dataset, run, "--resume", "--epochs", "2"), watch=run.parent,
                mentions=["in use by another kgtrace process", f"pid {holder.pid}"])
    finally:
        holder.communicate("")


def test_evaluate_into_an_output_another_process_writes(trained, tmp_path):
    run, _ = trained
    out = tmp_path / "m.json"
    holder = hold("file_lock", out)
    try:
        refused(["evaluate", run, "--out", out, "--device", "cpu"], watch=[run.parent],
                mentions=[str(out), "in use by another kgtrace process", f"pid {holder.pid}"])
    finally:
        holder.communicate("")
    assert not list(tmp_path.iterdir())  # the holder's lock file went with it


def test_two_trainings_into_one_folder(tmp_path):
    """Two real processes: exactly one trains; the other is refused at once and writes nothing."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "kgtrace", *map(str, train_args("nations", run, "--epochs", "3"))]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate() + (p.returncode,) for p in procs]
    codes = sorted(code for *_, code in results)
    assert codes == [0, 2], results
    loser = next(err for _, err, code in results if code == 2)
    assert "in use by another kgtrace process" in loser or "not empty" in loser, loser
    epochs = [json.loads(ln)["epoch"] for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3]


# ----------------------------------------------------------------------------- values refused before any folder


@pytest.mark.parametrize("more, mentions", [
    (["--seed", str(2**70)], ["seed=", "2**63"]),
    (["--lr", "inf"], ["lr=inf", "finite"]),
    (["--lr", "nan"], ["lr=nan"]),
    (["--weight-decay", "nan"], ["weight_decay=nan", "finite"]),
    (["--threads", "100000"], ["threads=100000", "cores"]),
    (["--model-arg", "embedding_dim=1000000000000001"], ["embedding_dim=1000000000000001", "at most"]),
])
def test_a_bad_value_is_refused_and_no_run_folder_is_left(data, tmp_path, more, mentions):
    out = tmp_path / "run"
    refused(train_args(data / "nations", out, *more), watch=tmp_path, mentions=mentions)
    assert not out.exists()


def test_a_settings_file_with_aliases_or_not_text_is_refused(data, tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("model_args:\n  a: &a [1, 2, 3]\n  b: &b [*a, *a, *a]\n  c: [*b, *b, *b]\n")
    refused(train_args(data / "nations", tmp_path / "run", "--config", bomb), watch=tmp_path,
            mentions=["bomb.yaml", "alias"])
    picture = tmp_path / "config.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    refused(train_args(data / "nations", tmp_path / "run", "--config", picture), watch=tmp_path,
            mentions=["config.png", "UTF-8"])


def test_train_overwrite_keeps_what_the_user_added_and_says_so(data, tmp_path):
    out = tmp_path / "run"
    assert run_cli(train_args(data / "nations", out))[0] == 0
    (out / "notes.txt").write_text("my notes\n")
    (out / "mydata").mkdir()
    (out / "mydata" / "keep.tsv").write_text("a\tb\n")
    code, stdout, err = run_cli(train_args(data / "nations", out, "--overwrite"))
    assert code == 0, err
    assert "kept 2 files kgtrace did not write there: mydata/keep.tsv, notes.txt" in stdout + err
    assert (out / "notes.txt").read_text() == "my notes\n" and (out / "mydata" / "keep.tsv").read_text() == "a\tb\n"
    assert (out / "checkpoints" / "best.pt").is_file()


def test_prepare_overwrite_keeps_what_the_user_added(tmp_path):
    src = tmp_path / "all.txt"
    src.write_text("".join(f"e{i}\tr\te{(i + 1) % 40}\ne{i}\ts\te{(i + 3) % 40}\n" for i in range(40)))
    out = tmp_path / "d"
    assert run_cli(["prepare", "--triples", src, "--out", out])[0] == 0
    (out / "README.md").write_text("about my data\n")
    code, stdout, err = run_cli(["prepare", "--triples", src, "--out", out, "--overwrite"])
    assert code == 0, err
    assert "README.md" in stdout and (out / "README.md").read_text() == "about my data\n"


def test_a_run_trained_with_more_threads_than_here_still_loads(trained, tmp_path):
    """The bound on threads is this machine's, checked where threads are set: a run trained on a larger machine is
    evaluated here, and resumed once --threads fits."""
    run, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = copy / "config.yaml"
    config.write_text(config.read_text().replace("threads: 1", "threads: 4096"))
    assert run_cli(["evaluate", copy, "--device", "cpu"])[0] == 0
    refused(["train", "--out", copy, "--resume", "--epochs", "2", "--no-progress"], watch=tmp_path,
            mentions=["threads=4096", "cores", "--threads"])
    code, _, err = run_cli(["train", "--out", copy, "--resume", "--epochs", "2", "--threads", "1", "--no-progress"])
    assert code == 0, err


def test_the_run_stays_locked_from_training_to_its_test_metrics(data, tmp_path):
    """train(hold=stack) keeps the folder's lock after it returns: a second process that starts while the test
    metrics are computed is refused, instead of taking the lock in the gap and refusing the first one's write."""
    from contextlib import ExitStack

    from kgtrace.core.config import TrainConfig
    from kgtrace.training.loop import train

    out = tmp_path / "run"
    probe = [sys.executable, "-c", "import sys\nfrom kgtrace.core.owned import folder_lock\nfrom kgtrace.core.errors import "
             f"KgtraceError\ntry:\n    with folder_lock({str(out)!r}):\n        pass\nexcept KgtraceError:\n"
             "    sys.exit(3)"]
    config = TrainConfig(dataset=str(data / "nations"), model="distmult", model_args={"embedding_dim": 8}, epochs=1,
                         threads=1, device="cpu")
    with ExitStack() as hold:
        train(config, out, progress=False, log=lambda *_: None, hold=hold)
        assert subprocess.run(probe).returncode == 3  # still held
    assert subprocess.run(probe).returncode == 0  # released with the stack
