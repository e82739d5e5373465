"""A prover run's explanations as typed results: each triple's proof, step by step, in the graph's labels.

`Proofs` holds one `TripleProof` per explained triple, each a sequence of
`ProofStep` s (the goal resolved, the fact or rule that resolved it, the goals left).
``to_dict()`` is the JSON ``kgtrace explain PROVER_RUN`` writes, ``read(path)`` reads it back (the
report does), ``to_df()`` gives one row per step and ``lines()`` the console's text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from kgtrace.display.frames import FrameKind, as_frame

__all__ = ["STEP_COLUMNS", "ProofStep", "Proofs", "TripleProof"]

STEP_COLUMNS = ("triple_index", "head", "relation", "tail", "proved", "confidence", "step", "goal", "resolved_with",
                "goals_after")


@dataclass(frozen=True)
class ProofStep:
    """One resolution step: ``goal`` (the first goal, in labels) resolved with a training fact (kind "fact",
    ``fact``) or a rule (kind "rule", ``rule`` and the rule's ``source``: mined, a file, ...); ``goals_after``:
    the goals left, "(proved)" when none."""

    goal: str
    kind: str
    fact: str | None
    rule: str | None
    source: str | None
    goals_after: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProofStep:
        return cls(data["goal"], data["kind"], data.get("fact"), data.get("rule"), data.get("source"),
                   data["goals_after"])

    def to_dict(self) -> dict[str, Any]:
        used = {"fact": self.fact} if self.kind == "fact" else {"rule": self.rule, "source": self.source}
        return {"goal": self.goal, "kind": self.kind, **used, "goals_after": self.goals_after}

    def resolved_with(self) -> str:
        """'fact r(a, b)' or 'rule r(X, Y) <- ...': what resolved the goal."""
        return f"fact {self.fact}" if self.kind == "fact" else f"rule {self.rule}"


@dataclass(frozen=True)
class TripleProof:
    """How a prover run proves (head, relation, tail), in labels (head_name, tail_name: readable names).

    proved: whether a proof was found within ``depth_limit`` steps; confidence: the proof's score in
    (0, 1] (the product of its rules' confidences), 0 when unproved; method: the prover ("bfs",
    "policy"); steps: the proof, first step first (empty when unproved).
    """

    head: str
    relation: str
    tail: str
    head_name: str
    tail_name: str
    proved: bool
    method: str
    depth_limit: int
    confidence: float
    steps: tuple[ProofStep, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TripleProof:
        return cls(data["head"], data["relation"], data["tail"], data.get("head_name") or data["head"],
                   data.get("tail_name") or data["tail"], bool(data["proved"]), data.get("method", ""),
                   int(data.get("depth_limit", 0)), float(data.get("confidence", 0.0)),
                   tuple(map(ProofStep.from_dict, data.get("steps", ()))))

    def to_dict(self) -> dict[str, Any]:
        return {"head": self.head, "relation": self.relation, "tail": self.tail, "head_name": self.head_name,
                "tail_name": self.tail_name, "proved": self.proved, "method": self.method,
                "depth_limit": self.depth_limit, "confidence": self.confidence,
                "steps": [step.to_dict() for step in self.steps]}

    def key(self) -> tuple[str, str, str]:
        """(head, relation, tail) in labels: what an embedding run's explanation of the same triple is keyed by."""
        return self.head, self.relation, self.tail

    def lines(self) -> list[str]:
        """The proof as text: one line for the triple, two per step."""
        triple = f"{self.relation}({self.head}, {self.tail})"
        if not self.proved:
            return [f"{triple}: no proof within {self.depth_limit} steps ({self.method}); score 0"]
        lines = [f"{triple}: proved in {len(self.steps)} steps, confidence {self.confidence:.4f} ({self.method})"]
        for i, step in enumerate(self.steps, 1):
            where = f"  [{step.source}]" if step.source else ""
            left = step.goals_after if step.goals_after != "(proved)" else "none left: proved"
            lines += [f"  {i}. {step.goal}  <-  {step.resolved_with()}{where}", f"     goals: {left}"]
        return lines


@dataclass(frozen=True)
class Proofs:
    """The proofs of one ``kgtrace explain PROVER_RUN``, in the order the triples were asked."""

    items: tuple[TripleProof, ...]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[TripleProof]:
        return iter(self.items)

    def __getitem__(self, i: int) -> TripleProof:
        return self.items[i]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Proofs:
        return cls(tuple(map(TripleProof.from_dict, data["proofs"])))

    @classmethod
    def read(cls, path: str | Path) -> Proofs:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_dict(self) -> dict[str, Any]:
        return {"proofs": [item.to_dict() for item in self.items]}

    def lines(self) -> list[str]:
        return [line for item in self.items for line in item.lines()]

    def to_df(self, kind: FrameKind = "polars") -> Any:
        """One row per proof step (an unproved triple: one row without a step), `STEP_COLUMNS`."""
        rows = []
        for i, p in enumerate(self.items):
            steps = [(n, s.goal, s.resolved_with(), s.goals_after) for n, s in enumerate(p.steps, 1)]
            rows += [(i, p.head, p.relation, p.tail, p.proved, p.confidence, *step)
                     for step in steps or [(None, None, None, None)]]
        schema = dict(zip(STEP_COLUMNS, (pl.Int64, pl.String, pl.String, pl.String, pl.Boolean, pl.Float64, pl.Int64,
                                         pl.String, pl.String, pl.String), strict=True))
        return as_frame(pl.DataFrame(rows, schema=schema, orient="row"), kind)
