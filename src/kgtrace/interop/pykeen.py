"""kgtrace weights as PyKEEN state dicts (PyKEEN 1.11), so both tools score with identical weights.

Layouts (see the model modules' docstrings): PyKEEN interleaves a relation and its inverse
(rows 2r and 2r + 1) where kgtrace keeps two blocks (r and R + r); PyKEEN's ConvE entity bias
is an [E, 1] embedding; its ConvE layers live in ``interaction.hr2d`` / ``interaction.hr1d``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# kgtrace ConvE module -> PyKEEN ConvEInteraction sub-module.
CONVE_LAYERS = {"bn0": "interaction.hr2d.0", "conv": "interaction.hr2d.2", "bn1": "interaction.hr2d.3",
                "fc": "interaction.hr1d.0", "bn2": "interaction.hr1d.2"}


def interleave_inverses(relations: Tensor, num_relations: int) -> Tensor:
    """[2R, D] in kgtrace's block order -> PyKEEN's interleaved order."""
    out = torch.empty_like(relations)
    out[0::2], out[1::2] = relations[:num_relations], relations[num_relations:]
    return out


def pykeen_state_dict(model: nn.Module, template: dict[str, Tensor]) -> dict[str, Tensor]:
    """``template`` (a PyKEEN model's state_dict) with kgtrace ``model``'s weights filled in.

    Supports ConvE (PyKEEN created with inverse triples) and DistMult.
    """
    state = dict(template)
    kind = type(model).__name__
    state["entity_representations.0._embeddings.weight"] = model.entity_embeddings.detach().clone()
    if kind == "DistMult":
        state["relation_representations.0._embeddings.weight"] = model.relation_embeddings.detach().clone()
        return state
    if kind != "ConvE":
        raise ValueError(f"no PyKEEN mapping for {kind}; supported: ConvE, DistMult")
    state["entity_representations.1._embeddings.weight"] = model.entity_bias.detach().clone().unsqueeze(1)  # [E, 1]
    state["relation_representations.0._embeddings.weight"] = interleave_inverses(
        model.relation_embeddings.detach(), model.num_relations)
    for ours, theirs in CONVE_LAYERS.items():
        for key, value in getattr(model, ours).state_dict().items():
            state[f"{theirs}.{key}"] = value.clone()
    return state
