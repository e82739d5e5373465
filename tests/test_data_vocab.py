import gzip

import numpy as np
import pytest

from kgtrace.core.errors import DataError
from kgtrace.data.vocab import Vocab, read_vocab, write_vocab


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_build_sorts_and_dedupes():
    v = Vocab.build(["b", "a", "c", "a"])
    assert v.labels == ("a", "b", "c")
    assert len(v) == 3
    assert v.to_id == {"a": 0, "b": 1, "c": 2}
    assert v.index() is v.to_id


def test_encode_and_unknown():
    v = Vocab(("x", "y", "z"))
    ids = v.encode(np.array(["z", "x", "z"], dtype=object))
    assert ids.dtype == np.int64 and ids.tolist() == [2, 0, 2]
    with pytest.raises(KeyError, match="'nope'"):
        v.encode(["x", "nope", "also"])
    assert v.lookup(["y", "nope"]).tolist() == [1, -1]


def test_duplicate_labels_rejected():
    with pytest.raises(ValueError):
        Vocab(("a", "a"))


def test_digest_depends_on_order():
    assert Vocab(("a", "b")).digest() == Vocab(("a", "b")).digest()
    assert Vocab(("a", "b")).digest() != Vocab(("b", "a")).digest()
    assert len(Vocab(("a",)).digest()) == 64


def test_node_dict_any_order_with_bom_crlf_blank(tmp_path):
    p = write(tmp_path / "node_dict", "\ufeffb\t1\r\n\r\na\t2\r\nMONDO:1\t0\r\n".encode())
    assert read_vocab(p).labels == ("MONDO:1", "b", "a")


def test_pykeen_plain_and_gz(tmp_path):
    text = "id\tlabel\n1\tbeta\n0\talpha\n"
    plain = write(tmp_path / "entity_to_id.tsv", text.encode())
    gz = tmp_path / "relation_to_id.tsv.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(text)
    assert read_vocab(plain).labels == ("alpha", "beta")
    assert read_vocab(gz).labels == ("alpha", "beta")


def test_openke_count(tmp_path):
    p = write(tmp_path / "entity2id.txt", b"2\nfoo\t0\nbar\t1\n")
    assert read_vocab(p).labels == ("foo", "bar")
    bad = write(tmp_path / "relation2id.txt", b"3\nfoo\t0\nbar\t1\n")
    with pytest.raises(DataError, match=r"relation2id\.txt:1: .*says 3 entries but the file has 2"):
        read_vocab(bad)


def test_duplicate_id_names_line(tmp_path):
    p = write(tmp_path / "node_dict", b"a\t0\nb\t1\nc\t1\n")
    with pytest.raises(DataError) as e:
        read_vocab(p)
    assert f"{p}:3:" in str(e.value) and "line 2" in str(e.value)


def test_duplicate_label_names_line(tmp_path):
    p = write(tmp_path / "node_dict", b"a\t0\nb\t1\n\na\t2\n")
    with pytest.raises(DataError, match=rf"{p}:4: label 'a' already has an id on line 1"):
        read_vocab(p)


def test_non_contiguous_ids(tmp_path):
    p = write(tmp_path / "rel_dict", b"a\t0\nb\t2\n")
    with pytest.raises(DataError) as e:
        read_vocab(p)
    assert e.value.line is None and "id 1 is missing" in str(e.value) and str(p) in str(e.value)


def test_bad_id_and_field_count(tmp_path):
    p = write(tmp_path / "node_dict", b"a\t0\nb\tx\n")
    with pytest.raises(DataError, match=rf"{p}:2: id 'x'"):
        read_vocab(p)
    q = write(tmp_path / "node_dict2", b"a\t0\nb 1\n")
    with pytest.raises(DataError, match=rf"{q}:2: expected 2"):
        read_vocab(q)


def test_non_utf8_line(tmp_path):
    p = write(tmp_path / "node_dict", b"a\t0\nb\xe9\t1\n")
    with pytest.raises(DataError, match=rf"{p}:2: .*not valid UTF-8"):
        read_vocab(p)


def test_write_read_roundtrip(tmp_path):
    v = Vocab(("z", "CHEBI:1", "a b"))
    p = tmp_path / "sub" / "node_dict"
    write_vocab(v, p)
    assert p.read_text() == "z\t0\nCHEBI:1\t1\na b\t2\n"
    assert read_vocab(p) == v
    assert not [f for f in p.parent.iterdir() if f.name.endswith(".tmp")]
