"""kgtrace's attribution methods against dattri's on the linear datamodeling score (LDS); prints JSON.

The LDS (Park et al., TRAK 2023; the dattri benchmark, NeurIPS 2024) asks how well a method's
attributions predict retrained models. M models are trained from scratch on random subsets
(each a fraction alpha of the training triples); for each explained test prediction z,

    LDS(z) = Spearman over m of ( f_m(z), sum_{j in subset m} tau(z, j) )

with f_m(z) the subset model's output on z: its score (a logit) and the log-probability of the
true tail among all tails. A method's LDS is the mean over predictions, with a bootstrap interval.

For each dataset x model: train (or reuse) a small base run, run kgtrace's LDS check on it
(``kgtrace.faithfulness.lds.check_lds``: it trains the M subset models, resumably, and scores
kgtrace's methods), then compute each dattri 0.3.0 attributor's [N, n_train] matrix on the same
run and predictions and score it on the same subsets and the same retrained outputs
(``load_lds_inputs``, ``lds_scores``, ``summarize_lds``). Each dattri attributor runs in a
fresh process (its own peak memory; on the CPU its address space is capped by --peer-memory,
so that an attributor that needs more fails with an allocation error, recorded, instead of
meeting the out-of-memory killer); where one cannot handle a model (embedding tables, no
Linear layer), its error is recorded in the JSON.

Each row of the JSON (per dataset x model x method): ``score`` and ``log_prob``, each with the
mean LDS, its bootstrap interval (low, high) and n, the predictions with a defined LDS; ``seconds``
computing the attributions; for dattri also ``peak_mb`` (the peak resident memory of its process
during the attribution, CUDA's allocated peak on a GPU), ``added_mb`` (above what the process
held before: torch and the loaded run), ``settings``, and where it failed ``error`` (type and
message), ``where`` (the dattri line that raised it), ``why`` and ``warnings`` (what dattri
warned or logged); ``not_run`` where this benchmark did not start it (memory, see --explicit-limit).

    python benchmarks/lds.py [--datasets umls,nations,kinships] [--models distmult,complex,conve]
        [--subsets 50] [--fraction 0.5] [--predictions 50] [--jobs 2] [--threads 1]
        [--device auto|cpu|cuda] [--out /tmp/lds-bench] [--peers dattri] [--dattri-methods tracin,if-cg,...]

Needs ``pip install dattri==0.3.0`` for --peers dattri (``--peers ''`` runs kgtrace alone).
Everything lands in --out: base runs, their ``faithfulness/`` folder (subset trainings, kgtrace's
attribution matrices, lds.json) and ``faithfulness/peers/`` (dattri's matrices, reused on a rerun).

How kgtrace's models become a dattri task (``dattri_task``): a training example is a triple
(h, r, t); the data loaders yield (triples [B, 3], zeros [B]) and the label is ignored. The
module dattri differentiates is ``Scorer``, whose forward is the model's ``score_hrt``; its
parameters are every trainable parameter of the model (prefixed ``model.``), in eval mode.
The loss, for TracIn and the influence functions, is kgtrace TracIn's per-triple loss
softplus(-score), BCE-with-logits against label 1, averaged over the batch (so dattri's
Hessian is that of the mean loss over the training triples: the positive triples alone, not
the run's KvsAll objective over all tails, which kgtrace's ``influence`` uses). TRAK's
"loss" is its model output f = log(p / (1 - p)) = score for p = sigmoid(score), with
p as the correct-class probability, as dattri's TRAK examples write f for classifiers.
dattri's hook-based LoGra takes its test gradients from cross_entropy(model(x), y) whatever the
task says, so it gets ``BinaryLogits`` (logits (0, score), class 1: the same softplus(-score)).

Sign: dattri's TracIn and influence functions return  g_train . (H^-1) g_test  with g the
gradients of the loss (dattri negates nothing). A gradient step on a training triple moves
the weights by -lr g_train and the test loss by -lr g_train . g_test; upweighting it moves
them by -eps H^-1 g_train and the test loss by -eps g_test . H^-1 g_train. So a positive
dattri value means the training triple *lowers* the prediction's loss, i.e. raises its
score: a proponent, kgtrace's sign. dattri's TRAK differentiates f = score directly and
returns phi_test (Phi'Phi)^-1 phi_train (1 - p_train): positive raises the score, too. No
dattri matrix is negated; dattri's [n_train, N] result is only transposed to kgtrace's [N, n_train].
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import resource
import sys
import tempfile
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import base_run, resolved
from torch import Tensor, nn

# Small models and few epochs, as in benchmarks/faithfulness.py: a subset training takes seconds on one core.
MODELS = {
    "distmult": {"model_args": {"embedding_dim": 64}, "epochs": 40, "lr": 0.01},
    "complex": {"model_args": {"embedding_dim": 32}, "epochs": 40, "lr": 0.01},  # 64 reals
    "conve": {"model_args": {"embedding_dim": 32, "embedding_height": 4, "output_channels": 8}, "epochs": 20,
              "lr": 0.003},
    "transe": {"model_args": {"embedding_dim": 64}, "epochs": 40, "lr": 0.01},
    "rotate": {"model_args": {"embedding_dim": 32, "margin": 6.0}, "epochs": 40, "lr": 0.01},  # 64 reals
    "tucker": {"model_args": {"embedding_dim": 32, "relation_dim": 16}, "epochs": 40, "lr": 0.01},
    "rescal": {"model_args": {"embedding_dim": 16}, "epochs": 40, "lr": 0.01},  # a 16 x 16 matrix per relation
}
OUTPUTS = ("score", "log_prob")
# dattri attributors tried (--dattri-methods); what each is, in dattri_attributor.
DATTRI_METHODS = ("tracin", "grad-dot", "grad-cos", "tracin-proj", "if-explicit", "if-cg", "if-lissa", "if-datainf",
                  "if-arnoldi", "if-ekfac", "trak", "trak-exact", "logra")
# dattri attributors not tried, and why.
DATTRI_NOT_RUN = {
    "DVEmbAttributor": "records per-step gradients during training (it is trained alongside the model), "
                       "not a post-hoc attributor of a finished run",
    "RPSAttributor": "needs a final Linear layer producing the logits; no kgtrace model ends in one "
                     "(the score is a product with the entity embeddings)",
    "KNNShapleyAttributor": "a data valuation over a feature-space KNN classifier, not an attribution to "
                            "one prediction of the model",
    "FactGraSSAttributor, BlockProjectedIFAttributor": "the same hook machinery as LoGraAttributor (Linear layers "
                                                       "only); logra stands for them",
}
# if-explicit forms the Hessian with torch.func.hessian over the whole training set at once: its
# memory grows with parameters x training triples (measured on the CPU at 4416 x 1592 = 7.0e6,
# Nations: 18 GB peak for DistMult dim 64, 19.6 GB for ComplEx). Beyond --explicit-limit this
# benchmark does not start it (the default keeps it near 10 GB; raise it on a larger machine).
EXPLICIT_LIMIT = 4e6


class NotRun(Exception):
    """This benchmark's own refusal to start a dattri attributor (reported as not_run, not as dattri's error)."""


# ----------------------------------------------------------------------------- runs and kgtrace's LDS


def kgtrace_lds(run: Path, args: argparse.Namespace) -> tuple[object, float]:
    """kgtrace's LDS check on ``run`` (trains the subset models, scores kgtrace's methods) and its wall seconds."""
    from kgtrace.faithfulness.lds import LdsSettings, check_lds

    settings = LdsSettings(subsets=args.subsets, fraction=args.fraction, sample=args.predictions, seed=0,
                           bootstrap=args.bootstrap, damping=args.damping, trak_dim=args.kgtrace_trak_dim,
                           jobs=args.jobs, threads=args.threads, device=args.device.type,
                           **({"methods": args.methods} if args.methods else {}))
    start = time.perf_counter()
    summary = check_lds(run, run / "faithfulness", settings, progress=not args.no_progress,
                        log=lambda text: print(f"{run.name}: {text}", file=sys.stderr))
    return summary, time.perf_counter() - start


def scored(values: np.ndarray, bootstrap: int) -> dict:
    """One output's LDS of one method: mean, bootstrap interval, how many predictions had a defined LDS."""
    from kgtrace.faithfulness.lds import summarize_lds

    mean, low, high = summarize_lds(values, bootstrap=bootstrap, seed=0)
    return {"lds": round(mean, 4), "low": round(low, 4), "high": round(high, 4), "n": int((~np.isnan(values)).sum())}


def lds_row(matrix: np.ndarray, inputs, bootstrap: int) -> dict:
    """LDS per output of an attribution matrix [N, n_train] on the check's subsets and retrained outputs."""
    from kgtrace.faithfulness.lds import lds_scores

    values = {output: lds_scores(inputs.outputs[output], inputs.masks, matrix) for output in OUTPUTS}
    return {**{output: scored(values[output], bootstrap) for output in OUTPUTS},
            "per_prediction": [None if np.isnan(v) else round(float(v), 4) for v in values["score"]]}


# ----------------------------------------------------------------------------- kgtrace models as dattri tasks


class Scorer(nn.Module):
    """What dattri differentiates: forward is the kgtrace model's ``score_hrt`` of triples [B, 3] (any float/int)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, triples: Tensor) -> Tensor:
        # dattri's LiSSA casts the sampled data to float; vmapped samples come as [3] or [1, 3].
        return self.model.score_hrt(triples.reshape(-1, 3).long())


class BinaryLogits(Scorer):
    """For dattri's hook-based attributors, whose test side takes cross_entropy(model(x), y) whatever the task's
    loss: logits [B, 2] = (0, score), so that class 1 (a true triple) costs softplus(-score), kgtrace's loss."""

    def forward(self, triples: Tensor) -> Tensor:
        score = super().forward(triples)
        return torch.stack([torch.zeros_like(score), score], dim=1)


def triple_loader(triples: Tensor, batch_size: int, classes: bool = False):
    """A dattri data loader: unshuffled batches of (triples [B, 3], labels [B]): zeros, ignored by the
    losses here; with ``classes``, class 1 (long), for BinaryLogits' cross-entropy."""
    from torch.utils.data import DataLoader, TensorDataset

    labels = torch.ones(len(triples), dtype=torch.long) if classes else torch.zeros(len(triples))
    data = TensorDataset(triples.long(), labels)
    return DataLoader(data, batch_size=max(1, min(batch_size, len(triples))), shuffle=False)


def dattri_task(run, scorer: Scorer, checkpoints: list, target: str = "loss"):
    """A dattri AttributionTask over the kgtrace run's ``checkpoints`` (CheckpointInfo list).

    target "loss": softplus(-score) averaged over the batch (TracIn, influence functions);
    "score": the score itself, TRAK's model output f = log(p / (1 - p)) with p = sigmoid(score);
    "module": the cross-entropy of BinaryLogits against class 1, i.e. softplus(-score), summed over the
    batch and called as loss(model, batch, device): the form of dattri's hook-based attributors
    (LoGra), which backpropagate through the module (``scorer`` must then be a BinaryLogits).
    """
    from dattri.task import AttributionTask
    from torch.func import functional_call

    from kgtrace.core.checkpoint import load_checkpoint

    def loss(params: dict, data: tuple) -> Tensor:
        triples, _ = data
        scores = functional_call(scorer, params, (triples,))
        return (F.softplus(-scores) if target == "loss" else scores).mean()

    def module_loss(model: nn.Module, batch: tuple, device: str) -> Tensor:
        return F.cross_entropy(model(batch[0].to(device)), batch[1].to(device), reduction="sum")

    def load(model: Scorer, info) -> Scorer:  # kgtrace's checkpoint files: weights only
        device = next(model.parameters()).device
        model.model.load_state_dict(load_checkpoint(info.path, map_location=device)["model_state"])
        return model.eval()

    return AttributionTask(loss_func=module_loss if target == "module" else loss, model=scorer,
                           checkpoints=list(checkpoints), checkpoints_load_func=load)


def correct_probability(scorer: Scorer):
    """TRAK's p(z) = sigmoid(score(z)) of one sample, functional in the (unflattened) parameters."""
    from torch.func import functional_call

    def p(params: dict, data: tuple) -> Tensor:
        return torch.sigmoid(functional_call(scorer, params, (data[0],))).sum()
    return p


def dattri_attributor(method: str, run, scorer: Scorer, args: argparse.Namespace, device: str, scratch: str):
    """(attributor, the settings used) for one of DATTRI_METHODS (module doc).

    tracin: TracInCP over every checkpoint weighed by its lr, exact gradients (dattri projects
    to 512 dimensions unless told otherwise: proj_type "identity" keeps them); grad-dot and
    grad-cos: the final checkpoint, weight 1, raw or normalised gradients; tracin-proj: tracin
    with dattri's default projection (512, Gaussian). The influence functions: the final
    checkpoint, damping --damping, the Hessian of the mean loss over the training triples.
    trak: every checkpoint as the ensemble, projection --trak-dim; trak-exact: the same without a
    projection (dattri's identity projector), as kgtrace's trak by default. logra: the
    final checkpoint, dattri's defaults, its files in ``scratch`` (else the working directory,
    where the next run would take them up as its own).
    """
    from dattri import algorithm as da

    final = [run.checkpoints[-1]]
    everything = list(run.checkpoints)
    n_params = sum(p.numel() for p in scorer.parameters() if p.requires_grad)
    identity = {"proj_type": "identity", "proj_dim": -1, "proj_max_batch_size": 32, "proj_seed": 0, "device": device}
    damping = args.damping
    if method == "tracin":
        lrs = torch.tensor([c.lr for c in everything])
        return (da.TracInAttributor(dattri_task(run, scorer, everything), lrs, normalized_grad=False,
                                    projector_kwargs=identity, device=device),
                {"checkpoints": len(everything), "weights": "lr", "projection": "none"})
    if method in ("grad-dot", "grad-cos"):
        return (da.TracInAttributor(dattri_task(run, scorer, final), torch.ones(1), normalized_grad=method == "grad-cos",
                                    projector_kwargs=identity, device=device),
                {"checkpoints": 1, "weights": 1, "projection": "none"})
    if method == "tracin-proj":
        default = {"proj_type": "normal", "proj_dim": 512, "proj_max_batch_size": 32, "proj_seed": 0, "device": device}
        lrs = torch.tensor([c.lr for c in everything])
        return (da.TracInAttributor(dattri_task(run, scorer, everything), lrs, normalized_grad=False,
                                    projector_kwargs=default, device=device),
                {"checkpoints": len(everything), "weights": "lr", "projection": "normal, 512"})
    task = dattri_task(run, scorer, final)
    if method == "if-explicit":
        size = n_params * len(run.dataset.train)
        if size > args.explicit_limit:
            raise NotRun(f"the explicit Hessian of {n_params} parameters over {len(run.dataset.train)} training "
                         f"triples ({size:.2g} > --explicit-limit {args.explicit_limit:.2g}; see EXPLICIT_LIMIT)")
        return da.IFAttributorExplicit(task, device=device, regularization=damping), {"regularization": damping}
    if method == "if-cg":
        return (da.IFAttributorCG(task, device=device, regularization=damping, max_iter=args.cg_iterations),
                {"regularization": damping, "max_iter": args.cg_iterations})
    if method == "if-lissa":
        return (da.IFAttributorLiSSA(task, device=device, damping=damping, recursion_depth=args.lissa_depth),
                {"damping": damping, "recursion_depth": args.lissa_depth, "scaling": 50.0, "batch_size": 1})
    if method == "if-datainf":
        return da.IFAttributorDataInf(task, device=device, regularization=damping), {"regularization": damping}
    if method == "if-arnoldi":
        return (da.IFAttributorArnoldi(task, device=device, regularization=damping, proj_dim=100, max_iter=100),
                {"regularization": damping, "proj_dim": 100, "max_iter": 100})
    if method == "if-ekfac":
        return da.IFAttributorEKFAC(task, device=device, damping=damping), {"damping": damping}
    if method == "trak":
        projection = {"proj_type": "normal", "proj_dim": args.trak_dim, "proj_max_batch_size": 32, "proj_seed": 0,
                      "device": device}
        return (da.TRAKAttributor(dattri_task(run, scorer, everything, target="score"), correct_probability(scorer),
                                  projector_kwargs=projection, device=device, regularization=args.trak_ridge),
                {"checkpoints": len(everything), "proj_dim": args.trak_dim, "regularization": args.trak_ridge})
    if method == "trak-exact":
        return (da.TRAKAttributor(dattri_task(run, scorer, everything, target="score"), correct_probability(scorer),
                                  projector_kwargs=identity, device=device, regularization=args.trak_ridge),
                {"checkpoints": len(everything), "projection": "none", "regularization": args.trak_ridge})
    if method == "logra":
        logits = BinaryLogits(scorer.model)
        return (da.LoGraAttributor(dattri_task(run, logits, final, target="module"), device=device, offload="none",
                                   cache_dir=scratch),
                {"proj_dim": 4096, "layers": "every torch.nn.Linear (dattri's default)"})
    raise ValueError(f"unknown dattri method {method!r}; choose from {', '.join(DATTRI_METHODS)}")


def dattri_matrix(method: str, run_dir: str, predictions: Tensor, args: argparse.Namespace, device: str) -> dict:
    """One dattri attributor's [N, n_train] float64 matrix, seconds and peak memory, or its error (in a child process)."""
    from kgtrace.runs.embedding import load_run

    torch.set_num_threads(args.threads)
    if device == "cpu" and args.peer_memory > 0:
        # An allocation past the cap raises (recorded as the attributor's error) instead of the kernel's
        # out-of-memory killer ending this process or, on a shared machine, someone else's.
        cap = int(args.peer_memory * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    run = load_run(run_dir, "last", device=device)
    scorer = Scorer(run.model).to(device).eval()
    before = _reset_peak(device)
    start = time.perf_counter()
    logged = _LogRecords()
    logging.getLogger("dattri").addHandler(logged)
    with warnings.catch_warnings(record=True) as caught, tempfile.TemporaryDirectory(prefix="dattri-") as scratch:
        warnings.simplefilter("always")
        try:
            attributor, used = dattri_attributor(method, run, scorer, args, device, scratch)
            matrix = attribute(method, attributor, run.dataset.train, predictions, args.dattri_batch,
                               args.dattri_test_batch)
        except NotRun as e:
            return {"not_run": str(e)}
        except Exception as e:  # noqa: BLE001 - a peer's failure is a result to report
            return {"error": f"{type(e).__name__}: {e}".strip()[:2000], "where": _where(e), **_why(method, run.model),
                    "seconds": round(time.perf_counter() - start, 2), **_warned(caught, logged)}
    seconds = time.perf_counter() - start
    peak = _peak_mb(device)
    result = {"matrix": matrix, "seconds": round(seconds, 2), "peak_mb": round(peak, 1),
              "added_mb": round(peak - before, 1), "settings": used, **_warned(caught, logged)}
    bad = int((~torch.isfinite(matrix)).sum())
    if bad:
        result["error"] = f"non-finite result: {bad} of {matrix.numel()} entries are NaN or inf"
    elif not matrix.any():
        result.update({"error": "every attribution is 0 (see its warnings)", **_why(method, run.model)})
    return result


def _why(method: str, model: nn.Module) -> dict:
    """The likely reason a Linear-layer-only dattri attributor failed on ``model``, if it is that."""
    if method in ("if-ekfac", "logra") and not any(isinstance(m, nn.Linear) for m in model.modules()):
        return {"why": f"{type(model).__name__} has no torch.nn.Linear module; dattri's {method} covers Linear "
                       "layers only (its default layer choice), not embedding tables"}
    return {}


def attribute(method: str, attributor, train: Tensor, predictions: Tensor, batch: int, test_batch: int) -> Tensor:
    """Run a dattri attributor: cache the training set where it precomputes, then attribute; [N, n_train] float64.

    Batches of ``batch`` training triples, but where a batch changes the result or its cost: the
    Hessian-based ones (if-explicit, if-cg, if-lissa) add up the inverse-Hessian products of the
    cached loader's batches (sum_b H_b^-1 v, not H^-1 v), so they cache the whole training set as
    one batch; and if-explicit forms its Hessian again for every pair of batches it attributes,
    so it takes all training triples and all predictions at once (the other two redo only their
    cheaper solves per batch). Predictions go ``test_batch`` at a time: the influence functions
    solve for a test batch's vectors at once (vmapped), and their memory grows with it.
    """
    hessian = method in ("if-explicit", "if-cg", "if-lissa")
    classes = method == "logra"
    cache_loader = triple_loader(train, len(train) if hessian else batch, classes)
    train_loader = triple_loader(train, len(train) if method == "if-explicit" else batch, classes)
    test_loader = triple_loader(predictions, len(predictions) if method == "if-explicit" else test_batch, classes)
    if method not in ("tracin", "grad-dot", "grad-cos", "tracin-proj"):  # TracIn has nothing to cache
        attributor.cache(cache_loader)
    if method in ("trak", "trak-exact"):  # TRAK attributes the training set it cached
        scores = attributor.attribute(test_dataloader=test_loader)
    else:
        scores = attributor.attribute(train_loader, test_loader)
    return scores.detach().double().cpu().T.contiguous()  # dattri's [n_train, N] -> kgtrace's [N, n_train]


class _LogRecords(logging.Handler):
    """Keeps what dattri logs at WARNING or above (LoGra reports its failures only there)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _warned(caught: list, logged: _LogRecords) -> dict:
    """The distinct warnings a dattri attributor raised or logged (e.g. Arnoldi's negative eigenvalues), if any."""
    texts = [str(w.message) for w in caught if not issubclass(w.category, (DeprecationWarning, FutureWarning))]
    texts = list(dict.fromkeys(" ".join(t.split())[:300] for t in texts + logged.messages))
    return {"warnings": texts} if texts else {}


def _reset_peak(device: str) -> float:
    """Start measuring this process's peak memory afresh; returns the memory in use now, in MB."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    try:  # Linux: "5" resets the peak resident set size (VmHWM) to the current one
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_mb("VmRSS")


def _peak_mb(device: str) -> float:
    """This process's peak memory in MB since _reset_peak: CUDA's allocated peak on a GPU, else the peak RSS."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return _status_mb("VmHWM")


def _status_mb(field: str) -> float:
    """A memory field of /proc/self/status in MB; elsewhere the process's lifetime peak RSS (getrusage)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _where(e: Exception) -> str:
    """The innermost frame of the traceback inside dattri (file:line function), where a peer's error came from."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "dattri" in f.filename]
    frame = (frames or traceback.extract_tb(e.__traceback__) or [None])[-1]
    return "" if frame is None else f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno} {frame.name}"


def isolated(method: str, run: Path, predictions: Tensor, args: argparse.Namespace, device: str) -> dict:
    """dattri_matrix in a fresh process: its own peak memory; a crash (e.g. killed for memory) becomes an error."""
    context = multiprocessing.get_context("spawn")
    os.environ.setdefault("TQDM_DISABLE", "1")  # dattri's per-batch bars; the child inherits it
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            return pool.submit(dattri_matrix, method, str(run), predictions, args, device).result()
    except BrokenProcessPool as e:
        return {"error": f"the process died (killed for memory?): {e}"}


def peer_rows(run: Path, args: argparse.Namespace, inputs) -> list[dict]:
    """Each dattri attributor's LDS on the check's subsets (matrices cached in faithfulness/peers/)."""
    folder = run / "faithfulness" / "peers"
    folder.mkdir(parents=True, exist_ok=True)
    device = "cuda" if args.device.type == "cuda" else "cpu"
    rows = []
    for method in args.dattri_methods:
        path = folder / f"dattri-{method}.pt"
        signature = json.dumps({"predictions": inputs.predictions.tolist(), "args": _peer_args(args)})
        saved = torch.load(path, weights_only=True) if path.is_file() else None
        if saved is None or saved.get("signature") != signature:
            print(f"{run.name}: dattri {method} ...", file=sys.stderr)
            saved = {"signature": signature, **isolated(method, run, inputs.predictions, args, device)}
            torch.save(saved, path)
        row = {"method": f"dattri:{method}", **{k: v for k, v in saved.items() if k not in ("signature", "matrix")}}
        if "matrix" in saved and "error" not in saved:
            row.update(lds_row(saved["matrix"].numpy(), inputs, args.bootstrap))
        rows.append(row)
    return rows


def _peer_args(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in ("damping", "trak_dim", "trak_ridge", "cg_iterations", "lissa_depth",
                                          "dattri_batch", "dattri_test_batch", "explicit_limit", "peer_memory")}


# ----------------------------------------------------------------------------- the table


def kgtrace_rows(summary) -> list[dict]:
    """kgtrace's methods as rows like the peers' (summary rows per output, or the method's error)."""
    rows = {}
    for r in summary.rows:
        row = rows.setdefault(r.method, {"method": f"kgtrace:{r.method}", "seconds": round(r.seconds, 2)})
        row[r.output] = {"lds": round(r.lds, 4), "low": round(r.low, 4), "high": round(r.high, 4), "n": r.n}
        row["per_prediction"] = [None if v is None else round(v, 4) for v in summary.per_prediction[r.method]["score"]]
    for method, error in summary.errors.items():
        rows[method] = {"method": f"kgtrace:{method}", "error": error}
    return list(rows.values())


def one(dataset: str, model: str, args: argparse.Namespace) -> dict:
    from kgtrace.faithfulness.lds import load_lds_inputs

    start = time.perf_counter()
    run = base_run(dataset, model, MODELS[model], args.out, args.threads, args.device)
    trained = time.perf_counter() - start
    summary, check_s = kgtrace_lds(run, args)
    inputs = load_lds_inputs(run / "faithfulness")
    rows = kgtrace_rows(summary)
    if "dattri" in args.peers:
        rows += peer_rows(run, args, inputs)
    return {"dataset": dataset, "model": model, "config": MODELS[model], "base_training_s": round(trained, 1),
            "lds_check_s": round(check_s, 1), "subset_training_s": round(summary.training_seconds, 2),
            "predictions": len(inputs.predictions), "train_triples": int(inputs.masks.shape[1]),
            "subsets": int(inputs.masks.shape[0]), "rows": rows,
            "trak_ridges": ridge_sweep(run, inputs, args) if args.trak_ridges else {},
            "folder": str(run / "faithfulness")}


def ridge_sweep(run_dir: Path, inputs, args: argparse.Namespace) -> dict[str, float]:
    """kgtrace TRAK's mean LDS on the score at each of ``--trak-ridges`` (one set of gradients for all)."""
    from kgtrace.attribution.trak import trak_ridges
    from kgtrace.faithfulness.lds import lds_scores
    from kgtrace.runs.embedding import load_run

    run = load_run(run_dir, "last")
    matrices = trak_ridges(run, inputs.predictions, args.trak_ridges, dim=args.kgtrace_trak_dim)  # [G, N, n_train]
    return {f"{ridge:g}": round(float(np.nanmean(lds_scores(inputs.outputs["score"], inputs.masks, m.numpy()))), 4)
            for ridge, m in zip(args.trak_ridges, matrices)}


def versions() -> dict:
    import importlib.metadata as md

    found = {}
    for name in ("kgtrace", "dattri", "torch"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return found


KGTRACE_COLUMNS = ("tracin-last", "tracin-all", "tracin-last-final", "grad-dot", "grad-cos", "influence",
                   "influence-fisher", "trak", "random", "neighbourhood")


def markdown_tables(documents: list[dict]) -> str:
    """The benchmarks page's tables: kgtrace's methods, dattri's, the best of each, and kgtrace TRAK's ridge sweep."""
    runs = [run for doc in documents for run in doc["results"]]
    peers = sorted({row["method"].split(":", 1)[1] for run in runs for row in run["rows"]
                    if row["method"].startswith("dattri:")}, key=lambda m: DATTRI_METHODS.index(m))
    tables = [_methods_table(runs, "kgtrace", KGTRACE_COLUMNS), _methods_table(runs, "dattri", peers), _best_table(runs)]
    if any(run.get("trak_ridges") for run in runs):
        tables.append(_ridge_table(runs))
    return "\n\n".join(tables)


def _methods_table(runs: list[dict], library: str, columns) -> str:
    """One row per run: the library's LDS of each method (column) on the score."""
    lines = [f"| dataset | model | {' | '.join(columns)} |", "|---|---|" + "---|" * len(columns)]
    for run in runs:
        rows = {row["method"]: row for row in run["rows"]}
        cells = [_cell(rows.get(f"{library}:{c}")) for c in columns]
        lines.append(f"| {run['dataset']} | {run['model']} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _best_row(run: dict, library: str) -> dict | None:
    """The library's method with the highest LDS on the score in ``run`` (random and neighbourhood aside)."""
    scored = [r for r in run["rows"] if r["method"].startswith(library + ":") and r.get("score")
              and r["score"]["lds"] is not None and not r["method"].endswith(("random", "neighbourhood"))]
    return max(scored, key=lambda r: r["score"]["lds"], default=None)


def _best_table(runs: list[dict]) -> str:
    """One row per run: each library's best method, its LDS (the higher in bold) and seconds, and their difference."""
    lines = ["| dataset | model | kgtrace's best | LDS | s | dattri's best | LDS | s | difference, paired |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        best = {library: _best_row(run, library) for library in ("kgtrace", "dattri")}
        top = max((r["score"]["lds"] for r in best.values() if r), default=None)
        cells = []
        for row in best.values():
            if row is None:
                cells += ["–"] * 3
                continue
            lds = f"{row['score']['lds']:.3f}"
            cells += [row["method"].split(":", 1)[1], f"**{lds}**" if row["score"]["lds"] == top else lds,
                      f"{row['seconds']:.1f}"]
        cells.append(paired_difference(best["kgtrace"], best["dattri"]))
        lines.append(f"| {run['dataset']} | {run['model']} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _ridge_table(runs: list[dict]) -> str:
    """kgtrace TRAK's LDS at each swept ridge, the best per run in bold, and the mean of the runs that swept them all."""
    ridges = list(dict.fromkeys(r for run in runs for r in run.get("trak_ridges", {})))
    lines = [f"| dataset | model | {' | '.join(ridges)} |", "|---|---|" + "---|" * len(ridges)]
    for run in runs:
        sweep = run.get("trak_ridges", {})
        best = max(sweep.values(), default=None)
        cells = ["–" if r not in sweep else f"**{sweep[r]:.3f}**" if sweep[r] == best else f"{sweep[r]:.3f}"
                 for r in ridges]
        lines.append(f"| {run['dataset']} | {run['model']} | {' | '.join(cells)} |")
    swept = [run["trak_ridges"] for run in runs if set(run.get("trak_ridges", {})) == set(ridges)]
    means = [float(np.mean([sweep[r] for sweep in swept])) for r in ridges]
    lines.append(f"| mean of {len(swept)} runs | | {' | '.join(f'{m:.3f}' for m in means)} |")
    return "\n".join(lines)


def removal_result(folder: Path) -> dict:
    """The removal check's settings and table (faithfulness.json in ``folder``), with the run it was made on."""
    saved = json.loads((folder / "faithfulness.json").read_text())
    run = folder.parent.name  # DATASET-MODEL, a run of this script
    dataset, model = run.split("-", 1)
    return {"command": f"kgtrace faithfulness RUN --sample {saved['settings']['sample']} --k "
                       f"{','.join(map(str, saved['settings']['ks']))} --methods {','.join(saved['settings']['methods'])} "
                       "--jobs 1 --threads 1",
            "run": f"benchmarks/lds.py's {run} ({MODELS[model]})", "dataset": dataset, "model": model,
            "settings": saved["settings"], "predictions": saved["predictions"]["how"],
            "control_max_abs_score_change": saved["control_max_abs_score_change"], "table": saved["table"]}


def removals_table(documents: list[dict]) -> str:
    """One row per run and method: PD and TC in % at k = 1 and 10, and the MRR drop at 10."""
    lines = ["| dataset | model | method | k=1 PD / TC | k=10 PD / TC | k=10 MRR drop |", "|---|---|---|---|---|---|"]
    for doc in documents:
        cells = {(r["method"], r["k"]): r for r in doc["table"] if r["method"] != "none"}
        for method in dict.fromkeys(m for m, _ in cells):
            one, ten = cells.get((method, 1)), cells.get((method, 10))
            pdtc = ["–" if r is None else f"{100 * r['pd']:.0f} / {100 * r['tc']:.0f}" for r in (one, ten)]
            drop = "–" if ten is None else f"{ten['mrr_drop']:.3f}"
            lines.append(f"| {doc.get('dataset', '')} | {doc.get('model', '')} | {method} | {pdtc[0]} | {pdtc[1]} | {drop} |")
    return "\n".join(lines)


def paired_difference(ours: dict | None, theirs: dict | None, bootstrap: int = 1000) -> str:
    """Mean over the predictions of ours - theirs (per-prediction LDS on the score), with its percentile bootstrap
    interval over the predictions (paired: both methods' LDS of the same prediction)."""
    from kgtrace.faithfulness.lds import summarize_lds

    if not ours or not theirs or "per_prediction" not in ours or "per_prediction" not in theirs:
        return "–"
    pairs = [(a, b) for a, b in zip(ours["per_prediction"], theirs["per_prediction"]) if a is not None and b is not None]
    mean, low, high = summarize_lds(np.array([a - b for a, b in pairs]), bootstrap=bootstrap, seed=0)
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def _cell(row: dict | None) -> str:
    """A method's LDS on the score with its interval, its refusal, or a dash when not run."""
    if row is None:
        return "–"
    if row.get("score") and row["score"].get("lds") is not None:
        return f"{row['score']['lds']:.3f} [{row['score']['low']:.2f}, {row['score']['high']:.2f}]"
    reason = row.get("not_run") or row.get("error") or "no value"
    short = "not run" if row.get("not_run") else ("NaN" if "non-finite" in reason else
                                                 "all 0" if "is 0" in reason else
                                                 "out of memory" if "allocate" in reason or "memory" in reason.lower()
                                                 else reason.split(":")[0])
    return short


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="umls,nations,kinships")
    parser.add_argument("--models", default="distmult,complex,conve")
    parser.add_argument("--subsets", type=int, default=50, help="M: subset models trained per run")
    parser.add_argument("--fraction", type=float, default=0.5, help="alpha: the fraction of training triples kept")
    parser.add_argument("--predictions", type=int, default=50, help="rank-first test triples explained per run")
    parser.add_argument("--methods", default="", help="kgtrace's methods (comma-separated); default: the check's")
    parser.add_argument("--peers", default="dattri", help="peer libraries: dattri, or '' for none")
    parser.add_argument("--dattri-methods", default=",".join(DATTRI_METHODS))
    parser.add_argument("--damping", type=float, default=1e-3, help="influence functions' damping (both libraries)")
    parser.add_argument("--trak-dim", type=int, default=2048, help="dattri TRAK's projection")
    parser.add_argument("--kgtrace-trak-dim", type=int, default=None,
                        help="kgtrace TRAK's projection (default: none, the exact gradients, as its own default)")
    parser.add_argument("--trak-ridge", type=float, default=1e-3, help="dattri TRAK's ridge on Phi'Phi")
    parser.add_argument("--trak-ridges", default="", help="kgtrace TRAK's LDS at each of these ridges (comma-separated "
                        "fractions of the mean of its kernel's nonzero eigenvalues), besides its default's")
    parser.add_argument("--cg-iterations", type=int, default=10, help="dattri if-cg's iterations (its default)")
    parser.add_argument("--lissa-depth", type=int, default=1000, help="dattri if-lissa's recursion depth")
    parser.add_argument("--explicit-limit", type=float, default=EXPLICIT_LIMIT,
                        help="dattri if-explicit runs only where parameters x training triples is at most this")
    parser.add_argument("--dattri-batch", type=int, default=2048, help="training triples per dattri gradient batch")
    parser.add_argument("--dattri-test-batch", type=int, default=10, help="predictions per dattri test batch")
    parser.add_argument("--peer-memory", type=float, default=12.0,
                        help="GB of address space a dattri process may take on the CPU (0: no cap); past it, "
                             "its allocation fails and the error is recorded")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2, help="subset trainings in parallel")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="where trainings and dattri run: auto (CUDA when available), cpu or cuda")
    parser.add_argument("--out", type=Path, default=Path("/tmp/lds-bench"))
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--table", nargs="+", type=Path, metavar="JSON",
                        help="print the Markdown tables of these result files (this script's output) and stop")
    parser.add_argument("--removals", type=Path, metavar="FOLDER",
                        help="print the removal check's table in FOLDER (kgtrace faithfulness RUN --out FOLDER, on a "
                             "run of this script) as a result file, and stop")
    parser.add_argument("--removals-table", nargs="+", type=Path, metavar="JSON",
                        help="print the Markdown table of these --removals result files and stop")
    args = parser.parse_args()
    if args.table:
        print(markdown_tables([json.loads(p.read_text()) for p in args.table]))
        return
    if args.removals:
        print(json.dumps(removal_result(args.removals), indent=1))
        return
    if args.removals_table:
        print(removals_table([json.loads(p.read_text()) for p in args.removals_table]))
        return
    args.methods = tuple(m for m in args.methods.split(",") if m)
    args.peers = tuple(p for p in args.peers.split(",") if p)
    args.dattri_methods = tuple(m for m in args.dattri_methods.split(",") if m)
    args.trak_ridges = [float(r) for r in args.trak_ridges.split(",") if r]
    unknown = [m for m in args.dattri_methods if m not in DATTRI_METHODS] + [p for p in args.peers if p != "dattri"]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}; dattri methods are {', '.join(DATTRI_METHODS)}")
    args.device = resolved(args.device)

    torch.set_num_threads(args.threads)
    results = [one(dataset, model, args) for dataset in args.datasets.split(",") for model in args.models.split(",")]
    print(json.dumps({"command": " ".join(sys.argv), "device": args.device.type, "versions": versions(),
                      "subsets": args.subsets, "fraction": args.fraction, "dattri_settings": _peer_args(args),
                      "dattri_not_run": DATTRI_NOT_RUN if "dattri" in args.peers else {}, "results": results},
                     indent=1))


if __name__ == "__main__":  # the process pool spawns workers that import this file
    main()
