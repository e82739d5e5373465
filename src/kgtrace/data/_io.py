"""Shared file helpers for the data layer: line reading with exact line numbers (writes: kgtrace.core.io).

Every reader reports problems as `DataError` naming the file and the
1-based line; every writer writes to a temporary file next to the target and renames it into
place, so a crash never leaves a half-written file under the final name.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from kgtrace.core.errors import DataError

BOM = "\ufeff"
UTF8_FIX = "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in > out`)"
GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of every gzip file
GZIP_FIX = "download the file again, or compress it again with `gzip` (`gzip -t FILE` tells whether a .gz file is whole)"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
SNIFF_BYTES = 1 << 13  # the start of a file that check_text_start looks at
PROGRESS_BYTES = 64 << 20  # files this large show a progress bar while they are read (on a terminal)
PROGRESS_LINES = 1 << 16  # lines read between two updates of raw_lines' bar
# What Python's gzip raises on a cut-off or damaged stream: EOFError when the file ends early,
# BadGzipFile on a bad header or checksum, zlib.error on damaged compressed data.
GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)
# Characters that a TSV field cannot hold without breaking the line structure.
TSV_FORBIDDEN = r"[\t\r\n]"


def check_file(path: str | os.PathLike) -> Path:
    """Return ``path`` as a Path; DataError if it is missing or not a regular file."""
    p = Path(path)
    if not p.exists():
        raise DataError(p, None, "file not found", "check the path, or create the file")
    if p.is_dir():
        raise DataError(p, None, "this is a folder, not a file", "give the path of the file inside it")
    if not p.is_file():
        raise DataError(p, None, "not a regular file", "give the path of a regular file")
    return p


def check_text_start(path: str | os.PathLike) -> None:
    """DataError if the start of the file shows it is not UTF-8 text as named: ``x.gz`` not
    gzipped, gzip bytes in ``x.txt``, UTF-16 text, or a binary file (NUL bytes).

    Checked up front because each mistake otherwise surfaces as a confusing decoding or
    field-count error, or not at all.
    """
    p = Path(path)
    with open(p, "rb") as f:
        start = f.read(SNIFF_BYTES)
    if p.suffix == ".gz":
        if start and not start.startswith(GZIP_MAGIC):
            raise DataError(p, None, "the name ends in .gz but the file is not gzip-compressed",
                            f"if it is plain text, rename it to {p.stem}; else download it again")
        return
    if start.startswith(GZIP_MAGIC):
        raise DataError(p, None, "the file is gzip-compressed (it starts with the bytes 1f 8b)",
                        f"rename it to {p.name}.gz (kgtrace reads .gz files), or decompress it: "
                        f"`mv {p.name} {p.name}.gz && gunzip {p.name}.gz`")
    if start.startswith(UTF16_BOMS):
        raise DataError(p, None, "the file is UTF-16 text", "save it as UTF-8 (e.g. `iconv -f utf-16 -t utf-8 in > out`)")
    if b"\0" in start:
        line = start[: start.index(b"\0")].count(b"\n") + 1
        raise DataError(p, line, "the line holds NUL bytes: this looks like a binary file, not text",
                        "check the path; kgtrace reads tab-separated UTF-8 text (optionally .gz)")


def open_binary(path: str | os.PathLike) -> BinaryIO:
    """Open a file for binary reading, decompressing transparently when it ends in ``.gz``."""
    p = check_file(path)
    check_text_start(p)
    if p.suffix == ".gz":
        return gzip.open(p, "rb")  # type: ignore[return-value]
    return open(p, "rb")


def raw_lines(path: str | os.PathLike) -> Iterator[bytes]:
    """The raw lines of a (possibly gzipped) file, endings kept.

    A file of `PROGRESS_BYTES` or more shows a progress bar of its bytes on a terminal, as
    `raw_blocks`. A cut-off or damaged gzip stream is a DataError naming the line being read when it broke.
    """
    with open_binary(path) as f, _progress(path) as bar:  # opened first: a missing file is a DataError
        total = bar.total
        read = 0
        try:
            for raw in f:
                read += 1
                if read % PROGRESS_LINES == 0:
                    bar.update(_position(f) - bar.n)
                yield raw
            bar.update(total - bar.n)
        except GZIP_ERRORS as e:
            raise DataError(path, read + 1, f"the gzip data is cut off or damaged after line {read} ({e})",
                            GZIP_FIX) from None


def raw_blocks(path: str | os.PathLike, size: int) -> Iterator[tuple[int, bytes]]:
    """Blocks of whole lines of a (possibly gzipped) file, each about ``size`` bytes, endings kept, with the
    1-based number of each block's first line: a large file parsed block by block without a Python object per line.

    A file of `PROGRESS_BYTES` or more shows a progress bar of its bytes on a terminal (a long read
    never waits without a word). A cut-off or damaged gzip stream is a DataError naming the line being read
    when it broke (as `raw_lines` names it: the file is read again line by line to find it).
    """
    with open_binary(path) as f, _progress(path) as bar:  # opened first: a missing file is a DataError
        line = 1
        try:
            while block := f.read(size):
                if not block.endswith(b"\n"):
                    block += f.readline()  # finish the last line
                bar.update(_position(f) - bar.n)
                yield line, block
                line += block.count(b"\n")
        except GZIP_ERRORS as e:
            for _ in raw_lines(path):  # raises the DataError naming the exact line
                pass
            raise DataError(path, line, f"the gzip data is damaged at or after line {line} ({e})", GZIP_FIX) from None


def _progress(path: str | os.PathLike) -> tqdm:
    """A progress bar of the bytes of ``path`` read so far: drawn on a terminal for a file of PROGRESS_BYTES or more."""
    total = os.path.getsize(path)
    return tqdm(total=total, unit="B", unit_scale=True, desc=f"reading {Path(path).name}",
                disable=True if total < PROGRESS_BYTES else None, leave=False)


def _position(f: BinaryIO) -> int:
    """Bytes of the file on disk read so far (of the compressed stream, for a gzip file)."""
    return f.fileobj.tell() if isinstance(f, gzip.GzipFile) else f.tell()


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
    for number, raw in enumerate(raw_lines(path), 1):
        yield number, decode_line(path, number, raw)


def read_text(path: str | os.PathLike) -> str:
    """Read a whole (small) UTF-8 file; DataError naming the line of the first non-UTF-8 byte."""
    data = b"".join(raw_lines(path))
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
