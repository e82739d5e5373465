"""ConvE's fc input computed in bands (head rows, mixed rows, relation rows) equals the whole-input pass; so do
influences with the bands' upstream terms in forward or reverse mode."""

import itertools

import pytest
import torch

from kgtrace.attribution import select_parameters
from kgtrace.attribution.conve import RELATION_PRODUCTS, band_plan, conve_factors, conve_influence, pair_pass
from kgtrace.attribution.conve_bands import band_pass, band_values, bands, relation_band
from kgtrace.attribution.factors import dot
from kgtrace.attribution.grads import dense_factors
from kgtrace.models.conve import ConvE


def model(height, kernel, batch_norm, dim=24, seed=0):
    torch.manual_seed(seed)
    m = ConvE(7, 3, embedding_dim=dim, embedding_height=height, output_channels=5, kernel_height=kernel[0],
              kernel_width=kernel[1], apply_batch_normalization=batch_norm)
    with torch.no_grad():
        m.entity_bias.normal_()
        for bn in (m.bn0, m.bn1, m.bn2) if batch_norm else ():
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.normal_()
            bn.bias.normal_()
    return m.eval()


@pytest.mark.parametrize("height,kernel,batch_norm,expected", [
    (4, (3, 3), True, [("head", range(0, 2)), ("pair", range(2, 4)), ("relation", range(4, 6))]),
    (4, (3, 2), False, [("head", range(0, 2)), ("pair", range(2, 4)), ("relation", range(4, 6))]),
    (4, (1, 3), True, [("head", range(0, 4)), ("relation", range(4, 8))]),  # kh = 1: no row sees both
    (3, (5, 3), True, [("pair", range(0, 2))]),  # kh > H: every row sees both halves
    (2, (4, 1), True, [("pair", range(0, 1))]),  # kh = 2H: one output row
])
def test_bands_equal_the_whole_fc_input(height, kernel, batch_norm, expected):
    m = model(height, kernel, batch_norm)
    assert bands(m) == expected
    pairs = torch.tensor([[0, 0], [0, 4], [3, 4], [6, 1], [3, 2], [2, 5]])  # shared heads, shared relations
    with torch.no_grad():
        a, _, _ = pair_pass(m, pairs)  # [U, F]
        fc_bands, z = band_pass(m, pairs)
    assembled = torch.full_like(a, float("nan"))
    for band in fc_bands:
        assembled[:, band.columns] = band.a[band.index]
    torch.testing.assert_close(assembled, a)  # every column covered once, with the same value
    torch.testing.assert_close(z, m.fc(a))
    distinct = {"head": 4, "pair": 6, "relation": 5}  # heads 0, 3, 6, 2; six pairs; relations 0, 4, 1, 2, 5
    assert [band.a.shape[0] for band in fc_bands] == [distinct[key] for key, _ in expected]  # a row per distinct id


@pytest.mark.parametrize("batch_norm", [True, False])
def test_band_jvps_equal_the_whole_inputs_columns(batch_norm):
    """Forward mode per band (rows of the image sliced, head or relation tangents only where the band sees them)."""
    from kgtrace.attribution.conve_bands import KEYS
    from kgtrace.attribution.conve_block import block_jvp, conv_block

    m = model(4, (3, 3), batch_norm, seed=1)
    pairs = torch.tensor([[0, 0], [0, 4], [3, 4], [6, 1], [3, 2], [2, 5]])
    g = torch.Generator().manual_seed(2)
    entity_tangent, relation_tangent = torch.randn(7, 24, generator=g), torch.randn(6, 24, generator=g)
    entity_tangent[6] = 0  # a head the test gradient does not touch
    tangent = {"conv.weight": torch.randn(m.conv.weight.shape, generator=g), "conv.bias": torch.randn(5, generator=g)}
    if batch_norm:
        tangent |= {"bn0.weight": torch.randn(1, generator=g), "bn1.bias": torch.randn(5, generator=g)}
    with torch.no_grad():
        a, _, _ = pair_pass(m, pairs)
        whole = block_jvp(m, conv_block(m, pairs, a), tangent, entity_tangent[pairs[:, 0]], relation_tangent[pairs[:, 1]])
        for band in band_pass(m, pairs)[0]:
            sees = KEYS[band.key]  # 0: the head only, 1: the relation only, None: both
            dh = entity_tangent[band.ids[:, 0]] * (sees != 1)
            dr = relation_tangent[band.ids[:, 1]] * (sees != 0)
            got = block_jvp(m, conv_block(m, band.ids, band.a, band.image_rows(m)), tangent, dh, dr)  # [U_b, F_b]
            torch.testing.assert_close(got.index_select(0, band.index), whole[:, band.columns])


def test_relation_band_is_computed_once_and_again_when_the_weights_change():
    """The relation band's values per relation id are kept per model, and recomputed after any weight changes."""
    m = model(4, (3, 3), True)
    calls = []

    def counted(model_, key, ids):
        calls.append(len(ids))
        return band_values(model_, key, ids)

    ids = torch.tensor([[0, 4], [0, 1]])  # distinct relations of a chunk (the head is not read)
    with torch.no_grad():
        first = relation_band(m, ids, counted)
        again = relation_band(m, ids, counted)
        assert calls == [6]  # every relation id of the table once (2R = 6), then reused
        for got, want in zip(first, band_values(m, "relation", ids)):
            torch.testing.assert_close(got, want)
        assert all(torch.equal(x, y) for x, y in zip(first, again))
        m.relation_embeddings.add_(0.5)  # in place: the cache must notice
        changed = relation_band(m, ids, counted)
        assert calls == [6, 6]
        for got, want in zip(changed, band_values(m, "relation", ids)):
            torch.testing.assert_close(got, want)
    relation_band(m, ids, counted)  # with gradients on: computed for these ids, not cached
    assert calls == [6, 6, 2]


@pytest.mark.parametrize("height,batch_norm", [(4, True), (4, False), (2, True)])  # height 2: the pair band alone
@pytest.mark.parametrize("n_test", [1, 3])  # 3: forward products meet the triples grouped by band value
def test_influence_with_any_bands_in_forward_mode_equals_torch_funcs_gradient_products(height, batch_norm, n_test):
    """conve_influence with each band of fc's input in forward or in reverse mode (every plan) equals the products
    of autograd's per-triple gradients; in two chunks that share a memo (the relation band's products, made once)."""
    m = model(height, (3, 3), batch_norm, seed=3)
    g = torch.Generator().manual_seed(4)
    relations = m.relation_embeddings.shape[0]

    def triples(n):
        return torch.stack([torch.randint(0, 7, (n,), generator=g), torch.randint(0, relations, (n,), generator=g),
                            torch.randint(0, 7, (n,), generator=g)], dim=1)

    train, test = triples(80), triples(n_test)
    keys = [key for key, _ in bands(m)]
    for names in (select_parameters(m, "all"), ["conv.weight", "bn1.bias" if batch_norm else "conv.bias", "fc.weight"]):
        test_factors = conve_factors(m, test, names)
        expected = dot(dense_factors(m, test, names), dense_factors(m, train, names))  # [n_test, 80], torch.func
        for plan in itertools.chain.from_iterable(itertools.combinations(keys, k) for k in range(len(keys) + 1)):
            memo = {}
            got = torch.cat([conve_influence(m, test_factors, chunk, names, frozenset(plan), memo)
                             for chunk in (train[:50], train[50:])], dim=1)
            torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6 * expected.abs().max().item())
            assert ("relation" in memo) == ("relation" in plan)


def test_band_plan_takes_each_band_forward_where_it_is_cheaper():
    """Head and pair bands: test triples x distinct values in the chunk against its triples; the relation band (kept
    for the pass): test triples x relation ids against the pass's triples, within the memory bound."""
    m = model(4, (3, 3), True)  # 6 relation ids
    chunk = torch.tensor([[0, 0, 1], [0, 0, 2], [0, 1, 3], [0, 1, 4], [1, 2, 5], [1, 2, 6]])  # 2 heads, 3 pairs
    assert band_plan(m, ["fc.weight"], 1, chunk, 100) is None  # no upstream parameter: the factors alone
    assert band_plan(m, ["conv.bias"], 1, chunk, 100) == {"head", "pair", "relation"}
    assert band_plan(m, ["conv.bias"], 2, chunk, 100) == {"head", "relation"}  # 2 x 3 pairs = 6 triples
    assert band_plan(m, ["conv.bias"], 3, chunk, 100) == {"relation"}  # 3 x 2 heads = 6 triples
    assert band_plan(m, ["conv.bias"], 17, chunk, 100) == set()  # 17 x 6 relation ids > 100 triples
    assert band_plan(m, ["conv.bias"], 16, chunk, 10**6) == {"relation"}
    m.relation_embeddings = torch.nn.Parameter(torch.zeros(RELATION_PRODUCTS, 24))
    assert band_plan(m, ["conv.bias"], 2, chunk, 10**9) == {"head"}  # more relation products than are kept
