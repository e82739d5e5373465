"""Every reader of the data layer on damaged or misnamed gzip input: a DataError naming the file (and line)."""

import gzip
import json

import numpy as np
import pytest

from kgtrace.core.errors import DataError
from kgtrace.data import triples as tr
from kgtrace.data.kgx import read_kgx
from kgtrace.data.names import read_edge_map_json, read_names
from kgtrace.data.triples import read_labeled_triples, read_labeled_triples_slow, read_labeled_triples_with_lines
from kgtrace.data.vocab import read_vocab

ROWS = 4000  # enough that a file cut in half breaks well after line 1


def triples_text() -> bytes:
    return "".join(f"e{i}\tr{i % 3}\te{(i * 7) % 97}\n" for i in range(ROWS)).encode()


def vocab_text() -> bytes:
    return "".join(f"e{i}\t{i}\n" for i in range(ROWS)).encode()


def names_text() -> bytes:
    return "".join(f"X:{i}\tname {i}\n" for i in range(ROWS)).encode()


def edge_map_text() -> bytes:
    return json.dumps({json.dumps({"predicate": f"p:{i}"}): f"predicate:{i}" for i in range(ROWS)}, indent=1).encode()


def kgx_nodes(tmp_path):
    nodes = tmp_path / "nodes.jsonl"
    nodes.write_text("".join(json.dumps({"id": f"X:{i}", "category": "biolink:Thing"}) + "\n" for i in range(50)))
    return nodes


def kgx_edges_tsv() -> bytes:
    rows = "".join(f"X:{i % 50}\tbiolink:related_to\tX:{(i * 7) % 50}\n" for i in range(ROWS))
    return ("subject\tpredicate\tobject\n" + rows).encode()


def kgx_edges_jsonl() -> bytes:
    return "".join(json.dumps({"subject": f"X:{i % 50}", "predicate": "biolink:related_to",
                               "object": f"X:{(i * 7) % 50}"}) + "\n" for i in range(ROWS)).encode()


# name of the file -> (its plain content, how it is read)
READERS = {
    "triples.tsv": (triples_text, lambda p, tmp: read_labeled_triples(p)),
    "triples_lines.tsv": (triples_text, lambda p, tmp: read_labeled_triples_with_lines(p)),
    "triples_slow.tsv": (triples_text, lambda p, tmp: read_labeled_triples_slow(p)),
    "entity_to_id.tsv": (vocab_text, lambda p, tmp: read_vocab(p)),
    "names.tsv": (names_text, lambda p, tmp: read_names(p)),
    "edge_map.json": (edge_map_text, lambda p, tmp: read_edge_map_json(p)),
    "edges.tsv": (kgx_edges_tsv, lambda p, tmp: read_kgx(kgx_nodes(tmp), p)),
    "edges.jsonl": (kgx_edges_jsonl, lambda p, tmp: read_kgx(kgx_nodes(tmp), p)),
    "nodes.jsonl": (lambda: kgx_nodes_bytes(), lambda p, tmp: read_kgx(p, write_edges(tmp))),
}


def kgx_nodes_bytes() -> bytes:
    return "".join(json.dumps({"id": f"X:{i}", "category": "biolink:Thing"}) + "\n" for i in range(ROWS)).encode()


def write_edges(tmp_path):
    edges = tmp_path / "edges.jsonl"
    edges.write_bytes(kgx_edges_jsonl())
    return edges


@pytest.mark.parametrize("name", sorted(READERS))
def test_cut_off_gzip_names_file_and_line(tmp_path, name):
    content, read = READERS[name]
    path = tmp_path / f"{name}.gz"
    packed = gzip.compress(content())
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DataError) as e:
        read(path, tmp_path)
    assert e.value.path == str(path) and e.value.line is not None and e.value.line > 1
    assert "cut off or damaged" in e.value.problem and "download the file again" in e.value.fix


@pytest.mark.parametrize("name", ["triples.tsv", "entity_to_id.tsv", "edges.tsv", "edges.jsonl"])
def test_damaged_gzip_checksum(tmp_path, name):
    content, read = READERS[name]
    path = tmp_path / f"{name}.gz"
    packed = gzip.compress(content())
    path.write_bytes(packed[:-8] + bytes(8))  # the trailer's CRC and length zeroed
    with pytest.raises(DataError) as e:
        read(path, tmp_path)
    assert e.value.path == str(path) and "cut off or damaged" in e.value.problem


@pytest.mark.parametrize("name", sorted(READERS))
def test_plain_file_named_gz(tmp_path, name):
    content, read = READERS[name]
    path = tmp_path / f"{name}.gz"
    path.write_bytes(content())
    with pytest.raises(DataError) as e:
        read(path, tmp_path)
    assert e.value.path == str(path) and "not gzip-compressed" in e.value.problem
    assert f"rename it to {name}" in e.value.fix


@pytest.mark.parametrize("name", sorted(READERS))
def test_gzip_bytes_in_a_plain_name(tmp_path, name):
    content, read = READERS[name]
    path = tmp_path / name
    path.write_bytes(gzip.compress(content()))
    with pytest.raises(DataError) as e:
        read(path, tmp_path)
    assert e.value.path == str(path) and "gzip-compressed" in e.value.problem and "iconv" not in str(e.value)
    assert f"{name}.gz" in e.value.fix


def test_gzipped_triples_take_the_fast_path_with_exact_lines(tmp_path):
    text = b"# made by hand\n\nhead\trelation\ttail\na\tr\tb\n# mid\n\n\nb\ts\tc\n\n"
    path = tmp_path / "t.tsv.gz"
    path.write_bytes(gzip.compress(text))
    fast = tr._read_fast(path, want_lines=True)
    assert fast is not None
    assert fast[0].tolist() == [["a", "r", "b"], ["b", "s", "c"]] and fast[1].tolist() == [4, 8]
    slow, lines = read_labeled_triples_slow(path)
    assert np.array_equal(fast[0], slow) and lines.tolist() == [4, 8]


def test_gzipped_triples_error_line_is_the_decompressed_line(tmp_path):
    path = tmp_path / "t.tsv.gz"
    path.write_bytes(gzip.compress(b"a\tr\tb\n# note\nb\ts\n"))
    with pytest.raises(DataError) as e:
        read_labeled_triples_with_lines(path)
    assert e.value.line == 3


@pytest.mark.parametrize("name", sorted(READERS))
def test_utf16_and_binary_files(tmp_path, name):
    content, read = READERS[name]
    path = tmp_path / name
    path.write_text(content().decode(), encoding="utf-16")
    with pytest.raises(DataError, match="UTF-16"):
        read(path, tmp_path)
    path.write_bytes(b"a\tr\tb\n" + bytes(range(256)))
    with pytest.raises(DataError) as e:
        read(path, tmp_path)
    assert e.value.line == 2 and "binary file" in e.value.problem


@pytest.mark.parametrize("compressed", [False, True])
def test_a_large_file_read_block_by_block_shows_its_progress(tmp_path, monkeypatch, compressed):
    """A file of PROGRESS_BYTES or more gets a progress bar of its bytes on disk (drawn on a terminal), to the end."""
    from kgtrace.data import _io

    path = tmp_path / ("big.tsv.gz" if compressed else "big.tsv")
    text = "".join(f"a{i}\tr\tb{i}\n" for i in range(5000)).encode()
    path.write_bytes(gzip.compress(text) if compressed else text)
    bars = []
    monkeypatch.setattr(_io, "tqdm", lambda total, disable, **kwargs: bars.append(Bar(total, disable)) or bars[-1])
    monkeypatch.setattr(_io, "PROGRESS_BYTES", 1000)
    blocks = list(_io.raw_blocks(path, 4096))
    assert b"".join(block for _, block in blocks) == text
    assert bars[-1].disable is None and bars[-1].n == bars[-1].total == path.stat().st_size
    monkeypatch.setattr(_io, "PROGRESS_BYTES", path.stat().st_size + 1)
    list(_io.raw_blocks(path, 4096))
    assert bars[-1].disable is True  # a small file: no bar


def test_a_large_file_read_line_by_line_shows_its_progress(tmp_path, monkeypatch):
    """The line reader (the reference readers, and every reader in a forked child) shows its bar too."""
    from kgtrace.data import _io

    path = tmp_path / "big.tsv"
    path.write_text("".join(f"a{i}\tr\tb{i}\n" for i in range(5000)))
    bars = []
    monkeypatch.setattr(_io, "tqdm", lambda total, disable, **kwargs: bars.append(Bar(total, disable)) or bars[-1])
    monkeypatch.setattr(_io, "PROGRESS_BYTES", 1000)
    monkeypatch.setattr(_io, "PROGRESS_LINES", 100)
    assert len(list(_io.raw_lines(path))) == 5000
    assert bars[-1].disable is None and bars[-1].n == bars[-1].total == path.stat().st_size


class Bar:
    """tqdm as kgtrace.data._io draws it, recording what it is given."""

    def __init__(self, total, disable):
        self.total, self.disable, self.n = total, disable, 0

    def update(self, n):
        self.n += n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
