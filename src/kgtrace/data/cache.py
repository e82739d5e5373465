"""A run's dataset, cached beside the run: a 10M-triple graph reloads in seconds, not half a minute.

Every command on a run (evaluate, explain, index, faithfulness, resume) reloads its dataset through
the run's id maps. From text, that is parsing every split, mapping labels to ids, and reading names
and categories: 24 s for a 10M-triple ROBOKOP-shaped graph on one core (2.7 s from the cache). The first reload of a
large dataset writes what it built into the run folder (``dataset.cache``: one file, written
atomically under a lock, read with ``weights_only=True``); later reloads read that file instead.

The cache is used only while it describes the same files. Its key lists every file the
dataset's loading looks at (each split under every accepted name, the id maps, names,
categories and edge map of the dataset folder, present or absent, and the run's ``node_dict``,
``rel_dict`` and ``data.json``) with its size, inode, modification and change time in
nanoseconds. Change time is set by the kernel on every write and cannot be set back by a
user, so an edited file misses the cache, as it would miss git's index. A file changed in the
same clock tick as the cache was built would not (git's "racily clean" case): a file less than
`RACY_NS` old when it is read is never cached. Cached triples are still checked against
the run's pinned digests on every load, as parsed ones are.

Datasets whose splits are smaller than `MIN_BYTES` are not cached: they parse in a few
seconds, and their run folders stay as they were.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from kgtrace.core.errors import DataWarning, KgtraceError
from kgtrace.core.io import atomic_open, remove_stale_temporaries
from kgtrace.core.layout import RunLayout
from kgtrace.core.owned import file_lock
from kgtrace.data.dataset import CATEGORIES_FILE, EDGE_MAP_FILE, MAP_FILES, NAMES_FILE, SPLIT_SUFFIXES, SPLITS, Dataset
from kgtrace.data.registry import DATASETS, UNPACKED, cached
from kgtrace.data.vocab import Vocab

FORMAT = "kgtrace-dataset-cache"
#: Raise it whenever loading a dataset from its files changes what it builds: older caches then miss.
VERSION = 1
#: Splits smaller than this (bytes, all three together) are not cached: they parse in a few seconds (FB15k-237's
#: 23 MB in 0.6 s), and a process that parsed them has its allocator warmed for what follows.
MIN_BYTES = 64 << 20
#: A file modified less than this long (ns) before it was read could change again unseen in the same tick.
RACY_NS = 2_000_000_000

Key = dict[str, Any]


def cache_key(run: Path, source: str) -> Key | None:
    """The key of ``source`` loaded through the run in ``run``: each input file's stat signature (None
    for an absent one), or None when the dataset is not cached (bundled, not fetched yet, or small)."""
    folder = _dataset_folder(source)
    if folder is None:
        return None
    split_names = [f"{split}{suffix}" for split in SPLITS for suffix in SPLIT_SUFFIXES]
    other_names = [name for pair in MAP_FILES for name in pair] + [NAMES_FILE, EDGE_MAP_FILE, CATEGORIES_FILE, UNPACKED]
    layout = RunLayout(run)
    files = {name: _signature(folder / name) for name in split_names + other_names}
    files |= {f"run:{path.name}": _signature(path) for path in (layout.node_dict, layout.rel_dict, layout.data)}
    split_bytes = sum(files[name][0] for name in split_names if files[name])
    if split_bytes < MIN_BYTES:
        return None
    return {"version": VERSION, "source": source, "files": files}


def read_cache(run: Path, key: Key | None) -> Dataset | None:
    """The dataset cached in ``run`` under ``key``, or None (no cache, another key, or an unreadable file).

    Re-emits the DataWarnings that loading the dataset from its files gave.
    """
    path = RunLayout(run).dataset_cache
    if key is None or not path.is_file():
        return None
    state = _load(path, mmap=False)
    if state is None or state["key"] != key:
        return None
    for message in state["warnings"]:
        warnings.warn(DataWarning(message), stacklevel=3)
    return _dataset(state)


def write_cache(run: Path, key: Key | None, dataset: Dataset, data_warnings: list[str], started_ns: int) -> bool:
    """Cache ``dataset``, loaded from its files since ``started_ns`` (time.time_ns), under ``key``; True if written.

    Nothing is written when the files changed meanwhile or are too fresh to trust their times
    (module doc), when another process holds the cache's lock, or when the run folder is read-only:
    the next load is then only as slow as this one. A file of that name that is not kgtrace's
    cache is never replaced.
    """
    path = RunLayout(run).dataset_cache
    if key is None or key != cache_key(run, key["source"]) or _racy(key, started_ns):
        return False
    if path.exists() and _load(path) is None:
        return False
    try:
        with file_lock(path):
            remove_stale_temporaries(run, {path.name})  # the lock is held: a temporary left is a dead writer's
            with atomic_open(path, "wb") as f:
                torch.save(_state(key, dataset, data_warnings), f)
    except (KgtraceError, OSError):
        return False
    return True


def _dataset_folder(source: str) -> Path | None:
    """The folder ``source`` is read from, or None for a bundled dataset or a remote one not fetched yet."""
    entry = DATASETS.get(source)
    if entry is None:
        return Path(source).resolve()
    return None if entry.bundled else cached(entry.name)


def _signature(path: Path) -> list[int] | None:
    try:
        s = path.stat()
    except FileNotFoundError:
        return None
    return [s.st_size, s.st_ino, s.st_mtime_ns, s.st_ctime_ns]


def _racy(key: Key, started_ns: int) -> bool:
    """Whether a file of ``key`` was modified within RACY_NS of being read (or after)."""
    return any(sig is not None and max(sig[2], sig[3]) > started_ns - RACY_NS for sig in key["files"].values())


def _state(key: Key, ds: Dataset, data_warnings: list[str]) -> dict[str, Any]:
    # Strings as JSON text: one pickled string per table loads at once (weights_only unpickles objects slowly).
    lineages = sorted(set(ds.entity_categories.values()))
    lineage_id = {lineage: i for i, lineage in enumerate(lineages)}
    return {
        "format": FORMAT, "key": key, "name": ds.name, "source": ds.source,
        "entities": json.dumps(ds.entities.labels), "relations": json.dumps(ds.relations.labels),
        "train": ds.train, "valid": ds.valid, "test": ds.test,
        "entity_names": json.dumps(ds.entity_names), "relation_names": json.dumps(ds.relation_names),
        "category_labels": json.dumps(list(ds.entity_categories)), "lineages": json.dumps(lineages),
        "lineage_of": torch.tensor([lineage_id[c] for c in ds.entity_categories.values()], dtype=torch.int32),
        "edge_map": json.dumps(ds.edge_map), "warnings": data_warnings,
    }


def _dataset(state: dict[str, Any]) -> Dataset:
    lineages = [tuple(lineage) for lineage in json.loads(state["lineages"])]
    categories = dict(zip(json.loads(state["category_labels"]), (lineages[i] for i in state["lineage_of"].tolist())))
    return Dataset(
        name=state["name"], source=state["source"],
        entities=Vocab(json.loads(state["entities"])), relations=Vocab(json.loads(state["relations"])),
        train=state["train"], valid=state["valid"], test=state["test"],
        entity_names=json.loads(state["entity_names"]), relation_names=json.loads(state["relation_names"]),
        entity_categories=categories, edge_map=json.loads(state["edge_map"]),
    )


def _load(path: Path, mmap: bool = True) -> dict[str, Any] | None:
    """The cache file's content, or None when it is not a readable kgtrace dataset cache.

    mmap=False reads the triples into the process's own memory: gathers from a file mapping's small pages
    run ~1.4x slower (TracIn's pass on FB15k-237), so a dataset that is used is read, not mapped.
    """
    try:
        state = torch.load(path, weights_only=True, mmap=mmap)
    except Exception:  # a truncated or foreign file is not used (and, not being kgtrace's, not replaced)
        return None
    return state if isinstance(state, dict) and state.get("format") == FORMAT else None
