"""Shared file helpers for the data layer: line reading with exact line numbers (writes: kgtrace.io).

Every reader reports problems as :class:`~kgtrace.errors.DataError` naming the file and the
1-based line; every writer writes to a temporary file next to the target and renames it into
place, so a crash never leaves a half-written file under the final name.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl

from kgtrace.errors import DataError

BOM = "\ufeff"
UTF8_FIX = "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in > out`)"
# Characters that a TSV field cannot hold without breaking the line structure.
TSV_FORBIDDEN = r"[\t\r\n]"


def check_file(path: str | os.PathLike) -> Path:
    """Return ``path`` as a Path; DataError if it is missing or not a regular file."""
    p = Path(path)
    if not p.exists():
        raise DataError(p, None, "file not found", "check the path, or create the file")
    if not p.is_file():
        raise DataError(p, None, "not a regular file", "pass the path of a file, not a folder")
    return p


def open_binary(path: str | os.PathLike) -> BinaryIO:
    """Open a file for binary reading, decompressing transparently when it ends in ``.gz``."""
    p = check_file(path)
    if p.suffix == ".gz":
        return gzip.open(p, "rb")  # type: ignore[return-value]
    return open(p, "rb")


def decode_line(path: str | os.PathLike, number: int, raw: bytes) -> str:
    """Decode one raw line as UTF-8 and drop its line ending (LF or CRLF) and, on line 1, a BOM."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start : e.end]
        raise DataError(
            path, number, f"bytes {bad!r} at column {e.start + 1} are not valid UTF-8", UTF8_FIX
        ) from None
    if number == 1:
        text = text.removeprefix(BOM)
    return text.removesuffix("\n").removesuffix("\r")


def text_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, text)`` for every line of a (possibly gzipped) UTF-8 file.

    Line numbers are 1-based; the text has no line ending. Blank lines are yielded too, so
    callers decide what to skip and numbers always match what an editor shows.
    """
    with open_binary(path) as f:
        for number, raw in enumerate(f, 1):
            yield number, decode_line(path, number, raw)


def read_text(path: str | os.PathLike) -> str:
    """Read a whole (small) UTF-8 file; DataError naming the line of the first non-UTF-8 byte."""
    with open_binary(path) as f:
        data = f.read()
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(path, line, f"bytes {data[e.start:e.end]!r} are not valid UTF-8", UTF8_FIX) from None


def check_tsv_values(path: str | os.PathLike, what: str, values: pl.Series) -> None:
    """DataError if any value is empty or holds a tab or line break (it would corrupt a TSV)."""
    bad = values.is_null() | (values.str.strip_chars() == "") | values.str.contains(TSV_FORBIDDEN)
    if bad.any():
        value = values.filter(bad)[0]
        raise DataError(
            path,
            None,
            f"cannot write {what} {value!r}: it is empty or contains a tab or line break",
            "remove tabs and line breaks from labels and names in the input",
        )


def strings_to_object_array(frame: pl.DataFrame) -> np.ndarray:
    """Turn a frame of string columns into an object array ``[n, k]`` of Python str.

    Equal strings share one Python object: a graph repeats each entity label many times,
    and sharing cuts the memory of a tens-of-millions-row array several-fold.
    """
    n, k = frame.shape
    if n == 0:
        return np.empty((0, k), dtype=object)
    stacked = pl.concat([frame[c] for c in frame.columns])
    distinct = stacked.unique(maintain_order=True)
    codes = stacked.replace_strict(distinct, pl.int_range(len(distinct), eager=True)).to_numpy()
    pool = distinct.to_numpy().astype(object)
    return pool[codes].reshape(k, n).T.copy()


def object_column(values: np.ndarray) -> pl.Series:
    """A polars String series from a 1-d object array of str."""
    return pl.Series(values=values, dtype=pl.String)
