"""Datasets: three splits of id triples, the id maps, and optional names and categories.

A dataset folder holds ``train.txt``, ``valid.txt`` and ``test.txt`` (or ``.tsv``, either gzipped) with
labelled triples, and optionally:

* id maps, first pair found wins: ``node_dict`` + ``rel_dict`` (kgtrace/ROBOKOP),
  ``entity_to_id.tsv(.gz)`` + ``relation_to_id.tsv(.gz)`` (PyKEEN), ``entity2id.txt`` +
  ``relation2id.txt`` (OpenKE). Without maps, ids are the sorted labels of the train split.
* ``node_names.txt`` (entity names), ``edge_map.json`` (relation descriptions),
  ``node_categories.tsv`` (``label<TAB>cat1|cat2``).

A valid or test triple whose entity never occurs in train is left out with a
`DataWarning` (count and first lines): no model learns such an entity.
So is one whose relation never occurs in train, unless the id map lists that relation: that
is how ``kgtrace prepare --split predicate`` holds a predicate out of train.

The dataset registry (`kgtrace.data.registry`) names the rest: the bundled benchmarks
(`BUNDLED`) load from package data, offline; remote ones (``fb15k237``, ``wn18rr``, ``hetionet``) are
fetched into a cache on first use. A registered name takes precedence over a folder of the same
name; write ``./umls`` for the folder.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TypeVar

import numpy as np
import polars as pl
import torch

from kgtrace.core.errors import DataError, DataWarning, KgtraceError
from kgtrace.data._io import object_column
from kgtrace.data.names import (
    describe_predicate,
    read_categories,
    read_edge_map_json,
    read_names,
    write_categories,
    write_edge_map,
    write_names,
)
from kgtrace.data.registry import DATASETS, cache_folder, fetch, registered_name
from kgtrace.data.splits import is_in, seen_mask
from kgtrace.data.triples import encode_triples, read_labeled_triples_with_lines, write_id_triples
from kgtrace.data.vocab import Vocab, read_vocab, write_vocab

SPLITS = ("train", "valid", "test")
SPLIT_SUFFIXES = (".txt", ".tsv", ".txt.gz", ".tsv.gz")
MAP_FILES = (
    ("node_dict", "rel_dict"),
    ("entity_to_id.tsv.gz", "relation_to_id.tsv.gz"),
    ("entity_to_id.tsv", "relation_to_id.tsv"),
    ("entity2id.txt", "relation2id.txt"),
)
NAMES_FILE = "node_names.txt"
EDGE_MAP_FILE = "edge_map.json"
CATEGORIES_FILE = "node_categories.tsv"
UNSEEN_EXAMPLES = 3  # triples named in the warning about valid/test triples unseen in train
T = TypeVar("T")


@dataclass
class Dataset:
    """A link-prediction dataset; triples are LongTensors ``[n, 3]`` of (head, relation, tail) ids."""

    name: str
    source: str  # bundled name ("umls") or absolute folder path
    entities: Vocab
    relations: Vocab
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    entity_names: dict[str, str] = field(default_factory=dict)  # label -> readable name
    relation_names: dict[str, str] = field(default_factory=dict)  # relation label -> readable description
    entity_categories: dict[str, tuple[str, ...]] = field(default_factory=dict)
    edge_map: dict[str, str] = field(default_factory=dict)  # edge_map.json as stored: description -> label

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    def all_triples(self) -> torch.Tensor:
        """train, valid and test concatenated: LongTensor ``[n_train + n_valid + n_test, 3]``."""
        return torch.cat([self.train, self.valid, self.test])

    def known_triples(self, split: str) -> torch.Tensor:
        """The true triples that filter the ranking of ``split``: all three splits for test,
        train + valid for valid (validation never sees test)."""
        return self.all_triples() if split == "test" else torch.cat([self.train, self.valid])

    def split_of(self, triples: torch.Tensor) -> list[str | None]:
        """The split holding each triple of ``triples`` [n, 3] ("train" first when several do), or None for
        a triple in none (a new prediction)."""
        def keys(t: torch.Tensor) -> torch.Tensor:  # [m] one integer per (h, r, t)
            t = t.long().reshape(-1, 3)
            return (t[:, 0] * self.num_relations + t[:, 1]) * self.num_entities + t[:, 2]

        query, found = keys(triples), [None] * len(triples)
        for split in reversed(SPLITS):  # train last, so that it wins
            for i in torch.isin(query, keys(getattr(self, split))).nonzero().flatten().tolist():
                found[i] = split
        return found

    def entity_label(self, i: int) -> str:
        return self.entities.labels[int(i)]

    def relation_label(self, i: int) -> str:
        return self.relations.labels[int(i)]

    def entity_name(self, label: str) -> str:
        """The readable name of an entity label, or the label itself if it has none."""
        return self.entity_names.get(label, label)

    def relation_name(self, label: str) -> str:
        """The readable description of a relation label, or the label itself if it has none."""
        return self.relation_names.get(label, label)


def load_dataset(
    name_or_path: str | os.PathLike, *, entities: Vocab | None = None, relations: Vocab | None = None
) -> Dataset:
    """Load a registered dataset by name (bundled, or fetched into the cache), or a dataset folder.

    Valid and test triples whose entities or relations training never sees are left out with a warning
    (module doc).

    Args:
        name_or_path: a registered name in kgtrace's or PyKEEN's spelling (``"nations"``, ``"FB15k-237"``;
            ``kgtrace datasets`` lists them), or a folder holding train.txt, valid.txt and test.txt.
        entities: the entities' id map to use instead of one built from the files (reloading a run keeps
            its ids).
        relations: the relations' id map, likewise.

    Returns:
        The `Dataset`: its splits as id tensors [n, 3], id maps, and names and categories where the folder
        has them.

    Raises:
        DataError: a file's line cannot be read, or holds a label the given id maps lack (naming the file
            and line), or the train split is empty.
        KgtraceError: the name is neither registered nor a folder.
    """
    entry = DATASETS.get(str(name_or_path))
    if entry is None and not Path(name_or_path).exists():  # another spelling of a registered name ("FB15k-237")
        entry = DATASETS.get(registered_name(str(name_or_path)) or "")
    if entry is not None:
        load = _load_bundled if entry.bundled else _load_remote
        return load(entry.name, entities, relations)
    folder = Path(name_or_path)
    if folder.is_file():
        raise DataError(folder, None, "this is a file, not a dataset folder",
                        "give the folder holding train.txt, valid.txt and test.txt, or make one from this file "
                        f"with `kgtrace prepare --triples {folder} --out FOLDER`")
    if not folder.is_dir():
        raise KgtraceError(
            f"{str(name_or_path)!r} is neither a registered dataset nor a folder. "
            f"Fix: use one of {', '.join(DATASETS)} (kgtrace datasets lists them), or the path of a folder holding "
            "train.txt, valid.txt, test.txt"
        )
    folder = folder.resolve()
    splits = {split: _split_file(folder, split) for split in SPLITS}
    return _load(folder.name, str(folder), folder, splits, entities, relations)


def save_dataset(ds: Dataset, folder: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Write ``ds`` as a canonical dataset folder (each file atomically).

    Writes train/valid/test.txt, node_dict, rel_dict, and node_names.txt, edge_map.json,
    node_categories.tsv when non-empty. Refuses to replace existing files unless ``overwrite``.
    """
    folder = Path(folder)
    _refuse_existing(folder, overwrite)
    folder.mkdir(parents=True, exist_ok=True)
    write_vocab(ds.entities, folder / "node_dict")
    write_vocab(ds.relations, folder / "rel_dict")
    for split in SPLITS:
        write_id_triples(getattr(ds, split), ds.entities, ds.relations, folder / f"{split}.txt")
    if ds.entity_names:
        write_names(ds.entity_names, folder / NAMES_FILE)
    edge_map = _edge_map_to_save(ds)
    if edge_map:
        write_edge_map(edge_map, folder / EDGE_MAP_FILE)
    if ds.entity_categories:
        write_categories(ds.entity_categories, folder / CATEGORIES_FILE)


def _load_bundled(name: str, entities: Vocab | None, relations: Vocab | None) -> Dataset:
    root = resources.files("kgtrace.data") / "bundled" / name
    with ExitStack() as stack:
        # as_file gives a real path even when the package is installed zipped.
        splits = {split: stack.enter_context(resources.as_file(root / f"{split}.txt")) for split in SPLITS}
        return _load(name, name, None, splits, entities, relations)


def _load_remote(name: str, entities: Vocab | None, relations: Vocab | None) -> Dataset:
    folder = fetch(name)
    splits = {split: _split_file(folder, split) for split in SPLITS}
    return _load(name, name, folder, splits, entities, relations)


def _load(
    name: str, source: str, folder: Path | None, splits: dict[str, Path],
    entities: Vocab | None, relations: Vocab | None,
) -> Dataset:
    labeled = {split: read_labeled_triples_with_lines(path) for split, path in splits.items()}
    if len(labeled["train"][0]) == 0:
        raise DataError(splits["train"], None, "the train split holds no triples",
                        "write the training triples into it, one head<TAB>relation<TAB>tail per line, or make "
                        "the dataset folder with `kgtrace prepare --triples FILE --out FOLDER`")
    from_run = entities is not None or relations is not None
    map_files = _map_files(folder) if folder is not None else None
    if entities is None or relations is None:
        default_entities, default_relations = _vocabs(map_files, labeled["train"][0])
        entities = default_entities if entities is None else entities
        relations = default_relations if relations is None else relations
    # A relation the id map lists may be absent from train on purpose: `kgtrace prepare --split
    # predicate` holds a predicate out of train. Without id map files the map is built from train.
    held_out = relations.labels if map_files or from_run else ()
    train = labeled["train"][0]
    seen_entities = pl.concat([object_column(train[:, 0]), object_column(train[:, 2])]).unique()
    seen_relations = pl.concat([object_column(train[:, 1]), pl.Series(list(held_out), dtype=pl.String)]).unique()
    for split in ("valid", "test"):
        labeled[split] = _drop_unseen(labeled[split], seen_entities, seen_relations, splits[split], splits["train"])
    # Messages about a label missing from an id map name the map actually in use.
    id_maps = ("node_dict", "rel_dict") if from_run or not map_files else (map_files[0].name, map_files[1].name)
    ids = {s: encode_triples(labeled[s][0], entities, relations, splits[s], lines=labeled[s][1],
                             id_maps=id_maps, from_run=from_run) for s in SPLITS}
    edge_map = _optional(folder, EDGE_MAP_FILE, read_edge_map_json)
    return Dataset(
        name=name, source=source, entities=entities, relations=relations,
        train=ids["train"], valid=ids["valid"], test=ids["test"],
        entity_names=_optional(folder, NAMES_FILE, lambda p: read_names(p, entities)),
        relation_names={label: describe_predicate(key) for key, label in edge_map.items()},
        entity_categories=_optional(folder, CATEGORIES_FILE, read_categories),
        edge_map=edge_map,
    )


def _drop_unseen(
    split: tuple[np.ndarray, np.ndarray], entities: pl.Series, relations: pl.Series, path: Path, train_path: Path
) -> tuple[np.ndarray, np.ndarray]:
    """``split`` (triples, lines) without the triples whose entity or relation is not among those seen in train
    (``entities``, ``relations``: the relations held out on purpose count as seen): a model cannot rank what it
    never trained on (PyKEEN drops them too).

    Warns with the count and the first few lines and labels.
    """
    triples, lines = split
    keep = seen_mask(triples, entities, relations)
    if keep.all():
        return split
    bad = np.flatnonzero(~keep)
    examples = [_unseen_label(triples[i], int(lines[i]), entities, relations) for i in bad[:UNSEEN_EXAMPLES]]
    warnings.warn(DataWarning(
        f"{path}: left out {bad.size} of {len(triples)} triples whose entity or relation never occurs in "
        f"{train_path.name}, so no model learns it ({'; '.join(examples)}{'; ...' if bad.size > UNSEEN_EXAMPLES else ''}). "
        f"To keep them, move them into {train_path.name}, or re-split the triples with "
        "`kgtrace prepare --triples FILE --out FOLDER`"), stacklevel=4)
    return triples[keep], lines[keep]


def _unseen_label(triple: np.ndarray, line: int, entities: pl.Series, relations: pl.Series) -> str:
    """'line 12: entity 'X'' for the first label of ``triple`` that train lacks."""
    for column, pool, kind in ((0, entities, "entity"), (1, relations, "relation"), (2, entities, "entity")):
        if not is_in(triple[column:column + 1], pool)[0]:
            return f"line {line}: {kind} {triple[column]!r}"
    return f"line {line}"


def _vocabs(map_files: tuple[Path, Path] | None, triples: np.ndarray) -> tuple[Vocab, Vocab]:
    """Entity and relation vocabularies from the folder's id maps, else built from ``triples``."""
    if map_files:
        return read_vocab(map_files[0]), read_vocab(map_files[1])
    return Vocab.build(np.concatenate([triples[:, 0], triples[:, 2]])), Vocab.build(triples[:, 1])


def _split_file(folder: Path, split: str) -> Path:
    found = [folder / f"{split}{suffix}" for suffix in SPLIT_SUFFIXES if (folder / f"{split}{suffix}").is_file()]
    if not found:
        raise DataError(folder / f"{split}.txt", None, f"the dataset folder has no {split} split",
                        "a dataset folder needs train.txt, valid.txt and test.txt (or .tsv, .txt.gz, .tsv.gz); "
                        "`kgtrace prepare --triples FILE --out FOLDER` makes one from a single triples file")
    if len(found) > 1:
        names = [f.name for f in found]
        both = f"both {names[0]} and {names[1]} exist" if len(found) == 2 else f"{', '.join(names)} all exist"
        raise DataError(found[1], None, both, f"keep only one {split} file")
    return found[0]


def dataset_inputs(source: str) -> list[str]:
    """The folder a dataset is read from (a remote one's cache folder; [] for a bundled one): --overwrite never
    replaces a folder holding it."""
    entry = DATASETS.get(str(source))
    if entry is None:
        return [str(source)]
    return [] if entry.bundled else [str(cache_folder(entry.name))]


def split_path(ds: Dataset, split: str) -> str:
    """Where a split of ``ds`` was read from: its file in a dataset folder or the cache, or 'BUNDLED:split'."""
    entry = DATASETS.get(ds.source)
    folder = cache_folder(ds.source) if entry and not entry.bundled else Path(ds.source)
    if (entry and entry.bundled) or not folder.is_dir():
        return f"{ds.source}:{split}"
    return str(_split_file(folder, split))


def _map_files(folder: Path) -> tuple[Path, Path] | None:
    """The first pair of id-map files present, or None; DataError if a pair is half present."""
    for entity_file, relation_file in MAP_FILES:
        have = ((folder / entity_file).is_file(), (folder / relation_file).is_file())
        if all(have):
            return folder / entity_file, folder / relation_file
        if any(have):
            present, absent = (entity_file, relation_file) if have[0] else (relation_file, entity_file)
            raise DataError(folder / absent, None, f"{present} is present but {absent} is missing",
                            f"add {absent}, or remove {present} to have ids built from the triples")
    return None


def _optional(folder: Path | None, name: str, read: Callable[[Path], T]) -> T | dict:
    """``read(folder / name)`` if that file exists, else an empty dict."""
    if folder is None or not (folder / name).is_file():
        return {}
    return read(folder / name)


def _edge_map_to_save(ds: Dataset) -> dict[str, str]:
    """The stored edge map; else one that reads back as ``relation_names`` exactly."""
    if ds.edge_map:
        return ds.edge_map
    return {json.dumps({"predicate": readable}): label for label, readable in ds.relation_names.items()}


def _refuse_existing(folder: Path, overwrite: bool) -> None:
    if overwrite or not folder.exists():
        return
    names = [f"{s}.txt" for s in SPLITS] + ["node_dict", "rel_dict", NAMES_FILE, EDGE_MAP_FILE, CATEGORIES_FILE]
    existing = [folder / n for n in names if (folder / n).exists()]
    if existing:
        raise DataError(existing[0], None, "the file already exists",
                        "save into an empty folder, or pass overwrite=True")
