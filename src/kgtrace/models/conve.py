"""ConvE (Dettmers et al., 2018, "Convolutional 2D Knowledge Graph Embeddings").

The layer order follows PyKEEN's ``ConvEInteraction`` (and the authors' code), so that
PyKEEN weights can be imported and give equal scores::

    [h ; r] image -> bn0 -> input dropout -> conv2d (no padding) -> bn1 -> relu
      -> feature-map dropout (Dropout2d) -> flatten -> fc -> output dropout -> bn2 -> relu
      = q;   score(h, r, t) = <q, e_t> + b_t

Importing PyKEEN weights (checked with PyKEEN 1.11, ``create_inverse_triples=True``, one
input channel, batch normalisation on) maps state-dict entries as follows:

* ``entity_representations.0._embeddings.weight`` [E, D]  -> ``entity_embeddings``
* ``entity_representations.1._embeddings.weight`` [E, 1]  -> ``entity_bias`` (squeeze)
* ``relation_representations.0._embeddings.weight`` [2R, D] -> ``relation_embeddings``,
  re-ordered: PyKEEN interleaves relations (relation r at row 2r, its inverse at 2r + 1),
  kgtrace keeps them in two blocks (r at row r, its inverse at row R + r), i.e.
  ``ours = torch.cat([theirs[0::2], theirs[1::2]])``.
* ``interaction.hr2d.0`` -> ``bn0``, ``interaction.hr2d.2`` -> ``conv``,
  ``interaction.hr2d.3`` -> ``bn1``, ``interaction.hr1d.0`` -> ``fc``,
  ``interaction.hr1d.2`` -> ``bn2`` (weights, biases and running statistics alike).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kgtrace.core.errors import ConfigError
from kgtrace.core.specs import ModelSpec, PykeenLayout
from kgtrace.models._checks import check_bool, check_dropout, check_positive_int, check_sizes
from kgtrace.models._tables import rows
from kgtrace.models.base import inverse_queries

__all__ = ["SPEC", "ConvE", "conve_problems"]


def conve_problems(
    num_entities: object,
    num_relations: object,
    *,
    embedding_dim: object,
    embedding_height: object,
    output_channels: object,
    kernel_height: object,
    kernel_width: object,
    input_dropout: object,
    feature_map_dropout: object,
    output_dropout: object,
    apply_batch_normalization: object,
) -> list[str]:
    """Every problem with a ConvE configuration, one line each (empty when valid)."""
    problems: list[str] = []
    dim_ok = check_sizes(problems, num_entities, num_relations, embedding_dim)
    height_ok = check_positive_int(problems, "embedding_height", embedding_height)
    check_positive_int(problems, "output_channels", output_channels)
    kh_ok = check_positive_int(problems, "kernel_height", kernel_height)
    kw_ok = check_positive_int(problems, "kernel_width", kernel_width)
    for key, value in (
        ("input_dropout", input_dropout),
        ("feature_map_dropout", feature_map_dropout),
        ("output_dropout", output_dropout),
    ):
        check_dropout(problems, key, value)
    check_bool(problems, "apply_batch_normalization", apply_batch_normalization)
    if not (dim_ok and height_ok):
        return problems
    if embedding_dim % embedding_height:
        divisors = [d for d in range(1, embedding_dim + 1) if embedding_dim % d == 0]
        problems.append(
            f"embedding_height={embedding_height}: must divide embedding_dim={embedding_dim}; "
            f"fix: use one of {divisors}"
        )
        return problems
    width = embedding_dim // embedding_height
    if kh_ok and kernel_height > 2 * embedding_height:
        problems.append(
            f"kernel_height={kernel_height}: exceeds the stacked image height 2*embedding_height="
            f"{2 * embedding_height}; fix: use kernel_height <= {2 * embedding_height}"
        )
    if kw_ok and kernel_width > width:
        problems.append(
            f"kernel_width={kernel_width}: exceeds the image width embedding_dim/embedding_height="
            f"{width}; fix: use kernel_width <= {width} or a smaller embedding_height"
        )
    return problems


class ConvE(nn.Module):
    """ConvE with reciprocal relations: head queries are asked through inverse relations.

    Parameters: ``entity_embeddings`` [E, D], ``relation_embeddings`` [2R, D] (rows R..2R-1
    are the inverse relations), ``entity_bias`` [E], ``conv``, ``fc`` and, with batch
    normalisation, ``bn0``/``bn1``/``bn2``.

    Speed: the layers are not run one by one. bn1 (batch or running statistics) and the
    feature-map dropout mask are folded into per-sample convolution weights, so conv, bn1,
    dropout2d and relu cost one batched matmul and an in-place relu over the [B, C, L]
    feature maps (see `_features`); on one CPU thread this roughly halves the time of
    the layer-by-layer sequence outside the fc layer. Results equal the layer-by-layer
    sequence up to float rounding (~1e-6 relative). Where bn1 makes a gradient vanish
    mathematically (``conv.bias`` in training mode) it is exactly zero here, while
    layer-by-layer code returns rounding noise.

    Initialisation: embeddings are Xavier-normal over the whole table (std =
    sqrt(2 / (rows + D))), as in the authors' code; PyKEEN instead draws N(0, (2/sqrt(D))^2)
    per row. Only the start of training differs; imported weights overwrite both.
    ``entity_bias`` starts at zero (both references); conv/fc/bn keep PyTorch defaults.
    """

    def __init__(
        self,
        num_entities: int,
        num_relations: int,
        *,
        embedding_dim: int = 200,
        embedding_height: int = 10,
        output_channels: int = 32,
        kernel_height: int = 3,
        kernel_width: int = 3,
        input_dropout: float = 0.2,
        feature_map_dropout: float = 0.2,
        output_dropout: float = 0.3,
        apply_batch_normalization: bool = True,
    ):
        super().__init__()
        problems = conve_problems(
            num_entities,
            num_relations,
            embedding_dim=embedding_dim,
            embedding_height=embedding_height,
            output_channels=output_channels,
            kernel_height=kernel_height,
            kernel_width=kernel_width,
            input_dropout=input_dropout,
            feature_map_dropout=feature_map_dropout,
            output_dropout=output_dropout,
            apply_batch_normalization=apply_batch_normalization,
        )
        if problems:
            raise ConfigError(problems)
        self.num_entities = num_entities
        self.num_relations = num_relations
        self.embedding_dim = embedding_dim
        self.embedding_height = embedding_height
        self.embedding_width = embedding_dim // embedding_height
        self.input_dropout = float(input_dropout)
        self.feature_map_dropout = float(feature_map_dropout)
        self.output_dropout = float(output_dropout)
        conv_height = 2 * embedding_height - kernel_height + 1
        conv_width = self.embedding_width - kernel_width + 1

        self.entity_embeddings = nn.Parameter(torch.empty(num_entities, embedding_dim))
        self.relation_embeddings = nn.Parameter(torch.empty(2 * num_relations, embedding_dim))
        self.entity_bias = nn.Parameter(torch.zeros(num_entities))
        self.conv = nn.Conv2d(1, output_channels, (kernel_height, kernel_width))
        self.fc = nn.Linear(output_channels * conv_height * conv_width, embedding_dim)
        self.bn0 = nn.BatchNorm2d(1) if apply_batch_normalization else None
        self.bn1 = nn.BatchNorm2d(output_channels) if apply_batch_normalization else None
        self.bn2 = nn.BatchNorm1d(embedding_dim) if apply_batch_normalization else None
        self.reset_embeddings()
        self.sparse_grad = False  # sparse gradients of the rows read (kgtrace.models._tables.rows)

    def reset_embeddings(self) -> None:
        """Re-draw the embeddings (Xavier normal) and zero the entity bias."""
        nn.init.xavier_normal_(self.entity_embeddings)
        nn.init.xavier_normal_(self.relation_embeddings)
        nn.init.zeros_(self.entity_bias)

    def _image(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation) ids -> stacked input image [B, 1, 2*height, width]."""
        h = rows(self.entity_embeddings, hr[:, 0], self.sparse_grad)  # [B, D]
        r = rows(self.relation_embeddings, hr[:, 1], self.sparse_grad)  # [B, D]
        return self._stack(h, r)

    def _stack(self, h: Tensor, r: Tensor) -> Tensor:
        """Head and relation vectors [B, D] each -> stacked input image [B, 1, 2*height, width]."""
        # Row-major [B, 2D] = h's D values then r's: viewed as [B, 1, 2H, W] this is h's
        # H x W image stacked on top of r's, with a single copy (the cat).
        x = torch.cat([h, r], dim=1)  # [B, 2D]
        return x.view(-1, 1, 2 * self.embedding_height, self.embedding_width)  # [B, 1, 2H, W]

    def _patches(self, x: Tensor, ones: bool = False) -> Tensor:
        """Image [B, 1, 2H, W] -> bn0'd, input-dropped image cut into conv patches, taps first [K, B, L].

        ones=True appends a plane of ones, [K + 1, B, L], so that a bias rides in the matmul.

        K = kernel_height * kernel_width taps and L = conv_h * conv_w output positions, both
        row-major, so ``conv.weight.view(C, K) @ patches[:, b]`` is sample b's convolution
        (cross-correlation, as Conv2d) in NCHW order. Taps first keeps ``view(K, B * L)``
        copy-free for the patch statistics; K shifted slices stacked beat F.unfold on CPU.
        """
        if self.bn0 is not None:
            x = self.bn0(x)
        x = F.dropout(x, self.input_dropout, self.training)
        batch = x.shape[0]
        x = x.view(batch, 2 * self.embedding_height, self.embedding_width)  # [B, 2H, W], one channel
        kernel_height, kernel_width = self.conv.kernel_size
        conv_height = x.shape[1] - kernel_height + 1
        conv_width = x.shape[2] - kernel_width + 1
        taps = [
            x[:, u : u + conv_height, v : v + conv_width] for u in range(kernel_height) for v in range(kernel_width)
        ]
        if ones:
            taps.append(x.new_ones(batch, conv_height, conv_width))
        return torch.stack(taps).view(len(taps), batch, conv_height * conv_width)  # [K (+ 1), B, L]

    def _conv_affine(self, patches: Tensor) -> tuple[Tensor, Tensor]:
        """Fold bn1 into the convolution: weight [C, K] and bias [C] of bn1(conv(.)).

        With one input channel, conv output channel c is the affine map w_c . p + b_c of a
        patch p, so its batch mean and variance follow from the patches' mean [K] and
        covariance [K, K]: bn1 never has to read the [B, C, L] feature maps.
        """
        weight = self.conv.weight.view(self.conv.out_channels, -1)  # [C, K]
        bias = self.conv.bias
        bn = self.bn1
        if bn is None:
            return weight, bias
        if bn.training or bn.running_mean is None:
            patch_mean, patch_cov, count = _patch_moments(patches)
            mean = weight @ patch_mean + bias  # [C]
            var = ((weight @ patch_cov) * weight).sum(dim=1)  # [C], biased, as bn1 normalises
            if bn.training and bn.running_mean is not None:
                _update_running_stats(bn, mean, var, count)
        else:
            mean, var = bn.running_mean, bn.running_var
        scale = bn.weight * torch.rsqrt(var + bn.eps)  # [C]
        return weight * scale.unsqueeze(1), bn.bias + (bias - mean) * scale

    def _features(self, hr: Tensor) -> Tensor:
        """[B, 2] ids -> relu(dropout2d(bn1(conv(patches)))) flattened, [B, C * L] (fc's input)."""
        return self._maps(self._image(hr))

    def _maps(self, image: Tensor) -> Tensor:
        """Image [B, 1, 2H, W] -> relu(dropout2d(bn1(conv(patches)))) flattened, [B, C * L].

        One batched matmul computes conv, bn1 and the feature-map dropout together: the
        dropout keeps or zeroes whole channels per sample with a non-negative scale m, and
        relu(z) * m == relu(z * m), so m is folded into per-sample weights [B, C, K + 1] (bias included).
        """
        patches = self._patches(image, ones=True)  # [K + 1, B, L], the last plane ones
        weight, bias = self._conv_affine(patches[:-1])  # [C, K], [C]
        affine = torch.cat([weight, bias.unsqueeze(1)], dim=1)  # [C, K + 1]: the bias meets the ones plane
        batch, channels = patches.shape[1], weight.shape[0]
        p = self.feature_map_dropout
        if self.training and p > 0:
            keep = weight.new_empty(batch, channels, 1).bernoulli_(1 - p).div_(1 - p)  # [B, C, 1]
            weights = affine * keep  # [B, C, K + 1]
        else:
            weights = affine.expand(batch, -1, -1)  # [B, C, K + 1], no copy
        # bmm rather than baddbmm with a broadcast bias, which first copies the bias into the whole output;
        # on contiguous [B, K + 1, L] patches: bmm reads the taps-first view slowly (8.5 ms against 5.2 ms
        # for 619 pairs on one CPU thread), the copy costs 0.5 ms.
        maps = torch.bmm(weights, patches.transpose(0, 1).contiguous())  # [B, C, L]
        # In place: bmm's backward needs its inputs, not its output.
        # Channel-major flattening, as PyKEEN does, so imported fc weights line up.
        return F.relu_(maps).view(batch, -1)  # [B, C * L]

    def _hidden(self, x: Tensor) -> Tensor:
        """Flattened feature maps [B, F] -> query vector [B, D]."""
        x = self.fc(x)
        x = F.dropout(x, self.output_dropout, self.training)
        if self.bn2 is not None:
            x = self.bn2(x)
        return F.relu(x)

    def encode_query(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids, relation in [0, 2R) -> query q [B, D]."""
        return self._hidden(self._features(hr))

    def decode(self, q: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """q [B, D] -> scores of entities start..stop-1, [B, stop - start], in one addmm."""
        entities = self.entity_embeddings[start:stop]  # [n, D], a view
        return torch.addmm(self.entity_bias[start:stop], q, entities.t())

    def decode_ids(self, q: Tensor, ids: Tensor) -> Tensor:
        """q [B, D], entity ids [B, C] -> each query's scores of its own entities [B, C]."""
        entities = rows(self.entity_embeddings, ids, self.sparse_grad)  # [B, C, D]
        return torch.linalg.vecdot(entities, q.unsqueeze(1)) + rows(self.entity_bias, ids, self.sparse_grad)

    def score_t(self, hr: Tensor) -> Tensor:
        """[B, 2] (head, relation-or-inverse) ids -> scores of every tail [B, E]."""
        return self.decode(self.encode_query(hr))

    def score_h(self, rt: Tensor) -> Tensor:
        """[B, 2] (relation, tail) ids -> scores of every head [B, E], via the inverse relation."""
        return self.score_t(inverse_queries(rt, self.num_relations))

    def score_hrt(self, hrt: Tensor) -> Tensor:
        """[B, 3] (head, relation, tail) ids -> scores [B], scoring only the given tails."""
        q = self.encode_query(hrt[:, :2])  # [B, D]
        tails = hrt[:, 2]
        t = rows(self.entity_embeddings, tails, self.sparse_grad)  # [B, D]
        return torch.linalg.vecdot(q, t) + rows(self.entity_bias, tails, self.sparse_grad)


SPEC = ModelSpec(
    name="conve",
    model_class=ConvE,
    # The fc layer that makes the query vector and the per-entity score bias; not the entity
    # embeddings, which are shared with the input side (the head's image).
    last_layer=("fc.weight", "fc.bias", "entity_bias"),
    row_tables={"entity_embeddings": "entity", "entity_bias": "entity", "relation_embeddings": "relation"},
    factoriser="conve",
    inverse_relations=True,
    pykeen=PykeenLayout("ConvE", kind="conve", marker=("interaction.hr1d.",)),
    # Its gradients' spectrum is more spread than the bilinear models': the LDS peaks at a ridge of 1 to 3
    # on the bundled graphs, at .1 to 1 for DistMult and ComplEx.
    trak_ridge=1.0,
)


def _patch_moments(patches: Tensor) -> tuple[Tensor, Tensor, int]:
    """Mean [K] and biased covariance [K, K] of taps-first patches [K, B, L] over all B * L."""
    flat = patches.view(patches.shape[0], -1)  # [K, B*L], no copy
    count = flat.shape[1]
    mean = flat.mean(dim=1)  # [K]
    # Centre first: the one-pass E[pp^T] - mu mu^T would cancel catastrophically.
    centred = flat - mean.unsqueeze(1)  # [K, B*L]
    return mean, (centred @ centred.t()) / count, count


@torch.no_grad()
def _update_running_stats(bn: nn.BatchNorm2d, mean: Tensor, var: Tensor, count: int) -> None:
    """Update bn's running statistics exactly as its own training-mode forward would."""
    bn.num_batches_tracked.add_(1)
    momentum = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
    bn.running_mean.lerp_(mean, momentum)
    # Running variance is unbiased (Bessel-corrected), the normalisation uses the biased one.
    bn.running_var.lerp_(var * (count / max(count - 1, 1)), momentum)
