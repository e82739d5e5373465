"""Candidate sets for filtered ranking: sampled corruptions and node-category restrictions.

Sampled corruptions (`rank_side_sampled`) rank each true answer against itself and
K corrupted answers drawn uniformly without replacement from its *eligible* entities:
not a known answer of the query (filtered sampling), not the true answer, and, with a
`CandidateRestriction`, of an allowed category.

The sampler. Query ``q`` of side ``s`` meets the entities in the order of a keyed
bijection ``sigma_q`` of ``[0, 2^b)``, ``2^b >= E``: ``sigma_q(0), sigma_q(1), ...``,
skipping values ``>= E`` and ineligible entities. Its corruptions are the first K eligible
entities met (all of them if fewer are eligible). For a uniformly random permutation that
is exactly a uniform K-subset of the eligible entities. ``sigma_q`` is 4 rounds of (xor a
key, multiply by an odd key mod 2^b, xor the value shifted right by ceil(b/2)), each step
a bijection, with the 8 keys drawn by splitmix64 from (seed, side, q). It is a pseudo-random
permutation, not a uniform one: over 10^6 queries, the frequencies of the pairs of first two
corruptions were within noise of uniform (chi-square / df 1.000 +- 0.002 at E = 1000, 0.95
+- 0.03 at E = 60); 3 rounds were measurably off (1.014). b is at least 10: smaller domains
mix poorly (E = 50 with b = 6: 1.9), and skipping the extra positions costs little.

The sample depends on nothing but (seed, side, q, the eligible set, K): the same whatever
the chunking, the memory budget, the scoring path or the device. A query walks about
``K * 2^b / eligible`` positions (at most 2^b), so K << E costs O(K) hashing, not O(E);
only the one-byte-per-entity eligibility mask (a memset) and, on the ``score_t`` path,
the scores themselves are O(E) per query (``benchmarks/eval_vs_pykeen.py`` times it).

Type restrictions (`CandidateRestriction`) say which entities may answer each
relation-or-inverse query, from the categories of KGX nodes (``node_categories.tsv``):
inferred from training triples (`infer_restriction`) or given as rules
(`explicit_restriction`, `parse_restrict`). They are stored per category set
("group"), [2R, G] booleans, never [2R, E].
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from kgtrace.core.errors import ConfigError, KgtraceError, option, option_name
from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.ranks import RankCounts, count_ranks, ranked
from kgtrace.evaluation.sides import BYTES_PER_SCORE, SideQueries, check_finite, non_finite_error
from kgtrace.models.base import QueryScorer, Scorer, forward_triples

__all__ = [
    "CandidateRestriction",
    "Corruptions",
    "check_restrict",
    "explicit_restriction",
    "has_categories",
    "infer_restriction",
    "parse_restrict",
    "rank_side_restricted",
    "rank_side_sampled",
    "restriction_note",
    "restriction_of",
    "restricts",
    "sample_corruptions",
]

SIDE_CODES = {"head": 0, "tail": 1}
WALK_ROUNDS = 4
MIN_WALK_BITS = 10
MAX_WALK_BITS = 31  # keeps key * value below 2^62: int64 products never overflow
# Bytes per walked position kept alive in one tile: the int64 entity, its int64 flat index,
# an int64 shift temporary, the int32 running count, a handful of bool masks, the gathered
# float score and, on the score_hrt path, the int64 (row, entity) pair of a sampled entry.
BYTES_PER_WALK = 64
# Bytes per triple in one score_hrt call: the [3] ids plus the model's intermediates
# (DistMult of dim 200 holds three [200] float vectors, 2.4 KB); 4 KiB leaves room for
# wider models. A rule prover with bigger per-triple state should be given a bigger budget.
BYTES_PER_TRIPLE = 4096
MIN_TILE, MAX_TILE = 64, 1 << 19  # a tile beyond 2^19 positions (4 MB per int64) only leaves the cache
MAX_QUERIES_PER_CHUNK = 65536
# Positions walked beyond the expected need, so that most rows finish in one block.
WALK_SLACK_FACTOR, WALK_SLACK = 1.1, 64

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


# ----------------------------------------------------------------------------- type restriction


@dataclass(frozen=True)
class CandidateRestriction:
    """Which entities may answer each (relation-or-inverse) query: a 'treats' tail must be a disease."""

    entity_group: Tensor  # LongTensor [E]: id of each entity's category set (distinct category tuples)
    allowed: Tensor  # BoolTensor [2R, G]: may group g answer relation r (r >= R: inverse = head side)

    def mask(self, relations: Tensor) -> Tensor:
        """relations [B] in [0, 2R) -> BoolTensor [B, E]: may entity e answer query b."""
        allowed = self.allowed.to(relations.device)[relations]  # [B, G]
        return allowed[:, self.entity_group.to(relations.device)]  # [B, E]

    def count(self, relations: Tensor) -> Tensor:
        """relations [B] -> LongTensor [B]: the number of entities allowed to answer each."""
        sizes = torch.bincount(self.entity_group, minlength=self.allowed.shape[1]).to(relations.device)  # [G]
        return (self.allowed.to(relations.device)[relations].long() * sizes).sum(1)

    def to(self, device: torch.device | str) -> "CandidateRestriction":
        return CandidateRestriction(self.entity_group.to(device), self.allowed.to(device))


@dataclass(frozen=True)
class _Groups:
    """Entities grouped by their set of categories."""

    entity_group: Tensor  # LongTensor [E]
    categories: tuple[tuple[str, ...], ...]  # sorted categories of each group; () = uncategorized


def _entity_groups(dataset) -> _Groups:
    """Group entities by category set; KgtraceError when the dataset has no categories."""
    labels = dataset.entities.labels
    per_entity = [tuple(sorted(set(dataset.entity_categories.get(label, ())))) for label in labels]
    if not any(per_entity):
        raise KgtraceError(
            f"restricting candidates by type needs node categories, but no entity of dataset {dataset.name!r} "
            "has one. Fix: add node_categories.tsv (label<TAB>cat1|cat2, e.g. the category column of the KGX "
            "nodes file) to the dataset folder, or build the folder with kgtrace prepare --nodes NODES --edges "
            "EDGES, which keeps the KGX categories; or rank every entity (--restrict none)"
        )
    group_of: dict[tuple[str, ...], int] = {}
    ids = [group_of.setdefault(cats, len(group_of)) for cats in per_entity]
    return _Groups(torch.tensor(ids, dtype=torch.long), tuple(group_of))


def _membership(groups: _Groups) -> Tensor:
    """FloatTensor [G, C + 1]: 1 where group g has category c; the last column marks 'no category'."""
    names = sorted({c for cats in groups.categories for c in cats})
    column = {name: i for i, name in enumerate(names)}
    member = torch.zeros(len(groups.categories), len(names) + 1)
    for g, cats in enumerate(groups.categories):
        for c in cats or (None,):
            member[g, column[c] if c is not None else len(names)] = 1.0
    return member


def infer_restriction(dataset, triples: Tensor | None = None) -> CandidateRestriction:
    """The domain and range seen in ``triples`` (default: the training split).

    An entity may be a tail of relation r if its *most specific* category is a category of
    some tail of r in ``triples``, and a head likewise (row r + R). An entity's most specific
    categories are those of its categories that the fewest entities of the dataset carry:
    with Biolink lineages (``biolink:NamedThing|biolink:Disease``) an ancestor is carried by
    at least every entity its descendant is, so a disease counts as a disease, not as a
    named thing that every entity also is (ties, e.g. two categories on the same entities,
    all count). Uncategorized entities count as one more category: allowed where some seen
    answer was uncategorized. A relation without triples has no evidence and stays unrestricted.
    """
    groups = _entity_groups(dataset)
    triples = (dataset.train if triples is None else triples).long().cpu()
    num_relations, num_groups = dataset.num_relations, len(groups.categories)
    h, r, t = triples.unbind(1)
    seen = torch.zeros(2 * num_relations, num_groups, dtype=torch.bool)
    seen[r, groups.entity_group[t]] = True
    seen[r + num_relations, groups.entity_group[h]] = True
    member = _membership(groups)  # [G, C + 1]
    seen_categories = (seen.float() @ member) > 0  # [2R, C + 1]
    allowed = (seen_categories.float() @ _most_specific(groups, member).t()) > 0  # [2R, G]
    allowed[~seen.any(1)] = True
    return CandidateRestriction(groups.entity_group, allowed)


def _most_specific(groups: _Groups, member: Tensor) -> Tensor:
    """FloatTensor [G, C + 1]: 1 where category c is one of group g's rarest categories among the entities."""
    sizes = torch.bincount(groups.entity_group, minlength=member.shape[0]).to(member.dtype)  # [G]
    carriers = sizes @ member  # [C + 1]: entities carrying each category
    carried = torch.where(member > 0, carriers, torch.inf)  # [G, C + 1]: inf where g lacks c
    fewest = carried.min(dim=1, keepdim=True).values  # [G, 1]
    return ((member > 0) & (carried == fewest)).to(member.dtype)


def explicit_restriction(dataset, rules: dict[tuple[str, str], set[str]]) -> CandidateRestriction:
    """Restrict by rules {(relation label, "head" | "tail"): allowed categories}; others unrestricted.

    An entity is allowed if it has any of the rule's categories. Raises ConfigError listing
    every unknown relation, side or category at once.
    """
    groups = _entity_groups(dataset)
    num_relations = dataset.num_relations
    allowed = torch.ones(2 * num_relations, len(groups.categories), dtype=torch.bool)
    known_categories = sorted({c for cats in groups.categories for c in cats})
    problems: list[str] = []
    for (relation, side), categories in rules.items():
        rule_problems = _rule_problems(dataset, relation, side, categories, known_categories)
        problems.extend(rule_problems)
        if not rule_problems:
            row = dataset.relations.to_id[relation] + (num_relations if side == "head" else 0)
            allowed[row] = torch.tensor([bool(categories & set(cats)) for cats in groups.categories])
    if problems:
        raise ConfigError(problems)
    return CandidateRestriction(groups.entity_group, allowed)


def _rule_problems(dataset, relation: str, side: str, categories: set[str], known: list[str]) -> list[str]:
    rule = f"restrict rule {relation}:{side}={'|'.join(sorted(categories))}"
    problems = []
    if relation not in dataset.relations.to_id:
        examples = ", ".join(dataset.relations.labels[:5])
        problems.append(f"{rule}: relation {relation!r} is not in dataset {dataset.name!r}; "
                        f"fix: use a relation label of the dataset, e.g. {examples}")
    if side not in SIDE_CODES:
        problems.append(f"{rule}: side {side!r} is neither head nor tail; fix: write RELATION:head=... or RELATION:tail=...")
    unknown = sorted(categories - set(known))
    if unknown:
        problems.append(f"{rule}: no entity has category {', '.join(map(repr, unknown))}; "
                        f"fix: use categories of node_categories.tsv, e.g. {', '.join(known[:8])}")
    return problems


def parse_restrict(texts: Sequence[str]) -> dict[tuple[str, str], set[str]]:
    """Parse ``RELATION:tail=CAT1|CAT2`` (or ``:head=``) rules; repeated rules for one target merge.

    The relation is everything before the last ':' ahead of '=', so CURIE relations such as
    ``biolink:treats:tail=biolink:Disease`` parse. ConfigError lists every malformed rule.
    """
    fix = ("fix: write RELATION:tail=CAT1|CAT2 or RELATION:head=CAT1|CAT2 (or one of auto, typed, none alone: "
           "auto and typed infer the categories from training, none ranks every entity)")
    rules: dict[tuple[str, str], set[str]] = {}
    problems = []
    for text in texts:
        target, equals, listed = text.partition("=")
        relation, colon, side = target.strip().rpartition(":")
        categories = {c.strip() for c in listed.split("|")} - {""}
        problem = (
            "no '=' before the categories" if not equals
            else "no ':head' or ':tail' after the relation" if not colon or not relation
            else f"side {side!r} is neither head nor tail" if side not in SIDE_CODES
            else "no category after '='" if not categories
            else None
        )
        if problem:
            problems.append(f"{option_name('--restrict')} {text!r}: {problem}; {fix}")
        else:
            rules.setdefault((relation, side), set()).update(categories)
    if problems:
        raise ConfigError(problems)
    return rules


# ----------------------------------------------------------------------------- ranking among allowed entities


def has_categories(dataset) -> bool:
    """Whether any entity of ``dataset`` has a node category (node_categories.tsv, a KGX nodes file's)."""
    return any(dataset.entity_categories.get(label) for label in dataset.entities.labels)


KEYWORDS = (["auto"], ["none"], ["typed"])  # --restrict values that stand alone


def check_restrict(rules: Sequence[str]) -> None:
    """Refuse malformed ``--restrict`` rules before any work (their relations and categories are checked against a
    dataset by `restriction_of`)."""
    if list(rules) and list(rules) not in KEYWORDS:
        parse_restrict(rules)


def restricts(dataset, rules: Sequence[str] = ()) -> bool:
    """Whether `restriction_of` (``dataset``, ``rules``) restricts the candidates, without building it."""
    return list(rules) != ["none"] and (list(rules) not in ([], ["auto"]) or has_categories(dataset))


def restriction_of(dataset, rules: Sequence[str] = ()) -> CandidateRestriction | None:
    """The candidates ``rules`` (``--restrict``) ask for.

    None given, or "auto" (the default): where the dataset has node categories, each relation's
    heads and tails are restricted to the categories it takes in training (`infer_restriction`;
    a drug's ``treats`` answers are diseases), else every entity. "none": every entity. "typed": the
    inferred restriction, refused without categories. Otherwise ``RELATION:side=CATS`` rules.
    """
    rules = list(rules) or ["auto"]
    if rules == ["auto"]:
        return infer_restriction(dataset) if has_categories(dataset) else None
    if rules == ["none"]:
        return None
    if rules == ["typed"]:
        return infer_restriction(dataset)
    return explicit_restriction(dataset, parse_restrict(rules))


def restriction_note(restriction: CandidateRestriction | bool | None, rules: Sequence[str] = ()) -> str:
    """What the candidates are, in one line for a command's first output (``restriction``: the one built, or
    whether there is one; ``rules``: the ``--restrict`` given)."""
    none = option("--restrict", "none")
    if restriction is None or restriction is False:
        return "candidates: every entity"
    if list(rules) in ([], ["auto"], ["typed"]):
        return (f"candidates: each relation's heads and tails restricted to the node categories it takes in training "
                f"({none}: every entity)")
    return f"candidates: restricted by {'; '.join(rules)} ({none}: every entity)"


def restricted_queries_per_chunk(num_entities: int, memory_budget: int) -> int:
    """Queries ranked at once by `rank_side_restricted`: their [B, E] scores plus the [B, E] bool mask."""
    return max(1, min(MAX_QUERIES_PER_CHUNK, memory_budget // (num_entities * (BYTES_PER_SCORE + 1))))


def sampled_queries_per_chunk(model: Scorer, memory_budget: int) -> int:
    """Queries ranked at once by `rank_side_sampled` (its plan for this budget)."""
    return _plan(model, memory_budget).queries_per_chunk


@torch.inference_mode()
def rank_side_restricted(
    model: Scorer, sq: SideQueries, known: AnswerIndex, restriction: CandidateRestriction, *,
    memory_budget: int, device: torch.device,
) -> RankCounts:
    """Filtered rank counts of one side against all entities the restriction allows.

    Disallowed entities drop out like filtered ones, so num_candidates counts allowed,
    unfiltered entities only. The true answer always counts, even if its own category is
    not allowed for the relation: a test triple outside the inferred range is still ranked,
    against the allowed entities.
    """
    num_entities = model.num_entities
    chunk = restricted_queries_per_chunk(num_entities, memory_budget)
    restriction = restriction.to(device)
    parts = []
    for start in range(0, len(sq.answers), chunk):
        queries = sq.queries[start : start + chunk]
        answers = sq.answers[start : start + chunk].to(device)
        scores = ranked(model.score_t(queries.to(device)))  # [B, E]
        check_finite(scores, sq, start)
        eligible = _eligible(queries, answers, known, restriction, num_entities, device)
        excluded = eligible.mask.logical_not_()  # [B, E], in place: disallowed or another known answer
        excluded[torch.arange(len(answers), device=device), answers] = False
        # -inf never beats or ties a finite true score: excluded entities drop out of the counts.
        scores.masked_fill_(excluded, float("-inf"))
        no_filter = torch.zeros(0, dtype=torch.long, device=device)
        counts = count_ranks(scores, answers, no_filter, no_filter)
        parts.append(RankCounts(counts.greater.cpu(), counts.equal.cpu(), (1 + eligible.count).cpu()))
    return RankCounts.cat(parts)


# ----------------------------------------------------------------------------- the per-query sampler


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 output function on uint64 arrays (wrapping arithmetic is defined for numpy uint64)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def _walk_bits(num_entities: int) -> int:
    """b of the permuted domain [0, 2^b) that covers the entity ids."""
    bits = max(MIN_WALK_BITS, (num_entities - 1).bit_length())
    if bits > MAX_WALK_BITS:
        raise KgtraceError(f"sampled corruptions support at most 2^{MAX_WALK_BITS} entities, got {num_entities}. "
                           f"Fix: rank against all entities ({option('--corruptions', 0)})")
    return bits


@dataclass(frozen=True)
class _Permutations:
    """One keyed bijection of [0, 2^bits) per query of a chunk: the order it meets entities in."""

    xor: Tensor  # LongTensor [B, WALK_ROUNDS], keys in [0, 2^bits)
    mul: Tensor  # LongTensor [B, WALK_ROUNDS], odd keys in [0, 2^bits)
    bits: int

    @classmethod
    def of(cls, seed: int, side: str, query_ids: Tensor, num_entities: int, device: torch.device) -> "_Permutations":
        """Keys from (seed, side, global query index) only, so chunking cannot change them."""
        bits = _walk_bits(num_entities)
        base = _splitmix64(_splitmix64(np.array([seed & _MASK64], dtype=np.uint64)) ^ np.uint64(SIDE_CODES[side]))
        per_query = _splitmix64(base + query_ids.cpu().numpy().astype(np.uint64))  # [B]
        words = _splitmix64(per_query[:, None] + np.arange(2 * WALK_ROUNDS, dtype=np.uint64) * _GOLDEN)  # [B, 2 * ROUNDS]
        mask = np.uint64((1 << bits) - 1)
        xor = torch.from_numpy((words[:, :WALK_ROUNDS] & mask).astype(np.int64))
        mul = torch.from_numpy(((words[:, WALK_ROUNDS:] & mask) | np.uint64(1)).astype(np.int64))
        return cls(xor.to(device), mul.to(device), bits)

    def entities(self, rows: Tensor, start: int, width: int) -> Tensor:
        """sigma_q(start .. start + width - 1) of the queries ``rows`` [b]: LongTensor [b, width] in [0, 2^bits)."""
        mask, shift = (1 << self.bits) - 1, (self.bits + 1) // 2
        xor, mul = self.xor[rows], self.mul[rows]  # [b, ROUNDS]
        positions = torch.arange(start, start + width, device=xor.device)
        x = positions.unsqueeze(0) ^ xor[:, :1]  # [b, width]
        shifted = torch.empty_like(x)
        # In place: the walk is the hot loop, and fresh [b, width] tensors per step would double its cost.
        for r in range(WALK_ROUNDS):
            if r:
                x.bitwise_xor_(xor[:, r : r + 1])
            x.mul_(mul[:, r : r + 1]).bitwise_and_(mask)
            torch.bitwise_right_shift(x, shift, out=shifted)
            x.bitwise_xor_(shifted)
        return x


@dataclass(frozen=True)
class _Tile:
    """A block of walked positions for some queries of a chunk."""

    rows: Tensor  # LongTensor [b]: rows of the chunk
    entities: Tensor  # LongTensor [b, w]: entity met at each position (clamped into [0, E) where skipped)
    flat: Tensor  # LongTensor [b, w]: index of (row, entity) in a flattened [B, E] chunk tensor
    take: Tensor  # BoolTensor [b, w]: the entity is one of the row's corruptions


@dataclass(frozen=True)
class _Eligible:
    """The entities each query of a chunk may draw: unknown, not the true answer, allowed."""

    mask: Tensor  # BoolTensor [B, E]
    count: Tensor  # LongTensor [B]


def _eligible(queries: Tensor, answers: Tensor, known: AnswerIndex, allowed: CandidateRestriction | None,
              num_entities: int, device: torch.device) -> _Eligible:
    relations, answers = queries[:, 1].to(device), answers.to(device)
    if allowed is None:
        mask = torch.ones(len(answers), num_entities, dtype=torch.bool, device=device)
    else:
        mask = allowed.mask(relations)  # [B, E]
    rows, cols = (x.to(device) for x in known.lookup(queries))
    mask[rows, cols] = False
    mask[torch.arange(len(answers), device=device), answers] = False
    return _Eligible(mask, _count_eligible(relations, answers, rows, cols, allowed, num_entities))


def _count_eligible(relations: Tensor, answers: Tensor, rows: Tensor, cols: Tensor,
                    allowed: CandidateRestriction | None, num_entities: int) -> Tensor:
    """Eligible entities per query [B], from the few exclusions: summing a [B, E] bool mask costs 4 ns an entry."""
    num_rows = len(answers)
    true_rows = torch.arange(num_rows, device=answers.device)
    # Each excluded (row, entity) once: the true answer is often also a known answer.
    codes = torch.unique(torch.cat([rows * num_entities + cols, true_rows * num_entities + answers]))
    excluded_rows, excluded_entities = codes // num_entities, codes % num_entities
    if allowed is None:
        return num_entities - torch.bincount(excluded_rows, minlength=num_rows)
    # Only exclusions the restriction would have allowed reduce its count.
    was_allowed = allowed.allowed[relations[excluded_rows], allowed.entity_group[excluded_entities]]
    return allowed.count(relations) - torch.bincount(excluded_rows[was_allowed], minlength=num_rows)


def _walk(perms: _Permutations, eligible: _Eligible, num_corruptions: int, tile_elems: int) -> Iterator[_Tile]:
    """Walk each row's permutation in blocks of positions until it has met its corruptions."""
    span = 1 << perms.bits
    available = eligible.count  # [B]
    wanted = available.clamp(max=num_corruptions)  # [B]
    met = torch.zeros_like(available)  # eligible entities met so far
    active = torch.nonzero(wanted > 0).squeeze(1)
    start = 0
    while len(active) and start < span:
        width = _block_width(wanted[active] - met[active], available[active] - met[active], span - start, tile_elems)
        for rows in active.split(max(1, tile_elems // width)):
            yield _tile(perms, eligible.mask, rows, start, width, met, num_corruptions)
        start += width
        active = active[met[active] < wanted[active]]


def _block_width(missing: Tensor, remaining: Tensor, positions_left: int, tile_elems: int) -> int:
    """Positions the median active row still needs (eligible entities are spread evenly), with slack.

    A median, not a maximum, so that one row of a scarce relation does not make the others
    walk their whole domain; the rows it leaves unfinished go on in the next block.
    """
    need = (missing.double() * positions_left / remaining.double()).median()
    width = int(float(need) * WALK_SLACK_FACTOR) + WALK_SLACK
    return max(1, min(width, tile_elems, positions_left))


def _tile(perms: _Permutations, eligible: Tensor, rows: Tensor, start: int, width: int, met: Tensor,
          num_corruptions: int) -> _Tile:
    """Walk positions start .. start + width - 1 of ``rows``; updates ``met`` [B] in place."""
    num_entities = eligible.shape[1]
    entities = perms.entities(rows, start, width)  # [b, w]
    valid = entities < num_entities  # the domain is a power of two: positions past E are skipped
    entities.clamp_(max=num_entities - 1)
    flat = entities + (rows * num_entities).unsqueeze(1)  # [b, w] into the flattened [B, E] chunk
    valid &= torch.take(eligible, flat)
    # The k-th eligible entity met is a corruption while k <= K.
    order = torch.cumsum(valid, 1, dtype=torch.int32)  # [b, w]
    order += met[rows].to(torch.int32).unsqueeze(1)
    take = valid & (order <= num_corruptions)
    met[rows] += valid.sum(1)
    return _Tile(rows, entities, flat, take)


# ----------------------------------------------------------------------------- sampled ranking


@dataclass(frozen=True)
class _Plan:
    """Chunk sizes for one memory budget."""

    by_score_t: bool  # score [B, E] and gather; else score_hrt on [P, 3] triples
    queries_per_chunk: int
    tile_elems: int  # walked positions per tile
    triples_per_call: int  # score_hrt batch


def _plan(model: Scorer, memory_budget: int) -> _Plan:
    """Split the budget: a quarter for walk tiles; the rest for [B, E] scores + masks (score_t) or
    half for [B, E] masks and a quarter for score_hrt batches."""
    num_entities = model.num_entities
    tile = max(MIN_TILE, min(MAX_TILE, memory_budget // 4 // BYTES_PER_WALK))
    rest = memory_budget - tile * BYTES_PER_WALK
    per_scored_query = num_entities * (BYTES_PER_SCORE + 1)  # float scores with headroom, bool eligibility
    by_score_t = isinstance(model, QueryScorer) and rest >= per_scored_query
    if by_score_t:
        queries = rest // per_scored_query
    else:
        queries = memory_budget // 2 // num_entities  # the bool eligibility mask only
    triples = max(1, memory_budget // 4 // BYTES_PER_TRIPLE)
    return _Plan(by_score_t, max(1, min(MAX_QUERIES_PER_CHUNK, queries)), tile, triples)


@torch.inference_mode()
def rank_side_sampled(
    model: Scorer, sq: SideQueries, known: AnswerIndex, *, num_corruptions: int, seed: int,
    memory_budget: int, device: torch.device, allowed: CandidateRestriction | None = None,
) -> RankCounts:
    """Rank each true answer among itself and up to ``num_corruptions`` sampled filtered corruptions.

    num_candidates = 1 + min(K, eligible entities). Ties count as in `count_ranks`.
    Scores by ``score_t`` and a gather when one query's [E] scores fit the budget, else by
    ``score_hrt`` on the sampled triples (both give the same counts for the same scores).
    The model should be in eval mode.
    """
    _check_num_corruptions(num_corruptions)
    device = torch.device(device)
    allowed = allowed.to(device) if allowed is not None else None
    plan = _plan(model, memory_budget)
    parts = []
    for start in range(0, len(sq.answers), plan.queries_per_chunk):
        stop = min(start + plan.queries_per_chunk, len(sq.answers))
        queries, answers = sq.queries[start:stop], sq.answers[start:stop].to(device)
        eligible = _eligible(queries, answers, known, allowed, model.num_entities, device)
        num_candidates = 1 + eligible.count.clamp(max=num_corruptions)
        perms = _Permutations.of(seed, sq.side, torch.arange(sq.offset + start, sq.offset + stop), model.num_entities,
                                 device)
        tiles = _walk(perms, eligible, num_corruptions, plan.tile_elems)
        if plan.by_score_t:
            greater, equal = _count_by_score_t(model, queries.to(device), answers, tiles, sq, start)
        else:
            greater, equal = _count_by_score_hrt(model, queries.to(device), answers, tiles, plan.triples_per_call,
                                                 sq, start)
        parts.append(RankCounts(greater.cpu(), equal.cpu(), num_candidates.cpu()))
    return RankCounts.cat(parts)


def _check_num_corruptions(num_corruptions: int) -> None:
    if not isinstance(num_corruptions, int) or num_corruptions < 1:
        raise ConfigError([f"corruptions={num_corruptions!r}: sampled ranking needs at least 1 corruption per "
                           "query; fix: pass a positive K, or rank against all entities (corruptions 0)"])


def _count_by_score_t(model: Scorer, queries: Tensor, answers: Tensor, tiles: Iterator[_Tile], sq: SideQueries,
                      start: int) -> tuple[Tensor, Tensor]:
    """(greater [B], equal [B]) among the sampled entities, from one [B, E] score_t call."""
    scores = ranked(model.score_t(queries))  # [B, E]
    rows = torch.arange(len(answers), device=answers.device)
    true = scores[rows, answers]  # [B]
    check_finite(true.unsqueeze(1), sq, start)
    # A finite sum proves every score finite (NaN and inf propagate), at 0.2 ns an entry against
    # 5 for isfinite; only if it fails do the tiles look for a sampled non-finite score.
    all_finite = bool(torch.isfinite(scores.sum()))
    greater = torch.zeros(len(answers), dtype=torch.long, device=answers.device)
    equal = torch.zeros_like(greater)
    for tile in tiles:
        sampled = torch.take(scores, tile.flat)  # [b, w]
        if not all_finite:
            _check_sampled_finite((~torch.isfinite(sampled) & tile.take).any(1), tile.rows, sq, start)
        column = true[tile.rows].unsqueeze(1)  # [b, 1]
        greater.index_add_(0, tile.rows, ((sampled > column) & tile.take).sum(1))
        equal.index_add_(0, tile.rows, ((sampled == column) & tile.take).sum(1))
    return greater, equal


def _count_by_score_hrt(model: Scorer, queries: Tensor, answers: Tensor, tiles: Iterator[_Tile], batch: int,
                        sq: SideQueries, start: int) -> tuple[Tensor, Tensor]:
    """(greater [B], equal [B]) among the sampled entities, scoring whole triples in batches."""
    true = ranked(model.score_hrt(_triples(model, queries, answers)))  # [B]
    check_finite(true.unsqueeze(1), sq, start)
    greater = torch.zeros(len(answers), dtype=torch.long, device=answers.device)
    equal = torch.zeros_like(greater)
    for tile in tiles:
        r, c = torch.nonzero(tile.take, as_tuple=True)  # [P] positions of the sampled entries
        sampled_rows, entities = tile.rows[r], tile.entities[r, c]
        for i in range(0, len(sampled_rows), batch):
            row = sampled_rows[i : i + batch]
            triples = _triples(model, queries[row], entities[i : i + batch])  # [p, 3]
            scores = ranked(model.score_hrt(triples))  # [p]
            _check_sampled_finite(~torch.isfinite(scores), row, sq, start)
            greater.index_add_(0, row, (scores > true[row]).long())
            equal.index_add_(0, row, (scores == true[row]).long())
    return greater, equal


def _triples(model: Scorer, queries: Tensor, entities: Tensor) -> Tensor:
    """(anchor, relation-or-inverse) queries [P, 2] answered by entities [P] -> the triples [P, 3] score_hrt takes.

    A scorer with score_t scores the query itself (its score_t column; ConvE learns r + R apart from r);
    one without it takes (h, r, t), r in [0, R) only.
    """
    triples = torch.cat([queries, entities.unsqueeze(1)], 1)
    return triples if isinstance(model, QueryScorer) else forward_triples(triples, model.num_relations)


def _check_sampled_finite(bad: Tensor, rows: Tensor, sq: SideQueries, start: int) -> None:
    """Raise for the first row flagged in ``bad`` [n] (rows [n] of the chunk at ``start``)."""
    if bool(bad.any()):
        raise non_finite_error(sq, start + int(rows[bad].min()))


# ----------------------------------------------------------------------------- inspecting samples


@dataclass(frozen=True)
class Corruptions:
    """The sampled corruptions of some queries as sparse pairs, sorted by query then entity."""

    rows: Tensor  # LongTensor [P]: index of the query in the SideQueries
    entities: Tensor  # LongTensor [P]: a corrupted answer of that query


def sample_corruptions(
    sq: SideQueries, known: AnswerIndex, num_entities: int, *, num_corruptions: int, seed: int,
    allowed: CandidateRestriction | None = None, memory_budget: int = 1 << 28, device: torch.device | str = "cpu",
) -> Corruptions:
    """The corruptions `rank_side_sampled` ranks against, for inspection and tests.

    Holds every sampled pair in memory (16 bytes each): for small inputs.
    """
    _check_num_corruptions(num_corruptions)
    device = torch.device(device)
    allowed = allowed.to(device) if allowed is not None else None
    tile = max(MIN_TILE, min(MAX_TILE, memory_budget // 4 // BYTES_PER_WALK))
    chunk = max(1, min(MAX_QUERIES_PER_CHUNK, memory_budget // 2 // num_entities))
    empty = torch.zeros(0, dtype=torch.long)
    rows, entities = [empty], [empty]
    for start in range(0, len(sq.answers), chunk):
        stop = min(start + chunk, len(sq.answers))
        eligible = _eligible(sq.queries[start:stop], sq.answers[start:stop], known, allowed, num_entities, device)
        # keyed by the query's index among all of its side (sq.offset), as rank_side_sampled draws them
        perms = _Permutations.of(seed, sq.side, torch.arange(sq.offset + start, sq.offset + stop), num_entities, device)
        for t in _walk(perms, eligible, num_corruptions, tile):
            r, c = torch.nonzero(t.take, as_tuple=True)
            rows.append(t.rows[r].cpu() + start)
            entities.append(t.entities[r, c].cpu())
    pair_rows, pair_entities = torch.cat(rows), torch.cat(entities)
    order = torch.argsort(pair_rows * num_entities + pair_entities)
    return Corruptions(pair_rows[order], pair_entities[order])
