"""SAFRAN's clusters of redundant rules: which rules count once in the ``nr_noisy_or`` aggregation.

Ott et al. (2021, SAFRAN) observe that a noisy-or over rules counts the same evidence many times when rules
predict the same facts (``r(X,Y) :- s(X,Y)`` and ``r(X,Y) :- s(X,A), t(A,Y)`` over a graph where t is
mostly the identity). Their non-redundant noisy-or groups the rules of a query relation into clusters of
rules whose predictions overlap, takes the best confidence within a cluster and the noisy-or across them:

    score(candidate) = 1 - prod over clusters C of (1 - max over rules in C predicting it of confidence)

`RuleClusters` holds the clusters of each directed query relation q (r: tails of r, r + R: heads of r), one
threshold per q, and the validation curve the threshold was read from (`kgtrace.prover.redundancy` learns
them). A rule listed in no cluster of q is a cluster of its own; threshold -1 means one cluster of every rule
(the max aggregation). Rule numbers are positions in the rule file the clusters were learned for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from kgtrace.core.errors import KgtraceError
from kgtrace.core.io import atomic_write_text

__all__ = ["CLUSTERS_FILE", "ONE_CLUSTER", "ClusterLookup", "RuleClusters"]

CLUSTERS_FILE = "clusters.json"  # beside a prover run's rules.txt (aggregation nr_noisy_or)
ONE_CLUSTER = -1.0  # the threshold that joins every rule of a query relation: the max aggregation


@dataclass(frozen=True)
class ClusterLookup:
    """One query relation's clusters as arrays: rule numbers (sorted) and the cluster of each."""

    members: Tensor  # [m] long, sorted: the rules in a cluster of two or more
    labels: Tensor  # [m] long: each one's cluster, 0 .. clusters - 1
    clusters: int  # clusters of two or more rules
    num_rules: int  # the rule file's length

    @property
    def ids(self) -> int:
        """Cluster ids lie below this: clusters + rule numbers (`of`)."""
        return self.clusters + self.num_rules

    def of(self, rules: Tensor) -> Tensor:
        """Cluster ids [n] of rule numbers [n]: a listed rule's cluster, an unlisted rule its own (clusters + rule)."""
        if not len(self.members):
            return self.clusters + rules
        at = torch.searchsorted(self.members, rules).clamp(max=len(self.members) - 1)
        listed = self.members[at] == rules
        return torch.where(listed, self.labels[at], self.clusters + rules)


@dataclass(frozen=True)
class RuleClusters:
    """Each directed query relation's clusters of rules (module doc), with how they were chosen."""

    num_rules: int  # the rule file's length: the clusters name its rules by position
    groups: dict[int, tuple[tuple[int, ...], ...]]  # q -> clusters of two or more rule numbers
    thresholds: dict[int, float]  # q -> the Jaccard threshold its clusters join above (ONE_CLUSTER: all)
    curves: dict[int, dict[float, float]]  # q -> validation MRR of each threshold tried
    queries: dict[int, int]  # q -> validation queries its threshold was chosen on (0: the pooled choice)

    def lookup(self, q: int) -> ClusterLookup:
        groups = self.groups.get(q, ())
        members = [rule for group in groups for rule in group]
        labels = [label for label, group in enumerate(groups) for _ in group]
        order = sorted(range(len(members)), key=members.__getitem__)
        return ClusterLookup(torch.tensor([members[i] for i in order], dtype=torch.long),
                             torch.tensor([labels[i] for i in order], dtype=torch.long), len(groups), self.num_rules)

    def to_dict(self) -> dict:
        keys = sorted(set(self.groups) | set(self.thresholds))
        return {"num_rules": self.num_rules,
                "queries": {str(q): {"threshold": self.thresholds.get(q, ONE_CLUSTER),
                                     "validation_queries": self.queries.get(q, 0),
                                     "mrr": {str(t): m for t, m in self.curves.get(q, {}).items()},
                                     "clusters": [list(g) for g in self.groups.get(q, ())]} for q in keys}}

    @classmethod
    def from_dict(cls, data: dict) -> RuleClusters:
        queries = {int(q): v for q, v in data["queries"].items()}
        return cls(int(data["num_rules"]),
                   {q: tuple(tuple(int(r) for r in g) for g in v["clusters"]) for q, v in queries.items()},
                   {q: float(v["threshold"]) for q, v in queries.items()},
                   {q: {float(t): float(m) for t, m in v["mrr"].items()} for q, v in queries.items()},
                   {q: int(v["validation_queries"]) for q, v in queries.items()})

    def write(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def read(cls, path: str | Path, num_rules: int) -> RuleClusters:
        """The clusters in ``path``, checked against a rule file of ``num_rules`` rules."""
        path = Path(path)
        if not path.is_file():
            raise KgtraceError(f"{path}: missing; the nr_noisy_or aggregation needs the clusters that kgtrace prove "
                               "apply --aggregation nr_noisy_or learns. Fix: write the run again with that command")
        try:
            clusters = cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError) as e:
            raise KgtraceError(f"{path}: not a clusters file of kgtrace ({e}). Fix: write the run again with "
                               "kgtrace prove apply --aggregation nr_noisy_or") from None
        if clusters.num_rules != num_rules:
            raise KgtraceError(f"{path}: clusters of {clusters.num_rules} rules, but the run's rule file has "
                               f"{num_rules}. Fix: write the run again with kgtrace prove apply --aggregation "
                               "nr_noisy_or (the clusters name rules by position)")
        return clusters
