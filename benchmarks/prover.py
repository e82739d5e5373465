"""The rule prover on Nations, Kinships and UMLS, side by side with ConvE; prints JSON.

Per dataset, with rules mined from the training triples (kgtrace's defaults):

* ranking (filtered, realistic ties; test split, head and tail) against all entities and against 100
  sampled corruptions, for: the BFS baseline (best proof's confidence within --depth steps), the learned
  policy (PPO for --epochs epochs, with --init-from-conve from ConvE's entity and relation embeddings,
  then its beam search of every candidate triple; its proof score, confidence / noisy_or / probability,
  chosen on the validation triples), ConvE (--conve-epochs), and the hybrids ConvE logit + w x the
  prover's proof confidence (0 for a triple it does not prove: kgtrace's HybridScorer), w chosen on
  validation triples from a grid by kgtrace.prover.hybrid's rule (the smallest weight within one
  standard error of the best); for the policy also ``hybrid_policy_conve_raw_score``, w x its score as
  it is (1 + confidence, or the value estimate of an unproved triple); with --link-weight, the policy
  trained with its own link head (NTP-lambda's ComplEx on the policy's embeddings), ranked alone
  (``link_head``) and as the run scores, the head's logit + w x the proof part (``policy_link``, w
  chosen as above). The policy searches each (query, entity) pair, E searches per query: with
  --policy-test-triples N only the first N test triples are ranked for it, and BFS, ConvE and the BFS
  hybrid are reported on the same N triples too (``*_policy_subset``), side by side;
* proof rates: the share of test triples, and of their sampled corruptions, that each prover proves;
* engine speed: exhaustive provability search to --depth of --qps-queries test triples and as many
  corruptions, in queries per second, for the reference engine, the vectorised engine eager and
  compiled (torch.compile through CompiledCall), with a check that all three agree.

Each prover's scores of every test query are computed once ([queries, E] tables) and both
rankings read them, so all-entity and sampled metrics rank the very same scores.

ConvE is trained and scores on --device (its score tables are then kept on the CPU, beside the
provers'). The provers stay on the CPU whatever --device: kgtrace trains the policy on the CPU
(kgtrace.prover.ppo takes no device), and the engine-speed section compares CPU engines.

    python benchmarks/prover.py [--datasets nations,kinships,umls] [--threads 2] [--epochs 3] [--out FILE.json]
        [--policy-test-triples N] [--valid-triples N] [--beam W] [--init-from-conve] [--engine-speed-only]
        [--link-weight W] [--link-epochs N] [--embedding-dim D] [--device auto]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kgtrace.compute.system import resolve_device
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import KgtraceError
from kgtrace.data.answers import AnswerIndex
from kgtrace.data.dataset import load_dataset
from kgtrace.evaluation.candidates import sample_corruptions
from kgtrace.evaluation.evaluate import Candidates, evaluate, model_device
from kgtrace.evaluation.sides import side_queries
from kgtrace.prover.config import HYBRID_WEIGHTS, PROOF_SCORES
from kgtrace.prover.engine import VectorEngine, pad_states
from kgtrace.prover.hybrid import ScoreTable, choose_weight, distinct_queries, reciprocal_ranks
from kgtrace.prover.link import LinkHead
from kgtrace.prover.logic import EngineShapes, query_state
from kgtrace.prover.mining import MiningConfig, mine_rules, rule_set
from kgtrace.prover.policy import PolicyScorer, beam_scores
from kgtrace.prover.ppo import train_policy
from kgtrace.prover.reference import ReferenceEngine, proof_depth
from kgtrace.prover.run import ProverConfig, load_prover_run
from kgtrace.prover.scorer import BfsScorer, HybridScorer, proof_part
from kgtrace.prover.search import compiled_deriver, eager_deriver, vector_search
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import train


def table_scorer(rows: dict[tuple[int, int], torch.Tensor], ds) -> ScoreTable:
    """A Scorer over rows {(anchor, relation-or-inverse): [E] scores}, as table() and policy_tables() build them."""
    return ScoreTable(torch.tensor(list(rows)), torch.stack(list(rows.values())), ds.num_entities, ds.num_relations)


def table(scorer, triples: torch.Tensor, chunk: int = 64) -> dict[tuple[int, int], torch.Tensor]:
    """Every distinct (anchor, relation-or-inverse) query of both sides of ``triples``, scored over all entities
    (the queries go to the scorer's device, ConvE's on CUDA; the rows come back on the CPU)."""
    scored = ScoreTable.of(scorer, triples.to(model_device(scorer)), chunk)
    return {(a, r): row for (a, r), row in zip(scored.queries.tolist(), scored.rows)}


def policy_tables(scorer: PolicyScorer, triples: torch.Tensor, num_relations: int) -> dict[str, dict]:
    """table() for each proof score of the policy, from one beam search of every (query, entity) pair."""
    E = scorer.num_entities
    queries = distinct_queries(triples, num_relations)
    tables: dict[str, dict] = {mode: {} for mode in PROOF_SCORES}
    for part in queries.split(max(1, scorer.batch_size // E)):
        anchor, relation = part.repeat_interleave(E, 0).unbind(1)  # [q E] each
        entity = torch.arange(E).repeat(len(part))
        inverse = relation >= num_relations
        hrt = torch.stack([torch.where(inverse, entity, anchor), torch.where(inverse, relation - num_relations, relation),
                           torch.where(inverse, anchor, entity)], 1)  # [q E, 3], as PolicyScorer.score_t builds them
        with torch.no_grad():
            beams = [scorer.search(x) for x in hrt.split(scorer.batch_size)]
        for mode in PROOF_SCORES:
            scores = torch.cat([beam_scores(b, mode) for b in beams]).float().view(len(part), E)
            tables[mode].update({(a, r): row for (a, r), row in zip(part.tolist(), scores)})
    return tables


def valid_mrr(rows: dict, ds) -> float:
    known_valid = AnswerIndex.build(ds.known_triples("valid"), ds.num_relations)
    scorer = table_scorer(rows, ds)
    return evaluate(scorer, VALID[0], known=known_valid).both.realistic.mrr


def metrics(scorer, ds, corruptions: int) -> dict:
    known = AnswerIndex.build(ds.all_triples(), ds.num_relations)
    m = evaluate(scorer, TEST[0], known=known, candidates=Candidates(corruptions)).both.realistic
    return {"mrr": round(m.mrr, 4), **{f"hits_at_{k}": round(m.hits_at[k], 4) for k in (1, 3, 10)}}


def proof_rates(rows: dict, ds, proved_above: float, corruptions: int = 100) -> dict:
    """Share of test triples (both sides' answers) and of their sampled corruptions scoring above the proof line."""
    known = AnswerIndex.build(ds.all_triples(), ds.num_relations)
    true_proved, false_proved, false_total = 0, 0, 0
    for side in ("tail", "head"):
        sq = side_queries(TEST[0], ds.num_relations, side)
        sampled = sample_corruptions(sq, known, ds.num_entities, num_corruptions=corruptions, seed=0)
        scores = torch.stack([rows[(a, r)] for a, r in sq.queries.tolist()])  # [Q, E]
        true_proved += int((scores.gather(1, sq.answers.unsqueeze(1)) > proved_above).sum())
        false_proved += int((scores[sampled.rows, sampled.entities] > proved_above).sum())
        false_total += len(sampled.rows)
    return {"true": round(true_proved / (2 * len(TEST[0])), 4), "corruptions": round(false_proved / false_total, 4)}


def evaluate_rows(rows: dict, ds, proved_above: float) -> dict:
    scorer = table_scorer(rows, ds)
    return {"all_entities": metrics(scorer, ds, 0), "sampled_100": metrics(scorer, ds, 100),
            "proof_rate": proof_rates(rows, ds, proved_above)}


def hybrid(prover_rows: dict, prover_valid: dict, proof_line: float | None, conve, ds) -> dict:
    """ConvE logit + w x proof_part(prover score) (kgtrace's HybridScorer; proof_line None: the prover score as
    it is), w chosen on validation triples (all entities, filtered by train + valid) by kgtrace's rule
    (kgtrace.prover.hybrid: the smallest weight within one standard error of the best validation MRR)."""
    known_valid = AnswerIndex.build(ds.known_triples("valid"), ds.num_relations)
    device = model_device(conve)
    conve_rows = {key: conve.score_t(torch.tensor([key], device=device)).squeeze(0).float().cpu()
                  for key in prover_rows | prover_valid}
    if proof_line is not None:
        prover_rows = {k: proof_part(v, proof_line) for k, v in prover_rows.items()}
        prover_valid = {k: proof_part(v, proof_line) for k, v in prover_valid.items()}

    def mixed(rows: dict, w: float) -> ScoreTable:
        return table_scorer({k: conve_rows[k] + w * v for k, v in rows.items()}, ds)

    choice = choose_weight({w: reciprocal_ranks(mixed(prover_valid, w), VALID[0], known_valid) for w in HYBRID_WEIGHTS})
    result = evaluate_rows({k: conve_rows[k] + choice.weight * v for k, v in prover_rows.items()}, ds, float("inf"))
    del result["proof_rate"]
    # For reading the choice only (it is made on validation): the test MRR every weight would have given.
    test = {x: metrics(mixed(prover_rows, x), ds, 0)["mrr"] for x in HYBRID_WEIGHTS}
    curve = choice.to_dict()
    return {"weight": choice.weight, "valid_mrr": curve["mrr"][choice.weight], **result,
            "best_valid_weight": choice.best, "best_valid_weight_test_mrr": test[choice.best],
            "valid_mrr_by_weight": curve["mrr"], "valid_gap_by_weight": curve["gap"], "valid_se_by_weight": curve["se"],
            "test_mrr_by_weight": test}


VALID: list = [None]  # the validation triples the hybrid weight (and the policy's proof score) is chosen on
TEST: list = [None]  # the test triples ranked


def engine_speed(ds, rules, depth: int, n: int, threads: int, repeats: int = 3) -> dict:
    """Queries per second of the provability search (shortest proof within depth) by each engine."""
    known = AnswerIndex.build(ds.all_triples(), ds.num_relations)
    test = ds.test[:n]
    sampled = sample_corruptions(side_queries(test, ds.num_relations, "tail"), known, ds.num_entities,
                                 num_corruptions=1, seed=0)
    corrupted = test.clone()
    corrupted[sampled.rows, 2] = sampled.entities
    triples = torch.cat([test, corrupted])
    shapes = EngineShapes(max_atoms=6, max_history=depth + 1)
    reference = ReferenceEngine(ds.train, rules, ds.num_entities, shapes)
    engine = VectorEngine(ds.train, rules, ds.num_entities, shapes)
    starts = pad_states([query_state(t) for t in triples.tolist()], 6, ds.num_relations)
    out = {"queries": len(triples), "depth": depth, "threads": threads, "vector_repeats": repeats}
    started = time.perf_counter()
    expected = [proof_depth(reference, query_state(t), depth) for t in triples.tolist()]
    out["reference_qps"] = round(len(triples) / (time.perf_counter() - started), 1)
    expected = torch.tensor([-1 if d is None else d for d in expected])
    compiled = compiled_deriver(engine, 1024)
    started = time.perf_counter()
    vector_search(engine, compiled, starts[:8], depth, first_only=True)  # compiles
    out["compile_seconds"] = round(time.perf_counter() - started, 1)
    for name, derive in (("eager", eager_deriver(engine)), ("compiled", compiled)):
        seconds = []
        for _ in range(repeats):  # the median: on a shared machine single runs vary by tens of percent
            started = time.perf_counter()
            found = vector_search(engine, derive, starts, depth, first_only=True, chunk=1024)
            seconds.append(time.perf_counter() - started)
        out[f"vector_{name}_qps"] = round(len(triples) / statistics.median(seconds), 1)
        out[f"vector_{name}_identical"] = bool(torch.equal(found.depth, expected))
    out["compiled_over_reference"] = round(out["vector_compiled_qps"] / out["reference_qps"], 2)
    out["compiled_over_eager"] = round(out["vector_compiled_qps"] / out["vector_eager_qps"], 2)
    out["proved_share"] = round(float((expected >= 0).float().mean()), 4)
    return out


def train_conve(name: str, args, work: Path, device: torch.device) -> tuple[Path, float]:
    """ConvE for --conve-epochs on the dataset: (its run folder, seconds). It seeds itself, as the policy's
    training does, so training it before or after the policy changes neither."""
    started = time.perf_counter()
    conve_dir = work / f"{name}-conve"
    train(TrainConfig(dataset=name, model="conve", epochs=args.conve_epochs, eval_every=0, threads=args.threads,
                      device=device.type), conve_dir, progress=False, log=lambda *_: None)
    return conve_dir, time.perf_counter() - started


def run_dataset(name: str, args, work: Path, device: torch.device) -> dict:
    log = lambda *a: print(f"[{name}]", *a, file=sys.stderr, flush=True)  # noqa: E731
    ds = load_dataset(name)
    VALID[0], TEST[0] = ds.valid[: args.valid_triples], ds.test
    mining = MiningConfig()
    mined = mine_rules(ds.train, ds.num_entities, ds.num_relations, mining)
    rules = rule_set(mined, ds.num_relations)
    result: dict = {"rules": len(rules), "mining": mining.__dict__}
    log(f"{len(rules)} rules")
    result["engine_speed"] = engine_speed(ds, rules, args.depth, args.qps_queries, args.threads)
    log("engine speed", result["engine_speed"])
    if args.engine_speed_only:
        return result

    started = time.perf_counter()
    bfs = BfsScorer(VectorEngine(ds.train, rules, ds.num_entities, EngineShapes(max_atoms=6, max_history=args.depth + 1)),
                    args.depth, state_chunk=1024)
    bfs.derive = compiled_deriver(bfs.engine, 1024)
    bfs_rows, bfs_valid = table(bfs, ds.test), table(bfs, VALID[0])
    result["bfs"] = {"depth": args.depth, **evaluate_rows(bfs_rows, ds, BfsScorer.proof_line),
                     "seconds": round(time.perf_counter() - started, 1), "overflow": bfs.overflow.tolist()}
    log("bfs", result["bfs"])

    conve_dir, conve_train_seconds = train_conve(name, args, work, device)  # first, so that the policy may start from it
    started = time.perf_counter()
    config = ProverConfig(dataset=name, method="policy", rules="mined", depth=args.depth, epochs=args.epochs,
                          beam_width=args.beam, threads=args.threads, eval_triples=100, compile=args.compile_policy,
                          init_from=str(conve_dir) if args.init_from_conve else "",
                          entity_embeddings=args.init_from_conve or args.link_weight > 0, link_weight=args.link_weight,
                          link_epochs=args.link_epochs if args.link_weight > 0 else 0,  # passes of a head there is
                          embedding_dim=args.embedding_dim)
    trained = train_policy(config, ds, rules, work / f"{name}-policy", progress=False, log=log)
    train_seconds = time.perf_counter() - started
    run = load_prover_run(trained.run_dir, device="cpu")  # where it was trained
    prover = run.model.prover if isinstance(run.model, HybridScorer) else run.model  # a link head's run: a hybrid
    scorer = PolicyScorer(prover.policy, prover.engine, args.depth, width=args.beam, batch_size=args.policy_batch,
                          compile=args.compile_policy)
    limits = [int(n) for n in args.policy_test_triples.split(",")]
    limit = limits[args.datasets.split(",").index(name)] if len(limits) > 1 else limits[0]
    subset = ds.test[:limit] if limit else ds.test
    valid_tables = policy_tables(scorer, VALID[0], ds.num_relations)
    valid_mrrs = {mode: round(valid_mrr(rows, ds), 4) for mode, rows in valid_tables.items()}
    mode = max(PROOF_SCORES, key=lambda m: valid_mrrs[m])  # first listed wins a tie
    policy_rows, policy_valid = policy_tables(scorer, subset, ds.num_relations)[mode], valid_tables[mode]
    TEST[0] = subset
    result["policy"] = {"epochs": args.epochs, "beam_width": args.beam, "best_valid_mrr": round(trained.best_valid_mrr, 4),
                        "test_triples": len(subset), "proof_score": mode, "valid_mrr_by_proof_score": valid_mrrs,
                        **evaluate_rows(policy_rows, ds, PolicyScorer.proof_line), "train_seconds": round(train_seconds, 1),
                        "seconds": round(time.perf_counter() - started, 1)}
    log("policy", result["policy"])
    if len(subset) < len(ds.test):
        result["bfs_policy_subset"] = evaluate_rows(bfs_rows, ds, BfsScorer.proof_line)
    TEST[0] = ds.test

    started = time.perf_counter()
    conve = load_run(conve_dir, device=device).model
    conve_rows = table(conve, ds.test, chunk=1024)
    result["conve"] = {"epochs": args.conve_epochs, **evaluate_rows(conve_rows, ds, float("inf")),
                       "seconds": round(conve_train_seconds + time.perf_counter() - started, 1)}
    del result["conve"]["proof_rate"]
    result["hybrid_bfs_conve"] = hybrid(bfs_rows, bfs_valid, BfsScorer.proof_line, conve, ds)
    TEST[0] = subset
    if len(subset) < len(ds.test):
        result["conve_policy_subset"] = evaluate_rows(conve_rows, ds, float("inf"))
        del result["conve_policy_subset"]["proof_rate"]
        result["hybrid_bfs_conve_policy_subset"] = hybrid(bfs_rows, bfs_valid, BfsScorer.proof_line, conve, ds)
    result["hybrid_policy_conve"] = hybrid(policy_rows, policy_valid, PolicyScorer.proof_line, conve, ds)
    # The earlier form, for comparison: the policy's score as it is (1 + confidence, or the value when unproved).
    result["hybrid_policy_conve_raw_score"] = hybrid(policy_rows, policy_valid, None, conve, ds)
    if args.link_weight:  # the learned prover with its own link head, weighed as kgtrace prove weigh does
        with torch.no_grad():
            head = LinkHead(prover.policy)
            result["link_head"] = {"link_weight": args.link_weight, "link_epochs": args.link_epochs,
                                   **evaluate_rows(table(head, subset, chunk=1024), ds, float("inf"))}
            del result["link_head"]["proof_rate"]
            if len(subset) < len(ds.test):  # the head alone is cheap: every test triple too, beside ConvE's
                TEST[0] = ds.test
                result["link_head_all_test"] = evaluate_rows(table(head, ds.test, chunk=1024), ds, float("inf"))
                del result["link_head_all_test"]["proof_rate"]
                TEST[0] = subset
            result["policy_link"] = hybrid(policy_rows, policy_valid, PolicyScorer.proof_line, head, ds)
        log("link head", result["link_head"], "policy + link head", result["policy_link"])
    TEST[0] = ds.test
    log("conve", result["conve"], "hybrids", result["hybrid_bfs_conve"], result["hybrid_policy_conve"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="nations,kinships,umls")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="PPO epochs of the policy")
    parser.add_argument("--beam", type=int, default=4, help="the policy's beam width when scoring")
    parser.add_argument("--policy-test-triples", default="0",
                        help="rank only the first N test triples for the policy (0: all), one N or one per dataset; "
                             "the other methods are also reported on them")
    parser.add_argument("--policy-batch", type=int, default=512, help="ground searches per policy beam batch")
    parser.add_argument("--no-compile-policy", dest="compile_policy", action="store_false",
                        help="train and search with the policy eagerly (else its rollout and beam search are compiled graphs)")
    parser.add_argument("--conve-epochs", type=int, default=100)
    parser.add_argument("--init-from-conve", action="store_true",
                        help="start the policy's entity and relation embeddings from the ConvE run (one embedding per "
                             "entity; else all entities share one and the policy sees relations and rule confidences only)")
    parser.add_argument("--link-weight", type=float, default=0.0,
                        help="train the policy with NTP-lambda's link head (kgtrace.prover.link) at this loss weight, "
                             "and report it alone and with the policy's proofs (policy_link); 0: no head")
    parser.add_argument("--link-epochs", type=int, default=30,
                        help="passes of the link head alone before PPO (with --link-weight > 0)")
    parser.add_argument("--embedding-dim", type=int, default=ProverConfig.embedding_dim,
                        help="width of the policy's embeddings (the link head's ComplEx has half as many complex ones)")
    parser.add_argument("--valid-triples", type=int, default=200, help="validation triples the hybrid weight is chosen on")
    parser.add_argument("--engine-speed-only", action="store_true", help="time the engines only (no ranking)")
    parser.add_argument("--qps-queries", type=int, default=200, help="test triples (plus one corruption each) timed")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto (CUDA when available), cpu or cuda")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    try:
        device = resolve_device(args.device)
    except KgtraceError as e:
        sys.exit(f"{Path(__file__).name}: error: {e}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    report = {"settings": vars(args), "device": device.type, "torch": torch.__version__, "results": {}}
    with tempfile.TemporaryDirectory() as work:
        for name in args.datasets.split(","):
            report["results"][name] = run_dataset(name, args, Path(work), device)
            if args.out:
                Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
