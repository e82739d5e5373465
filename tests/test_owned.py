"""kgtrace.core.owned: which folders --overwrite may replace, the locks, and results written index last."""

import json

import pytest

from kgtrace.core.errors import KgtraceError, command_line
from kgtrace.core.io import atomic_write_text
from kgtrace.core.owned import (
    LOCK,
    MANIFEST,
    MARKER,
    check_out_folder,
    claim_out_folder,
    file_digest,
    file_lock,
    folder_lock,
    kept_note,
    read_mark,
    replace_problem,
    retire,
    write_index,
    write_mark,
)


def test_claim_creates_marks_and_replaces_only_its_own_kind(tmp_path):
    out = tmp_path / "run"
    assert claim_out_folder(out, kind="run", overwrite=False) == []
    assert read_mark(out).kind == "run"
    atomic_write_text(out / "checkpoints" / "epoch-0001.pt", "x")  # kgtrace's: listed in its manifest
    with command_line(), pytest.raises(KgtraceError, match=r"^--out .*/run: folder is not empty .*checkpoints.*Fix: "
                                                          "choose another --out or pass --overwrite"):
        check_out_folder(out, kind="run", overwrite=False)
    # the same refusal to a Python caller names its arguments
    with pytest.raises(KgtraceError, match=r"^out='.*/run': folder is not empty .*Fix: choose another out or pass "
                                           "overwrite=True"):
        check_out_folder(out, kind="run", overwrite=False)
    assert claim_out_folder(out, kind="run", overwrite=True) == []
    assert sorted(p.name for p in out.iterdir()) == [MARKER, MANIFEST]
    atomic_write_text(out / "config.yaml", "epochs: 1\n")
    with pytest.raises(KgtraceError, match="is a run folder, not a dataset folder"):
        claim_out_folder(out, kind="dataset", overwrite=True)


def test_overwrite_removes_only_what_kgtrace_wrote_and_says_what_it_kept(tmp_path):
    out = tmp_path / "run"
    claim_out_folder(out, kind="run", overwrite=False)
    atomic_write_text(out / "config.yaml", "epochs: 1\n")
    atomic_write_text(out / "checkpoints" / "epoch-0001.pt", "x")
    (out / "notes.txt").write_text("mine\n")  # the user's, added by hand
    (out / "mydata").mkdir()
    (out / "mydata" / "keep.tsv").write_text("a\tb\n")
    (out / "checkpoints" / "mine.pt").write_text("y")  # the user's, beside kgtrace's
    kept = claim_out_folder(out, kind="run", overwrite=True)
    assert kept == ["checkpoints/mine.pt", "mydata/keep.tsv", "notes.txt"]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        MARKER, MANIFEST, "checkpoints", "checkpoints/mine.pt", "mydata", "mydata/keep.tsv", "notes.txt"]
    assert "kept 3 files" in kept_note(out, kept) and "notes.txt" in kept_note(out, kept)
    assert kept_note(out, []) is None


def test_a_marked_folder_without_a_list_of_its_files_is_not_replaced(tmp_path):
    out = tmp_path / "old"
    claim_out_folder(out, kind="run", overwrite=False)
    (out / MANIFEST).unlink()  # as an earlier kgtrace left it
    (out / "config.yaml").write_text("epochs: 1\n")
    with pytest.raises(KgtraceError, match="did not list the files it wrote.*Nothing was deleted"):
        claim_out_folder(out, kind="run", overwrite=True)
    assert (out / "config.yaml").is_file()


def test_unmarked_folder_is_never_emptied(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.yaml").write_text("epochs: 1\n")
    with pytest.raises(KgtraceError, match="not written by kgtrace.*Nothing was deleted"):
        claim_out_folder(tmp_path / "mine", kind="run", overwrite=True)
    assert (tmp_path / "mine" / "config.yaml").read_text() == "epochs: 1\n"


def test_replace_problems_inputs_and_working_directory(tmp_path, monkeypatch):
    out = tmp_path / "d"
    claim_out_folder(out, kind="dataset", overwrite=False)
    (out / "x.txt").write_text("a\tr\tb\n")
    assert "holds an input" in replace_problem(out, "dataset", [out / "x.txt"])
    assert replace_problem(out, "dataset", [tmp_path / "elsewhere.txt", None]) is None
    monkeypatch.chdir(out)
    assert "working directory" in replace_problem(out, "dataset")
    monkeypatch.chdir(tmp_path)
    assert "working directory" in replace_problem(tmp_path, "dataset")


def test_a_file_is_not_a_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(KgtraceError, match="is a file, not a folder"):
        check_out_folder(tmp_path / "f", kind="run", overwrite=True)


def test_lock_file_is_not_content_and_survives_claiming(tmp_path):
    out = tmp_path / "run"
    claim_out_folder(out, kind="run", overwrite=False)
    with folder_lock(out):
        assert (out / LOCK).is_file()
        check_out_folder(out, kind="run", overwrite=False)  # holds only the marker and the lock: still empty
        with folder_lock(out):  # re-entrant within one process (train inside kgtrace run)
            pass
        claim_out_folder(out, kind="run", overwrite=True)
        assert (out / LOCK).is_file()
    holder = json.loads((out / LOCK).read_text())
    assert {"pid", "host", "command", "since"} <= set(holder)


def test_file_lock_leaves_no_file(tmp_path):
    with file_lock(tmp_path / "sub" / "m.json"):
        assert (tmp_path / "sub" / ".m.json.lock").is_file()
    assert list((tmp_path / "sub").iterdir()) == []


def test_index_written_last_names_its_companions(tmp_path):
    index, table = tmp_path / "x.json", tmp_path / "x.tsv"
    index.write_text('{"old": true}')
    retire(index)
    assert not index.exists()
    table.write_text("a\tb\n")
    write_index(index, {"rows": [1]}, [table])
    assert json.loads(index.read_text()) == {"rows": [1], "files": {"x.tsv": file_digest(table)}}


def test_a_failed_table_write_leaves_no_stale_json(tmp_path, monkeypatch):
    """A kill (here: an error) between the table and the JSON leaves no JSON at all, never the old one."""
    from kgtrace.attribution import results

    out = tmp_path / "e.json"
    out.write_text('{"explanations": []}\n')
    (tmp_path / "e.tsv").write_text("old\n")

    def fail(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(results, "write_index", fail)
    with pytest.raises(OSError):
        results.Explanations(()).write(out)
    assert not out.exists()


def test_mark_records_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["/usr/bin/kgtrace", "train", "--out", "r"])
    write_mark(tmp_path, "run")
    assert read_mark(tmp_path).command == "kgtrace train --out r"
    (tmp_path / MARKER).write_text("not json")
    assert read_mark(tmp_path) is None


def test_a_folder_kgtrace_owns_below_another_is_its_own_on_overwrite(tmp_path):
    """A run's TracIn index (a folder kgtrace owns inside the run): replacing the run removes what the index's own
    list names, keeps the user's file inside it, and does not count kgtrace's index files as the user's."""
    out = tmp_path / "run"
    claim_out_folder(out, kind="run", overwrite=False)
    atomic_write_text(out / "config.yaml", "epochs: 1\n")
    write_mark(out / "tracin-index", "tracin-index")
    atomic_write_text(out / "tracin-index" / "index.json", "{}\n")
    (out / "tracin-index" / "mine.txt").write_text("mine\n")
    assert claim_out_folder(out, kind="run", overwrite=True) == ["tracin-index/mine.txt"]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        MARKER, MANIFEST, "tracin-index", "tracin-index/mine.txt"]


def test_a_list_that_leads_out_of_the_folder_is_not_followed(tmp_path):
    out = tmp_path / "run"
    claim_out_folder(out, kind="run", overwrite=False)
    outside = tmp_path / "precious.txt"
    outside.write_text("mine\n")
    with open(out / MANIFEST, "a") as f:
        f.write("../precious.txt\n")
    claim_out_folder(out, kind="run", overwrite=True)
    assert outside.read_text() == "mine\n"
