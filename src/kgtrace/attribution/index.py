"""A projected TracIn index: training gradients indexed once on disk, queried many times.

Each training triple's gradient at each checkpoint is stored in factored form
(`Factors`), with the one block that is too large to store, a linear
layer's weight gradient delta a^T (ConvE's fc: 2M numbers), randomly projected:
a -> a @ A with A [F, dim] ~ N(0, 1/dim), i.e. the gradient is mapped by (A^T (x) I_D), a
Johnson-Lindenstrauss map with E[<P g, P g'>] = <g, g'>, kept as its two factors (dim + D
numbers instead of F * D). Every other block (delta itself, biases, batch norm, the
convolution, embedding rows with their ids) is small or sparse and stored exactly (a layer
bias that rides in its outer factor, `Outer`, as a column of ones after
a A), so the only error is that of the estimate <a A, a' A> of <a, a'>; it shrinks as 1/sqrt(dim)
(``benchmarks/tracin_index.py`` reports it on the bundled data). Paths without such a
layer (DistMult, ComplEx: embedding rows only) are stored exactly.

A query factors its own gradients at each checkpoint, projects them with the same A, and
scores every stored training gradient with the same inner products as exact TracIn
(`dot`), streaming over memory-mapped ``.npy`` files: no training gradient
is recomputed.

Folder layout: ``index.json`` (written last: an index without it is incomplete), one
folder ``epoch-NNNN/`` per checkpoint holding ``dense.npy`` [n, P], ``rows-SPACE-ids.npy``
[n, S] and ``rows-SPACE-grads.npy`` [n, S, W], ``outer-K-a.npy`` [n, dim] (dim + 1 with the layer's
bias) and ``outer-K-delta.npy`` [n, D]; while building, ``progress.json`` with the chunks done, so
that a killed build resumes.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from kgtrace.attribution.factors import Factors, Outer, dot
from kgtrace.attribution.topk import RunningTopK, TopK, top_k_results
from kgtrace.attribution.tracin import TracIn
from kgtrace.compute.system import bar_disable
from kgtrace.core.errors import ConfigError, KgtraceError, option_name
from kgtrace.core.io import atomic_write_text, record_written
from kgtrace.core.owned import KINDS, contents, folder_lock, read_mark, write_mark
from kgtrace.data.pinned import split_digest
from kgtrace.runs.embedding import Run

__all__ = ["IndexMeta", "ProjectedIndex", "Projector", "build_index"]

DTYPES = {"float16": np.float16, "float32": np.float32}
SAVE_EVERY_S = 30.0
#: The stored layout's version, in ``index.json``. 2: a layer's bias rides in its outer factor (was in ``dense``).
LAYOUT = 2
INDEX_KIND = "tracin-index"  # the marker kind of an index folder (kgtrace.core.owned)


class Projector:
    """Projects the linear-layer inputs of `Factors` to ``dim`` numbers; same seed, same map."""

    def __init__(self, dim: int, seed: int, device: torch.device | str = "cpu"):
        self.dim, self.seed, self.device = dim, seed, torch.device(device)
        self._maps: dict[tuple[int, int], Tensor] = {}

    def _map(self, layer: int, width: int) -> Tensor:
        """A [width, dim] N(0, 1/dim) matrix, fixed by (seed, layer, width)."""
        if (layer, width) not in self._maps:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + layer * 7919 + width)
            self._maps[(layer, width)] = (torch.randn(width, self.dim, generator=generator)
                                          / math.sqrt(self.dim)).to(self.device)
        return self._maps[(layer, width)]

    def __call__(self, f: Factors) -> Factors:
        """The same gradients with each outer block's a projected, one row per triple ([n, dim]).

        A block's input in several parts is projected part by part with the rows of one map for the
        whole input, so the result does not depend on how the input was split. A layer's bias stays
        exact: its column of ones is appended after the projection ([n, dim + 1]).
        """
        outer = []
        for k, o in enumerate(f.outer):
            full = self._map(k, sum(p.a.shape[1] for p in o.parts))  # [F, dim]
            projected = sum((p.a.float() @ (full if p.columns is None else full[p.columns]))[p.index]
                            for p in o.parts)  # [n, dim]
            if o.bias:
                projected = torch.cat([projected, projected.new_ones(f.n, 1)], dim=1)  # [n, dim + 1]
            outer.append(Outer.whole(projected, torch.arange(f.n, device=o.delta.device), o.delta))
        return Factors(f.n, f.dense, f.rows, outer)


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
    layout: int = 1  # absent in index.json: built before layout 2


def _train_digest(tracin: TracIn) -> str:
    return split_digest(tracin.train)


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
    _check_index_folder(folder)
    tracin = TracIn(run, params=params, device=device, chunk_size=chunk_size)
    meta = IndexMeta(str(run.path), tracin.names, tracin.path, [{"epoch": c.epoch, "lr": c.lr} for c in tracin.checkpoints],
                     len(tracin.train), dim, seed, dtype, _train_digest(tracin), layout=LAYOUT)
    folder.mkdir(parents=True, exist_ok=True)
    with folder_lock(folder, "index folder"):  # one builder at a time; a second is refused, naming the first
        _check_index_folder(folder)
        if read_mark(folder) is None:
            write_mark(folder, INDEX_KIND)
        start = time.perf_counter()
        _fill(tracin, folder, meta, progress)
        meta.seconds = time.perf_counter() - start
        atomic_write_text(folder / "index.json", json.dumps(asdict(meta), indent=2) + "\n")
        (folder / "progress.json").unlink(missing_ok=True)
    return ProjectedIndex(folder, run, device=device)


def _check_index_folder(folder: Path) -> None:
    """Refuse a folder that holds a complete index, or files that are not an index kgtrace was building there."""
    if (folder / "index.json").exists():
        raise KgtraceError(f"{folder}: already holds a complete index. Fix: query it, or delete the folder to rebuild")
    existing = contents(folder)
    mark = read_mark(folder)
    if existing and (mark is None or mark.kind != INDEX_KIND):
        what = "was not written by kgtrace" if mark is None else f"is {KINDS.get(mark.kind, mark.kind)}"
        listing = ", ".join(existing[:5]) + (f" and {len(existing) - 5} more" if len(existing) > 5 else "")
        raise KgtraceError(f"{option_name('--out')} {folder}: the folder {what} and holds {listing}; an index is "
                           "built only in a new "
                           "folder or one where kgtrace was building an index. Nothing was changed. Fix: choose "
                           "another --out")


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
    bar = tqdm(total=len(models) * len(chunks), desc="TracIn index", unit="chunk", disable=bar_disable(progress))
    with bar, torch.no_grad():
        for info, model in zip(tracin.checkpoints, models):
            first = int(done["chunks"].get(str(info.epoch), 0))
            store = _Store(folder / f"epoch-{info.epoch:04d}", meta.num_train, DTYPES[meta.dtype], resume=first > 0)
            bar.update(first)
            for number in range(first, len(chunks)):
                positions = chunks[number]
                store.write(positions.cpu().numpy(), projector(tracin._factorise(model, tracin.train[positions])))
                bar.update(1)
                if time.monotonic() - saved_at >= SAVE_EVERY_S or number == len(chunks) - 1:
                    store.flush()
                    done["chunks"][str(info.epoch)] = number + 1
                    atomic_write_text(record, json.dumps(done) + "\n")
                    saved_at = time.monotonic()


class _Store:
    """One checkpoint's stored factors: one memory-mapped .npy per block, [num_train, ...]."""

    def __init__(self, folder: Path, num_train: int, dtype: type, resume: bool = False):
        self.folder, self.num_train, self.dtype, self.resume = folder, num_train, dtype, resume
        self.arrays: dict[str, np.ndarray] = {}
        folder.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _blocks(f: Factors) -> dict[str, Tensor]:
        """Factors as named per-triple arrays (outer blocks must be per triple, as Projector returns them)."""
        blocks = {} if f.dense is None else {"dense": f.dense}
        for space, (ids, grads) in f.rows.items():
            blocks[f"rows-{space}-ids"], blocks[f"rows-{space}-grads"] = ids, grads
        for k, o in enumerate(f.outer):
            (part,) = o.parts  # one per-triple part, as Projector returns it
            blocks[f"outer-{k}-a"], blocks[f"outer-{k}-delta"] = part.a, o.delta
        return blocks

    def write(self, positions: np.ndarray, f: Factors) -> None:
        for name, block in self._blocks(f).items():
            if name not in self.arrays:
                dtype = np.int64 if name.endswith("-ids") else self.dtype
                self.arrays[name] = np.lib.format.open_memmap(
                    self.folder / f"{name}.npy", mode="r+" if self.resume else "w+", dtype=dtype,
                    shape=(self.num_train, *block.shape[1:]))
                record_written(self.folder / f"{name}.npy")
            self.arrays[name][positions] = block.float().cpu().numpy() if block.is_floating_point() else block.cpu().numpy()

    def flush(self) -> None:
        for array in self.arrays.values():
            array.flush()

    @staticmethod
    def read(folder: Path, start: int, stop: int, device: torch.device) -> Factors:
        """Rows start..stop-1 of a stored checkpoint as float32 Factors."""
        def load(name: str) -> Tensor:
            array = np.load(folder / f"{name}.npy", mmap_mode="r")[start:stop]
            return torch.from_numpy(np.array(array, dtype=np.int64 if name.endswith("-ids") else np.float32)).to(device)

        names = {p.stem for p in folder.glob("*.npy")}
        spaces = sorted(n[len("rows-"):-len("-ids")] for n in names if n.startswith("rows-") and n.endswith("-ids"))
        layers = sorted(int(n.split("-")[1]) for n in names if n.startswith("outer-") and n.endswith("-a"))
        n = stop - start
        index = torch.arange(n, device=device)
        return Factors(n, load("dense") if "dense" in names else None,
                       {s: (load(f"rows-{s}-ids"), load(f"rows-{s}-grads")) for s in spaces},
                       [Outer.whole(load(f"outer-{k}-a"), index, load(f"outer-{k}-delta")) for k in layers])


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
        if self.meta.layout != LAYOUT:
            raise KgtraceError(f"{self.folder}: built by an earlier kgtrace, whose stored layout ({self.meta.layout}) "
                               f"this one cannot read ({LAYOUT}). Fix: delete the folder and build it again with "
                               f"kgtrace index RUN_DIR --out FOLDER")
        epochs = [c["epoch"] for c in self.meta.checkpoints]
        self.tracin = TracIn(run, params=self.meta.params, checkpoints=epochs, device=device, path=self.meta.path)
        lrs = [c.lr for c in self.tracin.checkpoints]
        if lrs != [c["lr"] for c in self.meta.checkpoints] or _train_digest(self.tracin) != self.meta.train_digest:
            raise KgtraceError(f"{self.folder}: built from other checkpoints or training triples than run "
                               f"{run.path}. Fix: rebuild the index for this run")
        self.projector = Projector(self.meta.dim, self.meta.seed, self.tracin.device)
        self.chunk_size = chunk_size
        self.epochs = epochs

    def _parts(self, test: Tensor):
        """(positions [c], lr-weighted parts [C, n_test, c]) chunk by chunk over the memory-mapped factors."""
        test = self.tracin._check_test(test)
        with torch.no_grad():
            queries = [self.projector(self.tracin._factorise(m, test)) for m in self.tracin._checkpoint_models()]
            lrs = [c["lr"] for c in self.meta.checkpoints]
            for start in range(0, self.meta.num_train, self.chunk_size):
                stop = min(start + self.chunk_size, self.meta.num_train)
                parts = [lr * dot(q, _Store.read(self.folder / f"epoch-{e:04d}", start, stop, test.device))
                         for q, e, lr in zip(queries, self.epochs, lrs)]
                yield torch.arange(start, stop, device=test.device), torch.stack(parts)

    def influence(self, test: Tensor) -> Tensor:
        """Approximate influence [n_test, n_train] (float32)."""
        pieces = [parts.double().sum(0) for _, parts in self._parts(test)]
        return torch.cat(pieces, dim=1).float().cpu()

    def top_k(self, test: Tensor, k: int = 10) -> list[TopK]:
        """Approximate strongest proponents and opponents per test triple, as `TracIn.top_k`."""
        test = self.tracin._check_test(test)
        k = min(int(k), self.meta.num_train)
        best = RunningTopK(len(test), k, len(self.epochs), largest=True, device=test.device)
        worst = RunningTopK(len(test), k, len(self.epochs), largest=False, device=test.device)
        for positions, parts in self._parts(test):
            best.update(parts, positions)
            worst.update(parts, positions)
        return top_k_results(test, self.tracin.train_indices, best, worst)
