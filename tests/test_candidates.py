"""Sampled filtered corruptions and category restrictions, checked by hand, against a reference
sampler and against all-entity ranking."""

import dataclasses

import pytest
import torch
from scorers import TableScorer

from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.data.answers import AnswerIndex
from kgtrace.data.dataset import Dataset
from kgtrace.data.vocab import Vocab
from kgtrace.evaluation import candidates as cand
from kgtrace.evaluation.candidates import (
    CandidateRestriction,
    explicit_restriction,
    infer_restriction,
    parse_restrict,
    rank_side_restricted,
    rank_side_sampled,
    sample_corruptions,
)
from kgtrace.evaluation.ranks import RankCounts
from kgtrace.evaluation.sides import SideQueries, rank_side, side_queries
from kgtrace.models import build_model

CPU = torch.device("cpu")
BIG = 1 << 30


class HrtOnly:
    """A scorer offering only score_hrt, like a rule prover."""

    def __init__(self, model):
        self.model = model
        self.num_entities = model.num_entities
        self.num_relations = model.num_relations

    def score_hrt(self, hrt):
        return self.model.score_hrt(hrt)


def same(a: RankCounts, b: RankCounts) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("greater", "equal", "num_candidates"))


def exact_distmult(num_entities: int, num_relations: int, seed: int = 0):
    """DistMult whose weights are multiples of 1/4: every score is exact in float32, whatever the summation order."""
    model = build_model("distmult", num_entities, num_relations, embedding_dim=8).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.entity_embeddings.copy_(torch.randint(-4, 5, (num_entities, 8), generator=gen) / 4)
        model.relation_embeddings.copy_(torch.randint(-4, 5, (num_relations, 8), generator=gen) / 4)
    return model


def random_triples(n: int, num_entities: int, num_relations: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, num_entities, (n,), generator=gen),
                        torch.randint(0, num_relations, (n,), generator=gen),
                        torch.randint(0, num_entities, (n,), generator=gen)], 1)


def sampled(model, sq, known, k, seed=0, budget=BIG, allowed=None):
    return rank_side_sampled(model, sq, known, num_corruptions=k, seed=seed, memory_budget=budget, device=CPU,
                             allowed=allowed)


def small_budget(num_entities: int) -> int:
    """A budget for score_t chunks of 2 queries and the smallest walk tiles."""
    return cand.MIN_TILE * cand.BYTES_PER_WALK * 4 + 2 * num_entities * (cand.BYTES_PER_SCORE + 1)


# ----------------------------------------------------------------------------- hand-computed cases


def one_query(scores, true, known_others=()):
    """A single tail query (0, r0) over len(scores) entities with the given scores."""
    num_entities = len(scores)
    table = torch.zeros(2, num_entities, num_entities)
    table[0, 0] = torch.tensor(scores)
    sq = SideQueries("tail", torch.tensor([[0, 0]]), torch.tensor([true]))
    known = AnswerIndex.build(torch.tensor([[0, 0, e] for e in (true, *known_others)]), 1)
    return TableScorer(table), sq, known


def test_all_eligible_when_k_exceeds_them_with_ties_by_hand():
    # True answer 2 scores 0.5; entity 0 (0.9) is another known answer -> never drawn; eligible
    # {1, 3, 4, 5}: 1 beats it, 3 and 5 tie, 4 is below -> g = 1, e = 2, n = 5.
    model, sq, known = one_query([0.9, 0.7, 0.5, 0.5, 0.1, 0.5], true=2, known_others=(0,))
    for k in (4, 5, 1000):
        counts = sampled(model, sq, known, k)
        assert (counts.greater.tolist(), counts.equal.tolist(), counts.num_candidates.tolist()) == ([1], [2], [5])
        assert counts.rank("optimistic").tolist() == [2.0]
        assert counts.rank("pessimistic").tolist() == [4.0]
        assert counts.rank("realistic").tolist() == [3.0]


def test_counts_follow_the_sample_with_ties():
    model, sq, known = one_query([0.9, 0.7, 0.5, 0.5, 0.1, 0.5, 0.5, 0.8], true=2, known_others=(0,))
    scores = model.table[0, 0].detach()
    for seed in range(20):
        counts = sampled(model, sq, known, 3, seed=seed)
        drawn = sample_corruptions(sq, known, 8, num_corruptions=3, seed=seed).entities
        assert len(drawn) == 3 and 0 not in drawn.tolist() and 2 not in drawn.tolist()
        assert counts.greater.tolist() == [int((scores[drawn] > 0.5).sum())]
        assert counts.equal.tolist() == [int((scores[drawn] == 0.5).sum())]
        assert counts.num_candidates.tolist() == [4]


def test_known_and_true_answers_never_sampled():
    num_entities, num_relations = 40, 2
    known_triples = random_triples(300, num_entities, num_relations, seed=1)
    known = AnswerIndex.build(known_triples, num_relations)
    test = known_triples[:30]
    for side in ("head", "tail"):
        sq = side_queries(test, num_relations, side)
        rows, answers = known.lookup(sq.queries)
        forbidden = set(zip(rows.tolist(), answers.tolist())) | set(enumerate(sq.answers.tolist()))
        for seed in range(30):
            drawn = sample_corruptions(sq, known, num_entities, num_corruptions=10, seed=seed)
            pairs = set(zip(drawn.rows.tolist(), drawn.entities.tolist()))
            assert len(pairs) == len(drawn.rows)  # without replacement
            assert not pairs & forbidden


def test_zero_or_negative_corruptions_is_a_config_error():
    model, sq, known = one_query([0.1, 0.2], true=0)
    with pytest.raises(ConfigError, match="corruptions=0"):
        sampled(model, sq, known, 0)


# ----------------------------------------------------------------------------- the sampler itself


def reference_sample(seed: int, side: str, query: int, num_entities: int, eligible: set[int], k: int) -> list[int]:
    """The documented sampler in plain Python integers: first k eligible entities of sigma_q."""
    m64 = (1 << 64) - 1
    golden, mix1, mix2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

    def splitmix(x):
        x = (x + golden) & m64
        x = ((x ^ (x >> 30)) * mix1) & m64
        x = ((x ^ (x >> 27)) * mix2) & m64
        return x ^ (x >> 31)

    bits = max(10, (num_entities - 1).bit_length())
    mask, shift = (1 << bits) - 1, (bits + 1) // 2
    base = splitmix(splitmix(seed & m64) ^ {"head": 0, "tail": 1}[side])
    per_query = splitmix((base + query) & m64)
    words = [splitmix((per_query + i * golden) & m64) for i in range(8)]
    xor, mul = [w & mask for w in words[:4]], [(w & mask) | 1 for w in words[4:]]
    drawn = []
    for position in range(1 << bits):
        x = position
        for r in range(4):
            x = ((x ^ xor[r]) * mul[r]) & mask
            x ^= x >> shift
        if x < num_entities and x in eligible:
            drawn.append(x)
            if len(drawn) == k:
                break
    return sorted(drawn)


def test_matches_the_reference_sampler():
    num_entities, num_relations = 1500, 2
    known_triples = random_triples(3000, num_entities, num_relations, seed=2)
    known = AnswerIndex.build(known_triples, num_relations)
    sq = side_queries(known_triples[:6], num_relations, "head")
    rows, answers = known.lookup(sq.queries)
    drawn = sample_corruptions(sq, known, num_entities, num_corruptions=25, seed=-7)
    for q in range(6):
        eligible = set(range(num_entities)) - {int(sq.answers[q])} - set(answers[rows == q].tolist())
        expected = reference_sample(-7, "head", q, num_entities, eligible, 25)
        assert drawn.entities[drawn.rows == q].tolist() == expected


def test_a_slice_of_the_queries_draws_what_the_whole_draws_for_them():
    """A process of a distributed job ranks a slice (SideQueries.offset): its queries' corruptions are those the
    whole side draws for them, in sample_corruptions as in rank_side_sampled."""
    num_entities, num_relations = 300, 3
    known_triples = random_triples(900, num_entities, num_relations, seed=4)
    known = AnswerIndex.build(known_triples, num_relations)
    whole = side_queries(known_triples[:40], num_relations, "tail")
    part = dataclasses.replace(whole, queries=whole.queries[25:], answers=whole.answers[25:], offset=25)
    all_drawn = sample_corruptions(whole, known, num_entities, num_corruptions=15, seed=3)
    part_drawn = sample_corruptions(part, known, num_entities, num_corruptions=15, seed=3)
    keep = all_drawn.rows >= 25
    assert torch.equal(part_drawn.rows + 25, all_drawn.rows[keep])
    assert torch.equal(part_drawn.entities, all_drawn.entities[keep])


def test_deterministic_and_independent_of_chunking():
    num_entities, num_relations = 60, 3
    model = exact_distmult(num_entities, num_relations)
    known_triples = random_triples(400, num_entities, num_relations, seed=3)
    known = AnswerIndex.build(known_triples, num_relations)
    sq = side_queries(known_triples[:50], num_relations, "tail")
    reference = sampled(model, sq, known, 20, seed=5)
    assert same(reference, sampled(model, sq, known, 20, seed=5))
    for budget in (1, small_budget(num_entities), 10**6):
        assert same(reference, sampled(model, sq, known, 20, seed=5, budget=budget))
    chunks = [sample_corruptions(sq, known, num_entities, num_corruptions=20, seed=5, memory_budget=b)
              for b in (1, 10**4, BIG)]
    assert all(torch.equal(c.entities, chunks[0].entities) and torch.equal(c.rows, chunks[0].rows) for c in chunks)
    other = sample_corruptions(sq, known, num_entities, num_corruptions=20, seed=6)
    assert not torch.equal(other.entities, chunks[0].entities)
    tail_of_head = sample_corruptions(side_queries(known_triples[:50], num_relations, "head"), known, num_entities,
                                      num_corruptions=20, seed=5)
    assert not torch.equal(tail_of_head.entities, chunks[0].entities)


def test_score_t_and_score_hrt_paths_agree():
    num_entities, num_relations = 200, 4
    known_triples = random_triples(1500, num_entities, num_relations, seed=4)
    known = AnswerIndex.build(known_triples, num_relations)
    test = known_triples[:80]
    model = exact_distmult(num_entities, num_relations)
    for side in ("head", "tail"):
        sq = side_queries(test, num_relations, side)
        by_score_t = sampled(model, sq, known, 50, seed=1)
        assert same(by_score_t, sampled(HrtOnly(model), sq, known, 50, seed=1))
        assert same(by_score_t, sampled(model, sq, known, 50, seed=1, budget=1))  # [E] scores do not fit: score_hrt
    # Integer scores with many ties; the table's head rows are the transposed tail rows.
    gen = torch.Generator().manual_seed(0)
    half = torch.randint(0, 3, (2, 30, 30), generator=gen).float()
    table = TableScorer(torch.cat([half, half.transpose(1, 2)]))
    known_triples = random_triples(200, 30, 2, seed=5)
    known = AnswerIndex.build(known_triples, 2)
    for side in ("head", "tail"):
        sq = side_queries(known_triples[:40], 2, side)
        assert same(sampled(table, sq, known, 7, seed=2), sampled(HrtOnly(table), sq, known, 7, seed=2))


@pytest.mark.parametrize("name, settings", [
    ("conve", {"embedding_dim": 8, "embedding_height": 2, "output_channels": 4}),
    ("complex", {"embedding_dim": 6}),
])
def test_score_hrt_path_scores_head_queries_as_score_t_does(name, settings):
    # ConvE learns each inverse relation r + R apart from r: a head query (t, r + R, ?) answered by h
    # must be scored as that query, not as the forward triple (h, r, t). Float64 keeps matmul (score_t)
    # and per-triple (score_hrt) rounding apart from the float32 scores the ranker compares.
    num_entities, num_relations = 60, 3
    torch.manual_seed(3)
    model = build_model(name, num_entities, num_relations, **settings).double().eval()
    known_triples = random_triples(400, num_entities, num_relations, seed=7)
    known = AnswerIndex.build(known_triples, num_relations)
    for side in ("head", "tail"):
        sq = side_queries(known_triples[:30], num_relations, side)
        by_score_t = sampled(model, sq, known, 15, seed=4)
        assert same(by_score_t, sampled(model, sq, known, 15, seed=4, budget=1)), side  # budget 1: score_hrt


def test_enough_corruptions_equal_all_entity_ranking():
    num_entities, num_relations = 120, 3
    gen = torch.Generator().manual_seed(1)
    half = torch.randint(0, 5, (num_relations, num_entities, num_entities), generator=gen).float()
    table = TableScorer(torch.cat([half, half.transpose(1, 2)]))
    known_triples = random_triples(900, num_entities, num_relations, seed=6)
    known = AnswerIndex.build(known_triples, num_relations)
    for side in ("head", "tail"):
        sq = side_queries(known_triples[:100], num_relations, side)
        full = rank_side(table, sq, known, memory_budget=BIG, device=CPU)
        for k in (num_entities - 1, 10**6):
            assert same(full, sampled(table, sq, known, k))
            assert same(full, sampled(HrtOnly(table), sq, known, k))


def test_each_eligible_entity_drawn_about_equally_often():
    num_entities, k, num_queries = 50, 5, 4000
    known = AnswerIndex.build(torch.tensor([[0, 0, 1], [0, 0, 2], [0, 0, 3]]), 1)
    # The same query asked many times: each copy has its own index, so its own sample.
    sq = SideQueries("tail", torch.tensor([[0, 0]]).repeat(num_queries, 1), torch.full((num_queries,), 1))
    drawn = sample_corruptions(sq, known, num_entities, num_corruptions=k, seed=11)
    frequency = torch.bincount(drawn.entities, minlength=num_entities).double()
    assert frequency[1:4].tolist() == [0.0, 0.0, 0.0]  # 1, 2, 3 known (1 true); 0 is eligible
    eligible = torch.tensor([0] + list(range(4, num_entities)))
    expected = num_queries * k / len(eligible)
    chi2 = float(((frequency[eligible] - expected) ** 2 / expected).sum())
    df = len(eligible) - 1
    assert chi2 < df + 8 * (2 * df) ** 0.5  # about 8 standard deviations: loose, and the seed is fixed
    # Pairs drawn together: each unordered pair of eligible entities about equally often.
    rows = drawn.entities.view(num_queries, k)
    first, second = torch.triu_indices(k, k, 1)
    low = torch.minimum(rows[:, first], rows[:, second]).flatten()
    high = torch.maximum(rows[:, first], rows[:, second]).flatten()
    together = torch.bincount(low * num_entities + high, minlength=num_entities**2).view(num_entities, num_entities)
    upper = torch.triu(torch.ones(len(eligible), len(eligible), dtype=torch.bool), 1)
    pair_counts = together[eligible][:, eligible][upper].double()
    pair_expected = num_queries * k * (k - 1) / 2 / len(pair_counts)
    chi2 = float(((pair_counts - pair_expected) ** 2 / pair_expected).sum())
    df = len(pair_counts) - 1
    assert chi2 < df + 8 * (2 * df) ** 0.5


def test_non_finite_score_names_the_query():
    model, sq, known = one_query([0.1, float("nan"), 0.3, 0.4], true=2)
    for scorer in (model, HrtOnly(model)):
        with pytest.raises(KgtraceError, match=r"tail query #0 \(anchor entity id 0"):
            sampled(scorer, sq, known, 3)
    nan_true, sq, known = one_query([0.1, 0.2, float("inf")], true=2)
    with pytest.raises(KgtraceError, match="non-finite score"):
        sampled(nan_true, sq, known, 1)


def test_scale_smoke(torch_threads):
    """50k entities, 20k corruptions per query: every query gets K + 1 candidates (speed: benchmarks/)."""
    torch_threads(1)  # on a busy 2-core machine, 2 threads spin on every small op and run 10x slower
    num_entities, num_relations, num_queries, k = 50_000, 10, 200, 20_000
    model = build_model("distmult", num_entities, num_relations, embedding_dim=8).eval()
    known_triples = random_triples(20_000, num_entities, num_relations, seed=7)
    known = AnswerIndex.build(known_triples, num_relations)
    sq = side_queries(known_triples[:num_queries], num_relations, "tail")
    counts = rank_side_sampled(model, sq, known, num_corruptions=k, seed=0, memory_budget=256 << 20, device=CPU)
    assert counts.num_candidates.tolist() == [k + 1] * num_queries
    assert int(counts.greater.max()) <= k


# ----------------------------------------------------------------------------- type restriction

ENTITIES = ("aspirin", "ibuprofen", "flu", "gout", "BRCA1", "mystery", "statin")
CATEGORIES = {
    "aspirin": ("biolink:Drug",),
    "ibuprofen": ("biolink:Drug", "biolink:ChemicalEntity"),
    "flu": ("biolink:Disease",),
    "gout": ("biolink:Disease",),
    "BRCA1": ("biolink:Gene",),
    "statin": ("biolink:ChemicalEntity",),
    # "mystery" has no category
}
RELATIONS = ("biolink:treats", "interacts", "unused")


def typed_dataset(categories=CATEGORIES) -> Dataset:
    e = {label: i for i, label in enumerate(ENTITIES)}
    train = torch.tensor([[e["aspirin"], 0, e["flu"]], [e["BRCA1"], 1, e["mystery"]], [e["BRCA1"], 1, e["statin"]]])
    return Dataset(name="typed", source="typed", entities=Vocab(ENTITIES), relations=Vocab(RELATIONS),
                   train=train, valid=train[:0], test=train[:0], entity_categories=dict(categories))


def allowed_labels(restriction: CandidateRestriction, relation: int) -> set[str]:
    mask = restriction.mask(torch.tensor([relation]))[0]
    return {ENTITIES[i] for i in torch.nonzero(mask).squeeze(1).tolist()}


def test_inferred_domain_and_range():
    restriction = infer_restriction(typed_dataset())
    num_relations = len(RELATIONS)
    assert restriction.allowed.shape == (2 * num_relations, 6)  # 6 distinct category sets, not E
    assert allowed_labels(restriction, 0) == {"flu", "gout"}  # treats: range = diseases
    assert allowed_labels(restriction, num_relations) == {"aspirin", "ibuprofen"}  # treats^-1: domain = drugs
    # interacts tails: an uncategorized entity and a chemical were seen -> both kinds, sharing a category counts.
    assert allowed_labels(restriction, 1) == {"mystery", "statin", "ibuprofen"}
    assert allowed_labels(restriction, num_relations + 1) == {"BRCA1"}
    assert allowed_labels(restriction, 2) == set(ENTITIES)  # no training triples: unrestricted
    assert restriction.count(torch.tensor([0, num_relations, 2])).tolist() == [2, 2, 7]


def test_restriction_needs_categories():
    with pytest.raises(KgtraceError, match="node_categories.tsv"):
        infer_restriction(typed_dataset(categories={}))
    with pytest.raises(KgtraceError, match="node_categories.tsv"):
        explicit_restriction(typed_dataset(categories={}), {})


def test_restricted_ranking_counts_allowed_entities_only():
    num_entities = len(ENTITIES)
    restriction = infer_restriction(typed_dataset())
    # treats tail query (aspirin, ?): allowed {flu, gout}; true answer gout.
    scores = torch.tensor([9.0, 8.0, 1.0, 0.5, 7.0, 6.0, 5.0])
    table = torch.zeros(2 * len(RELATIONS), num_entities, num_entities)
    table[0, 0] = scores
    model = TableScorer(table)
    sq = SideQueries("tail", torch.tensor([[0, 0], [0, 0], [0, 0]]), torch.tensor([3, 3, 4]))
    no_known = AnswerIndex.build(torch.zeros(0, 3, dtype=torch.long), len(RELATIONS))
    counts = rank_side_restricted(model, sq, no_known, restriction, memory_budget=BIG, device=CPU)
    # gout (0.5) vs flu (1.0): g = 1, n = 2. BRCA1 is not a disease, yet as a true answer it is ranked
    # among the allowed {flu, gout} and itself: both score lower -> g = 0, n = 3.
    assert counts.greater.tolist() == [1, 1, 0]
    assert counts.num_candidates.tolist() == [2, 2, 3]
    # flu is another known answer; so is statin, which the restriction excludes anyway.
    known = AnswerIndex.build(torch.tensor([[0, 0, 2], [0, 0, 6]]), len(RELATIONS))
    counts = rank_side_restricted(model, sq, known, restriction, memory_budget=1, device=CPU)
    assert counts.greater.tolist() == [0, 0, 0]
    assert counts.num_candidates.tolist() == [1, 1, 2]
    # Sampling under the same restriction draws allowed entities only, and K beyond them ranks like all.
    assert same(sampled(model, sq, no_known, 50, allowed=restriction),
                rank_side_restricted(model, sq, no_known, restriction, memory_budget=BIG, device=CPU))


def test_restricted_sampling_draws_allowed_only():
    num_entities, num_relations = 300, 2
    gen = torch.Generator().manual_seed(3)
    entity_group = torch.randint(0, 4, (num_entities,), generator=gen)
    allowed = torch.tensor([[True, False, True, False], [True] * 4, [False, True, False, False], [True] * 4])
    restriction = CandidateRestriction(entity_group, allowed)
    known_triples = random_triples(500, num_entities, num_relations, seed=8)
    known = AnswerIndex.build(known_triples, num_relations)
    sq = side_queries(known_triples[:60], num_relations, "tail")
    drawn = sample_corruptions(sq, known, num_entities, num_corruptions=30, seed=0, allowed=restriction)
    relations = sq.queries[drawn.rows, 1]
    assert bool(allowed[relations, entity_group[drawn.entities]].all())
    table = TableScorer(torch.randint(0, 4, (2 * num_relations, num_entities, num_entities), generator=gen).float())
    full = rank_side_restricted(table, sq, known, restriction, memory_budget=BIG, device=CPU)
    assert same(full, sampled(table, sq, known, num_entities, allowed=restriction))
    # num_candidates by brute force: allowed, not another known answer, plus the true answer.
    mask = restriction.mask(sq.queries[:, 1])
    rows, cols = known.lookup(sq.queries)
    mask[rows, cols] = False
    mask[torch.arange(len(sq.answers)), sq.answers] = True
    assert full.num_candidates.tolist() == mask.sum(1).tolist()


def test_parse_restrict_rules():
    rules = parse_restrict(["biolink:treats:tail=biolink:Disease|biolink:PhenotypicFeature",
                            "biolink:treats:head=biolink:Drug", "biolink:treats:tail=biolink:Disease | x:Y"])
    assert rules == {("biolink:treats", "tail"): {"biolink:Disease", "biolink:PhenotypicFeature", "x:Y"},
                     ("biolink:treats", "head"): {"biolink:Drug"}}


def test_parse_restrict_lists_every_problem():
    with pytest.raises(ConfigError) as error:
        parse_restrict(["typed", "treats=biolink:Disease", "treats:subject=biolink:Drug", "treats:tail=", "ok:tail=A"])
    problems = error.value.problems
    assert len(problems) == 4
    assert "'typed'" in problems[0] and "no '='" in problems[0]
    assert "no ':head' or ':tail'" in problems[1]
    assert "'subject'" in problems[2]
    assert "no category" in problems[3]
    assert all("RELATION:tail=CAT1|CAT2" in p for p in problems)


def test_explicit_restriction():
    dataset = typed_dataset()
    restriction = explicit_restriction(dataset, parse_restrict(["biolink:treats:tail=biolink:Disease",
                                                                "interacts:head=biolink:Gene|biolink:Drug"]))
    assert allowed_labels(restriction, 0) == {"flu", "gout"}
    assert allowed_labels(restriction, len(RELATIONS) + 1) == {"BRCA1", "aspirin", "ibuprofen"}
    assert allowed_labels(restriction, 1) == set(ENTITIES)  # no rule: unrestricted
    assert allowed_labels(restriction, len(RELATIONS)) == set(ENTITIES)
    with pytest.raises(ConfigError) as error:
        explicit_restriction(dataset, {("cures", "tail"): {"biolink:Disease"},
                                       ("biolink:treats", "tail"): {"biolink:Desease"}})
    assert len(error.value.problems) == 2
    assert "'cures'" in error.value.problems[0] and "biolink:treats" in error.value.problems[0]
    assert "'biolink:Desease'" in error.value.problems[1] and "biolink:Disease" in error.value.problems[1]


def test_inferred_restriction_keeps_the_most_specific_category_of_a_lineage():
    """Biolink lineages: every node is a NamedThing and diseases and phenotypes share a parent, yet 'treats'
    tails seen only on diseases allow diseases alone; a node typed only NamedThing stays allowed."""
    lineage = {"d1": ("biolink:NamedThing", "biolink:DiseaseOrPhenotypicFeature", "biolink:Disease"),
               "d2": ("biolink:NamedThing", "biolink:DiseaseOrPhenotypicFeature", "biolink:Disease"),
               "p1": ("biolink:NamedThing", "biolink:DiseaseOrPhenotypicFeature", "biolink:PhenotypicFeature"),
               "c1": ("biolink:NamedThing", "biolink:ChemicalEntity", "biolink:SmallMolecule"),
               "c2": ("biolink:NamedThing", "biolink:ChemicalEntity", "biolink:SmallMolecule"),
               "g1": ("biolink:NamedThing", "biolink:Gene"),
               "x": ("biolink:NamedThing",)}
    labels = tuple(lineage)
    e = {label: i for i, label in enumerate(labels)}
    train = torch.tensor([[e["c1"], 0, e["d1"]], [e["g1"], 1, e["p1"]], [e["g1"], 1, e["x"]]])
    ds = Dataset(name="lineage", source="lineage", entities=Vocab(labels), relations=Vocab(("treats", "has")),
                 train=train, valid=train[:0], test=train[:0], entity_categories=lineage)
    restriction = infer_restriction(ds)

    def allowed(relation: int) -> set[str]:
        return {labels[i] for i in torch.nonzero(restriction.mask(torch.tensor([relation]))[0]).squeeze(1).tolist()}

    assert allowed(0) == {"d1", "d2", "x"}  # treats tails: diseases, and x whose only category a disease has
    assert allowed(2) == {"c1", "c2", "x"}  # treats heads: small molecules
    assert allowed(1) == {"p1", "x"}  # has tails: a phenotype and a bare named thing were seen
