"""Negative sampling (``--training negative-sampling``) and the table models' LibKGE options
(inverse relations, embedding dropout, uniform initialisation)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from kgtrace.attribution.influence import training_hessian
from kgtrace.attribution.trak import removal_weights
from kgtrace.core.checkpoint import load_checkpoint
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.specs import spec_named
from kgtrace.models import ComplEx, ConvE, DistMult, RotatE, TransE, _tables, build_model
from kgtrace.training import loss
from kgtrace.training.batches import Batches
from kgtrace.training.compiled import negative_sampling_rows as compiled_rows
from kgtrace.training.compiled import step_inputs, train_call
from kgtrace.training.loop import resume, train
from kgtrace.training.loss import draw_candidates, gathers_rows, negative_sampling_reference, negative_sampling_rows

E, R = 23, 4


def triples(n=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, E, (n,), generator=gen), torch.randint(0, R, (n,), generator=gen),
                        torch.randint(0, E, (n,), generator=gen)], dim=1)


def models():
    torch.manual_seed(1)
    return [DistMult(E, R, embedding_dim=6), DistMult(E, R, embedding_dim=6, inverse_relations=True),
            ComplEx(E, R, embedding_dim=3), ComplEx(E, R, embedding_dim=3, inverse_relations=True),
            ConvE(E, R, embedding_dim=8, embedding_height=2, output_channels=2), TransE(E, R, embedding_dim=5),
            RotatE(E, R, embedding_dim=3, margin=2.0)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])  # the softmax cross-entropy, RotatE's self-adversarial loss
@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("negatives", [(4, 3), (5, 0), (0, 2)])
def test_rows_equal_the_per_triple_reference_in_value_and_gradient(negatives, gather, temperature, monkeypatch):
    """Scoring every entity and gathering the candidates' columns, or scoring the candidates' gathered rows,
    equals scoring each (triple, candidate) alone through score_hrt, the head side as (t, r + R, c); also
    every parameter's gradient."""
    monkeypatch.setattr(loss, "gathers_rows", lambda *_: gather)
    hrt = triples()
    torch.manual_seed(3)
    tails, heads = draw_candidates(hrt, *negatives, E)
    for model in models():
        model = model.double().eval()
        twin = copy.deepcopy(model)
        rows = negative_sampling_rows(model, temperature, hrt, tails, heads, torch.ones(len(hrt), dtype=torch.bool))
        rows.mean().backward()
        expected = negative_sampling_reference(twin, hrt, tails, heads, temperature)
        expected.backward()
        torch.testing.assert_close(rows.mean(), expected, rtol=1e-12, atol=1e-12)
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=f"{type(model).__name__} {name}")


def test_rows_are_gathered_when_the_candidates_are_few_beside_the_entities():
    assert not gathers_rows(403, 256, 14_541)  # FB15k-237 with LibKGE's DistMult: score every entity
    assert gathers_rows(257, 200, 1_097_020)  # a ROBOKOP-sized graph: gather each query's candidates
    # a distance model gathers whenever the candidates are fewer than the entities (RotatE's FB15k-237 recipe)
    assert gathers_rows(257, 2_000, 14_505, decodes_by_product=False)
    assert not gathers_rows(20, 8, 14, decodes_by_product=False)
    assert not spec_named("transe").decodes_by_product and not spec_named("rotate").decodes_by_product
    assert spec_named("distmult").decodes_by_product and spec_named("rescal").decodes_by_product


def test_padded_rows_add_nothing():
    model, hrt = models()[0].eval(), triples()
    tails, heads = draw_candidates(hrt, 3, 3, E)
    valid = torch.arange(len(hrt)) < 5
    rows = negative_sampling_rows(model, 0.0, hrt, tails, heads, valid)
    assert torch.equal(rows[5:], torch.zeros(len(hrt) - 5))
    torch.testing.assert_close(rows[:5], negative_sampling_rows(model, 0.0, hrt[:5], tails[:5], heads[:5],
                                                                torch.ones(5, dtype=torch.bool)))


def test_draws_are_uniform_unfiltered_and_follow_the_global_generator():
    hrt = triples(2000)
    torch.manual_seed(4)
    tails, heads = draw_candidates(hrt, 7, 2, E)
    assert tails.shape == (2000, 8) and heads.shape == (2000, 3)
    assert torch.equal(tails[:, 0], hrt[:, 2]) and torch.equal(heads[:, 0], hrt[:, 0])
    counts = torch.bincount(tails[:, 1:].reshape(-1), minlength=E).double()
    assert counts.min() > 0 and counts.max() < 1.2 * counts.mean()  # 14,000 draws over 23 entities
    assert (tails[:, 1:] == hrt[:, 2:3]).any()  # the answer itself may be drawn (unfiltered)
    torch.manual_seed(4)
    again = draw_candidates(hrt, 7, 2, E)
    assert torch.equal(again[0], tails) and torch.equal(again[1], heads)


def test_config_needs_negatives_exactly_with_negative_sampling():
    with pytest.raises(ConfigError, match="draws no negatives"):
        TrainConfig(training="negative-sampling").validate()
    with pytest.raises(ConfigError, match="only apply to training=negative-sampling"):
        TrainConfig(training="1vsall", negatives_tail=5).validate()
    with pytest.raises(ConfigError, match="negatives_head=-1"):
        TrainConfig(training="negative-sampling", negatives_tail=5, negatives_head=-1).validate()
    TrainConfig(training="negative-sampling", negatives_tail=5).validate()
    with pytest.raises(ConfigError, match="adversarial_temperature=1.0: weighs drawn negatives"):
        TrainConfig(adversarial_temperature=1.0)
    with pytest.raises(ConfigError, match="adversarial_temperature=-1"):
        TrainConfig(training="negative-sampling", negatives_tail=5, adversarial_temperature=-1)
    TrainConfig(training="negative-sampling", negatives_tail=5, adversarial_temperature=1.0)


def test_the_adversarial_weights_favour_the_negatives_scored_highest():
    """alpha = 0 weighs the negatives evenly; a larger alpha moves the weight to the highest-scored one."""
    picked = torch.tensor([[2.0, 1.0, -1.0, 0.5]], requires_grad=True)
    even = loss.sampled_adversarial_rows(picked, 1e-12)
    log_sig = torch.nn.functional.logsigmoid
    torch.testing.assert_close(even, -(log_sig(picked[:, 0]) + log_sig(-picked[:, 1:]).mean(1)) / 2)
    sharp = loss.sampled_adversarial_rows(picked, 1e6)
    torch.testing.assert_close(sharp, -(log_sig(picked[:, 0]) + log_sig(-picked[:, 1])) / 2)
    sharp.sum().backward()  # the weights are constants: no gradient reaches the other negatives through them
    assert picked.grad[0, 2] == 0 and picked.grad[0, 3] == 0


def config(**kw):
    base = dict(dataset="nations", model="distmult", model_args={"embedding_dim": 16}, training="negative-sampling",
                negatives_tail=6, negatives_head=4, epochs=4, batch_size=64, seed=3, optimizer="adagrad", lr=0.1,
                checkpoint_every=1, eval_every=4, threads=1, device="cpu", compile=False)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("settings", [
    {"model_args": {"embedding_dim": 16}},
    {"model_args": {"embedding_dim": 16, "inverse_relations": True, "entity_dropout": 0.2, "relation_dropout": 0.1,
                    "init_uniform": [-0.5, 1.0]}},
    {"model": "rotate", "model_args": {"embedding_dim": 16, "margin": 6.0}, "adversarial_temperature": 1.0,
     "optimizer": "adam", "lr": 0.01},  # RotatE's recipe: self-adversarial negatives, Adam
])
def test_negative_sampling_learns_and_resumes_exactly(tmp_path, settings):
    """Loss falls and validation beats chance; a run stopped after epoch 2 and resumed ends with the same
    weights as one run straight through (the draws come from the generator the checkpoints save)."""
    whole = train(config(**settings), tmp_path / "whole", progress=False, log=lambda *_: None)
    records = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["loss"] < records[0]["loss"]
    assert whole.best_valid_mrr > 0.3  # Nations has 14 entities: random ranking gives about 0.25
    train(config(**settings, epochs=2), tmp_path / "part", progress=False, log=lambda *_: None)
    resume(tmp_path / "part", progress=False, log=lambda *_: None, epochs=4)
    a = load_checkpoint(tmp_path / "whole/checkpoints/epoch-0004.pt")["model_state"]
    b = load_checkpoint(tmp_path / "part/checkpoints/epoch-0004.pt")["model_state"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("gather", [False, True])
def test_compiled_negative_sampling_equals_eager(gather, monkeypatch):
    """The compiled call takes the eagerly drawn candidates: the loss and gradients of the eager rows."""
    monkeypatch.setattr(loss, "gathers_rows", lambda *_: gather)
    torch.manual_seed(7)
    model = DistMult(E, R, embedding_dim=8, inverse_relations=True)
    twin = copy.deepcopy(model)
    cfg = config(negatives_tail=5, negatives_head=3)
    batches = Batches.build(triples(40), R, "negative-sampling")
    call = train_call(model, "negative-sampling", 8, torch.device("cpu"), (5, 3))
    for n in (8, 5):
        inputs = step_inputs(batches, torch.arange(n), cfg, E, torch.device("cpu"))
        (rows,) = call(model, 0.0, **inputs)
        (rows.sum() / n).backward()
        eager = compiled_rows(twin, 0.0, **inputs, valid=torch.ones(n, dtype=torch.bool))
        (eager.sum() / n).backward()
        torch.testing.assert_close(rows, eager)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        model.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)
    assert call.name == "train_negative_sampling" and call.stats.recompilations == 0


def test_influence_and_trak_refuse_a_sampled_objective():
    model, hrt = models()[0], triples()
    cfg = config()
    with pytest.raises(KgtraceError, match="negative-sampling"):
        training_hessian(model, hrt, R, cfg, ["relation_embeddings"])
    with pytest.raises(KgtraceError, match="negative-sampling"):
        removal_weights(model, hrt, cfg)


# ----------------------------------------------------------------------------- the table options


@pytest.mark.parametrize("cls", [DistMult, ComplEx])
def test_inverse_relations_have_their_own_rows(cls):
    """With inverse relations the head query (t, r + R) reads row r + R: changing it changes head scores only."""
    torch.manual_seed(0)
    model = cls(E, R, embedding_dim=4, inverse_relations=True).eval()
    assert model.relation_embeddings.shape[0] == 2 * R
    hrt = triples()
    tails, heads = model.score_t(hrt[:, :2]), model.score_h(hrt[:, 1:])
    with torch.no_grad():
        model.relation_embeddings[R:] += 1.0
    assert torch.equal(model.score_t(hrt[:, :2]), tails) and not torch.allclose(model.score_h(hrt[:, 1:]), heads)
    # score_hrt is the tail query's score (the forward relation), as for ConvE
    torch.testing.assert_close(model.score_hrt(hrt), tails.gather(1, hrt[:, 2:]).squeeze(1))


@pytest.mark.parametrize("cls", [DistMult, ComplEx])
def test_embedding_dropout_acts_in_training_only(cls):
    torch.manual_seed(0)
    model = cls(E, R, embedding_dim=4, entity_dropout=0.5, relation_dropout=0.5)
    plain = cls(E, R, embedding_dim=4)
    plain.load_state_dict(model.state_dict())
    hr = triples()[:, :2]
    assert torch.equal(model.eval().score_t(hr), plain.eval().score_t(hr))
    model.train()
    torch.manual_seed(1)
    first = model.score_t(hr)
    torch.manual_seed(1)
    assert torch.equal(model.score_t(hr), first)  # masks from the global generator
    assert not torch.allclose(first, plain.score_t(hr))
    # dropped rows are zero and kept ones scaled by 1/(1-p): the masks reach the candidates' rows too
    torch.manual_seed(2)
    assert (model.decode(torch.ones(1, model.entity_embeddings.shape[1])) != plain.decode(
        torch.ones(1, model.entity_embeddings.shape[1]))).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropped_keeps_each_value_with_probability_one_minus_p_scaled_as_f_dropout(dtype):
    """The CPU mask (torch.rand >= p) against F.dropout's contract: kept values are x / (1 - p), the rest
    0, kept with probability 1 - p; the gradient is the same mask; eval mode or p = 0 pass x itself."""
    p = 0.3
    x = torch.linspace(1.0, 2.0, 200_000, dtype=dtype).view(1000, 200).requires_grad_()
    assert _tables.dropped(x, p, training=False) is x and _tables.dropped(x, 0.0, training=True) is x
    torch.manual_seed(0)
    y = _tables.dropped(x, p, training=True)
    kept = y != 0
    assert y.dtype == dtype
    torch.testing.assert_close(y[kept], (x / (1 - p))[kept])
    assert float(kept.float().mean()) == pytest.approx(1 - p, abs=0.005)  # 2e5 draws: sigma 0.001
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.to(dtype) / (1 - p))
    torch.manual_seed(0)
    assert torch.equal(_tables.dropped(x, p, training=True), y)  # masks from the global generator


def test_uniform_initialisation_draws_within_its_bounds():
    torch.manual_seed(0)
    model = DistMult(500, 40, embedding_dim=64, init_uniform=[-0.25, 1.0])
    for table in (model.entity_embeddings.detach(), model.relation_embeddings.detach()):
        assert -0.25 <= float(table.min()) < -0.2 and 0.95 < float(table.max()) <= 1.0
        assert float(table.mean()) == pytest.approx(0.375, abs=0.02)


def test_normal_initialisation_has_its_standard_deviation():
    torch.manual_seed(0)
    model = build_model("rescal", 500, 40, embedding_dim=16, init_normal=0.12)
    for table in (model.entity_embeddings.detach(), model.relation_matrices.detach()):
        assert float(table.mean()) == pytest.approx(0.0, abs=0.01)
        assert float(table.std()) == pytest.approx(0.12, rel=0.03)


def test_table_options_are_checked_all_at_once():
    with pytest.raises(ConfigError) as err:
        build_model("complex", E, R, embedding_dim=4, inverse_relations="yes", entity_dropout=1.0,
                    relation_dropout=-0.1, init_uniform=[1.0], init_normal=-0.1)
    for key in ("inverse_relations='yes'", "entity_dropout=1.0", "relation_dropout=-0.1", "init_uniform=[1.0]",
                "init_normal=-0.1"):
        assert key in str(err.value)
    with pytest.raises(ConfigError, match="both set"):
        build_model("transe", E, R, embedding_dim=4, init_uniform=[-0.5, 1.0], init_normal=0.1)
