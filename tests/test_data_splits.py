import numpy as np
import pytest

from kgtrace.core.errors import ConfigError
from kgtrace.data.splits import ensure_seen, holdout_predicate, random_split


def arr(rows):
    return np.array(rows, dtype=object).reshape(-1, 3)


def graph(n=400, seed=1):
    rng = np.random.default_rng(seed)
    return arr([[f"e{rng.integers(40)}", f"r{rng.integers(4)}", f"e{rng.integers(40)}"] for _ in range(n)])


def entities(t):
    return set(t[:, 0]) | set(t[:, 2])


def test_random_split_deterministic_and_complete():
    t = graph()
    a = random_split(t, (0.8, 0.1, 0.1), seed=3)
    b = random_split(t, (0.8, 0.1, 0.1), seed=3)
    c = random_split(t, (0.8, 0.1, 0.1), seed=4)
    for x, y in zip(a[:3], b[:3]):
        assert np.array_equal(x, y)
    assert not np.array_equal(a[1], c[1])
    train, valid, test, report = a
    assert len(train) + len(valid) + len(test) == len(t)
    assert sorted(map(tuple, np.concatenate([train, valid, test]).tolist())) == sorted(map(tuple, t.tolist()))
    assert (report.train, report.valid, report.test) == (len(train), len(valid), len(test))
    assert len(valid) + report.moved_to_train >= 39  # ~10% before moves
    assert entities(valid) <= entities(train) and entities(test) <= entities(train)


def test_random_split_bad_fractions():
    with pytest.raises(ConfigError) as e:
        random_split(graph(), (0.8, 0.3, 0.1))
    assert "sum to 1.2" in str(e.value)


def test_ensure_seen_move_is_minimal():
    train = arr([["a", "r", "b"]])
    valid = arr([["a", "r", "x"], ["b", "r", "x"], ["a", "r", "b"]])
    test = arr([["x", "s", "a"], ["y", "r", "a"]])
    new_train, v, t, report = ensure_seen(train, valid, test, policy="move")
    # moving (a r x) makes x seen, so (b r x) stays; (x s a) moves for relation s; (y r a) moves for y
    assert report.moved_to_train == 3 and report.dropped == 0
    assert v.tolist() == [["b", "r", "x"], ["a", "r", "b"]]
    assert t.tolist() == []
    assert new_train.tolist() == [["a", "r", "b"], ["a", "r", "x"], ["x", "s", "a"], ["y", "r", "a"]]


def test_ensure_seen_drop():
    train = arr([["a", "r", "b"]])
    valid = arr([["a", "r", "x"], ["b", "r", "a"]])
    test = arr([["a", "s", "b"], ["b", "r", "b"]])
    new_train, v, t, report = ensure_seen(train, valid, test, policy="drop")
    assert report.dropped == 2 and report.moved_to_train == 0
    assert new_train.tolist() == train.tolist()
    assert v.tolist() == [["b", "r", "a"]] and t.tolist() == [["b", "r", "b"]]
    with pytest.raises(ConfigError):
        ensure_seen(train, valid, test, policy="shuffle")


def test_holdout_predicate():
    t = graph(600)
    t[::7, 1] = "treats"
    train, valid, test, report = holdout_predicate(t, "treats", valid_fraction=0.1, seed=0)
    again = holdout_predicate(t, "treats", valid_fraction=0.1, seed=0)
    assert np.array_equal(valid, again[1]) and np.array_equal(test, again[2])
    assert set(test[:, 1]) == {"treats"} and "treats" not in set(train[:, 1]) | set(valid[:, 1])
    assert 0 < len(test) <= (t[:, 1] == "treats").sum()
    assert report.moved_to_train == 0
    assert len(train) + len(valid) + len(test) + report.dropped == len(t)
    assert entities(test) <= entities(train)
    with pytest.raises(ConfigError, match="not a relation"):
        holdout_predicate(t, "nope")


def test_holdout_fraction_keeps_part_of_the_predicate_for_training():
    import numpy as np

    from kgtrace.data.splits import holdout_predicate

    rows = [(f"d{i}", "treats", f"s{i % 5}") for i in range(20)] + [(f"d{i}", "binds", f"s{i % 5}") for i in range(20)]
    triples = np.array(rows, dtype=object)
    train, valid, test, _ = holdout_predicate(triples, "treats", valid_fraction=0.0, seed=1, test_fraction=0.25)
    assert len(test) == 5 and set(test[:, 1]) == {"treats"}
    assert (train[:, 1] == "treats").sum() == 15  # the relation can be learned
    again = holdout_predicate(triples, "treats", valid_fraction=0.0, seed=1, test_fraction=0.25)[2]
    assert (again == test).all()
