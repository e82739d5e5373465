"""kgtrace.load_run loads any run folder: the folder says which kind it holds (a prover run: test_prover_bfs.py)."""

import pytest

import kgtrace
from kgtrace.core.errors import KgtraceError
from kgtrace.core.layout import RunLayout


def test_an_embedding_run_loads_as_a_run_and_a_folder_without_one_is_refused(tmp_path):
    out = tmp_path / "run"
    kgtrace.train(kgtrace.TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 4}, epochs=1,
                                      eval_every=0, threads=1, device="cpu"), out, progress=False, log=lambda *_: None)
    assert RunLayout(out).kind == "embedding"
    run = kgtrace.load_run(out)
    assert isinstance(run, kgtrace.Run) and run.model.num_entities == run.dataset.num_entities
    assert RunLayout(tmp_path).kind is None
    with pytest.raises(KgtraceError, match="not a kgtrace run"):
        kgtrace.load_run(tmp_path)


def test_evaluating_an_embedding_run_calls_nothing_in_the_prover(tmp_path):
    """kgtrace evaluate on an embedding run: no function of kgtrace/prover/ runs (a profile of every Python call)."""
    import sys
    from pathlib import Path

    from kgtrace.cli import main

    out = tmp_path / "run"
    kgtrace.train(kgtrace.TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 4}, epochs=1,
                                      eval_every=0, threads=1, device="cpu"), out, progress=False, log=lambda *_: None)
    prover = str(Path(kgtrace.__file__).parent / "prover")
    entered = set()

    def watch(frame, event, _arg):
        if event == "call" and frame.f_code.co_filename.startswith(prover):
            entered.add(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(watch)
    try:
        code = main(["evaluate", str(out), "--device", "cpu", "--no-compile"])
    finally:
        sys.setprofile(None)
    assert code == 0 and entered == set()
