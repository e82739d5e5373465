"""A prover run's explanation of a triple: its proof, step by step, with the rules and facts used."""

from __future__ import annotations

import math

from torch import Tensor

from kgtrace.prover.logic import Atom, atom_text, query_state, state_text
from kgtrace.prover.policy import policy_proof
from kgtrace.prover.reference import FACT, Proof, ReferenceEngine, best_proofs, search
from kgtrace.prover.rules import format_rule
from kgtrace.prover.run import ProverRun

__all__ = ["explain_proofs", "proof_lines"]


def find_proof(run: ProverRun, triple: tuple[int, int, int]) -> Proof | None:
    """The proof the run scores a triple by: the best proof within depth (bfs), or the policy's (policy)."""
    if run.config.method == "policy":
        return policy_proof(run, triple)
    engine = ReferenceEngine(run.dataset.train, run.rules, run.dataset.num_entities, run.config.shapes())
    return best_proofs(search(engine, query_state(triple), run.config.depth)).get(None)


def explain_proofs(run: ProverRun, triples: Tensor) -> list[dict]:
    """One record per triple [n, 3]: labels, whether and how it is proved, the steps in order."""
    ds = run.dataset
    entities, relations = ds.entities.labels, ds.relations.labels
    items = []
    for h, r, t in triples.tolist():
        proof = find_proof(run, (h, r, t))
        state = query_state((h, r, t))
        steps = []
        for step in proof.steps if proof else ():
            goal: Atom = state[0]
            entry = {"goal": atom_text(goal, entities, relations), "kind": step.kind}
            if step.kind == FACT:
                entry["fact"] = atom_text(run.engine.fact_atom(step.index), entities, relations)
            else:
                rule = run.rules.rules[step.index]
                entry["rule"] = format_rule(rule, relations)
                entry["source"] = rule.source
            entry["goals_after"] = state_text(step.state, entities, relations)
            steps.append(entry)
            state = step.state
        items.append({
            "head": entities[h], "relation": relations[r], "tail": entities[t],
            "head_name": ds.entity_name(entities[h]), "tail_name": ds.entity_name(entities[t]),
            "proved": proof is not None, "method": run.config.method, "depth_limit": run.config.depth,
            "confidence": math.exp(proof.log_confidence) if proof else 0.0, "steps": steps,
        })
    return items


def proof_lines(items: list[dict]) -> list[str]:
    """The records of :func:`explain_proofs` as text, one line per triple and two per step (the CLI prints them)."""
    lines = []
    for item in items:
        triple = f"{item['relation']}({item['head']}, {item['tail']})"
        if not item["proved"]:
            lines.append(f"{triple}: no proof within {item['depth_limit']} steps ({item['method']}); score 0")
            continue
        lines.append(f"{triple}: proved in {len(item['steps'])} steps, confidence {item['confidence']:.4f} "
                     f"({item['method']})")
        for i, step in enumerate(item["steps"], 1):
            by = f"fact {step['fact']}" if step["kind"] == FACT else f"rule {step['rule']}"
            where = f"  [{step['source']}]" if step.get("source") else ""
            lines.append(f"  {i}. {step['goal']}  <-  {by}{where}")
            lines.append(f"     goals: {step['goals_after'] if step['goals_after'] != '(proved)' else 'none left: proved'}")
    return lines
