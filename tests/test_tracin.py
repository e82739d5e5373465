"""TracIn attribution: every path agrees with the per-triple autograd reference (UMLS, 4 checkpoints)."""

import copy
from dataclasses import fields
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from kgtrace.attribution import TracIn, select_parameters
from kgtrace.attribution import spill as spill_module
from kgtrace.attribution import tracin as tracin_module
from kgtrace.attribution.reference import triple_gradient
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import train

ARGS = {
    "conve": {"embedding_dim": 16, "embedding_height": 4, "output_channels": 4},
    "distmult": {"embedding_dim": 16},
    "complex": {"embedding_dim": 8},
}


def _train(tmp_path_factory, model):
    out = tmp_path_factory.mktemp(model)
    config = TrainConfig(dataset="umls", model=model, model_args=ARGS[model], epochs=4, checkpoint_every=1,
                         eval_every=0, threads=1, device="cpu", seed=5, lr=0.01, lr_decay=0.7, batch_size=256)
    train(config, out, progress=False, log=lambda *_: None)
    return load_run(out)


@pytest.fixture(scope="module")
def conve_run(tmp_path_factory):
    return _train(tmp_path_factory, "conve")


@pytest.fixture(scope="module")
def distmult_run(tmp_path_factory):
    return _train(tmp_path_factory, "distmult")


@pytest.fixture(scope="module")
def complex_run(tmp_path_factory):
    return _train(tmp_path_factory, "complex")


@pytest.fixture(scope="module")
def complex_reciprocal_run(tmp_path_factory):
    """ComplEx with its own inverse relations and embedding dropout, trained with negative sampling."""
    out = tmp_path_factory.mktemp("complex-reciprocal")
    config = TrainConfig(dataset="umls", model="complex", epochs=3, checkpoint_every=1, eval_every=0, threads=1,
                         device="cpu", seed=5, lr=0.05, optimizer="adagrad", batch_size=256,
                         training="negative-sampling", negatives_tail=20, negatives_head=10,
                         model_args={"embedding_dim": 8, "inverse_relations": True, "entity_dropout": 0.3,
                                     "relation_dropout": 0.2, "init_uniform": [-0.5, 0.5]})
    train(config, out, progress=False, log=lambda *_: None)
    return load_run(out)


def probe(run):
    """Three test triples and one whose head is its tail (both entity slots on one row)."""
    return torch.cat([run.dataset.test[:3], torch.tensor([[5, 3, 5]])])


def subset(run, test, n_shared=60, step=40):
    """Training rows: every step-th, plus some sharing an entity with the test triples (so rows meet)."""
    train = run.dataset.train
    entities = test[:, [0, 2]].reshape(-1)
    shares = (train[:, [0, 2]].unsqueeze(-1) == entities).any(-1).any(-1).nonzero().squeeze(1)
    return torch.unique(torch.cat([torch.arange(0, len(train), step), shares[::3][:n_shared]]))


def assert_agrees(got, ref):
    assert got.dtype == torch.float32 and got.shape == ref.shape
    ref = ref.float()
    scale = ref.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * scale)


def test_select_parameters(conve_run, distmult_run):
    assert select_parameters(conve_run.model, "last") == ["fc.weight", "fc.bias", "entity_bias"]
    assert select_parameters(distmult_run.model, "last") == ["entity_embeddings"]
    assert select_parameters(distmult_run.model, "all") == ["entity_embeddings", "relation_embeddings"]
    assert select_parameters(conve_run.model, ["fc.bias"]) == ["fc.bias"]
    with pytest.raises(ConfigError, match="nope.*fc.weight"):
        select_parameters(conve_run.model, ["fc.bias", "nope"])
    with pytest.raises(ConfigError, match="unknown parameter set"):
        select_parameters(conve_run.model, "first")


def test_options_are_checked(conve_run):
    with pytest.raises(ConfigError, match="epoch") as error:
        TracIn(conve_run, checkpoints=[99], path="nope", precision="fp8", chunk_size=0)
    assert len(error.value.problems) == 4  # all problems at once
    with pytest.raises(ConfigError, match="fp16.*CUDA"):
        TracIn(conve_run, precision="fp16")
    assert TracIn(conve_run).path == "fast"
    assert TracIn(conve_run, params="all").path == "fast"
    assert TracIn(conve_run, params="all", path="general").path == "general"


@pytest.mark.parametrize("model,params,paths", [
    ("conve", "last", ["fast", "rows", "general"]),
    ("conve", "all", ["fast", "rows"]),
    ("conve", ["fc.weight"], ["fast", "general"]),
    ("conve", ["entity_embeddings"], ["fast", "rows"]),
    ("conve", ["bn0.weight", "conv.weight", "bn1.bias", "relation_embeddings", "bn2.weight"], ["fast", "general"]),
    ("distmult", "last", ["fast", "general"]),
    ("distmult", "all", ["fast", "general"]),
    ("complex", "all", ["fast", "general"]),
    ("complex_reciprocal", "all", ["fast", "general"]),
])
def test_paths_agree_with_reference(request, model, params, paths):
    run = request.getfixturevalue(f"{model}_run")
    assert len(run.checkpoints) == (3 if model == "complex_reciprocal" else 4)
    test = probe(run)
    rows = subset(run, test)
    ref = TracIn(run, params=params, path="reference", train_indices=rows).influence(test)
    for path in paths:
        got = TracIn(run, params=params, path=path, train_indices=rows, chunk_size=37).influence(test)
        assert_agrees(got, ref)


def test_conve_all_includes_every_parameter(conve_run):
    """'all' really is every parameter: dropping any one of them changes the influences."""
    names = select_parameters(conve_run.model, "all")
    assert set(names) == {n for n, _ in conve_run.model.named_parameters()}
    test, rows = probe(conve_run)[:2], torch.arange(0, 600, 3)
    full = TracIn(conve_run, params="all", train_indices=rows).influence(test)
    for name in names:
        rest = TracIn(conve_run, params=[n for n in names if n != name], train_indices=rows).influence(test)
        assert not torch.equal(rest, full), name


def test_checkpoints_weighed_by_lr(conve_run):
    rows = torch.arange(30)
    test = conve_run.dataset.test[:2]
    lrs = [c.lr for c in conve_run.checkpoints]
    assert lrs == sorted(lrs, reverse=True) and lrs[0] > lrs[-1]  # lr_decay recorded per checkpoint
    parts = [TracIn(conve_run, checkpoints=[c.epoch], train_indices=rows).influence(test)
             for c in conve_run.checkpoints]
    both = TracIn(conve_run, checkpoints=[1, 3], train_indices=rows).influence(test)
    torch.testing.assert_close(both, parts[0] + parts[2])
    ref = TracIn(conve_run, checkpoints=[2], path="reference", train_indices=rows).influence(test)
    assert_agrees(parts[1], ref)


def test_eval_mode_is_used(conve_run):
    """Gradients are taken in eval mode, even when the run's model was left in train mode."""
    conve_run.model.train()
    try:
        tracin = TracIn(conve_run, params="all", path="general", train_indices=torch.arange(10))
        got = tracin.influence(conve_run.dataset.test[:1])
    finally:
        conve_run.model.eval()
    ref = TracIn(conve_run, params="all", path="reference", train_indices=torch.arange(10)).influence(
        conve_run.dataset.test[:1])
    assert_agrees(got, ref)
    # The check has teeth: in train mode (dropout, batch statistics) the gradients differ.
    model, names = copy.deepcopy(conve_run.model), tracin.names
    pair = conve_run.dataset.train[:2]
    model.eval()
    eval_grad = triple_gradient(model, pair[0], names)
    model.train()
    torch.manual_seed(0)
    params = dict(model.named_parameters())
    loss = F.softplus(-model.score_hrt(pair)).sum()  # batch of two: train-mode BatchNorm needs > 1
    train_grad = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    model.eval()
    assert not torch.allclose(eval_grad, torch.cat([
        (torch.zeros_like(params[n]) if g is None else g).reshape(-1) for n, g in zip(names, train_grad)]))


def test_batch_of_one(conve_run):
    got = TracIn(conve_run, params="all", train_indices=[5]).influence(conve_run.dataset.test[0])
    assert got.shape == (1, 1)


@pytest.mark.parametrize("model,params", [("conve", "last"), ("conve", "all"), ("distmult", "all")])
def test_self_influence_is_the_diagonal(request, model, params):
    run = request.getfixturevalue(f"{model}_run")
    rows = torch.cat([torch.arange(40, 100), (run.dataset.train[:, 0] == run.dataset.train[:, 2]).nonzero()[:3, 0]])
    tracin = TracIn(run, params=params, train_indices=rows, chunk_size=25)
    diagonal = tracin.influence(run.dataset.train[rows]).diagonal()
    self_inf = tracin.self_influence()
    assert self_inf.shape == (len(rows),) and self_inf.dtype == torch.float32 and (self_inf > 0).all()
    torch.testing.assert_close(self_inf, diagonal, rtol=1e-4, atol=1e-4 * diagonal.abs().max().item())
    per = tracin.checkpoint_self_influence()
    assert per.shape == (4, len(rows)) and (per >= 0).all()


def test_top_k_streams_to_the_same_answer(conve_run):
    """top_k (one streaming pass, any chunking) equals the top of the full influence matrix."""
    rows = torch.arange(200, 900)
    test = conve_run.dataset.test[:3]
    full = TracIn(conve_run, train_indices=rows).influence(test)
    per_checkpoint = torch.stack([TracIn(conve_run, checkpoints=[c.epoch], train_indices=rows).influence(test)
                                  for c in conve_run.checkpoints])  # [C, n, m]
    for chunk in (64, 333, 4096):
        results = TracIn(conve_run, train_indices=rows, chunk_size=chunk).top_k(test, k=5)
        for i, (res, triple) in enumerate(zip(results, test)):
            assert torch.equal(res.test, triple)
            assert (res.proponent_influence[:-1] >= res.proponent_influence[1:]).all()
            assert (res.opponent_influence[:-1] <= res.opponent_influence[1:]).all()
            torch.testing.assert_close(res.proponent_influence, torch.topk(full[i], 5).values)
            torch.testing.assert_close(res.opponent_influence, torch.topk(full[i], 5, largest=False).values)
            # Indices are into dataset.train, not into the subset; parts split the influence by checkpoint.
            assert ((res.proponents >= 200) & (res.proponents < 900)).all()
            torch.testing.assert_close(full[i, res.proponents - 200], res.proponent_influence)
            torch.testing.assert_close(res.proponent_parts, per_checkpoint[:, i, res.proponents - 200].T)
            torch.testing.assert_close(res.opponent_parts.sum(1), res.opponent_influence)


def test_top_k_resumes_after_a_kill(conve_run, tmp_path, monkeypatch):
    rows, test = torch.arange(1000), conve_run.dataset.test[:2]
    expected = TracIn(conve_run, train_indices=rows, chunk_size=100).top_k(test, k=4)
    state = tmp_path / "state.pt"
    monkeypatch.setattr(tracin_module, "SAVE_EVERY_S", 0.0)
    tracin = TracIn(conve_run, train_indices=rows, chunk_size=100)
    calls = {"n": 0}
    real = tracin._factorise

    def dying(model, triples):
        calls["n"] += 1
        if calls["n"] > 4 + 6 * 4:  # test factors once per checkpoint, then six chunks of four checkpoints
            raise KeyboardInterrupt
        return real(model, triples)

    monkeypatch.setattr(tracin, "_factorise", dying)
    with pytest.raises(KeyboardInterrupt):
        tracin.top_k(test, k=4, state=state)
    saved = torch.load(state, weights_only=True)
    assert saved["next"] == 6
    stale, other = tmp_path / ".state.pt.abcd1234.tmp", tmp_path / ".other.pt.abcd1234.tmp"
    stale.write_bytes(b"half a save")  # as a kill during a save leaves it
    other.write_bytes(b"not the state's")
    resumed = TracIn(conve_run, train_indices=rows, chunk_size=100)
    seen = []
    monkeypatch.setattr(resumed, "_factorise", lambda m, t: seen.append(len(t)) or real(m, t))
    got = resumed.top_k(test, k=4, state=state)
    assert len(seen) == 4 + 4 * 4  # test factors, then only the four chunks left
    assert not state.exists() and not stale.exists() and other.exists()
    for a, b in zip(got, expected):
        assert torch.equal(a.proponents, b.proponents) and torch.equal(a.opponents, b.opponents)
        torch.testing.assert_close(a.proponent_influence, b.proponent_influence)
    # A state of another computation is not resumed from.
    monkeypatch.setattr(resumed, "_factorise", real)
    torch.save({"signature": "other", "next": 9, "data": {}}, state)
    other = resumed.top_k(test, k=4, state=state)
    assert torch.equal(other[0].proponents, expected[0].proponents)


def one_model(run):
    """Bytes of one checkpoint's model: a memory budget of this holds one checkpoint at a time."""
    return sum(t.numel() * t.element_size() for t in [*run.model.parameters(), *run.model.buffers()])


def test_checkpoints_a_group_at_a_time_give_the_same_results(conve_run, tmp_path):
    rows, test = torch.arange(1000), conve_run.dataset.test[:3]
    whole = TracIn(conve_run, train_indices=rows, chunk_size=100)
    expected = whole.top_k(test, k=5)
    for per_group, sizes in ((1, [1, 1, 1, 1]), (3, [3, 1])):
        grouped = TracIn(conve_run, train_indices=rows, chunk_size=100, memory_budget=per_group * one_model(conve_run))
        assert [len(g) for g in grouped.groups] == sizes
        for a, b in zip(grouped.top_k(test, k=5, state=tmp_path / "state.pt"), expected, strict=True):
            for field in fields(a):  # bit for bit: the spilled parts are the very floats ranked before
                assert torch.equal(getattr(a, field.name), getattr(b, field.name)), field.name
        assert list(tmp_path.iterdir()) == []  # the spilled parts and the state go when the pass is done
        assert torch.equal(grouped.checkpoint_self_influence(), whole.checkpoint_self_influence())
        torch.testing.assert_close(grouped.influence(test), whole.influence(test))
    # Without a state file the parts spill into a temporary folder, removed after.
    grouped = TracIn(conve_run, train_indices=rows, chunk_size=100, memory_budget=one_model(conve_run))
    assert torch.equal(grouped.top_k(test, k=5)[0].proponents, expected[0].proponents)


def test_a_group_at_a_time_resumes_after_kills(conve_run, tmp_path, monkeypatch):
    """Killed while spilling the second checkpoint, then while ranking in the last: the resumed passes agree."""
    rows, test = torch.arange(1000), conve_run.dataset.test[:2]
    expected = TracIn(conve_run, train_indices=rows, chunk_size=100).top_k(test, k=4)
    state = tmp_path / "state.pt"
    monkeypatch.setattr(tracin_module, "SAVE_EVERY_S", 0.0)

    def killed_after(calls):
        tracin = TracIn(conve_run, train_indices=rows, chunk_size=100, memory_budget=one_model(conve_run))
        real, seen = tracin._factorise, []

        def dying(model, triples):
            seen.append(len(triples))
            if len(seen) > calls:
                raise KeyboardInterrupt
            return real(model, triples)

        monkeypatch.setattr(tracin, "_factorise", dying)
        with pytest.raises(KeyboardInterrupt):
            tracin.top_k(test, k=4, state=state)
        return torch.load(state, weights_only=True)["next"]

    # Per checkpoint: its test factors, then ten chunks of 100 training triples.
    assert killed_after((1 + 10) + (1 + 3)) == 10 + 3  # first checkpoint spilled, three chunks of the second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt", "state.pt.spill0", "state.pt.spill1",
                                                          "state.pt.spill2"]
    assert killed_after((1 + 7) + (1 + 10) + (1 + 5)) == 3 * 10 + 5  # resumed; killed ranking in the last
    resumed = TracIn(conve_run, train_indices=rows, chunk_size=100, memory_budget=one_model(conve_run))
    seen = []
    real = resumed._factorise
    monkeypatch.setattr(resumed, "_factorise", lambda m, t: seen.append(len(t)) or real(m, t))
    got = resumed.top_k(test, k=4, state=state)
    assert len(seen) == 1 + 5  # the last checkpoint's test factors and its five chunks left
    assert list(tmp_path.iterdir()) == []
    for a, b in zip(got, expected, strict=True):
        for field in fields(a):
            assert torch.equal(getattr(a, field.name), getattr(b, field.name)), field.name


def test_a_cut_spill_file_is_an_error_not_zeros(conve_run, tmp_path, monkeypatch):
    """A resumed pass whose spilled parts lost their end says which file, and how to start over."""
    rows, test, state = torch.arange(1000), conve_run.dataset.test[:2], tmp_path / "state.pt"
    monkeypatch.setattr(tracin_module, "SAVE_EVERY_S", 0.0)
    tracin = TracIn(conve_run, train_indices=rows, chunk_size=100, memory_budget=one_model(conve_run))
    real, calls = tracin._factorise, []

    def dying(model, triples):
        calls.append(len(triples))
        if len(calls) > 3 * (1 + 10) + (1 + 2):  # three checkpoints spilled, two chunks ranked in the last
            raise KeyboardInterrupt
        return real(model, triples)

    monkeypatch.setattr(tracin, "_factorise", dying)
    with pytest.raises(KeyboardInterrupt):
        tracin.top_k(test, k=4, state=state)
    spilled = tmp_path / "state.pt.spill1"
    spilled.write_bytes(spilled.read_bytes()[:1000])
    resumed = TracIn(conve_run, train_indices=rows, chunk_size=100, memory_budget=one_model(conve_run))
    with pytest.raises(KgtraceError, match=r"state.pt.spill1: holds 0 of the \d+ bytes of chunk 2.*delete it"):
        resumed.top_k(test, k=4, state=state)


def test_a_group_at_a_time_refuses_without_the_disk(conve_run, tmp_path, monkeypatch):
    monkeypatch.setattr(spill_module.shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
    tracin = TracIn(conve_run, train_indices=torch.arange(1000), memory_budget=one_model(conve_run))
    with pytest.raises(KgtraceError, match=r"needs 0\.0 GiB.*raise memory_budget.*elsewhere \(state\)"):
        tracin.top_k(conve_run.dataset.test[:2], state=tmp_path / "state.pt")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="memory_budget='lots'"):
        TracIn(conve_run, memory_budget="lots")


def test_save_every_sets_how_often_a_pass_saves_its_progress(conve_run, tmp_path, monkeypatch):
    tracin = TracIn(conve_run, train_indices=torch.arange(500), chunk_size=100)
    checkpoints, real = len(tracin.checkpoints), tracin._factorise

    def killed_in_chunk_3(save_every):
        calls = {"n": 0}

        def dying(model, triples):
            calls["n"] += 1
            if calls["n"] > 2 * checkpoints:  # two chunks of every checkpoint done
                raise KeyboardInterrupt
            return real(model, triples)

        state = tmp_path / f"state-{save_every}.pt"
        monkeypatch.setattr(tracin, "_factorise", dying)
        with pytest.raises(KeyboardInterrupt):
            tracin.self_influence(state=state, save_every=save_every)
        return state

    assert torch.load(killed_in_chunk_3(0), weights_only=True)["next"] == 2  # 0: after every chunk
    monkeypatch.setattr(tracin_module, "SAVE_EVERY_S", 1e9)
    assert not killed_in_chunk_3(None).exists()  # the default: every SAVE_EVERY_S seconds
    with pytest.raises(ConfigError, match="save_every=-1"):
        tracin.top_k(conve_run.dataset.test[:1], state=tmp_path / "s.pt", save_every=-1)


def test_bf16_precision_is_close(conve_run):
    rows, test = torch.arange(0, 5216, 7), conve_run.dataset.test[:3]
    exact = TracIn(conve_run, params="all", train_indices=rows).influence(test)
    low = TracIn(conve_run, params="all", train_indices=rows, precision="bf16").influence(test)
    error = ((low - exact).abs().max() / exact.abs().max()).item()
    assert 0 < error < 0.05  # bf16 keeps 8 bits of mantissa: about 1e-2 relative, not exact


@pytest.mark.parametrize("params", ["all", ["entity_embeddings", "bn1.weight"], ["relation_embeddings", "conv.bias"]])
def test_forward_mode_agrees_with_per_triple_gradients(conve_run, params, monkeypatch):
    """For few test triples ConvE's upstream terms are taken in forward mode: same influences."""
    from kgtrace.attribution.conve import band_plan

    rows = torch.arange(0, 2400)
    for test in (conve_run.dataset.test[:1], torch.tensor([[5, 3, 5], [7, 2, 9]])):
        tracin = TracIn(conve_run, params=params, train_indices=rows, chunk_size=1200)
        assert band_plan(tracin.model, tracin.names, len(test), conve_run.dataset.train[rows[:1200]], 2400) == {
            "head", "pair", "relation"}
        got = tracin.influence(test)
        with monkeypatch.context() as m:
            m.setattr(tracin_module, "_FORWARD_MODE", False)  # reverse mode: per-triple gradients
            expected = tracin.influence(test)
        assert_agrees(got, expected.double())
    ref = TracIn(conve_run, params=params, path="reference", train_indices=rows[::20]).influence(test)
    assert_agrees(TracIn(conve_run, params=params, train_indices=rows[::20], chunk_size=120).influence(test), ref)


def test_default_chunks_bound_the_dense_gradients_of_row_form_fast_paths():
    """TuckER's fast path is the row form: its core tensor's gradient is dense per triple, so the default chunk
    shrinks with it (an 8M-parameter core takes one triple at a time) where a factored gradient keeps FAST_CHUNKS."""
    from kgtrace.attribution.paths import FAST_CHUNKS, default_chunk_size
    from kgtrace.models import build_model

    cpu = torch.device("cpu")
    with torch.device("meta"):
        big = build_model("tucker", 1000, 10, embedding_dim=200, relation_dim=200)
    small = build_model("tucker", 50, 4, embedding_dim=16, relation_dim=16)
    every = [name for name, _ in small.named_parameters()]
    assert default_chunk_size(big, [name for name, _ in big.named_parameters()], "fast", cpu) == 1
    assert 1 < default_chunk_size(small, every, "fast", cpu) < FAST_CHUNKS["cpu"]
    assert default_chunk_size(small, ["entity_embeddings"], "fast", cpu) == FAST_CHUNKS["cpu"]
    assert default_chunk_size(build_model("distmult", 50, 4), ["entity_embeddings", "relation_embeddings"], "fast",
                              torch.device("cuda")) == FAST_CHUNKS["cuda"]
