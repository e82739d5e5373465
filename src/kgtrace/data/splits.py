"""Train/valid/test splits of triples: labels (object arrays ``[n, 3]``: head, relation, tail) or integer codes
(int64 ``[n, 3]``, as ``kgtrace prepare`` splits a large graph); relations are given in the same kind.

All splits are deterministic given the seed (a numpy Generator), keep the input order within
each split, and end with `ensure_seen`, so every entity and relation of valid/test also
occurs in train (a model cannot rank an entity it never trained on).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from kgtrace.compute.system import polars_usable
from kgtrace.core.errors import ConfigError, option_name
from kgtrace.data._io import object_column

POLICIES = ("move", "drop")


@dataclass(frozen=True)
class SplitReport:
    """What a split did, and the sizes it produced."""

    moved_to_train: int  # valid/test triples moved to train because they had an unseen entity/relation
    dropped: int  # valid/test triples dropped for the same reason
    train: int
    valid: int
    test: int


def random_split(
    triples: np.ndarray, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, SplitReport]:
    """Shuffle triples into train/valid/test by ``fractions``; unseen ones are moved to train."""
    problems = check_fractions(fractions)
    if problems:
        raise ConfigError(problems)
    n = len(triples)
    order = np.random.default_rng(seed).permutation(n)
    n_valid, n_test = round(fractions[1] * n), round(fractions[2] * n)
    valid = triples[np.sort(order[:n_valid])]
    test = triples[np.sort(order[n_valid : n_valid + n_test])]
    train = triples[np.sort(order[n_valid + n_test :])]
    return ensure_seen(train, valid, test, policy="move")


def holdout_predicate(
    triples: np.ndarray, predicate: str, valid_fraction: float = 0.1, seed: int = 0, test_fraction: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, SplitReport]:
    """Test = ``test_fraction`` of the triples of ``predicate`` (default all of them); valid =
    ``valid_fraction`` of the others; train = the rest.

    Test triples with an entity unseen in train are dropped (moving them would leak the
    held-out predicate into train). The held-out relation itself is exempt from the check:
    with test_fraction 1 it never occurs in train, so a model cannot learn it; a fraction
    below 1 keeps the rest of its edges for training (e.g. 0.2 to predict new 'treats' edges).
    """
    return holdout_relations(triples, (predicate,), valid_fraction, seed, test_fraction)


def holdout_relations(
    triples: np.ndarray, relations: Collection[str], valid_fraction: float = 0.1, seed: int = 0,
    test_fraction: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, SplitReport]:
    """`holdout_predicate` for several relation labels at once (e.g. one predicate folded
    with different qualifiers into ``predicate:3``, ``predicate:7``)."""
    held = _series(triples[:, 1]).is_in(_series(np.asarray(list(relations), dtype=triples.dtype)).implode()).to_numpy()
    problems = []
    if not held.any():
        problems.append(f"{option_name('--holdout-predicate')}: {', '.join(map(repr, relations)) or 'nothing'} is not a relation "
                        "of the triples; use one of the relation labels (or KGX predicates) in the input")
    if not 0 <= valid_fraction < 1:
        problems.append(f"valid fraction: {valid_fraction!r} must be in [0, 1)")
    if not 0 < test_fraction <= 1:
        problems.append(f"holdout fraction: {test_fraction!r} must be in (0, 1]; 1 holds out every edge")
    if problems:
        raise ConfigError(problems)
    rng = np.random.default_rng(seed)
    held_rows = np.flatnonzero(held)
    kept = rng.permutation(len(held_rows))[max(1, round(test_fraction * len(held_rows))):]
    held[held_rows[kept]] = False  # the held-out predicate's edges not in test go back to the pool
    rest = triples[~held]
    order = rng.permutation(len(rest))
    n_valid = round(valid_fraction * len(rest))
    valid, train = rest[np.sort(order[:n_valid])], rest[np.sort(order[n_valid:])]
    return ensure_seen(train, valid, triples[held], policy="drop", exempt_relations=relations)


def ensure_seen(
    train: np.ndarray,
    valid: np.ndarray,
    test: np.ndarray,
    policy: str = "move",
    *,
    exempt_relations: Collection[str] = (),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, SplitReport]:
    """Make every valid/test entity and relation (except ``exempt_relations``) occur in train.

    ``"move"``: offending triples go to train, valid first then test, each in order; a triple
    is moved only if it is still unseen after the earlier moves, so few are moved.
    ``"drop"``: offending triples are removed.
    """
    if policy not in POLICIES:
        raise ConfigError([f"policy: {policy!r} is not one of {', '.join(POLICIES)}"])
    if train.dtype == object:
        entities = pl.concat([_series(train[:, 0]), _series(train[:, 2])]).unique()
        relations = pl.concat([_series(train[:, 1]), _series(np.asarray(list(exempt_relations), dtype=object))]).unique()
        valid_ok, test_ok = (seen_mask(split, entities, relations) for split in (valid, test))
    else:
        valid_ok, test_ok = _seen_codes(train, valid, test, exempt_relations)
    if policy == "drop":
        dropped = int((~valid_ok).sum() + (~test_ok).sum())
        return _result(train, valid[valid_ok], test[test_ok], moved=0, dropped=dropped)
    if valid_ok.all() and test_ok.all():
        return _result(train, valid, test, moved=0, dropped=0)
    return _move_unseen(train, valid, test, valid_ok, test_ok, set(exempt_relations))


def check_fractions(fractions: Sequence[float]) -> list[str]:
    """Problems with train/valid/test ``fractions`` (empty list if fine)."""
    values = list(fractions) if isinstance(fractions, (list, tuple)) else []
    if len(values) != 3 or not all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in values):
        return [f"--fractions: {fractions!r} must be three numbers (train, valid, test), e.g. --fractions 0.8,0.1,0.1"]
    problems = []
    if any(f < 0 for f in values) or values[0] <= 0:
        problems.append(f"{option_name('--fractions')}: {fractions!r} must be non-negative with a positive train fraction")
    if abs(sum(values) - 1) > 1e-6:
        problems.append(f"{option_name('--fractions')}: {fractions!r} sum to {sum(values):g}; make them sum to 1")
    return problems


def seen_mask(triples: np.ndarray, entities: pl.Series, relations: pl.Series) -> np.ndarray:
    """bool [n]: head, tail in ``entities`` and relation in ``relations``."""
    if len(triples) == 0:
        return np.ones(0, dtype=bool)
    return is_in(triples[:, 0], entities) & is_in(triples[:, 1], relations) & is_in(triples[:, 2], entities)


def is_in(values: np.ndarray, pool: pl.Series) -> np.ndarray:
    """bool [n]: whether each of the labels ``values`` [n] is in ``pool``."""
    if not polars_usable():  # a forked child (kgtrace.compute.system.polars_usable): a Python set
        known = set(pool.to_list())
        return np.fromiter((value in known for value in values), dtype=bool, count=len(values))
    return _series(values).is_in(pool.implode()).to_numpy()


def _seen_codes(train: np.ndarray, valid: np.ndarray, test: np.ndarray,
                exempt: Collection[int]) -> tuple[np.ndarray, np.ndarray]:
    """seen_mask of valid and test for integer codes: lookups in boolean tables, no hashing."""
    size = 1 + max((int(split.max()) for split in (train, valid, test) if len(split)), default=0)
    nodes, relations = np.zeros(size, dtype=bool), np.zeros(size, dtype=bool)
    nodes[train[:, 0]] = nodes[train[:, 2]] = True
    relations[train[:, 1]] = True
    relations[np.asarray(list(exempt), dtype=np.int64)] = True
    return tuple(nodes[split[:, 0]] & relations[split[:, 1]] & nodes[split[:, 2]] for split in (valid, test))


def _series(values: np.ndarray) -> pl.Series:
    """Labels (object array of str) or codes (ints) as a polars series."""
    return object_column(values) if values.dtype == object else pl.Series(values=values)


def _move_unseen(
    train: np.ndarray, valid: np.ndarray, test: np.ndarray, valid_ok: np.ndarray, test_ok: np.ndarray,
    exempt: set[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, SplitReport]:
    """Greedy "move": recheck each offending triple against train plus the triples moved so far."""
    entities = set(train[:, 0]) | set(train[:, 2])
    relations = set(train[:, 1]) | exempt
    keep = {"valid": valid_ok.copy(), "test": test_ok.copy()}
    moved_rows = []
    for name, split in (("valid", valid), ("test", test)):
        for i in np.flatnonzero(~keep[name]):
            h, r, t = split[i]
            if h in entities and t in entities and r in relations:
                keep[name][i] = True
                continue
            entities.update((h, t))
            relations.add(r)
            moved_rows.append(split[i])
    moved = np.array(moved_rows, dtype=train.dtype).reshape(-1, 3)
    new_train = np.concatenate([train, moved])
    return _result(new_train, valid[keep["valid"]], test[keep["test"]], moved=len(moved), dropped=0)


def _result(
    train: np.ndarray, valid: np.ndarray, test: np.ndarray, *, moved: int, dropped: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, SplitReport]:
    return train, valid, test, SplitReport(moved, dropped, len(train), len(valid), len(test))
