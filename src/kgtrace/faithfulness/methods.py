"""Removal methods: for each prediction, the training triples to take away, most important first.

Each method maps (run, predictions [N, 3], k, seed) to one LongTensor per prediction of at
most k indices into ``run.dataset.train``, in removal order; removing "the top k" for a
smaller k takes the first k of that list, so the removed sets are nested across k.

* ``tracin-last`` / ``tracin-all``: the k strongest TracIn proponents (largest influence
  first, ties to the lower index) with the model's last-layer parameters or all of them
  (``kgtrace explain --params``), summed over every epoch checkpoint of the run.
* ``random``: k training triples drawn uniformly without replacement; the draw is seeded by
  (seed, h, r, t), so a prediction gets the same draw whatever else is explained with it.
* ``neighbourhood``: GradRollback's baseline (NH, Lawrence et al. 2021): k training triples
  that share an entity with the prediction (h or t as head or tail). All such neighbours are
  equally eligible; they are picked uniformly at random without replacement, seeded by
  (seed, h, r, t) as ``random`` is (GradRollback's code picks with ``np.random.choice``
  too). A prediction with fewer than k neighbours loses all of them. (GradRollback's code
  also counts triples that merely share the relation r; the issue asks for shared entities.)

The proof method (the facts of a prover's proof) needs a prover run and is not here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from torch import Tensor

from kgtrace.run import Run

__all__ = ["METHODS", "Method"]

Method = Callable[[Run, Tensor, int, int, bool], list[Tensor]]


def tracin_last(run: Run, predictions: Tensor, k: int, seed: int, progress: bool = False) -> list[Tensor]:
    return _tracin(run, predictions, k, "last", progress)


def tracin_all(run: Run, predictions: Tensor, k: int, seed: int, progress: bool = False) -> list[Tensor]:
    return _tracin(run, predictions, k, "all", progress)


def _tracin(run: Run, predictions: Tensor, k: int, params: str, progress: bool) -> list[Tensor]:
    from kgtrace.attribution import TracIn

    found = TracIn(run, params=params).top_k(predictions, k, progress=progress)
    return [item.proponents.clone() for item in found]


def random_triples(run: Run, predictions: Tensor, k: int, seed: int, progress: bool = False) -> list[Tensor]:
    n = len(run.dataset.train)
    return [torch.randperm(n, generator=_generator(seed, "random", triple))[:k] for triple in predictions]


def neighbourhood(run: Run, predictions: Tensor, k: int, seed: int, progress: bool = False) -> list[Tensor]:
    train = run.dataset.train
    chosen = []
    for triple in predictions:
        ends = triple[[0, 2]]  # [2] the prediction's head and tail
        shares = torch.isin(train[:, 0], ends) | torch.isin(train[:, 2], ends)  # [n_train]
        candidates = torch.nonzero(shares).flatten()
        order = torch.randperm(len(candidates), generator=_generator(seed, "neighbourhood", triple))
        chosen.append(candidates[order[:k]])
    return chosen


def _generator(seed: int, salt: str, triple: Tensor) -> torch.Generator:
    """A generator seeded by (seed, salt, h, r, t): the same prediction gets the same draw in any company."""
    text = f"{seed}/{salt}/{'/'.join(str(int(x)) for x in triple)}"
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1)


#: Removal methods by name (module doc).
METHODS: dict[str, Method] = {
    "tracin-last": tracin_last,
    "tracin-all": tracin_all,
    "random": random_triples,
    "neighbourhood": neighbourhood,
}
