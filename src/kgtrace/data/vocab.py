"""Id maps between labels (entity CURIEs, relation names) and contiguous integer ids.

Formats read by `read_vocab` (detected from the content, so any file name works):

* kgtrace / ROBOKOP ``node_dict`` and ``rel_dict``: ``label<TAB>id`` per line, no header.
* PyKEEN ``entity_to_id.tsv`` / ``relation_to_id.tsv`` (optionally ``.gz``): a header line
  ``id<TAB>label``, then ``id<TAB>label`` per line.
* OpenKE ``entity2id.txt`` / ``relation2id.txt``: a first line holding only the number of
  entries, then ``label<TAB>id`` per line.

Ids must be exactly 0..n-1 (lines in any order) and labels unique. A UTF-8 BOM, CRLF line
endings and blank lines are accepted.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl

from kgtrace.compute.system import polars_usable
from kgtrace.core.errors import DataError
from kgtrace.core.io import atomic_write_text
from kgtrace.data._io import check_tsv_values, text_lines


@dataclass(frozen=True)
class Vocab:
    """An ordered set of labels; the position of a label is its id."""

    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(self.labels))
        if len(set(self.labels)) != len(self.labels):
            raise ValueError("Vocab labels must be unique")

    def __len__(self) -> int:
        return len(self.labels)

    @cached_property
    def to_id(self) -> dict[str, int]:
        """label -> id, built once on first use."""
        return {label: i for i, label in enumerate(self.labels)}

    def index(self) -> dict[str, int]:
        """label -> id (same dict as `to_id`)."""
        return self.to_id

    @cached_property
    def label_series(self) -> pl.Series:
        """The labels in id order, as a polars String series (built once)."""
        return pl.Series(self.labels, dtype=pl.String)

    def lookup(self, labels: Sequence[str] | np.ndarray) -> np.ndarray:
        """Ids of ``labels`` as int64 ``[n]``, with -1 for labels not in the vocab."""
        if not polars_usable():  # a forked child (kgtrace.compute.system.polars_usable): the label -> id dict
            return np.fromiter((self.to_id.get(label, -1) for label in labels), dtype=np.int64, count=len(labels))
        values = pl.Series(values=np.asarray(labels, dtype=object), dtype=pl.String)
        ids = values.replace_strict(
            self.label_series,
            pl.int_range(len(self), eager=True),
            default=-1,
            return_dtype=pl.Int64,
        )
        return ids.to_numpy().astype(np.int64, copy=False)

    def encode(self, labels: Sequence[str] | np.ndarray) -> np.ndarray:
        """Ids of ``labels`` as int64 ``[n]``; KeyError naming the first unknown label."""
        ids = self.lookup(labels)
        unknown = np.flatnonzero(ids < 0)
        if unknown.size:
            first = unknown[0]
            raise KeyError(
                f"{np.asarray(labels, dtype=object)[first]!r} (position {first}) is not in the "
                f"vocabulary; {unknown.size} unknown label(s) in all"
            )
        return ids

    def digest(self) -> str:
        """sha256 hex of the labels in id order; equal digests mean identical id maps."""
        return hashlib.sha256("\n".join(self.labels).encode("utf-8")).hexdigest()

    @classmethod
    def build(cls, labels: Iterable[str]) -> Vocab:
        """Vocab of the sorted distinct labels (the same ids PyKEEN assigns)."""
        return cls(tuple(sorted(set(labels))))


def read_vocab(path: str | os.PathLike) -> Vocab:
    """Read an id map in any supported format (see the module docstring)."""
    rows = [(n, text) for n, text in text_lines(path) if text.strip()]
    if not rows:
        raise DataError(path, None, "the id map is empty", "write one `label<TAB>id` line per label")
    first_line, first = rows[0]
    head = first.split("\t")
    if [f.strip().lower() for f in head] == ["id", "label"]:
        entries = [_parse_entry(path, n, text, label_first=False) for n, text in rows[1:]]
    elif len(head) == 1 and first.strip().isdigit():
        entries = [_parse_entry(path, n, text, label_first=True) for n, text in rows[1:]]
        _check_count(path, first_line, int(first.strip()), len(entries))
    else:
        entries = [_parse_entry(path, n, text, label_first=True) for n, text in rows]
    return Vocab(_labels_by_id(path, entries))


def write_vocab(vocab: Vocab, path: str | os.PathLike) -> None:
    """Write ``label<TAB>id`` lines in id order (node_dict format), atomically."""
    check_tsv_values(path, "label", vocab.label_series)
    atomic_write_text(path, (f"{label}\t{i}\n" for i, label in enumerate(vocab.labels)))


def _parse_entry(path: str | os.PathLike, n: int, text: str, *, label_first: bool) -> tuple[int, str, int]:
    """Parse one map line into ``(line, label, id)``."""
    layout = "label<TAB>id" if label_first else "id<TAB>label"
    fields = text.split("\t")
    if len(fields) != 2:
        raise DataError(
            path, n, f"expected 2 tab-separated fields ({layout}), found {len(fields)}",
            f"write each line as {layout}; PyKEEN files start with the header `id<TAB>label`",
        )
    label, raw_id = fields if label_first else fields[::-1]
    if not raw_id.strip().isdigit():
        raise DataError(path, n, f"id {raw_id!r} is not a non-negative integer", f"write each line as {layout}")
    if not label.strip():
        raise DataError(path, n, "the label is empty", "give every id a label, or delete the line")
    return n, label, int(raw_id.strip())


def _check_count(path: str | os.PathLike, line: int, count: int, found: int) -> None:
    if count != found:
        raise DataError(
            path, line, f"the first line says {count} entries but the file has {found}",
            f"set the first line to {found}",
        )


def _labels_by_id(path: str | os.PathLike, entries: list[tuple[int, str, int]]) -> tuple[str, ...]:
    """Labels ordered by id; DataError on a repeated label or id, or a gap in 0..n-1."""
    line_of_label: dict[str, int] = {}
    label_of_id: dict[int, str] = {}
    line_of_id: dict[int, int] = {}
    for n, label, i in entries:
        if label in line_of_label:
            raise DataError(
                path, n, f"label {label!r} already has an id on line {line_of_label[label]}",
                "give every label exactly one id",
            )
        if i in label_of_id:
            raise DataError(
                path, n, f"id {i} is already used on line {line_of_id[i]}",
                "give every label its own id, numbered 0..n-1",
            )
        line_of_label[label], label_of_id[i], line_of_id[i] = n, label, n
    size = len(entries)
    missing = next((i for i in range(size) if i not in label_of_id), None)
    if missing is not None:
        raise DataError(
            path, None, f"ids must be exactly 0..{size - 1} but id {missing} is missing "
            f"(largest id is {max(label_of_id)})",
            "renumber the ids contiguously from 0",
        )
    return tuple(label_of_id[i] for i in range(size))
