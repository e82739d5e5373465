"""Figures written as PNG files (matplotlib's Agg backend: no display needed).

matplotlib.pyplot is imported on first use (`pyplot`), not with this module: it is a second of start-up
that the many commands which draw nothing (and every subprocess of a job) need not pay.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from kgtrace.core.io import atomic_open


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported on the first call (module doc)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def training_curve(records: list[dict[str, Any]], path: str | Path) -> None:
    """Loss per epoch (left axis) and validation MRR where measured (right axis), as a PNG file."""
    save_figure(training_curve_figure(records), path)


def training_curve_figure(records: list[dict[str, Any]]):
    """The figure of `training_curve`."""
    fig, loss_ax = pyplot().subplots(figsize=(6, 3.5), dpi=100)
    loss_ax.plot([r["epoch"] for r in records], [r["loss"] for r in records], color="tab:blue", label="training loss")
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("training loss", color="tab:blue")
    valid = [r for r in records if "valid_mrr" in r]
    if valid:
        mrr_ax = loss_ax.twinx()
        mrr_ax.plot([r["epoch"] for r in valid], [r["valid_mrr"] for r in valid], "o-", color="tab:orange")
        mrr_ax.set_ylabel("validation MRR (filtered)", color="tab:orange")
        mrr_ax.set_ylim(0, 1)
    fig.tight_layout()
    return fig


def save_figure(fig, path: str | Path) -> None:
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    pyplot().close(fig)


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (then closed), e.g. to embed in a page."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    pyplot().close(fig)
    return buffer.getvalue()


def rank_histogram(ranks_by_side: dict[str, np.ndarray], path: str | Path, title: str = "") -> None:
    """Histogram of realistic filtered ranks per side, on logarithmic bins (rank 1 has its own bin), as a PNG file."""
    save_figure(rank_histogram_figure(ranks_by_side, title), path)


def rank_histogram_figure(ranks_by_side: dict[str, np.ndarray], title: str = ""):
    """The figure of `rank_histogram`: the histogram, its count axis logarithmic so that the bars past rank 1 keep
    their height, and beside it the share of queries ranked k or better for every k (Hits@k as a curve)."""
    largest = max((float(r.max()) for r in ranks_by_side.values() if len(r)), default=1.0)
    edges = np.unique(np.concatenate([[0.5, 1.5], np.geomspace(1.5, max(largest, 2.0) + 0.5, 20)]))
    fig, (counts, share) = pyplot().subplots(1, 2, figsize=(9, 3.5), dpi=100)
    counts.hist(list(ranks_by_side.values()), bins=edges, label=list(ranks_by_side), alpha=0.8)
    counts.set_xscale("log")
    counts.set_yscale("log")
    counts.set_xlabel("filtered rank (realistic)")
    counts.set_ylabel("queries (log scale)")
    counts.legend()
    for side, ranks in ranks_by_side.items():
        ordered = np.sort(np.asarray(ranks, dtype=float))
        share.step(ordered, np.arange(1, len(ordered) + 1) / max(len(ordered), 1), where="post", label=side)
    share.set_xscale("log")
    share.set_ylim(0, 1.02)
    share.set_xlabel("rank k")
    share.set_ylabel("share ranked k or better (Hits@k)")
    share.grid(alpha=0.3)
    share.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
