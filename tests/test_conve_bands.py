"""ConvE's fc input computed in bands (head rows, mixed rows, relation rows) equals the whole-input pass."""

import pytest
import torch

from kgtrace.attribution.conve import pair_pass
from kgtrace.attribution.conve_bands import band_pass, band_values, bands, relation_band
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
