"""Peak memory of one ConvE training step on a large synthetic graph; prints JSON.

A graph of 1,000,000 entities and 5,000,000 triples (50 relations), ConvE dim 200, batch 256.
Each variant runs in its own process and reports its peak RSS: what the model, its Adam state
and the answer index hold before the step, what forward + backward add (where the loss
matters), and what the whole step adds (the dense entity-embedding gradient and Adam's update
over 200M entity parameters are the same in every variant):

* ``sparse``: kgtrace's KvsAll loss (sparse positives, no [B, E] label tensor);
* ``sparse_chunked``: the same loss over entity chunks of 65,536 (no [B, E] score tensor either);
* ``dense_labels``: the textbook loss, a dense [B, E] label matrix and BCE-with-logits, for comparison.

On CUDA the model, its Adam state and the batch live on the GPU (the answer index stays in host
memory, as in training), so each variant also reports the GPU's allocated memory before the step
and its peak (``torch.cuda.max_memory_allocated``, reset after the warm-up step) after forward +
backward and after the whole step, beside the RSS figures.

    python benchmarks/train_memory.py [--entities 1000000] [--triples 5000000] [--batch 256] [--device auto]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from common import resolved


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak so far, KiB on Linux


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def worker(args: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F

    from kgtrace.data.answers import AnswerIndex
    from kgtrace.models import build_model
    from kgtrace.training.loss import kvsall_bce, kvsall_bce_chunked_backward

    device = resolved(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    triples = torch.stack([torch.randint(0, args.entities, (args.triples,)),
                           torch.randint(0, args.relations, (args.triples,)),
                           torch.randint(0, args.entities, (args.triples,))], 1)  # [n, 3]
    index = AnswerIndex.build(triples, args.relations)
    del triples
    model = build_model("conve", args.entities, args.relations, embedding_dim=200).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)  # as kgtrace trains
    # One warm-up step so that Adam's state exists before we measure the step itself.
    pos = torch.arange(args.batch)
    queries = index.queries()[pos].to(device)
    rows, cols = (t.to(device) for t in index.pairs_at(pos))

    def step() -> tuple[float, float, float | None]:
        """One step; returns the loss and the peak RSS (and on CUDA the peak allocated GPU memory) after forward
        + backward (before Adam)."""
        optimizer.zero_grad(set_to_none=True)
        if args.variant == "sparse_chunked":
            loss = kvsall_bce_chunked_backward(model, queries, rows, cols, 0.1, args.chunk)
        elif args.variant == "sparse":
            loss = kvsall_bce(model.score_t(queries), rows, cols, 0.1)
            loss.backward()
        else:
            scores = model.score_t(queries)
            labels = torch.zeros_like(scores)  # [B, E], the tensor kgtrace never builds
            labels[rows, cols] = 1.0
            labels = labels * 0.9 + (1 - labels) * 0.1 / (args.entities - 1)
            loss = F.binary_cross_entropy_with_logits(scores, labels)
            loss.backward()
        peak_backward = rss_mb()
        cuda_peak_backward = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
        optimizer.step()
        return float(loss), peak_backward, cuda_peak_backward  # float(loss) waits for the GPU's work

    step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        cuda_before = torch.cuda.memory_allocated(device) / 2**20
    before = current_rss_mb()
    start = time.perf_counter()
    loss, peak_backward, cuda_peak_backward = step()
    seconds = time.perf_counter() - start
    peak = rss_mb()
    result = {"variant": args.variant, "device": device.type, "loss": loss, "step_seconds": seconds,
              "rss_before_step_mb": before, "peak_rss_forward_backward_mb": peak_backward, "peak_rss_mb": peak,
              "forward_backward_adds_mb": peak_backward - before, "step_adds_mb": peak - before,
              "queries": index.num_queries}
    if cuda:
        cuda_peak = torch.cuda.max_memory_allocated(device) / 2**20
        result |= {"cuda_allocated_before_step_mb": cuda_before, "cuda_peak_forward_backward_mb": cuda_peak_backward,
                   "cuda_peak_mb": cuda_peak, "cuda_forward_backward_adds_mb": cuda_peak_backward - cuda_before,
                   "cuda_step_adds_mb": cuda_peak - cuda_before}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--triples", type=int, default=5_000_000)
    parser.add_argument("--relations", type=int, default=50)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=65_536)
    parser.add_argument("--variants", default="sparse,sparse_chunked,dense_labels")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto (CUDA when available), cpu or cuda")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(worker(args)))
        return
    device = resolved(args.device)  # once, here: each worker is given the device it resolved to
    results = []
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, "--variant", variant, f"--device={device.type}"] + [
            f"--{k}={getattr(args, k)}" for k in ("entities", "triples", "relations", "batch", "chunk")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0
                       else {"variant": variant, "error": (done.stderr.strip().splitlines() or ["failed"])[-1]})
        print(json.dumps(results[-1]), file=sys.stderr)
    dense = {r["variant"]: r for r in results}.get("dense_labels", {})
    for r in results:
        if "error" not in r and "forward_backward_adds_mb" in dense:
            r["forward_backward_memory_ratio_to_dense_labels"] = (
                r["forward_backward_adds_mb"] / dense["forward_backward_adds_mb"])
        if "error" not in r and "cuda_forward_backward_adds_mb" in dense:
            r["cuda_forward_backward_memory_ratio_to_dense_labels"] = (
                r["cuda_forward_backward_adds_mb"] / dense["cuda_forward_backward_adds_mb"])
    print(json.dumps({"benchmark": "train_memory", "device": device.type, "entities": args.entities,
                      "triples": args.triples, "batch": args.batch, "embedding_dim": 200, "results": results},
                     indent=2))


if __name__ == "__main__":
    main()
