"""torch.distributed: two gloo processes on the CPU give one process's results, and a failing one stops the job.

Multi-process tests launch ``torchrun --nproc-per-node 2`` (or two plain processes for the
failure test) with one thread each, and compare with the same work done here on one thread:
evaluation metrics and per-query ranks exactly, TracIn influences within 1e-5 relative with
identical top-k, training losses within float rounding.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from kgtrace.attribution import TracIn
from kgtrace.attribution import topk as topk_module
from kgtrace.attribution.topk import RunningTopK
from kgtrace.cli import main
from kgtrace.compute.distributed import World, block_split, world_from_env
from kgtrace.core.checkpoint import load_checkpoint
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError
from kgtrace.data.answers import AnswerIndex
from kgtrace.data.dataset import load_dataset
from kgtrace.evaluation import sharded
from kgtrace.evaluation.evaluate import Candidates, rank_queries, rank_side_with
from kgtrace.evaluation.sides import SideQueries, side_queries
from kgtrace.models import build_model
from kgtrace.runs.embedding import load_run
from kgtrace.training.batches import Batches
from kgtrace.training.loop import train
from kgtrace.training.sharded import part_of_batch
from kgtrace.training.step import batch_loss

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="this torch build has no gloo backend")

SRC = Path(__file__).resolve().parents[1] / "src"
JOB = Path(__file__).with_name("distributed_job.py")
SMALL_CONVE = {"embedding_dim": 16, "embedding_height": 4, "output_channels": 4}
BUDGET = "32KB"  # UMLS's 135 entities: 15 queries per chunk, so each side is split into many chunks


def env() -> dict[str, str]:
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # CUDA hidden: these are gloo-on-CPU tests, also on a machine with fewer GPUs than processes.
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "KGTRACE_DIST_TIMEOUT": "120",
            "CUDA_VISIBLE_DEVICES": ""}


def torchrun(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.fixture(scope="module")
def umls_run(tmp_path_factory):
    """A tiny ConvE on UMLS with two epoch checkpoints; 5,216 training triples are two TracIn chunks of 4,096."""
    out = tmp_path_factory.mktemp("dist") / "run"
    config = TrainConfig(dataset="umls", model="conve", model_args=SMALL_CONVE, epochs=2, checkpoint_every=1,
                         eval_every=0, threads=1, device="cpu")
    train(config, out, progress=False, log=lambda *_: None)
    return out


# ----------------------------------------------------------------------------- in one process


def test_block_split_gives_whole_blocks_in_order():
    assert block_split(100, 15, 2) == [60, 40]  # 7 blocks: 4 + 3, the last block short
    assert block_split(100, 15, 3) == [45, 30, 25]
    assert block_split(10, 15, 3) == [10, 0, 0]  # one block: the first process ranks it all
    assert block_split(0, 15, 2) == [0, 0]
    for n, block, parts in ((1000, 7, 4), (31, 1, 5), (64, 8, 8)):
        sizes = block_split(n, block, parts)
        assert sum(sizes) == n and all(s % block == 0 for s in sizes[:-1] if s)


def test_world_from_torchrun_variables():
    assert world_from_env({}) == World()
    assert world_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == World(3, 4, 1)
    with pytest.raises(ConfigError) as e:
        world_from_env({"RANK": "4", "WORLD_SIZE": "4"})
    assert "RANK=4" in str(e.value)
    with pytest.raises(ConfigError) as e:
        world_from_env({"RANK": "x", "WORLD_SIZE": "2"})
    assert "RANK='x'" in str(e.value) and "torchrun" in str(e.value)


def test_commands_of_one_process_refuse_torchrun(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(["summarize", str(tmp_path), "--out", str(tmp_path / "s.tsv")]) == 2
    err = capsys.readouterr().err
    assert "runs in one process" in err and "without torchrun" in err


def test_merged_top_k_equals_one_stream():
    """Three processes' running top-k over disjoint columns merge into one stream's, ties to the lower column."""
    torch.manual_seed(0)
    parts = torch.randint(-3, 4, (2, 5, 60)).float()  # [C, n, train]: many ties among few values
    columns = torch.arange(60)
    for largest in (True, False):
        one = RunningTopK(5, 7, 2, largest)
        for chunk in columns.split(9):
            one.update(parts[:, :, chunk], chunk)
        shards = []
        for rank in range(3):  # process r streams every third chunk, as TracIn assigns them
            r = RunningTopK(5, 7, 2, largest)
            for chunk in list(columns.split(9))[rank::3]:
                r.update(parts[:, :, chunk], chunk)
            shards.append(r)
        shards[1].merge([shards[0].state(), shards[2].state()])
        assert torch.equal(shards[1].columns, one.columns) and torch.equal(shards[1].values, one.values)
        assert torch.equal(shards[1].parts, one.parts)


@pytest.mark.parametrize("mode, chunk", [("kvsall", 0), ("kvsall", 5), ("kvsall-ce", 0), ("1vsall", 0)])
def test_parts_of_a_batch_give_the_whole_batch_gradient(mode, chunk):
    """Each process divides by the whole batch's rows over N; averaging N gradients (DDP) gives one process's."""
    ds = load_dataset("nations")
    torch.manual_seed(0)
    model = build_model("distmult", ds.num_entities, ds.num_relations, embedding_dim=8)
    batches = Batches.build(ds.train, ds.num_relations, mode)
    config = TrainConfig(dataset="nations", model="distmult", training=mode, entity_chunk=chunk)
    pos = torch.randperm(len(batches))[:37]

    def loss_and_grads(rows, batch_rows=None):
        model.zero_grad()
        loss = batch_loss(model, batches, rows, config, torch.device("cpu"), batch_rows=batch_rows)
        if loss.requires_grad:
            loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    whole_loss, whole_grads = loss_and_grads(pos)
    size = 3
    losses, grads = [], []
    for rank in range(size):
        part, parts = part_of_batch(pos, World(rank, size))
        assert parts == size and len(part) in (12, 13)
        loss, g = loss_and_grads(part, len(pos) / parts)
        losses.append(loss)
        grads.append(g)
    assert torch.allclose(sum(losses) / size, whole_loss, rtol=1e-6)
    for i, whole in enumerate(whole_grads):
        torch.testing.assert_close(sum(g[i] for g in grads) / size, whole, rtol=1e-5, atol=1e-8)


def test_short_batch_is_not_cut():
    for rank in (0, 1):  # 3 rows cannot give each of 2 processes the 2 rows batch norm needs: both take all
        part, parts = part_of_batch(torch.arange(10, 13), World(rank, 2))
        assert torch.equal(part, torch.arange(10, 13)) and parts == 1
    assert torch.equal(part_of_batch(torch.arange(8), World(1, 2))[0], torch.tensor([1, 3, 5, 7]))


@pytest.mark.parametrize("corruptions", [0, 20])
def test_parts_at_chunk_bounds_rank_as_one_process(umls_run, corruptions):
    """Without processes: each part, ranked from its global offset, gives exactly one process's counts."""
    run = load_run(umls_run)
    ds = run.dataset
    known = AnswerIndex.build(ds.known_triples("test"), ds.num_relations)
    candidates = Candidates(corruptions, seed=3)
    budget = 32 << 10
    for side in ("head", "tail"):
        sq = side_queries(ds.test, ds.num_relations, side)
        whole = rank_side_with(run.model, sq, known, candidates, memory_budget=budget, device=torch.device("cpu"))
        chunk = sharded.queries_per_chunk(run.model, candidates, budget, len(sq.answers))
        sizes = block_split(len(sq.answers), chunk, 3)
        assert sizes[2] > 0  # every part ranks something
        starts = [sum(sizes[:r]) for r in range(3)]
        parts = [rank_side_with(run.model, SideQueries(side, sq.queries[s : s + n], sq.answers[s : s + n], offset=s),
                                known, candidates, memory_budget=budget, device=torch.device("cpu"))
                 for s, n in zip(starts, sizes)]
        for name in ("greater", "equal", "num_candidates"):
            assert torch.equal(torch.cat([getattr(p, name) for p in parts]), getattr(whole, name)), (side, name)


# ----------------------------------------------------------------------------- two processes


def test_evaluate_with_two_processes_equals_one(umls_run, tmp_path, torch_threads):
    args = ["evaluate", str(umls_run), "--memory-budget", BUDGET, "--corruptions", "20", "--device", "cpu"]
    done = torchrun("-m", "kgtrace", *args, "--out", str(tmp_path / "two.json"),
                    "--per-query", str(tmp_path / "two.tsv"))
    assert done.stdout.count("filtered test metrics") == 1  # only rank 0 prints
    torch_threads(1)  # as each of the two processes; a BLAS product's rounding may depend on it
    assert main([*args, "--out", str(tmp_path / "one.json"), "--per-query", str(tmp_path / "one.tsv")]) == 0
    assert json.loads((tmp_path / "two.json").read_text()) == json.loads((tmp_path / "one.json").read_text())
    assert (tmp_path / "two.tsv").read_bytes() == (tmp_path / "one.tsv").read_bytes()


def test_a_command_frees_its_process_group(umls_run, tmp_path):
    # Building the checkpoint's ConvE on the meta device imports torch._dynamo and with it
    # torch.distributed.fsdp, whose ShardedGradScaler binds dist.group.WORLD as a default argument
    # when imported. Imported mid-command, it kept the group (and its gloo threads) alive past
    # destroy_process_group, to be torn down with the interpreter: rank 1 aborted now and then.
    torchrun(str(JOB), "teardown", "evaluate", str(umls_run), "--memory-budget", BUDGET, "--device", "cpu",
             "--out", str(tmp_path / "m.json"))


def test_explain_with_two_processes_equals_one(umls_run, tmp_path, torch_threads):
    args = ["explain", str(umls_run), "--test", "6", "--top-k", "5", "--method", "tracin", "--device", "cpu", "--no-progress"]
    torchrun("-m", "kgtrace", *args, "--out", str(tmp_path / "two.json"))
    torch_threads(1)  # as each of the two processes; a BLAS product's rounding may depend on it
    assert main([*args, "--out", str(tmp_path / "one.json")]) == 0
    two, one = (json.loads((tmp_path / f"{n}.json").read_text())["explanations"] for n in ("two", "one"))
    assert len(two) == len(one) == 6
    for a, b in zip(two, one):
        for kind in ("proponents", "opponents"):
            assert [e["train_index"] for e in a[kind]] == [e["train_index"] for e in b[kind]]
            got, want = (torch.tensor([e["influence"] for e in x[kind]]) for x in (a, b))
            assert relative_error(got, want) <= 1e-5
    assert not list(tmp_path.glob("*.state*"))  # the processes' progress files are removed when done


def test_tracin_and_ranking_api_with_two_processes_equal_one(umls_run, tmp_path, torch_threads):
    """Several training chunks per process, and many query chunks per side, through the Python API."""
    torchrun(str(JOB), "api", str(umls_run), str(tmp_path / "two.pt"))
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    run = load_run(umls_run)
    ds = run.dataset
    torch_threads(1)  # as each of the two processes; a BLAS product's rounding may depend on it
    tracin = TracIn(run, chunk_size=700)
    influence, self_influence = tracin.influence(ds.test[:4]), tracin.self_influence()
    top = tracin.top_k(ds.test[:4], k=6)
    ranks = {"all": rank_queries(run.model, ds.test, known=ds.known_triples("test"), memory_budget=32 << 10),
             "sampled": rank_queries(run.model, ds.test, known=ds.known_triples("test"), memory_budget=32 << 10,
                                     candidates=Candidates(corruptions=20, seed=5))}
    assert relative_error(two["influence"], influence) <= 1e-5
    assert relative_error(two["self"], self_influence) <= 1e-5
    for got, want in zip(two["top"], top):
        assert torch.equal(got["proponents"], want.proponents) and torch.equal(got["opponents"], want.opponents)
        assert relative_error(got["proponent_influence"], want.proponent_influence) <= 1e-5
    for name, r in ranks.items():
        for side, counts in r.counts.items():
            for field in ("greater", "equal", "num_candidates"):
                assert torch.equal(two["counts"][name][side][field], getattr(counts, field)), (name, side, field)


def test_train_with_two_processes_follows_one(tmp_path, torch_threads):
    """DistMult (no batch statistics, no dropout); a batch of 173 leaves a last batch of 3 rows, not cut."""
    args = ["train", "--dataset", "umls", "--model", "distmult", "--model-arg", "embedding_dim=16", "--epochs", "3",
            "--batch-size", "173", "--checkpoint-every", "1", "--eval-every", "1", "--memory-budget", BUDGET,
            "--threads", "1", "--device", "cpu", "--no-progress"]
    done = torchrun("-m", "kgtrace", *args, "--out", str(tmp_path / "two"))
    assert done.stdout.count("trained 3 epochs") == 1  # only rank 0 prints
    torch_threads(1)  # as each of the two processes; a BLAS product's rounding may depend on it
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    assert sorted(p.name for p in (tmp_path / "two").rglob("*")) == sorted(p.name for p in (tmp_path / "one").rglob("*"))
    records = [[json.loads(line) for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
               for n in ("two", "one")]
    assert [r["step"] for r in records[0]] == [r["step"] for r in records[1]] == [10, 20, 30]
    for a, b in zip(*records):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["valid_mrr"] == pytest.approx(b["valid_mrr"], abs=1e-3)
    two, one = (load_checkpoint(tmp_path / n / "checkpoints" / "epoch-0003.pt")["model_state"] for n in ("two", "one"))
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(900)  # compiles or trains several runs: minutes on a loaded 2-core machine
def test_compiled_train_with_two_processes_follows_one(tmp_path, torch_threads):
    """--compile under torchrun: each process compiles its part of the batch (87 and 86 rows), same losses."""
    args = ["train", "--dataset", "umls", "--model", "distmult", "--model-arg", "embedding_dim=16", "--epochs", "2",
            "--batch-size", "173", "--eval-every", "1", "--threads", "1", "--device", "cpu", "--no-progress",
            "--compile"]
    done = torchrun("-m", "kgtrace", *args, "--out", str(tmp_path / "two"))
    assert done.stdout.count("compiled train_kvsall (batch 87") == 1  # rank 0's counters, logged once
    assert (tmp_path / "two" / "compile_stats.json").exists()
    torch_threads(1)  # as each of the two processes; a BLAS product's rounding may depend on it
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    records = [[json.loads(line) for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
               for n in ("two", "one")]
    for a, b in zip(*records, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["valid_mrr"] == pytest.approx(b["valid_mrr"], abs=1e-6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failing_process_stops_the_job_with_its_error(umls_run, tmp_path):
    """No launcher to kill the others: rank 1 fails while rank 0 waits for its counts; both exit.

    The collective timeout (1 hour) is far beyond how long the test waits (90 s, then it fails with
    TimeoutExpired): that the processes end at all shows the failure, not the timeout, ended them.
    """
    port = str(free_port())
    args = [sys.executable, str(JOB), "fail", "1", "evaluate", str(umls_run), "--memory-budget", BUDGET,
            "--device", "cpu", "--out", str(tmp_path / "m.json")]
    processes = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**env(), "KGTRACE_DIST_TIMEOUT": "3600", "RANK": str(r), "LOCAL_RANK": str(r),
                                       "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
                 for r in (0, 1)]
    try:
        outputs = [p.communicate(timeout=90) for p in processes]
    finally:
        for p in processes:
            p.kill()
    codes = [p.returncode for p in processes]
    assert codes[1] == 2 and codes[0] != 0, (codes, outputs)
    assert "kgtrace evaluate [rank 1/2]: error: injected failure on rank 1" in outputs[1][1]
    assert "kgtrace evaluate [rank 0/2]: stopped: lost contact with the other processes" in outputs[0][1]
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("largest", [True, False])
def test_running_top_k_equals_one_stable_sort_of_everything(largest, monkeypatch):
    """With and without narrowing each merge to its contenders: the k best of all columns, ties to the lower one."""
    torch.manual_seed(1)
    parts = torch.randint(-4, 5, (3, 6, 5000)).float()  # [C, n, train]: few values, ties everywhere
    totals = parts.double().sum(0)  # [n, train]
    order = torch.argsort(totals, dim=1, descending=largest, stable=True)[:, :12]  # columns ascending among ties
    for prefilter in (4, 10**9):  # narrowed, and two full sorts per merge
        monkeypatch.setattr(topk_module, "PREFILTER", prefilter)
        running = RunningTopK(6, 12, 3, largest)
        for chunk in torch.randperm(5000).split(700):  # chunks of shuffled columns
            running.update(parts[:, :, chunk], chunk)
        assert torch.equal(running.columns, order) and torch.equal(running.values, totals.gather(1, order))
        assert torch.equal(running.parts, parts.permute(1, 2, 0).gather(1, order.unsqueeze(2).expand(-1, -1, 3)))
