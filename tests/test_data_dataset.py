import gzip
import json
import warnings
from pathlib import Path

import pytest
import torch

from kgtrace.core.errors import DataError, DataWarning, KgtraceError
from kgtrace.data.dataset import Dataset, load_dataset, save_dataset
from kgtrace.data.registry import BUNDLED
from kgtrace.data.vocab import Vocab


@pytest.mark.parametrize(
    ("name", "sizes"),
    [("umls", (135, 46, 5216, 652, 661)), ("kinships", (104, 25, 8544, 1068, 1074)), ("nations", (14, 55, 1592, 199, 201))],
)
def test_bundled_sizes(name, sizes):
    ds = load_dataset(name)
    assert (ds.num_entities, ds.num_relations, len(ds.train), len(ds.valid), len(ds.test)) == sizes
    assert ds.train.dtype == torch.int64 and ds.train.shape[1] == 3
    assert ds.source == name and ds.name == name
    assert list(ds.entities.labels) == sorted(ds.entities.labels)
    assert int(ds.all_triples()[:, 0].max()) < ds.num_entities
    assert len(ds.all_triples()) == sum(sizes[2:])


def test_bundled_label_roundtrip():
    ds = load_dataset("umls")
    h, r, t = ds.train[0].tolist()
    assert (ds.entity_label(h), ds.relation_label(r), ds.entity_label(t)) == (
        "acquired_abnormality", "location_of", "experimental_model_of_disease")
    assert ds.entity_name("acquired_abnormality") == "acquired_abnormality"


def test_unknown_name_lists_bundled(tmp_path):
    with pytest.raises(KgtraceError) as e:
        load_dataset(str(tmp_path / "missing"))
    assert all(b in str(e.value) for b in BUNDLED)


def make_folder(tmp_path, suffix=".txt"):
    folder = tmp_path / "ds"
    folder.mkdir(parents=True)
    (folder / f"train{suffix}").write_text("a\tr\tb\nb\tr\tc\nc\ts\ta\n")
    (folder / f"valid{suffix}").write_text("a\ts\tb\n")
    (folder / f"test{suffix}").write_text("head\trelation\ttail\nb\tr\ta\n")
    return folder


def test_folder_without_maps_builds_sorted_ids(tmp_path):
    ds = load_dataset(make_folder(tmp_path, ".tsv"))
    assert ds.entities.labels == ("a", "b", "c") and ds.relations.labels == ("r", "s")
    assert ds.test.tolist() == [[1, 0, 0]]
    assert ds.source == str((tmp_path / "ds").resolve())


def test_folder_with_pykeen_gz_maps_names_edge_map(tmp_path):
    folder = make_folder(tmp_path)
    for fname, rows in (("entity_to_id.tsv.gz", ["c", "a", "b"]), ("relation_to_id.tsv.gz", ["s", "r"])):
        with gzip.open(folder / fname, "wt") as f:
            f.write("id\tlabel\n" + "".join(f"{i}\t{x}\n" for i, x in enumerate(rows)))
    (folder / "node_names.txt").write_text("Alpha\ta\nBeta\tb\n")
    (folder / "edge_map.json").write_text(json.dumps({json.dumps({"predicate": "x:r", "q_qualifier": "v"}): "r"}))
    (folder / "node_categories.tsv").write_text("a\tT1|T2\n")
    ds = load_dataset(folder)
    assert ds.entities.labels == ("c", "a", "b")
    assert ds.train[0].tolist() == [1, 1, 2]
    assert ds.entity_name("a") == "Alpha" and ds.entity_name("c") == "c"
    assert ds.relation_names == {"r": "x:r [q_qualifier=v]"}
    assert ds.entity_categories == {"a": ("T1", "T2")}


def test_half_present_map_pair(tmp_path):
    folder = make_folder(tmp_path)
    (folder / "node_dict").write_text("a\t0\nb\t1\nc\t2\n")
    with pytest.raises(DataError, match="rel_dict is missing"):
        load_dataset(folder)


def test_passed_vocab_overrides_and_reports_line(tmp_path):
    folder = make_folder(tmp_path)
    ents, rels = Vocab(("c", "b", "a")), Vocab(("s", "r"))
    ds = load_dataset(folder, entities=ents, relations=rels)
    assert ds.entities is ents and ds.valid.tolist() == [[2, 0, 1]]
    with pytest.raises(DataError) as e:
        load_dataset(folder, entities=Vocab(("a", "b")), relations=rels)
    assert e.value.line == 2 and e.value.path.endswith("train.txt") and "'c'" in str(e.value)


def test_missing_split_and_ambiguous_split(tmp_path):
    folder = make_folder(tmp_path)
    (folder / "valid.txt").unlink()
    with pytest.raises(DataError, match="no valid split"):
        load_dataset(folder)
    (folder / "valid.txt").write_text("a\ts\tb\n")
    (folder / "valid.tsv").write_text("a\ts\tb\n")
    with pytest.raises(DataError, match="both valid.txt and valid.tsv"):
        load_dataset(folder)


def test_save_roundtrip_keeps_ids_and_extras(tmp_path):
    ds = load_dataset("nations")
    ds = Dataset(
        ds.name, ds.source, ds.entities, ds.relations, ds.train, ds.valid, ds.test,
        entity_names={ds.entity_label(0): "Zero land"},
        relation_names={ds.relation_label(0): "readable relation"},
        entity_categories={ds.entity_label(0): ("Country",)},
    )
    out = tmp_path / "saved"
    save_dataset(ds, out)
    again = load_dataset(out)
    assert again.entities == ds.entities and again.relations == ds.relations
    for split in ("train", "valid", "test"):
        assert torch.equal(getattr(again, split), getattr(ds, split))
    assert again.entity_names == ds.entity_names
    assert again.relation_names == ds.relation_names
    assert again.entity_categories == ds.entity_categories
    with pytest.raises(DataError, match="already exists"):
        save_dataset(ds, out)
    save_dataset(ds, out, overwrite=True)


@pytest.mark.parametrize("suffix", [".txt.gz", ".tsv.gz"])
def test_gzipped_splits_read_like_plain_ones(tmp_path, suffix):
    plain = load_dataset(make_folder(tmp_path / "plain"))
    folder = make_folder(tmp_path / "packed")
    for split in ("train", "valid", "test"):
        path = folder / f"{split}.txt"
        (folder / f"{split}{suffix}").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    packed = load_dataset(folder)
    assert packed.entities == plain.entities and packed.relations == plain.relations
    for split in ("train", "valid", "test"):
        assert torch.equal(getattr(packed, split), getattr(plain, split))


def test_plain_and_gzipped_split_both_present(tmp_path):
    folder = make_folder(tmp_path)
    (folder / "train.txt.gz").write_bytes(gzip.compress((folder / "train.txt").read_bytes()))
    with pytest.raises(DataError, match="both train.txt and train.txt.gz exist"):
        load_dataset(folder)


def test_label_missing_from_map_names_the_map_in_use(tmp_path):
    folder = make_folder(tmp_path)
    (folder / "entity_to_id.tsv").write_text("id\tlabel\n0\ta\n1\tb\n")  # no c
    (folder / "relation_to_id.tsv").write_text("id\tlabel\n0\tr\n1\ts\n")
    with pytest.raises(DataError) as e:
        load_dataset(folder)
    assert e.value.path.endswith("train.txt") and e.value.line == 2
    assert "entity_to_id.tsv" in e.value.problem and "add the entity to entity_to_id.tsv" in e.value.fix
    assert "node_dict" not in str(e.value)


def test_label_missing_from_a_runs_map_says_the_map_is_fixed(tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset(make_folder(tmp_path), entities=Vocab(("a", "b")), relations=Vocab(("r", "s")))
    assert "node_dict" in e.value.problem and "train a new run" in e.value.fix and "add the" not in e.value.fix


NATIONS = Path(__file__).parents[1] / "src/kgtrace/data/bundled/nations"


def nations_folder(tmp_path, extra_test="", extra_valid=""):
    folder = tmp_path / "nations"
    folder.mkdir()
    for split, extra in (("train", ""), ("valid", extra_valid), ("test", extra_test)):
        (folder / f"{split}.txt").write_text((NATIONS / f"{split}.txt").read_text() + extra)
    return folder


def test_bundled_datasets_load_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        for name in BUNDLED:
            load_dataset(name)


def test_test_only_entity_is_left_out_with_a_warning(tmp_path):
    folder = nations_folder(tmp_path, extra_test="atlantis\tembassy\tusa\nusa\tembassy\tatlantis\n")
    with pytest.warns(DataWarning) as caught:
        ds = load_dataset(folder)
    assert (ds.num_entities, ds.num_relations, len(ds.train), len(ds.valid), len(ds.test)) == (14, 55, 1592, 199, 201)
    assert "atlantis" not in ds.entities.to_id
    message = str(caught[0].message)
    assert str(folder / "test.txt") in message and "left out 2 of 203" in message
    assert "line 202: entity 'atlantis'" in message and "line 203: entity 'atlantis'" in message
    assert "kgtrace prepare --triples" in message
    # Reloading with the run's own maps gives the same splits.
    with pytest.warns(DataWarning):
        again = load_dataset(folder, entities=ds.entities, relations=ds.relations)
    assert torch.equal(again.test, ds.test) and torch.equal(again.valid, ds.valid)


def test_valid_only_relation_is_left_out_too(tmp_path):
    folder = nations_folder(tmp_path, extra_valid="usa\tinvades\tuk\n")
    with pytest.warns(DataWarning, match="line 200: relation 'invades'"):
        ds = load_dataset(folder)
    assert (ds.num_relations, len(ds.valid)) == (55, 199) and "invades" not in ds.relations.to_id


def test_id_maps_listing_an_entity_unseen_in_train(tmp_path):
    folder = nations_folder(tmp_path, extra_test="atlantis\tembassy\tusa\n")
    bundled = load_dataset("nations")
    (folder / "node_dict").write_text("".join(f"{x}\t{i}\n" for i, x in enumerate(bundled.entities.labels))
                                      + "atlantis\t14\n")
    (folder / "rel_dict").write_text("".join(f"{x}\t{i}\n" for i, x in enumerate(bundled.relations.labels)))
    with pytest.warns(DataWarning, match="entity 'atlantis'"):
        ds = load_dataset(folder)
    # The map keeps its ids (an untrained row), but no evaluation triple uses the entity.
    assert ds.num_entities == 15 and len(ds.test) == 201
    assert 14 not in ds.all_triples()[:, [0, 2]].unique().tolist()


def test_relation_the_id_map_lists_may_be_held_out_of_train(tmp_path):
    folder = make_folder(tmp_path)
    (folder / "test.txt").write_text("a\tt\tb\n")  # t: in rel_dict, never in train
    (folder / "node_dict").write_text("a\t0\nb\t1\nc\t2\n")
    (folder / "rel_dict").write_text("r\t0\ns\t1\nt\t2\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        ds = load_dataset(folder)
    assert ds.test.tolist() == [[0, 2, 1]]


@pytest.mark.parametrize("text", ["", "head\trelation\ttail\n", "# nothing yet\n\n"])
def test_empty_train_split(tmp_path, text):
    folder = make_folder(tmp_path)
    (folder / "train.txt").write_text(text)
    with pytest.raises(DataError) as e:
        load_dataset(folder)
    assert e.value.path.endswith("train.txt") and "no triples" in e.value.problem


def test_cli_prints_the_warning_as_one_line(tmp_path, capsys):
    from kgtrace.cli import main

    folder = nations_folder(tmp_path, extra_test="atlantis\tembassy\tusa\n")
    code = main(["train", "--dataset", str(folder), "--out", str(tmp_path / "run"), "--model", "distmult",
                 "--epochs", "1", "--model-arg", "embedding_dim=8", "--eval-every", "0", "--no-progress",
                 "--device", "cpu", "--threads", "1", "--no-compile"])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = [line for line in err.splitlines() if "atlantis" in line]
    assert len(lines) == 1 and lines[0].startswith("kgtrace train: warning: ") and "test.txt" in lines[0]
    assert "DataWarning" not in err and "warnings.warn" not in err
    assert len((tmp_path / "run" / "node_dict").read_text().splitlines()) == 14


def test_a_file_given_as_dataset_folder(tmp_path):
    folder = make_folder(tmp_path)
    with pytest.raises(DataError) as e:
        load_dataset(folder / "train.txt")
    assert "a file, not a dataset folder" in e.value.problem and "kgtrace prepare --triples" in e.value.fix
