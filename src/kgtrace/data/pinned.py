"""A run's data, pinned: the content hash of each split it was trained with.

A run records, in ``data.json``, the sha256 of each split's id triples in the run's order
(ids from the run's own id maps, so the hash is of the data, not of how the file is
formatted). Reloading the run for evaluation, explanation, the faithfulness check or a
resumed training compares them: a split edited since would silently change filtered
metrics and which rows TracIn ranks, so it is refused, naming the split.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
from torch import Tensor

from kgtrace.core.errors import DataWarning, KgtraceError, UnknownLabel
from kgtrace.core.io import atomic_write_text
from kgtrace.core.layout import IMPORTED, RunLayout
from kgtrace.data.cache import cache_key, read_cache, write_cache
from kgtrace.data.dataset import SPLITS, Dataset, load_dataset
from kgtrace.data.vocab import read_vocab


def split_digest(triples: Tensor) -> str:
    """sha256 of id triples [n, 3] as little-endian int64, row by row."""
    return hashlib.sha256(np.ascontiguousarray(triples.cpu().numpy(), dtype="<i8").tobytes()).hexdigest()


def pin_splits(folder: str | os.PathLike, dataset: Dataset) -> None:
    """Write ``folder/data.json``: the dataset's source and each split's triple count and digest."""
    splits = {s: {"triples": len(getattr(dataset, s)), "sha256": split_digest(getattr(dataset, s))} for s in SPLITS}
    maps = {"entities": dataset.entities.digest(), "relations": dataset.relations.digest()}
    atomic_write_text(RunLayout(folder).data,
                      json.dumps({"dataset": dataset.source, "id_maps": maps, "splits": splits}, indent=2) + "\n")


def check_pinned(folder: str | os.PathLike, dataset: Dataset) -> None:
    """Refuse ``dataset`` if a split differs from the one pinned in ``folder``, or the pins are missing or damaged
    (a run imported from PyKEEN, which pins nothing, passes)."""
    path = RunLayout(folder).data
    if not path.is_file():
        if (Path(folder) / IMPORTED).is_file():
            return
        raise KgtraceError(f"{path}: missing. It pins the data the run was trained with, and without it a changed "
                           "dataset would go unnoticed. Fix: restore it from a copy of the run, or train the run again")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ids, pinned = data["id_maps"], data["splits"]
        _ = [pinned[s]["sha256"] for s in SPLITS] + [ids[name] for name in ("entities", "relations")]
    except (ValueError, KeyError, TypeError):
        raise KgtraceError(f"{path}: damaged (not the JSON kgtrace train writes). Fix: restore it from a copy of the "
                           "run, or train the run again") from None
    maps = [name for name, vocab, file in (("entities", dataset.entities, "node_dict"),
                                           ("relations", dataset.relations, "rel_dict"))
            if ids[name] != vocab.digest()]
    if maps:  # the ids moved, not (necessarily) the data: say so rather than call every split changed
        raise KgtraceError(f"{folder}: the run's {' and '.join(maps)} id map differs from the one it was trained "
                           "with, so its ids would point at the wrong labels. Fix: restore the run's node_dict and "
                           "rel_dict, or train a new run (kgtrace train --out NEW_RUN)")
    changed = [f"{s} ({pinned[s]['triples']} triples then, {len(getattr(dataset, s))} now)" for s in SPLITS
               if pinned[s]["sha256"] != split_digest(getattr(dataset, s))]
    if changed:
        raise KgtraceError(
            f"{folder}: the dataset {dataset.source} changed since this run was trained: its {', '.join(changed)} "
            f"split{'s differ' if len(changed) > 1 else ' differs'} from the one pinned in {path.name}. Filtered "
            "metrics and TracIn's training rows would describe other data. Fix: restore the dataset's files as they "
            f"were, or train a new run on the changed data (kgtrace train --dataset {dataset.source} --out NEW_RUN)")


def load_pinned_dataset(folder: str | os.PathLike, source: str) -> Dataset:
    """The dataset ``source`` through the id maps of the run in ``folder`` (node_dict, rel_dict),
    refused when it no longer is the data the run was trained with.

    A large dataset is read from the run's cache when its files are unchanged, and cached after
    being parsed (`kgtrace.data.cache`); either way its splits are checked against the pins.
    """
    folder = Path(folder)
    key = cache_key(folder, source)
    dataset = read_cache(folder, key)
    if dataset is not None:
        check_pinned(folder, dataset)
        return dataset
    started = time.time_ns()
    with warnings.catch_warnings(record=True) as caught:  # kept with the cache, to be given again on a hit
        warnings.simplefilter("always")
        dataset = _parse(folder, source)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    check_pinned(folder, dataset)
    write_cache(folder, key, dataset, [str(w.message) for w in caught if issubclass(w.category, DataWarning)], started)
    return dataset


def _parse(folder: Path, source: str) -> Dataset:
    """``source`` read from its files through the run's id maps; a label they lack is a KgtraceError."""
    try:
        return load_dataset(source, entities=read_vocab(RunLayout(folder).node_dict),
                            relations=read_vocab(RunLayout(folder).rel_dict))
    except UnknownLabel as e:  # a label the run never saw: its model has no embedding for it
        where = e.path if e.line is None else f"{e.path}:{e.line}"
        raise KgtraceError(
            f"{folder}: the dataset {source} changed since this run was trained: {where}: {e.problem}. Fix: restore "
            f"the dataset's files as they were, or train a new run on the changed data (kgtrace train --dataset "
            f"{source} --out NEW_RUN)") from None
