"""benchmarks/reproduce.py: every recipe is a valid configuration, and one tiny recipe runs to a result file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import benchmark_script

from kgtrace.core.config import TrainConfig
from kgtrace.models import build_model


@pytest.fixture(scope="module")
def reproduce():
    with benchmark_script("reproduce") as module:
        yield module


def test_every_recipe_is_a_valid_training_configuration(reproduce):
    for recipe in reproduce.RECIPES.values():
        TrainConfig(dataset=recipe.dataset, model_args=dict(recipe.model_args), **recipe.settings).validate()
        build_model(recipe.settings["model"], 30, 4, **recipe.model_args)
        assert recipe.dataset in ("fb15k237", "wn18rr") and 0 < recipe.published_mrr < 1


def test_the_authors_conve_recipe_has_their_image_and_fc(reproduce):
    model = build_model("conve", 30, 4, **reproduce.RECIPES["conve-authors-fb15k237"].model_args)
    assert (2 * model.embedding_height, model.embedding_width) == (40, 10)  # their [20 x 10 ; 20 x 10] stack
    assert model.fc.in_features == 9728  # their main.py's --hidden-size default for embeddings of 200


def test_the_authors_replication_differs_from_their_readme_settings_in_the_hidden_dropout_only(reproduce):
    readme, replication = reproduce.RECIPES["conve-authors-fb15k237"], reproduce.RECIPES["conve-authors-hd05-fb15k237"]
    assert replication.settings == readme.settings
    assert replication.model_args == {**readme.model_args, "output_dropout": 0.5}  # their --hidden-drop 0.5


def test_the_libkge_conve_recipe_has_its_aspect_ratio_two(reproduce):
    model = build_model("conve", 30, 4, **reproduce.RECIPES["conve-libkge-fb15k237"].model_args)
    assert (model.embedding_height, model.embedding_width) == (12, 24)  # LibKGE: sqrt(288 / 2) x 2 sqrt(288 / 2)
    assert model.fc.in_features == 32 * 22 * 22  # 32 channels of 3 x 3 over the [24 x 24] stack


def test_the_result_names_the_threads_the_run_trained_with(reproduce):
    assert reproduce.trained_threads([{"threads": 1}, {"threads": 2}], {"threads": 1}, 4) == 2  # the last session's
    assert reproduce.trained_threads([{"seconds": 5.0}], {"threads": 1}, 4) == 1  # sessions from before they said
    assert reproduce.trained_threads([], {"threads": 0}, 4) == 4  # 0: torch's default, this process's


def test_the_table_names_the_processor_where_the_result_does(reproduce):
    assert reproduce.processor_label({"processor": "Intel(R) Xeon(R) Processor"}) == "Intel Xeon"
    assert reproduce.processor_label({"processor": "AMD EPYC 9B45 128-Core Processor"}) == "AMD EPYC 9B45 128-Core"
    assert reproduce.processor_label({"processor": "x86_64"}) == "CPU"  # results that kept the architecture only


def test_a_runs_hours_are_its_sessions_or_its_epochs_where_a_session_went_unrecorded(reproduce):
    assert reproduce.run_hours({"wall_seconds": 7200.0, "train_seconds": 6000.0}) == 2.0  # all sessions recorded
    assert reproduce.run_hours({"wall_seconds": 3600.0, "train_seconds": 5400.0}) == 1.5  # one was killed
    assert reproduce.run_hours({"wall_seconds": 0, "train_seconds": 1800.0}) == 0.5  # none recorded


def test_a_recipe_pauses_writes_its_result_and_resumes(reproduce, tmp_path, monkeypatch, capsys):
    recipe = reproduce.Recipe("tiny-nations", "nations", {"model": "distmult", "epochs": 4, "eval_every": 2,
                              "patience": 3, "batch_size": 64}, 0.5, "a test", model_args={"embedding_dim": 8})
    monkeypatch.setitem(reproduce.RECIPES, recipe.name, recipe)
    argv = ["tiny-nations", "--device", "cpu", "--threads", "1", "--runs", str(tmp_path / "runs"),
            "--results", str(tmp_path / "results")]
    assert reproduce.main([*argv, "--hours", "1e-9"]) == 0  # pauses after the first epoch
    result = json.loads((tmp_path / "results" / "tiny-nations.json").read_text())
    assert (result["status"], result["epochs"]) == ("paused", 1)
    assert reproduce.main([*argv, "--snapshot"]) == 0  # trains nothing; no process trains it: paused
    result = json.loads((tmp_path / "results" / "tiny-nations.json").read_text())
    assert (result["status"], result["epochs"]) == ("paused", 1)
    assert held_elsewhere(tmp_path / "runs" / "tiny-nations", lambda: reproduce.snapshot_status(
        tmp_path / "runs" / "tiny-nations")) == "in progress"  # as while another process trains it
    assert reproduce.main(argv) == 0
    result = json.loads((tmp_path / "results" / "tiny-nations.json").read_text())
    assert (result["status"], result["epochs"]) == ("finished", 4)
    assert [point["epoch"] for point in result["curve"]] == [1, 2, 3, 4]
    assert reproduce.snapshot_status(tmp_path / "runs" / "tiny-nations") == "finished"
    assert {"valid_head_mrr", "valid_tail_mrr"} <= set(result["curve"][1])
    assert set(result["test"]) == {"head", "tail", "both"}
    assert result["target"]["mrr"] == result["test"]["both"]["mrr"]
    assert result["target"]["reached"] == (result["target"]["mrr"] >= 0.5)
    sessions = [json.loads(line) for line in (tmp_path / "runs" / "tiny-nations" / "reproduce_sessions.jsonl")
                .read_text().splitlines()]
    assert [s["threads"] for s in sessions] == [1, 1] and result["machine"]["threads"] == 1
    capsys.readouterr()
    assert reproduce.main(["--table", "--results", str(tmp_path / "results")]) == 0
    table = capsys.readouterr().out.splitlines()
    cpu = reproduce.processor_label(result["machine"])
    assert len(table) == 3 and table[2].startswith(f"| tiny-nations | {cpu}, 1 thread(s) | finished | 4 (")


def test_a_seed_names_a_run_of_its_own(reproduce, tmp_path, monkeypatch):
    recipe = reproduce.Recipe("tiny-nations", "nations", {"model": "distmult", "epochs": 2, "eval_every": 1,
                              "patience": 3, "batch_size": 64}, 0.5, "a test", model_args={"embedding_dim": 8})
    monkeypatch.setitem(reproduce.RECIPES, recipe.name, recipe)
    argv = ["tiny-nations", "--device", "cpu", "--threads", "1", "--runs", str(tmp_path / "runs"),
            "--results", str(tmp_path / "results"), "--hours", "1e-9"]
    assert reproduce.main([*argv, "--seed", "3", "--name", "tiny-seed3"]) == 0
    result = json.loads((tmp_path / "results" / "tiny-seed3.json").read_text())
    assert result["config"]["seed"] == 3 and result["epochs"] == 1
    with pytest.raises(SystemExit, match="seed: run 3, recipe 0"):  # resuming it as seed 0's run
        reproduce.main([*argv, "--name", "tiny-seed3"])
    assert reproduce.main([*argv, "--seed", "3", "--name", "tiny-seed3"]) == 0  # its own seed resumes it
    assert json.loads((tmp_path / "results" / "tiny-seed3.json").read_text())["epochs"] == 2


def held_elsewhere(folder: Path, call):
    """``call()`` while another process holds ``folder``'s lock (the lock is re-entrant within one process)."""
    code = ("import sys, time\nfrom kgtrace.core.owned import folder_lock\nwith folder_lock(sys.argv[1]):\n"
            "    print('held', flush=True)\n    time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        return call()
    finally:
        holder.kill()
        holder.wait()
