"""The whole path at the users' scale: each step on a 16M-edge ROBOKOP-shaped graph (and the Hetionet-shaped
one), its seconds and peak memory against its target; prints JSON and writes benchmarks/results/scale-DEVICE.json.

    python benchmarks/make_graph.py robokop --out benchmarks/graphs/robokop
    python benchmarks/make_graph.py hetionet --out benchmarks/graphs/hetionet
    python benchmarks/scale.py [--steps prepare,train,...] [--device auto] [--threads 2] [--redo]

Every step runs as its own process (the ``kgtrace`` command a user would type where there is one),
so its peak resident memory is its own (``wait4``; the GPU's peak memory is not recorded yet).
Steps already in the result file are kept, so the script resumes where it stopped; ``--redo``
runs the named steps again. The steps, in order:

* ``prepare``: ``kgtrace prepare`` of the KGX JSONL (category pairs, a dropped predicate,
  ``biolink:treats`` held out, qualifiers folded); edges read per second.
* ``train``: ConvE dim 200, Adam, KvsAll, batch 128, ``--steps-per-epoch`` steps for 4 epochs (a
  checkpoint each: the checkpoints TracIn reads); seconds per 1,000 steps and an epoch extrapolated.
* ``train-chunked``: the same for one epoch of 10 steps with ``entity_chunk`` 65,536: what it costs and saves.
* ``train-sampled``: the same ConvE with ``--training negative-sampling`` (256 negatives a side; each query
  scores its own candidates' rows instead of all entities), two epochs of 10 steps.
* ``train-sampled-adagrad``, ``train-sparse``: the same with Adagrad, its gradients dense, then sparse
  (``--sparse``: a step computes and updates only the rows it read; the same weights, up to float rounding).
* ``evaluate``: ``kgtrace evaluate`` of the test split (filtered, both sides, all entities);
  ``evaluate-compiled`` the same with ``--compile`` (Inductor fuses the counting of higher and tied
  scores into one pass over the scores).
* ``restrict``: the inferred type restriction of ``biolink:treats`` (how many entities each side
  allows, and whether exactly the small molecules and diseases), then the restricted evaluation.
* ``tracin-last``: ``kgtrace explain --test 100 --params last`` over all training triples, 4 checkpoints.
* ``tracin-all``: ``--params all`` on a prefix of the training triples, extrapolated to all of them,
  beside its floor: one forward and backward pass per training triple and checkpoint (torch's FLOP
  counter) at the machine's measured matmul rate.
* ``explain``: ``kgtrace explain --predict DRUG biolink:treats --top-n 10``, exact.
* ``explain-last``: the same over the last checkpoint only (``--checkpoints 4``).
* ``explain-torchrun``: ``explain`` as one process per core (``torchrun --nproc-per-node N``, one thread
  each: a pass's small products and gathers scale better over processes than over threads); peak RSS
  is one process's.
* ``index``, ``explain-index``: ``kgtrace index`` (projected gradients, ``--dim 128``: the index of
  10M triples and 4 checkpoints at 1,024 would not fit this disk), then the same ``explain`` answered
  from it (approximate).
* ``rules``: rules alone on the prepared ROBOKOP-shaped graph: ``kgtrace rules learn`` for ``--rules-seconds``,
  ``kgtrace prove apply`` with them (maxplus), and ``kgtrace evaluate`` of its test split (every entity);
  the three processes' seconds together and the largest peak memory.
* ``mine``: ``kgtrace rules mine`` on the Hetionet-shaped graph.
* ``run``: ``kgtrace run`` on the Hetionet-shaped graph with Compound-treats-Disease held out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import processor_name

HERE = Path(__file__).resolve().parent
GRAPHS = HERE / "graphs"
WORK = HERE / "runs" / "scale"
KGTRACE = [sys.executable, "-m", "kgtrace"]
STEPS = ("prepare", "train", "train-chunked", "train-sampled", "train-sampled-adagrad", "train-sparse", "evaluate",
         "evaluate-compiled", "restrict", "tracin-last", "tracin-all", "explain", "explain-last", "explain-torchrun",
         "index", "explain-index", "rules", "mine", "run")
PAIRS = ("biolink:ChemicalEntity,biolink:Disease", "biolink:ChemicalEntity,biolink:Gene", "biolink:Gene,biolink:Gene",
         "biolink:Gene,biolink:Disease", "biolink:Gene,biolink:BiologicalProcessOrActivity",
         "biolink:Gene,biolink:AnatomicalEntity", "biolink:DiseaseOrPhenotypicFeature,biolink:DiseaseOrPhenotypicFeature",
         "biolink:ChemicalEntity,biolink:PhenotypicFeature", "biolink:ChemicalEntity,biolink:ChemicalEntity")
TARGETS = {  # what each step must reach on the 2-core CPU
    "prepare": "at least 300,000 edges/s, peak RSS under 4 GB",
    "train": "seconds per 1,000 steps measured; memory within 24 GB with Adam",
    "train-sampled": "seconds per 1,000 steps measured; memory within 24 GB with Adam",
    "train-sampled-adagrad": "seconds per 1,000 steps measured; memory within 24 GB",
    "train-sparse": "seconds per 1,000 steps measured; memory within 24 GB",
    "evaluate": "under 300 s for 10,000 test triples, within the memory budget",
    "restrict": "treats heads: the small molecules only; tails: the diseases only",
    "tracin-last": "under 900 s for 100 test triples over all training triples, 4 checkpoints; under 4 GB",
    "tracin-all": "measured, against its FLOP floor",
    "explain": "under 120 s",
    "explain-torchrun": "under 120 s (one process per core)",
    "index": "built (its time is paid once for every later query)",
    "explain-index": "under 120 s (approximate: projected gradients)",
    "explain-last": "under 120 s (TracIn over the last checkpoint only)",
    "rules": "learning plus ranking the test split within 900 s and 16 GB",
    "mine": "under 300 s and 8 GB",
    "run": "completes, with real drug and disease names in report.html",
}


def measure(command: list[str], timeout: float | None = None) -> dict:
    """Run ``command``; its wall seconds, peak RSS (GB, from its own wait4), exit status and output tail."""
    log = WORK / "step.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        while True:  # reaped here, not by Popen, so that wait4 reports this process's own peak
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if timeout is not None and time.perf_counter() - start > timeout:
                process.kill()
            time.sleep(0.2)
    seconds = time.perf_counter() - start
    return {"command": " ".join(map(str, command)), "seconds": round(seconds, 1),
            "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2), "returncode": os.waitstatus_to_exitcode(status),
            "output_tail": log.read_text()[-1500:]}


# ---------------------------------------------------------------- the steps


def step_prepare(args: argparse.Namespace) -> dict:
    graph = args.robokop
    command = [*KGTRACE, "prepare", "--nodes", graph / "nodes.jsonl", "--edges", graph / "edges.jsonl",
               "--out", args.work / "robokop-treats", "--overwrite", "--drop-predicate",
               "biolink:occurs_together_in_literature_with", "--split", "predicate", "--holdout-predicate",
               "biolink:treats", "--holdout-fraction", "0.16"]
    for pair in PAIRS:
        command += ["--category-pair", pair]
    result = measure(command)
    edges = sum(1 for _ in open(graph / "edges.jsonl", "rb"))
    return {**result, "edges": edges, "edges_per_s": round(edges / result["seconds"]),
            "met": result["returncode"] == 0 and edges / result["seconds"] >= 300_000 and result["peak_rss_gb"] < 4}


def train_config(args: argparse.Namespace, **changes) -> dict:
    return {"dataset": str(args.work / "robokop-treats"), "model": "conve", "epochs": 4, "batch_size": 128,
            "steps_per_epoch": args.steps, "checkpoint_every": 1, "eval_every": 0, "threads": args.threads,
            "device": args.device, "lr": 0.003, **changes}


SAMPLED = {"training": "negative-sampling", "negatives_tail": 256, "negatives_head": 256, "epochs": 2,
           "steps_per_epoch": 10}


#: Adagrad with negative sampling, dense or sparse (LibKGE's ConvE recipes use Adagrad).
ADAGRAD = {**SAMPLED, "optimizer": "adagrad", "lr": 0.1}


def step_train(args: argparse.Namespace, name: str = "conve", **changes) -> dict:
    """Train the run ``name`` with ``changes`` to :func:`train_config`'s settings; seconds per step, an epoch."""
    out = args.work / name
    config = train_config(args, **changes)
    result = measure([sys.executable, __file__, "--child", "train", json.dumps(config), str(out)])
    child = _child_json(result) | _child_json(measure([sys.executable, __file__, "--child", "flops", json.dumps(config),
                                                      str(out)]))
    seconds_per_step = child["seconds_per_step"]
    return {**result, **child, "seconds_per_1000_steps": round(1000 * seconds_per_step, 1),
            "epoch_hours": round(child["steps_per_full_epoch"] * seconds_per_step / 3600, 2),
            "met": result["returncode"] == 0 and result["peak_rss_gb"] < 24}


def step_evaluate(args: argparse.Namespace, restrict: bool = False, compiled: bool = False) -> dict:
    run = args.work / "conve"
    out = args.work / ("test-restricted.json" if restrict else "test-compiled.json" if compiled else "test-metrics.json")
    command = [*KGTRACE, "evaluate", run, "--memory-budget", args.memory_budget, "--device", args.device,
               "--out", out, "--compile" if compiled else "--no-compile"]
    # Every entity, or the categories of each relation (which ranks every entity too, for the unrestricted figures).
    result = measure(command + ["--restrict", "typed" if restrict else "none"])
    metrics = json.loads(out.read_text())
    queries = metrics["num_queries"]  # test triples, each ranked on both sides
    per_10k = result["seconds"] * 10_000 / queries
    return {**result, "test_triples": queries, "seconds_per_10000": round(per_10k, 1), "mrr": metrics["both"]["realistic"]["mrr"],
            "met": result["returncode"] == 0 and per_10k < 300}


def step_restrict(args: argparse.Namespace) -> dict:
    result = measure([sys.executable, __file__, "--child", "restrict", str(args.work / "robokop-treats")])
    child = _child_json(result)
    evaluated = step_evaluate(args, restrict=True)
    return {**result, **child, "restricted_evaluation": evaluated,
            "met": child["heads_exact"] and child["tails_exact"] and evaluated["returncode"] == 0}


def step_tracin_last(args: argparse.Namespace) -> dict:
    out = args.work / "tracin-last.json"
    result = measure([*KGTRACE, "explain", args.work / "conve", "--test", "100", "--params", "last",
                      "--checkpoints", "all", "--memory-budget", args.tracin_budget, "--device", args.device,
                      "--no-progress", "--out", out])
    return {**result, "met": result["returncode"] == 0 and result["seconds"] < 900 and result["peak_rss_gb"] < 4}


def step_tracin_all(args: argparse.Namespace) -> dict:
    result = measure([sys.executable, __file__, "--child", "tracin-all", str(args.work / "conve"), str(args.prefix),
                      args.device])
    child = _child_json(result)
    return {**result, **child, "met": result["returncode"] == 0}


def step_explain(args: argparse.Namespace, checkpoints: str = "all", index: bool = False,
                 processes: int = 1) -> dict:
    """``explain --predict`` for one drug: exact over ``checkpoints``, or answered from the projected index; with
    ``processes`` > 1 as that many torchrun processes of one thread each."""
    picked = _child_json(measure([sys.executable, __file__, "--child", "drug", str(args.work / "robokop-treats")]))
    source = ["--index", args.work / "tracin-index"] if index else ["--checkpoints", checkpoints]
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), "-m", "kgtrace"]
                if processes > 1 else KGTRACE)
    result = measure([*launcher, "explain", args.work / "conve", "--predict", picked["drug"], picked["treats"],
                      "--top-n", "10", *source, "--memory-budget", args.tracin_budget, "--device", args.device,
                      "--no-progress", "--out",
                      args.work / ("explain-predict-index.json" if index else "explain-predict.json")])
    return {**result, **picked, "met": result["returncode"] == 0 and result["seconds"] < 120}


def step_index(args: argparse.Namespace) -> dict:
    result = measure([*KGTRACE, "index", args.work / "conve", "--out", args.work / "tracin-index", "--dim",
                      str(args.index_dim), "--device", args.device, "--no-progress"])
    size = sum(f.stat().st_size for f in (args.work / "tracin-index").rglob("*") if f.is_file())
    return {**result, "dim": args.index_dim, "index_gb": round(size / 2**30, 1), "met": result["returncode"] == 0}


def step_rules(args: argparse.Namespace) -> dict:
    """Learn rules from the prepared graph, apply them, rank the test split: AnyBURL's path at the users' scale."""
    data, rules, run = args.work / "robokop-treats", args.work / "robokop.rules", args.work / "robokop-rules"
    out = args.work / "rules-test-metrics.json"
    parts = {
        "learn": measure([*KGTRACE, "rules", "learn", "--dataset", data, "--seconds", str(args.rules_seconds), "--out",
                          rules, "--overwrite"]),
        "apply": measure([*KGTRACE, "prove", "apply", "--dataset", data, "--rules", rules, "--out", run, "--overwrite"]),
        "evaluate": measure([*KGTRACE, "evaluate", run, "--restrict", "none", "--out", out]),
    }
    failed = [name for name, part in parts.items() if part["returncode"] != 0]
    if failed:
        return {**parts[failed[0]], "failed": failed[0], "met": False}
    metrics = json.loads(out.read_text())
    seconds = sum(part["seconds"] for part in parts.values())
    peak = max(part["peak_rss_gb"] for part in parts.values())
    return {"seconds": round(seconds, 1), "peak_rss_gb": peak, "returncode": 0,
            "parts": {name: {k: part[k] for k in ("command", "seconds", "peak_rss_gb")} for name, part in parts.items()},
            "rules": sum(1 for line in open(rules) if line.strip() and not line.startswith("#")),
            "test_triples": metrics["num_queries"], "mrr": metrics["both"]["realistic"]["mrr"],
            "hits_at_10": metrics["both"]["realistic"]["hits_at_10"], "met": seconds < 900 and peak < 16}


def hetionet_folder(args: argparse.Namespace) -> Path:
    """The Hetionet-shaped graph with Compound-treats-Disease held out (prepared once)."""
    folder = args.work / "hetionet-ctd"
    if not (folder / "train.txt").is_file():
        subprocess.run([*KGTRACE, "prepare", "--nodes", args.hetionet / "hetionet-v1.0-nodes.tsv", "--edges",
                        args.hetionet / "hetionet-v1.0-edges.sif.gz", "--out", folder, "--split", "predicate",
                        "--holdout-predicate", "CtD", "--holdout-fraction", "0.3"], check=True)
    return folder


def step_mine(args: argparse.Namespace) -> dict:
    """Chains as well (the default; stopped after ``--mine-timeout`` seconds), then implications and inverses only."""
    def mine(out: Path, *options: str, timeout: float | None = None) -> dict:
        result = measure([*KGTRACE, "rules", "mine", "--dataset", hetionet_folder(args), "--out", out, "--overwrite",
                          *options], timeout=timeout)
        done = result["returncode"] == 0
        return {**result, "rules": sum(1 for line in open(out) if line.strip() and not line.startswith("#")) if done else 0}

    chains = mine(args.work / "hetionet-rules-chains.tsv", timeout=args.mine_timeout)
    result = mine(args.work / "hetionet-rules.tsv", "--no-chains")
    return {**result, "with_chains": {key: chains[key] for key in ("seconds", "peak_rss_gb", "returncode", "rules")}
            | {"message": chains["output_tail"].strip().splitlines()[-1] if chains["returncode"] else ""},
            "met": chains["returncode"] == 0 and chains["seconds"] < 300 and chains["peak_rss_gb"] < 8}


def step_run(args: argparse.Namespace) -> dict:
    out = args.work / "hetionet-run"
    result = measure([*KGTRACE, "run", "--dataset", hetionet_folder(args), "--out", out, "--epochs", "2",
                      "--steps-per-epoch", str(args.steps), "--threads", str(args.threads), "--no-progress",
                      "--overwrite"])  # from scratch: a rerun would reuse every finished step
    report = (out / "report.html").read_text() if (out / "report.html").is_file() else ""
    names = _test_names(hetionet_folder(args))
    shown = sorted({name for name in names if name in report})
    return {**result, "test_names": len(names), "test_names_in_report": len(shown), "examples": shown[:8],
            "met": result["returncode"] == 0 and bool(shown) and "Compound treats Disease" in report}


def _test_names(folder: Path) -> set[str]:
    """The names of the compounds and diseases of the held-out Compound-treats-Disease triples."""
    names = dict(line.rstrip("\n").split("\t") for line in open(folder / "node_names.txt"))
    ends = (label for line in open(folder / "test.txt") for label in line.rstrip("\n").split("\t")[::2])
    return {names[label] for label in ends if label in names}


def _child_json(result: dict) -> dict:
    """The JSON line a child step printed last."""
    lines = [line for line in result["output_tail"].splitlines() if line.startswith("{")]
    if result["returncode"] != 0 or not lines:
        raise SystemExit(f"step failed ({result['returncode']}): {result['command']}\n{result['output_tail']}")
    return json.loads(lines[-1])


STEP_FUNCTIONS = {"prepare": step_prepare, "train": step_train,
                  "train-chunked": lambda a: step_train(a, "conve-chunked", entity_chunk=65536, epochs=1,
                                                        steps_per_epoch=10),
                  "train-sampled": lambda a: step_train(a, "conve-sampled", **SAMPLED),
                  "train-sampled-adagrad": lambda a: step_train(a, "conve-adagrad", **ADAGRAD),
                  "train-sparse": lambda a: step_train(a, "conve-sparse", **ADAGRAD, sparse=True),
                  "evaluate": step_evaluate, "evaluate-compiled": lambda a: step_evaluate(a, compiled=True),
                  "restrict": step_restrict, "tracin-last": step_tracin_last, "tracin-all": step_tracin_all,
                  "explain": step_explain, "explain-last": lambda a: step_explain(a, "4"),
                  "explain-torchrun": lambda a: step_explain(a, processes=os.cpu_count() or 1), "index": step_index,
                  "explain-index": lambda a: step_explain(a, index=True),
                  "rules": step_rules, "mine": step_mine, "run": step_run}


# ---------------------------------------------------------------- child processes (one step each, JSON out)


def child_train(config: str, out: str) -> dict:
    from kgtrace.core.config import TrainConfig
    from kgtrace.training.batches import Batches
    from kgtrace.training.loop import train

    settings = TrainConfig(**json.loads(config))
    train(settings, out, overwrite=True, progress=False, log=lambda *_: None)
    epochs = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    from kgtrace.runs.embedding import load_run

    run = load_run(out)
    queries = len(Batches.build(run.dataset.train, run.dataset.num_relations, settings.training))
    seconds = [e["seconds"] for e in epochs]
    steady = seconds[1:] or seconds  # the first epoch also pays for building the answer index
    return {"entities": run.dataset.num_entities, "train_triples": len(run.dataset.train),
            "steps_per_full_epoch": -(-queries // settings.batch_size), "epoch_seconds": seconds,
            "seconds_per_step": sum(steady) / (len(steady) * settings.steps_per_epoch),
            "parameters": sum(p.numel() for p in run.model.parameters())}


def child_flops(config: str, out: str) -> dict:
    """One training step's forward and backward FLOPs (torch's counter), for the plan."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from kgtrace.core.config import TrainConfig
    from kgtrace.runs.embedding import load_run
    from kgtrace.training.batches import Batches
    from kgtrace.training.step import batch_loss

    settings = TrainConfig(**json.loads(config))
    run = load_run(out)
    batches = Batches.build(run.dataset.train[:100_000], run.dataset.num_relations, settings.training)
    with FlopCounterMode(display=False) as counter:
        batch_loss(run.model.train(), batches, torch.arange(settings.batch_size), settings, torch.device("cpu")).backward()
    return {"flops_per_step": counter.get_total_flops()}


def child_restrict(folder: str) -> dict:
    import torch

    from kgtrace.data.dataset import load_dataset
    from kgtrace.evaluation.candidates import infer_restriction

    ds = load_dataset(folder)
    treats = next(label for label, text in ds.relation_names.items() if text == "biolink:treats")
    r = ds.relations.to_id[treats]
    restriction = infer_restriction(ds)
    allowed_tails = restriction.mask(torch.tensor([r]))[0].numpy()
    allowed_heads = restriction.mask(torch.tensor([r + ds.num_relations]))[0].numpy()

    def carrying(category: str):
        import numpy as np

        return np.array([category in ds.entity_categories.get(label, ()) for label in ds.entities.labels])

    molecules, diseases = carrying("biolink:SmallMolecule"), carrying("biolink:Disease")
    return {"relation": treats, "entities": ds.num_entities, "allowed_heads": int(allowed_heads.sum()),
            "small_molecules": int(molecules.sum()), "allowed_tails": int(allowed_tails.sum()),
            "diseases": int(diseases.sum()), "heads_exact": bool((allowed_heads == molecules).all()),
            "tails_exact": bool((allowed_tails == diseases).all())}


def child_drug(folder: str) -> dict:
    from kgtrace.data.dataset import load_dataset

    ds = load_dataset(folder)
    treats = next(label for label, text in ds.relation_names.items() if text == "biolink:treats")
    head = int(ds.test[0, 0])
    return {"drug": ds.entities.labels[head], "drug_name": ds.entity_name(ds.entities.labels[head]), "treats": treats}


def child_tracin_all(run_dir: str, prefix: str, device: str) -> dict:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from kgtrace.attribution.tracin import TracIn
    from kgtrace.runs.embedding import load_run

    device = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    run = load_run(run_dir)
    n_train, n_prefix = len(run.dataset.train), min(int(prefix), len(run.dataset.train))
    test = run.dataset.test[:100]
    tracin = TracIn(run, params="all", device=device, train_indices=torch.arange(n_prefix))
    start = time.perf_counter()
    tracin.top_k(test, k=10)
    seconds = time.perf_counter() - start
    # The floor: per training triple and checkpoint, one forward and backward pass of its score (torch's FLOP
    # counter over a batch): no exact TracIn can compute its gradients with less. The products with the test
    # gradients come on top (on factors: the fc layer's gradient is an outer product).
    model = run.model.to(device).train()
    batch = run.dataset.train[:256].to(device)
    with FlopCounterMode(display=False) as counter:
        model.score_hrt(batch).sum().backward()
    pass_flops = counter.get_total_flops() / len(batch)
    a = torch.randn(2048, 2048, device=device)
    a @ a  # warm-up
    start_mm = time.perf_counter()
    for _ in range(5):
        a @ a
    rate = 5 * 2 * 2048**3 / (time.perf_counter() - start_mm)
    checkpoints = len(tracin.checkpoints)
    floor = pass_flops * n_train * checkpoints / rate
    return {"prefix_triples": n_prefix, "prefix_seconds": round(seconds, 1), "checkpoints": checkpoints,
            "extrapolated_seconds": round(seconds * n_train / n_prefix, 1), "flops_per_triple": pass_flops,
            "matmul_gflops": round(rate / 1e9, 1), "floor_seconds": round(floor, 1),
            "times_floor": round(seconds * n_train / n_prefix / floor, 1)}


def table(results: dict) -> str:
    """The benchmarks page's Markdown table of a result file."""
    steps = results.get("steps", {})
    rows = ["| step | measured | peak RSS | target | met |", "|---|---|---|---|---|"]
    for name in STEPS:
        if name not in steps:
            continue
        r = steps[name]
        rows.append(f"| {name} | {_measured(name, r)} | {r['peak_rss_gb']:.1f} GB | {r['target']} | "
                    f"{'yes' if r['met'] else '**no**'} |")
    return "\n".join(rows)


def plan(results: dict, batch: int = 128, dim: int = 200) -> str:
    """Where one machine is not enough: an epoch here and per process, and ConvE's memory per process at 2M and 10M
    entities (weights, gradient and Adam's two moments of the entity table, the [batch, entities] scores and their
    gradient; with ``--sparse`` negative sampling, the table and Adagrad's sum of squares), as a Markdown table."""
    train = results.get("steps", {}).get("train")
    if not train:
        return ""
    steps, per_step = train["steps_per_full_epoch"], train["seconds_per_1000_steps"] / 1000
    epoch_flops = steps * train["flops_per_step"]
    rate = results["steps"].get("tracin-all", {}).get("matmul_gflops")
    floor = (f" (at this machine's measured {rate:.0f} GFLOP/s matmul rate: {epoch_flops / rate / 1e9 / 3600:.1f} h)"
             if rate else "")
    rows = [f"An epoch of the prepared graph is {steps:,} steps of {batch} queries: {steps * per_step / 3600:.1f} h "
            f"on this CPU; {train['flops_per_step'] / 1e9:,.0f} GFLOP a step, {epoch_flops / 1e15:,.1f} PFLOP an "
            f"epoch{floor}. A GPU's epoch is that over its measured matmul rate (`scale.py --device cuda` measures "
            "it where a GPU is lent). With `torchrun` on N machines each "
            "process takes 1/N of every batch but holds the whole model and all-reduces its dense gradient "
            f"({train['entities'] * dim * 4 / 2**30:.2f} GiB of entity table a step), so N machines cut the "
            "compute, not the memory per process: at 10M entities ConvE with Adam needs more than this machine's "
            "24 GB in every process; on one process, `--sparse` negative sampling with Adagrad holds the table and "
            "its sum of squares only (a sharded entity table would be the next step for `torchrun`).", "",
            "| entities | entity table | + gradient + Adam | scores and their gradient | per process | `--sparse`, "
            "Adagrad |", "|---|---|---|---|---|---|"]
    for entities in (2_000_000, 10_000_000):
        table_gb = entities * dim * 4 / 2**30
        scores_gb = 2 * batch * entities * 4 / 2**30
        rows.append(f"| {entities:,} | {table_gb:.1f} GiB | {4 * table_gb:.1f} GiB | {scores_gb:.1f} GiB "
                    f"(`--entity-chunk 65536`: {2 * batch * 65536 * 4 / 2**30:.2f} GiB) | {4 * table_gb + scores_gb:.1f} GiB "
                    f"| {2 * table_gb:.1f} GiB |")
    return "\n".join(rows)


def _measured(name: str, r: dict) -> str:
    """One cell: the step's figures that its target speaks of."""
    if name == "prepare":
        return f"{r['edges']:,} edges in {r['seconds']:.0f} s: {r['edges_per_s']:,} edges/s"
    if name.startswith("train"):
        return (f"{r['seconds_per_1000_steps']:,.0f} s per 1,000 steps ({r['entities']:,} entities, "
                f"{r['train_triples']:,} triples); an epoch of {r['steps_per_full_epoch']:,} steps: {r['epoch_hours']} h")
    if name.startswith("evaluate"):
        return f"{r['test_triples']:,} test triples in {r['seconds']:.0f} s ({r['seconds_per_10000']:.0f} s per 10,000)"
    if name == "mine":
        chains = r["with_chains"]
        done = (f"{chains['rules']} rules in {chains['seconds']:.0f} s, {chains['peak_rss_gb']} GB" if not chains["returncode"]
                else f"stopped after {chains['seconds']:.0f} s" if chains["returncode"] < 0 else "refused")
        return f"with chains: {done}; `--no-chains`: {r['rules']} rules in {r['seconds']:.0f} s"
    if name == "rules":
        parts = r["parts"]
        return (f"{r['rules']:,} rules; learned in {parts['learn']['seconds']:.0f} s, {r['test_triples']:,} test triples "
                f"ranked in {parts['apply']['seconds'] + parts['evaluate']['seconds']:.0f} s: {r['seconds']:.0f} s, "
                f"{r['peak_rss_gb']} GB; MRR {r['mrr']:.3f}, Hits@10 {r['hits_at_10']:.3f}")
    if name == "run":
        return (f"{r['seconds']:.0f} s; {r['test_names_in_report']} of the {r['test_names']} test compounds and "
                f"diseases named in report.html (e.g. {', '.join(r['examples'][:4])})")
    if name == "index":
        return f"{r['seconds']:.0f} s, {r['index_gb']} GB at dim {r['dim']}"
    if name == "restrict":
        return (f"heads {r['allowed_heads']:,} of {r['entities']:,} (small molecules: {r['small_molecules']:,}); "
                f"tails {r['allowed_tails']:,} (diseases: {r['diseases']:,})")
    if name == "tracin-all":
        return (f"{r['prefix_triples']:,} triples in {r['prefix_seconds']:.0f} s; all: {r['extrapolated_seconds'] / 3600:.1f} h, "
                f"{r['times_floor']}x its FLOP floor ({r['floor_seconds']:.0f} s at {r['matmul_gflops']} GFLOP/s)")
    return f"{r['seconds']:.0f} s"


CHILDREN = {"train": child_train, "flops": child_flops, "restrict": child_restrict, "drug": child_drug,
            "tracin-all": child_tracin_all}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", dest="step_names", default=",".join(STEPS), help="steps to run, comma-separated")
    parser.add_argument("--robokop", type=Path, default=GRAPHS / "robokop", help="make_graph.py robokop's folder")
    parser.add_argument("--hetionet", type=Path, default=GRAPHS / "hetionet", help="make_graph.py hetionet's folder")
    parser.add_argument("--work", type=Path, default=WORK, help="where runs and outputs go (not committed)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--train-steps", dest="steps", type=int, default=25,
                        help="optimizer steps per training epoch (4 epochs, a checkpoint each)")
    parser.add_argument("--prefix", type=int, default=20_000, help="tracin-all: training triples actually scored")
    parser.add_argument("--memory-budget", default="4GB", help="evaluate: kgtrace's --memory-budget")
    parser.add_argument("--tracin-budget", default="1GB",
                        help="tracin-last, explain: kgtrace explain's --memory-budget (checkpoint models held at once)")
    parser.add_argument("--mine-timeout", type=float, default=3600.0,
                        help="mine: seconds after which mining with chains is stopped (and reported so)")
    parser.add_argument("--rules-seconds", type=float, default=600.0, help="rules: seconds of rule learning")
    parser.add_argument("--index-dim", type=int, default=128, help="index: numbers per training gradient and checkpoint")
    parser.add_argument("--redo", action="store_true", help="run the named steps again even if done")
    parser.add_argument("--results", type=Path, default=None,
                        help="the result file to read and extend (default: benchmarks/results/scale-DEVICE.json)")
    parser.add_argument("--table", action="store_true", help="print the Markdown table of the result file and stop")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](*args.child[1:])))
        return
    import torch

    from kgtrace.core.io import atomic_write_text

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    out = args.results or HERE / "results" / f"scale-{device}.json"
    results = json.loads(out.read_text()) if out.is_file() else {}
    if args.table:
        print(table(results) + "\n\n" + plan(results))
        return
    results["machine"] = {"cpu": processor_name(), "cores": os.cpu_count(),
                          "torch": torch.__version__, "device": device}
    for name in [n.strip() for n in args.step_names.split(",") if n.strip()]:
        if name not in STEP_FUNCTIONS:
            raise SystemExit(f"unknown step {name!r}; steps: {', '.join(STEPS)}")
        if name in results.get("steps", {}) and not args.redo:
            continue
        result = STEP_FUNCTIONS[name](args)
        result["target"] = TARGETS.get(name.removesuffix("-chunked").removesuffix("-compiled"), "")
        results.setdefault("steps", {})[name] = result
        atomic_write_text(out, json.dumps(results, indent=1) + "\n")  # after every step: a kill loses only that step
        print(json.dumps({"step": name, **{k: v for k, v in result.items() if k != "output_tail"}}), flush=True)


if __name__ == "__main__":
    main()
