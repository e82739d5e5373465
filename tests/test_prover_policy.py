"""The proof environment (pure steps, success and failure), rollouts and beam search, PPO's pieces,
policy runs trained, resumed, evaluated and explained; the compiled rollout and beam search equal to the eager ones."""

from __future__ import annotations

import json
import math

import pytest
import torch
from mined import mined

from kgtrace.cli import main
from kgtrace.data.dataset import load_dataset
from kgtrace.data.vocab import Vocab
from kgtrace.prover.engine import VectorEngine, pad_states, unpad_states
from kgtrace.prover.env import Trajectory, beam_search, env_reset, env_step, rollout
from kgtrace.prover.logic import EngineShapes, query_state
from kgtrace.prover.policy import PolicyScorer, ProofPolicy, beam_scores, compiled_rollout
from kgtrace.prover.ppo import _is_known, _triple_keys, advantages, corrupt, resume_policy, train_policy
from kgtrace.prover.rules import parse_rules
from kgtrace.prover.run import ProverConfig
from kgtrace.prover.search import eager_deriver

ANN, BOB, CAT, DAN = range(4)
PARENT, GRANDPARENT = 0, 1
E, R = 4, 2
TRAIN = torch.tensor([[ANN, PARENT, BOB], [BOB, PARENT, CAT], [BOB, PARENT, DAN]])
RULES = parse_rules(["0.9  grandparent(X,Y) :- parent(X,Z), parent(Z,Y)", "0.4  grandparent(X,Y) :- parent(X,Y)"],
                    Vocab(("parent", "grandparent")))
STEPS = 3


@pytest.fixture(scope="module")
def tiny():
    engine = VectorEngine(TRAIN, RULES, E, EngineShapes(max_atoms=4, max_history=STEPS + 1))
    torch.manual_seed(0)
    policy = ProofPolicy(E, R, engine.num_variables, 8, engine.keys_head).eval()
    return engine, policy


def start(triples):
    return pad_states([query_state(t) for t in triples], 4, R), torch.full((len(triples), 3), -1)


def test_steps_are_pure_and_episodes_end_in_proofs_or_failures(tiny):
    engine, _ = tiny
    derive = eager_deriver(engine)
    states, excluded = start([(ANN, GRANDPARENT, CAT), (BOB, GRANDPARENT, ANN), (CAT, PARENT, ANN)])
    env = env_reset(derive, states, excluded, STEPS, R)
    # parent(cat, ann) is no fact and no rule concludes parent: failed at once. The others offer the chain
    # and the implication (whose parent(ann, cat) is no fact, but still a goal).
    assert env.done.tolist() == [False, False, True] and not env.success.any()
    assert env.derived.valid.sum(1).tolist() == [2, 2, 0]
    old, copies = env, [x.clone() for x in (env.states, env.history, env.steps, env.done)]
    env = env_step(derive, env, torch.tensor([0, 0, 0]), STEPS, R)  # both take the chain rule
    assert all(torch.equal(a, b) for a, b in zip(copies, (old.states, old.history, old.steps, old.done)))  # pure
    assert unpad_states(env.states[:1], R) == [((PARENT, ANN, E), (PARENT, E, CAT))]
    env = env_step(derive, env, torch.tensor([0, 0, 0]), STEPS, R)  # parent(ann, bob); parent(bob, cat)
    assert env.done.tolist() == [False, True, True]  # parent(cat, ann): nothing derives it, bob's episode failed
    env = env_step(derive, env, torch.tensor([0, 0, 0]), STEPS, R)
    assert env.success.tolist() == [True, False, False] and env.done.all()
    assert env.steps.tolist() == [3, 2, 0]
    assert env.log_confidence[0] == pytest.approx(math.log(0.9))


def test_rollout_follows_the_policy_and_noise_samples_it(tiny):
    engine, policy = tiny
    derive = eager_deriver(engine)
    states, excluded = start([(ANN, GRANDPARENT, CAT)])
    S = engine.shapes.max_states
    with torch.no_grad():
        greedy = rollout(policy, derive, states, excluded, torch.zeros(1, STEPS, S), max_steps=STEPS, num_relations=R)
        env = env_reset(derive, states, excluded, STEPS, R)
        logits, _ = policy(env.states, env.derived.states, env.derived.valid, env.derived.log_confidence, excluded)
        assert int(greedy.action[0, 0]) == int(logits.argmax())
        # Gumbel noise: the first action is drawn with the policy's probabilities.
        n = 4000
        noise = -torch.log(-torch.log(torch.rand(n, STEPS, S, generator=torch.Generator().manual_seed(1))))
        sampled = rollout(policy, derive, states.expand(n, -1, -1), excluded.expand(n, -1), noise, max_steps=STEPS,
                          num_relations=R)
    probabilities = torch.softmax(logits, 1)[0, :2]
    frequencies = torch.bincount(sampled.action[:, 0], minlength=2)[:2].float() / n
    assert frequencies.tolist() == pytest.approx(probabilities.tolist(), abs=0.03)
    assert torch.allclose(sampled.log_prob[:, 0], torch.log(probabilities[sampled.action[:, 0]]), atol=1e-5)


def brute_force_best(policy, engine, state, history, taken, log_prob):
    """The most probable proof's log probability by enumerating every feasible path."""
    from kgtrace.prover.env import feasible

    h = torch.full((1, STEPS + 1, 4, 3), -1)
    h[0, : len(history)] = pad_states(history, 4, R)
    derived = feasible(engine.derive(pad_states([state], 4, R), h, torch.full((1, 3), -1)), torch.tensor([taken]),
                       STEPS, R)
    logits, _ = policy(pad_states([state], 4, R), derived.states, derived.valid, derived.log_confidence,
                       torch.full((1, 3), -1))
    steps = torch.log_softmax(logits, 1)[0]
    best = float("-inf")
    for slot in torch.nonzero(derived.valid[0]).squeeze(1).tolist():
        child = unpad_states(derived.states[0, slot : slot + 1], R)[0]
        score = log_prob + float(steps[slot])
        best = max(best, score if not child else brute_force_best(policy, engine, child, history + [child], taken + 1,
                                                                  score))
    return best


def test_wide_beams_find_the_most_probable_proof(tiny):
    engine, policy = tiny
    triples = [(ANN, GRANDPARENT, CAT), (ANN, GRANDPARENT, DAN), (BOB, GRANDPARENT, ANN)]
    states, excluded = start(triples)
    with torch.no_grad():
        beams = beam_search(policy, eager_deriver(engine), states, excluded, width=8, max_steps=STEPS, num_relations=R)
        expected = [brute_force_best(policy, engine, query_state(t), [query_state(t)], 0, 0.0) for t in triples]
    assert beams.success.tolist() == [True, True, False]
    assert beams.log_prob[:2].tolist() == pytest.approx(expected[:2], abs=1e-5)
    assert beams.length[:2].tolist() == [3, 3] and int(beams.step[0, 0]) == engine.num_facts + 0  # rule 0 first
    with torch.no_grad():  # one beam follows the most probable step, as greedy does
        narrow = beam_search(policy, eager_deriver(engine), states, excluded, width=1, max_steps=STEPS, num_relations=R)
        greedy = rollout(policy, eager_deriver(engine), states, excluded, torch.zeros(3, STEPS, engine.shapes.max_states),
                         max_steps=STEPS, num_relations=R)
    assert narrow.success.tolist() == greedy.success.tolist()


def test_gae_by_hand():
    # One episode of two steps, reward 1 at its end; another that ended after one step with reward -1.
    values = torch.tensor([[0.5, 0.2, 0.0], [0.1, 0.0, 0.0]])
    fields = dict.fromkeys(Trajectory._fields)
    fields.update(value=values, acted=torch.tensor([[True, True, False], [True, False, False]]),
                  steps=torch.tensor([2, 1]))
    trajectory = Trajectory(**fields)
    advantage, returns = advantages(trajectory, torch.tensor([1.0, -1.0]), gamma=0.9, lam=0.5)
    delta1 = 1.0 - 0.2  # last step: reward - value
    delta0 = 0.0 + 0.9 * 0.2 - 0.5
    assert advantage[0].tolist() == pytest.approx([delta0 + 0.9 * 0.5 * delta1, delta1, 0.0])
    assert advantage[1].tolist() == pytest.approx([-1.0 - 0.1, 0.0, 0.0])
    assert returns[0, :2].tolist() == pytest.approx((advantage[0, :2] + values[0, :2]).tolist())


def test_corruptions_are_never_training_triples():
    ds = load_dataset("nations")
    keys = _triple_keys(ds.train, ds.num_entities, ds.num_relations)
    false = corrupt(ds.train[:300], 5, ds.num_entities, ds.num_relations, keys, torch.Generator().manual_seed(0))
    assert not _is_known(false, keys, ds.num_entities, ds.num_relations).any()
    same_relation = false[:, 1] == ds.train[:300].repeat_interleave(5, 0)[:, 1]
    one_side_kept = (false[:, 0] == ds.train[:300].repeat_interleave(5, 0)[:, 0]) | (
        false[:, 2] == ds.train[:300].repeat_interleave(5, 0)[:, 2])
    assert same_relation.all() and one_side_kept.all()


def tiny_config(**more) -> ProverConfig:
    return ProverConfig(dataset="nations", method="policy", rules="mined", depth=3, embedding_dim=8, chunk_queries=256,
                        corruptions=1, eval_triples=10, eval_corruptions=3, beam_width=2, threads=1, **more)


def test_a_resumed_run_ends_like_an_uninterrupted_one(tmp_path):
    ds, rules = mined("nations", 3)
    quiet = dict(progress=False, log=lambda *_: None)
    train_policy(tiny_config(epochs=2), ds, rules, tmp_path / "whole", **quiet)
    train_policy(tiny_config(epochs=1), ds, rules, tmp_path / "split", **quiet)
    resume_policy(tmp_path / "split", epochs=2, **quiet)
    whole = torch.load(tmp_path / "whole/checkpoints/epoch-0002.pt", weights_only=True)
    split = torch.load(tmp_path / "split/checkpoints/epoch-0002.pt", weights_only=True)
    for key, value in whole["policy_state"].items():
        assert torch.equal(value, split["policy_state"][key]), key
    records = [json.loads(line) for line in (tmp_path / "split/metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and records[-1]["proved_true"] > 0


def test_policy_run_commands(tmp_path, capsys):
    run = tmp_path / "policy"
    assert main(["prove", "train", "--dataset", "nations", "--mine", "--max-rules-per-head", "3", "--epochs", "1",
                 "--chunk-queries", "256", "--corruptions", "1", "--embedding-dim", "8", "--beam-width", "2",
                 "--eval-triples", "10", "--eval-corruptions", "3", "--threads", "1", "--out", str(run),
                 "--no-progress"]) == 0
    out = tmp_path / "m.json"
    assert main(["evaluate", str(run), "--corruptions", "3", "--out", str(out), "--device", "cpu"]) == 0
    metrics = json.loads(out.read_text())
    assert metrics["candidates"] == 3 and 0 < metrics["both"]["realistic"]["mrr"] <= 1 and "prover" in metrics
    capsys.readouterr()
    assert main(["explain", str(run), "--test", "3", "--out", str(tmp_path / "why.json")]) == 0
    items = json.loads((tmp_path / "why.json").read_text())["proofs"]
    assert len(items) == 3 and all(item["method"] == "policy" for item in items)
    for item in items:  # a proof's steps end with no goal left; its confidence is the product of its rules'
        if item["proved"]:
            assert item["steps"][-1]["goals_after"] == "(proved)" and 0 < item["confidence"] <= 1


@pytest.mark.timeout(900)  # compiles or trains several runs: minutes on a loaded 2-core machine
def test_compiled_rollout_equals_eager(tiny):
    engine, policy = tiny
    states, excluded = start([(ANN, GRANDPARENT, CAT), (BOB, GRANDPARENT, ANN), (ANN, GRANDPARENT, DAN)] * 3)
    noise = -torch.log(-torch.log(torch.rand(9, STEPS, engine.shapes.max_states,
                                             generator=torch.Generator().manual_seed(2))))
    call = compiled_rollout(policy, engine, STEPS, 4)
    with torch.no_grad():
        compiled = Trajectory(*call(policy, engine, states=states, excluded=excluded, noise=noise))
        eager = rollout(policy, eager_deriver(engine), states, excluded, noise, max_steps=STEPS, num_relations=R)
    for name, got, want in zip(Trajectory._fields, compiled, eager):
        assert torch.allclose(got, want, atol=1e-5) if got.is_floating_point() else torch.equal(got, want), name
    assert call.stats.recompilations == 0 and call.stats.graph_breaks == 0


@pytest.mark.timeout(900)  # compiles or trains several runs: minutes on a loaded 2-core machine
def test_compiled_beam_search_equals_eager(tiny):
    engine, policy = tiny
    hrt = torch.tensor([(ANN, GRANDPARENT, CAT), (BOB, GRANDPARENT, ANN), (ANN, GRANDPARENT, DAN), (ANN, PARENT, BOB),
                        (CAT, GRANDPARENT, DAN)] * 2)  # 10 queries: batches of 4, the last one padded
    eager = PolicyScorer(policy, engine, STEPS, width=3, batch_size=4)
    compiled = PolicyScorer(policy, engine, STEPS, width=3, batch_size=4, compile=True)
    with torch.no_grad():
        for part in hrt.split(4):
            got, want = compiled.search(part), eager.search(part)
            for name, g, w in zip(got._fields, got, want):
                assert torch.allclose(g, w, atol=1e-5) if g.is_floating_point() else torch.equal(g, w), name
        for mode in ("confidence", "noisy_or", "probability"):
            eager.proof_score = compiled.proof_score = mode
            assert torch.allclose(compiled.score_hrt(hrt), eager.score_hrt(hrt), atol=1e-5), mode
    assert compiled.score_hrt(hrt)[:4].gt(1).tolist() == [True, False, True, True]  # proved: 1 + confidence
    stats = compiled._compiled.stats
    assert stats.recompilations == 0 and stats.graph_breaks == 0


def test_score_hrt_of_a_head_query_is_its_score_t_column(tiny):
    # (anchor, r + R, h) is the head query of (h, r, anchor), as score_t reads it.
    engine, policy = tiny
    scorer = PolicyScorer(policy, engine, STEPS, width=2, batch_size=8)
    queries = torch.tensor([[CAT, GRANDPARENT + R], [BOB, PARENT + R], [ANN, GRANDPARENT]])
    rows = scorer.score_t(queries)  # [3, E]
    for entity in range(E):
        hrt = torch.cat([queries, torch.full((3, 1), entity)], 1)
        assert torch.allclose(scorer.score_hrt(hrt), rows[:, entity], atol=1e-6), entity


def test_a_training_query_without_its_own_fact_looks_like_a_test_query():
    # Proving grandparent(ann, cat) with that triple excluded must look to the policy exactly as proving it
    # where it was never a fact: else the policy (and its value) tell training queries, whose triple is a
    # fact, from test queries and corruptions, which are not (the cause of proving 80% of true training
    # queries but under 20% of true test triples).
    query = (ANN, GRANDPARENT, CAT)
    with_it = torch.cat([TRAIN, torch.tensor([query])])
    views = []
    for triples, banned in ((with_it, [GRANDPARENT, ANN, CAT]), (TRAIN, [-1, -1, -1])):
        engine = VectorEngine(triples, RULES, E, EngineShapes(max_atoms=4, max_states=4, max_facts=2,
                                                                  max_history=STEPS + 1))
        torch.manual_seed(0)
        policy = ProofPolicy(E, R, engine.num_variables, 8, engine.keys_head).eval()
        with torch.no_grad():  # distinct status embeddings; the second state holds the query atom as a later goal
            policy.status.weight.normal_()
        states, excluded = pad_states([query_state(query), ((GRANDPARENT, ANN, CAT), (PARENT, ANN, BOB))], 4, R), \
            torch.tensor([banned, banned])
        env = env_reset(eager_deriver(engine), states, excluded, STEPS, R)
        with torch.no_grad():
            views.append(policy(env.states, env.derived.states, env.derived.valid, env.derived.log_confidence,
                                excluded))
    (logits, value), (expected_logits, expected_value) = views
    assert torch.equal(logits, expected_logits) and torch.equal(value, expected_value)


def test_a_beam_as_wide_as_every_partial_proof_proves_what_bfs_proves():
    from kgtrace.prover.search import vector_search

    ds, rules = mined("nations", 3)
    engine = VectorEngine(ds.train, rules, ds.num_entities, EngineShapes(max_atoms=6, max_history=STEPS + 1))
    torch.manual_seed(0)
    policy = ProofPolicy(ds.num_entities, ds.num_relations, engine.num_variables, 8, engine.keys_head).eval()
    triples = torch.cat([ds.test[:20], ds.test[:20, [2, 1, 0]]])  # true triples and mostly false reversals
    states = pad_states([query_state(t) for t in triples.tolist()], 6, ds.num_relations)
    excluded = torch.full((len(triples), 3), -1)
    bfs = vector_search(engine, eager_deriver(engine), states, STEPS)
    widest = max(vector_search(engine, eager_deriver(engine), states[i : i + 1], STEPS).expanded
                 for i in range(len(triples)))  # a query's partial proofs, all levels together
    with torch.no_grad():
        beams = beam_search(policy, eager_deriver(engine), states, excluded, width=widest, max_steps=STEPS,
                            num_relations=ds.num_relations)
        narrow = beam_search(policy, eager_deriver(engine), states, excluded, width=1, max_steps=STEPS,
                             num_relations=ds.num_relations)
    assert torch.equal(beams.success, bfs.depth >= 0) and 0 < int(beams.success.sum()) < len(triples)
    assert torch.allclose(beams.log_confidence, bfs.log_confidence)  # the same best proofs' confidences
    assert (narrow.success <= beams.success).all()


def test_found_proofs_give_the_best_confidence_and_a_noisy_or_over_first_steps():
    # grandparent(ann, cat) has three proofs: the chain through bob and through eve (0.9 each, one first
    # step: the chain rule) and the implication with parent(ann, cat) (0.4). Best 0.9; noisy-or over first
    # steps 1 - 0.1 x 0.6 (the chain's two groundings count once).
    eve = 4
    facts = torch.tensor([[ANN, PARENT, BOB], [BOB, PARENT, CAT], [ANN, PARENT, eve], [eve, PARENT, CAT],
                          [ANN, PARENT, CAT]])
    engine = VectorEngine(facts, RULES, 5, EngineShapes(max_atoms=4, max_history=STEPS + 1))
    torch.manual_seed(0)
    policy = ProofPolicy(5, R, engine.num_variables, 8, engine.keys_head).eval()
    states, excluded = start([(ANN, GRANDPARENT, CAT), (ANN, GRANDPARENT, BOB), (CAT, GRANDPARENT, ANN)])
    with torch.no_grad():
        beams = beam_search(policy, eager_deriver(engine), states, excluded, width=8, max_steps=STEPS, num_relations=R)
        scores = beam_scores(beams)
    assert beams.log_confidence[:2].tolist() == pytest.approx([math.log(0.9), math.log(0.4)])
    assert beams.support.tolist() == pytest.approx([1 - 0.1 * 0.6, 0.4, 0.0])
    assert beams.log_confidence[2] == float("-inf") and not beams.success[2]
    assert scores[:2].tolist() == pytest.approx([1.9 + 0.94e-3, 1.4 + 0.4e-3]) and scores[2] < 1
    assert beam_scores(beams, "noisy_or")[:2].tolist() == pytest.approx([1.94, 1.4])


def test_factored_atom_embeddings_equal_the_linear_layer_over_concatenations(tiny):
    engine, _ = tiny
    torch.manual_seed(3)
    for entity_embeddings in (False, True):
        policy = ProofPolicy(E, R, engine.num_variables, 8, engine.keys_head, entity_embeddings).eval()
        states, excluded = start([(ANN, GRANDPARENT, CAT), (BOB, GRANDPARENT, ANN), (CAT, PARENT, ANN)])
        derived = env_reset(eager_deriver(engine), states, excluded, STEPS, R).derived.states  # [3, S, 4, 3]
        for x in (states, derived):
            assert torch.allclose(policy.embed(x, excluded), policy.embed_reference(x, excluded), atol=1e-6)


def test_policy_gradients_repeat_exactly_on_two_threads(tiny):
    # PPO's update must not depend on thread scheduling: table[ids]'s backward accumulates with atomic
    # adds on a multi-threaded CPU (different sums on every call), F.embedding's does not.
    engine, _ = tiny
    torch.manual_seed(4)
    policy = ProofPolicy(E, R, engine.num_variables, 64, engine.keys_head)
    triples = torch.randint(E, (4096, 3)).remainder(torch.tensor([E, R, E]))  # many rows on 4 entities: contention
    states, excluded = start(triples.tolist())
    derived = env_reset(eager_deriver(engine), states, excluded, STEPS, R).derived
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = []
        for _ in range(4):
            policy.zero_grad()
            logits, value = policy(states, derived.states, derived.valid, derived.log_confidence, excluded)
            (logits.masked_fill(~derived.valid, 0).square().sum() + value.sum()).backward()
            grads.append([p.grad.clone() for p in policy.parameters()])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for other in grads[1:] for a, b in zip(grads[0], other))
