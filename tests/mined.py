"""Bundled datasets with their mined rules, mined once per test session (tests treat both as read-only)."""

import functools

from kgtrace.data.dataset import Dataset, load_dataset
from kgtrace.prover.mining import MiningConfig, mine_rules, rule_set
from kgtrace.prover.rules import RuleSet


@functools.cache
def mined(name: str, max_rules_per_head: int) -> tuple[Dataset, RuleSet]:
    """``name``'s dataset and the rules mined from its training triples (default thresholds, the best
    ``max_rules_per_head`` per head relation)."""
    ds = load_dataset(name)
    found = mine_rules(ds.train, ds.num_entities, ds.num_relations, MiningConfig(max_rules_per_head=max_rules_per_head))
    return ds, rule_set(found, ds.num_relations)
