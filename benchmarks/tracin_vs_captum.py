"""TracIn on one ConvE run: kgtrace against Captum's TracInCPFast (and, optionally, TracInCP); print JSON.

One run, one model, the same epoch checkpoints (each weighed by its recorded lr) and data:
ConvE (dim 200, kgtrace's defaults) trained on --dataset (a registry name: umls by default,
fb15k237, ...) for --epochs epochs with a checkpoint every --checkpoint-every epochs (or an
existing run, --run DIR). Influence of all training triples on the first n test triples, n in
--n-test, loss l = softplus(-score) = BCE-with-logits against label 1, model in eval mode, both
tools on --device. Each (tool, n_test) cell runs in its own process at --threads threads, so
peak RSS is that cell's alone; a cell's seconds cover building the tool and computing the
[n_test, n_train] influence (not loading the run), the median of --repeats such processes (on a
shared 2-core machine single runs vary by +-30%); a cell past --cell-timeout seconds records a
timeout.

Cells:

* ours/last:    ``TracIn(run, params="last")`` (fc.weight, fc.bias, entity_bias; fast path).
* ours/fc.weight: ``params=["fc.weight"]``, the set Captum's TracInCPFast computes (see below).
* captum_fast:  ``captum.influence.TracInCPFast`` with ``final_fc_layer`` = ConvE's ``fc``.
* ours/fc:      ``params=["fc.weight", "fc.bias"]``, the set TracInCP(layers=["model.fc"]) computes.
* captum_cp:    ``captum.influence.TracInCP`` (per-example full gradients of fc), only
  with --with-tracincp and only for n_test=1: it is slow (an issue measured 344 s, 8.8 GB).
* ours/all:     ``params="all"`` (every parameter, exact factored path), unless --skip-all;
  compared in time with ours/last.
* captum_cp_all: ``captum.influence.TracInCP`` with ``layers=None``: per-example gradients of
  every parameter, the same quantity as ours/all (only with --with-tracincp-all). Over all of
  FB15k-237 it would take hours, so it runs on the first --cp-all-prefix training triples and on
  twice that many. Its seconds for the whole training set are extrapolated from those two runs:
  Captum's loop costs the same per training batch, so they are the larger run's seconds plus,
  for each triple it left out, the seconds a triple adds (the two runs' difference over their
  difference in triples). The cell keeps both measured runs (``prefix_runs``) beside
  ``seconds_extrapolated``; its peak RSS is the larger run's (it does not grow with the prefix:
  Captum holds one batch of gradients at a time). Its influences are compared with ours/all's
  first columns.
* ours/last-bf16, ours/all-bf16: the same with ``precision="bf16"`` (--with-bf16), compared
  with their fp32 cells (``max_rel_diff``) and in time.

How Captum sees ConvE. TracInCPFast's trick needs the *model output* to be the output of its
final nn.Linear: it takes x = that layer's input (a forward hook) and J = d loss / d model
output (``torch.autograd.functional.jacobian`` of the loss on the model's output), and per
checkpoint scores lr * <J, J'> * <x, x'>, i.e. exactly the inner product of the per-example
*weight* gradients J x^T. It has no bias term (captum 0.9.0, ``_influence_batch_tracincp_fast``),
so it is compared with our influence over ["fc.weight"] only. ConvE's score is not fc's
output (fc -> bn2 -> relu -> dot with the tail embedding + tail bias), so:

* ``CaptumConvE(hrt)`` returns fc's output z = fc(features(h, r)) [B, D] (so final_fc_layer
  is ``model.fc``) and remembers the batch's tails;
* ``ScoreLoss(z, label)`` finishes the score, relu(bn2(z)) . e_t + b_t, and returns
  BCE-with-logits against the label (1 for every triple) with the reduction Captum asks for
  ("sum" for TracInCPFast, "none" for TracInCP). d loss / dz is then exactly kgtrace's delta.

Eval semantics: ``CaptumConvE.train(mode)`` ignores ``mode`` and keeps every submodule in eval
mode (BatchNorm on running statistics, dropout off), whatever Captum calls; ``forward``
asserts it. The training set is a ``TensorDataset(hrt, ones)``; ``checkpoints_load_func``
loads our checkpoint file (``torch.load(weights_only=True)`` via kgtrace's loader) into the
wrapper and returns its lr.

Differences are reported against our influence over the same parameters:
``max_rel_diff`` = max |captum - ours| / max |ours|, and ``max_elementwise_rel_diff`` =
max |captum - ours| / |ours| over the entries with |ours| > 1e-3 max |ours|.

    python benchmarks/tracin_vs_captum.py [--run DIR] [--dataset umls] [--epochs 8] [--checkpoint-every 2]
        [--n-test 1,100] [--threads 1] [--repeats 5] [--device auto|cpu|cuda] [--with-tracincp] [--skip-all]
        [--with-bf16] [--with-tracincp-all [--cp-all-prefix 512]]
    python benchmarks/tracin_vs_captum.py --dataset fb15k237 --epochs 2 --checkpoint-every 1 --repeats 1

Needs Captum (``pip install captum==0.9.0`` beside kgtrace).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARAM_SETS = {"last": "last", "fc.weight": ["fc.weight"], "fc": ["fc.weight", "fc.bias"], "all": "all",
              "last-bf16": "last", "all-bf16": "all"}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def train_run(folder: Path, args: argparse.Namespace) -> None:
    import kgtrace

    config = kgtrace.TrainConfig(dataset=args.dataset, model="conve", model_args={"embedding_dim": 200},
                                 epochs=args.epochs, checkpoint_every=args.checkpoint_every, eval_every=0,
                                 seed=args.seed, threads=args.threads, device=args.device)
    kgtrace.train(config, folder, progress=False, log=lambda *_: None)


# --- Captum's view of ConvE ----------------------------------------------------------------------

def captum_classes():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class CaptumConvE(nn.Module):
        """ConvE cut at fc: forward(hrt [B, 3]) -> fc output [B, D]; always in eval mode."""

        def __init__(self, model: nn.Module):
            super().__init__()
            self.model = model.eval()
            self.tails = None

        def train(self, mode: bool = True):  # Captum may switch modes: keep eval semantics
            return super().train(False)

        def forward(self, hrt):
            assert not self.model.training, "CaptumConvE must stay in eval mode"
            self.tails = hrt[:, 2]
            return self.model.fc(self.model._features(hrt[:, :2]))

    class ScoreLoss(nn.Module):
        """Finish ConvE's score from fc's output z and return BCE-with-logits against the label."""

        def __init__(self, wrapper: CaptumConvE, reduction: str):
            super().__init__()
            self.wrapper = wrapper
            self.reduction = reduction

        def forward(self, z, label):
            m = self.wrapper.model
            y = m.bn2(z) if m.bn2 is not None else z  # eval: running statistics; output dropout is identity
            tails = self.wrapper.tails
            score = torch.linalg.vecdot(F.relu(y), m.entity_embeddings[tails]) + m.entity_bias[tails]
            return F.binary_cross_entropy_with_logits(score, label, reduction=self.reduction)

    return CaptumConvE, ScoreLoss


def captum_influence(run, test, kind: str, batch_size: int, device: str, train_limit: int | None = None):
    import copy

    import torch
    from captum.influence import TracInCP, TracInCPFast
    from torch.utils.data import TensorDataset

    from kgtrace.core.checkpoint import load_checkpoint

    CaptumConvE, ScoreLoss = captum_classes()
    wrapper = CaptumConvE(copy.deepcopy(run.model).to(device))
    lrs = {str(c.path): c.lr for c in run.checkpoints}

    def load(model, path):
        state = load_checkpoint(path)  # torch.load(weights_only=True)
        model.model.load_state_dict(state["model_state"])
        model.eval()
        assert float(state["lr"]) == lrs[str(path)]
        return float(state["lr"])

    train = run.dataset.train[:train_limit].to(device)
    data = TensorDataset(train, torch.ones(len(train), device=device))
    paths = [str(c.path) for c in run.checkpoints]
    if kind == "fast":
        tracin = TracInCPFast(wrapper, wrapper.model.fc, data, paths, checkpoints_load_func=load,
                              loss_fn=ScoreLoss(wrapper, "sum"), batch_size=batch_size)
    else:  # "cp": fc's weight and bias; "cp_all": every parameter (layers=None)
        tracin = TracInCP(wrapper, data, paths, checkpoints_load_func=load,
                          layers=["model.fc"] if kind == "cp" else None,
                          loss_fn=ScoreLoss(wrapper, "none"), batch_size=batch_size,
                          sample_wise_grads_per_batch=False)
    return tracin.influence((test.to(device), torch.ones(len(test), device=device)))


# --- one cell per process ---------------------------------------------------------------------------

def worker(args: argparse.Namespace) -> None:
    import torch

    import kgtrace
    from kgtrace.attribution import TracIn

    torch.set_num_threads(args.threads)
    run = kgtrace.load_run(args.run, "last")
    test = run.dataset.test[: args.n]
    start = time.perf_counter()
    if args.worker.startswith("ours:"):
        name = args.worker.split(":", 1)[1]
        tracin = TracIn(run, params=PARAM_SETS[name], precision="bf16" if name.endswith("-bf16") else "fp32",
                        device=args.device)
        scores = tracin.influence(test)
        path = tracin.path
    else:
        kind = args.worker.removeprefix("captum_")
        scores = captum_influence(run, test, kind, args.batch_size, args.device, args.train_limit)
        path = args.worker
    if args.device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    torch.save(scores.detach().float().cpu(), args.save)
    out = {"seconds": seconds, "peak_rss_mb": peak_rss_mb(), "path": path, "shape": list(scores.shape),
           "n_train": len(run.dataset.train)}
    if args.device == "cuda":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))


def cell(tool: str, n: int, args: argparse.Namespace, run: Path, scratch: Path) -> dict:
    """The median of --repeats runs of a cell, each in a fresh process (TracInCP: one run); peak RSS: the largest."""
    if tool == "captum_cp_all":
        return prefix_cell(tool, n, args, run, scratch)
    runs = []
    for _ in range(1 if tool == "captum_cp" else args.repeats):
        runs.append(one_cell(tool, n, args, run, scratch))
        if "error" in runs[-1]:
            return runs[-1]
    out = dict(runs[-1])
    out["seconds_runs"] = [r["seconds"] for r in runs]
    out["seconds"] = statistics.median(out["seconds_runs"])
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    return out


def prefix_cell(tool: str, n: int, args: argparse.Namespace, run: Path, scratch: Path) -> dict:
    """One run on the first --cp-all-prefix training triples and one on twice as many; seconds extrapolated.

    Captum's TracInCP costs the same for every training batch: the two runs give the seconds a
    training triple adds, and the whole training set costs the larger run plus the triples it
    left out at that rate.
    """
    small, large = args.cp_all_prefix, 2 * args.cp_all_prefix
    runs = [one_cell(tool, n, args, run, scratch, train_limit=small)]
    if "error" in runs[0]:
        return runs[0]
    if runs[0]["n_train"] < large:  # known from the first run: do not start the slow second one
        return {"error": f"fewer than {large} training triples: lower --cp-all-prefix"}
    runs.append(one_cell(tool, n, args, run, scratch, train_limit=large))
    if "error" in runs[1]:
        return runs[1]
    per_triple = (runs[1]["seconds"] - runs[0]["seconds"]) / (large - small)
    n_train = runs[1]["n_train"]
    return {"seconds_extrapolated": runs[1]["seconds"] + per_triple * (n_train - large),
            "seconds_per_train_triple": per_triple, "peak_rss_mb": max(r["peak_rss_mb"] for r in runs), "path": tool,
            "prefix_runs": [{"train_triples": limit, "seconds": r["seconds"]} for limit, r in zip((small, large), runs)],
            "shape": runs[1]["shape"], "scores_file": runs[1]["scores_file"]}


def one_cell(tool: str, n: int, args: argparse.Namespace, run: Path, scratch: Path,
             train_limit: int | None = None) -> dict:
    save = scratch / f"{tool.replace(':', '_')}_{n}_{train_limit or 'all'}.pt"
    batch = {"captum_cp": args.cp_batch_size, "captum_cp_all": args.cp_all_batch_size}.get(tool, args.batch_size)
    cmd = [sys.executable, __file__, "--worker", tool, "--run", str(run), "--n", str(n),
           "--threads", str(args.threads), "--batch-size", str(batch), "--save", str(save), "--device", args.device]
    if train_limit is not None:
        cmd += ["--train-limit", str(train_limit)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.cell_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.cell_timeout} s"}
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["scores_file"] = str(save)
    return out


def differences(theirs: Path, ours: Path, columns: int | None = None) -> dict:
    """How far their influences are from ours; ``columns``: they ran on that many first training triples only."""
    import torch

    a, b = torch.load(theirs, weights_only=True).double(), torch.load(ours, weights_only=True).double()
    b = b[:, :columns]  # columns=None: all of them
    if a.shape != b.shape:
        return {"max_rel_diff": None, "shape_mismatch": [list(a.shape), list(b.shape)]}
    diff = (a - b).abs()
    scale = b.abs().max().clamp_min(1e-300)
    big = b.abs() > 1e-3 * scale
    return {"max_rel_diff": float(diff.max() / scale),
            "max_elementwise_rel_diff": float((diff[big] / b.abs()[big]).max()) if big.any() else None}


def tools_for(n: int, args: argparse.Namespace) -> list[str]:
    tools = ["ours:last", "ours:fc.weight", "captum_fast"]
    if args.with_tracincp and n == 1:
        tools += ["ours:fc", "captum_cp"]
    if not args.skip_all:
        tools.append("ours:all")
        if args.with_tracincp_all:
            tools.append("captum_cp_all")
    if args.with_bf16:
        tools += ["ours:last-bf16"] + ([] if args.skip_all else ["ours:all-bf16"])
    return tools


def compare(row: dict) -> None:
    """Add differences and ratios to ``row`` for every pair of cells that both succeeded."""
    ok = {name: value for name, value in row.items() if isinstance(value, dict) and "error" not in value}
    for theirs, ours in (("captum_fast", "ours:fc.weight"), ("captum_cp", "ours:fc"), ("captum_cp_all", "ours:all"),
                         ("ours:last-bf16", "ours:last"), ("ours:all-bf16", "ours:all")):
        t, o = ok.get(theirs), ok.get(ours)
        if t and o:
            prefix = t["prefix_runs"][-1]["train_triples"] if "prefix_runs" in t else None
            t.update(differences(Path(t["scores_file"]), Path(o["scores_file"]), prefix))
            t["compared_with"] = ours
            row[f"seconds_ratio_{theirs}_over_{ours}"] = t.get("seconds_extrapolated", t.get("seconds")) / o["seconds"]
            row[f"peak_rss_ratio_{theirs}_over_{ours}"] = t["peak_rss_mb"] / o["peak_rss_mb"]
    for theirs in ("captum_fast", "captum_cp"):  # Captum against our usual parameter sets, in time and memory
        for ours in ("ours:last", "ours:all"):
            t, o = ok.get(theirs), ok.get(ours)
            if t and o:
                row[f"seconds_ratio_{theirs}_over_{ours}"] = t["seconds"] / o["seconds"]
                row[f"peak_rss_ratio_{theirs}_over_{ours}"] = t["peak_rss_mb"] / o["peak_rss_mb"]
    if "ours:all" in ok and "ours:last" in ok:
        row["seconds_ratio_ours:all_over_ours:last"] = ok["ours:all"]["seconds"] / ok["ours:last"]["seconds"]
    for value in row.values():
        if isinstance(value, dict):
            value.pop("scores_file", None)


def prepare_run(args: argparse.Namespace, scratch: Path) -> tuple[Path, float | None]:
    """The run folder (--run, or one trained into ``scratch``) and the seconds its training took (None: given)."""
    if args.run:
        return Path(args.run), None
    run = scratch / "run"
    start = time.perf_counter()
    train_run(run, args)
    trained = time.perf_counter() - start
    print(json.dumps({"trained": str(run), "seconds": trained}), file=sys.stderr)
    return run, trained


def describe(run: Path, trained: float | None, args: argparse.Namespace) -> dict:
    import kgtrace

    info = kgtrace.load_run(run, "last")
    return {"run": str(args.run) if args.run else "temporary", "dataset": info.config.dataset,
            "model": info.config.model, "model_args": info.config.model_args,
            "epochs": info.config.epochs, "steps": last_step(run), "training_seconds": trained,
            "n_train": len(info.dataset.train), "n_test_available": len(info.dataset.test),
            "checkpoints": [{"epoch": c.epoch, "lr": c.lr} for c in info.checkpoints],
            "device": args.device, "threads": args.threads, "repeats": args.repeats,
            "captum_fast_batch_size": args.batch_size, "captum_cp_batch_size": args.cp_batch_size,
            "captum_cp_all_batch_size": args.cp_all_batch_size, "captum_cp_all_prefix": args.cp_all_prefix}


def last_step(run: Path) -> int | None:
    """The optimizer steps the run took (its metrics.jsonl's last record), None if unknown."""
    lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").is_file() else []
    return json.loads(lines[-1]).get("step") if lines else None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="an existing kgtrace ConvE run folder (default: train one into a temp folder)")
    parser.add_argument("--dataset", default="umls", help="what the run is trained on when no --run is given")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-test", default="1,100", help="numbers of test triples (first n of the test split)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs per cell, each in a fresh process; seconds are their median (TracInCP: one run)")
    parser.add_argument("--batch-size", type=int, default=4096, help="TracInCPFast's training batch size")
    parser.add_argument("--cp-batch-size", type=int, default=128,
                        help="TracInCP's training batch size (it holds batch x |fc| per-example gradients)")
    parser.add_argument("--with-tracincp", action="store_true", help="also Captum TracInCP, n_test=1 only (slow)")
    parser.add_argument("--skip-all", action="store_true", help='skip our params="all" cells')
    parser.add_argument("--with-tracincp-all", action="store_true",
                        help="also Captum TracInCP over every parameter, timed on two training prefixes (slow)")
    parser.add_argument("--cp-all-prefix", type=int, default=512,
                        help="training triples of the smaller TracInCP-all run (the larger has twice as many)")
    parser.add_argument("--cp-all-batch-size", type=int, default=16,
                        help="TracInCP-all's training batch size (it holds batch x |every parameter| gradients)")
    parser.add_argument("--with-bf16", action="store_true", help="also our bf16 cells, compared with fp32")
    parser.add_argument("--cell-timeout", type=int, default=3600, help="seconds before a cell is abandoned")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    parser.add_argument("--train-limit", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        return worker(args)
    from kgtrace.compute.system import resolve_device

    args.device = resolve_device(args.device).type
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        run, trained = prepare_run(args, scratch)
        setup = describe(run, trained, args)
        results = []
        for n in (int(x) for x in args.n_test.split(",")):
            row = {"n_test": n}
            for tool in tools_for(n, args):
                row[tool] = cell(tool, n, args, run, scratch)
                print(json.dumps({"n_test": n, tool: row[tool]}), file=sys.stderr)
            compare(row)
            results.append(row)
    print(json.dumps({"benchmark": "tracin_vs_captum", "setup": setup, "results": results}, indent=2))


if __name__ == "__main__":
    main()
