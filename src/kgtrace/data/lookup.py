"""Entities and relations named by a user: labels or integer ids -> ids, with close-match hints."""

from __future__ import annotations

import difflib

import torch
from torch import Tensor

from kgtrace.data.dataset import Dataset
from kgtrace.data.vocab import Vocab
from kgtrace.errors import ConfigError

__all__ = ["find_ids", "lookup_problem", "parse_ids", "parse_triple"]


def lookup_problem(vocab: Vocab, text: str, role: str, kind: str) -> tuple[int | None, str | None]:
    """(id, None) for a known label or an id below len(vocab); (None, problem naming close labels) otherwise.

    A label wins over an id of the same spelling. kind is "entity" or "relation".
    """
    if text in vocab.to_id:
        return vocab.to_id[text], None
    if text.strip().isdigit() and int(text) < len(vocab):
        return int(text), None
    close = difflib.get_close_matches(text, vocab.labels, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else \
        f"use a label from the run's {'rel_dict' if kind == 'relation' else 'node_dict'} or an id below {len(vocab)}"
    return None, f"{role} {text!r}: unknown {kind}; {hint}"


def parse_ids(dataset: Dataset, **named: str | int | None) -> dict[str, int | None]:
    """Look up each named value (keys head/tail: entities, relation: a relation); None stays None.

    All unknown values are reported together in one ConfigError.
    """
    ids, problems = find_ids(dataset, **named)
    if problems:
        raise ConfigError(problems)
    return ids


def find_ids(dataset: Dataset, **named: str | int | None) -> tuple[dict[str, int | None], list[str]]:
    """As :func:`parse_ids`, returning (ids, problems) instead of raising: unknown values map to None."""
    ids, problems = {}, []
    for role, value in named.items():
        if value is None:
            ids[role] = None
            continue
        kind = "relation" if role == "relation" else "entity"
        vocab = dataset.relations if kind == "relation" else dataset.entities
        ids[role], problem = lookup_problem(vocab, str(value), role, kind)
        if problem:
            problems.append(problem)
    return ids, problems


def parse_triple(dataset: Dataset, h: str | int, r: str | int, t: str | int) -> Tensor:
    """Labels (or integer ids) -> LongTensor [3]; an unknown label is a ConfigError with close labels."""
    ids = parse_ids(dataset, head=h, relation=r, tail=t)
    return torch.tensor([ids["head"], ids["relation"], ids["tail"]], dtype=torch.long)
