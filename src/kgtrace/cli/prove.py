"""kgtrace rules and prove: the rule prover's commands."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kgtrace.cli.common import HelpFormatter, field_defaults, named_output, parse_list, train_help
from kgtrace.core.errors import KgtraceError
from kgtrace.core.owned import check_outputs
from kgtrace.data.dataset import dataset_inputs

if TYPE_CHECKING:
    from kgtrace.prover.config import ProverConfig


def add_rules_args(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(title="actions", metavar="ACTION", dest="action", required=True)
    mine = actions.add_parser("mine", formatter_class=HelpFormatter,
                              help="mine implication, inverse and length-2 chain rules (AMIE's measures)",
                              description="Mine r(X,Y) :- s(X,Y), r(X,Y) :- s(Y,X) and r(X,Y) :- s(.,.), t(.,.) "
                                          "(every direction) from the training triples, with support, head coverage, "
                                          "standard and PCA confidence; write them best first, one per line: "
                                          "CONFIDENCE  HEAD :- BODY  # measures")
    mine.add_argument("--dataset", default="umls", help=train_help("dataset"))
    mine.add_argument("--out", required=True, metavar="FILE", help="rule file to write")
    add_mining_args(mine)
    mine.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    learn = actions.add_parser("learn", formatter_class=HelpFormatter,
                               help="learn AnyBURL's path rules (cyclic up to 3 atoms, and with constants) until "
                                    "--seconds are up",
                               description="Sample paths from the training triples and read rules off them, as "
                                           "AnyBURL does: r(X,Y) :- path(X,Y) of 1 to --max-length atoms, and "
                                           "r(X,\"c\") :- s(X,\"d\") and r(X,\"c\") :- s(X,A) (either side); each "
                                           "new rule measured (confidence = correct / (groundings + offset)); write "
                                           "them best first. Rerunning the command continues the learning from "
                                           "FILE.state (give more --seconds or --rounds). Rank with them: kgtrace "
                                           "prove apply --rules FILE.")
    learn.add_argument("--dataset", default="umls", help=train_help("dataset"))
    learn.add_argument("--out", required=True, metavar="FILE", help="rule file to write")
    add_learning_args(learn)
    learn.add_argument("--overwrite", action="store_true", help="replace an existing --out file and learn anew")


def add_learning_args(p: argparse.ArgumentParser) -> None:
    from kgtrace.prover.config import LearnConfig

    defaults = field_defaults(LearnConfig)
    p.add_argument("--seconds", type=float, default=defaults.seconds, help="time to learn for (all runs together)")
    p.add_argument("--rounds", type=int, default=defaults.rounds,
                   help="learn for this many rounds of sampled paths whatever the time (0: for --seconds); the "
                        "same rules on any machine")
    p.add_argument("--max-length", type=int, default=defaults.max_length, help="body atoms of the longest cyclic rule")
    p.add_argument("--no-acyclic", dest="acyclic", action="store_false", help="no rules with constants")
    p.add_argument("--paths-per-round", type=int, default=defaults.paths_per_round,
                   help="training facts sampled per round, a path of each length walked from each")
    p.add_argument("--meet-neighbours", type=int, default=defaults.meet_neighbours,
                   help="also find cyclic paths of 2 and 3 steps met in the middle: up to N steps from each sampled "
                        "fact's head and into its tail, every pair tried (0: random walks only; for sparse graphs)")
    p.add_argument("--confidence-sample", type=int, default=defaults.confidence_sample,
                   help="start entities whose groundings measure a cyclic rule")
    p.add_argument("--min-support", type=int, default=defaults.min_support, help="correct predictions a rule needs")
    p.add_argument("--min-confidence", type=float, default=defaults.min_confidence, help="confidence a rule needs")
    p.add_argument("--confidence-offset", type=float, default=defaults.confidence_offset,
                   help="confidence = correct / (groundings + offset): AnyBURL's unseen negatives")
    p.add_argument("--seed", type=int, default=defaults.seed, help="random seed of the sampled paths")


def add_mining_args(p: argparse.ArgumentParser) -> None:
    from kgtrace.prover.config import MiningConfig

    defaults = field_defaults(MiningConfig)
    p.add_argument("--min-support", type=int, default=defaults.min_support,
                   help="distinct (x, y) pairs a rule must predict correctly")
    p.add_argument("--min-head-coverage", type=float, default=defaults.min_head_coverage,
                   help="support / facts of the head relation")
    p.add_argument("--min-confidence", type=float, default=defaults.min_confidence, help="standard confidence")
    p.add_argument("--min-pca-confidence", type=float, default=defaults.min_pca_confidence,
                   help="PCA confidence (AMIE's partial completeness assumption)")
    p.add_argument("--confidence", choices=("std", "pca"), default=defaults.confidence,
                   help="the measure written as each rule's confidence")
    p.add_argument("--confidence-offset", type=float, default=defaults.confidence_offset,
                   help="written confidence = support / (denominator + offset), damping rules with rare bodies "
                        "(AnyBURL's default 5; 0: AMIE's measure itself)")
    p.add_argument("--max-rules-per-head", type=int, default=defaults.max_rules_per_head,
                   help="keep each head relation's best N rules (0: all); bounds the prover's branching")
    p.add_argument("--no-chains", dest="chains", action="store_false", help="mine implications and inverses only")
    p.add_argument("--max-chain-paths", type=int, default=defaults.max_chain_paths,
                   help="two-hop paths counted at once while mining chains (about 100 bytes each): supports and "
                        "chain products are taken a block of facts or rows at a time within it, so it bounds memory, "
                        "not the rules (0: all at once)")


def mining_config(args: argparse.Namespace):
    """The MiningConfig of the mining options (each option's dest is the field's name)."""
    from kgtrace.prover.config import MiningConfig

    return MiningConfig(**{f.name: getattr(args, f.name) for f in fields(MiningConfig)}).validate()


def cmd_rules(args: argparse.Namespace) -> int:
    if args.action == "learn":
        return rules_learn(args)
    return rules_mine(args)


def rules_learn(args: argparse.Namespace) -> int:
    from kgtrace.prover.config import LearnConfig
    from kgtrace.prover.learn import learn_rule_file

    config = LearnConfig(**{f.name: getattr(args, f.name) for f in fields(LearnConfig)})
    check_outputs(named_output(args.out, "--out"), pinned=dataset_inputs(args.dataset))
    learned = learn_rule_file(args.dataset, args.out, config, overwrite=args.overwrite)
    heads = len({m.rule.head for m in learned})
    constants = sum(m.rule.has_constants for m in learned)
    print(f"wrote {len(learned)} rules ({constants} with constants) for {heads} relations into {args.out}; rank with "
          f"them: kgtrace prove apply --dataset {args.dataset} --rules {args.out} --out RUN")
    return 0


def rules_mine(args: argparse.Namespace) -> int:
    from kgtrace.data.dataset import load_dataset
    from kgtrace.prover.mining import mine_rules
    from kgtrace.prover.rules import write_rules

    config = mining_config(args)
    if Path(args.out).exists() and not args.overwrite:
        raise KgtraceError(f"--out {args.out}: the file exists. Fix: pass --overwrite, or choose another name")
    check_outputs(named_output(args.out, "--out"), pinned=dataset_inputs(args.dataset))
    ds = load_dataset(args.dataset)
    mined = mine_rules(ds.train, ds.num_entities, ds.num_relations, config)
    header = [f"kgtrace rules mine --dataset {args.dataset}: {len(mined)} rules from {len(ds.train)} training triples",
              "settings: " + json.dumps(config.__dict__), "CONFIDENCE  HEAD :- BODY  # measures"]
    write_rules(args.out, [m.rule for m in mined], ds.relations.labels, [m.note() for m in mined], header)
    heads = len({m.rule.head for m in mined})
    print(f"wrote {len(mined)} rules for {heads} of {ds.num_relations} relations into {args.out}")
    return 0



def add_prove_args(p: argparse.ArgumentParser) -> None:
    from kgtrace.prover.config import AGGREGATIONS, HYBRID_WEIGHTS

    actions = p.add_subparsers(title="actions", metavar="ACTION", dest="action", required=True)
    bfs = actions.add_parser("bfs", formatter_class=HelpFormatter,
                             help="the non-learned prover: a triple's score is its best proof's confidence",
                             description="Write a prover run that scores a triple by exhaustive proof search to "
                                         "--depth steps: the product of the confidences of the rules of its best "
                                         "proof, 0 without one. Rank it with kgtrace evaluate RUN.")
    add_prover_args(bfs)
    apply = actions.add_parser("apply", formatter_class=HelpFormatter,
                               help="rule application: a candidate ranked by the rules that predict it (AnyBURL's)",
                               description="Write a prover run that ranks every entity as the answer of a query by "
                                           "the rules whose body's path from the query's entity predicts it: "
                                           "maxplus (AnyBURL's: the best rule's confidence, ties by the next best), "
                                           "max, noisy_or, or nr_noisy_or (SAFRAN's: a noisy-or over clusters of "
                                           "rules whose predictions overlap, each counting once with its best rule; "
                                           "the clusters are chosen on the validation split and kept in the run). "
                                           "Rules of kgtrace rules learn (paths up to 3 atoms, constants) or mined. "
                                           "Rank it with kgtrace evaluate RUN.")
    add_prover_args(apply)
    apply.add_argument("--aggregation", choices=AGGREGATIONS, default="maxplus",
                       help="how the rules predicting a candidate combine (a hybrid needs max, noisy_or or "
                            "nr_noisy_or)")
    train = actions.add_parser("train", formatter_class=HelpFormatter,
                               help="learn a proof policy with PPO over training triples and sampled false ones",
                               description="Write a prover run and train its policy (PPO: clipped objective, GAE, "
                                           "entropy bonus) to prove training triples (each without itself as a "
                                           "fact) and not their sampled corruptions; --depth is the steps of an "
                                           "episode. A triple's score is the best proof its policy-guided beam "
                                           "search finds. --resume continues the run in --out.")
    add_prover_args(train, resumable=True)
    add_policy_args(train)
    weigh = actions.add_parser("weigh", formatter_class=HelpFormatter,
                               help="choose a hybrid prover run's --hybrid-weight on validation triples",
                               description="Rank validation triples by a hybrid prover run (one written with "
                                           "--embedding-run or --link-weight) at each weight of a grid, and set "
                                           "the run's weight to the smallest one whose validation MRR lies within "
                                           "one standard error of the best (paired over queries): among weights "
                                           "validation cannot tell apart, the one that leaves the most to the "
                                           "embedding model. Prints the curve and writes it to RUN/hybrid-weight.json.")
    weigh.add_argument("run", help="a prover run written with --embedding-run or --link-weight")
    weigh.add_argument("--valid-triples", type=int, default=200, help="rank the first N validation triples (0: all)")
    weigh.add_argument("--weights", default=None,
                       help="the grid of weights, comma-separated, taken as given (default: "
                            f"{','.join(f'{w:g}' for w in HYBRID_WEIGHTS)}, doubled further while its largest weight "
                            "has the best validation MRR)")
    weigh.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to score")


# The policy options of kgtrace prove train: ProverConfig field, help (the default is the field's).
POLICY_OPTIONS = (
    ("epochs", "passes over the training triples"),
    ("chunk_queries", "training triples per rollout batch"),
    ("corruptions", "sampled false triples per training triple (K)"),
    ("lr", "Adam learning rate"),
    ("embedding_dim", "width of the policy's embeddings"),
    ("beam_width", "partial proofs the policy keeps per triple when scoring"),
    ("proof_score", "a proved triple's tie-break: confidence (best proof's rules), noisy_or or probability"),
    ("entropy", "entropy bonus"),
    ("negative_reward", "penalty for proving a false triple"),
    ("ppo_epochs", "optimisation passes over each batch of episodes"),
    ("eval_triples", "validation triples ranked after each epoch"),
    ("eval_corruptions", "sampled corruptions each validation triple is ranked against"),
    ("seed", "random seed"),
    ("threads", "CPU threads for torch (0: torch's default)"),
    ("link_weight", "NTP-lambda's link head: the weight of a ComplEx loss on the policy's own embeddings, added "
                    "to PPO's; > 0 also scores a triple by its logit + --hybrid-weight x the proof (0: no head)"),
    ("link_epochs", "passes of the link head's loss alone before PPO"),
    ("link_lr", "Adagrad learning rate of those passes"),
    ("link_init", "std the link head's entity and relation embeddings start from, as in Lacroix et al.'s "
                  "ComplEx-N3 (0, or with --init-from: as they are)"),
    ("link_n3", "weight of the N3 regulariser in the link head's loss"),
)
POLICY_KEYS = tuple(key for key, _ in POLICY_OPTIONS)  # the ProverConfig fields kgtrace prove train sets


def add_policy_args(p: argparse.ArgumentParser) -> None:
    from kgtrace.prover.config import ProverConfig

    defaults = field_defaults(ProverConfig)
    for key, help_text in POLICY_OPTIONS:
        default = getattr(defaults, key)
        p.add_argument("--" + key.replace("_", "-"), type=type(default), default=None,
                       help=f"{help_text} (default: {default})")
    p.add_argument("--init-from", default="", metavar="RUN",
                   help="start the policy's entity and relation embeddings from this embedding run")
    p.add_argument("--entity-embeddings", action="store_true",
                   help="learn one embedding per entity (default: entities share one; set by --init-from and "
                        "--link-weight)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")


def add_prover_args(p: argparse.ArgumentParser, resumable: bool = False) -> None:
    from kgtrace.prover.config import ProverConfig

    defaults = field_defaults(ProverConfig)
    p.add_argument("--dataset", default="umls", help=train_help("dataset"))
    p.add_argument("--out", required=True, help="run folder to write")
    rules = p.add_mutually_exclusive_group(required=not resumable)
    rules.add_argument("--rules", metavar="FILE", help="rule file (CONFIDENCE  HEAD :- BODY, or the prototype's lines)")
    rules.add_argument("--mine", action="store_true", help="mine the rules from the training triples (options below)")
    p.add_argument("--depth", type=int, default=defaults.depth, help="resolution steps a proof may take")
    p.add_argument("--max-atoms", type=int, default=defaults.max_atoms, help="atoms a proof state may hold")
    p.add_argument("--max-states", type=int, default=defaults.max_states,
                   help="derived states kept per step (0: all); more are counted as overflow")
    p.add_argument("--max-facts", type=int, default=defaults.max_facts,
                   help="facts read per goal (0: the most any goal with a constant matches)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="run the engine's step through torch.compile (default: on CUDA only)")
    p.add_argument("--embedding-run", default="", metavar="RUN",
                   help="hybrid: add this embedding run's logit to --hybrid-weight x the prover's score")
    p.add_argument("--hybrid-weight", type=float, default=defaults.hybrid_weight,
                   help="the prover's weight (hybrid); kgtrace prove weigh RUN chooses it on validation triples")
    p.add_argument("--overwrite", action="store_true", help="replace an existing prover run in --out")
    if resumable:
        rules.add_argument("--resume", action="store_true",
                           help="continue the run in --out from its latest checkpoint (only --epochs may change)")
    add_mining_args(p)


def prover_config(args: argparse.Namespace, method: str, **settings: Any):
    """prover_setup (kgtrace.prover.setup) with the prove options: (config, rules, notes, dataset)."""
    from kgtrace.compute.compile import compile_default
    from kgtrace.compute.system import resolve_device
    from kgtrace.prover.setup import prover_setup

    return prover_setup(args.dataset, method, rules_file=None if args.mine else args.rules,
                        mining=mining_config(args) if args.mine else None, embedding_run=args.embedding_run,
                        depth=args.depth, max_atoms=args.max_atoms, max_states=args.max_states,
                        max_facts=args.max_facts, compile=compile_default(resolve_device("auto"), args.compile),
                        hybrid_weight=args.hybrid_weight, **settings)


def cmd_prove(args: argparse.Namespace) -> int:
    from kgtrace.prover.run import write_prover_run

    if args.action == "train":
        return prove_train(args)
    if args.action == "weigh":
        return prove_weigh(args)
    more = {"aggregation": args.aggregation} if args.action == "apply" else {}
    config, rules, notes, ds = prover_config(args, args.action, **more)
    if config.embedding_run:
        from kgtrace.prover.neural import embedding_model

        embedding_model(config.embedding_run, ds, "cpu")  # refuse a run over other ids before writing anything
    out = write_prover_run(args.out, config, ds, rules, notes=notes, overwrite=args.overwrite)  # and reads it back
    print("config:", json.dumps(config.to_dict()))
    print(f"wrote the {config.method} prover run {out} ({len(rules)} rules); rank it with: kgtrace evaluate {out}")
    print_weigh_hint(config, out)
    return 0


def print_weigh_hint(config: "ProverConfig", out: Path) -> None:
    """A hybrid run scores with the weight in its config; say how to choose it on validation triples."""
    if config.hybrid():
        print(f"hybrid weight {config.hybrid_weight:g}; to choose it on validation triples: kgtrace prove weigh {out}")


def prove_train(args: argparse.Namespace) -> int:
    from kgtrace.prover.ppo import resume_policy, train_policy
    from kgtrace.prover.run import read_config

    if args.resume:
        result = resume_policy(args.out, epochs=args.epochs, progress=args.progress)
    else:
        more = {key: getattr(args, key) for key in POLICY_KEYS if getattr(args, key) is not None}
        config, rules, notes, ds = prover_config(args, "policy", init_from=args.init_from,
                                                 entity_embeddings=args.entity_embeddings, **more)
        print("config:", json.dumps(config.to_dict()))
        result = train_policy(config, ds, rules, args.out, notes=notes, overwrite=args.overwrite,
                              progress=args.progress)
    print(f"trained {result.epochs_completed} epochs into {result.run_dir}; best validation MRR "
          f"{result.best_valid_mrr:.4f} at epoch {result.best_epoch}; rank it with: kgtrace evaluate {result.run_dir}")
    print_weigh_hint(read_config(Path(result.run_dir)), result.run_dir)
    return 0


def prove_weigh(args: argparse.Namespace) -> int:
    from kgtrace.compute.system import resolve_device
    from kgtrace.prover.hybrid import WEIGHT_FILE, weigh_prover_run
    from kgtrace.prover.run import CONFIG_FILE

    weights = None if args.weights is None else parse_list(args.weights, "--weights", float)
    choice = weigh_prover_run(args.run, args.valid_triples, weights, resolve_device(args.device))
    print(f"validation MRR by hybrid weight ({choice.queries} queries; gap and standard error against the best, "
          f"weight {choice.best:g}):")
    for w in sorted(choice.mrr):
        mark = "  <- chosen" if w == choice.weight else ""
        print(f"  {w:>8g}  MRR {choice.mrr[w]:.4f}  gap {choice.gap[w]:.4f}  SE {choice.se[w]:.4f}{mark}")
    print(f"set hybrid_weight {choice.weight:g} in {Path(args.run) / CONFIG_FILE}; the curve is in "
          f"{Path(args.run) / WEIGHT_FILE}")
    return 0


