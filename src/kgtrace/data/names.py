"""Readable names for entities and relations, and entity categories.

Node-name files have two tab-separated columns, ``id<TAB>name`` or ``name<TAB>id``, with an
optional header (``id``/``label``/``curie`` and ``name``, any case). Which column holds the id:

1. a header names it;
2. else, given the dataset's entities, the column with more values that are entity labels;
3. else, the column with more values that look like CURIEs (``prefix:local``, no spaces);
4. ties go to the first column (kgtrace writes ``label<TAB>name``).

``edge_map.json`` (ROBOKOP style) maps JSON-encoded predicate descriptions, e.g.
``{"predicate": "biolink:affects", "object_aspect_qualifier": "activity"}``, to relation
labels such as ``predicate:28``; `read_edge_map` inverts it to readable strings such as
``biolink:affects [object_aspect_qualifier=activity]``.

``node_categories.tsv`` holds ``label<TAB>cat1|cat2`` per line.
"""

from __future__ import annotations

import io
import json
import os
import re

import polars as pl

from kgtrace.compute.system import polars_usable
from kgtrace.core.errors import DataError
from kgtrace.core.io import atomic_write_text
from kgtrace.data._io import GZIP_ERRORS, check_tsv_values, open_binary, read_text, text_lines
from kgtrace.data.vocab import Vocab

CURIE = re.compile(r"^[A-Za-z_][\w.\-]*:\S+$")
ID_HEADERS = {"id", "label", "curie", "node", "node_id", "entity"}
NAME_HEADERS = {"name", "node_name", "entity_name"}
CATEGORY_SEPARATOR = "|"


def read_names(path: str | os.PathLike, entities: Vocab | None = None) -> dict[str, str]:
    """Read entity names: label -> name. With ``entities``, only names of those entities are kept."""
    frame = _pairs_fast(path)
    if frame is not None and _header_id_column(list(frame.row(0))) is None:
        a, b = frame.columns
        if entities is not None:
            hits = [int(frame[c].is_in(entities.label_series.implode()).sum()) for c in (a, b)]
        else:
            hits = [int(frame[c].str.contains(CURIE.pattern).sum()) for c in (a, b)]
        if hits != [0, 0] or entities is None:
            labels, names = (a, b) if hits[0] >= hits[1] else (b, a)
            if entities is not None:
                frame = frame.filter(pl.col(labels).is_in(entities.label_series.implode()))
            return dict(zip(frame[labels].to_list(), frame[names].to_list()))
    rows = _two_column_rows(path, "id<TAB>name")
    id_col = _header_id_column(rows[0][1]) if rows else None
    if id_col is not None:
        rows = rows[1:]
    elif rows:
        id_col = _guess_id_column(path, rows, entities)
    names = _collect(path, [(n, f[id_col], f[1 - id_col]) for n, f in rows], "name")
    if entities is not None:
        names = {label: name for label, name in names.items() if label in entities.to_id}
    return names


def write_names(names: dict[str, str], path: str | os.PathLike) -> None:
    """Write ``label<TAB>name`` lines, atomically."""
    _write_pairs(names, path, "name")


def read_categories(path: str | os.PathLike) -> dict[str, tuple[str, ...]]:
    """Read ``label<TAB>cat1|cat2`` lines: label -> categories."""
    frame = _pairs_fast(path)
    if frame is not None:
        a, b = frame.columns
        lists = frame[b].str.split(CATEGORY_SEPARATOR).list.eval(pl.element().filter(pl.element() != ""))
        return dict(zip(frame[a].to_list(), map(tuple, lists.to_list())))
    pairs = _collect(path, [(n, f[0], f[1]) for n, f in _two_column_rows(path, "label<TAB>cat1|cat2")], "category")
    return {label: tuple(c for c in cats.split(CATEGORY_SEPARATOR) if c) for label, cats in pairs.items()}


def write_categories(categories: dict[str, tuple[str, ...]], path: str | os.PathLike) -> None:
    """Write ``label<TAB>cat1|cat2`` lines, atomically."""
    _write_pairs({k: CATEGORY_SEPARATOR.join(v) for k, v in categories.items()}, path, "category")


def read_edge_map(path: str | os.PathLike) -> dict[str, str]:
    """Read ``edge_map.json`` and invert it: relation label -> readable predicate description."""
    return {label: describe_predicate(key) for key, label in read_edge_map_json(path).items()}


def read_edge_map_json(path: str | os.PathLike) -> dict[str, str]:
    """Read ``edge_map.json`` as stored: description -> relation label, checked to be one-to-one."""
    text = read_text(path)
    fix = 'write one JSON object: {"<predicate description>": "<relation label>", ...}'
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(path, e.lineno, f"invalid JSON: {e.msg} (column {e.colno})", fix) from None
    if not isinstance(data, dict):
        raise DataError(path, 1, f"expected a JSON object, found {type(data).__name__}", fix)
    seen: set[str] = set()
    for key, label in data.items():
        if not isinstance(label, str) or not label.strip():
            raise DataError(path, _line_of(text, key), f"the relation label of {key!r} is {label!r}, not a string",
                            'map each description to a relation label such as "predicate:0"')
        if label in seen:
            raise DataError(path, _line_of(text, key), f"relation label {label!r} is given to two descriptions",
                            "give each description its own relation label")
        seen.add(label)
    return data


def write_edge_map(edge_map: dict[str, str], path: str | os.PathLike) -> None:
    """Write ``edge_map.json`` (description -> relation label), one pair per line, atomically."""
    atomic_write_text(path, [json.dumps(edge_map, indent=2), "\n"])


def describe_predicate(key: str) -> str:
    """``'{"predicate": "p", "q": "v"}'`` -> ``'p [q=v]'``; a key that is not such JSON is kept as is."""
    try:
        desc = json.loads(key)
    except json.JSONDecodeError:
        return key
    if not isinstance(desc, dict) or "predicate" not in desc:
        return key
    qualifiers = [f"{k}={v}" for k, v in desc.items() if k != "predicate"]
    return str(desc["predicate"]) + (f" [{', '.join(qualifiers)}]" if qualifiers else "")


def _pairs_fast(path: str | os.PathLike) -> pl.DataFrame | None:
    """The two columns of a clean file (no blank or odd lines, no empty field, no label given two values) as a
    polars frame, each label once; None otherwise, and the line-by-line reader then names the problem (and reads
    the file where polars cannot run: `polars_usable`)."""
    if not polars_usable():
        return None
    try:
        with open_binary(path) as f:
            data = f.read()
    except GZIP_ERRORS:  # a damaged .gz: the line reader names the line where it breaks
        return None
    if not data or b"\r" in data or data.startswith(b"\xef\xbb\xbf") or b"\n\n" in data or data.startswith(b"\n"):
        return None
    try:
        frame = pl.read_csv(io.BytesIO(data), separator="\t", has_header=False, quote_char=None, infer_schema=False)
    except pl.exceptions.PolarsError:
        return None
    empty = pl.any_horizontal(pl.all().is_null() | (pl.all().str.strip_chars() == ""))
    if frame.width != 2 or frame.select(empty).to_series().any():
        return None
    unique = frame.unique(maintain_order=True)
    if unique[unique.columns[0]].is_duplicated().any():
        return None
    return unique


def _two_column_rows(path: str | os.PathLike, layout: str) -> list[tuple[int, list[str]]]:
    """Non-blank lines split on tabs, each checked to have two fields."""
    rows = []
    for n, text in text_lines(path):
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) != 2:
            raise DataError(path, n, f"expected 2 tab-separated fields ({layout}), found {len(fields)}",
                            f"write each line as {layout}")
        rows.append((n, fields))
    return rows


def _header_id_column(fields: list[str]) -> int | None:
    """Index of the id column if ``fields`` is a header row, else None."""
    lowered = [f.strip().lower() for f in fields]
    for id_col in (0, 1):
        if lowered[id_col] in ID_HEADERS and lowered[1 - id_col] in NAME_HEADERS:
            return id_col
    return None


def _guess_id_column(path: str | os.PathLike, rows: list[tuple[int, list[str]]], entities: Vocab | None) -> int:
    if entities is not None:
        hits = [sum(f[c] in entities.to_id for _, f in rows) for c in (0, 1)]
        if hits == [0, 0]:
            raise DataError(path, None, "neither column holds labels of the dataset's entities",
                            "use the entity labels of the dataset (as in node_dict) in one column")
    else:
        hits = [sum(bool(CURIE.match(f[c])) for _, f in rows) for c in (0, 1)]
    return 0 if hits[0] >= hits[1] else 1


def _collect(path: str | os.PathLike, triples: list[tuple[int, str, str]], what: str) -> dict[str, str]:
    """label -> value; DataError on an empty field or a label given two different values."""
    out: dict[str, str] = {}
    line_of: dict[str, int] = {}
    for n, label, value in triples:
        if not label.strip() or not value.strip():
            raise DataError(path, n, f"empty label or {what}", "fill in both columns or delete the line")
        if label in out and out[label] != value:
            raise DataError(path, n, f"{label!r} already has {what} {out[label]!r} on line {line_of[label]}",
                            f"give each label one {what}")
        out[label], line_of[label] = value, n
    return out


def _write_pairs(pairs: dict[str, str], path: str | os.PathLike, what: str) -> None:
    check_tsv_values(path, "label", pl.Series(list(pairs.keys()), dtype=pl.String))
    check_tsv_values(path, what, pl.Series(list(pairs.values()), dtype=pl.String))
    atomic_write_text(path, (f"{label}\t{value}\n" for label, value in pairs.items()))


def _line_of(text: str, key: str) -> int | None:
    """Line of a JSON object key in ``text``, or None if it cannot be found verbatim."""
    for encoded in (json.dumps(key), json.dumps(key, ensure_ascii=False)):
        at = text.find(encoded)
        if at >= 0:
            return text.count("\n", 0, at) + 1
    return None
