"""A prover run's starting point from plain settings: the dataset loaded, the rules read or mined, the config built.

What ``kgtrace prove bfs`` and ``kgtrace prove train`` do before they write or train a run, reachable
from Python with keyword arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from kgtrace.data.dataset import Dataset, load_dataset
from kgtrace.prover.config import MiningConfig, ProverConfig, max_body
from kgtrace.prover.mining import mine_rules, rule_set
from kgtrace.prover.rules import RuleSet, read_rules
from kgtrace.training.loop import dataset_source

__all__ = ["ProverSetup", "prover_setup"]


class ProverSetup(NamedTuple):
    config: ProverConfig  # validated
    rules: RuleSet  # read or mined
    notes: list[str] | None  # each mined rule's measures (None: rules read from a file)
    dataset: Dataset


def prover_setup(dataset: str, method: str, *, rules_file: str | Path | None = None, mining: MiningConfig | None = None,
                 embedding_run: str | Path = "", init_from: str | Path = "", **settings: Any) -> ProverSetup:
    """Load ``dataset``; read the rules of ``rules_file``, or mine them with ``mining`` (exactly one of the two);
    build and validate the ProverConfig of ``method`` with ``settings`` (its other fields, e.g. depth=3).

    Paths of ``embedding_run`` and ``init_from`` are made absolute. A policy (method "policy") learns one
    embedding per entity when asked (entity_embeddings=True), and always when it starts from ``init_from``
    or has a link head (link_weight > 0).
    """
    if (rules_file is None) == (mining is None):
        raise ValueError("prover_setup: give exactly one of rules_file and mining")
    ds = load_dataset(dataset)
    if mining is not None:
        mined = mine_rules(ds.train, ds.num_entities, ds.num_relations, mining.validate())
        rules, notes, source = rule_set(mined, ds.num_relations), [m.note() for m in mined], "mined"
    else:
        rules = read_rules(rules_file, ds.relations, entities=ds.entities, max_body=max_body(method))
        notes, source = None, str(Path(rules_file).resolve())
    if method == "policy":
        settings["init_from"] = str(Path(init_from).resolve()) if init_from else ""
        settings["entity_embeddings"] = (bool(settings.get("entity_embeddings")) or bool(init_from)
                                         or bool(settings.get("link_weight")))
    config = ProverConfig(dataset=dataset_source(dataset), method=method, rules=source,
                          mining=dict(mining.__dict__) if mining else {},
                          embedding_run=str(Path(embedding_run).resolve()) if embedding_run else "",
                          **settings).validate()
    return ProverSetup(config=config, rules=rules, notes=notes, dataset=ds)
