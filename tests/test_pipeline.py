"""kgtrace.pipeline: one call trains, ranks the test split and returns the run, the losses and the metrics."""

import json

import pytest
import torch

import kgtrace
from kgtrace.compute.system import resolve_device
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError, KgtraceError, command_line
from kgtrace.core.io import check_json_out
from kgtrace.faithfulness import FaithfulnessSettings


def test_pipeline_trains_ranks_and_returns_frames(tmp_path):
    result = kgtrace.pipeline(dataset="Nations", model="DistMult", epochs=2, model_args={"embedding_dim": 8},
                              eval_every=1, threads=1, device="cpu", out=tmp_path / "run", log=lambda *_: None)
    assert result.run_dir == tmp_path / "run" and result.training.epochs_completed == 2
    saved = json.loads((tmp_path / "run" / "test_metrics.json").read_text())
    assert saved == result.metrics.to_dict() and (tmp_path / "run" / "test_ranks.tsv").is_file()
    epochs = result.training.to_df()
    assert epochs["epoch"].to_list() == [1, 2] and epochs["valid_mrr"].null_count() == 0
    frame = result.to_df()
    assert len(frame) > 0 and "test MRR" in repr(result)
    assert isinstance(kgtrace.load_run(result.run_dir), kgtrace.Run)  # the run serves everything else
    # a re-run cell is refused in Python's terms, not the command line's
    with pytest.raises(kgtrace.KgtraceError, match=r"out='.*run': folder is not empty .*call kgtrace\.resume\(out\) "
                                                   r"to continue that run or pass overwrite=True"):
        kgtrace.pipeline(dataset="nations", model="distmult", epochs=1, out=tmp_path / "run", log=lambda *_: None)


def test_an_unknown_setting_is_refused_with_the_settings_names(tmp_path):
    with pytest.raises(ConfigError, match="learning_rate: not a setting of TrainConfig .*lr"):
        kgtrace.pipeline(dataset="nations", learning_rate=0.01, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("call", "python", "cli"), [
    (lambda: resolve_device("cuda"), "device='cpu'", "--device cpu"),
    (lambda: check_json_out("x.tsv"), "out='x.tsv'", "--out x.tsv"),
    (lambda: TrainConfig(sparse=True, compile=True), "compile=False", "--no-compile"),
    (lambda: FaithfulnessSettings(methods=("proof",)), "pass prover_run (the folder", "pass --prover-run (the folder"),
])
def test_errors_name_the_callers_own_arguments(call, python, cli, monkeypatch):
    """Raised from Python, a message names the keyword argument; inside the command line, the option."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KgtraceError) as from_python:
        call()
    with command_line(), pytest.raises(KgtraceError) as from_cli:
        call()
    assert python in str(from_python.value) and "--" not in str(from_python.value).split("Fix")[-1]
    assert cli in str(from_cli.value)
