"""NTP-lambda's link head: ComplEx on the policy's own embeddings, its loss beside PPO's, and runs that score with it."""

from __future__ import annotations

import json

import pytest
import torch
from mined import mined

from kgtrace.cli import main
from kgtrace.core.errors import ConfigError
from kgtrace.models.complex import ComplEx
from kgtrace.prover.link import LinkHead, link_loss, warm_up
from kgtrace.prover.policy import ProofPolicy
from kgtrace.prover.ppo import resume_policy, train_policy
from kgtrace.prover.run import ProverConfig, load_prover_run
from kgtrace.prover.scorer import HybridScorer, proof_part

E, R, V, DIM = 6, 3, 4, 8


def policy(seed: int = 0) -> ProofPolicy:
    torch.manual_seed(seed)
    return ProofPolicy(E, R, V, DIM, torch.tensor([0, 1, 2]), entity_embeddings=True)


def test_the_head_scores_as_kgtrace_complex_over_the_same_tables():
    p = policy()
    head = LinkHead(p)
    complex_ = ComplEx(E, R, embedding_dim=DIM // 2)
    with torch.no_grad():
        complex_.entity_embeddings.copy_(p.terms.weight[:E])
        complex_.relation_embeddings.copy_(p.relations.weight[:R])
    hr = torch.tensor([[0, 0], [5, 2], [3, 4], [1, 5]])  # relation ids 3..5 are inverses
    rt = torch.tensor([[0, 1], [2, 5]])
    hrt = torch.tensor([[0, 0, 1], [5, 2, 3], [2, 1, 2]])
    torch.testing.assert_close(head.score_t(hr), complex_.score_t(hr), rtol=0, atol=1e-6)
    torch.testing.assert_close(head.score_h(rt), complex_.score_h(rt), rtol=0, atol=1e-6)
    torch.testing.assert_close(head.score_hrt(hrt), complex_.score_hrt(hrt), rtol=0, atol=1e-6)


def test_n3_by_hand():
    p = policy()
    with torch.no_grad():
        p.terms.weight.zero_()
        p.relations.weight.zero_()
        p.terms.weight[0] = torch.tensor([3.0, 0, 0, 0, 4.0, 0, 0, 0])  # one coordinate of modulus 5: 125
        p.terms.weight[1] = torch.tensor([0, 1.0, 0, 0, 0, 0, 0, 0])  # 1
        p.relations.weight[2] = torch.tensor([0, 0, 2.0, 0, 0, 0, 0, 0])  # 8
    head = LinkHead(p)
    with torch.no_grad():
        assert float(head.n3(torch.tensor([[0, 2, 1]]))) == pytest.approx(125 + 8 + 1)
        assert float(head.n3(torch.tensor([[0, 2, 1], [1, 0, 1]]))) == pytest.approx((134 + 2) / 2)


def test_the_loss_trains_the_shared_tables_and_nothing_else():
    p = policy()
    triples = torch.tensor([[0, 0, 1], [2, 1, 3]])
    link_loss(LinkHead(p), triples, n3=0.01).backward()
    assert p.terms.weight.grad[:E].abs().sum() > 0 and p.relations.weight.grad[:R].abs().sum() > 0
    assert p.terms.weight.grad[E:].abs().sum() == 0  # variables' rows: the head reads entities only
    assert p.relations.weight.grad[R:].abs().sum() == 0  # the answer atom's and padding's rows
    assert all(param.grad is None for name, param in p.named_parameters() if name not in ("terms.weight",
                                                                                        "relations.weight"))


def test_warm_up_fits_the_training_triples():
    p = policy()
    train = torch.tensor([[0, 0, 1], [1, 0, 2], [2, 0, 3], [3, 1, 4], [4, 1, 5], [0, 2, 5]])
    head = LinkHead(p)
    losses = warm_up(head, train, epochs=60, lr=0.05, n3=0.0, generator=torch.Generator().manual_seed(0))
    assert losses[-1] < 0.2 * losses[0]
    with torch.no_grad():
        assert torch.equal(head.score_t(train[:, :2]).argmax(1), train[:, 2])


def test_reset_draws_the_heads_rows_only():
    p = policy()
    variables, extra_relations = p.terms.weight[E:].clone(), p.relations.weight[R:].clone()
    LinkHead(p).reset(1e-3, torch.Generator().manual_seed(0))
    entities, relations = p.terms.weight.detach()[:E], p.relations.weight.detach()[:R]
    assert 0 < float(entities.abs().max()) < 5e-3 and 0 < float(relations.abs().max()) < 5e-3
    assert torch.equal(p.terms.weight[E:], variables) and torch.equal(p.relations.weight[R:], extra_relations)


def test_settings_that_cannot_hold_a_head_are_reported_together():
    with pytest.raises(ConfigError) as error:
        ProverConfig(method="bfs", link_weight=1.0, embedding_dim=7, embedding_run="/x").validate()
    text = str(error.value)
    for key in ("method policy", "entity_embeddings true", "embedding_dim=7", "embedding_run=/x"):
        assert key in text
    with pytest.raises(ConfigError, match="link_epochs=5: trains the link head, which needs link_weight > 0"):
        ProverConfig(link_epochs=5).validate()
    assert ProverConfig(method="policy", link_weight=1.0, entity_embeddings=True).validate().hybrid()
    assert not ProverConfig().hybrid()


def link_config(**more) -> ProverConfig:
    return ProverConfig(dataset="nations", method="policy", rules="mined", depth=2, embedding_dim=8, chunk_queries=512,
                        corruptions=1, eval_triples=10, eval_corruptions=3, beam_width=2, threads=1,
                        entity_embeddings=True, link_weight=1.0, link_epochs=3, hybrid_weight=2.0, **more)


@pytest.fixture(scope="module")
def nations():
    return mined("nations", 3)


def test_a_run_with_a_head_scores_its_logit_plus_the_weighted_proof_part(tmp_path, nations):
    ds, rules = nations
    logs: list[str] = []
    train_policy(link_config(epochs=1), ds, rules, tmp_path / "run", progress=False, log=logs.append)
    assert any(line.startswith("link head: 3 passes alone") for line in logs)
    record = json.loads((tmp_path / "run/metrics.jsonl").read_text())
    assert record["link_loss"] > 0
    run = load_prover_run(tmp_path / "run")
    assert isinstance(run.model, HybridScorer) and run.model.weight == 2.0
    policy = run.model.prover.policy
    assert run.model.embedding.policy is policy  # the head reads the policy's own tables
    hr = torch.cat([ds.test[:4, :2], torch.stack([ds.test[:4, 2], ds.test[:4, 1] + ds.num_relations], 1)])
    expected = LinkHead(policy).score_t(hr) + 2.0 * proof_part(run.model.prover.score_t(hr), 1.0)
    torch.testing.assert_close(run.model.score_t(hr), expected.detach(), rtol=0, atol=0)


def test_a_run_killed_before_its_first_checkpoint_starts_afresh_with_its_warm_up(tmp_path, nations):
    ds, rules = nations
    quiet = dict(progress=False, log=lambda *_: None)
    train_policy(link_config(epochs=1), ds, rules, tmp_path / "whole", **quiet)
    train_policy(link_config(epochs=1), ds, rules, tmp_path / "killed", **quiet)
    for path in (tmp_path / "killed/checkpoints").iterdir():  # as if killed during the first epoch
        path.unlink()
    (tmp_path / "killed/metrics.jsonl").unlink()
    resume_policy(tmp_path / "killed", **quiet)
    whole = torch.load(tmp_path / "whole/checkpoints/epoch-0001.pt", weights_only=True)["policy_state"]
    again = torch.load(tmp_path / "killed/checkpoints/epoch-0001.pt", weights_only=True)["policy_state"]
    for key, value in whole.items():
        assert torch.equal(value, again[key]), key


def test_prove_train_with_a_head_then_weigh(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["prove", "train", "--dataset", "nations", "--mine", "--max-rules-per-head", "3", "--epochs", "1",
                 "--depth", "2", "--chunk-queries", "512", "--corruptions", "1", "--embedding-dim", "8",
                 "--beam-width", "2", "--eval-triples", "10", "--eval-corruptions", "3", "--threads", "1",
                 "--link-weight", "1", "--link-epochs", "2", "--out", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert '"entity_embeddings": true' in out and f"kgtrace prove weigh {run}" in out
    assert main(["prove", "weigh", str(run), "--valid-triples", "20", "--weights", "0,1,4", "--device", "cpu"]) == 0
    chosen = json.loads((run / "hybrid-weight.json").read_text())["weight"]
    assert load_prover_run(run).model.weight == chosen


def test_a_resumed_policy_run_drops_a_torn_last_metrics_line(tmp_path, nations):
    ds, rules = nations
    quiet = dict(progress=False, log=lambda *_: None)
    out = tmp_path / "run"
    train_policy(link_config(epochs=1), ds, rules, out, **quiet)
    with open(out / "metrics.jsonl", "a") as f:  # as if killed while appending epoch 2's record
        f.write('{"epoch": 2, "step": 4, "lo')
    resume_policy(out, epochs=2, **quiet)
    assert [json.loads(x)["epoch"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_resumed_policy_run_removes_the_temporary_files_of_killed_writes(tmp_path, nations):
    ds, rules = nations
    out = tmp_path / "run"
    train_policy(link_config(epochs=1), ds, rules, out, progress=False, log=lambda *_: None)
    (out / "checkpoints" / ".epoch-0002.pt.abcd1234.tmp").write_bytes(b"x")
    (out / ".prover.yaml.abcd1234.tmp").write_bytes(b"x")
    (out / "checkpoints" / ".epoch-0002.pt.tmp").write_bytes(b"x")  # not a name atomic_path gives
    logs = []
    resume_policy(out, epochs=1, progress=False, log=logs.append)
    assert f"{out}: removed 2 temporary file(s) left by killed writes" in logs
    assert sorted(p.name for p in out.rglob(".*")) == [".epoch-0002.pt.tmp", ".kgtrace", ".kgtrace.files",
                                                          ".kgtrace.lock"]
