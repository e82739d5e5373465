"""Per-query results for studying failures: a table (TSV or Parquet) and a rank histogram."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

from kgtrace.core.errors import KgtraceError, option_name
from kgtrace.core.io import atomic_path
from kgtrace.data.vocab import Vocab
from kgtrace.evaluation.evaluate import QueryRanks, model_device
from kgtrace.evaluation.sides import side_queries
from kgtrace.models.base import Scorer

FORMATS = (".tsv", ".parquet")


@torch.inference_mode()
def true_scores(model: Scorer, queries: torch.Tensor, answers: torch.Tensor, batch: int = 65536) -> torch.Tensor:
    """Score of each (anchor, relation-or-inverse, answer) [Q]: the score the query's rank was taken at."""
    device = model_device(model)
    hrt = torch.cat([queries, answers.unsqueeze(1)], dim=1)  # [Q, 3]
    parts = [model.score_hrt(chunk.to(device)).float().cpu() for chunk in hrt.split(batch)]
    return torch.cat(parts) if parts else torch.zeros(0)


def query_table(ranks: QueryRanks, model: Scorer, entities: Vocab, relations: Vocab) -> pl.DataFrame:
    """One row per (triple, side): labels, the three ranks, the true score and the candidate count."""
    frames = []
    labels_e, labels_r = np.asarray(entities.labels, dtype=object), np.asarray(relations.labels, dtype=object)
    h, r, t = (ranks.triples[:, i].numpy() for i in range(3))
    for side, counts in ranks.counts.items():
        sq = side_queries(ranks.triples, model.num_relations, side)
        frames.append(pl.DataFrame({
            "index": np.arange(len(h)),
            "head": labels_e[h], "relation": labels_r[r], "tail": labels_e[t],
            "side": [side] * len(h),
            "rank_optimistic": counts.rank("optimistic").numpy(),
            "rank_pessimistic": counts.rank("pessimistic").numpy(),
            "rank_realistic": counts.rank("realistic").numpy(),
            "true_score": true_scores(model, sq.queries, sq.answers).numpy(),
            "num_candidates": counts.num_candidates.numpy(),
        }))
    return pl.concat(frames).sort(["index", "side"])


def write_query_table(table: pl.DataFrame, path: str | Path) -> None:
    """TSV or Parquet by the file's extension, written atomically."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise KgtraceError(f"{option_name('--per-query')} {path}: unknown format {suffix!r}. Fix: name the file .tsv or .parquet")
    with atomic_path(path) as tmp:
        if suffix == ".tsv":
            table.write_csv(tmp, separator="\t")
        else:
            table.write_parquet(tmp)
