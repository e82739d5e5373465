"""Scorers for tests: scores read from a fixed table, so ranks can be computed by hand."""

import torch
from torch import nn


class TableScorer(nn.Module):
    """score_t([a, r]) = table[r, a]: a [2R, E, E] table; relations r >= R are inverses (head queries)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = nn.Parameter(table)  # [2R, E, E]
        self.num_relations = table.shape[0] // 2
        self.num_entities = table.shape[1]

    def score_t(self, hr):
        return self.table[hr[:, 1], hr[:, 0]]

    def score_h(self, rt):
        return self.score_t(torch.stack([rt[:, 1], rt[:, 0] + self.num_relations], 1))

    def score_hrt(self, hrt):
        # (h, r, t) is the tail query (h, r) answered by t; relation ids in [R, 2R) ask heads.
        return self.table[hrt[:, 1], hrt[:, 0], hrt[:, 2]]
