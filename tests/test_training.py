"""Training runs: determinism, resume after a kill, run-folder safety, checkpoints."""

import json
import time

import pytest
import torch
from badinput import refused

from kgtrace.core.checkpoint import load_checkpoint
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError, DataError, KgtraceError
from kgtrace.core.io import atomic_path, remove_stale_temporaries
from kgtrace.models import build_model
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import FUSED_DEVICES, make_optimizer, resume, train, truncate_metrics

SMALL = {"embedding_dim": 16, "embedding_height": 4, "output_channels": 4}


def small_config(**kw):
    base = dict(dataset="nations", model="conve", model_args=SMALL, epochs=3, batch_size=64, seed=3,
                checkpoint_every=1, eval_every=1, threads=1, device="cpu")
    return TrainConfig(**{**base, **kw})


def weights(path):
    return load_checkpoint(path)["model_state"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_same_seed_same_weights(tmp_path):
    train(small_config(), tmp_path / "a", progress=False, log=lambda *_: None)
    train(small_config(), tmp_path / "b", progress=False, log=lambda *_: None)
    assert_same_weights(weights(tmp_path / "a/checkpoints/epoch-0003.pt"), weights(tmp_path / "b/checkpoints/epoch-0003.pt"))


def test_run_folder_contents_and_load_run(tmp_path):
    result = train(small_config(), tmp_path / "run", progress=False, log=lambda *_: None)
    out = tmp_path / "run"
    for name in ("config.yaml", "node_dict", "rel_dict", "metrics.jsonl", "training_curve.png",
                 "checkpoints/best.pt", "checkpoints/epoch-0001.pt"):
        assert (out / name).exists(), name
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert all({"loss", "lr", "seconds", "valid_mrr"} <= r.keys() for r in records)
    run = load_run(out)
    assert run.dataset.num_entities == 14 and not run.model.training
    assert [c.epoch for c in run.checkpoints] == [1, 2, 3]
    assert all(c.lr == pytest.approx(1e-3) for c in run.checkpoints)
    assert run.checkpoint.name == "best.pt"
    assert load_checkpoint(run.checkpoint)["epoch"] == result.best_epoch


def test_lr_decay_is_recorded_per_checkpoint(tmp_path):
    train(small_config(lr_decay=0.5, eval_every=0), tmp_path / "run", progress=False, log=lambda *_: None)
    lrs = [c.lr for c in load_run(tmp_path / "run").checkpoints]
    assert lrs == pytest.approx([1e-3, 5e-4, 2.5e-4])


def test_refuses_non_empty_folder_and_foreign_overwrite(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    with pytest.raises(KgtraceError, match="not empty"):
        train(small_config(), tmp_path / "mine", progress=False, log=lambda *_: None)
    with pytest.raises(KgtraceError, match="not written by kgtrace"):
        train(small_config(), tmp_path / "mine", overwrite=True, progress=False, log=lambda *_: None)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"


def test_resume_refuses_changed_settings(tmp_path):
    train(small_config(epochs=1), tmp_path / "run", progress=False, log=lambda *_: None)
    with pytest.raises(ConfigError, match="lr=0.1: the run was trained with 0.001; a resumed run keeps its settings"):
        resume(tmp_path / "run", lr=0.1, progress=False, log=lambda *_: None)
    # The training command repeated with --resume: equal values are accepted, the dataset as given or as recorded.
    resume(tmp_path / "run", lr=0.001, dataset="nations", model="conve", epochs=2, progress=False, log=lambda *_: None)
    assert [json.loads(ln)["epoch"] for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_checkpoint_with_other_id_maps_is_refused(tmp_path):
    train(small_config(epochs=1), tmp_path / "run", progress=False, log=lambda *_: None)
    lines = (tmp_path / "run" / "node_dict").read_text().splitlines()
    a, b = lines[0].split("\t"), lines[1].split("\t")
    lines[0], lines[1] = f"{b[0]}\t{a[1]}", f"{a[0]}\t{b[1]}"  # swap two labels' ids
    (tmp_path / "run" / "node_dict").write_text("\n".join(lines) + "\n")
    with pytest.raises(KgtraceError, match="entities id map differs"):
        load_run(tmp_path / "run")


def test_config_collects_every_problem():
    with pytest.raises(ConfigError) as err:
        TrainConfig(epochs=0, lr=-1.0, precision="fp8", model="hole").validate()
    text = str(err.value)
    for key in ("epochs=0", "lr=-1.0", "precision='fp8'", "model='hole'"):
        assert key in text


def test_bf16_autocast_trains_on_cpu(tmp_path):
    result = train(small_config(precision="bf16", epochs=2), tmp_path / "run", progress=False, log=lambda *_: None)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert result.epochs_completed == 2 and all(r["loss"] == r["loss"] for r in records)  # no NaN
    assert records[1]["loss"] < records[0]["loss"]


def test_fp16_on_cpu_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="fp16"):
        train(small_config(precision="fp16"), tmp_path / "run", progress=False, log=lambda *_: None)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("mode,chunk", [("1vsall", 0), ("kvsall", 5), ("kvsall-ce", 0)])
def test_other_training_modes_learn(tmp_path, mode, chunk):
    config = small_config(model="distmult", model_args={"embedding_dim": 16}, training=mode, entity_chunk=chunk,
                          epochs=4, eval_every=4)
    result = train(config, tmp_path / "run", progress=False, log=lambda *_: None)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["loss"] < records[0]["loss"]
    assert result.best_valid_mrr > 0.3  # Nations has 14 entities: random ranking gives about 0.25


def test_early_stopping_with_patience(tmp_path):
    config = small_config(epochs=30, eval_every=1, patience=1, lr=0.5)  # a rate this high stops improving
    result = train(config, tmp_path / "run", progress=False, log=lambda *_: None)
    assert result.stopped_early and result.epochs_completed < 30
    assert (tmp_path / "run" / f"checkpoints/epoch-{result.epochs_completed:04d}.pt").is_file()


def test_resume_drops_a_torn_last_metrics_line(tmp_path):
    """A kill during the append of epoch 2's record leaves half a line; resume redoes epoch 2 and writes it whole."""
    out = tmp_path / "run"
    train(small_config(epochs=1), out, progress=False, log=lambda *_: None)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "step": 22, "lo')
    resume(out, epochs=2, progress=False, log=lambda *_: None)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    assert (out / "metrics.jsonl").read_text().endswith("}\n")


@pytest.mark.parametrize("torn", ["", '{"epoch": 3'])
def test_truncate_metrics_drops_an_unparsable_last_line_only(tmp_path, torn):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1}\n{"epoch": 2}\n{"epoch": 3, "lo\n' + torn)
    if torn:  # the bad line is no longer the last: refused
        with pytest.raises(DataError, match=r"metrics\.jsonl:3: not a JSON record"):
            truncate_metrics(tmp_path, 2)
        return
    truncate_metrics(tmp_path, 2)
    assert path.read_text() == '{"epoch": 1}\n{"epoch": 2}\n'


def test_resume_refuses_a_corrupt_metrics_line_in_the_middle(tmp_path):
    out = tmp_path / "run"
    train(small_config(epochs=2), out, progress=False, log=lambda *_: None)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text(lines[0][:20] + "\n" + lines[1])
    refused(["train", "--resume", "--out", out, "--epochs", "3", "--no-progress"], watch=out,
            mentions=[f"{out / 'metrics.jsonl'}:1", "Fix:"])


STALE = [".epoch-0002.pt.k3j_9x0a.tmp", ".best.pt.abcdefgh.tmp"]  # as atomic_path names its temporary files
NOT_STALE = [".epoch-0002.pt.tmp", ".epoch-0002.pt.k3j_9x0.tmp", ".epoch-0002.pt.K3J_9X0A.tmp",
             "epoch-0002.pt.k3j_9x0a.tmp", ".epoch-0002.pt.k3j_9x0a.tmp.bak", "my.epoch-0002.pt.k3j_9x0a.tmp"]


def test_remove_stale_temporaries_takes_atomic_paths_names_only(tmp_path):
    for name in STALE + NOT_STALE:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".notes.abcdefgh.tmp").mkdir()  # a folder, not a temporary file
    with atomic_path(tmp_path / "epoch-0003.pt") as written:  # a name as mkstemp draws it
        names = [written.name]
    (tmp_path / names[0]).write_bytes(b"x")  # as if that write had been killed
    assert remove_stale_temporaries(tmp_path) == sorted(STALE + names)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(NOT_STALE + [".notes.abcdefgh.tmp", "epoch-0003.pt"])
    (tmp_path / ".a.json.abcdefgh.tmp").write_bytes(b"x")
    (tmp_path / ".b.json.abcdefgh.tmp").write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path, ["a.json"]) == [".a.json.abcdefgh.tmp"]
    assert (tmp_path / ".b.json.abcdefgh.tmp").exists()
    assert remove_stale_temporaries(tmp_path / "absent") == []


def test_resume_removes_the_temporary_files_of_killed_writes(tmp_path):
    out = tmp_path / "run"
    train(small_config(epochs=1), out, progress=False, log=lambda *_: None)
    for name in STALE + NOT_STALE:
        (out / "checkpoints" / name).write_bytes(b"x" * 100)
    (out / ".metrics.jsonl.q1w2e3r4.tmp").write_text("{}")  # training's own file: stale
    (out / ".explain.json.q1w2e3r4.tmp").write_text("{}")  # may be a live kgtrace explain's: kept
    logs = []
    resume(out, epochs=2, progress=False, log=logs.append)
    assert f"{out}: removed 3 temporary file(s) left by killed writes" in logs
    left = {p.name for p in (out / "checkpoints").iterdir()}
    assert not left & set(STALE) and set(NOT_STALE) <= left
    assert not (out / ".metrics.jsonl.q1w2e3r4.tmp").exists() and (out / ".explain.json.q1w2e3r4.tmp").exists()


def test_a_deadline_pauses_at_an_epoch_and_resume_ends_as_one_run(tmp_path):
    """A deadline already past pauses after the first epoch (checkpointed, though checkpoint_every is 3, and
    not validated out of turn); resuming ends with the weights, metrics and best epoch of one uninterrupted run."""
    config = small_config(epochs=4, eval_every=2, checkpoint_every=3)
    paused = train(config, tmp_path / "paused", progress=False, log=lambda *_: None, deadline=time.monotonic())
    assert paused.stopped_at_deadline and paused.epochs_completed == 1
    assert (tmp_path / "paused" / "checkpoints" / "epoch-0001.pt").is_file()
    again = resume(tmp_path / "paused", progress=False, log=lambda *_: None, deadline=time.monotonic())
    assert again.stopped_at_deadline and again.epochs_completed == 2
    done = resume(tmp_path / "paused", progress=False, log=lambda *_: None)
    whole = train(config, tmp_path / "whole", progress=False, log=lambda *_: None)
    assert not done.stopped_at_deadline and (done.epochs_completed, done.best_epoch) == (4, whole.best_epoch)
    assert_same_weights(weights(tmp_path / "paused/checkpoints/epoch-0004.pt"),
                        weights(tmp_path / "whole/checkpoints/epoch-0004.pt"))
    records = [json.loads(ln) for ln in (tmp_path / "paused" / "metrics.jsonl").read_text().splitlines()]
    wholes = [json.loads(ln) for ln in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert [r.get("valid_mrr") for r in records] == [r.get("valid_mrr") for r in wholes]
    assert {"valid_head_mrr", "valid_tail_mrr"} <= set(records[1])


def test_adagrad_and_plateau_decay_follow_validation_and_resume_exactly(tmp_path):
    """lr_patience 1: the rate is multiplied by lr_decay after each validation without a better MRR, and
    only then; a paused and resumed run keeps the scheduler's counters (same rates, same weights)."""
    config = small_config(epochs=6, eval_every=1, optimizer="adagrad", lr=0.5, lr_decay=0.5, lr_patience=1)
    whole = tmp_path / "whole"
    train(config, whole, progress=False, log=lambda *_: None)
    records = [json.loads(ln) for ln in (whole / "metrics.jsonl").read_text().splitlines()]
    lr, best, bad = 0.5, -1.0, 0
    for record in records:  # the rate an epoch trained with follows from the validations before it
        assert record["lr"] == pytest.approx(lr)
        if record["valid_mrr"] > best * (1 + 1e-4):  # ReduceLROnPlateau's relative threshold
            best, bad = record["valid_mrr"], 0
        else:
            bad += 1
        if bad > 1:  # more than lr_patience validations without a better MRR
            lr, bad = lr * 0.5, 0
    assert records[-1]["lr"] < 0.5, "the test needs a decay to happen"
    assert "Adagrad" in type_name_of_optimizer(whole)
    paused = tmp_path / "paused"
    train(config, paused, progress=False, log=lambda *_: None, deadline=time.monotonic())
    resume(paused, progress=False, log=lambda *_: None)
    assert_same_weights(weights(paused / "checkpoints/epoch-0006.pt"), weights(whole / "checkpoints/epoch-0006.pt"))


def type_name_of_optimizer(run):
    state = load_checkpoint(run / "checkpoints/epoch-0006.pt")["optimizer_state"]
    return "Adagrad" if "sum" in state["state"][0] else "Adam"


def test_lr_patience_needs_validation():
    with pytest.raises(ConfigError, match="lr_patience=2: counts validations, but eval_every is 0"):
        TrainConfig(lr_patience=2, eval_every=0).validate()
    with pytest.raises(ConfigError, match="optimizer='sgd'"):
        TrainConfig(optimizer="sgd").validate()


def test_steps_per_epoch_caps_each_epoch(tmp_path):
    """steps_per_epoch 2: two optimizer steps per epoch (Adam counts them), each epoch over a fresh shuffle."""
    out = tmp_path / "capped"
    train(small_config(epochs=2, batch_size=16, steps_per_epoch=2), out, progress=False, log=lambda *_: None)
    state = load_checkpoint(out / "checkpoints/epoch-0002.pt")["optimizer_state"]["state"]
    assert {int(s["step"]) for s in state.values()} == {4}
    with pytest.raises(ConfigError, match="steps_per_epoch=-1: must be 0 or more"):
        TrainConfig(steps_per_epoch=-1).validate()


def test_a_last_batch_of_one_is_left_out_only_for_batch_norm(tmp_path):
    from kgtrace.data.dataset import load_dataset
    from kgtrace.training.batches import Batches
    from kgtrace.training.step import epoch_batches

    ds = load_dataset("nations")
    n = len(Batches.build(ds.train, ds.num_relations, "kvsall"))
    config = TrainConfig(dataset="nations", model="conve", model_args={"embedding_dim": 16, "embedding_height": 4,
                                                                       "output_channels": 4},
                         batch_size=n - 1, epochs=1, eval_every=0, threads=1, device="cpu")
    # ConvE's batch norm cannot train on one example: this used to stop training with a ValueError.
    train(config, tmp_path / "run", progress=False, log=lambda *_: None)
    conve = load_run(tmp_path / "run").model
    order = torch.arange(n)
    assert [len(b) for b in epoch_batches(order, config, conve)] == [n - 1]
    distmult = build_model("distmult", ds.num_entities, ds.num_relations, embedding_dim=4)
    assert [len(b) for b in epoch_batches(order, config, distmult)] == [n - 1, 1]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_optimizer_steps_like_the_unfused_one(optimizer, device):
    # The fused kernel is taken only where torch has one (fused Adagrad raises on CUDA at its first step).
    config = TrainConfig(model="distmult", optimizer=optimizer, lr=0.1, weight_decay=0.01)
    model = build_model("distmult", 7, 3, embedding_dim=4).to(device)
    plain = build_model("distmult", 7, 3, embedding_dim=4).to(device)
    plain.load_state_dict(model.state_dict())
    fast = make_optimizer(config, model)
    slow = type(fast)(plain.parameters(), lr=0.1, weight_decay=0.01, foreach=False)
    assert fast.defaults["fused"] == (device in FUSED_DEVICES[type(fast)])
    hrt = torch.tensor([[0, 1, 2], [3, 0, 5]], device=device)
    for net, step in ((model, fast), (plain, slow)):
        for _ in range(3):
            step.zero_grad()
            net.score_hrt(hrt).square().sum().backward()
            step.step()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, plain.state_dict()[key], rtol=1e-5, atol=1e-6)
