"""Turn a labelled triple file or a KGX graph into a dataset folder that load_dataset reads.

The folder is built in a temporary sibling and renamed into place, so a crash never leaves
a folder that looks complete. A non-empty output folder is refused unless ``overwrite``, and
even then replaced only if kgtrace prepared it and it holds none of the inputs (kgtrace.core.owned).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from kgtrace.core.errors import ConfigError, DataError, KgtraceError, option, option_name
from kgtrace.core.io import atomic_folder, foreign_files
from kgtrace.core.owned import check_out_folder, read_mark, write_mark
from kgtrace.data._io import object_column
from kgtrace.data.dataset import Dataset, save_dataset
from kgtrace.data.kgx import check_category_pairs, distinct_rows, present, read_kgx
from kgtrace.data.names import describe_predicate, read_names
from kgtrace.data.splits import SplitReport, check_fractions, holdout_relations, random_split
from kgtrace.data.triples import read_labeled_triples
from kgtrace.data.vocab import Vocab

SPLIT_METHODS = ("random", "predicate")
INPUT_FILES = {  # what each input option names, for messages
    "triples": "file of labelled triples (head<TAB>relation<TAB>tail per line)",
    "nodes": "KGX nodes file (.tsv or .jsonl)",
    "edges": "KGX edges file (.tsv or .jsonl)",
    "names": "node-name file (id<TAB>name per line)",
}


@dataclass(frozen=True)
class PrepareReport:
    """Counts from one prepare run."""

    out: str  # absolute path of the dataset folder
    input_kind: str  # "triples" or "kgx"
    read: int  # triples read (TSV lines, or KGX edges)
    dropped_predicate: int
    dropped_category: int
    dropped_unknown_node: int
    duplicates: int
    split: str
    moved_to_train: int  # valid/test triples moved to train so their entities are seen in training
    dropped_unseen: int  # valid/test triples dropped for that reason (predicate holdout)
    train: int
    valid: int
    test: int
    entities: int
    relations: int
    kept: tuple[str, ...] = ()  # with --overwrite: the files in the folder that kgtrace did not write, kept

    def summary(self) -> str:
        """A few human-readable lines."""
        return "\n".join([
            f"prepared {self.out}",
            f"  read {self.read} {'edges' if self.input_kind == 'kgx' else 'triples'}; dropped "
            f"{self.dropped_predicate} by predicate, {self.dropped_category} by category, "
            f"{self.dropped_unknown_node} with unknown nodes, {self.duplicates} duplicates",
            f"  {self.split} split: {self.train} train / {self.valid} valid / {self.test} test; "
            f"{self.moved_to_train} moved to train and {self.dropped_unseen} dropped as unseen in train",
            f"  {self.entities} entities, {self.relations} relations",
            *([f"  kept {len(self.kept)} file(s) kgtrace did not write there: {', '.join(self.kept)}"] if self.kept else []),
        ])


@dataclass(frozen=True)
class _Cut:
    """Input triples after filtering and removing repeats, before splitting: integer codes, and their labels."""

    codes: np.ndarray  # int64 [n, 3]: node, relation, node codes
    nodes: pl.Series  # String: the label of each node code
    relations: tuple[str, ...]  # the label of each relation code
    names: dict[str, str]
    categories: dict[str, tuple[str, ...]]
    edge_map: dict[str, str]
    counts: dict[str, int]  # read, dropped_predicate, dropped_category, dropped_unknown_node, duplicates


def prepare(
    out: str | os.PathLike,
    *,
    triples: str | None = None,
    nodes: str | None = None,
    edges: str | None = None,
    category_pairs: Sequence[tuple[str, str]] = (),
    drop_predicates: Sequence[str] = (),
    fold_qualifiers: bool = True,
    split: str = "random",
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    holdout_predicate: str | None = None,
    holdout_fraction: float = 1.0,
    names: str | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> PrepareReport:
    """Build a dataset folder at ``out`` from ``triples`` (labelled TSV) or ``nodes`` + ``edges`` (KGX).

    Give either ``triples`` or both ``nodes`` and ``edges``.

    Args:
        out: the dataset folder to write.
        triples: a labelled TSV file, ``head<TAB>relation<TAB>tail`` per line.
        nodes: a KGX nodes file (TSV or JSON lines, optionally gzipped); its names and categories are kept.
        edges: the KGX edges file of those nodes, likewise.
        category_pairs: KGX only: keep the edges between these node categories, either direction
            (``[("biolink:ChemicalEntity", "biolink:Disease")]``); none given: every edge.
        drop_predicates: predicates (relations) to leave out, in either input.
        fold_qualifiers: KGX only: make a predicate with its qualifiers one relation
            (``biolink:affects`` with ``object_direction_qualifier=increased``), as ROBOKOP's exports mean them.
        split: ``"random"``: ``fractions`` of the triples in train, valid and test; ``"predicate"``: every
            triple of ``holdout_predicate`` in test, ``fractions[1]`` of the rest in valid.
        fractions: the (train, valid, test) shares of ``split="random"``, summing to 1.
        holdout_predicate: the relation ``split="predicate"`` holds out (``"biolink:treats"``).
        holdout_fraction: the share of that relation's triples held out; the rest stays in training.
        names: a node-name file (``id<TAB>name`` or ``name<TAB>id``); its names win over the KGX nodes'.
        seed: the split's random seed.
        overwrite: replace a dataset folder kgtrace wrote at ``out``.

    Returns:
        A `PrepareReport`: the triples read and dropped (and why), and each split's size.

    Raises:
        ConfigError: listing every problem with the options at once.
        DataError: an input line cannot be read, naming the file and line.
    """
    out = Path(out)
    problems = _option_problems(
        out, triples, nodes, edges, category_pairs, drop_predicates, split, fractions, holdout_predicate, names,
        seed, overwrite,
    )
    if problems:
        raise ConfigError(problems)
    if triples is not None:
        cut = _cut_triples(triples, drop_predicates)
    else:
        assert nodes is not None and edges is not None
        cut = _cut_kgx(nodes, edges, category_pairs, drop_predicates, fold_qualifiers)
    if len(cut.codes) == 0:
        raise ConfigError([f"input: no triples left after filtering ({cut.counts}); "
                           "check --category-pair and --drop-predicate against the input"])
    if split == "random":
        train, valid, test, report = random_split(cut.codes, fractions, seed)
    else:
        assert holdout_predicate is not None
        held = _held_relations(cut, holdout_predicate)
        train, valid, test, report = holdout_relations(cut.codes, held, fractions[1], seed, holdout_fraction)
    ds = _dataset(out, train, valid, test, cut, names)
    kept = tuple(foreign_files(out)) if read_mark(out) is not None else ()  # the swap moves them into the new folder
    with atomic_folder(out) as tmp:  # a temporary sibling, swapped into place whole
        write_mark(tmp, "dataset")  # first: every file written after it is listed as kgtrace's
        save_dataset(ds, tmp)
    return dataclasses.replace(_report(out, "triples" if triples is not None else "kgx", cut, split, report, ds),
                               kept=kept)


def _option_problems(
    out: Path, triples: str | None, nodes: str | None, edges: str | None, category_pairs: Sequence[tuple[str, str]],
    drop_predicates: Sequence[str], split: str, fractions: Sequence[float], holdout: str | None,
    names: str | None, seed: int, overwrite: bool,
) -> list[str]:
    problems = _input_problems(triples, nodes, edges, names)
    if category_pairs and triples is not None:
        problems.append(f"{option_name('--category-pair', 'category_pairs')}: needs KGX input ({option_name('--nodes')} and "
                        f"{option_name('--edges')}), not {option_name('--triples')}")
    problems += check_category_pairs(category_pairs)
    if isinstance(drop_predicates, str) or not all(isinstance(p, str) for p in drop_predicates):
        problems.append(f"{option_name('--drop-predicate', 'drop_predicates')}: {drop_predicates!r} must be a list of predicates")
    problems += _split_problems(split, fractions, holdout)
    if not isinstance(seed, int) or isinstance(seed, bool):
        problems.append(f"{option_name('--seed')}: {seed!r} must be an integer")
    problems += _out_problems(out, overwrite, [triples, nodes, edges, names])
    return problems


def _input_problems(triples: str | None, nodes: str | None, edges: str | None, names: str | None) -> list[str]:
    problems = []
    if triples is not None and (nodes is not None or edges is not None):
        problems.append(f"input: give either {option_name('--triples')} or {option_name('--nodes')} and "
                        f"{option_name('--edges')}, not both")
    elif triples is None and (nodes is None or edges is None):
        problems.append(f"input: give {option_name('--triples')} FILE (labelled TSV), or both "
                        f"{option_name('--nodes')} FILE and {option_name('--edges')} FILE (KGX)")
    for key, value in (("triples", triples), ("nodes", nodes), ("edges", edges), ("names", names)):
        if value is None or Path(value).is_file():
            continue
        if Path(value).is_dir():
            problems.append(f"{key}: {str(value)!r} is a folder; give the {INPUT_FILES[key]} itself, not its folder")
        else:
            problems.append(f"{key}: file {str(value)!r} not found; check the path")
    return problems


def _split_problems(split: str, fractions: Sequence[float], holdout: str | None) -> list[str]:
    if split not in SPLIT_METHODS:
        return [f"--split: {split!r} is not one of {', '.join(SPLIT_METHODS)}"]
    problems = check_fractions(fractions)
    if split == "predicate" and not holdout:
        problems.append(f"{option_name('--holdout-predicate')}: {option('--split', 'predicate')} needs the relation to hold out, "
                        f"e.g. {option_name('--holdout-predicate')} biolink:treats")
    if split == "random" and holdout:
        problems.append(f"{option_name('--holdout-predicate')} {holdout!r}: is only used with "
                        f"{option('--split', 'predicate')}; add {option('--split', 'predicate')}")
    return problems


def _out_problems(out: Path, overwrite: bool, inputs: Sequence[str | None]) -> list[str]:
    """Whether ``out`` may receive the dataset: new, empty, or a prepared dataset --overwrite may replace."""
    try:
        check_out_folder(out, kind="dataset", overwrite=overwrite, inputs=inputs)
    except KgtraceError as e:
        return [str(e)]
    return []


def _cut_triples(path: str, drop_predicates: Sequence[str]) -> _Cut:
    labeled = read_labeled_triples(path)
    if len(labeled) == 0:
        raise DataError(path, None, "the file holds no triples",
                        "write one triple per line: head<TAB>relation<TAB>tail")
    heads, relations, tails = (object_column(labeled[:, i]) for i in range(3))
    keep = ~relations.is_in(pl.Series(list(drop_predicates), dtype=pl.String).implode())
    heads, relations, tails = heads.filter(keep), relations.filter(keep), tails.filter(keep)
    nodes = pl.concat([heads, tails]).unique(maintain_order=True)
    relation_labels = relations.unique(maintain_order=True)
    codes = distinct_rows(np.stack([_codes(heads, nodes), _codes(relations, relation_labels), _codes(tails, nodes)], 1))
    counts = {"read": len(labeled), "dropped_predicate": int((~keep).sum()), "dropped_category": 0,
              "dropped_unknown_node": 0, "duplicates": len(heads) - len(codes)}
    return _Cut(codes, nodes, tuple(relation_labels.to_list()), {}, {}, {}, counts)


def _codes(values: pl.Series, labels: pl.Series) -> np.ndarray:
    """int64 [n]: the position of each value in ``labels``."""
    return values.replace_strict(labels, pl.int_range(len(labels), eager=True), return_dtype=pl.Int64).to_numpy()


def _cut_kgx(
    nodes: str, edges: str, category_pairs: Sequence[tuple[str, str]], drop_predicates: Sequence[str], fold: bool
) -> _Cut:
    kgx = read_kgx(nodes, edges, category_pairs=category_pairs, drop_predicates=drop_predicates, fold_qualifiers=fold)
    counts = {key: kgx.report[key] for key in ("dropped_predicate", "dropped_category", "dropped_unknown_node", "duplicates")}
    return _Cut(kgx.codes, kgx.nodes, kgx.relations, kgx.names, kgx.categories, kgx.edge_map,
                {"read": kgx.report["edges_read"], **counts})


def _held_relations(cut: _Cut, predicate: str) -> list[int]:
    """The codes of the relations to hold out: ``predicate`` itself if it is one, else every folded
    KGX relation (``predicate:<n>``) whose description has that predicate."""
    if predicate in cut.relations:
        labels = [predicate]
    else:
        labels = [label for key, label in cut.edge_map.items()
                  if label in cut.relations and json.loads(key).get("predicate") == predicate]
    if not labels:
        raise ConfigError([f"{option_name('--holdout-predicate')}: {predicate!r} is not a relation of the triples; "
                           "use one of the "
                           f"relation labels (or KGX predicates) in the input, e.g. {', '.join(cut.relations[:5])}"])
    return [cut.relations.index(label) for label in labels]


def _dataset(out: Path, train: np.ndarray, valid: np.ndarray, test: np.ndarray, cut: _Cut, names: str | None) -> Dataset:
    every = np.concatenate([train, valid, test])
    used_nodes, used_relations = present(every[:, [0, 2]], len(cut.nodes)), present(every[:, 1], len(cut.relations))
    node_labels = cut.nodes.gather(used_nodes)
    entities = Vocab.build(node_labels.to_list())  # sorted labels: the ids PyKEEN assigns
    relations = Vocab.build([cut.relations[i] for i in used_relations])
    entity_id = np.full(len(cut.nodes), -1, dtype=np.int64)
    entity_id[used_nodes] = entities.lookup(node_labels.to_numpy())
    relation_id = np.full(len(cut.relations), -1, dtype=np.int64)
    relation_id[used_relations] = relations.lookup([cut.relations[i] for i in used_relations])

    def encode(codes: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.stack([entity_id[codes[:, 0]], relation_id[codes[:, 1]], entity_id[codes[:, 2]]],
                                         axis=1).reshape(-1, 3))

    entity_names = cut.names | (read_names(names, entities) if names else {})
    known = entities.to_id
    edge_map = {k: v for k, v in cut.edge_map.items() if v in relations.to_id}
    return Dataset(
        name=out.name, source=str(out.resolve()), entities=entities, relations=relations,
        train=encode(train), valid=encode(valid), test=encode(test),
        entity_names={k: v for k, v in entity_names.items() if k in known},
        entity_categories={k: v for k, v in cut.categories.items() if k in known},
        relation_names={v: describe_predicate(k) for k, v in edge_map.items()},
        edge_map=edge_map,
    )


def _report(out: Path, kind: str, cut: _Cut, split: str, report: SplitReport, ds: Dataset) -> PrepareReport:
    return PrepareReport(
        out=str(out.resolve()), input_kind=kind, read=cut.counts["read"],
        dropped_predicate=cut.counts["dropped_predicate"], dropped_category=cut.counts["dropped_category"],
        dropped_unknown_node=cut.counts["dropped_unknown_node"], duplicates=cut.counts["duplicates"],
        split=split, moved_to_train=report.moved_to_train, dropped_unseen=report.dropped,
        train=report.train, valid=report.valid, test=report.test,
        entities=ds.num_entities, relations=ds.num_relations,
    )
