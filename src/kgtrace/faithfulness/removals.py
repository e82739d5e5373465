"""Removal methods: for each prediction, the training triples to take away, most important first.

Each method maps (run, predictions [N, 3], k, seed) to one LongTensor per prediction of at
most k indices into ``run.dataset.train``, in removal order; removing "the top k" for a
smaller k takes the first k of that list, so the removed sets are nested across k.

* ``tracin-last`` / ``tracin-all``: the k strongest TracIn proponents (largest influence
  first, ties to the lower index) with the model's last-layer parameters or all of them
  (``kgtrace explain --params``), summed over every epoch checkpoint of the run.
* ``random``: k training triples drawn uniformly without replacement; the draw is seeded by
  (seed, h, r, t), so a prediction gets the same draw whatever else is explained with it.
* ``neighbourhood``: GradRollback's baseline (NH, Lawrence et al. 2021): k training triples
  that share an entity with the prediction (h or t as head or tail). All such neighbours are
  equally eligible; they are picked uniformly at random without replacement, seeded by
  (seed, h, r, t) as ``random`` is (GradRollback's code picks with ``np.random.choice``
  too). A prediction with fewer than k neighbours loses all of them. (GradRollback's code
  also counts triples that merely share the relation r; the issue asks for shared entities.)

* ``trak``, ``influence``, ``influence-fisher``, ``grad-cos`` (every attribution method whose spec says
  ``removal``): the k training triples with the largest attributions by that method of
  `kgtrace.attribution.methods`, largest first.

* ``proof``: the facts (training triples) of the proof a prover run (``kgtrace prove``) finds
  for the prediction, in the order the proof uses them: the best proof within its depth for a
  BFS run, the policy's for a learned one. An unproved prediction loses nothing, and a proof
  with fewer than k facts loses all of them. The prover run must use the embedding run's
  entity and relation labels (ids are matched by label).
* ``paths``: the training facts of the paths that imply the prediction (`kgtrace.prover.rule_paths`): the rules of
  a rule file (``kgtrace rules learn``) that predict it, strongest first, each path's facts in path order;
  the first k distinct ones. A prediction no rule predicts loses nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from kgtrace.attribution import TracIn
from kgtrace.attribution.methods import METHOD_SPECS, AttributionInputs, attribution_signature, removal_tops, shares_an_entity
from kgtrace.core.config import MAX_SEED
from kgtrace.core.errors import ConfigError, KgtraceError, option_name
from kgtrace.prover.explain import find_proof
from kgtrace.prover.graph import DirectedGraph
from kgtrace.prover.reference import FACT
from kgtrace.prover.rule_paths import PathFinder, path_facts
from kgtrace.prover.rules import read_rules
from kgtrace.prover.run import load_prover_run
from kgtrace.runs.embedding import Run

__all__ = ["METHODS", "Method", "MethodInputs", "method_signature", "removal_methods"]


@dataclass(frozen=True)
class MethodInputs:
    """What a method may need besides the run and the predictions; cannot be built invalid (every problem at once)."""

    seed: int = 0  # of the random draws (random, neighbourhood)
    progress: bool = False  # show TracIn's progress bar
    prover_run: str | None = None  # the prover run folder (proof)
    rules: str | None = None  # the rule file (paths)

    def __post_init__(self) -> None:
        problems = []
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            problems.append(f"seed={self.seed!r}: must be an integer from 0 to 2**63 - 1")
        if not isinstance(self.progress, bool):
            problems.append(f"progress={self.progress!r}: must be true or false")
        if self.prover_run is not None and not isinstance(self.prover_run, (str, Path)):
            problems.append(f"prover_run={self.prover_run!r}: must be a prover run folder (kgtrace prove --out)")
        if self.rules is not None and not isinstance(self.rules, (str, Path)):
            problems.append(f"rules={self.rules!r}: must be a rule file (kgtrace rules learn --out)")
        if problems:
            raise ConfigError(problems)


Method = Callable[[Run, Tensor, int, MethodInputs], list[Tensor]]


def tracin_last(run: Run, predictions: Tensor, k: int, inputs: MethodInputs = MethodInputs()) -> list[Tensor]:
    return _tracin(run, predictions, k, "last", inputs.progress)


def tracin_all(run: Run, predictions: Tensor, k: int, inputs: MethodInputs = MethodInputs()) -> list[Tensor]:
    return _tracin(run, predictions, k, "all", inputs.progress)


def _tracin(run: Run, predictions: Tensor, k: int, params: str, progress: bool) -> list[Tensor]:
    found = TracIn(run, params=params).top_k(predictions, k, progress=progress)
    return [item.proponents.clone() for item in found]


def _attribution_top(name: str) -> Method:
    def method(run: Run, predictions: Tensor, k: int, inputs: MethodInputs = MethodInputs()) -> list[Tensor]:
        matrix = METHOD_SPECS[name].compute(run, predictions, attribution_inputs(inputs))
        return [row.topk(min(k, len(row))).indices for row in matrix]  # [k] each, largest first
    return method


def attribution_inputs(inputs: MethodInputs) -> AttributionInputs:
    """The inputs the attribution methods get here: the seed, the rest their defaults."""
    return AttributionInputs(seed=inputs.seed, progress=inputs.progress)


def method_signature(name: str, inputs: MethodInputs, run: Run) -> str | None:
    """What a method's saved removals on ``run`` depend on besides the run and the prediction (None: the removal
    methods' own, whose formulas have not changed), as a string to compare."""
    if name not in removal_tops():
        return None
    return json.dumps(attribution_signature(name, attribution_inputs(inputs), run), sort_keys=True)


def random_triples(run: Run, predictions: Tensor, k: int, inputs: MethodInputs = MethodInputs()) -> list[Tensor]:
    n = len(run.dataset.train)
    return [torch.randperm(n, generator=_generator(inputs.seed, "random", triple))[:k] for triple in predictions]


def neighbourhood(run: Run, predictions: Tensor, k: int, inputs: MethodInputs = MethodInputs()) -> list[Tensor]:
    train = run.dataset.train
    chosen = []
    for triple in predictions:
        candidates = torch.nonzero(shares_an_entity(train, triple)).flatten()
        order = torch.randperm(len(candidates), generator=_generator(inputs.seed, "neighbourhood", triple))
        chosen.append(candidates[order[:k]])
    return chosen


def proof_facts(run: Run, predictions: Tensor, k: int, inputs: MethodInputs = MethodInputs()) -> list[Tensor]:

    if inputs.prover_run is None:
        raise ConfigError(["methods=proof: needs a prover run; fix: pass --prover-run DIR (a kgtrace prove --out folder)"])
    prover = load_prover_run(inputs.prover_run)
    entity_ids, relation_ids = _same_labels(run, prover.dataset, inputs.prover_run)
    train_index = {triple: i for i, triple in enumerate(map(tuple, run.dataset.train.tolist()))}
    back_entity = {p: e for e, p in enumerate(entity_ids)}
    back_relation = {p: r for r, p in enumerate(relation_ids)}
    chosen = []
    for h, r, t in predictions.tolist():
        proof = find_proof(prover, (entity_ids[h], relation_ids[r], entity_ids[t]))
        facts = []
        for step in proof.steps if proof is not None else ():
            if step.kind == FACT:
                rel, head, tail = prover.engine.fact_atom(step.index)  # the prover's ids
                triple = (back_entity[head], back_relation[rel], back_entity[tail])
                if triple not in train_index:
                    raise KgtraceError(f"{inputs.prover_run}: its proof of a prediction uses a fact that is not a "
                                       f"training triple of {run.path}. Fix: pass a prover run made from the "
                                       "embedding run's dataset and split")
                facts.append(train_index[triple])
        chosen.append(torch.tensor(list(dict.fromkeys(facts))[:k], dtype=torch.long))  # first use of each fact
    return chosen


def path_removals(run: Run, predictions: Tensor, k: int, inputs: MethodInputs = MethodInputs()) -> list[Tensor]:
    if inputs.rules is None:
        raise ConfigError([f"methods=paths: needs a rule file; fix: pass {option_name('--rules')} FILE "
                           "(kgtrace rules learn --out)"])
    ds = run.dataset
    rules = read_rules(inputs.rules, ds.relations, entities=ds.entities, max_body=3)
    finder = PathFinder.of(DirectedGraph.of(ds.train, ds.num_entities, ds.num_relations), rules)
    train_index = {triple: i for i, triple in enumerate(map(tuple, ds.train.tolist()))}
    return [torch.tensor([train_index[fact] for fact in path_facts(finder, tuple(triple), k)], dtype=torch.long)
            for triple in predictions.tolist()]


def _same_labels(run: Run, prover_dataset, prover_run: str) -> tuple[list[int], list[int]]:
    """The prover's id of each of the run's entities and relations (by label); raises when labels differ."""
    maps = []
    for what in ("entities", "relations"):
        ours, theirs = getattr(run.dataset, what), getattr(prover_dataset, what)
        missing = [label for label in ours.labels if label not in theirs.to_id]
        if missing or len(ours.labels) != len(theirs.labels):
            raise KgtraceError(f"{prover_run}: the prover run's {what} differ from those of {run.path} "
                               f"(e.g. {(missing or ['a different count'])[0]!r}). Fix: pass a prover run made "
                               "from the same dataset as the embedding run")
        maps.append([theirs.to_id[label] for label in ours.labels])
    return maps[0], maps[1]


def _generator(seed: int, salt: str, triple: Tensor) -> torch.Generator:
    """A generator seeded by (seed, salt, h, r, t): the same prediction gets the same draw in any company."""
    text = f"{seed}/{salt}/{'/'.join(str(int(x)) for x in triple)}"
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1)


#: The removal methods of this module by name (module doc); `removal_methods` adds the attribution methods'.
METHODS: dict[str, Method] = {
    "tracin-last": tracin_last,
    "tracin-all": tracin_all,
    "random": random_triples,
    "neighbourhood": neighbourhood,
    "proof": proof_facts,
    "paths": path_removals,
}


def removal_methods() -> dict[str, Method]:
    """Every removal method by name: this module's, then the top of each attribution method whose spec says
    ``removal`` (so a method registered later is offered too)."""
    return {**METHODS, **{name: _attribution_top(name) for name in removal_tops()}}
