"""Entities and relations named by a user: labels, integer ids or (entities) names -> ids, with close-match hints.

An entity may be named by its label, its id, or its name or label in any case when that names one
entity; several or none give a list of candidates with their ids, names and categories.

A relation may also be named the way KGX data names it, when that names exactly one relation:
its predicate (``biolink:treats``), its description with qualifiers (``biolink:affects
[object_aspect_qualifier=activity]``, as ``kgtrace`` prints it) or its ``edge_map.json`` key.
``kgtrace prepare`` folds each predicate + qualifiers into a label such as ``predicate:3``; a
predicate folded with several qualifier sets names several relations, and the message lists them.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kgtrace.core.errors import ConfigError
from kgtrace.data.dataset import Dataset
from kgtrace.data.names import describe_predicate
from kgtrace.data.triples import encode_triples, read_labeled_triples_with_lines
from kgtrace.data.vocab import Vocab

__all__ = [
    "encode_named_triples", "find_ids", "lookup_entity", "lookup_problem", "lookup_relation", "parse_ids",
    "parse_triple", "relation_ids", "relation_matches", "triples_of", "LABELS", "NamedTriple",
]


def lookup_problem(
    vocab: Vocab, text: str, role: str, kind: str, *, allow_ids: bool = True
) -> tuple[int | None, str | None]:
    """(id, None) for a known label or an id below len(vocab); (None, problem naming close labels) otherwise.

    A label wins over an id of the same spelling. kind is "entity" or "relation". ``allow_ids``
    False accepts labels only (a triple file holds labels).
    """
    if text in vocab.to_id:
        return vocab.to_id[text], None
    if allow_ids and text.strip().isdigit() and int(text) < len(vocab):
        return int(text), None
    close = difflib.get_close_matches(text, vocab.labels, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else \
        f"use a label from the run's {'rel_dict' if kind == 'relation' else 'node_dict'} or an id below {len(vocab)}"
    return None, f"{role} {text!r}: unknown {kind}; {hint}"


def lookup_entity(dataset: Dataset, text: str, role: str = "entity", *, allow_ids: bool = True
                  ) -> tuple[int | None, str | None]:
    """As `lookup_problem` for an entity, also accepting its name or its label in any case, when that names
    one entity (``metformin`` for ``CHEBI:6801``). Several, or none: the problem lists candidates, each with its
    id, name and categories."""
    found, problem = lookup_problem(dataset.entities, text, role, "entity", allow_ids=allow_ids)
    if problem is None:
        return found, None
    wanted = text.strip().casefold()
    matches = [label for label in dataset.entities.labels
               if label.casefold() == wanted or dataset.entity_name(label).casefold() == wanted]
    if len(matches) == 1:
        return dataset.entities.to_id[matches[0]], None
    if matches:
        return None, (f"{role} {text!r} names {len(matches)} entities: {_listed(dataset, matches)}; "
                      "pick one by its label or id")
    spelled = {}  # each label and name in lower case -> its label
    for label in dataset.entities.labels:
        spelled.setdefault(label.casefold(), label)
        spelled.setdefault(dataset.entity_name(label).casefold(), label)
    close = difflib.get_close_matches(wanted, list(spelled), n=5, cutoff=0.6)
    close_labels = list(dict.fromkeys(spelled[c] for c in close))[:3]
    if not close_labels:
        return None, problem
    return None, f"{role} {text!r}: unknown entity; did you mean {_listed(dataset, close_labels)}?"


def _listed(dataset: Dataset, labels: list[str]) -> str:
    """Entities as a user can tell them apart: 'CHEBI:6801' (metformin; biolink:Drug; id 3), ..."""
    def one(label: str) -> str:
        details = [dataset.entity_name(label)] if dataset.entity_name(label) != label else []
        details += ["|".join(dataset.entity_categories.get(label, ()))] if dataset.entity_categories.get(label) else []
        return f"{label!r} ({'; '.join([*details, f'id {dataset.entities.to_id[label]}'])})"
    return ", ".join(one(label) for label in labels)


def lookup_relation(
    dataset: Dataset, text: str, role: str = "relation", *, allow_ids: bool = True
) -> tuple[int | None, str | None]:
    """As `lookup_problem` for a relation, also accepting a predicate, description or
    edge_map.json key that names exactly one relation (module doc). Several: the problem lists them."""
    if text in dataset.relations.to_id:
        return dataset.relations.to_id[text], None
    matches = relation_matches(dataset, text)
    if len(matches) == 1:
        return dataset.relations.to_id[matches[0]], None
    if matches:
        listed = ", ".join(f"{label} ({dataset.relation_name(label)})" for label in matches)
        return None, (f"{role} {text!r} names {len(matches)} relations: {listed}; "
                      f"pick one by its label, e.g. --relation {matches[0]}")
    found, problem = lookup_problem(dataset.relations, text, role, "relation", allow_ids=allow_ids)
    close = difflib.get_close_matches(text, sorted({s for names in _spellings(dataset).values() for s in names}),
                                      n=3, cutoff=0.6)
    if problem and close:
        problem = f"{role} {text!r}: unknown relation; did you mean {', '.join(repr(c) for c in close)}?"
    return found, problem


def relation_matches(dataset: Dataset, text: str) -> list[str]:
    """Labels (in id order) of the relations whose predicate, description or edge_map.json key is ``text``."""
    found = [label for label, names in _spellings(dataset).items() if text in names]
    return sorted(found, key=dataset.relations.to_id.__getitem__)


def relation_ids(dataset: Dataset, values: np.ndarray) -> np.ndarray:
    """Relation ids int64 [n] of the labels (or, for KGX data, unambiguous predicates or
    descriptions) in ``values`` [n]; -1 where unknown or ambiguous."""
    ids = dataset.relations.lookup(values).copy()  # polars hands back a read-only array
    for value in set(values[ids < 0].tolist()):  # the few distinct unknown spellings
        matches = relation_matches(dataset, value)
        if len(matches) == 1:
            ids[values == value] = dataset.relations.to_id[matches[0]]
    return ids


def encode_named_triples(dataset: Dataset, path: str | os.PathLike) -> Tensor:
    """A labelled triple file given on the command line -> ids [n, 3], relations named as
    `relation_ids` accepts; a label the run lacks is a DataError naming its line."""
    labeled, lines = read_labeled_triples_with_lines(path)
    if len(labeled):
        ids = relation_ids(dataset, labeled[:, 1])
        labeled[ids >= 0, 1] = np.asarray(dataset.relations.labels, dtype=object)[ids[ids >= 0]]
    return encode_triples(labeled, dataset.entities, dataset.relations, path, lines=lines, from_run=True)


def parse_ids(dataset: Dataset, **named: str | int | None) -> dict[str, int | None]:
    """Look up each named value (keys head/tail: entities, relation: a relation); None stays None.

    All unknown values are reported together in one ConfigError.
    """
    ids, problems = find_ids(dataset, **named)
    if problems:
        raise ConfigError(problems)
    return ids


def find_ids(dataset: Dataset, **named: str | int | None) -> tuple[dict[str, int | None], list[str]]:
    """As `parse_ids`, returning (ids, problems) instead of raising: unknown values map to None."""
    ids, problems = {}, []
    for role, value in named.items():
        if value is None:
            ids[role] = None
            continue
        if role == "relation":
            ids[role], problem = lookup_relation(dataset, str(value), role)
        else:
            ids[role], problem = lookup_entity(dataset, str(value), role)
        if problem:
            problems.append(problem)
    return ids, problems


def parse_triple(dataset: Dataset, h: str | int, r: str | int, t: str | int) -> Tensor:
    """Labels (or integer ids) -> LongTensor [3]; an unknown label is a ConfigError with close labels."""
    ids = parse_ids(dataset, head=h, relation=r, tail=t)
    return torch.tensor([ids["head"], ids["relation"], ids["tail"]], dtype=torch.long)


def _spellings(dataset: Dataset) -> dict[str, set[str]]:
    """relation label -> the other names it answers to: predicate, description, edge_map.json key."""
    spellings: dict[str, set[str]] = {}
    for key, label in dataset.edge_map.items():
        if label in dataset.relations.to_id:
            spellings[label] = {key, describe_predicate(key), _predicate(key)}
    for label, description in dataset.relation_names.items():
        if label in dataset.relations.to_id:
            spellings.setdefault(label, set()).add(description)
    return spellings


def _predicate(key: str) -> str:
    """The predicate of an edge_map.json key (JSON with "predicate"); a key that is not such JSON is kept."""
    try:
        desc = json.loads(key)
    except json.JSONDecodeError:
        return key
    return str(desc["predicate"]) if isinstance(desc, dict) and "predicate" in desc else key


Named = tuple[str | int, str | int, str | int]  # a triple as its parts: ids, labels or names


def triples_of(dataset: Dataset, triples: Tensor | Named | Sequence[Named]) -> Tensor:
    """Id triples [n, 3] from a tensor of ids, one (head, relation, tail) or a list of them, each part an id, a
    label or (entities) a name in any case; every unknown part is reported at once, with close matches."""
    if isinstance(triples, Tensor):
        return triples.long().reshape(-1, 3).cpu()
    rows = [triples] if len(triples) == 3 and not isinstance(triples[0], (tuple, list)) else list(triples)
    parsed, problems = [], []
    for row in rows:
        try:
            parsed.append(parse_triple(dataset, *row))
        except ConfigError as e:
            problems += e.problems
    if problems:
        raise ConfigError(problems)
    return torch.stack(parsed) if parsed else torch.empty(0, 3, dtype=torch.long)


LABELS = ("head", "relation", "tail", "head_name", "relation_name", "tail_name")


@dataclass(frozen=True)
class NamedTriple:
    """A triple as its labels (the run's node and relation ids) and readable names (the label where none)."""

    head: str
    relation: str
    tail: str
    head_name: str
    relation_name: str
    tail_name: str

    @classmethod
    def of(cls, dataset: Dataset, triple: Sequence[int]) -> NamedTriple:
        """The labels and names of an id triple (h, r, t) of ``dataset``."""
        h, r, t = (int(x) for x in triple)
        head, relation, tail = dataset.entity_label(h), dataset.relation_label(r), dataset.entity_label(t)
        return cls(head, relation, tail, dataset.entity_name(head), dataset.relation_name(relation),
                   dataset.entity_name(tail))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NamedTriple:
        """From a written record; a name the record lacks is its label."""
        return cls(data["head"], data["relation"], data["tail"], data.get("head_name") or data["head"],
                   data.get("relation_name") or data["relation"], data.get("tail_name") or data["tail"])

    def to_dict(self) -> dict[str, str]:
        return {key: getattr(self, key) for key in LABELS}

    def text(self) -> str:
        """'metformin --treats--> type 2 diabetes': the names, as the console shows a triple."""
        return f"{self.head_name} --{self.relation_name}--> {self.tail_name}"
