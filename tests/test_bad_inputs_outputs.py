"""The files a command writes: never a file it reads, never among the run's or dataset's inputs, never a
companion the user did not name unless kgtrace wrote it, suffixes checked; faults of the operating system
(disk full, a file-size limit) are one clear message and exit 2, nothing half-written under a final name.

Each case runs the real CLI through the bad-input harness: refused, named, and nothing changed.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch
from badinput import refused, run_cli

from kgtrace.core import io as kgtrace_io
from kgtrace.core.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A dataset folder (Nations' files) and a tiny DistMult run trained on it."""
    root = tmp_path_factory.mktemp("outputs")
    ds = root / "ds"
    ds.mkdir()
    bundled = resources.files("kgtrace.data") / "bundled" / "nations"
    for split in ("train", "valid", "test"):
        (ds / f"{split}.txt").write_text((bundled / f"{split}.txt").read_text())
    run = root / "run"
    code, out, err = run_cli(["train", "--dataset", ds, "--model", "distmult", "--epochs", "2", "--checkpoint-every",
                              "1", "--out", run, "--threads", "1", "--device", "cpu", "--no-progress", "--no-compile"])
    assert code == 0, out + err
    return ds, run


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


CPU = ["--device", "cpu"]


def cases(ds: Path, run: Path, here: Path) -> list[tuple[list, list]]:
    """(argv, what the message must name): each would replace an input of the run or of its dataset."""
    hypotheses = here / "hypotheses.tsv"
    hypotheses.write_text("usa\tembassy\tchina\n")
    return [
        (["evaluate", run, *CPU, "--per-query", ds / "train.tsv"], [str(ds / "train.tsv"), "--per-query"]),
        (["evaluate", run, *CPU, "--out", run / "data.json"], ["data.json", "--out"]),
        (["evaluate", run, *CPU, "--out", run / "checkpoints" / "metrics.json"], ["checkpoints"]),
        (["predict", run, *CPU, "--head", "usa", "--relation", "embassy", "--out", ds / "train.json"],
         [str(ds / "train.json")]),
        (["score", run, *CPU, "--triples", hypotheses, "--out", ds / "train.json"], [str(ds / "train.tsv")]),
        (["score", run, *CPU, "--triples", hypotheses, "--out", here / "hypotheses.json"],
         ["hypotheses.tsv", "reads"]),
        (["explain", run, *CPU, "--triple", "usa", "embassy", "china", "--out", ds / "train.json", "--no-progress"],
         [str(ds / "train.json")]),
        (["explain", run, *CPU, "--triple", "usa", "embassy", "china", "--out", run / "test_metrics.json",
          "--no-progress"], ["test_metrics.json"]),
        (["explain", run, *CPU, "--triples", hypotheses, "--out", here / "hypotheses.json", "--no-progress"],
         ["hypotheses.tsv", "reads"]),
        (["summarize", run, "--out", ds / "train.tsv"], [str(ds / "train.tsv")]),
        (["summarize", run, "--out", here / "table.tsv", "--plot", here / "plot.txt"], ["--plot", ".png"]),
        (["rules", "mine", "--dataset", ds, "--out", ds / "train.txt", "--overwrite"], [str(ds / "train.txt")]),
    ]


@pytest.mark.parametrize("case", range(12))
def test_an_output_that_would_replace_an_input_is_refused(setup, here, case):
    ds, run = setup
    argv, mentions = cases(ds, run, here)[case]
    refused(argv, watch=[ds, run, here], mentions=mentions)


def test_a_companion_the_user_did_not_name_is_kept(setup, here):
    """--out results.json writes results.tsv beside it: refused where results.tsv is the user's, done where kgtrace
    wrote it (its results.json lists it), and refused again once the user has changed it."""
    _, run = setup
    mine = here / "results.tsv"
    mine.write_text("my own table\n")
    argv = ["predict", run, *CPU, "--head", "usa", "--relation", "embassy", "--out", here / "results.json"]
    refused(argv, watch=here, mentions=[str(mine), "move it away"])
    mine.unlink()
    assert run_cli(argv)[0] == 0
    assert run_cli(argv)[0] == 0  # kgtrace's own companion, listed in results.json: replaced
    with open(mine, "a") as f:
        f.write("a note of the user's\n")
    refused(argv, watch=here, mentions=[str(mine)])


def test_an_output_under_a_file_is_refused_before_any_work(setup, here):
    _, run = setup
    (here / "afile").write_text("x")
    refused(["explain", run, *CPU, "--triple", "usa", "embassy", "china", "--out", here / "afile" / "x.json"],
            watch=[here, run], mentions=["afile", "is a file, not a folder"])


def test_every_problem_with_the_outputs_is_named_at_once(setup, here):
    ds, run = setup
    err = refused(["evaluate", run, *CPU, "--out", run / "data.json", "--per-query", ds / "test.tsv"],
                  watch=[ds, run, here])
    assert "data.json" in err and str(ds / "test.tsv") in err


def test_evaluate_still_writes_the_runs_own_test_metrics(setup):
    """What the README does: evaluate --out RUN/test_metrics.json --per-query RUN/test_ranks.tsv."""
    _, run = setup
    code, out, err = run_cli(["evaluate", run, *CPU, "--out", run / "test_metrics.json",
                              "--per-query", run / "test_ranks.tsv"])
    assert code == 0, out + err


# ----------------------------------------------------------------------------- faults of the operating system


def test_a_full_disk_while_writing_is_one_message_and_nothing_half_written(setup, here, monkeypatch):
    _, run = setup
    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(kgtrace_io.os, "fsync", full)
    out = here / "metrics.json"
    err = refused(["evaluate", run, *CPU, "--out", out], watch=here, mentions=[str(out), "ENOSPC", "free disk space"])
    assert err.count("\n") == 1  # one line
    monkeypatch.setattr(kgtrace_io.os, "fsync", real)
    assert list(here.iterdir()) == []  # no temporary file left either


def test_a_file_size_limit_during_training_is_one_message_and_the_run_resumes(setup, here):
    """A real limit (ulimit -f) in a child process: exit 2, the checkpoint named, no file half-written, and the same
    run resumes once the limit is lifted."""
    ds, _ = setup
    if shutil.which("bash") is None:
        pytest.skip("needs bash for ulimit")
    run = here / "limited"
    train = [sys.executable, "-m", "kgtrace", "train", "--dataset", str(ds), "--model", "distmult", "--epochs", "2",
             "--checkpoint-every", "1", "--out", str(run), "--threads", "1", "--device", "cpu", "--no-progress",
             "--no-compile", "--model-arg", "embedding_dim=64"]
    limited = subprocess.run(["bash", "-c", 'ulimit -f 40; exec "$@"', "bash", *train], capture_output=True,
                             text=True, timeout=300)
    assert limited.returncode == 2, limited.stdout + limited.stderr
    assert "Traceback" not in limited.stderr and "internal error" not in limited.stderr
    assert "EFBIG" in limited.stderr and ".pt" in limited.stderr
    left = [p.name for p in run.rglob("*") if p.name.endswith(".tmp")]
    assert left == []
    for checkpoint in run.rglob("*.pt"):  # what is there under a final name is whole
        load_checkpoint(checkpoint)
    resumed = subprocess.run([*train[:3], "train", "--out", str(run), "--resume", "--threads", "1", "--no-progress"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr


# ----------------------------------------------------------------------------- a run that gives no answer worth reading


def damaged(run: Path, here: Path, how) -> Path:
    """A copy of ``run`` with ``how(copy)`` done to it."""
    copy = here / "damaged-run"
    shutil.copytree(run, copy)
    how(copy)
    return copy


def set_in_checkpoints(folder: Path, change) -> None:
    for path in (folder / "checkpoints").glob("*.pt"):
        state = torch.load(path, weights_only=True)
        change(state)
        torch.save(state, path)


def nan_weights(state):
    state["model_state"]["entity_embeddings"][0, 0] = float("nan")


def inf_weights(state):
    state["model_state"]["relation_embeddings"][1] = float("inf")


def nan_lr(state):
    state["lr"] = float("nan")


def wrong_shape(state):
    state["model_state"]["entity_embeddings"] = state["model_state"]["entity_embeddings"][:, :3].clone()


@pytest.mark.parametrize("change, mentions", [
    (nan_weights, ["not finite", "entity_embeddings", "smaller lr"]),
    (inf_weights, ["not finite", "relation_embeddings"]),
    (nan_lr, ["learning rate is nan"]),
    (wrong_shape, ["do not fit", "distmult"]),
])
@pytest.mark.parametrize("command", [
    ["evaluate"], ["predict", "--head", "usa", "--relation", "embassy"],
    ["explain", "--triple", "usa", "embassy", "china", "--no-progress"],
])
def test_a_run_with_broken_weights_is_refused_by_every_command(setup, here, change, mentions, command):
    _, run = setup
    broken = damaged(run, here, lambda folder: set_in_checkpoints(folder, change))
    refused([command[0], broken, *command[1:], *CPU], watch=here, mentions=mentions)


@pytest.mark.parametrize("how, mentions", [
    (lambda folder: (folder / "data.json").unlink(), ["data.json", "missing"]),
    (lambda folder: (folder / "data.json").write_text("{not json"), ["data.json", "damaged"]),
    (lambda folder: (folder / "data.json").write_text('{"splits": {}}'), ["data.json", "damaged"]),
])
def test_a_missing_or_damaged_data_pin_is_an_error(setup, here, how, mentions):
    _, run = setup
    refused(["evaluate", damaged(run, here, how), *CPU], watch=here, mentions=mentions)


# ----------------------------------------------------------------------------- the TracIn index folder


def test_an_index_is_not_built_into_a_users_folder(setup, here):
    _, run = setup
    mine = here / "mine"
    mine.mkdir()
    (mine / "progress.json").write_text('{"my": "progress"}\n')
    refused(["index", run, "--out", mine, "--dim", "16", *CPU, "--no-progress"], watch=here,
            mentions=[str(mine), "not written by kgtrace", "progress.json"])


def test_a_second_index_build_into_the_same_folder_is_refused(setup, here):
    _, run = setup
    out = here / "index"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom kgtrace.core.owned import folder_lock\n"
                               f"with folder_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        refused(["index", run, "--out", out, "--dim", "16", *CPU, "--no-progress"], watch=here,
                mentions=[str(out), "in use by another kgtrace process"])
    finally:
        holder.kill()
        holder.wait()
    code, stdout, err = run_cli(["index", run, "--out", out, "--dim", "16", *CPU, "--no-progress"])
    assert code == 0, err  # once the other has finished
    refused(["index", run, "--out", out, "--dim", "32", *CPU, "--no-progress"], watch=here,
            mentions=["already holds a complete index"])


COMMANDS = {
    "evaluate": lambda run, here: ["evaluate", run, *CPU, "--out", here / "m.json"],
    "predict": lambda run, here: ["predict", run, *CPU, "--head", "usa", "--relation", "embassy", "--out",
                                  here / "p.json"],
    "explain": lambda run, here: ["explain", run, *CPU, "--triple", "usa", "embassy", "china", "--out",
                                  here / "e.json", "--no-progress"],
    "prepare": lambda run, here: ["prepare", "--triples", here / "kg.tsv", "--out", here / "ds"],
}


@pytest.mark.parametrize("command, code", [
    *((name, errno.ENOSPC) for name in COMMANDS),  # a full disk, in every command
    ("evaluate", errno.EACCES), ("predict", errno.EROFS), ("explain", errno.ENAMETOOLONG), ("prepare", errno.EIO),
])
def test_a_fault_of_the_operating_system_is_one_message_naming_the_path(setup, here, monkeypatch, code, command):
    """Each fault met when the result is put in place: exit 2, the path, the errno's name and a fix, and no file of
    the command's left, half-written or whole."""
    _, run = setup
    (here / "kg.tsv").write_text("".join(f"e{i}\tr\te{(i + 1) % 30}\ne{i}\ts\te{(i + 7) % 30}\n" for i in range(30)))
    real = os.replace

    def failing(src, dst):
        if Path(dst).parent.resolve() == here.resolve() or here.resolve() in Path(dst).resolve().parents:
            raise OSError(code, os.strerror(code))
        return real(src, dst)

    monkeypatch.setattr(kgtrace_io.os, "replace", failing)
    err = refused(COMMANDS[command](run, here), watch=here, mentions=[errno.errorcode[code], "Fix:"])
    assert str(here) in err


def test_a_lock_file_that_is_a_folder_is_named(setup, here):
    _, run = setup
    copy = here / "run"
    shutil.copytree(run, copy)
    (copy / ".kgtrace.lock").unlink()
    (copy / ".kgtrace.lock").mkdir()
    refused(["train", "--out", copy, "--resume", "--epochs", "3", "--threads", "1", "--no-progress"], watch=here,
            mentions=[".kgtrace.lock", "is a folder", "move that folder away"])


def test_an_out_dir_among_the_runs_files_is_refused(setup, here):
    _, run = setup
    refused(["explain", run, *CPU, "--test", "2", "--out-dir", run / "checkpoints" / "explained", "--no-progress"],
            watch=[run, here], mentions=["--out-dir", "checkpoints"])
