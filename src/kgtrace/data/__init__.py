"""Data layer: reading, cutting, splitting and saving knowledge-graph datasets."""

from kgtrace.data.dataset import Dataset, load_dataset, save_dataset
from kgtrace.data.kgx import KgxCut, read_kgx
from kgtrace.data.names import read_edge_map, read_names, write_edge_map, write_names
from kgtrace.data.prepare import PrepareReport, prepare
from kgtrace.data.registry import BUNDLED, DATASETS, DatasetEntry, fetch
from kgtrace.data.splits import SplitReport, ensure_seen, holdout_predicate, random_split
from kgtrace.data.triples import encode_triples, read_labeled_triples, write_labeled_triples
from kgtrace.data.vocab import Vocab, read_vocab, write_vocab

__all__ = [
    "BUNDLED", "DATASETS", "Dataset", "DatasetEntry", "KgxCut", "PrepareReport", "SplitReport", "Vocab",
    "encode_triples", "ensure_seen", "fetch", "holdout_predicate", "load_dataset", "prepare", "random_split",
    "read_edge_map", "read_kgx", "read_labeled_triples", "read_names", "read_vocab",
    "save_dataset", "write_edge_map", "write_labeled_triples", "write_names", "write_vocab",
]
