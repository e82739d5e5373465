"""Paths as explanations: the rules that predict a triple, each with its groundings, the facts of each path.

A biologist's "why" is a path: metformin -affects-> PRKAA2 -gene_associated_with_condition-> obesity.
For a triple (h, r, t), every rule with head r that predicts t from h, as rule application
(`kgtrace.prover.apply`) reads it, is listed strongest first with up to ``per_rule`` groundings: the
training facts along its body's path, in path order. A cyclic rule's path runs from h to t; an acyclic
one's from h to its other constant (AC1) or anywhere (AC2), or, when h is the rule's constant, from t.
A grounding never uses the explained triple itself as a fact, and the count of a rule's groundings
stops at ``count_limit``.

This is the other kind of explanation beside training-triple attribution (TracIn, TRAK): not which
training triples moved a model's score, but which paths in the graph imply the triple.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import torch
from torch import Tensor

from kgtrace.data.dataset import Dataset
from kgtrace.data.lookup import Named, NamedTriple, triples_of
from kgtrace.display.frames import FrameKind, as_frame
from kgtrace.prover.apply import DirectedRule, directed_rules
from kgtrace.prover.graph import DirectedGraph, directed_inverse
from kgtrace.prover.logic import constant_of
from kgtrace.prover.rules import RuleSet, format_rule

__all__ = ["KIND", "GraphPaths", "PathFact", "PathFinder", "RulePaths", "TriplePaths", "explain_paths", "path_facts",
           "ranked_paths", "triple_paths"]

KIND = "paths in the graph that imply it (rules and their groundings)"
Fact = tuple[int, int, int]  # (head, relation, tail) ids


@dataclass(frozen=True)
class PathFact:
    """One training fact of a path, in labels and names."""

    head: str
    relation: str
    tail: str
    head_name: str
    relation_name: str  # readable: a KGX predicate with its qualifiers
    tail_name: str
    head_category: str
    tail_category: str

    def text(self) -> str:
        return f"{self.head_name} -{self.relation_name}-> {self.tail_name}"


@dataclass(frozen=True)
class RulePaths:
    """A rule that predicts the triple, and its groundings (each a path of facts, in path order)."""

    rule: str  # the rule in the rule file's format (labels)
    text: str  # the rule in names: relations' readable names, constants' entity names
    confidence: float
    groundings: tuple[tuple[PathFact, ...], ...]  # up to per_rule of them
    count: int  # groundings found, up to count_limit

    def to_dict(self) -> dict:
        return {"rule": self.rule, "text": self.text, "confidence": self.confidence, "count": self.count,
                "groundings": [[vars(f) for f in path] for path in self.groundings]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RulePaths:
        return cls(data["rule"], data["text"], float(data["confidence"]),
                   tuple(tuple(PathFact(**fact) for fact in path) for path in data["groundings"]), int(data["count"]))


@dataclass(frozen=True)
class TriplePaths:
    """The paths that imply one triple, strongest rule first."""

    triple: NamedTriple
    rules: tuple[RulePaths, ...]
    kind: str = KIND

    def lines(self) -> list[str]:
        """The console's lines: the triple, then each rule (in names) with its paths."""
        named = self.triple
        out = [f"({named.head_name}, {named.relation_name}, {named.tail_name}): {len(self.rules)} rule(s) predict it, "
               "strongest first (confidence, rule, paths found)"]
        for number, found in enumerate(self.rules, 1):
            out.append(f"  {number}. {found.confidence:.3f}  {found.text}  ({found.count} path(s))")
            out += ["       " + " ; ".join(fact.text() for fact in path) for path in found.groundings]
        return out

    def to_dict(self) -> dict:
        return {**self.triple.to_dict(), "kind": self.kind, "rules": [r.to_dict() for r in self.rules]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TriplePaths:
        return cls(NamedTriple.from_dict(data), tuple(map(RulePaths.from_dict, data["rules"])), data.get("kind", KIND))

    def key(self) -> tuple[str, str, str]:
        """(head, relation, tail) labels: what joins these paths to the same triple's other explanations."""
        return self.triple.head, self.triple.relation, self.triple.tail

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """One row per fact of each shown path: rule rank, rule, confidence, path, step, and the fact's labels,
        names and categories."""
        rows = [{"rule_rank": i, "rule": r.text, "confidence": r.confidence, "path": p, "step": s, **vars(fact)}
                for i, r in enumerate(self.rules, 1) for p, path in enumerate(r.groundings, 1)
                for s, fact in enumerate(path, 1)]
        return as_frame(pl.DataFrame(rows) if rows else pl.DataFrame(), kind)


@dataclass(frozen=True)
class GraphPaths:
    """The paths of several triples (``kgtrace explain --rules``' NAME.paths.json), in the order they were asked,
    with the rule file they come from."""

    items: tuple[TriplePaths, ...]
    rules: str = ""  # the rule file ("" when the rules were given in memory)
    kind: str = KIND

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[TriplePaths]:
        return iter(self.items)

    def __getitem__(self, i: int) -> TriplePaths:
        return self.items[i]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphPaths:
        return cls(tuple(map(TriplePaths.from_dict, data["triples"])), data.get("rules", ""), data.get("kind", KIND))

    @classmethod
    def read(cls, path: str | Path) -> GraphPaths:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    @staticmethod
    def holds(data: object) -> bool:
        """Whether a JSON document read from an explain file is a paths file."""
        return isinstance(data, dict) and data.get("kind") == KIND and "triples" in data

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rules": self.rules, "triples": [item.to_dict() for item in self.items]}

    def lines(self) -> list[str]:
        return [line for item in self.items for line in item.lines()]

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """`TriplePaths.to_df` of every triple, one above the other, each row led by its triple's labels."""
        frames = [pl.DataFrame({"triple": [i] * len(frame), "triple_head": [item.triple.head] * len(frame),
                                "triple_relation": [item.triple.relation] * len(frame),
                                "triple_tail": [item.triple.tail] * len(frame)}).hstack(frame)
                  for i, item in enumerate(self.items) if len(frame := item.to_df())]
        return as_frame(pl.concat(frames) if frames else pl.DataFrame(), kind)


def triple_paths(dataset: Dataset, finder: PathFinder, triple: Fact, *, top: int = 10, per_rule: int = 3,
                 count_limit: int = 1000) -> TriplePaths:
    """The ``top`` strongest rules predicting ``triple`` (ids) and up to ``per_rule`` of each one's paths."""
    found = []
    for directed, paths in ranked_paths(finder, triple, top=top, count_limit=count_limit):
        facts = tuple(tuple(_fact(dataset, f) for f in path) for path in paths[:per_rule])
        rule = finder.rules.rules[directed.rule]
        found.append(RulePaths(_clause(rule, dataset, names=False), _clause(rule, dataset, names=True),
                               directed.confidence, facts, len(paths)))
    return TriplePaths(NamedTriple.of(dataset, triple), tuple(found))


@dataclass(frozen=True)
class PathFinder:
    """A rule set's directed forms by query relation, strongest first, over a training graph: built once for
    every triple explained with them."""

    graph: DirectedGraph
    rules: RuleSet
    by_query: tuple[tuple[DirectedRule, ...], ...]  # [2R]

    @classmethod
    def of(cls, graph: DirectedGraph, rules: RuleSet) -> PathFinder:
        by_query: list[list[DirectedRule]] = [[] for _ in range(2 * graph.num_relations)]
        for directed in directed_rules(rules):
            by_query[directed.query].append(directed)
        return cls(graph, rules, tuple(tuple(sorted(found, key=lambda d: (-d.confidence, d.rule)))
                                       for found in by_query))


def ranked_paths(finder: PathFinder, triple: Fact, *, top: int = 10,
                 count_limit: int = 1000) -> list[tuple[DirectedRule, list[list[Fact]]]]:
    """The ``top`` strongest rules predicting ``triple`` (ids), each with its paths (up to ``count_limit``) as
    facts in path order."""
    h, r, t = triple
    graph, found = finder.graph, []
    for directed in finder.by_query[r]:
        paths = _groundings(graph, directed, h, t, count_limit, triple)
        if paths:
            found.append((directed, paths))
            if len(found) == top:
                break
    return found


def path_facts(finder: PathFinder, triple: Fact, k: int) -> list[Fact]:
    """The first ``k`` distinct facts of the paths that imply ``triple``: strongest rule first, its paths in order,
    each path's facts in path order."""
    facts: dict[Fact, None] = {}
    for _, paths in ranked_paths(finder, triple, top=len(finder.rules)):
        for path in paths:
            for fact in path:
                facts.setdefault(fact)
                if len(facts) == k:
                    return list(facts)
    return list(facts)


def _clause(rule, dataset: Dataset, names: bool) -> str:
    """The rule without its confidence, in labels (the file's format) or in names."""
    relations, entities = dataset.relations.labels, dataset.entities.labels
    if names:
        relations = [dataset.relation_name(label) for label in relations]
        named = {constant_of(t) for t in (*rule.head_args, *(x for atom in rule.body for x in atom[1:])) if t < 0}
        entities = [dataset.entity_name(label) if i in named else label for i, label in enumerate(entities)]
    return format_rule(rule, relations, entity_labels=entities).split("  ", 1)[1]


def explain_paths(dataset: Dataset, rules: RuleSet, triples: Tensor | Named | Sequence[Named], *, top: int = 10,
                  per_rule: int = 3, rules_file: str | Path = "", graph: DirectedGraph | None = None) -> GraphPaths:
    """`triple_paths` of each triple [n, 3] over ``dataset``'s training graph.

    Args:
        dataset: the dataset whose training triples are the facts (a run's ``dataset``).
        rules: rules over its relations and entities (``read_rules(path, ds.relations, entities=ds.entities,
            max_body=3)``, or a rule application run's ``rules``).
        triples: ids [n, 3], or one (head, relation, tail) or a list of them in ids, labels or names.
        top: rules listed per triple, strongest first.
        per_rule: paths shown per rule.
        rules_file: the file the rules were read from, recorded in the result.
        graph: ``dataset``'s training graph when one is at hand (a rule application run's ``graph``); built here
            otherwise.

    Returns:
        `GraphPaths`: one `TriplePaths` per triple, in order (a triple no rule predicts has no rules); ``.lines()``,
        ``.to_dict()`` (the NAME.paths.json of ``kgtrace explain --rules``), ``.to_df()``.
    """
    if graph is None:
        graph = DirectedGraph.of(dataset.train, dataset.num_entities, dataset.num_relations)
    finder = PathFinder.of(graph, rules)
    return GraphPaths(tuple(triple_paths(dataset, finder, tuple(triple), top=top, per_rule=per_rule)
                            for triple in triples_of(dataset, triples).tolist()), str(rules_file))


def _groundings(graph: DirectedGraph, directed: DirectedRule, h: int, t: int, limit: int,
                excluded: Fact) -> list[list[Fact]]:
    """The paths by which ``directed`` predicts t from h (module doc), as facts."""
    if directed.kind == "cyclic":
        return _walks(graph, h, directed.path, t, limit, excluded)
    if directed.kind == "condition":
        return _walks(graph, h, directed.path, directed.end, limit, excluded) if directed.constant == t else []
    return _walks(graph, t, directed.path, directed.end, limit, excluded) if directed.constant == h else []


def _walks(graph: DirectedGraph, start: int, path: tuple[int, ...], end: int | None, limit: int,
           excluded: Fact) -> list[list[Fact]]:
    """Up to ``limit`` walks along ``path`` from ``start`` (to ``end``, or anywhere), as facts; depth first, each
    step only into entities that can still reach ``end`` in the steps left."""
    E, R = graph.num_entities, graph.num_relations
    reachable = [torch.ones(E, dtype=torch.bool)] if end is None else [torch.arange(E) == end]
    for d in reversed(path):  # reachable[k]: the entities that reach end in the last k steps
        back = graph.walk(reachable[-1].float().unsqueeze(1), directed_inverse(d, R))[:, 0] > 0
        reachable.append(back)
    found: list[list[Fact]] = []

    def step(node: int, k: int, facts: list[Fact]) -> None:
        if len(found) >= limit:
            return
        if k == len(path):
            found.append(list(facts))
            return
        d = path[k]
        for following in _targets(graph, node, d).tolist():
            fact = (node, d, following) if d < R else (following, d - R, node)
            if fact != excluded and bool(reachable[len(path) - k - 1][following]):
                step(following, k + 1, [*facts, fact])

    if bool(reachable[len(path)][start]):
        step(start, 0, [])
    return found


def _targets(graph: DirectedGraph, x: int, d: int) -> Tensor:
    """The y with d(x, y)."""
    low, count = (int(v) for v in graph.edges(torch.tensor(x), d))
    return graph.neighbours[low:low + count, 1]


def _fact(dataset: Dataset, fact: Fact) -> PathFact:
    labels = dataset.entities.labels
    h, r, t = fact
    categories = dataset.entity_categories
    relation = dataset.relations.labels[r]
    return PathFact(labels[h], relation, labels[t], dataset.entity_name(labels[h]), dataset.relation_name(relation),
                    dataset.entity_name(labels[t]), "|".join(categories.get(labels[h], ())),
                    "|".join(categories.get(labels[t], ())))
