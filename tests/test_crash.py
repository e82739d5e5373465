"""Crash tests: SIGKILL a real kgtrace process several times at seeded random moments, rerun the
same command, and end with exactly what one uninterrupted run writes.

The kills follow files the process writes (a checkpoint, a metrics line, the explain state) plus a
small seeded random delay, so where one lands depends on the machine's speed; the assertions do not.
Each test asserts that at least one kill interrupted a running process.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest
import torch

import kgtrace
from kgtrace.core.checkpoint import latest_checkpoint
from kgtrace.core.layout import RunLayout

EPOCHS = 10
TRAIN = ["--dataset", "nations", "--model", "conve", "--model-arg", "embedding_dim=16", "--model-arg",
         "embedding_height=4", "--model-arg", "output_channels=4", "--epochs", str(EPOCHS), "--batch-size", "64",
         "--checkpoint-every", "1", "--eval-every", "1", "--threads", "1", "--device", "cpu", "--no-progress"]
EXPLAIN = ["--test", "12", "--top-k", "5", "--chunk-size", "16", "--save-every", "0", "--device", "cpu",
           "--no-progress"]
# The child processes import the kgtrace under test and compute on one thread.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(kgtrace.__file__).parents[1]),
                                                    os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def kgtrace_cli(*args) -> list[str]:
    return [sys.executable, "-m", "kgtrace", *map(str, args)]


def finish(argv: list, log: Path) -> None:
    """Run ``argv`` to its end; its output goes to ``log``."""
    with open(log, "w") as f:
        code = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=ENV, timeout=300).returncode
    assert code == 0, log.read_text()


def kill_when(argv: list, ready, delay: float, log: Path, timeout: float = 300) -> bool:
    """Start ``argv``; once ``ready()`` holds, wait ``delay`` s and SIGKILL it. Returns whether the kill
    interrupted it (False: it had finished, with success, before)."""
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=ENV)
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None and not ready():
                assert time.monotonic() < deadline, f"{argv}: nothing to wait for after {timeout} s"
                time.sleep(0.005)
            time.sleep(delay)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            code = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code in (0, -signal.SIGKILL), log.read_text()
    return code == -signal.SIGKILL


def after_epoch(run: Path, epoch: int, what: str):
    """A test of whether a training process has written epoch ``epoch``'s checkpoint, or its metrics
    record (which comes before the checkpoint; a stale record of a killed process does not count)."""
    if what == "checkpoint":
        return lambda: RunLayout(run).epoch_checkpoint(epoch).exists()
    metrics = run / "metrics.jsonl"

    def version():
        with suppress(FileNotFoundError):
            stat = metrics.stat()
            return stat.st_ino, stat.st_size, stat.st_mtime_ns

    before = version()  # a resume first rewrites the file without the records it will redo
    return lambda: version() != before and metrics.read_bytes().count(b"\n") >= epoch


def chunks_saved(state: Path) -> int:
    """How many chunks of its pass ``kgtrace explain`` has saved in its state file."""
    try:
        return int(torch.load(state, weights_only=True)["next"])
    except FileNotFoundError:
        return 0


def assert_identical(a, b, where: str) -> None:
    """Equal, tensors bit for bit (dicts and lists recursively)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def records(run: Path) -> list[dict]:
    """metrics.jsonl without the timings."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The uninterrupted run."""
    folder = tmp_path_factory.mktemp("whole")
    finish(kgtrace_cli("train", *TRAIN, "--out", folder / "run"), folder / "train.log")
    return folder / "run"


@pytest.mark.timeout(900)  # compiles or trains several runs: minutes on a loaded 2-core machine
def test_training_killed_again_and_again_resumes_to_the_uninterrupted_run(whole, tmp_path):
    rng = random.Random(26)
    run = tmp_path / "run"
    interrupted = 0
    for attempt in range(4):
        argv = kgtrace_cli("train", *TRAIN, "--out", run) if attempt == 0 else \
            kgtrace_cli("train", "--resume", "--out", run, "--no-progress")
        latest = latest_checkpoint(run / "checkpoints") if run.exists() else None
        done = 0 if latest is None else int(latest.stem.split("-")[1])
        target = min(done + rng.randint(1, 3), EPOCHS)
        ready = after_epoch(run, target, rng.choice(["checkpoint", "record"]))
        interrupted += kill_when(argv, ready, rng.uniform(0, 0.08), tmp_path / f"attempt-{attempt}.log")
    assert interrupted >= 1, "every process had finished before its kill"
    finish(kgtrace_cli("train", "--resume", "--out", run, "--no-progress"), tmp_path / "last.log")

    assert records(run) == records(whole)  # epochs 1..EPOCHS, once each, in order, with the same losses
    assert [r["epoch"] for r in records(run)] == list(range(1, EPOCHS + 1))
    names = sorted(p.name for p in (whole / "checkpoints").iterdir())
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == names  # no temporary file left either
    assert not list(run.glob(".*.tmp"))
    for name in names:  # weights, optimizer, scheduler, RNG states, counters: bit for bit
        assert_identical(torch.load(run / "checkpoints" / name, weights_only=True),
                         torch.load(whole / "checkpoints" / name, weights_only=True), name)
    assert json.loads((run / "test_metrics.json").read_text()) == json.loads((whole / "test_metrics.json").read_text())


@pytest.mark.timeout(900)  # compiles or trains several runs: minutes on a loaded 2-core machine
def test_explain_killed_mid_pass_resumes_from_its_state_to_the_uninterrupted_result(whole, tmp_path):
    rng = random.Random(14)
    finish(kgtrace_cli("explain", whole, *EXPLAIN, "--out", tmp_path / "whole.json"), tmp_path / "whole.log")
    out = tmp_path / "killed.json"
    state = Path(f"{out}.state")
    interrupted = resumed = 0
    for attempt in range(2):  # of 100 chunks (1,592 training triples), killed after one of 10..45, then of 55..90
        resumed += state.exists()  # this attempt starts from the progress a killed one saved
        chunk = rng.randint(10, 45) + 45 * attempt
        interrupted += kill_when(kgtrace_cli("explain", whole, *EXPLAIN, "--out", out),
                                 lambda chunk=chunk: chunks_saved(state) >= chunk,
                                 rng.uniform(0, 0.02), tmp_path / f"attempt-{attempt}.log")
    assert interrupted >= 1, "every process had finished before its kill"
    resumed += state.exists()
    finish(kgtrace_cli("explain", whole, *EXPLAIN, "--out", out), tmp_path / "last.log")
    assert resumed >= 1, "no rerun found a saved state to resume from"
    assert not state.exists() and not list(tmp_path.glob(".*.tmp"))  # nor a killed save's temporary file
    killed, uninterrupted = json.loads(out.read_text()), json.loads((tmp_path / "whole.json").read_text())
    assert killed["explanations"] == uninterrupted["explanations"]
    assert killed["files"] == {"killed.tsv": uninterrupted["files"]["whole.tsv"]}  # the same table, its own name
    assert out.with_suffix(".tsv").read_bytes() == (tmp_path / "whole.tsv").read_bytes()
