"""Hyperparameter checks shared by the models.

Each check appends a problem line (key, value, fix) to ``problems`` instead of raising, so
a constructor can report every bad setting in one `ConfigError`.
"""

from __future__ import annotations

import math


def is_int(value: object) -> bool:
    """True for real integers; bool is excluded because ``True`` as a size is a typo."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(problems: list[str], key: str, value: object) -> bool:
    """Require an integer >= 1; return whether the value passed (for dependent checks)."""
    if is_int(value) and value >= 1:
        return True
    problems.append(f"{key}={value!r}: must be an integer >= 1; fix: set {key} to a positive integer")
    return False


def check_dropout(problems: list[str], key: str, value: object) -> None:
    """Require a probability in [0, 1): a rate of 1 would zero every activation."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < 1.0
    if not ok or (isinstance(value, float) and math.isnan(value)):
        problems.append(f"{key}={value!r}: must be a number in [0, 1); fix: set {key} to e.g. 0.2")


def check_bool(problems: list[str], key: str, value: object) -> None:
    """Require a real bool, so that a string like "false" is not silently truthy."""
    if not isinstance(value, bool):
        problems.append(f"{key}={value!r}: must be true or false; fix: set {key} to true or false")


#: The largest embedding width a model takes: far past any published setting (ConvE 200, TuckER 200, RotatE 1,000),
#: and small enough that a typo (1e15) is refused at once rather than failing to allocate.
MAX_EMBEDDING_DIM = 1 << 16


def check_sizes(problems: list[str], num_entities: object, num_relations: object, embedding_dim: object) -> bool:
    """Check the sizes every model takes; return whether embedding_dim passed."""
    check_positive_int(problems, "num_entities", num_entities)
    check_positive_int(problems, "num_relations", num_relations)
    if not check_positive_int(problems, "embedding_dim", embedding_dim):
        return False
    if embedding_dim > MAX_EMBEDDING_DIM:
        problems.append(f"embedding_dim={embedding_dim}: at most {MAX_EMBEDDING_DIM:,}; fix: set embedding_dim to a "
                        "width such as 200")
        return False
    return True
