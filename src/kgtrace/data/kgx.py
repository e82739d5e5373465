"""Streaming reader for KGX node and edge files (ROBOKOP style), cutting them to labelled triples.

Formats, chosen by extension (optionally followed by ``.gz``):

* ``.tsv`` / ``.txt``: tab-separated with a header row; ``|`` separates multiple values
  (e.g. ``biolink:Gene|biolink:NamedThing``). Fields are taken verbatim (no CSV quoting).
  A row may have fewer fields than the header (the missing ones are empty), not more.
* ``.jsonl`` / ``.json`` / ``.ndjson``: one JSON object per line; ``category`` may be a list.

Required fields: nodes ``id`` and ``category``; edges ``subject``, ``predicate`` and
``object``. Hetionet's tabular format (``hetionet-v1.0-nodes.tsv``: ``id name kind``;
``hetionet-v1.0-edges.sif.gz``: ``source metaedge target``) is read too: its ``kind`` is the
category, its metaedge abbreviation (``CtD``) the relation, described as in
`HETIONET_METAEDGES` (``Compound treats Disease``).

Files are parsed in blocks of whole lines (`BLOCK_BYTES`), and kept edges are held as
integer codes of their nodes and relations, so memory is bounded by the nodes and the kept
triples (24 bytes each), never by the size of the edge file.
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

import numpy as np
import polars as pl

from kgtrace.compute.system import forked_polars_error, polars_usable
from kgtrace.core.errors import ConfigError, DataError, option_name
from kgtrace.data._io import decode_line, raw_blocks, raw_lines

NODE_REQUIRED = ("id", "category")
EDGE_REQUIRED = ("subject", "predicate", "object")
BLOCK_BYTES = 256 << 20  # files are parsed in blocks of whole lines of about this size
MULTI_SEPARATOR = "|"
MAX_PAIR_CATEGORIES = 62  # one bit each in an int64 mask
# Hetionet's column names, as KGX's.
HETIONET_COLUMNS = {"kind": "category", "source": "subject", "metaedge": "predicate", "target": "object"}
# Hetionet v1.0's 24 edge types (its metaedges table): abbreviation -> description.
HETIONET_METAEDGES = {
    "AdG": "Anatomy downregulates Gene", "AeG": "Anatomy expresses Gene", "AuG": "Anatomy upregulates Gene",
    "CbG": "Compound binds Gene", "CcSE": "Compound causes Side Effect", "CdG": "Compound downregulates Gene",
    "CpD": "Compound palliates Disease", "CrC": "Compound resembles Compound", "CtD": "Compound treats Disease",
    "CuG": "Compound upregulates Gene", "DaG": "Disease associates Gene", "DdG": "Disease downregulates Gene",
    "DlA": "Disease localizes Anatomy", "DpS": "Disease presents Symptom", "DrD": "Disease resembles Disease",
    "DuG": "Disease upregulates Gene", "GcG": "Gene covaries Gene", "GiG": "Gene interacts Gene",
    "GpBP": "Gene participates Biological Process", "GpCC": "Gene participates Cellular Component",
    "GpMF": "Gene participates Molecular Function", "GpPW": "Gene participates Pathway",
    "Gr>G": "Gene regulates Gene", "PCiC": "Pharmacologic Class includes Compound",
}
REPORT_KEYS = (
    "edges_read", "kept", "dropped_predicate", "dropped_category", "dropped_unknown_node", "duplicates", "nodes_read",
)


@dataclass(frozen=True)
class KgxCut:
    """The triples cut from a KGX graph, as integer codes, with what is known about their nodes and relations.

    Codes rather than labels: a graph of tens of millions of edges repeats each node id many
    times, and a Python string per label would take gigabytes.
    """

    codes: np.ndarray  # int64 [n, 3]: subject code, relation code, object code
    nodes: pl.Series  # String [N]: the node id of each node code
    relations: tuple[str, ...]  # the relation label of each relation code
    names: dict[str, str]  # node id -> name, for nodes in the triples that have one
    categories: dict[str, tuple[str, ...]]  # node id -> categories, for nodes in the triples
    edge_map: dict[str, str]  # JSON-encoded predicate + qualifiers -> relation label ({} without folding)
    report: dict[str, int]  # counts, keys as in REPORT_KEYS

    @property
    def triples(self) -> np.ndarray:
        """The triples as labels, object [n, 3] (subject, relation label, object): for small graphs."""
        if len(self.codes) == 0:
            return np.empty((0, 3), dtype=object)
        nodes = self.nodes.to_numpy().astype(object)
        relations = np.asarray(self.relations, dtype=object)
        return np.stack([nodes[self.codes[:, 0]], relations[self.codes[:, 1]], nodes[self.codes[:, 2]]], axis=1)


@dataclass(frozen=True)
class _Rules:
    drop_predicates: tuple[str, ...]
    pair_bits: tuple[tuple[int, int], ...]  # (bit of category A, bit of category B) per pair
    fold_qualifiers: bool


def read_kgx(
    nodes_path: str | os.PathLike,
    edges_path: str | os.PathLike,
    *,
    category_pairs: Sequence[tuple[str, str]] = (),
    drop_predicates: Sequence[str] = (),
    fold_qualifiers: bool = True,
) -> KgxCut:
    """Cut a KGX graph to triples.

    An edge is kept when its predicate is not in ``drop_predicates``, both its nodes are in
    the nodes file, and (if ``category_pairs`` is given) its (subject, object) categories match
    some pair in either direction; a node with several categories matches if any does.
    With ``fold_qualifiers``, each distinct predicate + qualifiers (fields ending in
    ``_qualifier``, and ``qualified_predicate``) becomes relation ``predicate:<n>``, numbered in
    order of first appearance among kept edges; else the relation is the predicate.
    Duplicate triples are kept once.
    """
    if not polars_usable():
        raise forked_polars_error(f"reading the KGX graph {edges_path}")
    problems = check_category_pairs(category_pairs)
    if isinstance(drop_predicates, str):
        problems.append(f"{option_name('--drop-predicate', 'drop_predicates')}: {drop_predicates!r} must be a list of "
                        "predicates, not one string")
    if problems:
        raise ConfigError(problems)
    nodes, nodes_read = _read_nodes(nodes_path)
    if nodes_read == 0:
        raise DataError(nodes_path, None, "the nodes file holds no nodes", _empty_fix(nodes_path, NODE_REQUIRED))
    bits = {c: 1 << i for i, c in enumerate(sorted({c for pair in category_pairs for c in pair}))}
    rules = _Rules(tuple(drop_predicates), tuple((bits[a], bits[b]) for a, b in category_pairs), fold_qualifiers)
    table = _node_masks(nodes, bits)
    counts: Counter[str] = Counter(nodes_read=nodes_read)
    edge_map: dict[str, str] = {}
    hetionet = is_hetionet(edges_path)
    if hetionet:
        rules = replace(rules, fold_qualifiers=False)
    wanted = is_qualifier if rules.fold_qualifiers else _nothing
    relation_codes: dict[str, int] = {}
    kept = [_relation_coded(_cut_batch(batch, table, rules, edge_map, counts), relation_codes)
            for batch in _batches(edges_path, EDGE_REQUIRED, wanted)]
    if counts["edges_read"] == 0:
        raise DataError(edges_path, None, "the edges file holds no edges", _empty_fix(edges_path, EDGE_REQUIRED))
    cut = _finish(kept, nodes, tuple(relation_codes), edge_map, counts)
    return replace(cut, edge_map=_metaedge_map(cut.relations)) if hetionet else cut


def is_hetionet(path: str | os.PathLike) -> bool:
    """True if ``path`` is an edge file whose header has Hetionet's column names where KGX's are required
    (the same rule as the reader's `_kgx_names`)."""
    if _format(path) != "tsv":
        return False
    with closing(raw_lines(path)) as lines:
        header = [h.strip() for h in decode_line(path, 1, next(lines, b"")).split("\t")]
    return _kgx_names(header, EDGE_REQUIRED) != header


def _metaedge_map(relations: Sequence[str]) -> dict[str, str]:
    """edge_map for Hetionet relations: ``{"predicate": description}`` -> abbreviation, for the known ones."""
    return {json.dumps({"predicate": HETIONET_METAEDGES[r]}): r for r in sorted(relations) if r in HETIONET_METAEDGES}


def _empty_fix(path: str | os.PathLike, required: tuple[str, ...]) -> str:
    """How a KGX file of this format lists its rows."""
    fields = ", ".join(required)
    if _format(path) == "tsv":
        return f"check the path; a KGX .tsv file has a header line naming {fields}, then one row per line"
    return f"check the path; a KGX .jsonl file has one JSON object per line, with {fields}"


def check_category_pairs(category_pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Problems with ``category_pairs`` (empty list if fine)."""
    problems = []
    for pair in category_pairs:
        if isinstance(pair, str) or len(pair) != 2 or not all(isinstance(c, str) and c for c in pair):
            problems.append(f"{option_name('--category-pair', 'category_pairs')}: {pair!r} is not a pair of categories; "
                            "write e.g. --category-pair biolink:ChemicalEntity,biolink:Disease")
    categories = {c for pair in category_pairs if not problems for c in pair}
    if len(categories) > MAX_PAIR_CATEGORIES:
        problems.append(f"{option_name('--category-pair', 'category_pairs')}: {len(categories)} distinct categories; use at most "
                        f"{MAX_PAIR_CATEGORIES}")
    return problems


def is_qualifier(field: str) -> bool:
    """True for KGX edge fields folded into the relation (``*_qualifier``, ``qualified_predicate``)."""
    return field.endswith("_qualifier") or field == "qualified_predicate"


def _nothing(field: str) -> bool:
    return False


def _cut_batch(
    batch: pl.DataFrame, table: pl.DataFrame, rules: _Rules, edge_map: dict[str, str], counts: Counter[str]
) -> pl.DataFrame:
    """Filter one edge batch; returns frame [subject, relation, object]: node codes and the relation label."""
    counts["edges_read"] += batch.height
    dropped = pl.Series(rules.drop_predicates, dtype=pl.String)
    batch = _keep(batch, ~pl.col("predicate").is_in(dropped.implode()), counts, "dropped_predicate")
    for end in ("subject", "object"):
        batch = batch.join(table.rename({"id": end, "mask": f"{end}_mask", "code": f"{end}_code"}), on=end,
                           how="left", maintain_order="left")
    known = pl.col("subject_mask").is_not_null() & pl.col("object_mask").is_not_null()
    batch = _keep(batch, known, counts, "dropped_unknown_node")
    if rules.pair_bits:
        batch = _keep(batch, _pair_match(rules.pair_bits), counts, "dropped_category")
    relation = _folded_relation(batch, edge_map) if rules.fold_qualifiers else batch["predicate"]
    return batch.select(pl.col("subject_code").alias("subject"), relation.alias("relation"),
                        pl.col("object_code").alias("object"))


def _relation_coded(batch: pl.DataFrame, codes: dict[str, int]) -> pl.DataFrame:
    """The batch with its relation labels replaced by codes, numbered in order of first appearance."""
    for label in batch["relation"].unique(maintain_order=True).to_list():
        codes.setdefault(label, len(codes))
    return batch.with_columns(pl.col("relation").replace_strict(list(codes), list(codes.values()),
                                                                 return_dtype=pl.Int64))


def _keep(batch: pl.DataFrame, keep: pl.Expr, counts: Counter[str], reason: str) -> pl.DataFrame:
    kept = batch.filter(keep)
    counts[reason] += batch.height - kept.height
    return kept


def _pair_match(pair_bits: tuple[tuple[int, int], ...]) -> pl.Expr:
    """True where (subject, object) categories match some pair, in either direction."""
    s, o = pl.col("subject_mask"), pl.col("object_mask")
    match = pl.lit(False)
    for a, b in pair_bits:
        match = match | (((s & a) != 0) & ((o & b) != 0)) | (((s & b) != 0) & ((o & a) != 0))
    return match


def _folded_relation(batch: pl.DataFrame, edge_map: dict[str, str]) -> pl.Series:
    """Relation label per edge: ``predicate:<n>`` per distinct predicate + qualifier values."""
    keys = ["predicate", *sorted(c for c in batch.columns if is_qualifier(c))]
    filled = batch.select(pl.col(keys).fill_null(""))
    combos = filled.unique(maintain_order=True)
    labels = [_relation_label(dict(zip(keys, row)), edge_map) for row in combos.iter_rows()]
    mapping = combos.with_columns(relation=pl.Series(labels, dtype=pl.String))
    return filled.join(mapping, on=keys, how="left", maintain_order="left")["relation"]


def _relation_label(values: dict[str, str], edge_map: dict[str, str]) -> str:
    desc = {"predicate": values["predicate"]} | {k: v for k, v in values.items() if k != "predicate" and v}
    return edge_map.setdefault(json.dumps(desc), f"predicate:{len(edge_map)}")


def _finish(kept: list[pl.DataFrame], nodes: pl.DataFrame, relations: tuple[str, ...], edge_map: dict[str, str],
            counts: Counter[str]) -> KgxCut:
    empty = pl.DataFrame(schema={"subject": pl.Int64, "relation": pl.Int64, "object": pl.Int64})
    triples = pl.concat([empty, *kept])
    codes = distinct_rows(triples.to_numpy())
    counts["duplicates"] = triples.height - len(codes)
    counts["kept"] = len(codes)
    used = nodes[present(codes[:, [0, 2]], nodes.height)]
    names = {i: n for i, n in used.select("id", "name").iter_rows() if n and n.strip()}
    categories = {i: _split_multi(c) for i, c in used.select("id", "category").iter_rows()}
    report = {key: int(counts[key]) for key in REPORT_KEYS}
    return KgxCut(codes, nodes["id"], relations, names, categories, dict(edge_map), report)


def distinct_rows(codes: np.ndarray) -> np.ndarray:
    """The distinct rows of non-negative int64 codes [n, 3], in first-seen order."""
    if len(codes) == 0:
        return codes.reshape(0, 3)
    high = codes.max(axis=0).astype(object) + 1  # Python ints: the packing bound cannot overflow here
    if high[0] * high[1] * high[2] < 2**63:
        keys = (codes[:, 0] * int(high[1]) + codes[:, 1]) * int(high[2]) + codes[:, 2]
        return codes[pl.Series(keys).is_first_distinct().to_numpy()]  # hashing, not sorting
    _, first = np.unique(codes, axis=0, return_index=True)
    return codes[np.sort(first)]


def present(codes: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of non-negative int ``codes`` (any shape) below ``size``, ascending, without sorting."""
    seen = np.zeros(size, dtype=bool)
    seen[codes.reshape(-1)] = True
    return np.flatnonzero(seen)


def _split_multi(value: str) -> tuple[str, ...]:
    return tuple(v for v in value.split(MULTI_SEPARATOR) if v)


# ---------------------------------------------------------------- nodes


def _read_nodes(path: str | os.PathLike) -> tuple[pl.DataFrame, int]:
    """Nodes as frame [id, category, name] (first row per id kept), and the rows read."""
    frames = list(_batches(path, NODE_REQUIRED, lambda field: field == "name"))
    schema = {"id": pl.String, "category": pl.String, "name": pl.String}
    nodes = pl.concat([pl.DataFrame(schema=schema), *frames], how="diagonal_relaxed")
    return nodes.unique(subset="id", keep="first", maintain_order=True), nodes.height


def _node_masks(nodes: pl.DataFrame, bits: dict[str, int]) -> pl.DataFrame:
    """Frame [id, mask, code]: mask has the bit of every pair category the node has; code is its row."""
    categories = pl.col("category").str.split(MULTI_SEPARATOR)
    mask = pl.lit(0, dtype=pl.Int64)
    for category, bit in bits.items():
        mask = mask + pl.when(categories.list.contains(category)).then(pl.lit(bit, pl.Int64)).otherwise(0)
    return nodes.select("id", mask.alias("mask"), pl.int_range(pl.len(), dtype=pl.Int64).alias("code"))


# ---------------------------------------------------------------- batch readers


def _batches(path: str | os.PathLike, required: tuple[str, ...], wanted: Callable[[str], bool]) -> Iterator[pl.DataFrame]:
    """Frames of string columns: the required fields plus the wanted optional ones."""
    if _format(path) == "tsv":
        yield from _tsv_batches(path, required, wanted)
    else:
        yield from _jsonl_batches(path, required, wanted)


def _format(path: str | os.PathLike) -> str:
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    last = suffixes[-1] if suffixes else ""
    if last in (".tsv", ".txt", ".sif"):  # .sif: Hetionet's edge file
        return "tsv"
    if last in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise DataError(path, None, f"cannot tell the KGX format from the extension {last!r}",
                    "name KGX files *.tsv or *.jsonl (optionally followed by .gz)")


def _tsv_batches(path: str | os.PathLike, required: tuple[str, ...], wanted: Callable[[str], bool]) -> Iterator[pl.DataFrame]:
    with closing(raw_blocks(path, BLOCK_BYTES)) as blocks:
        _, first = next(blocks, (1, b""))
        header_line, _, rest = first.partition(b"\n")
        header = _kgx_names([h.strip() for h in decode_line(path, 1, header_line).split("\t")], required)
        _check_header(path, header, required)
        columns = [i for i, name in enumerate(header) if name in required or wanted(name)]
        for start, block in chain([(2, rest)], blocks):
            if not block:
                continue
            frame = _parse_tsv_fast(block, header, columns, required)
            yield frame if frame is not None else _parse_tsv_slow(
                path, start, _lines(block), header, columns, required)


def _lines(block: bytes) -> list[bytes]:
    """A block's lines, endings kept, split at newlines only (as reading the file line by line does)."""
    lines = block.split(b"\n")
    last = lines.pop()  # empty when the block ends with a newline
    return [line + b"\n" for line in lines] + ([last] if last else [])


def _kgx_names(header: list[str], required: tuple[str, ...]) -> list[str]:
    """The header with Hetionet's column names read as KGX's, when the file uses them."""
    if all(name in header for name in required):
        return header
    renamed = [HETIONET_COLUMNS.get(name, name) for name in header]
    return renamed if all(name in renamed for name in required) else header


def _check_header(path: str | os.PathLike, header: list[str], required: tuple[str, ...]) -> None:
    missing = [name for name in required if name not in header]
    if missing:
        raise DataError(path, 1, f"the header has no {', '.join(map(repr, missing))} column "
                        f"(columns: {', '.join(header)})",
                        f"the first line must be a tab-separated header naming {', '.join(required)} "
                        "(or Hetionet's id, name, kind for nodes and source, metaedge, target for edges)")


def _parse_tsv_fast(
    block: bytes, header: list[str], columns: list[int], required: tuple[str, ...]
) -> pl.DataFrame | None:
    """polars parse of a block of lines; None if anything is odd (the slow parse then finds it)."""
    try:
        frame = pl.read_csv(io.BytesIO(block), separator="\t", has_header=False,
                            quote_char=None, infer_schema=False)
    except pl.exceptions.PolarsError:
        return None
    if frame.width != len(header):
        return None
    frame = frame.select([frame.columns[i] for i in columns])
    frame.columns = [header[i] for i in columns]
    missing = frame.select(pl.any_horizontal(
        pl.col(name).is_null() | (pl.col(name).str.strip_chars() == "") for name in required
    )).to_series()
    return None if missing.any() else frame


def _parse_tsv_slow(
    path: str | os.PathLike, first_line: int, chunk: list[bytes], header: list[str], columns: list[int],
    required: tuple[str, ...],
) -> pl.DataFrame:
    """Line-by-line parse of a chunk; DataError naming the exact line of any problem."""
    names = [header[i] for i in columns]
    data: dict[str, list[str | None]] = {name: [] for name in names}
    for n, raw in enumerate(chunk, first_line):
        text = decode_line(path, n, raw)
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) > len(header):
            raise DataError(path, n, f"found {len(fields)} tab-separated fields but the header has {len(header)}",
                            "remove the extra tabs, or name the extra column in the header")
        fields += [""] * (len(header) - len(fields))
        for i, name in zip(columns, names):
            if name in required and not fields[i].strip():
                raise DataError(path, n, f"the required field {name!r} is empty", f"fill in {name!r} or delete the line")
            data[name].append(fields[i] or None)
    return pl.DataFrame(data, schema={name: pl.String for name in names})


def _jsonl_batches(path: str | os.PathLike, required: tuple[str, ...], wanted: Callable[[str], bool]) -> Iterator[pl.DataFrame]:
    with closing(raw_blocks(path, BLOCK_BYTES)) as blocks:
        for start, block in blocks:
            if start == 1:
                block = block.removeprefix(b"\xef\xbb\xbf")
            frame = _parse_jsonl_fast(block, required, wanted)
            yield frame if frame is not None else _parse_jsonl_slow(
                path, start, _lines(block), required, wanted)


def _parse_jsonl_fast(block: bytes, required: tuple[str, ...], wanted: Callable[[str], bool]) -> pl.DataFrame | None:
    """polars parse of a block of JSON lines; None if anything is odd (the slow parse then finds it)."""
    try:
        frame = pl.read_ndjson(io.BytesIO(block), infer_schema_length=None)
    except pl.exceptions.PolarsError:
        return None
    if any(name not in frame.columns for name in required):
        return None
    frame = frame.select([c for c in frame.columns if c in required or wanted(c)])
    if frame.schema.get("category") == pl.List(pl.String):
        frame = frame.with_columns(pl.col("category").list.join(MULTI_SEPARATOR))
    if any(dtype != pl.String for dtype in frame.schema.values()):
        return None  # numbers, nested values, nulls-only columns: let the slow parse convert or reject them
    missing = frame.select(pl.any_horizontal(
        pl.col(name).is_null() | (pl.col(name).str.strip_chars() == "") for name in required
    )).to_series()
    if missing.any():
        return None
    # The slow parse drops empty values; match it.
    return frame.with_columns(pl.when(pl.all() != "").then(pl.all()))


def _parse_jsonl_slow(
    path: str | os.PathLike, first_line: int, chunk: list[bytes], required: tuple[str, ...],
    wanted: Callable[[str], bool],
) -> pl.DataFrame:
    """Line-by-line parse of a chunk of JSON lines; DataError naming the exact line of any problem."""
    rows = []
    fields = dict.fromkeys(required)  # ordered set of the columns seen
    for n, raw in enumerate(chunk, first_line):
        text = decode_line(path, n, raw)
        if text.strip():
            rows.append(_json_row(path, n, text, required, wanted))
            fields.update(dict.fromkeys(rows[-1]))
    return pl.from_dicts(rows, schema={k: pl.String for k in fields}) if rows else pl.DataFrame(
        schema={k: pl.String for k in fields})


def _json_row(
    path: str | os.PathLike, n: int, text: str, required: tuple[str, ...], wanted: Callable[[str], bool]
) -> dict[str, str]:
    """The required and wanted fields of one JSON line, as strings (lists joined with '|')."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(path, n, f"invalid JSON: {e.msg} (column {e.colno})",
                        "write exactly one complete JSON object per line") from None
    if not isinstance(record, dict):
        raise DataError(path, n, f"expected a JSON object, found {type(record).__name__}",
                        "write exactly one JSON object per line")
    row = {k: _as_text(v) for k, v in record.items() if k in required or wanted(k)}
    for name in required:
        if name not in record:
            raise DataError(path, n, f"the required field {name!r} is missing", f"add {name!r} to every line")
        if not row[name].strip() or (name != "category" and not isinstance(record[name], str)):
            raise DataError(path, n, f"the required field {name!r} is {record[name]!r}",
                            f"give {name!r} a non-empty string value")
    return {k: v for k, v in row.items() if v}


def _as_text(value: object) -> str:
    """A JSON value as text: lists joined with '|', null as ''."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return MULTI_SEPARATOR.join(t for t in map(_as_text, value) if t)
    return json.dumps(value, sort_keys=True)
