"""A prover run folder: what ``kgtrace prove`` writes and ``kgtrace evaluate`` / ``explain`` read.

Layout::

    prover.yaml          the resolved ProverConfig (method bfs, policy or apply, depth, shapes, hybrid, ...)
    rules.txt            the rules the run proves with (copied from --rules, or mined)
    clusters.json        (apply, aggregation nr_noisy_or) the clusters of redundant rules (kgtrace.prover.clusters)
    node_dict, rel_dict  the id maps of the dataset
    data.json            the digest of each split (kgtrace.data.pinned)
    checkpoints/         (policy) epoch-NNNN.pt and best.pt, as for embedding runs
    metrics.jsonl        (policy) one record per epoch

`load_prover_run` returns a `ProverRun` whose ``model`` fulfils the Scorer
protocol, so the evaluation ranks it as it ranks an embedding run's model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from kgtrace.core.config import read_yaml, write_yaml
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.layout import PROVER_CONFIG, RULES, RunLayout
from kgtrace.core.owned import check_out_folder, claim_out_folder, folder_lock, kept_note
from kgtrace.data.dataset import Dataset, dataset_inputs
from kgtrace.data.pinned import load_pinned_dataset, pin_splits
from kgtrace.data.vocab import write_vocab
from kgtrace.data.answers import AnswerIndex
from kgtrace.prover.apply import RuleScorer
from kgtrace.prover.clusters import CLUSTERS_FILE, RuleClusters
from kgtrace.prover.config import ProverConfig
from kgtrace.prover.engine import VectorEngine
from kgtrace.prover.graph import DirectedGraph
from kgtrace.prover.link import LinkHead
from kgtrace.prover.neural import embedding_model
from kgtrace.prover.policy import load_policy_scorer
from kgtrace.prover.redundancy import learn_clusters
from kgtrace.prover.rules import RuleSet, read_rules, write_rules
from kgtrace.prover.scorer import BfsScorer, HybridScorer
from kgtrace.prover.search import compiled_deriver

CONFIG_FILE = PROVER_CONFIG  # the names of kgtrace.core.layout, as this package spells them
RULES_FILE = RULES


@dataclass
class ProverRun:
    """A prover run: folder, config, dataset (with the run's ids), rules, engine and scorer."""

    path: Path
    config: ProverConfig
    dataset: Dataset
    rules: RuleSet
    engine: VectorEngine | None  # the SLD engine (bfs, policy); None for rule application
    model: nn.Module  # a Scorer: BfsScorer, a policy scorer, a RuleScorer, or a HybridScorer around one
    graph: DirectedGraph | None = None  # rule application's training graph (its paths explain); None for the others


def is_prover_run(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def write_prover_run(out: str | Path, config: ProverConfig, dataset: Dataset, rules: RuleSet, *,
                     notes: list[str] | None = None, overwrite: bool = False, log=print) -> Path:
    """Create the run folder (refusing to replace anything but a prover run) with its config, rules and id maps.

    notes: one comment per rule for rules.txt (e.g. the mined measures); default: where each rule was read.
    """
    out = Path(out)
    config.validate()
    inputs = [config.rules, config.embedding_run, config.init_from, *dataset_inputs(config.dataset)]
    check_out_folder(out, kind="prover-run", overwrite=overwrite, inputs=[p for p in inputs if p and p != "mined"])
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, "prover run folder"):
        kept = claim_out_folder(out, kind="prover-run", overwrite=overwrite,
                                inputs=[p for p in inputs if p and p != "mined"])
        if (note := kept_note(out, kept)) is not None:
            log(note)
        write_run_files(out, config, dataset, rules, notes)
        if config.method == "apply" and config.aggregation == "nr_noisy_or":
            write_clusters(out, dataset, rules, log)
        check_written(out, dataset)
    return out


def check_written(out: Path, dataset: Dataset) -> None:
    """Read back what a run's files could fail to say, with the dataset in hand (not read again): the config, the
    rules in the run's own id maps, and the clusters."""
    config = read_config(out)
    rules = read_rules(out / RULES_FILE, dataset.relations, entities=dataset.entities, max_body=config.max_body())
    if config.method == "apply" and config.aggregation == "nr_noisy_or":
        RuleClusters.read(out / CLUSTERS_FILE, len(rules))


def write_clusters(out: Path, dataset: Dataset, rules: RuleSet, log=print) -> RuleClusters:
    """Learn SAFRAN's clusters of redundant rules on the dataset's validation triples into ``out``/clusters.json."""
    if not len(dataset.valid):
        raise KgtraceError(f"the dataset {dataset.name} has no validation triples, on which nr_noisy_or chooses its "
                           "clusters of rules. Fix: use a dataset with a validation split, or --aggregation noisy_or")
    graph = DirectedGraph.of(dataset.train, dataset.num_entities, dataset.num_relations)
    known = AnswerIndex.build(dataset.known_triples("valid"), dataset.num_relations)
    clusters = learn_clusters(graph, rules, dataset.valid, known, log=log)
    clusters.write(out / CLUSTERS_FILE)
    return clusters


def write_run_files(out: Path, config: ProverConfig, dataset: Dataset, rules: RuleSet, notes: list[str] | None) -> None:
    write_vocab(dataset.entities, RunLayout(out).node_dict)
    write_vocab(dataset.relations, RunLayout(out).rel_dict)
    pin_splits(out, dataset)
    write_rules(out / RULES_FILE, rules.rules, dataset.relations.labels,
                notes if notes is not None else [rule.source for rule in rules.rules],
                header=[f"rules of the prover run {out.name} ({config.rules or 'given in code'})"],
                entity_labels=dataset.entities.labels)
    write_yaml(config.to_dict(), out / CONFIG_FILE)


def read_config(run_dir: Path) -> ProverConfig:
    values = read_yaml(run_dir / CONFIG_FILE)
    known = {f.name for f in dataclasses.fields(ProverConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError([f"{run_dir / CONFIG_FILE}: {k}: unknown setting" for k in unknown])
    return ProverConfig(**values).validate()


def load_prover_run(run_dir: str | Path, checkpoint: str | Path | None = None,
                    device: torch.device | str = "cpu", *, compile: bool | None = None) -> ProverRun:
    """Reload a prover run; checkpoint (policy runs): None/'best', 'last' or a file.

    compile: run the engine's step, and a policy's beam search, through torch.compile (None: as the run's config says).
    """
    run_dir = Path(run_dir)
    if not is_prover_run(run_dir):
        raise KgtraceError(f"{run_dir}: not a prover run (no {CONFIG_FILE}). Fix: pass the --out folder of kgtrace prove")
    config = read_config(run_dir)
    dataset = load_pinned_dataset(run_dir, config.dataset)
    rules = read_rules(run_dir / RULES_FILE, dataset.relations, entities=dataset.entities, max_body=config.max_body())
    if compile is not None:  # the returned run's config says what it runs with
        config = dataclasses.replace(config, compile=compile)
    engine = graph = None
    if config.method == "apply":
        graph = DirectedGraph.of(dataset.train, dataset.num_entities, dataset.num_relations)
        clusters = RuleClusters.read(run_dir / CLUSTERS_FILE, len(rules)) if config.aggregation == "nr_noisy_or" else None
        model: nn.Module = RuleScorer(graph, rules, config.aggregation, clusters=clusters)
    else:
        engine = VectorEngine(dataset.train, rules, dataset.num_entities, config.shapes()).to(device)
        derive = compiled_deriver(engine, 1024) if config.compile else None
        if config.method == "bfs":
            model = BfsScorer(engine, config.depth, derive)
        else:
            model = load_policy_scorer(run_dir, config, dataset, engine, derive, checkpoint, device, config.compile)
    if config.embedding_run:
        model = HybridScorer(model, embedding_model(config.embedding_run, dataset, device), config.hybrid_weight)
    elif config.link_weight:
        model = HybridScorer(model, LinkHead(model.policy), config.hybrid_weight)
    return ProverRun(run_dir, config, dataset, rules, engine, model.eval(), graph)

