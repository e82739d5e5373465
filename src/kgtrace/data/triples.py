"""Labelled triple files: ``head<TAB>relation<TAB>tail``, one triple per line.

Accepted: an optional header line (e.g. ``subject predicate object`` or ``head relation tail``,
any case), CRLF line endings, a UTF-8 BOM, blank lines and lines starting with ``#``
(comments; so a label cannot start with ``#``). Fields are taken verbatim (no trimming).

Reading has two paths that return identical results on valid input: a fast polars reader
for the normal case, and a line-by-line reference reader used whenever the fast one fails
or finds something odd, so that every error names the exact line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import polars as pl
import torch

from kgtrace.compute.system import polars_usable
from kgtrace.core.errors import DataError, UnknownLabel
from kgtrace.core.io import atomic_path
from kgtrace.data._io import (
    BOM,
    check_file,
    check_text_start,
    check_tsv_values,
    object_column,
    raw_lines,
    strings_to_object_array,
    text_lines,
)
from kgtrace.data.vocab import Vocab

FIELDS = ("head", "relation", "tail")
HEADER_WORDS = (
    {"head", "subject", "source", "h", "s", "from", "head_label", "subject_id"},
    {"relation", "predicate", "rel", "r", "p", "edge", "relation_label", "predicate_label"},
    {"tail", "object", "target", "t", "o", "to", "tail_label", "object_id"},
)
_SCAN_BLOCK = 1 << 26  # bytes per block when scanning for line starts


#: A label that would silently become one of its own: white space at its start or end (what strip() removes),
#: or a control character or byte-order mark inside (the same pattern in Python and in polars' regex).
BAD_LABEL = re.compile(r"^\s|\s$|[\x00-\x08\x0b-\x1f\x7f\ufeff]")


def read_labeled_triples(path: str | os.PathLike) -> np.ndarray:
    """Read a triple file into an object array of str ``[n, 3]`` (head, relation, tail)."""
    return _read(path, want_lines=False)[0]


def read_labeled_triples_with_lines(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Like `read_labeled_triples`, plus the 1-based line of each triple, int64 ``[n]``."""
    triples, lines = _read(path, want_lines=True)
    assert lines is not None
    return triples, lines


def read_labeled_triples_slow(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """The line-by-line reference reader: ``(triples [n, 3] object, lines [n] int64)``."""
    rows: list[list[str]] = []
    lines: list[int] = []
    seen_data = False
    for n, text in text_lines(path):
        if not text.strip() or text.startswith("#"):
            continue
        fields = text.split("\t")
        if not seen_data:
            seen_data = True
            if is_header(fields):
                continue
        _check_fields(path, n, fields)
        rows.append(fields)
        lines.append(n)
    array = np.empty((len(rows), 3), dtype=object)
    if rows:
        array[:] = rows
    return array, np.asarray(lines, dtype=np.int64)


def is_header(fields: list[str]) -> bool:
    """True if three fields name the columns (e.g. subject/predicate/object), any case."""
    return len(fields) == 3 and all(f.strip().lower() in w for f, w in zip(fields, HEADER_WORDS))


def write_labeled_triples(triples: np.ndarray, path: str | os.PathLike) -> None:
    """Write an object array ``[n, 3]`` as headerless TSV, atomically.

    DataError if a label is empty, holds a tab or line break, or a head starts with ``#``,
    since the file would not read back as the same triples.
    """
    assert triples.ndim == 2 and triples.shape[1] == 3, f"expected [n, 3], got {triples.shape}"
    frame = pl.DataFrame({name: object_column(triples[:, i]) for i, name in enumerate(FIELDS)})
    for name in FIELDS:
        check_tsv_values(path, f"{name} label", frame[name])
    _check_rereadable(path, frame)
    _write_frame(frame, path)


def write_id_triples(triples: torch.Tensor, entities: Vocab, relations: Vocab, path: str | os.PathLike) -> None:
    """Write id triples ``[n, 3]`` as labelled headerless TSV, atomically (as `write_labeled_triples`),
    taking the labels from the vocabs column by column: no Python string per triple."""
    ids = triples.cpu().numpy()
    check_tsv_values(path, "entity label", entities.label_series)  # each label once, not once per triple
    check_tsv_values(path, "relation label", relations.label_series)
    labels = (entities.label_series, relations.label_series, entities.label_series)
    frame = pl.DataFrame({name: labels[i].gather(ids[:, i]) for i, name in enumerate(FIELDS)})
    _check_rereadable(path, frame)
    _write_frame(frame, path)


def _write_frame(frame: pl.DataFrame, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        frame.write_csv(tmp, separator="\t", include_header=False, quote_style="never", line_terminator="\n")


def encode_triples(
    labeled: np.ndarray,
    entities: Vocab,
    relations: Vocab,
    path: str | os.PathLike,
    *,
    lines: np.ndarray | None = None,
    id_maps: tuple[str, str] = ("node_dict", "rel_dict"),
    from_run: bool = False,
) -> torch.Tensor:
    """Map labelled triples ``[n, 3]`` to ids: LongTensor ``[n, 3]`` (h, r, t).

    ``path`` (and ``lines``, the 1-based line of each triple) are used to locate the first
    triple with an unknown label in the DataError. Without ``lines``, the line is found by
    re-reading ``path`` when it holds exactly these triples. ``id_maps`` names the entity and
    relation map files the message points to; ``from_run`` says they are a trained run's maps,
    which cannot be edited (the model has one row per label).
    """
    if len(labeled) == 0:
        return torch.empty((0, 3), dtype=torch.int64)
    ids = np.stack(
        [entities.lookup(labeled[:, 0]), relations.lookup(labeled[:, 1]), entities.lookup(labeled[:, 2])], axis=1
    )
    bad_rows = np.flatnonzero((ids < 0).any(axis=1))
    if bad_rows.size:
        _raise_unknown(labeled, ids, int(bad_rows[0]), int(bad_rows.size), path, lines, id_maps, from_run)
    return torch.from_numpy(ids.astype(np.int64, copy=False))


def _raise_unknown(
    labeled: np.ndarray, ids: np.ndarray, row: int, count: int, path: str | os.PathLike, lines: np.ndarray | None,
    id_maps: tuple[str, str], from_run: bool,
) -> None:
    column = int(np.flatnonzero(ids[row] < 0)[0])
    kind = "relation" if column == 1 else "entity"
    id_map = id_maps[1] if kind == "relation" else id_maps[0]
    line = int(lines[row]) if lines is not None else _line_of_row(path, labeled, row)
    where = "" if line is not None else f"triple #{row + 1} "
    fix = (f"remove the triples that use it, or train a new run on this data (the run's {id_map} is fixed)"
           if from_run else f"add the {kind} to {id_map}, or remove the triples that use it")
    raise UnknownLabel(
        path,
        line,
        f"{where}{FIELDS[column]} {labeled[row, column]!r} is not in the {kind} id map {id_map} "
        f"({count} triple(s) with unknown labels in all)",
        fix,
    )


def _line_of_row(path: str | os.PathLike, labeled: np.ndarray, row: int) -> int | None:
    """The line of ``labeled[row]`` in ``path``, if the file holds exactly ``labeled``."""
    if not Path(path).is_file():
        return None
    try:
        again, lines = read_labeled_triples_with_lines(path)
    except DataError:
        return None
    if again.shape != labeled.shape or not np.array_equal(again[row], labeled[row]):
        return None
    return int(lines[row])


def _check_fields(path: str | os.PathLike, n: int, fields: list[str]) -> None:
    if len(fields) != 3:
        hint = " (the line has no tab; separate fields with tabs, not spaces)" if len(fields) == 1 else ""
        raise DataError(
            path, n, f"expected 3 tab-separated fields (head, relation, tail), found {len(fields)}{hint}",
            "put exactly one tab between head, relation and tail, with no trailing tab",
        )
    for name, value in zip(FIELDS, fields):
        if not value.strip():
            raise DataError(path, n, f"the {name} field is empty", f"fill in the {name} or delete the line")
        if value != value.strip():
            raise DataError(path, n, f"the {name} {value!r} has white space at its start or end: it would be a label "
                            f"of its own beside {value.strip()!r}", "remove the spaces around the label")
        if BAD_LABEL.search(value):
            raise DataError(path, n, f"the {name} {value!r} holds a control character or a byte-order mark "
                            "(an editor's or a concatenation's leftover): it would be a label of its own",
                            "remove that character from the label")


def _check_rereadable(path: str | os.PathLike, frame: pl.DataFrame) -> None:
    comment = frame["head"].str.starts_with("#")
    if comment.any():
        value = frame["head"].filter(comment)[0]
        raise DataError(path, None, f"cannot write head {value!r}: a line starting with '#' is a comment",
                        "rename labels that start with '#'")
    if frame.height and is_header(list(frame.row(0))):
        raise DataError(path, None, f"cannot write {frame.row(0)} first: it would read back as a header",
                        "rename those labels")


def _read(path: str | os.PathLike, *, want_lines: bool) -> tuple[np.ndarray, np.ndarray | None]:
    check_text_start(check_file(path))
    fast = _read_fast(path, want_lines=want_lines)
    if fast is not None:
        return fast
    return read_labeled_triples_slow(path)


def _read_fast(path: str | os.PathLike, *, want_lines: bool) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The polars reader; None whenever anything is unusual, so the reference reader decides (and where
    polars cannot run: a process forked after it was imported, `polars_usable`)."""
    if not polars_usable():
        return None
    # polars takes the column count from the first line it parses, so start at the first data line.
    skip = _leading_skippable_lines(path)
    try:
        frame = pl.read_csv(
            path, separator="\t", has_header=False, quote_char=None, comment_prefix="#",
            infer_schema=False, skip_lines=skip,
        )
    except (pl.exceptions.PolarsError, OSError):
        return None  # e.g. ragged lines, invalid UTF-8, nothing but comments, a damaged .gz
    if frame.width != 3:
        return None
    frame.columns = list(FIELDS)
    # polars keeps blank lines as all-null rows: that is the only kind of null we accept here.
    blank = frame.select(pl.all_horizontal(pl.all().is_null())).to_series()
    empty = frame.select(pl.any_horizontal(pl.all().is_null() | (pl.all().str.strip_chars() == ""))).to_series()
    bad = frame.select(pl.any_horizontal(pl.all().str.contains(BAD_LABEL.pattern))).to_series().fill_null(False)
    if (empty & ~blank).any() or bad.any():  # the reference reader names the line
        return None
    lines = None
    if want_lines:
        lines = _uncommented_line_numbers(path)
        lines = lines[lines > skip]
        if len(lines) != frame.height:
            return None
        lines = lines[~blank.to_numpy()]
    frame = frame.filter(~blank)
    if frame.height and is_header(list(frame.row(0))):
        frame = frame.slice(1)
        lines = None if lines is None else lines[1:]
    return strings_to_object_array(frame), lines


def _leading_skippable_lines(path: str | os.PathLike) -> int:
    """How many lines (blank or comment) precede the first data line."""
    for n, text in text_lines(path):
        if text.strip() and not text.startswith("#"):
            return n - 1
    return 0


def _uncommented_line_numbers(path: str | os.PathLike) -> np.ndarray:
    """1-based numbers of the lines not starting with '#' (blank lines included), int64."""
    if Path(path).suffix == ".gz":  # the scan below reads raw bytes, which would be the compressed ones
        return np.asarray([n for n, raw in enumerate(raw_lines(path), 1)
                           if not (raw.removeprefix(BOM.encode()) if n == 1 else raw).startswith(b"#")], dtype=np.int64)
    size = os.path.getsize(path)
    if size == 0:
        return np.empty(0, dtype=np.int64)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    newlines = [np.flatnonzero(data[i : i + _SCAN_BLOCK] == 0x0A) + i for i in range(0, size, _SCAN_BLOCK)]
    starts = np.concatenate([[0], *[nl + 1 for nl in newlines]])
    starts = starts[starts < size]  # the "line" after a final newline does not exist
    first = data[starts].copy()
    if size >= 3 and bytes(data[:3]) == b"\xef\xbb\xbf":
        first[0] = data[3] if size > 3 else 0
    return np.flatnonzero(first != ord("#")).astype(np.int64) + 1
