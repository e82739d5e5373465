"""The captured training step (kgtrace.training.graphed) against the step by step loop.

On a CPU the program runs uncaptured through the same code; on CUDA (when a GPU is at hand) the
same comparisons run with the graphs captured and replayed.
"""

from __future__ import annotations

import pytest
import torch

from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError
from kgtrace.data.dataset import load_dataset
from kgtrace.training.batches import Batches
from kgtrace.training.graphed import GraphedTraining, batch_pairs, label_mask, pairs_bound, plain_optimizer_state
from kgtrace.training.loop import new_state, plain_scheduler_state
from kgtrace.training.step import run_epoch
from kgtrace.workflows.doctor import TINY_CONVE, norm_error

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_batch_pairs_unpack_each_rows_positives_in_order():
    gen = torch.Generator().manual_seed(0)
    counts_all = torch.randint(0, 6, (40,), generator=gen)
    counts_all[[3, 7]] = 0  # rows without positives
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts_all.cumsum(0)])
    positives = torch.randint(0, 1000, (int(offsets[-1]),), generator=gen)
    pos = torch.randperm(40, generator=gen)[:9]
    starts, counts = offsets[pos], counts_all[pos]
    slots = pairs_bound(counts_all, 9)
    rows, answers, used = batch_pairs(starts, counts, positives, slots)
    expected = [(b, int(a)) for b, p in enumerate(pos.tolist()) for a in positives[offsets[p]:offsets[p + 1]]]
    got = list(zip(rows[used].tolist(), answers[used].tolist()))
    assert got == expected
    assert int(used.sum()) == int(counts.sum()) and slots >= int(counts.sum())
    assert slots == int(counts_all.sort(descending=True).values[:9].sum())
    # the mask holds exactly the positives, also for rows without any
    mask = torch.zeros(9, 1000, dtype=torch.bool)
    mask[[b for b, _ in expected], [a for _, a in expected]] = True
    assert torch.equal(label_mask(rows, answers, used, 9, 1000), mask)


def test_batch_pairs_of_a_batch_without_positives():
    rows, answers, used = batch_pairs(torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([5]), 3)
    assert not used.any() and answers.tolist() == [5, 5, 5]
    assert not label_mask(rows, answers, used, 2, 8).any()


CASES = {  # training mode -> (model, model_args, extra settings)
    "kvsall": ("conve", dict(TINY_CONVE), {}),
    "kvsall-ce": ("distmult", {"embedding_dim": 16}, {"label_smoothing_style": "conve"}),
    "1vsall": ("complex", {"embedding_dim": 8}, {}),
    "negative-sampling": ("conve", dict(TINY_CONVE), {"negatives_tail": 7, "negatives_head": 3}),
}


def epochs_both_ways(device: str, training: str, epochs: int = 2, **extra):
    model, args, settings = CASES[training]
    base = TrainConfig(dataset="umls", model=model, model_args=args, training=training, lr=0.01, epochs=epochs,
                       device=device, threads=1, eval_every=0, **{"batch_size": 100, **settings, **extra})
    dataset = load_dataset("umls")
    batches = Batches.build(dataset.train, dataset.num_relations, training)
    results = {}
    for captured in (False, True):
        config = TrainConfig(**{**base.to_dict(), "compile": captured and base.compile})  # eager: the plain loop
        state = new_state(config, dataset, torch.device(device))
        epoch = GraphedTraining(batches, torch.device(device)) if captured else run_epoch
        losses = []
        for _ in range(epochs):
            losses.append(epoch(state, batches, config, torch.device(device), False))
            state.epoch += 1
            state.scheduler.step()
        results[captured] = (state, losses, epoch)
    return results


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("training", sorted(CASES))
def test_captured_step_trains_as_the_step_by_step_loop(device, training):
    results = epochs_both_ways(device, training, lr_decay=0.5)
    check_same_training(results, device)


@pytest.mark.parametrize("device", DEVICES)
def test_captured_compiled_step_trains_as_the_step_by_step_loop(device):
    """With compile, the per-row loss runs Inductor's kernels inside the captured step (on CUDA, inside its graph)."""
    results = epochs_both_ways(device, "kvsall", compile=True, batch_size=128)  # the graphs compiled_runs compiles
    check_same_training(results, device)
    (_, _, driver) = results[True]
    assert all(p.call is not None and p.call.stats.recompilations == 0 for p in driver.programs.values())


def check_same_training(results, device):
    (eager, eager_losses, _), (graphed, graphed_losses, driver) = results[False], results[True]
    assert graphed.step == eager.step and graphed.step > 0
    # Float rounding apart (the positives' sums, summation order), the same steps on the same batches:
    # the first epoch's loss agrees closely; Adam lets rounding grow a little over the epochs.
    assert graphed_losses[0] == pytest.approx(eager_losses[0], rel=1e-5)
    assert graphed_losses[1] == pytest.approx(eager_losses[1], rel=1e-3)
    a, b = eager.model.state_dict(), graphed.model.state_dict()
    for name in a:
        if a[name].is_floating_point():
            assert norm_error(b[name], a[name]) < 2e-2, name
        else:
            assert torch.equal(b[name], a[name]), name  # batch norm's step counts
    assert float(graphed.optimizer.param_groups[0]["lr"]) == pytest.approx(float(eager.optimizer.param_groups[0]["lr"]))
    if device == "cuda":  # every step after the warm-ups replayed a captured graph
        assert all(p.graph is not None for p in driver.programs.values() if p.runs > 2)


def test_a_remainder_of_one_is_left_out_with_batch_norm_as_in_the_loop():
    dataset = load_dataset("umls")
    batches = Batches.build(dataset.train, dataset.num_relations, "kvsall")
    size = len(batches) - 1  # one full batch and a remainder of one
    config = TrainConfig(dataset="umls", model="conve", model_args=dict(TINY_CONVE), batch_size=size, epochs=1,
                         device="cpu", threads=1, eval_every=0)
    state = new_state(config, dataset, torch.device("cpu"))
    driver = GraphedTraining(batches, torch.device("cpu"))
    driver(state, batches, config, torch.device("cpu"), False)
    assert state.step == 1 and set(driver.programs) == {size} and int(driver.cursor) == size


def test_checkpoints_keep_plain_learning_rates():
    dataset = load_dataset("umls")
    config = TrainConfig(dataset="umls", model="distmult", lr_decay=0.5, device="cpu", eval_every=0)
    state = new_state(config, dataset, torch.device("cpu"))
    for group in state.optimizer.param_groups:  # as a captured run holds them
        group["lr"], group["capturable"] = torch.tensor(group["lr"]), True
    state.optimizer.step()
    state.scheduler.step()
    saved, scheduler = plain_optimizer_state(state.optimizer), plain_scheduler_state(state.scheduler)
    assert saved["param_groups"][0]["lr"] == pytest.approx(0.0005) and type(saved["param_groups"][0]["lr"]) is float
    assert saved["param_groups"][0]["capturable"] is False
    assert scheduler["_last_lr"] == [pytest.approx(0.0005)] and type(scheduler["_last_lr"][0]) is float
    assert isinstance(state.optimizer.param_groups[0]["lr"], torch.Tensor)  # the live optimizer unchanged


def test_settings_the_captured_step_cannot_hold_are_refused_at_once():
    with pytest.raises(ConfigError) as error:
        TrainConfig(captured_step=True, precision="fp16", optimizer="adagrad", training="negative-sampling",
                    negatives_tail=4, sparse=True)
    text = str(error.value)
    for setting in ("precision=fp16", "optimizer=adagrad", "sparse=true"):
        assert setting in text
    assert TrainConfig(captured_step=False, precision="fp16").captured_step is False
    assert TrainConfig(precision="fp16").captured_step_problems()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_run_resumes_as_one_run(tmp_path):
    from kgtrace.core.checkpoint import load_checkpoint
    from kgtrace.training.loop import resume, train

    # validation every epoch, compiled (CUDA graph trees of its own) between the captured steps' replays
    config = TrainConfig(dataset="umls", model="distmult", model_args={"embedding_dim": 16}, epochs=2, lr_decay=0.5,
                         checkpoint_every=1, eval_every=1, device="cuda", captured_step=True, compile=True)
    train(config, tmp_path / "whole", progress=False, log=lambda *_: None)
    train(config.__class__(**{**config.to_dict(), "epochs": 1}), tmp_path / "half", progress=False,
          log=lambda *_: None)
    resume(tmp_path / "half", epochs=2, progress=False, log=lambda *_: None)
    a = load_checkpoint(tmp_path / "whole" / "checkpoints" / "epoch-0002.pt")["model_state"]
    b = load_checkpoint(tmp_path / "half" / "checkpoints" / "epoch-0002.pt")["model_state"]
    for name in a:
        assert norm_error(b[name].float(), a[name].float()) < 1e-5, name


def test_a_step_that_cannot_be_captured_says_so_and_names_the_fix(monkeypatch):
    from contextlib import contextmanager

    from kgtrace.core.errors import KgtraceError
    from kgtrace.training.graphed import WARMUP_STEPS

    dataset = load_dataset("umls")
    batches = Batches.build(dataset.train, dataset.num_relations, "kvsall")
    config = TrainConfig(dataset="umls", model="distmult", model_args={"embedding_dim": 8}, device="cpu",
                         eval_every=0)
    state = new_state(config, dataset, torch.device("cpu"))
    program = GraphedTraining(batches, torch.device("cpu"))._program(128, state, config)
    program.capture, program.runs = True, WARMUP_STEPS  # as on CUDA, past the warm-ups

    @contextmanager
    def refusing(graph):
        raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", refusing)
    with pytest.raises(KgtraceError, match=r"could not be captured as a CUDA graph \(Cannot copy .*--no-captured-step"):
        program.run()


def test_a_new_runs_captured_step_and_compile_are_decided_by_device_and_settings():
    from kgtrace.training.loop import decided

    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # devices as names: nothing runs on them here
    on_cuda = decided(TrainConfig(), cuda)
    assert (on_cuda.captured_step, on_cuda.compile) == (True, False)  # the step is one graph; its loss eager
    asked = decided(TrainConfig(compile=True), cuda)
    assert (asked.captured_step, asked.compile) == (True, True)
    adagrad = decided(TrainConfig(optimizer="adagrad"), cuda)
    assert (adagrad.captured_step, adagrad.compile) == (False, True)  # not capturable: the compiled plain loop
    plain = decided(TrainConfig(), cpu)
    assert (plain.captured_step, plain.compile) == (False, False)
    assert decided(TrainConfig(captured_step=True), cpu).captured_step is True  # asked: the program runs uncaptured
