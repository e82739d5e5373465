"""The linear datamodeling score and the attribution methods it scores: hand-computed values, slow references."""

import copy
import json
from dataclasses import replace as dataclasses_replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attribution_references import ScoreT, fisher_reference, loss_gradients, reference_hessian, score_gradient
from scipy import stats
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from kgtrace.attribution import trak as trak_module
from kgtrace.attribution.influence import InfluenceFunction, training_hessian
from kgtrace.attribution.methods import METHOD_SPECS, AttributionInputs, attributions, choose_method
from kgtrace.attribution.trak import (
    TrakCost,
    TrakTime,
    default_ridge,
    removal_weights,
    trak,
    trak_ridges,
)
from kgtrace.cli import build_parser, main
from kgtrace.core.checkpoint import load_checkpoint
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.specs import model_names, spec_named
from kgtrace.faithfulness.lds import (
    LdsSettings,
    check_lds,
    draw_subsets,
    lds_scores,
    load_lds_inputs,
    spearman_rows,
    summarize_lds,
)
from kgtrace.models import build_model
from kgtrace.runs.embedding import load_run, model_from_checkpoint
from kgtrace.training.batches import Batches
from kgtrace.training.loop import train
from kgtrace.training.loss import dense_bce_reference, dense_ce_reference


@pytest.fixture(scope="module")
def tiny_distmult(tmp_path_factory):
    """DistMult width 4 on Nations, 6 epochs, checkpoints at 3 and 6 (276 parameters: every method runs)."""
    out = tmp_path_factory.mktemp("lds") / "run"
    config = TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 4}, epochs=6, lr=0.05,
                         checkpoint_every=3, eval_every=0, threads=1, device="cpu", label_smoothing=0.1)
    train(config, out, progress=False, log=lambda *_: None)
    return out


# ----------------------------------------------------------------------------- the arithmetic


def test_spearman_by_hand_with_ties():
    # a ranks [1, 2.5, 2.5, 4], b ranks [1, 3, 2, 4]; centred: [-1.5, 0, 0, 1.5] and [-1.5, .5, -.5, 1.5]
    # -> 4.5 / sqrt(4.5 * 5) = 0.9487
    a = np.array([[1.0], [2.0], [2.0], [3.0]])
    b = np.array([[10.0], [30.0], [20.0], [40.0]])
    assert spearman_rows(a, b)[0] == pytest.approx(4.5 / np.sqrt(22.5))


def test_spearman_equals_scipy_per_column_and_nan_for_constant():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, size=(12, 5)).astype(float)  # many ties
    b = rng.normal(size=(12, 5))
    ours = spearman_rows(a, b)
    for i in range(5):
        assert ours[i] == pytest.approx(stats.spearmanr(a[:, i], b[:, i]).statistic, abs=1e-12)
    assert np.isnan(spearman_rows(np.ones((4, 1)), b[:4, :1]))[0]


def test_lds_of_exact_and_reversed_attributions():
    masks = draw_subsets(6, 8, 0.5, seed=1)  # [8, 6]
    attributions = np.array([[3.0, -1.0, 0.5, 2.0, 0.0, -2.5], [1.0, 1.0, -1.0, 0.25, 4.0, 0.0]])  # [2, 6]
    truth = masks @ attributions.T  # outputs that are exactly the subset sums
    assert lds_scores(truth, masks, attributions) == pytest.approx([1.0, 1.0])
    assert lds_scores(-truth, masks, attributions) == pytest.approx([-1.0, -1.0])


def test_subsets_are_seeded_sized_and_stable_when_more_are_drawn():
    few, more = draw_subsets(101, 3, 0.3, seed=7), draw_subsets(101, 5, 0.3, seed=7)
    assert few.shape == (3, 101) and (few.sum(axis=1) == 30).all()
    assert (more[:3] == few).all()
    assert not (draw_subsets(101, 3, 0.3, seed=8) == few).all()


def test_summary_skips_undefined_and_brackets_the_mean():
    mean, low, high = summarize_lds(np.array([0.2, np.nan, 0.4, 0.6, 0.8]), bootstrap=500, seed=0)
    assert mean == pytest.approx(0.5)
    assert 0.2 <= low <= mean <= high <= 0.8


def test_settings_report_every_problem():
    with pytest.raises(ConfigError) as e:
        LdsSettings(subsets=2, fraction=1.5, methods=("tracin-last", "shapley"), jobs=0).validate()
    text = str(e.value)
    for part in ("subsets=2", "fraction=1.5", "shapley", "jobs=0"):
        assert part in text


# ----------------------------------------------------------------------------- methods against slow references


@pytest.mark.parametrize("dim", [16, 2000, None])  # k < n, k > n (solved as an [n, n] system), no projection
def test_trak_equals_its_formula_computed_triple_by_triple(tiny_distmult, dim):
    run = load_run(tiny_distmult)
    test = run.dataset.test[:3]
    expected = torch.zeros(3, len(run.dataset.train), dtype=torch.float64)
    for c, info in enumerate(run.checkpoints):
        model = model_from_checkpoint(load_checkpoint(info.path)).double()
        names = [n for n, _ in model.named_parameters()]
        size = sum(p.numel() for p in model.parameters())
        projection = (torch.eye(size) if dim is None else
                      torch.randn(size, dim, generator=torch.Generator().manual_seed(5 * 1_000_003 + c)) / dim ** 0.5)
        phi = torch.stack([score_gradient(model, z, names) for z in run.dataset.train]) @ projection.double()  # [n, k]
        phi_test = torch.stack([score_gradient(model, z, names) for z in test]) @ projection.double()  # [3, k]
        kernel = phi.T @ phi  # [k, k]: the primal form, whatever k
        mean_eigenvalue = float(torch.linalg.eigvalsh(kernel).sum()) / min(phi.shape)  # its rank is at most min(n, k)
        kernel = kernel + (0.5 * mean_eigenvalue + 1e-12) * torch.eye(len(kernel), dtype=torch.float64)
        expected += (phi_test @ torch.linalg.solve(kernel, phi.T)).detach()  # KvsAll: q_j = 1
    expected /= len(run.checkpoints)
    got = trak(run, test, dim=dim, seed=5, ridge=0.5)
    assert torch.allclose(got, expected, rtol=1e-3, atol=1e-4 * expected.abs().max())
    several = trak_ridges(run, test, [0.01, 0.5], dim=dim, seed=5)  # the gradients once, each ridge's solve
    assert torch.equal(several[1], got) and not torch.allclose(several[0], got)


def test_trak_refuses_features_that_would_not_fit_and_names_a_projection_that_does(tiny_distmult, monkeypatch):
    run = load_run(tiny_distmult)
    monkeypatch.setattr(trak_module, "MAX_FEATURE_BYTES", len(run.dataset.train) * 100 * 8)  # k = 100 fits
    with pytest.raises(KgtraceError, match=r"trak_dim=100\)"):
        trak(run, run.dataset.test[:1])  # exact: 276 parameters
    with pytest.raises(KgtraceError, match=r"trak_dim=100\)"):
        trak(run, run.dataset.test[:1], dim=101)
    assert trak(run, run.dataset.test[:1], dim=100).shape == (1, len(run.dataset.train))


def test_leaving_a_triple_out_of_kvsall_changes_the_gradient_by_one_multiple_of_its_score_gradient(tiny_distmult):
    """TRAK's q_j = 1 for KvsAll: with triple j's label negative instead of positive, the gradient of its query's
    BCE (label smoothing .1) changes by c * grad score(j), with the same c for every triple."""
    run = load_run(tiny_distmult)
    model = copy.deepcopy(run.model).double()
    params = dict(model.named_parameters())
    names = list(params)
    train = run.dataset.train

    def query_gradient(h, r, tails):
        scores = model.score_t(torch.tensor([[h, r]]))  # [1, E]
        loss = dense_bce_reference(scores, torch.zeros(len(tails), dtype=torch.long), torch.tensor(tails, dtype=torch.long), 0.1)
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, [params[n] for n in names])])

    multiples = []
    for h, r, t in train[:4].tolist():
        answers = [b for a, rel, b in train.tolist() if (a, rel) == (h, r)]
        change = query_gradient(h, r, answers) - query_gradient(h, r, [b for b in answers if b != t])
        direction = score_gradient(model, torch.tensor([h, r, t]), names)
        multiple = float(change @ direction / (direction @ direction))
        assert torch.allclose(change, multiple * direction, atol=1e-12)
        multiples.append(multiple)
    assert multiples == pytest.approx([multiples[0]] * 4) and multiples[0] != 0
    assert torch.equal(removal_weights(model, train, run.config), torch.ones(len(train), dtype=torch.float64))


def test_onevsall_removal_weights_are_one_minus_the_softmax_probability(tiny_distmult):
    run = load_run(tiny_distmult)
    model, train = run.model, run.dataset.train[:7]
    got = removal_weights(model, train, dataclasses_replace(run.config, training="1vsall"), chunk_size=3)
    E = run.dataset.num_entities
    for j, (h, r, t) in enumerate(train.tolist()):
        scores = model.score_hrt(torch.tensor([[h, r, e] for e in range(E)])).double()  # every tail, one at a time
        assert float(got[j]) == pytest.approx(1 - float(torch.softmax(scores, 0)[t]), rel=1e-6)


@pytest.mark.parametrize("eps, style", [(0.0, "pykeen"), (0.1, "pykeen"), (0.1, "conve")])
def test_kvsall_ce_removal_weights_are_the_change_of_the_score_gradient(tiny_distmult, eps, style):
    """Leaving z_j out of kvsall-ce training: the change of d objective / d f(z_j), with and without z_j
    (dense targets, autograd), is q_j, for queries of one answer and of several."""
    run = load_run(tiny_distmult)
    config = dataclasses_replace(run.config, training="kvsall-ce", label_smoothing=eps, label_smoothing_style=style)
    model, train, relations = run.model, run.dataset.train, run.dataset.num_relations
    got = removal_weights(model, train, config, chunk_size=50)
    query = torch.unique(train[:, :2], dim=0, return_inverse=True, return_counts=True)
    answers = query[2][query[1]]  # [n] answers of each triple's (h, r)

    def score_gradient(triples, h, r, t):  # d (summed kvsall-ce over ``triples``) / d score of (h, r, t)
        batches = Batches.build(triples, relations, "kvsall-ce")
        at = torch.nonzero((batches.queries == torch.tensor([h, r])).all(1))
        if len(at) == 0:
            return 0.0  # the query is gone with its only answer
        scores = model.score_t(batches.queries).double().detach().requires_grad_()
        rows, cols = batches.index.pairs_at(torch.arange(len(batches)))
        (dense_ce_reference(scores, rows, cols, eps, style) * len(batches)).backward()
        return float(scores.grad[int(at[0, 0]), t])

    chosen = [*torch.nonzero(answers == 1)[:3, 0].tolist(), *torch.nonzero(answers > 1)[:3, 0].tolist()]
    assert len(chosen) == 6
    for j in chosen:
        h, r, t = train[j].tolist()
        without = torch.cat([train[:j], train[j + 1:]])
        change = score_gradient(without, h, r, t) - score_gradient(train, h, r, t)
        assert float(got[j]) == pytest.approx(change, rel=1e-6)


def test_training_hessian_agrees_with_autograd(tiny_distmult):
    run = load_run(tiny_distmult)
    model, names, expected = reference_hessian(run)
    got = training_hessian(model, run.dataset.train, run.dataset.num_relations, run.config, names)
    assert (got - expected).abs().max() < 1e-10 * expected.abs().max()


def test_grad_cos_is_the_cosine_of_loss_gradients_at_the_final_weights(tiny_distmult):
    run = load_run(tiny_distmult)
    model = model_from_checkpoint(load_checkpoint(run.checkpoints[-1].path)).double()
    names = [n for n, _ in model.named_parameters()]
    test = run.dataset.test[:2]
    g_train = loss_gradients(model, run.dataset.train, names)
    g_test = loss_gradients(model, test, names)
    expected_dot = g_test @ g_train.T
    expected_cos = expected_dot / g_test.norm(dim=1, keepdim=True) / g_train.norm(dim=1)
    inputs = AttributionInputs()
    assert torch.allclose(METHOD_SPECS["grad-dot"].compute(run, test, inputs), expected_dot, rtol=1e-4, atol=1e-6)
    assert torch.allclose(METHOD_SPECS["grad-cos"].compute(run, test, inputs), expected_cos, rtol=1e-4, atol=1e-6)


def test_neighbourhood_marks_triples_sharing_an_entity(tiny_distmult):
    run = load_run(tiny_distmult)
    test = run.dataset.test[:2]
    got = METHOD_SPECS["neighbourhood"].compute(run, test, AttributionInputs())
    for i, (h, _, t) in enumerate(test.tolist()):
        for j, (a, _, b) in enumerate(run.dataset.train.tolist()):
            assert got[i, j] == float(bool({a, b} & {h, t}))


# ----------------------------------------------------------------------------- the check


def test_check_lds_writes_its_tables_and_resumes(tiny_distmult, tmp_path):
    out = tmp_path / "out"
    settings = LdsSettings(subsets=4, sample=3, methods=("tracin-last", "influence", "random", "trak"), bootstrap=50,
                           trak_dim=2 ** 30)  # TRAK's projection would not fit: refused, the rest go on
    summary = check_lds(tiny_distmult, out, settings, progress=False, log=lambda *_: None)
    assert {r.method for r in summary.rows} == {"tracin-last", "influence", "random"}
    assert "trak" in summary.errors and "trak_dim=" in summary.errors["trak"]  # from Python: the keyword argument
    assert all(-1 <= r.lds <= 1 and r.low <= r.lds <= r.high and r.n <= 3 for r in summary.rows)
    assert len(list((out / "jobs" / "retrain").glob("*.json"))) == 4
    saved = json.loads((out / "lds.json").read_text())
    assert saved["subsets"] == 4 and len(saved["prediction_ids"]) == 3
    assert (out / "lds.tsv").read_text().startswith("method\toutput\tlds")
    inputs = load_lds_inputs(out)
    assert inputs.masks.shape == (4, len(load_run(tiny_distmult).dataset.train))
    assert inputs.outputs["score"].shape == (4, 3)
    # The same call again retrains nothing and recomputes no attribution.
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.suffix in (".pt", ".json") and p.name != "lds.json"}
    again = check_lds(tiny_distmult, out, settings, progress=False, log=lambda *_: None)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert again.rows == summary.rows


def test_cli_lds_prints_the_table(tiny_distmult, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["faithfulness", str(tiny_distmult), "--lds", "--subsets", "3", "--sample", "2", "--methods",
                 "grad-cos,neighbourhood", "--bootstrap", "20", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "LDS over 3 subsets of 0.5" in printed
    assert "grad-cos" in printed and "neighbourhood" in printed and "best on the score" in printed
    assert (out / "lds-predictions.tsv").is_file()


def test_report_shows_the_lds_table(tiny_distmult, tmp_path):
    from kgtrace.report import write_report

    out = tmp_path / "lds-report"
    check_lds(tiny_distmult, out, LdsSettings(subsets=3, sample=2, methods=("grad-dot", "random"), bootstrap=20),
              progress=False, log=lambda *_: None)
    page = write_report(tiny_distmult, tmp_path / "report.html", faithfulness=[out]).read_text()
    assert "Linear datamodeling score" in page and "3 models trained from scratch" in page
    assert page.index("grad-dot") < page.rindex("random")  # a row per method


@pytest.mark.parametrize("model_name,args", [("distmult", {"embedding_dim": 4}),
                                             ("conve", {"embedding_dim": 6, "embedding_height": 2,
                                                        "output_channels": 2})])
def test_fisher_influence_equals_the_dense_block_diagonal_solve(tmp_path, model_name, args):
    from kgtrace.attribution.fisher import fisher_influence

    out = tmp_path / model_name
    config = TrainConfig(dataset="nations", model=model_name, model_args=args, epochs=2, lr=0.05, checkpoint_every=2,
                         eval_every=0, threads=1, device="cpu")
    train(config, out, progress=False, log=lambda *_: None)
    run = load_run(out)
    # A head = tail triple: its row counts once, with both slots' gradients summed.
    h, r, _ = run.dataset.train[0].tolist()
    run.dataset = dataclasses_replace(run.dataset, train=torch.cat([run.dataset.train[:60],
                                                                     torch.tensor([[h, r, h]])]))
    model = model_from_checkpoint(load_checkpoint(run.checkpoints[-1].path)).double().eval()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    test = run.dataset.test[:3]
    expected = fisher_reference(model, run.dataset.train, test, names, 1e-3)
    got = fisher_influence(run, test, damping=1e-3)
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-9 * expected.abs().max())


@pytest.mark.parametrize("training", ["1vsall", "kvsall-ce"])
def test_training_hessian_of_a_cross_entropy_objective(tmp_path, training):
    config = TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 3}, epochs=2, lr=0.05,
                         checkpoint_every=2, eval_every=0, threads=1, device="cpu", training=training)
    train(config, tmp_path / "run", progress=False, log=lambda *_: None)
    run = load_run(tmp_path / "run")
    model = copy.deepcopy(run.model).double().eval()
    names = [n for n, _ in model.named_parameters()]
    shapes = [(n, p.shape, p.numel()) for n, p in model.named_parameters()]
    batches = Batches.build(run.dataset.train, run.dataset.num_relations, training)

    def objective(scores):  # averaged over the examples: per (triple, direction), or per query
        if training == "1vsall":
            return F.cross_entropy(scores, batches.answers)  # of each example's answer
        rows, cols = batches.index.pairs_at(torch.arange(len(batches)))  # its smoothed labels, normalised
        return dense_ce_reference(scores, rows, cols, config.label_smoothing, config.label_smoothing_style)

    def loss(flat):
        weights, offset = {}, 0
        for name, shape, size in shapes:
            weights[f"model.{name}"] = flat[offset:offset + size].view(shape)
            offset += size
        return objective(functional_call(ScoreT(model), weights, (batches.queries,)))

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    expected = torch.autograd.functional.hessian(loss, flat)
    got = training_hessian(model, run.dataset.train, run.dataset.num_relations, run.config, names)
    assert (got - expected).abs().max() < 1e-10 * expected.abs().max()


# ----------------------------------------------------------------------------- explain with another method


def test_explain_with_trak_ranks_its_matrix_and_says_so(tiny_distmult, tmp_path, capsys):
    from kgtrace.attribution.methods import matrix_top_k
    from kgtrace.report.sections import explain_section

    out = tmp_path / "trak.json"
    assert main(["explain", str(tiny_distmult), "--test", "2", "--top-k", "3", "--method", "trak", "--trak-dim", "32",
                 "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("TRAK attribution (--method trak): ")
    items = json.loads(out.read_text())["explanations"]
    run = load_run(tiny_distmult)
    matrix = trak(run, run.dataset.test[:2], dim=32)
    expected = matrix_top_k(matrix, run.dataset.test[:2], 3)
    for i, (item, top) in enumerate(zip(items, expected)):
        assert item["method"] == "trak" and item["checkpoints"] == [3, 6]
        assert [e["train_index"] for e in item["proponents"]] == top.proponents.tolist()
        assert [e["train_index"] for e in item["opponents"]] == top.opponents.tolist()
        assert item["proponents"][0]["influence"] == pytest.approx(float(matrix[i].max()), rel=1e-6)
        assert item["proponents"][0]["checkpoint_shares"] is None  # not per checkpoint
    assert "TRAK attribution of a training triple on a prediction (<code>trak</code>)" in explain_section(out, {})


def test_trak_cost_counts_every_parameter_triple_and_checkpoint(tiny_distmult):
    run = load_run(tiny_distmult)
    cost = TrakCost.of(run)
    # Nations: 14 entities and 55 relations of width 4 -> 276 parameters; checkpoints at epochs 3 and 6
    assert (cost.triples, cost.parameters, cost.checkpoints) == (len(run.dataset.train), (14 + 55) * 4, 2)
    assert cost.feature_bytes == len(run.dataset.train) * 276 * 8
    assert cost.flops == 2 * len(run.dataset.train) * 276 * min(len(run.dataset.train), 276) * 2


def test_trak_time_adds_gradients_kernel_and_solve_per_checkpoint(tiny_distmult):
    estimate = TrakTime((10, 20), (1.0, 2.0), load=0.5, linear=0.1, matmul_rate=1e9, solve_rate=1e8, triples=100,
                        parameters=1000, checkpoints=3)
    kernel, solve = 2 * 100 * 1000 * 100, 100 ** 3 / 3
    assert estimate.seconds == pytest.approx(3 * (0.5 + 0.1 * 100 + kernel / 1e9 + solve / 1e8))
    measured = TrakTime.measure(load_run(tiny_distmult))
    assert measured.triples == len(load_run(tiny_distmult).dataset.train) and measured.checkpoints == 2
    assert measured.linear > 0 and measured.matmul_rate > 0 and measured.solve_rate > 0 and measured.seconds > 0


def test_trak_time_counts_the_arithmetic_exact_trak_does(tiny_distmult):
    # The estimate's kernel term, 2 n P min(n, P) per checkpoint (`TrakCost.flops`), against the operations torch's
    # FlopCounterMode counts in the real computation: the rest are the score products, linear in n (under 2% here).
    # Time is the benchmark's to check (benchmarks/auto_method.py: estimate / timed run); the count is exact here.
    run = load_run(tiny_distmult)
    train_triples, cost = run.dataset.train, TrakCost.of(run)
    with FlopCounterMode(display=False) as counted:
        trak(run, train_triples[:2])
    assert cost.triples > cost.parameters  # Phi^T Phi [P, P]
    assert 1.0 <= counted.get_total_flops() / cost.flops < 1.02
    few = 96  # under P = 276: Phi Phi^T [n, n], as in the pilots
    with FlopCounterMode(display=False) as counted:
        trak_module._one_model(run.model, train_triples[:few], train_triples[:1], None, 0, 512, [0.01], run.config)
    assert 1.0 <= counted.get_total_flops() / TrakCost(few, cost.parameters, 1).flops < 1.02


def test_auto_picks_trak_where_it_fits_and_tracin_where_it_does_not(tiny_distmult, monkeypatch):
    from kgtrace.attribution import methods

    run = load_run(tiny_distmult)
    chosen = choose_method(run)
    assert chosen.method == "trak" and "best LDS" in chosen.reason and "276 parameters" in chosen.reason
    assert "two timed pilots" in chosen.reason and f"budget of {methods.AUTO_BUDGET_S:g} s" in chosen.reason
    for bad in (-1.0, float("nan")):
        with pytest.raises(ConfigError, match=r"budget=.*: must be a number of seconds, 0 or more"):
            choose_method(run, budget=bad)
    chosen = choose_method(run, budget=0.0)  # any estimate is over a budget of nothing
    assert chosen.method == "tracin" and "more than the budget of 0 s" in chosen.reason
    monkeypatch.setattr(trak_module, "MAX_FEATURE_BYTES", TrakCost.of(run).feature_bytes - 1)
    assert choose_method(run).method == "tracin" and "GiB" in choose_method(run).reason
    sampled = dataclasses_replace(run, config=dataclasses_replace(run.config, training="negative-sampling",
                                                                  negatives_tail=8, negatives_head=8))
    monkeypatch.undo()
    assert choose_method(sampled).method == "tracin" and "negative sampling" in choose_method(sampled).reason


def test_explain_by_default_says_which_method_it_chose_and_gives_its_ranking(tiny_distmult, tmp_path, capsys):
    from kgtrace.report.sections import explain_section

    auto, named = tmp_path / "auto.json", tmp_path / "trak.json"
    common = ["--test", "2", "--top-k", "3", "--device", "cpu", "--no-progress"]
    assert main(["explain", str(tiny_distmult), *common, "--out", str(auto)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("--method auto: trak, the best LDS on the benchmark graphs; over 1,592 training triples ")
    assert main(["explain", str(tiny_distmult), *common, "--method", "trak", "--out", str(named)]) == 0
    first, second = (json.loads(f.read_text())["explanations"] for f in (auto, named))
    assert [i["method"] for i in first] == ["trak", "trak"] and first[0]["method_reason"].startswith("the best LDS")
    assert second[0]["method_reason"] == "--method trak"
    for a, b in zip(first, second):
        assert [e["train_index"] for e in a["proponents"]] == [e["train_index"] for e in b["proponents"]]
    assert "Method chosen: the best LDS on the benchmark graphs" in explain_section(auto, {})


def test_explain_auto_takes_tracin_when_a_tracin_option_is_given(tiny_distmult, tmp_path, capsys):
    out = tmp_path / "tracin.json"
    assert main(["explain", str(tiny_distmult), "--test", "1", "--params", "all", "--device", "cpu", "--no-progress",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("--method auto: tracin, --params given, which only TracIn reads")
    assert json.loads(out.read_text())["explanations"][0]["method"] == "tracin"
    assert main(["explain", str(tiny_distmult), "--test", "1", "--params", "all", "--trak-dim", "8"]) == 2
    assert "--trak-dim is TRAK's and --params TracIn's" in capsys.readouterr().err
    assert main(["explain", str(tiny_distmult), "--test", "1", "--method", "tracin", "--trak-dim", "8"]) == 2
    assert "--trak-dim with --method tracin: TRAK's projection" in capsys.readouterr().err


def test_explain_method_conflicts_are_reported_together(tiny_distmult, capsys):
    assert main(["explain", str(tiny_distmult), "--self", "--method", "grad-cos", "--memory-budget", "lots"]) == 2
    err = capsys.readouterr().err
    assert "--self with --method grad-cos" in err and "--memory-budget" in err


def test_removal_by_an_attribution_method_takes_its_largest(tiny_distmult):
    from kgtrace.faithfulness.removals import MethodInputs, removal_methods

    run = load_run(tiny_distmult)
    test = run.dataset.test[:2]
    matrix = METHOD_SPECS["grad-cos"].compute(run, test, AttributionInputs())
    removed = removal_methods()["grad-cos"](run, test, 4, MethodInputs())
    for row, chosen in zip(matrix, removed):  # by value: of (nearly) tied attributions either triple is the largest
        torch.testing.assert_close(row[chosen], torch.sort(row, descending=True).values[:4])


def test_influence_takes_the_final_weights_whichever_checkpoint_the_run_holds(tiny_distmult):
    first = load_run(tiny_distmult, str(load_run(tiny_distmult).checkpoints[0].path))
    test = first.dataset.test[:2]
    expected = InfluenceFunction(load_run(tiny_distmult)).influence(test)
    assert torch.equal(InfluenceFunction(first).influence(test), expected)


def test_the_trak_ridge_defaults_to_the_models_everywhere(tiny_distmult, capsys):
    parser = build_parser()
    explain = parser.parse_args(["explain", "RUN", "--test", "1"])
    lds = parser.parse_args(["faithfulness", "RUN", "--lds"])
    assert explain.trak_ridge is lds.trak_ridge is AttributionInputs().trak_ridge is LdsSettings().trak_ridge is None
    # --help names the models' ridges, from their specs
    assert {name: spec_named(name).trak_ridge for name in model_names()} == {
        "conve": 1.0, "distmult": 0.3, "complex": 0.3, "transe": 0.3, "rotate": 0.3, "tucker": 0.3, "rescal": 0.3}
    for command in ("explain", "faithfulness"):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        assert "the model's, 0.3; ConvE 1" in " ".join(capsys.readouterr().out.split())
    run = load_run(tiny_distmult)
    test = run.dataset.test[:2]
    assert default_ridge(run.model) == 0.3 and default_ridge(build_model("conve", 5, 2)) == 1.0
    assert torch.equal(trak(run, test, dim=16), trak(run, test, dim=16, ridge=0.3))
    assert not torch.equal(trak(run, test, dim=16), trak(run, test, dim=16, ridge=1.0))


def test_each_method_depends_only_on_the_inputs_it_declares(tiny_distmult):
    """A spec's ``reads`` decides when a saved matrix is reused: every other input must leave a method's values alone."""
    run = load_run(tiny_distmult)
    test = run.dataset.test[:2]
    base = AttributionInputs(trak_dim=16)
    other = AttributionInputs(seed=7, damping=0.05, trak_dim=8, trak_ridge=0.01)
    for method, attribution in attributions().items():
        reads = METHOD_SPECS[method].reads
        changed = dataclasses_replace(other, **{k: getattr(base, k) for k in reads})
        assert torch.equal(attribution(run, test, base), attribution(run, test, changed)), method
        if reads:  # and the declared ones do change them
            assert not torch.equal(attribution(run, test, base), attribution(run, test, other)), method
