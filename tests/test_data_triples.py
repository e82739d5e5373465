import numpy as np
import pytest
import torch

from kgtrace.core.errors import DataError
from kgtrace.data import triples as tr
from kgtrace.data.triples import (
    encode_triples,
    read_labeled_triples,
    read_labeled_triples_slow,
    read_labeled_triples_with_lines,
    write_labeled_triples,
)
from kgtrace.data.vocab import Vocab

VALID_FILES = {
    "plain": b"a\tr\tb\nb\ts\tc\n",
    "no_final_newline": b"a\tr\tb\nb\ts\tc",
    "header": b"subject\tpredicate\tobject\na\tr\tb\nb\ts\tc\n",
    "header_case_bom_crlf": b"\xef\xbb\xbfHead\tRelation\tTail\r\na\tr\tb\r\n\r\nb\ts\tc\r\n",
    "comments_blank": b"# made by hand\n\nhead\trelation\ttail\na\tr\tb\n# mid\n\n\nb\ts\tc\n\n",
    "whitespace_line": b"a\tr\tb\n   \nb\ts\tc\n",
}
EXPECTED = [["a", "r", "b"], ["b", "s", "c"]]
EXPECTED_LINES = {
    "plain": [1, 2], "no_final_newline": [1, 2], "header": [2, 3], "header_case_bom_crlf": [2, 4],
    "comments_blank": [4, 8], "whitespace_line": [1, 3],
}


@pytest.mark.parametrize("name", sorted(VALID_FILES))
def test_fast_slow_and_lines_agree(tmp_path, name):
    p = tmp_path / f"{name}.tsv"
    p.write_bytes(VALID_FILES[name])
    fast = read_labeled_triples(p)
    with_lines, lines = read_labeled_triples_with_lines(p)
    slow, slow_lines = read_labeled_triples_slow(p)
    assert fast.dtype == object and fast.shape == (2, 3)
    assert fast.tolist() == EXPECTED
    assert np.array_equal(fast, slow) and np.array_equal(with_lines, slow)
    assert lines.tolist() == slow_lines.tolist() == EXPECTED_LINES[name]


@pytest.mark.parametrize("name", ["plain", "header", "header_case_bom_crlf", "comments_blank"])
def test_fast_path_is_taken_on_clean_files(tmp_path, name):
    # The fast reader must handle the common variants itself, not fall back.
    p = tmp_path / "t.tsv"
    p.write_bytes(VALID_FILES[name])
    result = tr._read_fast(p, want_lines=True)
    assert result is not None
    assert result[0].tolist() == EXPECTED and result[1].tolist() == EXPECTED_LINES[name]


def test_fast_equals_slow_on_larger_random_file(tmp_path):
    rng = np.random.default_rng(0)
    rows = [f"e{rng.integers(50)}\tr{rng.integers(5)}\te{rng.integers(50)}" for _ in range(3000)]
    rows.insert(100, "# comment")
    rows.insert(2000, "")
    p = tmp_path / "big.tsv"
    p.write_text("\n".join(rows) + "\n")
    fast = tr._read_fast(p, want_lines=True)
    slow = read_labeled_triples_slow(p)
    assert fast is not None
    assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1])
    assert len(slow[0]) == 3000 and slow[1][100] == 102


@pytest.mark.parametrize(
    ("data", "line", "problem"),
    [
        (b"a\tr\tb\nb\ts\n", 2, "found 2"),
        (b"a\tr\tb\n# c\n\nb\ts\tc\td\n", 4, "found 4"),
        (b"a\tr\tb\nb\ts\tc\t\n", 2, "found 4"),
        (b"a\tr\tb\nb\t\tc\n", 2, "relation field is empty"),
        (b"a\tr\tb\r\n \tr\tc\r\n", 2, "head field is empty"),
        (b"head\trelation\ttail\na r b\n", 2, "no tab"),
        (b"a\tr\tb\n\nb\ts\t\xffc\n", 3, "not valid UTF-8"),
    ],
)
def test_errors_name_file_and_line(tmp_path, data, line, problem):
    p = tmp_path / "bad.tsv"
    p.write_bytes(data)
    with pytest.raises(DataError) as e:
        read_labeled_triples(p)
    assert e.value.line == line
    assert str(e.value).startswith(f"{p}:{line}: ") and problem in str(e.value) and "Fix:" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_labeled_triples(tmp_path / "nope.tsv")


def test_empty_and_comment_only(tmp_path):
    p = tmp_path / "e.tsv"
    p.write_bytes(b"# nothing\n\n")
    assert read_labeled_triples(p).shape == (0, 3)


def test_encode_and_unknown_label_line(tmp_path):
    p = tmp_path / "t.tsv"
    p.write_bytes(b"# c\na\tr\tb\n\nb\tq\tc\n")
    labeled, lines = read_labeled_triples_with_lines(p)
    ents, rels = Vocab.build(["a", "b", "c"]), Vocab(("r",))
    with pytest.raises(DataError) as e:
        encode_triples(labeled, ents, rels, p, lines=lines)
    assert e.value.line == 4 and "'q'" in str(e.value) and "relation" in str(e.value)
    with pytest.raises(DataError) as e:  # without lines: found by re-reading the file
        encode_triples(labeled, ents, rels, p)
    assert e.value.line == 4
    ids = encode_triples(labeled, ents, Vocab(("q", "r")), p, lines=lines)
    assert ids.dtype == torch.int64 and ids.tolist() == [[0, 1, 1], [1, 0, 2]]


def test_write_roundtrip_and_refusals(tmp_path):
    t = np.array([["a b", "r", "MONDO:1"], ["x", "r", "y"]], dtype=object)
    p = tmp_path / "out.tsv"
    write_labeled_triples(t, p)
    assert p.read_bytes() == b"a b\tr\tMONDO:1\nx\tr\ty\n"
    assert np.array_equal(read_labeled_triples(p), t)
    with pytest.raises(DataError, match="tab or line break"):
        write_labeled_triples(np.array([["a\tb", "r", "c"]], dtype=object), tmp_path / "bad.tsv")
    with pytest.raises(DataError, match="comment"):
        write_labeled_triples(np.array([["#a", "r", "c"]], dtype=object), tmp_path / "bad.tsv")
    assert not (tmp_path / "bad.tsv").exists()
