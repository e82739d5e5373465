"""The dataset registry: every dataset kgtrace knows by name, one entry each.

Bundled datasets ship inside the package and load offline. Remote ones are fetched on first use,
as PyKEEN does: the archive is downloaded from its public source into a cache (pystow's folder for
``kgtrace``: ``~/.data/kgtrace/datasets/NAME``, moved by ``KGTRACE_HOME`` or ``PYSTOW_HOME``),
its sha256 is checked, the three splits are unpacked beside it, and later uses read the cache.

A machine without internet points the registry at a mirror with ``KGTRACE_DATASETS_MIRROR``: a
folder, or a ``file://`` or ``https://`` URL, holding the archives under their own file names
(``FB15k-237.tar.gz``). The mirror replaces the download; the checksum is checked all the same.

Adding a dataset is one `DatasetEntry` in `DATASETS`: where its archive is, its
sha256, which archive member holds which split, and its licence and citation. A graph published
without splits (Hetionet: a nodes file and an edges file) names both files in a `GraphFiles`;
kgtrace splits it on first use with a fixed seed, and writes node names, kinds and relation
descriptions beside the splits.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import zipfile
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pystow
from filelock import FileLock, Timeout

from kgtrace.core.errors import KgtraceError
from kgtrace.core.io import atomic_open, atomic_write_text
from kgtrace.core.owned import file_digest, read_mark, write_mark
from kgtrace.core.specs import spelling_key
from kgtrace.data.kgx import read_kgx
from kgtrace.data.names import write_categories, write_edge_map, write_names
from kgtrace.data.splits import random_split
from kgtrace.data.triples import write_labeled_triples

MIRROR_ENV = "KGTRACE_DATASETS_MIRROR"
SPLITS = ("train", "valid", "test")
UNPACKED = "unpacked.sha256"  # written last into the cache folder: the archive's sha256 the splits came from
FETCH_WAIT_S = 600  # a second process fetching the same dataset waits this long for the first


@dataclass(frozen=True)
class GraphFiles:
    """A graph published as a nodes file and an edges file (Hetionet's tabular format, or KGX), without splits.

    The entry's ``url``/``sha256`` are the edges file's; the nodes file is named here. On first
    use the edges are split at random by ``fractions`` (train, valid, test) from ``seed``, as
    PyKEEN splits such graphs; valid/test triples whose entity would be unseen in train move to train.
    """

    nodes_url: str
    nodes_sha256: str
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    seed: int = 0

    @property
    def nodes_file(self) -> str:
        return self.nodes_url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset the registry knows: where it comes from and what it holds.

    ``url`` and ``sha256`` are None for a bundled dataset. ``members`` maps each split to its
    file inside the archive; a graph kgtrace splits itself has ``graph`` instead. ``counts`` are
    the sizes as published (entities, relations, and triples per split; for a graph, those of
    kgtrace's split), shown by ``kgtrace datasets``.
    """

    name: str
    title: str
    description: str
    licence: str
    citation: str
    counts: Mapping[str, int]
    url: str | None = None
    sha256: str | None = None
    members: Mapping[str, str] = field(default_factory=dict)
    graph: GraphFiles | None = None

    @property
    def bundled(self) -> bool:
        return self.url is None

    @property
    def archive(self) -> str:
        """The archive's file name, as the source and a mirror call it."""
        assert self.url is not None, f"{self.name} is bundled"
        return self.url.rsplit("/", 1)[-1]


def _counts(entities: int, relations: int, train: int, valid: int, test: int) -> dict[str, int]:
    return {"entities": entities, "relations": relations, "train": train, "valid": valid, "test": test}


_KOK = "Kok & Domingos 2007, Statistical Predicate Invention (ICML)"
_DETTMERS = "Dettmers et al. 2018, Convolutional 2D Knowledge Graph Embeddings (AAAI)"
_CONVE_REPO = "https://github.com/TimDettmers/ConvE/raw/master"  # the sha256 pins the content
_HETIONET = "hetio/hetionet/raw/main/hetnet/tsv"  # GitHub serves the edge file from large-file storage

DATASETS: dict[str, DatasetEntry] = {e.name: e for e in (
    DatasetEntry("umls", "UMLS", "semantic types of the Unified Medical Language System and their relations",
                 "public research data", _KOK, _counts(135, 46, 5216, 652, 661)),
    DatasetEntry("kinships", "Kinships", "kinship terms of the Alyawarra, between 104 people",
                 "public research data", "Kemp et al. 2006, Learning Systems of Concepts with an Infinite "
                 "Relational Model (AAAI)", _counts(104, 25, 8544, 1068, 1074)),
    DatasetEntry("nations", "Nations", "relations between 14 countries (treaties, trade, conflict)",
                 "public research data", _KOK, _counts(14, 55, 1592, 199, 201)),
    DatasetEntry("fb15k237", "FB15k-237", "Freebase subset without inverse-relation leakage (Toutanova & Chen 2015)",
                 "CC-BY 2.5 (Freebase)", _DETTMERS, _counts(14505, 237, 272115, 17535, 20466),
                 url=f"{_CONVE_REPO}/FB15k-237.tar.gz",
                 sha256="311df7930f842a02979eaa7a802484a6afe62303c07f915f1e6edbc30cbe05e8",
                 members={split: f"{split}.txt" for split in SPLITS}),
    DatasetEntry("wn18rr", "WN18RR", "WordNet subset without inverse-relation leakage",
                 "WordNet licence (Princeton)", _DETTMERS, _counts(40559, 11, 86835, 3034, 3134),
                 url=f"{_CONVE_REPO}/WN18RR.tar.gz",
                 sha256="1eb9152f804c140d163462c0d49f65e5a0b30ab5fbb375c5e3353c11a6249060",
                 members={split: f"{split}.txt" for split in SPLITS}),
    DatasetEntry("hetionet", "Hetionet", "biomedical graph of compounds, diseases, genes and 8 other kinds, 24 edge "
                 "types (v1.0); split at random 80/10/10 with seed 0", "CC0 1.0 (the compiled network)",
                 "Himmelstein et al. 2017, Systematic integration of biomedical knowledge prioritizes drugs for "
                 "repurposing (eLife)", _counts(45158, 24, 1800157, 225020, 225020),
                 url=f"https://github.com/{_HETIONET}/hetionet-v1.0-edges.sif.gz",
                 sha256="611f0411ac666be4e0270e54bbca67407e14720bfc3099311f0f5eec25c5a947",
                 graph=GraphFiles(f"https://github.com/{_HETIONET}/hetionet-v1.0-nodes.tsv",
                                  "3ad9eb86c031df8bc7d5efefa6edc93562182eb9a6a71e5129d3f18b9d42c50e")),
)}

BUNDLED = tuple(name for name, e in DATASETS.items() if e.bundled)


def registered_name(text: str) -> str | None:
    """The registered dataset ``text`` names in another spelling (PyKEEN's "FB15k-237", "UMLS", "WN18RR"): case,
    dashes and underscores aside; None when it names none."""
    return next((name for name in DATASETS if spelling_key(name) == spelling_key(text)), None)


def cache_folder(name: str) -> Path:
    """The folder a remote dataset is unpacked into (not created)."""
    return pystow.module("kgtrace").base / "datasets" / name


def cached(name: str) -> Path | None:
    """The unpacked folder of a remote dataset if it is complete in the cache, else None."""
    entry = DATASETS[name]
    folder = cache_folder(name)
    stamp = folder / UNPACKED
    return folder if stamp.is_file() and stamp.read_text().strip() == entry.sha256 else None


def fetch(name: str) -> Path:
    """The folder holding a remote dataset's train/valid/test, downloading and unpacking it if needed.

    Safe to call from several processes at once: one fetches, the others wait for it (a lock in
    the cache folder). A wrong checksum deletes the downloaded file (kgtrace wrote it) and raises.
    """
    entry = DATASETS[name]
    if entry.bundled:
        raise KgtraceError(f"{name} is bundled with kgtrace: it needs no fetching")
    done = cached(name)
    if done is not None:
        return done
    folder = cache_folder(name)
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / ".fetch.lock", timeout=FETCH_WAIT_S)
    try:
        with lock:
            if cached(name) is None:  # another process may have finished while this one waited
                _fetch_locked(entry, folder)
    except Timeout:
        raise KgtraceError(f"{folder}: another process has been fetching {name} for {FETCH_WAIT_S} s. "
                           f"Fix: wait for it, or remove {folder} if no kgtrace process is running") from None
    return folder


def _fetch_locked(entry: DatasetEntry, folder: Path) -> None:
    if read_mark(folder) is None:
        write_mark(folder, "dataset")
    for file, (_, sha256) in remote_files(entry).items():
        if not ((folder / file).is_file() and file_digest(folder / file) == sha256):
            _download(entry, file, folder / file)
    (folder / UNPACKED).unlink(missing_ok=True)
    if entry.graph is None:
        _unpack(entry, folder / entry.archive, folder)
    else:
        _split_graph(entry.graph, folder / entry.graph.nodes_file, folder / entry.archive, folder)
    atomic_write_text(folder / UNPACKED, f"{entry.sha256}\n")  # last: the folder is complete


def remote_files(entry: DatasetEntry) -> dict[str, tuple[str, str]]:
    """File name -> (public URL, sha256) of every file a remote dataset downloads."""
    assert entry.url is not None and entry.sha256 is not None, f"{entry.name} is bundled"
    files = {entry.archive: (entry.url, entry.sha256)}
    if entry.graph is not None:
        files[entry.graph.nodes_file] = (entry.graph.nodes_url, entry.graph.nodes_sha256)
    return files


def source_url(entry: DatasetEntry, file: str | None = None) -> str:
    """Where ``file`` (default: the archive) is read from: the mirror named by ``KGTRACE_DATASETS_MIRROR``, else
    its public URL."""
    file = file or entry.archive
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    if not mirror:
        return remote_files(entry)[file][0]
    if "://" in mirror:
        return f"{mirror.rstrip('/')}/{file}"
    return Path(mirror, file).resolve().as_uri()


def _download(entry: DatasetEntry, file: str, target: Path) -> None:
    """Download (or copy from the mirror) ``entry``'s ``file`` to ``target``, checked against its sha256."""
    url = source_url(entry, file)
    expected = remote_files(entry)[file][1]
    part = target.with_name(f"{target.name}.part")
    try:
        pystow.utils.download(url, part, force=True, progress_bar=False)
    except Exception as e:  # urllib and requests raise many kinds; the user needs the URL and the cause
        part.unlink(missing_ok=True)
        raise KgtraceError(
            f"{entry.name}: could not download {url} ({type(e).__name__}: {e}). Fix: check the network, or on a "
            f"machine without internet set {MIRROR_ENV} to a folder holding {file}") from None
    actual = file_digest(part)
    if actual != expected:
        part.unlink()  # kgtrace wrote it, and it is not the file the registry knows
        raise KgtraceError(
            f"{entry.name}: {url} has sha256 {actual}, but the registry expects {expected}: it is not the "
            f"file kgtrace knows (a changed upload, a wrong file in the mirror, or a broken download). Fix: put "
            f"the original {file} there, or load your copy as a folder (kgtrace train --dataset FOLDER)")
    part.replace(target)


def _split_graph(graph: GraphFiles, nodes: Path, edges: Path, folder: Path) -> None:
    """Split a graph's edges into ``folder/SPLIT.txt`` and write its node names, kinds and relation descriptions."""
    cut = read_kgx(nodes, edges)
    train, valid, test, _ = random_split(cut.triples, graph.fractions, graph.seed)
    for split, triples in zip(SPLITS, (train, valid, test)):
        write_labeled_triples(triples, folder / f"{split}.txt")
    write_names(cut.names, folder / "node_names.txt")
    write_categories(cut.categories, folder / "node_categories.tsv")
    write_edge_map(cut.edge_map, folder / "edge_map.json")


def _unpack(entry: DatasetEntry, archive: Path, folder: Path) -> None:
    """Write each split's member of ``archive`` to ``folder/SPLIT.txt`` (atomically; nothing else is extracted)."""
    with ExitStack() as stack:
        if zipfile.is_zipfile(archive):
            bundle = stack.enter_context(zipfile.ZipFile(archive))
            names = {name: name for name in bundle.namelist() if not name.endswith("/")}
            open_member = bundle.open
        else:
            bundle = stack.enter_context(tarfile.open(archive))
            names = {info.name.removeprefix("./"): info for info in bundle.getmembers() if info.isfile()}
            open_member = bundle.extractfile
        for split, member in entry.members.items():
            with open_member(names[_member_name(names, member, archive)]) as source, \
                    atomic_open(folder / f"{split}.txt", "wb") as out:
                shutil.copyfileobj(source, out)


def _member_name(names: Mapping[str, object], member: str, archive: Path) -> str:
    """``member``'s name in the archive, also when the archive nests it in one folder (``FB15k-237/train.txt``)."""
    if member in names:
        return member
    nested = [name for name in names if name.endswith(f"/{member}") and name.count("/") == 1]
    if len(nested) == 1:
        return nested[0]
    raise KgtraceError(f"{archive}: the archive holds no {member} (it holds {', '.join(sorted(names)[:6])}). Fix: "
                       "the registry entry's members must name files inside it")
