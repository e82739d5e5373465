"""kgtrace explain (TracIn, or a prover run's proofs) and index."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kgtrace.attribution.methods import AUTO_BUDGET_S, METHOD_SPECS, AttributionInputs, explain_methods, method_note
from kgtrace.attribution.results import Explanations, Influencer, SelfInfluence
from kgtrace.cli.common import (
    add_restrict_arg,
    check_run_outputs,
    compile_stats_path,
    indexed_outputs,
    memory_budget,
    named_output,
    output_lock,
    parse_list,
    trak_ridges,
    write_json,
)
from kgtrace.core.config import PRECISIONS
from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.io import check_json_out
from kgtrace.display.numbers import rank_number

if TYPE_CHECKING:
    from torch import Tensor

    from kgtrace.attribution.methods import MethodChoice


def add_explain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train (with epoch checkpoints)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--triple", nargs=3, metavar=("HEAD", "REL", "TAIL"),
                      help="explain one triple, given by labels or integer ids")
    what.add_argument("--triples", metavar="FILE",
                      help="explain every triple of a labelled file, head<TAB>relation<TAB>tail per line")
    what.add_argument("--test", type=int, metavar="N", help="explain the first N triples of the run's test split")
    what.add_argument("--predict", nargs=2, metavar=("HEAD", "REL"),
                      help="explain the model's best new tails of (HEAD, REL, ?) (see --top-n)")
    what.add_argument("--self", dest="self_influence", action="store_true",
                      help="rank every training triple by self-influence, highest (most suspicious) first")
    p.add_argument("--top-n", type=int, default=10, help="with --predict: how many new tails to explain")
    p.add_argument("--top-k", type=int, default=10,
                   help="proponents and opponents per triple (with --self: triples shown and detailed in the JSON)")
    p.add_argument("--method", default="auto", choices=("auto", *explain_methods()),
                   help="auto (default): trak, the best method by LDS, where its exact gradients fit and take at most "
                        "--budget seconds on this machine (estimated from two timed pilots), else tracin; the output "
                        "says which and why. tracin: streaming, any size "
                        "(--params, --checkpoints, --precision, --compile, --chunk-size, --index and --self apply, and "
                        "make auto choose it). Or a method that scores every training triple at once on the CPU "
                        "(small models: trak, influence-fisher, influence, grad-cos, ...; see docs/tracin.md)")
    p.add_argument("--budget", type=float, default=AUTO_BUDGET_S, metavar="SECONDS",
                   help="--method auto: the seconds TRAK may take here; over them, tracin")
    p.add_argument("--trak-dim", type=int, default=None, metavar="K",
                   help="--method trak: project the score gradients to K random dimensions (default: the exact "
                        "gradients; a projection is needed where training triples x parameters x 8 bytes exceed 2 GiB)")
    p.add_argument("--trak-ridge", type=float, default=None,
                   help="--method trak: the ridge, a fraction of the mean of its kernel's nonzero eigenvalues "
                        f"(default: the model's, {trak_ridges()})")
    p.add_argument("--damping", type=float, default=1e-3, help="--method influence*: the first damping tried")
    p.add_argument("--params", default=None,
                   help="TracIn's parameters whose gradients are compared: last (the model's last layer; default), "
                        "all, or NAME,NAME")
    p.add_argument("--checkpoints", default=None,
                   help="TracIn's epoch checkpoints summed over, each weighed by its learning rate: all (default) or "
                        "EPOCH,EPOCH")
    p.add_argument("--checkpoint", default="best",
                   help="checkpoint of the model that scores and ranks the triples: best, last or a file")
    p.add_argument("--precision", default=None, choices=PRECISIONS,
                   help="TracIn's gradients and their products in this type (default fp32; bf16/fp16: faster, about "
                        "1e-2 relative error)")
    p.add_argument("--index", metavar="FOLDER",
                   help="answer from a projected index built by kgtrace index (approximate; fast for many queries)")
    p.add_argument("--chunk-size", type=int, metavar="N",
                   help="training triples per chunk of the pass (bounds memory; default: 4096, less for gradients "
                        "materialised per triple)")
    p.add_argument("--memory-budget", default="2GB", metavar="SIZE",
                   help="memory for the checkpoints' models held at once and for ranking the explained triples "
                        "(e.g. 2GB); when the models need more, the pass goes over the training set once per group of "
                        "checkpoints that fits, keeping the earlier groups' influences on disk beside OUT.json until "
                        "the last group's pass ranks them (same results)")
    p.add_argument("--save-every", type=float, default=30.0, metavar="SECONDS",
                   help="how often a long pass saves its progress to OUT.json.state (or FOLDER.state with "
                        "--out-dir), which rerunning the same command resumes from (0: after every chunk)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compute per-triple gradients through torch.compile (same influences up to rounding; counters "
                        "in OUT.compile_stats.json; default: on CUDA only). A failed compilation is an error, never "
                        "a silent fallback")
    p.add_argument("--out", metavar="FILE.json",
                   help="JSON to write; a TSV with every row goes beside it (default: RUN_DIR/explain.json, "
                        "or RUN_DIR/self_influence.json with --self)")
    p.add_argument("--out-dir", metavar="FOLDER",
                   help="instead of one combined file, write one JSON + TSV per explained triple into FOLDER")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where to compute (auto: CUDA when available)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    add_restrict_arg(p)
    p.add_argument("--rules", metavar="FILE",
                   help="also the paths in the graph that imply each triple: the rules of FILE (kgtrace rules learn) "
                        "that predict it, strongest first, each with its paths of training facts; written beside the "
                        "output as NAME.paths.json")


def cmd_explain(args: argparse.Namespace) -> int:
    from kgtrace.attribution import TracIn
    from kgtrace.compute.compile import compile_default, logged_compilation
    from kgtrace.compute.system import resolve_device
    from kgtrace.core.layout import RunLayout
    from kgtrace.runs.embedding import load_run

    if RunLayout(args.run_dir).kind == "prover":
        if args.world.distributed:
            raise KgtraceError(f"{args.run_dir}: a prover run's proofs are found in one process. "
                               "Fix: run this command without torchrun")
        return explain_prover_run(args)
    check_explain_options(args)
    options = tracin_options(args)  # parsed before the run loads: a bad --params fails at once
    out = Path(args.out) if args.out else Path(args.run_dir) / (
        "self_influence.json" if args.self_influence else "explain.json")
    check_json_out(out)
    # The methods other than TracIn compute on the CPU: their run is loaded there.
    device = resolve_device(args.device if may_stream(args.method) else "cpu")
    run = load_run(args.run_dir, args.checkpoint, device=device)
    # --out-dir: its first file stands for the folder (where it lies, whether its folder can be written)
    check_run_outputs(args.run_dir, run.config.dataset, indexed_outputs(
        Path(args.out_dir) / "triple-0000.json" if args.out_dir else out, "--out-dir" if args.out_dir else "--out"),
        reads=(args.triples,))
    choice = explain_method(args, run)
    options["compile"] = compile_default(device, args.compile)
    compiled = logged_compilation(Path(args.out_dir) / "compile_stats.json" if args.out_dir
                                  else compile_stats_path(out, out), options["compile"] and args.world.is_main)
    with output_lock(args.out_dir or out, args.world):  # also keeps a second process off the saved state
        if args.self_influence:
            return explain_self_influence(args, run, TracIn(run, device=device, **options), compiled, out)
        return explain_test_triples(args, run, choice, device, options, compiled, out)


def explain_method(args: argparse.Namespace, run) -> MethodChoice:
    """--method as given; auto: TracIn where an option only TracIn reads is given, else ``choose_method``."""
    from kgtrace.attribution.methods import MethodChoice, choose_method

    if args.method != "auto":
        return MethodChoice(args.method, f"--method {args.method}")
    given = tracin_only_options(args)
    if given:
        return MethodChoice("tracin", f"{', '.join(given)} given, which only TracIn reads")
    if args.trak_dim is not None:
        return MethodChoice("trak", f"--trak-dim {args.trak_dim} given")
    return choose_method(run, args.budget)


def may_stream(method: str) -> bool:
    """Whether --method may run explain's streaming pass (TracIn's; auto may choose it), which alone takes --index,
    --self, torchrun and a GPU."""
    return method == "auto" or METHOD_SPECS[method].streaming


def tracin_only_options(args: argparse.Namespace) -> list[str]:
    """The options given that only TracIn reads (torchrun counts as one)."""
    tracin_only = {"--self": args.self_influence, "--index": args.index, "--params": args.params,
                   "--checkpoints": args.checkpoints, "--precision": args.precision, "--compile": args.compile,
                   "--chunk-size": args.chunk_size, "torchrun": args.world.distributed}
    return [name for name, value in tracin_only.items() if value not in (None, False)]


def check_explain_options(args: argparse.Namespace) -> None:
    """Every conflict among explain's options, raised at once."""
    counts = {"top-k": args.top_k, "top-n": args.top_n, "chunk-size": args.chunk_size}
    problems = [f"--{key} {value}: must be at least 1" for key, value in counts.items() if value is not None and value < 1]
    if not args.save_every >= 0:  # also NaN
        problems.append(f"--save-every {args.save_every}: must be a number of seconds, 0 or more")
    if not args.budget >= 0:  # also NaN
        problems.append(f"--budget {args.budget}: must be a number of seconds, 0 or more")
    if args.out_dir and (args.self_influence or args.out):
        problems.append("--out-dir: writes one file per explained triple; fix: drop --out, and use it without --self")
    if not may_stream(args.method):
        problems += [f"--{name} with --method {args.method}: {why}" for name, given, why in (
            ("index", args.index, "the index holds TracIn's projected gradients; fix: drop --index or use --method tracin"),
            ("self", args.self_influence, "self-influence is TracIn's; fix: use --method tracin"),
        ) if given]
        if args.world.distributed:
            problems.append(f"--method {args.method}: runs in one process; fix: run it without torchrun")
    if args.trak_dim is not None and args.method not in ("trak", "auto"):
        problems.append(f"--trak-dim with --method {args.method}: TRAK's projection; fix: drop it or use --method trak")
    tracin_only = tracin_only_options(args)
    if args.trak_dim is not None and args.method == "auto" and tracin_only:
        problems.append(f"--trak-dim is TRAK's and {', '.join(tracin_only)} TracIn's; fix: drop one, or "
                        "name the method with --method trak or --method tracin")
    if args.index and args.self_influence:
        problems.append("--index with --self: the index answers queries, not self-influence; fix: drop --index")
    problems += memory_budget(args.memory_budget)[1]
    if args.rules and (args.self_influence or args.out_dir):
        problems.append("--rules: paths explain triples, one file beside --out; fix: drop --self and --out-dir")
    if args.index and args.world.distributed:
        problems.append("--index: queries of a projected index run in one process; fix: run it without torchrun")
    if problems:
        raise ConfigError(problems)


def tracin_options(args: argparse.Namespace) -> dict:
    """TracIn's keyword arguments from explain's --params, --checkpoints, --precision and --compile."""
    params = args.params or "last"
    params = params if params in ("last", "all") else list(parse_list(params, "--params"))
    checkpoints = "all" if args.checkpoints in (None, "all") else list(parse_list(args.checkpoints, "--checkpoints", int))
    return {"params": params, "checkpoints": checkpoints, "precision": args.precision or "fp32", "compile": args.compile,
            "chunk_size": args.chunk_size, "world": args.world, "memory_budget": memory_budget(args.memory_budget)[0]}


def explain_state(args: argparse.Namespace, out: Path) -> Path:
    """Where a long pass saves its progress now and then; rerunning the same command resumes from it."""
    return Path(str(args.out_dir or out) + ".state")


def explain_self_influence(args: argparse.Namespace, run, tracin, compiled, out: Path) -> int:
    from kgtrace.attribution.explanations import self_influence_ranking

    with compiled:
        ranking = self_influence_ranking(run, tracin, args.top_k, progress=args.progress,
                                         state=explain_state(args, out), save_every=args.save_every)
    if not args.world.is_main:
        return 0
    print_self_influence(ranking)
    print(f"wrote {out} and {ranking.write(out)}")
    return 0


def explain_test_triples(args: argparse.Namespace, run, choice: MethodChoice, device, options: dict, compiled,
                         out: Path) -> int:
    from kgtrace.attribution.explanations import explain
    from kgtrace.evaluation.candidates import restriction_note, restricts

    test = explain_targets(args, run)
    rules = path_rules(args.rules, run.dataset) if args.rules else None  # read first: a bad file fails at once
    if args.world.is_main and restricts(run.dataset, args.restrict):  # restricted: the first line says so
        print(restriction_note(True, args.restrict).replace(
            "candidates:", "candidates (of --predict and of the ranks):", 1))
    if args.method == "auto" and args.world.is_main:
        print(f"--method auto: {choice.method}, {choice.reason}; --method tracin or trak to choose")
    inputs = AttributionInputs(progress=args.progress, damping=args.damping, trak_dim=args.trak_dim,
                               trak_ridge=args.trak_ridge)
    with compiled:
        items = explain(run, test, method=choice, top_k=args.top_k, inputs=inputs, tracin=options, index=args.index,
                        progress=args.progress, state=explain_state(args, out), save_every=args.save_every,
                        memory_budget=options["memory_budget"], restrict=args.restrict, device=device)
    if not args.world.is_main:  # every process holds the merged result; rank 0 reports it
        return 0
    print_explanations(items)
    if rules is not None:
        explain_rule_paths(run.dataset, rules, args.rules, test, paths_file(out))
    if args.out_dir:
        for i in range(len(items)):
            items[i:i + 1].write(Path(args.out_dir) / f"triple-{i:04d}.json")
        print(f"wrote {len(items)} explanations (JSON + TSV each) into {args.out_dir}")
    else:
        print(f"wrote {out} and {items.write(out)}")
    return 0


def paths_file(out: Path) -> Path:
    """Where --rules writes the paths beside explain's output."""
    return out.with_name(out.stem + ".paths.json")


def path_rules(rules_file: str, dataset):
    """The rules of --rules, over the run's relations and entities."""
    from kgtrace.prover.rules import read_rules

    return read_rules(rules_file, dataset.relations, entities=dataset.entities, max_body=3)


def explain_rule_paths(dataset, rules, rules_file: str, triples: Tensor, out: Path, graph=None) -> None:
    """Print each triple's paths (the ``rules``, read from ``rules_file``, that predict it) and write them to ``out``;
    ``graph``: the training graph when the run already holds one."""
    from kgtrace.prover.rule_paths import KIND, explain_paths

    found = explain_paths(dataset, rules, triples, rules_file=rules_file, graph=graph)
    print(f"\n{KIND}:")
    print("\n".join(found.lines()))
    write_json(found.to_dict(), out)
    print(f"wrote {out}")


def explain_prover_run(args: argparse.Namespace) -> int:
    """kgtrace explain on a prover run: each triple's proof, step by step (the TracIn options do not apply)."""
    from kgtrace.compute.system import resolve_device
    from kgtrace.prover.explain import explain_proofs
    from kgtrace.prover.run import load_prover_run

    if args.self_influence or args.predict or args.index or args.out_dir:
        raise ConfigError(["a prover run explains triples by their proofs; fix: use --triple, --triples or --test "
                           "(--self, --predict, --index and --out-dir are for embedding runs)"])
    out = Path(args.out) if args.out else Path(args.run_dir) / "explain.json"
    check_json_out(out)
    run = load_prover_run(args.run_dir, args.checkpoint, resolve_device(args.device))
    check_run_outputs(args.run_dir, run.config.dataset, named_output(out, "--out"), reads=(args.triples,))
    if run.config.method == "apply":  # rule application: the rules that predict each triple, and their paths
        explain_rule_paths(run.dataset, run.rules, str(Path(args.run_dir) / "rules.txt"), explain_targets(args, run),
                           out, run.graph)
        return 0
    proofs = explain_proofs(run, explain_targets(args, run))
    for line in proofs.lines():
        print(line)
    write_json(proofs.to_dict(), out)
    print(f"wrote {out}")
    return 0


def explain_targets(args: argparse.Namespace, run) -> Tensor:
    """The test triples [n, 3] that --triple, --triples, --test or --predict name."""
    from kgtrace.attribution.explanations import predicted_triples
    from kgtrace.data.lookup import parse_triple

    if args.triple:
        return parse_triple(run.dataset, *args.triple).view(1, 3)
    if args.predict:
        return predicted_triples(run, *args.predict, args.top_n, restrict=args.restrict)
    if args.test is not None:
        if args.test < 1 or not len(run.dataset.test):
            raise ConfigError([f"--test {args.test}: must be at least 1, and the run's dataset needs a test split"])
        return run.dataset.test[: args.test]
    from kgtrace.data.lookup import encode_named_triples

    test = encode_named_triples(run.dataset, args.triples)
    if len(test) == 0:
        raise KgtraceError(f"{args.triples}: no triples. Fix: write head<TAB>relation<TAB>tail per line")
    return test



def add_index_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by kgtrace train (with epoch checkpoints)")
    p.add_argument("--out", metavar="FOLDER", help="index folder to write (default: RUN_DIR/tracin-index); "
                                                    "an interrupted build in it resumes")
    p.add_argument("--dim", type=int, default=1024,
                   help="numbers per training gradient and checkpoint (error falls as 1/sqrt(dim))")
    p.add_argument("--params", default="last", help="parameters: last, all, or NAME,NAME (as kgtrace explain)")
    p.add_argument("--dtype", default="float16", choices=("float16", "float32"), help="storage type of the index")
    p.add_argument("--seed", type=int, default=0, help="seed of the random projection")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to compute")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")


def cmd_index(args: argparse.Namespace) -> int:
    from kgtrace.attribution.index import build_index
    from kgtrace.compute.system import resolve_device
    from kgtrace.runs.embedding import load_run

    params = args.params if args.params in ("last", "all") else list(parse_list(args.params, "--params"))
    device = resolve_device(args.device)
    run = load_run(args.run_dir, device=device)
    out = Path(args.out) if args.out else Path(args.run_dir) / "tracin-index"
    index = build_index(run, out, params=params, dim=args.dim, seed=args.seed, dtype=args.dtype, device=device,
                        progress=args.progress)
    meta = index.meta
    print(f"indexed {meta.num_train} training triples x {len(meta.checkpoints)} checkpoints at dim {meta.dim} "
          f"({', '.join(meta.params)}) in {meta.seconds:.1f} s into {out}; "
          f"query with: kgtrace explain {args.run_dir} --index {out} --triple HEAD REL TAIL")
    return 0



def print_explanations(items: Explanations, shown: int = 5, triples: int = 20) -> None:
    """Per test triple (the first ``triples``): names, score and ranks, then the strongest proponents and opponents."""
    if len(items):
        name, what = method_note(items[0].method)
        print(f"{name} (--method {items[0].method}): {what}; positive: raised the prediction's score")
    if len(items) > triples:
        print(f"(showing {triples} of {len(items)} explained triples; all of them are in the files written)")
    for item in items[:triples]:
        print(f"{item.triple.text()}   score {item.score:.4f} (probability {item.probability:.3f})   filtered rank: "
              f"tail {rank_number(item.rank_tail)}, head {rank_number(item.rank_head)}")
        if item.split == "train":
            print("  (a training triple: its strongest proponent is itself)")
        for kind, entries in (("proponents", item.proponents), ("opponents", item.opponents)):
            print(f"  {kind} (top {min(shown, len(entries))} of {len(entries)}{sign_note(kind, entries[:shown])}):"
                  "  influence, training row (train_index), entities shared with the triple above, training triple")
            for e in entries[:shown]:
                print(f"    {e.influence:+.4e}  row {e.train_index:<7} shares {e.shares:<7}  {e.triple.text()}")


def sign_note(kind: str, entries: Sequence[Influencer]) -> str:
    """Where a list runs past its sign: proponents are the highest influences and opponents the lowest, so when fewer
    training triples raised (lowered) the score than the list shows, it goes on with ones that did not."""
    raised = kind == "proponents"
    of_its_sign = [e.influence > 0 if raised else e.influence < 0 for e in entries]
    if all(of_its_sign):
        return ""
    count = of_its_sign.index(False)  # the list is sorted: every triple of its sign comes first
    verb = "raised" if raised else "lowered"
    if count == 0:
        return f"; no training triple {verb} the score"
    return f"; only {count} training triple{'s' if count > 1 else ''} {verb} the score"


def print_self_influence(ranking: SelfInfluence) -> None:
    print(f"most self-influential training triples (of {ranking.ranked.height}; all of them in the TSV): "
          "rank, self-influence, training row (train_index), triple")
    for rank, e in enumerate(ranking.top, 1):
        print(f"  {rank:>3}. {e.influence:.4e}  row {e.train_index:<7} {e.triple.text()}")


