"""The float32 products of TracIn's ConvE pass, and a score product: PyTorch's ``@`` against
kgtrace.compute.matmul.linear; print JSON.

Each shape is a product x [M, K] W^T with W [N, K] (ConvE-200's fc: N = 200): the head band
(K = 4608, the conv rows that see the head alone), the pair band (K = 1152) and the whole fc
input (K = 10368), M rows as a chunk of a TracIn pass meets them, one skinny product, and the
score product of a training or evaluation batch against every entity (N = 14,505).
Every call gets its own x of M rows, M drawn around the shape's size, so that row counts vary as
they do in a pass (kgtrace.compute.matmul's doc: oneDNN compiles per row count). GFLOP/s are 2 M K N
over the median of --repeats timings, at each of --threads; ``ratio`` is the rate of linear's oneDNN
path (``onednn=True``, whatever the processor) over ``@``'s, and ``max_rel_diff`` the largest
|linear - @| / max |@|. ``kgtrace_takes_onednn`` says which kgtrace itself takes on this processor.

    python benchmarks/matmul.py [--device auto|cpu|cuda] [--threads 1,2] [--repeats 5] [--calls 16]

On a GPU both are the same ``@`` (linear takes oneDNN on a CPU only): the ratio is 1 there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from common import processor_name, resolved

from kgtrace.compute.matmul import cpu_vendor, linear, onednn_available, prefers_onednn

#: (name, typical rows M, inner K, outputs N); the last is the score product of training and evaluation
#: (a batch of 1,024 queries against FB15k-237's 14,505 entities of 256 reals), which stays with ``@``.
SHAPES = (("head band", 366, 4608, 200), ("pair band", 1247, 1152, 200), ("whole fc input", 512, 10368, 200),
          ("skinny", 4096, 200, 16), ("entity scores", 1024, 256, 14505))


def rate(product, xs: list[torch.Tensor], w: torch.Tensor, device: torch.device, repeats: int) -> float:
    """GFLOP/s of product(x, w) over all of xs, the median of ``repeats`` passes (one warm-up pass first)."""
    flops = sum(2 * x.shape[0] * x.shape[1] * w.shape[0] for x in xs)
    seconds = []
    for _ in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        for x in xs:
            product(x, w)
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return flops / statistics.median(seconds[1:]) / 1e9


def _rel_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def onednn_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """linear's oneDNN path whatever the processor (kgtrace itself takes it where prefers_onednn says)."""
    return linear(x, w, onednn=True)


def measure(device: torch.device, threads: int, repeats: int, calls: int = 16) -> list[dict]:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, m, k, n in SHAPES:
        counts = torch.randint(m // 2, m * 3 // 2 + 1, (calls,), generator=g).tolist()  # row counts vary, as in a pass
        xs = [torch.randn(c, k, generator=g).to(device) for c in counts]
        w = torch.randn(n, k, generator=g).to(device)
        plain = rate(lambda x, w: x @ w.T, xs, w, device, repeats)
        ours = rate(onednn_linear, xs, w, device, repeats)
        diff = max(_rel_diff(onednn_linear(x, w), x @ w.T) for x in xs)
        rows.append({"shape": name, "rows": m, "inner": k, "outputs": n, "threads": threads,
                     "matmul_gflops": round(plain, 1), "linear_gflops": round(ours, 1), "ratio": round(ours / plain, 2),
                     "max_rel_diff": diff})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=16, help="products per shape and pass, each its own row count")
    args = p.parse_args()
    device = resolved(args.device)
    results = [row for t in (int(x) for x in args.threads.split(",")) for row in measure(device, t, args.repeats, args.calls)]
    print(json.dumps({"device": str(device), "processor": processor_name(),
                      "vendor": cpu_vendor(), "torch": torch.__version__, "onednn": onednn_available(),
                      "kgtrace_takes_onednn": prefers_onednn(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
