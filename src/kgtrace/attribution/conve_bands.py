"""ConvE's fc input in bands of rows that see the head alone, both halves, or the relation alone.

The stacked input image is the head's H rows above the relation's H rows, and ConvE's
convolution has no padding, so output row i sees image rows i .. i + kh - 1:

    rows 0 .. H - kh           see the head only      -> a_head(h)
    rows H - kh + 1 .. H - 1   see both (kh - 1 rows)  -> a_pair(h, r)
    rows H .. 2H - kh          see the relation only  -> a_relation(r)

In eval mode everything before fc acts per pixel (bn0 on running statistics), per channel
(conv bias, bn1: folded into the convolution) or elementwise (relu; the dropouts are the
identity), so each band of fc's input is a function of what it sees, and

    fc(a) = W_head a_head(h) + W_pair a_pair(h, r) + W_relation a_relation(r) + b

with W_band fc's weight columns of that band. The head and relation bands are computed once
per distinct head and relation instead of once per distinct pair, and so are their Grams
(`Part`) and forward mode's Jacobian-vector products. On UMLS (H = 10,
kh = 3: 8, 2 and 8 of 18 rows; 810 distinct training pairs over 135 heads and 46 relations)
the fc product and the Gram of fc inputs cost about a quarter of the whole-input ones.
Equal to `pair_pass` up to float rounding (tests/test_conve_bands.py; the
influences: tests/test_tracin.py). With kh > H every row sees both halves: one band, the pair's.
Per-triple (reverse-mode) upstream gradients are pulled back band by band too, each band through the
image rows it sees (`block_vjp`), and they sum to the whole image's.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from kgtrace.attribution.conve_block import folded_conv, taps
from kgtrace.compute.matmul import linear

__all__ = ["KEYS", "Band", "BandFn", "band_pass", "band_values", "band_weight", "bands", "conv_rows", "conv_width",
           "every_relation_band", "image_rows", "relation_band"]

#: Which id a band depends on: column of the (head, relation) pair, or None for the pair itself.
KEYS = {"head": 0, "pair": None, "relation": 1}


@dataclass
class Band:
    """fc's input on some conv output rows, for distinct pairs [U, 2]: one row per distinct value."""

    key: str  # what the band depends on: "head", "relation" or "pair"
    rows: range  # conv output rows
    ids: Tensor  # [U_b, 2] a (head, relation) pair for each distinct value (for "head" and "relation", the other id is 0)
    a: Tensor  # [U_b, C * len(rows) * Wc] relu(bn1(conv)) on those rows, channel-major as fc's input
    index: Tensor  # [U] each pair's row of ``a``
    columns: Tensor | None  # [C * len(rows) * Wc] the band's positions among fc's inputs; None: all of them

    def image_rows(self, model: nn.Module) -> slice:
        """The rows of the stacked image that the band's output rows see."""
        return image_rows(model, self.rows)

    def weight(self, model: nn.Module) -> Tensor:
        """fc's weight columns of the band, [D, F_b]."""
        return band_weight(model, None if self.columns is None else self.rows)


def conv_rows(model: nn.Module) -> int:
    """The number of conv output rows: 2H - kh + 1."""
    return 2 * model.embedding_height - model.conv.kernel_size[0] + 1


def conv_width(model: nn.Module) -> int:
    """The number of conv output columns: W - kw + 1."""
    return model.embedding_width - model.conv.kernel_size[1] + 1


def bands(model: nn.Module) -> list[tuple[str, range]]:
    """The non-empty bands of conv output rows, [(key, rows)], top to bottom."""
    out_rows = conv_rows(model)
    alone = max(0, model.embedding_height - model.conv.kernel_size[0] + 1)  # rows that see one half only, at each end
    spans = [("head", range(0, alone)), ("pair", range(alone, out_rows - alone)),
             ("relation", range(out_rows - alone, out_rows))]
    return [(key, rows) for key, rows in spans if len(rows)]


def image_rows(model: nn.Module, rows: range) -> slice:
    """The rows of the stacked image that conv output ``rows`` see."""
    return slice(rows.start, rows.stop + model.conv.kernel_size[0] - 1)


def band_weight(model: nn.Module, rows: range | None) -> Tensor:
    """fc's weight columns of the band on conv output ``rows`` (None: all), [D, C * len(rows) * Wc]."""
    if rows is None:
        return model.fc.weight
    width = conv_width(model)
    fc = model.fc.weight.view(len(model.fc.weight), model.conv.out_channels, -1)  # [D, C, Hc * Wc]
    return fc[:, :, rows.start * width:rows.stop * width].reshape(len(fc), -1)  # one strided copy


def band_values(model: nn.Module, key: str, ids: Tensor) -> tuple[Tensor, Tensor]:
    """Band ``key``'s fc input a [U_b, C * L_b] for pairs ``ids`` [U_b, 2], and its part of fc's product [U_b, D].

    The costly part of the banded factors, and the one compiled under ``TracIn(compile=True)``.
    The fc product goes through `kgtrace.compute.matmul.linear` (oneDNN on a CPU other than Intel's).
    """
    rows = dict(bands(model))[key]
    weight, bias = folded_conv(model)  # [C, K], [C]
    affine = torch.cat([weight, bias.unsqueeze(1)], dim=1)  # [C, K + 1]: the bias meets the ones row
    image = model._image(ids)[:, :, image_rows(model, rows)]  # [U_b, 1, rows + kh - 1, W]
    if model.bn0 is not None:
        image = model.bn0(image)  # per pixel on running statistics: a band of bn0(x) is bn0 of the band
    patches = taps(image[:, 0], model.conv.kernel_size, ones=True)  # [U_b, K + 1, L_b]
    a = torch.relu(affine @ patches).view(len(ids), -1)  # [U_b, C * L_b], channel-major as fc's input
    return a, linear(a, band_weight(model, rows))  # [U_b, D]


#: (model, band key, ids [U_b, 2]) -> (a [U_b, F_b], fc's product [U_b, D]): `band_values` or its compiled form.
BandFn = Callable[[nn.Module, str, Tensor], tuple[Tensor, Tensor]]


def band_pass(model: nn.Module, pairs: Tensor, band_fn: BandFn = band_values) -> tuple[list[Band], Tensor]:
    """fc's input for distinct pairs [U, 2] in `bands`, and fc's output z [U, D]."""
    out, z = [], model.fc.bias.expand(len(pairs), -1)  # [U, D]
    for key, rows in bands(model):
        ids, index = _distinct(pairs, KEYS[key])  # [U_b, 2], [U]
        a, product = relation_band(model, ids, band_fn) if key == "relation" else band_fn(model, key, ids)
        out.append(Band(key, rows, ids, a, index, _columns(model, rows, pairs.device)))
        z = z + product.index_select(0, index)  # [U, D]
    return out, z


def every_relation_band(model: nn.Module, band_fn: BandFn = band_values) -> Band:
    """The relation band with a row for every relation id r (ids (0, r), index the identity), from `relation_band`."""
    rows = dict(bands(model))["relation"]
    ids = _every_relation_id(model, torch.long, model.relation_embeddings.device)
    a, _ = relation_band(model, ids, band_fn)
    return Band("relation", rows, ids, a, ids[:, 1], _columns(model, rows, ids.device))


def _every_relation_id(model: nn.Module, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Ids (0, r) [R, 2] for every relation id r of the model (the head is not read)."""
    ids = torch.zeros(model.relation_embeddings.shape[0], 2, dtype=dtype, device=device)
    ids[:, 1] = torch.arange(len(ids), device=device)
    return ids


def _columns(model: nn.Module, rows: range, device: torch.device) -> Tensor:
    """The positions among fc's inputs [C * len(rows) * Wc] of conv output ``rows``, channel-major."""
    width = conv_width(model)
    columns = torch.arange(model.fc.weight.shape[1], device=device).view(model.conv.out_channels, -1)  # [C, Hc Wc]
    return columns[:, rows.start * width:rows.stop * width].reshape(-1)


#: model -> (what its band values depend on, every relation id's band values): a pass over training triples meets
#: most relations in every chunk (FB15k-237: 164 of 237 per chunk of 4,096), so their band is computed once per
#: model (per checkpoint) instead of once per chunk.
_RELATION_BANDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def relation_band(model: nn.Module, ids: Tensor, band_fn: BandFn) -> tuple[Tensor, Tensor]:
    """``band_fn(model, "relation", ids)`` for distinct relations ``ids`` [U_b, 2], gathered from every relation id's
    values, computed once while the model's weights, ``band_fn`` and autocast stay the same (and not under grad)."""
    if torch.is_grad_enabled():
        return band_fn(model, "relation", ids)
    device = ids.device.type
    key = (band_fn, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device),
           tuple((t.data_ptr(), t._version) for t in itertools.chain(model.parameters(), model.buffers())))
    cached = _RELATION_BANDS.get(model)
    if cached is None or cached[0] != key:
        every = _every_relation_id(model, ids.dtype, ids.device)  # [2R, 2]
        cached = (key, *band_fn(model, "relation", every))  # [2R, F_b], [2R, D]
        _RELATION_BANDS[model] = cached
    _, a, product = cached
    return a.index_select(0, ids[:, 1]), product.index_select(0, ids[:, 1])  # [U_b, F_b], [U_b, D]


def _distinct(pairs: Tensor, column: int | None) -> tuple[Tensor, Tensor]:
    """Pairs [U_b, 2] with distinct values in ``column`` (all columns: None), and each pair's row [U] among them."""
    if column is None:
        return pairs, torch.arange(len(pairs), device=pairs.device)
    values, index = torch.unique(pairs[:, column], return_inverse=True)
    ids = torch.zeros(len(values), 2, dtype=pairs.dtype, device=pairs.device)  # the other id is never read
    ids[:, column] = values
    return ids, index
