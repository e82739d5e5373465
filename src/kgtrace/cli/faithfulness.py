"""kgtrace faithfulness: are the explanations true?"""

from __future__ import annotations

import argparse
from pathlib import Path

from kgtrace.attribution.methods import attributions, lds_methods
from kgtrace.cli.common import add_restrict_arg, trak_ridges
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.faithfulness.removals import removal_methods
from kgtrace.faithfulness.results import FaithfulnessResult, LdsResult, LdsRow

FAITHFULNESS_EPILOG = """\
Predictions explained: the run's test triples that its last checkpoint ranks first (tail side,
filtered), all of them or --sample N of them drawn at random; or the triples of --triples FILE.
For each prediction, method and k, the method's top k training triples are removed and the model
is trained again (--mode retrain: from scratch with the run's config and seed; --mode finetune:
from the checkpoint of --finetune-from, default the latest at or before half the epochs, for the
remaining epochs). Measured against the run's last checkpoint: score drop, filtered tail-rank
change, PD (fraction whose probability, softmax over all tails, drops), TC (fraction no longer
top-1) and the MRR drop of the set. Finished trainings are kept in --out, so a rerun resumes;
running both modes into one --out also reports how far fine-tuning agrees with retraining.

--lds: the linear datamodeling score instead. --subsets M random subsets of --fraction of the
training triples (seeded by --seed), one model trained from scratch on each (the run's config and
seed; kept in --out, so a rerun resumes); each --methods attribution method (then: tracin-last,
tracin-all, tracin-last-final, grad-dot, grad-cos, influence, trak, random, neighbourhood, ...)
predicts each subset model's score and log-probability of each prediction by summing its
attributions over the subset; LDS = Spearman correlation of prediction and truth over the subsets,
averaged over the predictions, with a bootstrap interval. Writes lds.tsv, lds.json and
lds-predictions.tsv.
"""


def add_faithfulness_args(p: argparse.ArgumentParser) -> None:
    p.epilog = FAITHFULNESS_EPILOG
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train (with epoch checkpoints)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--triples", metavar="FILE", help="explain these labelled triples (head<TAB>relation<TAB>tail) "
                                                        "instead of the rank-first test triples")
    what.add_argument("--sample", type=int, metavar="N", help="explain N of the rank-first test triples, drawn at "
                                                              "random; unset: all of them")
    p.add_argument("--k", default="1,5,10", help="numbers of training triples removed, comma-separated")
    p.add_argument("--methods", default=None,
                   help=f"removal methods, comma-separated: {', '.join(removal_methods())} (proof needs "
                        "--prover-run, paths --rules); default tracin-last,tracin-all,random,neighbourhood. With "
                        f"--lds, attribution methods: {', '.join(attributions())}; default {','.join(lds_methods())}")
    p.add_argument("--prover-run", metavar="DIR", help="a kgtrace prove --out folder on the same dataset: the proof "
                                                       "method removes the facts of its proof of each prediction")
    p.add_argument("--rules", metavar="FILE", help="a rule file of the run's dataset (kgtrace rules learn): the paths "
                                                  "method removes the facts of the paths that imply each prediction")
    p.add_argument("--out", metavar="DIR", help="output folder, unset: RUN_DIR/faithfulness; a rerun resumes in it")
    p.add_argument("--mode", choices=("retrain", "finetune"), default="retrain",
                   help="train again from scratch, or continue an early checkpoint without the removed triples")
    p.add_argument("--finetune-from", type=int, metavar="EPOCH",
                   help="with --mode finetune: the checkpoint to continue; unset: the latest at or before half "
                        "the epochs")
    p.add_argument("--jobs", type=int, default=1, help="trainings run in parallel, each in its own process")
    p.add_argument("--threads", type=int, default=1, help="torch threads per training process")
    p.add_argument("--seed", type=int, default=0, help="seed of the random and neighbourhood methods and of --sample")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the trainings run")
    p.add_argument("--keep-runs", action="store_true", help="keep every trained run under OUT/runs/ to inspect it")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bars")
    add_restrict_arg(p)
    lds = p.add_argument_group("linear datamodeling score (--lds)")
    lds.add_argument("--lds", action="store_true", help="score attribution methods by the LDS instead of removals")
    lds.add_argument("--subsets", type=int, default=50, help="random training subsets, one model trained on each")
    lds.add_argument("--fraction", type=float, default=0.5, help="fraction of the training triples in each subset")
    lds.add_argument("--bootstrap", type=int, default=1000, help="resamples of the predictions for the interval")
    lds.add_argument("--damping", type=float, default=1e-3, help="influence functions: the first damping tried")
    lds.add_argument("--trak-dim", type=int, default=None, metavar="K",
                     help="TRAK: project the score gradients to K random dimensions (default: the exact gradients)")
    lds.add_argument("--trak-ridge", type=float, default=None,
                     help="TRAK: the ridge, a fraction of the mean of its kernel's nonzero eigenvalues (default: "
                          f"the model's, {trak_ridges()})")


def cmd_faithfulness(args: argparse.Namespace) -> int:
    if args.lds:
        return cmd_lds(args)
    from kgtrace.faithfulness import FaithfulnessSettings, check_faithfulness

    problems = []
    try:
        ks = tuple(int(x) for x in args.k.split(",") if x.strip())
    except ValueError:
        problems.append(f"--k {args.k!r}: write whole numbers separated by commas, e.g. 1,5,10")
        ks = (1,)  # a placeholder, so that the other settings are still checked
    methods = _methods(args.methods, FaithfulnessSettings.methods)
    try:  # a FaithfulnessSettings validates itself: its problems join --k's
        settings = FaithfulnessSettings(ks=ks, methods=methods, mode=args.mode, finetune_from=args.finetune_from,
                                        sample=args.sample, seed=args.seed, jobs=args.jobs, threads=args.threads,
                                        device=args.device, keep_runs=args.keep_runs, prover_run=args.prover_run,
                                        rules=str(Path(args.rules).resolve()) if args.rules else None,
                                        restrict=tuple(args.restrict))
    except ConfigError as e:
        problems += e.problems
    if problems:
        raise ConfigError(problems)
    triples = _given_triples(args)
    result = check_faithfulness(args.run_dir, args.out, settings, triples=triples, triples_source=args.triples,
                                progress=args.progress)
    print_faithfulness(result)
    out = Path(args.out) if args.out else Path(args.run_dir) / "faithfulness"
    print(f"wrote {out / 'faithfulness.tsv'}, {out / 'faithfulness.json'}, {out / 'cells.tsv'} and "
          f"{out / 'faithfulness.png'}" + (f" and {out / 'agreement.tsv'}" if result.agreement else ""))
    return 0


def cmd_lds(args: argparse.Namespace) -> int:
    from kgtrace.faithfulness.lds import LdsSettings, check_lds

    settings = LdsSettings(subsets=args.subsets, fraction=args.fraction, methods=_methods(args.methods, lds_methods()),
                           sample=args.sample, seed=args.seed, bootstrap=args.bootstrap, jobs=args.jobs,
                           threads=args.threads, device=args.device, damping=args.damping, trak_dim=args.trak_dim,
                           trak_ridge=args.trak_ridge)
    settings.validate()
    result = check_lds(args.run_dir, args.out, settings, triples=_given_triples(args), triples_source=args.triples,
                       progress=args.progress)
    print_lds(result)
    out = Path(args.out) if args.out else Path(args.run_dir) / "faithfulness"
    print(f"wrote {out / 'lds.tsv'}, {out / 'lds.json'} and {out / 'lds-predictions.tsv'}")
    return 0


def _methods(text: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    return default if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def _given_triples(args: argparse.Namespace):
    """The ids [N, 3] of --triples FILE's labelled triples; None without --triples."""
    if not args.triples:
        return None
    from kgtrace.data.lookup import encode_named_triples
    from kgtrace.runs.embedding import load_run

    triples = encode_named_triples(load_run(args.run_dir, "last").dataset, args.triples)
    if len(triples) == 0:
        raise KgtraceError(f"{args.triples}: no triples. Fix: write head<TAB>relation<TAB>tail per line")
    return triples


def print_lds(result: LdsResult) -> None:
    """The LDS table: per method, the mean LDS with its interval on both outputs, and the seconds."""
    print(f"LDS over {result.subsets} subsets of {result.fraction:g} of the training triples "
          f"({len(result.predictions)} predictions; a subset training took {result.training_seconds:.1f} s)")
    print(f"{'method':<18} {'LDS score':>10} {'interval':>17} {'LDS log-prob':>12} {'interval':>17} {'seconds':>8}")
    by_method: dict[str, dict[str, LdsRow]] = {}
    for row in result.rows:
        by_method.setdefault(row.method, {})[row.output] = row
    for method, rows in by_method.items():
        score, logp = rows["score"], rows["log_prob"]
        print(f"{method:<18} {score.lds:10.3f} {f'[{score.low:.3f}, {score.high:.3f}]':>17} {logp.lds:12.3f} "
              f"{f'[{logp.low:.3f}, {logp.high:.3f}]':>17} {score.seconds:8.2f}")
    for method, error in result.errors.items():
        print(f"{method}: not scored: {error}")
    if result.rows:
        best = result.best("score")
        print(f"best on the score: {best.method} (LDS {best.lds:.3f})")


def print_faithfulness(result: FaithfulnessResult) -> None:
    """The table: per variant, method and k, PD, TC, mean score drop and rank change, MRR drop."""
    print(f"{'variant':<20} {'method':<14} {'k':>3} {'n':>4} {'PD %':>6} {'TC %':>6} {'score drop':>10} "
          f"{'rank +':>7} {'MRR drop':>8}")
    for row in result.table:
        print(f"{row.variant:<20} {row.method:<14} {row.k:>3} {row.n:>4} {100 * row.pd:6.1f} "
              f"{100 * row.tc:6.1f} {row.score_drop:10.4f} {row.rank_change:7.2f} {row.mrr_drop:8.4f}")
    for row in result.agreement:
        if row.method == "all":
            print(f"{row.cheap} against retrain over {row.n} removals: PD agrees {100 * row.pd_agreement:.1f}%, "
                  f"TC {100 * row.tc_agreement:.1f}%, score drops correlate {row.score_drop_pearson:.3f}")


