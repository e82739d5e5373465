"""Scoring-contract and reference tests for every registered model (ConvE, DistMult, ComplEx, TransE, RotatE,
TuckER, RESCAL).

Models run in float64 so that comparisons with independently written reference
computations test the algebra, not float32 rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import spec_named
from kgtrace.models import MODELS, ComplEx, ConvE, DistMult, FactorisedScorer, Rescal, RotatE, TransE, TuckER, build_model
from kgtrace.models.transe import euclidean

E, R = 7, 3
TOL = {"rtol": 1e-6, "atol": 1e-9}


def _randomise_conve(model: ConvE) -> None:
    """Give the entity bias non-trivial values (the batch norms: `_randomise_batch_norms`)."""
    with torch.no_grad():
        model.entity_bias.normal_()


SETTINGS = {  # small settings of each model: a new model's go here
    "conve": {"embedding_dim": 8, "embedding_height": 2, "output_channels": 4},
    "distmult": {"embedding_dim": 6},
    "complex": {"embedding_dim": 4},
    "transe": {"embedding_dim": 5},
    "rotate": {"embedding_dim": 4, "margin": 2.0},
    "tucker": {"embedding_dim": 6, "relation_dim": 3},
    "rescal": {"embedding_dim": 4},
}


def _randomise_batch_norms(model: torch.nn.Module) -> None:
    """Batch-norm affine parameters and running statistics of non-trivial values."""
    with torch.no_grad():
        for bn in model.modules():
            if isinstance(bn, torch.nn.BatchNorm1d | torch.nn.BatchNorm2d):
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.normal_(0, 0.3)
                bn.running_mean.normal_(0, 0.3)
                bn.running_var.uniform_(0.5, 2.0)


def make_model(name: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(name, E, R, **{**SETTINGS[name], **overrides}).double()
    if name == "conve":
        _randomise_conve(model)
    _randomise_batch_norms(model)
    return model.eval()


def test_every_model_has_small_settings():
    assert set(SETTINGS) == set(MODELS)


def all_hrt() -> torch.Tensor:
    """Every (h, r, t) triple over E entities and R relations, [E*R*E, 3]."""
    grid = torch.cartesian_prod(torch.arange(E), torch.arange(R), torch.arange(E))
    return grid


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_implement_the_protocol(name):
    model = make_model(name)
    assert isinstance(model, FactorisedScorer)
    assert (model.num_entities, model.num_relations) == (E, R)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_score_hrt_equals_columns_of_score_t_and_score_h(name):
    model = make_model(name)
    hrt = all_hrt()
    rows = torch.arange(len(hrt))
    inverse_hrt = torch.stack([hrt[:, 2], hrt[:, 1] + R, hrt[:, 0]], dim=1)
    with torch.no_grad():
        direct = model.score_hrt(hrt)
        tails = model.score_t(hrt[:, :2])[rows, hrt[:, 2]]
        heads = model.score_h(hrt[:, 1:])[rows, hrt[:, 0]]
        inverse = model.score_hrt(inverse_hrt)
    assert direct.shape == (len(hrt),)
    torch.testing.assert_close(direct, tails, **TOL)
    # A head query is the tail query (t, r + R, ?): for every model its column h is the
    # score of the inverse triple. Models that answer the inverse from r's own parameters (conjugate,
    # transpose, negated translation or rotation) equal the forward score there too; those whose spec
    # gives inverses rows of their own (ConvE, TuckER) learn r + R apart.
    torch.testing.assert_close(heads, inverse, **TOL)
    if not spec_named(name).inverse_relations:
        torch.testing.assert_close(direct, heads, **TOL)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_score_h_is_score_t_of_the_inverse_relation(name):
    model = make_model(name)
    rt = torch.cartesian_prod(torch.arange(R), torch.arange(E))
    with torch.no_grad():
        heads = model.score_h(rt)
        inverse = model.score_t(torch.stack([rt[:, 1], rt[:, 0] + R], dim=1))
    assert heads.shape == (len(rt), E)
    torch.testing.assert_close(heads, inverse, **TOL)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_decode_chunks_concatenate_to_score_t(name):
    model = make_model(name)
    hr = torch.cartesian_prod(torch.arange(E), torch.arange(2 * R))
    with torch.no_grad():
        q = model.encode_query(hr)
        chunks = [model.decode(q, start, min(start + 3, E)) for start in range(0, E, 3)]
        full = model.score_t(hr)
    assert [c.shape[1] for c in chunks] == [3, 3, 1]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, **TOL)
    torch.testing.assert_close(model.decode(q), full, **TOL)
    ids = torch.randint(0, E, (len(hr), 5), generator=torch.Generator().manual_seed(1))  # repeats included
    with torch.no_grad():
        torch.testing.assert_close(model.decode_ids(q, ids), full.gather(1, ids), **TOL)


@pytest.mark.parametrize("name", ["distmult", "complex", "transe", "rotate", "rescal"])
def test_inverse_relations_keep_the_contract(name):
    """With their own inverse rows, head scores are the inverse relation's tail scores, not the forward ones."""
    model = make_model(name, inverse_relations=True)
    hrt = all_hrt()
    rows = torch.arange(len(hrt))
    with torch.no_grad():
        torch.testing.assert_close(model.score_hrt(hrt), model.score_t(hrt[:, :2])[rows, hrt[:, 2]], **TOL)
        heads = model.score_h(hrt[:, 1:])[rows, hrt[:, 0]]
        torch.testing.assert_close(heads, model.score_hrt(torch.stack([hrt[:, 2], hrt[:, 1] + R, hrt[:, 0]], 1)), **TOL)
        assert not torch.allclose(heads, model.score_hrt(hrt))


@pytest.mark.parametrize(("name", "overrides"), [("tucker", {}), ("rescal", {}), ("rescal", {"inverse_relations": True})])
def test_ranking_by_relation_equals_the_per_query_products(name, overrides):
    """Under inference mode (ranking) TuckER and RESCAL form each relation's matrix once per batch; the scores are
    those of the per-query products that autograd and training use."""
    model = make_model(name, **overrides)
    hr = torch.cartesian_prod(torch.arange(E), torch.arange(2 * R))  # every relation many times, in mixed order
    hr = hr[torch.randperm(len(hr), generator=torch.Generator().manual_seed(0))]
    with torch.no_grad():
        per_query = model.score_t(hr)
    with torch.inference_mode():
        grouped = model.score_t(hr)
    torch.testing.assert_close(grouped, per_query, **TOL)
    model.train()  # training mode: each query its own product, with its own dropout masks, as without inference mode
    with torch.inference_mode():
        torch.manual_seed(1)
        inferred = model.encode_query(hr)
    with torch.no_grad():
        torch.manual_seed(1)
        torch.testing.assert_close(inferred, model.encode_query(hr), **TOL)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_eval_mode_batch_of_one(name):
    model = make_model(name)
    hr = torch.tensor([[2, 1], [4, R + 2], [0, 0]])
    with torch.no_grad():
        batched = model.score_t(hr)
        singles = torch.cat([model.score_t(hr[i : i + 1]) for i in range(len(hr))])
        one = model.score_hrt(torch.tensor([[2, 1, 5]]))
    assert singles.shape == (3, E)
    torch.testing.assert_close(singles, batched, **TOL)
    torch.testing.assert_close(one, batched[0, 5:6], **TOL)


def _bn_eval(x: torch.Tensor, bn: torch.nn.Module) -> torch.Tensor:
    """Batch norm with running statistics over the channel dimension 1, written out."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    mean, var = bn.running_mean.view(shape), bn.running_var.view(shape)
    return (x - mean) / torch.sqrt(var + bn.eps) * bn.weight.view(shape) + bn.bias.view(shape)


def naive_conve_score(model: ConvE, h: int, r: int, t: int) -> torch.Tensor:
    """One triple's ConvE score in eval mode, layer by layer, F.conv2d on a single image."""
    height, width = model.embedding_height, model.embedding_width
    head = model.entity_embeddings[h].view(height, width)
    rel = model.relation_embeddings[r].view(height, width)
    image = torch.cat([head, rel], dim=0).view(1, 1, 2 * height, width)
    x = _bn_eval(image, model.bn0)
    x = F.conv2d(x, model.conv.weight, model.conv.bias)
    x = torch.relu(_bn_eval(x, model.bn1))
    x = x.reshape(1, -1) @ model.fc.weight.t() + model.fc.bias
    q = torch.relu(_bn_eval(x, model.bn2))[0]
    return (q * model.entity_embeddings[t]).sum() + model.entity_bias[t]


def test_conve_equals_naive_per_triple_computation():
    model = make_model("conve")
    hrt = torch.cartesian_prod(torch.arange(E), torch.arange(2 * R), torch.arange(E))[::5]
    with torch.no_grad():
        expected = torch.stack([naive_conve_score(model, h, r, t) for h, r, t in hrt.tolist()])
        scores = model.score_t(hrt[:, :2])[torch.arange(len(hrt)), hrt[:, 2]]
        direct = model.score_hrt(hrt)
    torch.testing.assert_close(scores, expected, **TOL)
    torch.testing.assert_close(direct, expected, **TOL)


def naive_conve_train_query(model: ConvE, hr: torch.Tensor, p_in: float, p_fm: float, p_out: float):
    """Training-mode query [B, D] layer by layer with nn-style batch norm on the whole batch.

    Draws its dropout masks in the same order and shapes as ConvE does, so with the same
    seed it sees the same masks; Dropout2d is applied as an explicit channel mask.
    """
    height, width = model.embedding_height, model.embedding_width
    h = model.entity_embeddings[hr[:, 0]].view(-1, 1, height, width)
    r = model.relation_embeddings[hr[:, 1]].view(-1, 1, height, width)
    x = torch.cat([h, r], dim=2)  # [B, 1, 2H, W]
    x = F.batch_norm(x, model.bn0.running_mean, model.bn0.running_var, model.bn0.weight, model.bn0.bias, True)
    x = F.dropout(x, p_in, True)
    x = F.conv2d(x, model.conv.weight, model.conv.bias)
    bn1 = model.bn1
    x = torch.relu(F.batch_norm(x, bn1.running_mean, bn1.running_var, bn1.weight, bn1.bias, True))
    keep = x.new_empty(x.shape[0], x.shape[1], 1).bernoulli_(1 - p_fm).div_(1 - p_fm)
    x = x * keep.unsqueeze(-1)
    x = F.dropout(model.fc(x.flatten(1)), p_out, True)
    bn2 = model.bn2
    return torch.relu(F.batch_norm(x, bn2.running_mean, bn2.running_var, bn2.weight, bn2.bias, True))


def _clone(model: ConvE) -> ConvE:
    twin = make_model("conve", **_conve_dropouts(model))
    twin.load_state_dict(model.state_dict())
    return twin


def _conve_dropouts(model: ConvE) -> dict:
    return {
        "input_dropout": model.input_dropout,
        "feature_map_dropout": model.feature_map_dropout,
        "output_dropout": model.output_dropout,
    }


@pytest.mark.parametrize("dropouts", [(0.0, 0.0, 0.0), (0.2, 0.5, 0.3)])
def test_conve_training_mode_matches_layer_by_layer(dropouts):
    """Folded bn1 + dropout2d equal the layer sequence: outputs, gradients, running stats."""
    p_in, p_fm, p_out = dropouts
    model = make_model("conve", input_dropout=p_in, feature_map_dropout=p_fm, output_dropout=p_out).train()
    reference = _clone(model).train()
    hr = torch.cartesian_prod(torch.arange(E), torch.arange(2 * R))
    torch.manual_seed(1)
    q = model.encode_query(hr)
    torch.manual_seed(1)
    q_ref = naive_conve_train_query(reference, hr, p_in, p_fm, p_out)
    torch.testing.assert_close(q, q_ref, **TOL)
    weights = torch.randn_like(q)
    (q * weights).sum().backward()
    (q_ref * weights).sum().backward()
    for (name, param), ref_param in zip(model.named_parameters(), reference.parameters()):
        expected = ref_param.grad if ref_param.grad is not None else torch.zeros_like(ref_param)
        actual = param.grad if param.grad is not None else torch.zeros_like(param)
        # bn1 cancels conv.bias exactly; the reference keeps rounding noise there.
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-10, msg=name)
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(model.bn1, name), getattr(reference.bn1, name), **TOL)
    assert int(model.bn1.num_batches_tracked) == 1


def test_conve_without_batch_norm_equals_naive():
    model = make_model("conve", apply_batch_normalization=False, input_dropout=0.0)
    assert model.bn0 is None and model.bn1 is None and model.bn2 is None
    hr = torch.tensor([[1, 2], [3, R], [6, 2 * R - 1]])
    height, width = model.embedding_height, model.embedding_width
    with torch.no_grad():
        image = torch.cat([model.entity_embeddings[hr[:, 0]], model.relation_embeddings[hr[:, 1]]], dim=1)
        x = torch.relu(F.conv2d(image.view(-1, 1, 2 * height, width), model.conv.weight, model.conv.bias))
        q = torch.relu(model.fc(x.flatten(1)))
        expected = q @ model.entity_embeddings.t() + model.entity_bias
        torch.testing.assert_close(model.score_t(hr), expected, **TOL)


def test_complex_inverse_equals_conjugate_formula():
    model = make_model("complex")
    dim = model.embedding_dim
    ent = torch.complex(model.entity_embeddings[:, :dim], model.entity_embeddings[:, dim:])  # [E, D]
    rel = torch.complex(model.relation_embeddings[:, :dim], model.relation_embeddings[:, dim:])  # [R, D]
    # score(h, r, t) = Re(sum_d h_d r_d conj(t_d)) for every (h, r, t): [E, R, E]
    naive = torch.einsum("hd,rd,td->hrt", ent, rel, ent.conj()).real
    with torch.no_grad():
        for r in range(R):
            for t in range(E):
                heads = model.score_t(torch.tensor([[t, r + R]]))[0]
                torch.testing.assert_close(heads, naive[:, r, t], **TOL)
            tails = model.score_t(torch.stack([torch.arange(E), torch.full((E,), r)], dim=1))
            torch.testing.assert_close(tails, naive[:, r, :], **TOL)


def test_distmult_inverse_reuses_the_relation():
    model = make_model("distmult")
    naive = torch.einsum("hd,rd,td->hrt", model.entity_embeddings, model.relation_embeddings, model.entity_embeddings)
    with torch.no_grad():
        heads = model.score_t(torch.tensor([[4, 1 + R]]))[0]
    torch.testing.assert_close(heads, naive[:, 1, 4], **TOL)


def test_build_model_returns_configured_models():
    conve = build_model("conve", E, R, embedding_dim=12, embedding_height=3, output_channels=5)
    assert isinstance(conve, ConvE)
    assert (conve.embedding_height, conve.embedding_width, conve.conv.out_channels) == (3, 4, 5)
    assert isinstance(build_model("distmult", E, R), DistMult)
    assert build_model("complex", E, R, embedding_dim=5).entity_embeddings.shape == (E, 10)
    assert MODELS == {"conve": ConvE, "distmult": DistMult, "complex": ComplEx, "transe": TransE, "rotate": RotatE,
                      "tucker": TuckER, "rescal": Rescal}


def test_build_model_rejects_unknown_name():
    with pytest.raises(ConfigError) as info:
        build_model("hole", E, R)
    assert "hole" in str(info.value) and "conve" in str(info.value)


def test_build_model_lists_unknown_keys_and_bad_values_together():
    with pytest.raises(ConfigError) as info:
        build_model("conve", E, R, embedding_dim=10, embedding_height=3, input_dropout=1.0, kernal_width=3)
    problems = info.value.problems
    assert len(problems) == 3
    unknown = next(p for p in problems if p.startswith("kernal_width=3"))
    assert "kernel_width" in unknown and "embedding_dim" in unknown  # lists the valid keys
    assert any(p.startswith("embedding_height=3") and "[1, 2, 5, 10]" in p for p in problems)
    assert any(p.startswith("input_dropout=1.0") for p in problems)


def test_conve_reports_every_bad_hyperparameter():
    with pytest.raises(ConfigError) as info:
        ConvE(
            0,
            R,
            embedding_dim=8,
            embedding_height=2,
            kernel_height=5,
            kernel_width=5,
            feature_map_dropout=-0.1,
            output_dropout=1,
            output_channels=0,
            apply_batch_normalization="yes",
        )
    keys = [p.split("=")[0] for p in info.value.problems]
    assert sorted(keys) == sorted(
        [
            "num_entities",
            "output_channels",
            "feature_map_dropout",
            "output_dropout",
            "apply_batch_normalization",
            "kernel_height",
            "kernel_width",
        ]
    )
    assert all("fix:" in p for p in info.value.problems)


@pytest.mark.parametrize("model_class", [DistMult, ComplEx, TransE, RotatE, TuckER, Rescal])
def test_embedding_models_validate_sizes(model_class):
    with pytest.raises(ConfigError) as info:
        model_class(E, 0, embedding_dim=True)
    assert [p.split("=")[0] for p in info.value.problems] == ["num_relations", "embedding_dim"]


# ----------------------------------------------------------------------------- written-out references


def naive_scores(name: str, model: torch.nn.Module) -> torch.Tensor:
    """Every (h, r, t) score [E, R, E] written from the papers' formulas, loop-free but independent of the models'
    code paths (no encode_query, no decode)."""
    e = model.entity_embeddings
    if name == "transe":
        diff = e[:, None, None, :] + model.relation_embeddings[None, :, None, :] - e[None, None, :, :]
        return model.margin - diff.abs().sum(-1) if model.scoring_norm == 1 else model.margin - diff.norm(dim=-1)
    if name == "rotate":
        h = torch.complex(*e.chunk(2, dim=1))  # [E, D]
        r = torch.polar(torch.ones_like(model.relation_phases), model.relation_phases)  # [R, D]
        moduli = (h[:, None, None, :] * r[None, :, None, :] - h[None, None, :, :]).abs()  # [E, R, E, D]
        return model.margin - (moduli.sum(-1) if model.scoring_norm == 1 else moduli.square().sum(-1).sqrt())
    if name == "rescal":
        m = model.relation_matrices.view(R, model.embedding_dim, model.embedding_dim)
        return torch.einsum("hd,rde,te->hrt", e, m, e)
    if name == "tucker":
        x = (e - model.bn0.running_mean) / torch.sqrt(model.bn0.running_var + model.bn0.eps) * model.bn0.weight \
            + model.bn0.bias  # [E, De]
        q = torch.einsum("rk,kij,hi->hrj", model.relation_embeddings[:R], model.core, x)  # [E, R, De]
        q = (q - model.bn1.running_mean) / torch.sqrt(model.bn1.running_var + model.bn1.eps) * model.bn1.weight \
            + model.bn1.bias
        return torch.einsum("hrj,tj->hrt", q, e)
    raise AssertionError(name)


@pytest.mark.parametrize(("name", "overrides"), [("transe", {}), ("transe", {"scoring_norm": 2}), ("rotate", {}),
                                                  ("rotate", {"scoring_norm": 2}), ("rescal", {}), ("tucker", {})])
def test_scores_equal_the_papers_formulas(name, overrides):
    model = make_model(name, **overrides)
    hrt = all_hrt()
    with torch.no_grad():
        expected = naive_scores(name, model)[hrt[:, 0], hrt[:, 1], hrt[:, 2]]
        torch.testing.assert_close(model.score_hrt(hrt), expected, **TOL)
        torch.testing.assert_close(model.score_t(hrt[:, :2])[torch.arange(len(hrt)), hrt[:, 2]], expected, **TOL)


@pytest.mark.parametrize("grad", [False, True])
def test_distance_models_decode_in_chunks(monkeypatch, grad):
    """A distance decode holds [B, chunk, D] differences (RotatE's ranking, and both under autograd): any
    chunking gives the same scores."""
    import kgtrace.models.transe as transe

    hr = torch.cartesian_prod(torch.arange(E), torch.arange(2 * R))
    for name in ("transe", "rotate"):
        model = make_model(name)
        with torch.set_grad_enabled(grad):
            whole = model.score_t(hr)
            monkeypatch.setattr(transe, "DIFFERENCES", 1)  # one entity per chunk
            torch.testing.assert_close(model.score_t(hr), whole, **TOL)
            monkeypatch.undo()


@pytest.mark.parametrize("norm", [1, 2])
def test_transe_decode_by_cdist_equals_the_differences(norm):
    """TransE's decode (torch.cdist) gives the scores of the differences written out (to rounding: its own order of
    summation)."""
    model = make_model("transe", scoring_norm=norm).float()
    hr = torch.cartesian_prod(torch.arange(E), torch.arange(2 * R))
    with torch.no_grad():
        q = model.encode_query(hr)
        expected = model.margin - torch.linalg.vector_norm(q.unsqueeze(1) - model.entity_embeddings, ord=norm, dim=-1)
        got = model.decode(q)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    with_grad = model.decode(model.encode_query(hr))  # the differences in chunks, twice differentiable
    assert with_grad.requires_grad
    torch.testing.assert_close(with_grad.detach(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["transe", "rotate"])
def test_distance_gradients_are_finite_at_zero_distance(name):
    """A triple whose translated or rotated head lands on its tail has distance 0: its gradient is a subgradient,
    not NaN."""
    model = make_model(name).train()
    with torch.no_grad():
        model.entity_embeddings[1] = model.entity_embeddings[0]
        if name == "transe":
            model.relation_embeddings.zero_()
        else:
            model.relation_phases.zero_()
    model.score_hrt(torch.tensor([[0, 0, 1]])).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_run_on_cuda(name):
    model = make_model(name).float()
    hr = torch.cartesian_prod(torch.arange(E), torch.arange(2 * R))
    with torch.no_grad():
        expected = model.score_t(hr)
        actual = model.cuda().score_t(hr.cuda()).cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    model.train()
    model.score_t(hr.cuda()).sum().backward()


def test_rotate_euclidean_ranking_by_cdist_equals_its_differences():
    """RotatE with scoring_norm 2 ranks by torch.cdist over [Re | Im]: the Euclidean norm of the moduli."""
    model = make_model("rotate", scoring_norm=2)
    hr = torch.cartesian_prod(torch.arange(E), torch.arange(2 * R))
    with torch.no_grad():
        ranked = model.score_t(hr)
    with_grad = model.score_t(hr)  # the moduli of the differences, in chunks
    assert with_grad.requires_grad
    torch.testing.assert_close(ranked, with_grad.detach(), **TOL)


def test_euclidean_ranking_distances_equal_float64_differences():
    """`euclidean`'s float64 matrix-product expansion on float32 inputs: the distances of float64 differences to
    float32 rounding, near zero (a query beside an entity) and far, with large norms; equal rows tie exactly."""
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(60, 64, generator=generator) * 30.0
    table[7] = table[3]  # two equal entities: any query's distances to them tie
    q = torch.cat([table[:10] + 1e-3 * torch.randn(10, 64, generator=generator), torch.randn(20, 64, generator=generator)])
    got = euclidean(q, table)
    assert got.dtype == torch.float32
    expected = torch.linalg.vector_norm(q.double().unsqueeze(1) - table.double(), dim=-1)
    torch.testing.assert_close(got.double(), expected, rtol=2e-7, atol=1e-6)
    assert torch.equal(got[:, 3], got[:, 7])
    torch.testing.assert_close(euclidean(q.double(), table.double()), expected)  # float64: cdist's own sums
