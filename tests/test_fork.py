"""kgtrace's readers in a process forked after polars ran in its parent: they finish, or say why they cannot.

polars' thread pool does not survive a fork: in the child, a polars call that hands work to the pool waits
forever at 0% CPU (what hung a test run in ``pl.read_csv``). A user's ``multiprocessing`` pool on Linux
forks by default. Each reader here runs in such a child, which must end within its limit.
"""

import os
import pickle
import signal
import time

import numpy as np
import polars as pl
import pytest

from kgtrace.compute.system import polars_usable
from kgtrace.core.errors import KgtraceError
from kgtrace.data.dataset import load_dataset
from kgtrace.data.kgx import read_kgx
from kgtrace.data.names import read_names
from kgtrace.data.triples import read_labeled_triples, read_labeled_triples_with_lines
from kgtrace.data.vocab import Vocab, read_vocab

LIMIT_S = 60.0


def in_forked_child(function):
    """function() in a child forked from this process (after polars ran here): ("ok", result) or ("error", text).

    A child still running after LIMIT_S is killed and the test fails: it hung.
    """
    pl.read_csv(b"a\tb\tc\nd\te\tf\n", separator="\t", has_header=False)  # polars' pool now runs here
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running pytest's exit handlers
        os.close(read)
        try:
            outcome = ("ok", function())
        except KgtraceError as e:
            outcome = ("error", str(e))
        except BaseException as e:  # noqa: B036 - anything else is reported to the parent, which fails
            outcome = ("crash", f"{type(e).__name__}: {e}")
        with os.fdopen(write, "wb") as f:
            pickle.dump(outcome, f)
        os._exit(0)
    os.close(write)
    start = time.monotonic()
    while time.monotonic() - start < LIMIT_S:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)
        pytest.fail(f"{function.__name__} hung in a forked child (killed after {LIMIT_S:.0f} s)")
    with os.fdopen(read, "rb") as f:
        outcome = pickle.load(f)
    assert outcome[0] != "crash", outcome[1]
    return outcome


@pytest.fixture
def files(tmp_path):
    triples = tmp_path / "train.tsv"
    triples.write_text("# a comment\nusa\tembassy\tchina\nuk\ttreaties\tussr\n\nchina\tembassy\tusa\n")
    (tmp_path / "valid.tsv").write_text("usa\tembassy\tussr\nusa\tembassy\tmars\n")  # mars: unseen, left out
    (tmp_path / "test.tsv").write_text("usa\tembassy\tussr\n")
    (tmp_path / "names.tsv").write_text("usa\tUnited States\nuk\tUnited Kingdom\n")
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "node_dict").write_text("china\t0\nuk\t1\nusa\t2\nussr\t3\n")
    return tmp_path


def test_the_child_knows_polars_cannot_run_there():
    assert polars_usable()
    assert in_forked_child(polars_usable) == ("ok", False)


def test_triples_names_and_id_maps_are_read_in_a_forked_child(files):
    def read():
        labeled, lines = read_labeled_triples_with_lines(files / "train.tsv")
        return (labeled.tolist(), lines.tolist(), read_labeled_triples(files / "test.tsv").tolist(),
                read_names(files / "names.tsv"), read_vocab(files / "maps" / "node_dict").labels,
                Vocab(("a", "b")).lookup(np.array(["b", "z"], dtype=object)).tolist())

    assert in_forked_child(read) == ("ok", read())


def test_a_dataset_is_loaded_in_a_forked_child(files):
    def load():
        ds = load_dataset(files)
        return ds.train.tolist(), ds.valid.tolist(), ds.test.tolist(), ds.entities.labels, ds.relations.labels

    with pytest.warns(UserWarning, match="mars"):
        expected = load()
    assert len(expected[1]) == 1
    assert in_forked_child(load) == ("ok", expected)


def test_a_bad_file_gets_its_message_in_a_forked_child(files):
    (files / "bad.tsv").write_text("usa\tembassy\n")

    def bad():
        return read_labeled_triples(files / "bad.tsv")

    with pytest.raises(KgtraceError) as here:
        bad()
    assert in_forked_child(bad) == ("error", str(here.value))


def test_kgx_in_a_forked_child_says_why_it_cannot_read(files):
    (files / "nodes.tsv").write_text("id\tcategory\tname\nA:1\tbiolink:Drug\tone\nB:2\tbiolink:Disease\ttwo\n")
    (files / "edges.tsv").write_text("subject\tpredicate\tobject\nA:1\tbiolink:treats\tB:2\n")

    def kgx():
        return read_kgx(files / "nodes.tsv", files / "edges.tsv")

    kind, text = in_forked_child(kgx)
    assert kind == "error" and "forked" in text and "spawn" in text
