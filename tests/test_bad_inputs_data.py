"""Bad inputs to the data layer through the real CLI: a non-zero exit, no traceback, a message naming the file
(and line), and the user's input folder untouched (tests/badinput.py)."""

import gzip
import json

import pytest
from badinput import refused

TRIPLES = "".join(f"e{i}\tr{i % 3}\te{(i * 7) % 40}\n" for i in range(400))


@pytest.fixture
def inputs(tmp_path):
    """The folder of the user's input files (watched), and where outputs would go."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    return folder, tmp_path / "out"


def prepare_refused(inputs, *args, mentions):
    folder, out = inputs
    return refused(["prepare", *args, "--out", out], watch=folder, mentions=mentions)


def train_refused(inputs, dataset, mentions):
    folder, out = inputs
    return refused(["train", "--dataset", dataset, "--out", out, "--epochs", "1", "--model-arg", "embedding_dim=16",
                    "--no-progress", "--device", "cpu"], watch=folder, mentions=mentions)


def dataset_folder(inputs, train="a\tr\tb\nb\tr\tc\nc\ts\ta\n"):
    folder = inputs[0] / "ds"
    folder.mkdir()
    (folder / "train.txt").write_text(train)
    (folder / "valid.txt").write_text("a\ts\tb\n")
    (folder / "test.txt").write_text("b\tr\ta\n")
    return folder


def kgx_nodes(folder):
    nodes = folder / "nodes.jsonl"
    nodes.write_text("".join(json.dumps({"id": f"e{i}", "category": "biolink:Thing"}) + "\n" for i in range(40)))
    return nodes


# ----------------------------------------------------------------------------- kgtrace prepare


def test_cut_off_gzip_triples(inputs):
    path = inputs[0] / "kg.tsv.gz"
    packed = gzip.compress(TRIPLES.encode())
    path.write_bytes(packed[: len(packed) // 2])
    err = prepare_refused(inputs, "--triples", path, mentions=[f"{path}:", "cut off or damaged", "download"])
    assert "EOFError" not in err


def test_plain_triples_named_gz(inputs):
    path = inputs[0] / "kg.tsv.gz"
    path.write_text(TRIPLES)
    prepare_refused(inputs, "--triples", path, mentions=[str(path), "not gzip-compressed", "rename it to kg.tsv"])


def test_gzip_bytes_in_a_txt_file(inputs):
    path = inputs[0] / "kg.txt"
    path.write_bytes(gzip.compress(TRIPLES.encode()))
    err = prepare_refused(inputs, "--triples", path, mentions=[str(path), "gzip-compressed", "kg.txt.gz"])
    assert "iconv" not in err


def test_folder_given_as_triples(inputs):
    prepare_refused(inputs, "--triples", inputs[0], mentions=[str(inputs[0]), "is a folder", "labelled triples"])


def test_missing_triples_file(inputs):
    prepare_refused(inputs, "--triples", inputs[0] / "nope.tsv", mentions=["nope.tsv", "not found"])


def test_line_with_two_columns(inputs):
    path = inputs[0] / "kg.tsv"
    path.write_text("a\tr\tb\nc\tr\n")
    prepare_refused(inputs, "--triples", path, mentions=[f"{path}:2:", "found 2"])


def test_line_with_four_columns(inputs):
    path = inputs[0] / "kg.tsv"
    path.write_text("a\tr\tb\nc\tr\td\te\n")
    prepare_refused(inputs, "--triples", path, mentions=[f"{path}:2:", "found 4"])


@pytest.mark.parametrize("text", ["", "subject\tpredicate\tobject\n", "# nothing yet\n"])
def test_triples_file_without_triples(inputs, text):
    path = inputs[0] / "kg.tsv"
    path.write_text(text)
    prepare_refused(inputs, "--triples", path, mentions=[str(path), "no triples"])


@pytest.mark.parametrize("line, mentions", [
    ("usa \tembassy\tchina\n", ["'usa '", "white space", "beside 'usa'"]),
    ("usa\t embassy\tchina\n", ["' embassy'", "white space"]),
    ("u\ufeffsa\tembassy\tchina\n", ["byte-order mark"]),
    ("usa\temb\x00assy\tchina\n", ["NUL"]),
    ("usa\temb\rassy\tchina\n", ["control character"]),
])
def test_a_label_that_would_silently_become_another_is_refused_at_its_line(inputs, line, mentions):
    path = inputs[0] / "kg.tsv"
    path.write_text("usa\tembassy\tchina\nuk\tembassy\tussr\n" + line, newline="")
    prepare_refused(inputs, "--triples", path, mentions=[f"{path}:3:", *mentions])


def test_binary_file(inputs):
    path = inputs[0] / "kg.tsv"
    path.write_bytes(bytes(range(256)) * 4)
    prepare_refused(inputs, "--triples", path, mentions=[f"{path}:1:", "looks like a binary file"])


def test_cut_off_gzip_kgx_edges(inputs):
    edges = inputs[0] / "edges.jsonl.gz"
    rows = "".join(json.dumps({"subject": f"e{i % 40}", "predicate": "biolink:related_to", "object": f"e{i % 7}"})
                   + "\n" for i in range(3000))
    packed = gzip.compress(rows.encode())
    edges.write_bytes(packed[: len(packed) // 2])
    prepare_refused(inputs, "--nodes", kgx_nodes(inputs[0]), "--edges", edges,
                    mentions=[f"{edges}:", "cut off or damaged"])


def test_plain_kgx_nodes_named_gz(inputs):
    nodes = inputs[0] / "nodes.jsonl.gz"
    nodes.write_bytes(kgx_nodes(inputs[0]).read_bytes())
    edges = inputs[0] / "edges.jsonl"
    edges.write_text(json.dumps({"subject": "e1", "predicate": "biolink:related_to", "object": "e2"}) + "\n")
    prepare_refused(inputs, "--nodes", nodes, "--edges", edges,
                    mentions=[str(nodes), "not gzip-compressed", "rename it to nodes.jsonl"])


@pytest.mark.parametrize("name", ["edges.jsonl", "edges.tsv"])
def test_empty_kgx_edges_file(inputs, name):
    edges = inputs[0] / name
    edges.write_text("subject\tpredicate\tobject\n" if name.endswith("tsv") else "")
    prepare_refused(inputs, "--nodes", kgx_nodes(inputs[0]), "--edges", edges, mentions=[str(edges), "no edges"])


def test_category_pair_without_comma(inputs):
    nodes = kgx_nodes(inputs[0])
    prepare_refused(inputs, "--nodes", nodes, "--edges", nodes, "--category-pair", "biolink:Drug biolink:Disease",
                    mentions=["--category-pair", "biolink:Drug biolink:Disease", "comma"])


def test_fractions_not_summing_to_one(inputs):
    path = inputs[0] / "kg.tsv"
    path.write_text(TRIPLES)
    prepare_refused(inputs, "--triples", path, "--fractions", "0.8,0.2,0.2", mentions=["fractions", "sum to 1.2"])


def test_predicate_split_without_holdout_predicate(inputs):
    path = inputs[0] / "kg.tsv"
    path.write_text(TRIPLES)
    prepare_refused(inputs, "--triples", path, "--split", "predicate", mentions=["--holdout-predicate", "biolink:treats"])


def test_names_file_with_a_bad_line(inputs):
    path, names = inputs[0] / "kg.tsv", inputs[0] / "names.txt"
    path.write_text(TRIPLES)
    names.write_text("e1\tfirst\ne2\tsecond\tthird\n")
    prepare_refused(inputs, "--triples", path, "--names", names, mentions=[f"{names}:2:", "expected 2"])


# ----------------------------------------------------------------------------- kgtrace train --dataset


def test_missing_dataset_folder(inputs):
    train_refused(inputs, inputs[0] / "nowhere",
                  mentions=["nowhere", "neither a registered dataset nor a folder", "kgtrace datasets"])


def test_file_given_as_dataset(inputs):
    path = inputs[0] / "kg.tsv"
    path.write_text(TRIPLES)
    train_refused(inputs, path, mentions=[str(path), "not a dataset folder", "kgtrace prepare --triples"])


@pytest.mark.parametrize("text", ["", "head\trelation\ttail\n"])
def test_train_split_without_triples(inputs, text):
    folder = dataset_folder(inputs, train=text)
    train_refused(inputs, folder, mentions=[str(folder / "train.txt")])


def test_train_line_with_two_columns(inputs):
    folder = dataset_folder(inputs, train="a\tr\tb\nb\tr\n")
    train_refused(inputs, folder, mentions=[f"{folder / 'train.txt'}:2:", "found 2"])


def test_half_present_id_map_pair(inputs):
    folder = dataset_folder(inputs)
    (folder / "node_dict").write_text("a\t0\nb\t1\nc\t2\n")
    train_refused(inputs, folder, mentions=[str(folder / "rel_dict"), "node_dict is present but rel_dict is missing"])


def test_pykeen_map_disagreeing_with_triples(inputs):
    folder = dataset_folder(inputs)
    (folder / "entity_to_id.tsv").write_text("id\tlabel\n0\ta\n1\tb\n")
    (folder / "relation_to_id.tsv").write_text("id\tlabel\n0\tr\n1\ts\n")
    err = train_refused(inputs, folder, mentions=[f"{folder / 'train.txt'}:2:", "'c'",
                                                  "add the entity to entity_to_id.tsv"])
    assert "node_dict" not in err


def test_id_map_with_a_bad_line(inputs):
    folder = dataset_folder(inputs)
    (folder / "node_dict").write_text("a\t0\nb\tone\nc\t2\n")
    (folder / "rel_dict").write_text("r\t0\ns\t1\n")
    train_refused(inputs, folder, mentions=[f"{folder / 'node_dict'}:2:", "'one'"])


def test_gzipped_bytes_in_train_txt(inputs):
    folder = dataset_folder(inputs)
    (folder / "train.txt").write_bytes(gzip.compress((folder / "train.txt").read_bytes()))
    err = train_refused(inputs, folder, mentions=[str(folder / "train.txt"), "gzip-compressed", "train.txt.gz"])
    assert "iconv" not in err


def test_cut_off_gzipped_train_split(inputs):
    folder = dataset_folder(inputs)
    (folder / "train.txt").unlink()
    packed = gzip.compress(TRIPLES.encode())
    (folder / "train.txt.gz").write_bytes(packed[: len(packed) // 2])
    train_refused(inputs, folder, mentions=[f"{folder / 'train.txt.gz'}:", "cut off or damaged"])


def test_plain_and_gzipped_train_split(inputs):
    folder = dataset_folder(inputs)
    (folder / "train.txt.gz").write_bytes(gzip.compress((folder / "train.txt").read_bytes()))
    train_refused(inputs, folder, mentions=["both train.txt and train.txt.gz exist", "keep only one"])


def test_missing_valid_split(inputs):
    folder = dataset_folder(inputs)
    (folder / "valid.txt").unlink()
    train_refused(inputs, folder, mentions=[str(folder / "valid.txt"), "no valid split", ".txt.gz"])


def test_utf16_triples(inputs):
    path = inputs[0] / "kg.tsv"
    path.write_text(TRIPLES, encoding="utf-16")
    prepare_refused(inputs, "--triples", path, mentions=[str(path), "UTF-16", "iconv -f utf-16"])
