"""A projected TracIn index: training gradients indexed once on disk, queried many times.

Each training triple's gradient at each checkpoint is projected to ``dim`` numbers by a
random map P with E[<P g, P g'>] = <g, g'> (Johnson-Lindenstrauss), stored as one
memory-mapped ``.npy`` per checkpoint, [n_train, dim]. A query projects its own gradients
with the same P and scores every training triple with one streaming matrix product per
checkpoint: no training gradient is recomputed. Influence is approximate; its error
shrinks as 1/sqrt(dim) (``benchmarks/tracin_index.py`` reports it on the bundled data).

P acts on the factored gradients (:class:`~.factors.Factors`) without forming them:

* dense block g [P]:        g @ G / sqrt(dim),                       G [P, dim] ~ N(0, 1)
* embedding row u at id i:  s(i) * (u @ S) / sqrt(dim),              S [W, dim] ~ N(0, 1), s(i) in {-1, +1}^dim
* outer product delta a^T:  (a @ A) * (delta @ B) / sqrt(dim),       A [F, dim], B [D, dim] ~ N(0, 1)

s(i) is a hash of (id, coordinate, seed), so no [num_entities, dim] table is stored. Each
term is an unbiased estimate of its block's inner products; different blocks' random maps
are independent, so their cross terms vanish in expectation.

Folder layout: ``index.json`` (written last: an index without it is incomplete),
``epoch-NNNN.npy`` per checkpoint, and while building ``progress.json`` with the chunks done,
so that a killed build resumes.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from kgtrace.attribution.factors import Factors
from kgtrace.attribution.topk import RunningTopK
from kgtrace.attribution.tracin import TopK, TracIn
from kgtrace.errors import ConfigError, KgtraceError
from kgtrace.io import atomic_write_text
from kgtrace.run import Run

__all__ = ["IndexMeta", "ProjectedIndex", "Projector", "build_index"]

DTYPES = {"float16": np.float16, "float32": np.float32}
SAVE_EVERY_S = 30.0


class Projector:
    """The random map P of the module doc, drawn from ``seed`` block by block (same seed, same map)."""

    def __init__(self, dim: int, seed: int, device: torch.device | str = "cpu"):
        self.dim, self.seed, self.device = dim, seed, torch.device(device)
        self._maps: dict[tuple, Tensor] = {}

    def _gaussian(self, key: tuple, rows: int) -> Tensor:
        """A [rows, dim] N(0, 1) matrix, fixed by (seed, key)."""
        if (key, rows) not in self._maps:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + _stable_hash(repr(key)))
            self._maps[(key, rows)] = torch.randn(rows, self.dim, generator=generator).to(self.device)
        return self._maps[(key, rows)]

    def signs(self, ids: Tensor, space: str) -> Tensor:
        """Pseudo-random signs [m, dim] in {-1, +1} per id (a murmur3-style integer hash)."""
        salt = (self.seed * 0x9E3779B1 + _stable_hash(space)) & 0x7FFFFFFF
        x = ids.long().unsqueeze(1) * 0x85EBCA6B + torch.arange(self.dim, device=ids.device) * 0xC2B2AE35 + salt
        for multiplier in (0x7FEB352D, 0x846CA68B):
            x = (x ^ (x >> 16)) & 0xFFFFFFFF
            x = (x * multiplier) & 0xFFFFFFFF
        x = x ^ (x >> 16)
        return 1.0 - 2.0 * (x & 1).float()

    def __call__(self, f: Factors) -> Tensor:
        """Projected gradients [n, dim] (float32)."""
        out = torch.zeros(f.n, self.dim, device=self.device)
        if f.dense is not None:
            out += f.dense.float() @ self._gaussian(("dense",), f.dense.shape[1])
        for space, (ids, grads) in f.rows.items():
            s = self._gaussian(("rows", space), grads.shape[2])
            for slot in range(ids.shape[1]):
                out += self.signs(ids[:, slot], space) * (grads[:, slot].float() @ s)
        for number, o in enumerate(f.outer):
            a = o.a.float() @ self._gaussian(("outer-a", number), o.a.shape[1])  # [U, dim]
            out += a[o.index] * (o.delta.float() @ self._gaussian(("outer-delta", number), o.delta.shape[1]))
        return out / math.sqrt(self.dim)


def _stable_hash(text: str) -> int:
    """A 31-bit hash of ``text`` that, unlike hash(), is the same in every process."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


@dataclass
class IndexMeta:
    """What an index was built from; a query must match it."""

    run: str
    params: list[str]
    path: str
    checkpoints: list[dict]  # [{"epoch", "lr"}], oldest first
    num_train: int
    dim: int
    seed: int
    dtype: str
    train_digest: str
    seconds: float = 0.0


def _train_digest(tracin: TracIn) -> str:
    return hashlib.sha256(tracin.train.cpu().numpy().tobytes()).hexdigest()


def build_index(run: Run, folder: str | Path, params: str | list[str] = "last", dim: int = 1024, seed: int = 0,
                dtype: str = "float16", device: str | torch.device = "cpu", progress: bool = False,
                chunk_size: int | None = None) -> "ProjectedIndex":
    """Project every training triple's gradient at every checkpoint into ``folder``; resumable.

    An existing complete index in ``folder`` is refused (delete it to rebuild); an
    incomplete one of the same settings is continued.
    """
    problems = []
    if not isinstance(dim, int) or dim < 1:
        problems.append(f"dim={dim!r}: must be a positive integer, e.g. 1024")
    if dtype not in DTYPES:
        problems.append(f"dtype={dtype!r}: use one of {sorted(DTYPES)}")
    if problems:
        raise ConfigError(problems)
    folder = Path(folder)
    if (folder / "index.json").exists():
        raise KgtraceError(f"{folder}: already holds a complete index. Fix: query it, or delete the folder to rebuild")
    tracin = TracIn(run, params=params, device=device, chunk_size=chunk_size)
    meta = IndexMeta(str(run.path), tracin.names, tracin.path, [{"epoch": c.epoch, "lr": c.lr} for c in tracin.checkpoints],
                     len(tracin.train), dim, seed, dtype, _train_digest(tracin))
    start = time.perf_counter()
    _fill(tracin, folder, meta, progress)
    meta.seconds = time.perf_counter() - start
    atomic_write_text(folder / "index.json", json.dumps(asdict(meta), indent=2) + "\n")
    (folder / "progress.json").unlink(missing_ok=True)
    return ProjectedIndex(folder, run, device=device)


def _fill(tracin: TracIn, folder: Path, meta: IndexMeta, progress: bool) -> None:
    """Write the projected gradients chunk by chunk, recording progress so that a kill loses little."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in asdict(meta).items() if k != "seconds"}
    record = folder / "progress.json"
    done = json.loads(record.read_text()) if record.exists() else {}
    if done.get("settings") != settings:
        done = {"settings": settings, "chunks": {}}
    projector = Projector(meta.dim, meta.seed, tracin.device)
    chunks = tracin._chunks()
    models = tracin._checkpoint_models()
    saved_at = time.monotonic()
    bar = tqdm(total=len(models) * len(chunks), desc="TracIn index", unit="chunk", disable=not progress)
    with bar, torch.no_grad():
        for info, model in zip(tracin.checkpoints, models):
            path = folder / f"epoch-{info.epoch:04d}.npy"
            first = int(done["chunks"].get(str(info.epoch), 0))
            mode = "r+" if first and path.exists() else "w+"
            first = first if mode == "r+" else 0
            rows = np.lib.format.open_memmap(path, mode=mode, dtype=DTYPES[meta.dtype], shape=(meta.num_train, meta.dim))
            bar.update(first)
            for number in range(first, len(chunks)):
                positions = chunks[number]
                projected = projector(tracin._factorise(model, tracin.train[positions]))
                rows[positions.cpu().numpy()] = projected.cpu().numpy().astype(DTYPES[meta.dtype])
                bar.update(1)
                if time.monotonic() - saved_at >= SAVE_EVERY_S or number == len(chunks) - 1:
                    rows.flush()
                    done["chunks"][str(info.epoch)] = number + 1
                    atomic_write_text(record, json.dumps(done) + "\n")
                    saved_at = time.monotonic()
            del rows


class ProjectedIndex:
    """A built index over a run's training triples; answers influence queries approximately.

    run: the run it was built from (its checkpoints must still be there: query gradients
    are taken at them).
    """

    def __init__(self, folder: str | Path, run: Run, device: str | torch.device = "cpu", chunk_size: int = 65536):
        self.folder = Path(folder)
        if not (self.folder / "index.json").is_file():
            raise KgtraceError(f"{self.folder}: not a complete TracIn index (no index.json). "
                               "Fix: build it with kgtrace index RUN_DIR --out FOLDER (a killed build resumes)")
        self.meta = IndexMeta(**json.loads((self.folder / "index.json").read_text()))
        epochs = [c["epoch"] for c in self.meta.checkpoints]
        self.tracin = TracIn(run, params=self.meta.params, checkpoints=epochs, device=device, path=self.meta.path)
        lrs = [c.lr for c in self.tracin.checkpoints]
        if lrs != [c["lr"] for c in self.meta.checkpoints] or _train_digest(self.tracin) != self.meta.train_digest:
            raise KgtraceError(f"{self.folder}: built from other checkpoints or training triples than run "
                               f"{run.path}. Fix: rebuild the index for this run")
        self.projector = Projector(self.meta.dim, self.meta.seed, self.tracin.device)
        self.chunk_size = chunk_size
        self.rows = [np.load(self.folder / f"epoch-{e:04d}.npy", mmap_mode="r") for e in epochs]

    def _parts(self, test: Tensor):
        """(positions [c], lr-weighted parts [C, n_test, c]) chunk by chunk over the memory-mapped rows."""
        test = self.tracin._check_test(test)
        with torch.no_grad():
            queries = [self.projector(self.tracin._factorise(m, test)) for m in self.tracin._checkpoint_models()]
        lrs = [c["lr"] for c in self.meta.checkpoints]
        for start in range(0, self.meta.num_train, self.chunk_size):
            stop = min(start + self.chunk_size, self.meta.num_train)
            parts = [lr * (q @ torch.from_numpy(np.array(rows[start:stop], dtype=np.float32)).to(q.device).T)
                     for q, rows, lr in zip(queries, self.rows, lrs)]
            yield torch.arange(start, stop, device=test.device), torch.stack(parts)

    def influence(self, test: Tensor) -> Tensor:
        """Approximate influence [n_test, n_train] (float32)."""
        pieces = [parts.double().sum(0) for _, parts in self._parts(test)]
        return torch.cat(pieces, dim=1).float().cpu()

    def top_k(self, test: Tensor, k: int = 10) -> list[TopK]:
        """Approximate strongest proponents and opponents per test triple, as :meth:`TracIn.top_k`."""
        test = self.tracin._check_test(test)
        k = min(int(k), self.meta.num_train)
        best = RunningTopK(len(test), k, len(self.rows), largest=True, device=test.device)
        worst = RunningTopK(len(test), k, len(self.rows), largest=False, device=test.device)
        for positions, parts in self._parts(test):
            best.update(parts, positions)
            worst.update(parts, positions)
        index = self.tracin.train_indices
        return [TopK(test[i].cpu(), index[best.columns[i].cpu()], best.values[i].float().cpu(), best.parts[i].cpu(),
                     index[worst.columns[i].cpu()], worst.values[i].float().cpu(), worst.parts[i].cpu())
                for i in range(len(test))]
