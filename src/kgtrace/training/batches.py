"""The training examples of an epoch, built once from the training triples."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kgtrace.data.answers import AnswerIndex, reciprocal_queries


@dataclass(frozen=True)
class Batches:
    """The training examples of one epoch: (anchor, relation) queries and their positives.

    kvsall and kvsall-ce: one example per distinct query, positives from ``index``; 1vsall: one
    example per (triple, direction), its single answer in ``answers``; negative-sampling: one
    example per triple, (head, relation) in ``queries`` and the tail in ``answers`` (the loss
    asks both directions of each).
    """

    queries: Tensor  # [N, 2]
    answers: Tensor | None  # [N] for 1vsall and negative-sampling
    index: AnswerIndex | None  # for kvsall and kvsall-ce
    mode: str = "kvsall"  # TrainConfig.training

    @classmethod
    def build(cls, train: Tensor, num_relations: int, mode: str) -> "Batches":
        if mode == "negative-sampling":
            return cls(train[:, :2], train[:, 2], None, mode)
        if mode == "1vsall":
            queries, answers = reciprocal_queries(train, num_relations)
            return cls(queries, answers, None, mode)
        index = AnswerIndex.build(train, num_relations)  # kvsall, kvsall-ce
        return cls(index.queries(), None, index, mode)

    def triples(self, pos: Tensor) -> Tensor:
        """The training triples [n, 3] of the examples at ``pos`` [n] (negative-sampling's examples are triples)."""
        if self.mode != "negative-sampling":
            raise ValueError(f"Batches.triples: the examples of {self.mode} are queries, not triples")
        return torch.cat([self.queries[pos], self.answers[pos].unsqueeze(1)], dim=1)

    def __len__(self) -> int:
        return len(self.queries)
