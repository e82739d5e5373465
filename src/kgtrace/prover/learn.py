"""Rule learning in AnyBURL's language: rules read off paths sampled from the training graph, until the time is up.

Each round samples ``paths_per_round`` directed training facts q(x, y) (a fact r(h, t) read either way:
q = r from h, or q = r + R from t) and walks paths from x, never through an entity twice and never along
the fact itself (Meilicke et al. 2019's bottom rules):

* for each length n = 1 .. ``max_length``, n - 1 random steps, then a step to y along one of the relations
  joining the last entity to y, when there is one: the cyclic rule ``q(X,Y) :- path(X,Y)``. (AnyBURL
  walks the last step at random too, and keeps the walks that happen to end at y; closing the walk
  finds the cyclic rules of a large graph many times faster, in the same language.)
* one random step x -d-> z (z != y) gives AnyBURL's acyclic rules ``q(X,y) :- d(X,z)`` (AC1) and
  ``q(X,y) :- d(X,A)`` (AC2); for q = r + R they read ``r(y,X) :- ...``.

A cyclic rule found from either end of its facts is one rule (kept as the path from the head's X).
Rules not seen before are measured, and kept when they predict at least ``min_support`` facts correctly
with a confidence of at least ``min_confidence``:

* cyclic ``r(X,Y) :- path``: the groundings are the pairs (x, y), x != y, the path joins, the correct
  ones facts r(x, y); counted exactly from every start x of up to ``confidence_sample`` entities of
  the first relation's domain, drawn once per relation (rules sharing a prefix share its walk,
  `SparseWalker`). Every pair joined from a start counts once: random walks along the body, as
  AnyBURL samples them, favour pairs joined by many paths, which are the correct ones more often,
  and on FB15k-237 their confidences outranked the acyclic rules' (test MRR .267 against .293);
* AC1 and AC2, exactly: the groundings are the x other than the constant with d(x, z) (with some
  d-edge); the correct ones have r(x, c) (r(c, x)).

``confidence = correct / (groundings + confidence_offset)``: AnyBURL's unseen negatives, which rank a rule
right 2 times in 2 below one right 90 times in 100. Rules are written best first.

Rounds run until ``seconds`` are spent, or, when ``rounds`` is given, for that many rounds whatever
the time (the same rules on any machine).
After each round the state (every rule seen, those kept, the time spent) is written beside the rule
file, so a rerun of the same command continues where the last one stopped; each round's random
draws come from (seed, round), so the rounds are the same whatever the stops.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from kgtrace.core.errors import KgtraceError, option, option_name
from kgtrace.core.io import atomic_write_text
from kgtrace.core.owned import file_lock
from kgtrace.data.dataset import load_dataset
from kgtrace.prover.config import LearnConfig
from kgtrace.prover.graph import DirectedGraph, SparseWalker, directed_inverse, spans
from kgtrace.prover.logic import Atom, Rule, constant_term
from kgtrace.prover.rules import write_rules

__all__ = ["LearnedRule", "Learning", "learn_rule_file", "learn_rules", "state_path"]

Key = tuple[int, ...]  # cyclic: (0, r, d1, .., dn), the path from the head's X; acyclic: (1, q, c, d, z or -1)
MEASURED_AT_ONCE = 256  # candidates measured between two looks at the clock
SETTINGS_ADDED_LATER = {"meet_neighbours": 0}  # LearnConfig fields newer than some states, at their old behaviour


@dataclass(frozen=True)
class LearnedRule:
    """A kept rule and its measures (``note()`` is its comment in the rule file)."""

    rule: Rule
    support: int  # correct predictions among the groundings counted
    groundings: int  # body groundings counted (cyclic: from the start entities drawn)
    sampled: bool  # whether the starts were a sample of the first relation's domain

    def note(self) -> str:
        return f"support={self.support} groundings={self.groundings}{' (sampled)' if self.sampled else ''}"


@dataclass
class Learning:
    """What a learning has found so far: the rules seen (measured or not kept) and those kept, with their measures."""

    seen: set[Key]
    kept: dict[Key, tuple[int, int, bool]]  # key -> (support, groundings, sampled)
    rounds: int = 0
    seconds: float = 0.0

    def rules(self, num_relations: int, offset: float) -> list[LearnedRule]:
        """The kept rules, best first (ties: shorter, then by key)."""
        found = [LearnedRule(_rule(key, support / (groundings + offset), num_relations), support, groundings, sampled)
                 for key, (support, groundings, sampled) in self.kept.items()]
        return sorted(found, key=lambda m: (-m.rule.confidence, len(m.rule.body), _sort_key(m.rule)))

    def to_json(self, config: LearnConfig, fingerprint: str) -> str:
        return json.dumps({"config": asdict(config), "fingerprint": fingerprint, "rounds": self.rounds,
                           "seconds": self.seconds, "seen": sorted(self.seen),
                           "kept": [[list(k), *v] for k, v in sorted(self.kept.items())]})

    @classmethod
    def from_json(cls, text: str) -> tuple[Learning, dict, str]:
        data = json.loads(text)
        kept = {tuple(k): (int(s), int(g), bool(p)) for k, s, g, p in data["kept"]}
        learning = cls({tuple(k) for k in data["seen"]}, kept, int(data["rounds"]), float(data["seconds"]))
        return learning, data["config"], data["fingerprint"]


def learn_rules(triples: Tensor, num_entities: int, num_relations: int, config: LearnConfig, *,
                state: str | Path | None = None, log: Callable[[str], None] = print) -> list[LearnedRule]:
    """Learn rules from ``triples`` [N, 3] (h, r, t) for ``config.seconds`` (module doc), best first.

    state: a file to keep the learning in after each round; when it exists (same triples and settings but
    ``seconds``), learning continues from it.
    """
    config.validate()
    graph = DirectedGraph.of(triples, num_entities, num_relations)
    fingerprint = f"{num_entities}:{num_relations}:{len(graph.keys)}:{int(graph.keys.sum())}"
    learning = _resumed(state, config, fingerprint) or Learning(set(), {})
    measure = _Measures(graph, config)
    start = time.monotonic() - learning.seconds

    def done() -> bool:  # by rounds when they are given, whatever the time; else by the clock
        return learning.rounds >= config.rounds if config.rounds else time.monotonic() - start >= config.seconds

    while not done():
        found = _round(graph, config, learning.rounds)
        new = [key for key in dict.fromkeys(found) if key not in learning.seen]
        # In an order that mixes the kinds, so that a round the clock cuts short has measured some of each.
        order = torch.randperm(len(new), generator=torch.Generator().manual_seed(config.seed + learning.rounds))
        new = [new[i] for i in order.tolist()]
        measured = 0
        for part in range(0, len(new), MEASURED_AT_ONCE):
            if not config.rounds and done():
                break
            batch = new[part: part + MEASURED_AT_ONCE]
            learning.kept.update(measure.passing(batch))
            learning.seen.update(batch)
            measured += len(batch)
        learning.rounds += 1
        learning.seconds = time.monotonic() - start
        if state is not None:
            atomic_write_text(state, learning.to_json(config, fingerprint))
        log(f"round {learning.rounds}: {measured:,} new rules measured, {len(learning.kept):,} kept of "
            f"{len(learning.seen):,} seen ({learning.seconds:,.0f} s of {config.seconds:,.0f})")
    return learning.rules(num_relations, config.confidence_offset)


def state_path(out: str | Path) -> Path:
    """Where the learning of the rule file ``out`` keeps its state between rounds."""
    return Path(str(out) + ".state")


def learn_rule_file(dataset: str, out: str | Path, config: LearnConfig, *, overwrite: bool = False,
                    log: Callable[[str], None] = print) -> list[LearnedRule]:
    """Learn rules from ``dataset``'s training triples into the rule file ``out``, best first.

    Args:
        dataset: a registered dataset or a dataset folder.
        out: the rule file to write (with the measures of each rule as its comment); its state beside it
            (`state_path`) lets a rerun continue the learning (with more ``seconds`` or ``rounds``).
        config: the learning's settings (`LearnConfig`).
        overwrite: replace a rule file that exists, and start the learning anew.
        log: where each round's line goes.

    Returns:
        The rules written, best first, with their measures.
    """
    out, state = Path(out), state_path(out)
    with file_lock(out):
        if out.exists() and not state.exists() and not overwrite:
            raise KgtraceError(f"{option_name('--out', 'out')} {out}: the file exists. Fix: pass "
                               f"{option('--overwrite')}, or choose another name")
        if overwrite and state.exists():
            state.unlink()  # the learning's own state: starting anew
        ds = load_dataset(dataset)
        learned = learn_rules(ds.train, ds.num_entities, ds.num_relations, config, state=state, log=log)
        header = [f"rules learned from {dataset}: {len(learned)} rules from {len(ds.train)} training triples",
                  "settings: " + json.dumps(asdict(config)), "CONFIDENCE  HEAD :- BODY  # measures"]
        write_rules(out, [m.rule for m in learned], ds.relations.labels, [m.note() for m in learned], header,
                    entity_labels=ds.entities.labels)
    return learned


def _resumed(state: str | Path | None, config: LearnConfig, fingerprint: str) -> Learning | None:
    if state is None or not Path(state).is_file():
        return None
    learning, saved, saved_fingerprint = Learning.from_json(Path(state).read_text())
    saved = {**SETTINGS_ADDED_LATER, **saved}  # a state older than a setting was learned as its value here says
    same = {**asdict(config), "seconds": None, "rounds": None} == {**saved, "seconds": None, "rounds": None}
    if not same or saved_fingerprint != fingerprint:
        raise KgtraceError(f"{state}: the learning state of other triples or settings. Fix: rerun with the settings "
                           "it was started with (only --seconds and --rounds may change), pass "
                           f"{option('--overwrite')} to learn anew, or write the rules to another {option_name('--out')}")
    return learning


# ----------------------------------------------------------------------------- sampling


def _round(graph: DirectedGraph, config: LearnConfig, number: int) -> list[Key]:
    """The rules the paths of one round read off (module doc), as keys, with repeats."""
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + number)
    E, R, n = graph.num_entities, graph.num_relations, config.paths_per_round
    facts = torch.randint(len(graph.keys), (n,), generator=generator)
    x = graph.keys[facts] // (2 * R * E)  # the fact's source: keys are (x 2R + d) E + y
    q, y = graph.neighbours[facts].unbind(1)
    found: list[Key] = []
    for length in range(1, config.max_length + 1):
        nodes, path, ok = _walk(graph, x, q, y, length - 1, generator)
        last, ok = _close(graph, nodes[-1], x, q, y, ok, generator)
        found += [_cyclic_key(int(d), steps, R) for d, steps in zip(q[ok].tolist(),
                                                                    torch.stack([*path, last], 1)[ok].tolist(),
                                                                    strict=True)]
    if config.meet_neighbours and config.max_length >= 2:
        found += _meet(graph, x, q, y, config.meet_neighbours, config.max_length, generator)
    if config.acyclic:
        nodes, path, ok = _walk(graph, x, q, y, 1, generator)
        for d0, c, d, z in torch.stack([q, y, path[0], nodes[1]], 1)[ok].tolist():
            found += [(1, d0, c, d, z), (1, d0, c, d, -1)]
    return found


def _meet(graph: DirectedGraph, x: Tensor, q: Tensor, y: Tensor, cap: int, max_length: int,
          generator: torch.Generator) -> list[Key]:
    """Cyclic paths of two and three steps from each x to y met in the middle: up to ``cap`` steps x -d1-> a from
    x and as many b -d3-> y into y (all of them where there are no more), then every pair of them: a = b closes
    x -d1-> a -d3-> y; a != b joined by some a -d2-> b (one drawn at random) closes x -d1-> a -d2-> b -d3-> y.
    No path passes x or y in its middle."""
    D, R = 2 * graph.num_relations, graph.num_relations
    d1, a, take_x = _neighbour_sample(graph, x, cap, generator)  # the steps x -d1-> a, grouped by fact
    dy, b, take_y = _neighbour_sample(graph, y, cap, generator)  # dy(y, b): the step b -> y is its inverse
    start_x, start_y = torch.cumsum(take_x, 0) - take_x, torch.cumsum(take_y, 0) - take_y
    per = take_x * take_y  # [n] pairs of a step from x and a step into y, per fact
    rank, fact = spans(torch.zeros_like(per), per)  # [p] each pair's place among its fact's, and its fact
    i = start_x[fact] + rank // take_y[fact]  # [p] a step from x
    j = start_y[fact] + rank % take_y[fact]  # [p] a step into y
    middle = (a[i] != x[fact]) & (a[i] != y[fact]) & (b[j] != x[fact]) & (b[j] != y[fact])
    d3 = (dy[j] + R) % D  # directed_inverse
    found = [_cyclic_key(d0, steps, R) for d0, steps in
             zip(q[fact][middle & (a[i] == b[j])].tolist(),
                 torch.stack([d1[i], d3], 1)[middle & (a[i] == b[j])].tolist(), strict=True)]
    if max_length >= 3:
        d2, joined = _joining_step(graph, a[i], b[j], generator)
        three = middle & (a[i] != b[j]) & joined
        found += [_cyclic_key(d0, steps, R) for d0, steps in
                  zip(q[fact][three].tolist(), torch.stack([d1[i], d2, d3], 1)[three].tolist(), strict=True)]
    return found


def _neighbour_sample(graph: DirectedGraph, nodes: Tensor, cap: int,
                      generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Up to ``cap`` directed facts d(node, other) of each node [n] (all of them when it has no more, else ``cap``
    drawn with replacement), grouped by node: (d [m], other [m], how many of each node [n])."""
    low = graph.offsets[nodes]
    degree = graph.offsets[nodes + 1] - low
    take = degree.clamp(max=cap)
    every, owner = spans(low, take)  # [m] the first ``take`` facts of each node, and the node
    drawn = low[owner] + (torch.rand(len(owner), generator=generator) * degree[owner]).long()
    pick = torch.where(degree[owner] <= cap, every, drawn)
    d, other = graph.neighbours[pick].unbind(1)
    return d, other, take


def _joining_step(graph: DirectedGraph, z: Tensor, y: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """One of the directed relations joining each z to y, drawn at random, and whether there is one."""
    low, count = graph.joining(z, y)
    pick = low + (torch.rand(len(z), generator=generator) * count).long().clamp(max=(count - 1).clamp(min=0))
    return graph.pairs[pick.clamp(max=len(graph.pairs) - 1)] % (2 * graph.num_relations), count > 0


def _close(graph: DirectedGraph, z: Tensor, x: Tensor, q: Tensor, y: Tensor, ok: Tensor,
           generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """The last step z -> y of each walk: one of the relations joining z to y, drawn at random (not the fact
    itself), and whether there is one."""
    d, joined = _joining_step(graph, z, y, generator)
    return d, ok & joined & ~((z == x) & (d == q))


def _walk(graph: DirectedGraph, x: Tensor, q: Tensor, y: Tensor, length: int,
          generator: torch.Generator) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """A random walk of ``length`` steps from each x: its nodes, its directed relations, and whether it may start a
    bottom rule (it exists, never repeats an entity, never meets y, and does not take the fact)."""
    nodes, path = [x], []
    ok = x != y
    for step in range(length):
        current = nodes[-1]
        low, degree = graph.offsets[current], graph.offsets[current + 1] - graph.offsets[current]
        ok = ok & (degree > 0)
        pick = low + (torch.rand(len(x), generator=generator) * degree).long().clamp(max=(degree - 1).clamp(min=0))
        d, following = graph.neighbours[pick.clamp(max=len(graph.neighbours) - 1)].unbind(1)
        if step == 0:
            ok = ok & ~((d == q) & (following == y))  # not along the fact itself
        for before in nodes:
            ok = ok & (following != before)
        ok = ok & (following != y)
        nodes.append(following)
        path.append(d)
    return nodes, path, ok


def _cyclic_key(q: int, path: list[int], num_relations: int) -> Key:
    """The rule read as the path from its head's X: a head query's path walked back."""
    if q < num_relations:
        return (0, q, *path)
    return (0, q - num_relations, *(directed_inverse(d, num_relations) for d in reversed(path)))


# ----------------------------------------------------------------------------- measuring


class _Measures:
    """Counts of each candidate's groundings and correct ones (module doc)."""

    def __init__(self, graph: DirectedGraph, config: LearnConfig):
        self.graph, self.config = graph, config
        E, R = graph.num_entities, graph.num_relations
        pairs = torch.unique(graph.keys // E)  # (x 2R + d) of every x with a d-edge
        self.domain_sizes = torch.bincount(pairs % (2 * R), minlength=2 * R)  # [2R]
        self.domains = {d: pairs[pairs % (2 * R) == d] // (2 * R) for d in range(2 * R)}

    def passing(self, keys: list[Key]) -> dict[Key, tuple[int, int, bool]]:
        """The candidates that pass the thresholds, with (support, groundings, sampled)."""
        counted: dict[Key, tuple[int, int, bool]] = {}
        cyclic = [k for k in keys if k[0] == 0]
        by_first: dict[int, list[Key]] = defaultdict(list)
        for key in cyclic:
            by_first[key[2]].append(key)
        for first, group in by_first.items():
            counted.update(self._cyclic(first, sorted(group)))
        acyclic = [k for k in keys if k[0] == 1]
        if acyclic:
            counted.update(self._acyclic(acyclic))
        c = self.config
        return {k: v for k, v in counted.items()
                if v[0] >= c.min_support and v[0] / (v[1] + c.confidence_offset) >= c.min_confidence}

    def _cyclic(self, first: int, keys: list[Key]) -> dict[Key, tuple[int, int, bool]]:
        """Every pair the body joins from the start entities (all of the first relation's domain, or a sample)."""
        starts = self._starts(first)
        sampled = len(starts) < len(self.domains[first])
        walker = SparseWalker(self.graph, starts)
        E = self.graph.num_entities
        correct_of: dict[int, Tensor] = {}
        found = {}
        for key in keys:
            r, path = key[1], key[2:]
            entity, column = walker.reach(path)  # the pairs (y, start) the body joins
            pairs = column * E + entity
            pairs = pairs[entity != starts[column]]  # x != y
            if r not in correct_of:
                rows, cols = self._facts_from(starts, r)
                correct_of[r] = torch.sort(cols * E + rows).values
            found[key] = (int(torch.isin(pairs, correct_of[r]).sum()), len(pairs), sampled)
        return found

    def _starts(self, first: int) -> Tensor:
        """Up to confidence_sample entities with a ``first``-edge, drawn once (seeded by the relation)."""
        domain = self.domains[first]
        if len(domain) <= self.config.confidence_sample:
            return domain
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + 7919 * first + 1)
        return domain[torch.randperm(len(domain), generator=generator)[: self.config.confidence_sample].sort().values]

    def _facts_from(self, starts: Tensor, d: int) -> tuple[Tensor, Tensor]:
        """(y, column) of every fact d(x, y), x = starts[column], y != x."""
        positions, column = self._ranges(starts, torch.full_like(starts, d))
        y = self.graph.neighbours[positions, 1]
        keep = y != starts[column]
        return y[keep], column[keep]

    def _ranges(self, x: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
        """The positions in graph.keys of the facts d[i](x[i], .), and the i of each."""
        return spans(*self.graph.edges(x, d))

    def _acyclic(self, keys: list[Key]) -> dict[Key, tuple[int, int, bool]]:
        """AC1 (z >= 0) and AC2 (z = -1) exactly: groundings x != c, correct those with q(x, c)."""
        R = self.graph.num_relations
        _, q, c, d, z = torch.tensor(keys).unbind(1)
        back = torch.where(d < R, d + R, d - R)
        groundings = self.domain_sizes[d].clone()
        groundings -= self.graph.has_edge(c, d).long()  # x = c does not count
        ac1 = z >= 0
        positions, owner = self._ranges(z[ac1], back[ac1])  # x with d(x, z): z -d^-1-> x
        groundings[ac1] = torch.bincount(owner, minlength=int(ac1.sum())) - self.graph.has(c[ac1], d[ac1], z[ac1]).long()
        correct = torch.zeros(len(keys), dtype=torch.long)
        index = ac1.nonzero().squeeze(1)[owner]
        xs = self.graph.neighbours[positions, 1]
        hit = self.graph.has(xs, q[index], c[index]) & (xs != c[index])
        correct.index_add_(0, index, hit.long())
        ac2 = (~ac1).nonzero().squeeze(1)
        positions, owner = self._ranges(c[ac2], torch.where(q[ac2] < R, q[ac2] + R, q[ac2] - R))  # x with q(x, c)
        index = ac2[owner]
        xs = self.graph.neighbours[positions, 1]
        hit = self.graph.has_edge(xs, d[index]) & (xs != c[index])
        correct.index_add_(0, index, hit.long())
        return {key: (int(s), int(g), False) for key, s, g in zip(keys, correct.tolist(), groundings.tolist(), strict=True)}


# ----------------------------------------------------------------------------- rules


def _rule(key: Key, confidence: float, num_relations: int) -> Rule:
    """The Rule of a key (prover.logic's local terms: X = 0, Y = 1, then the path's middle entities)."""
    R = num_relations
    if key[0] == 0:
        r, path = key[1], key[2:]
        nodes = [0, *range(2, len(path) + 1), 1]
        body = tuple(_atom(d, a, b, R) for d, a, b in zip(path, nodes, nodes[1:], strict=False))
        return Rule(r, body, confidence)
    _, q, c, d, z = key
    end = constant_term(z) if z >= 0 else 2
    head_args = (0, constant_term(c)) if q < R else (constant_term(c), 0)
    return Rule(q % R, (_atom(d, 0, end, R),), confidence, head_args=head_args)


def _atom(d: int, a: int, b: int, num_relations: int) -> Atom:
    """The atom of the step a -d-> b."""
    return (d, a, b) if d < num_relations else (d - num_relations, b, a)


def _sort_key(rule: Rule) -> tuple:
    return (rule.head, rule.head_args, rule.body)
