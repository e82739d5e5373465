"""The training examples of an epoch, built once from the training triples."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from kgtrace.data.answers import AnswerIndex, reciprocal_queries


@dataclass(frozen=True)
class Batches:
    """The training examples of one epoch: (anchor, relation) queries and their positives.

    kvsall and kvsall-ce: one example per distinct query, positives from ``index``; 1vsall: one
    example per (triple, direction), its single answer in ``answers``.
    """

    queries: Tensor  # [N, 2]
    answers: Tensor | None  # [N] for 1vsall
    index: AnswerIndex | None  # for kvsall

    @classmethod
    def build(cls, train: Tensor, num_relations: int, mode: str) -> "Batches":
        if mode != "1vsall":  # kvsall, kvsall-ce
            index = AnswerIndex.build(train, num_relations)
            return cls(index.queries(), None, index)
        queries, answers = reciprocal_queries(train, num_relations)
        return cls(queries, answers, None)

    def __len__(self) -> int:
        return len(self.queries)
