"""A tiny graph in Hetionet's tabular format (``hetionet-v1.0-nodes.tsv``, ``hetionet-v1.0-edges.sif.gz``)."""

from __future__ import annotations

import gzip
from pathlib import Path

NODES = [
    ("Compound::DB00001", "permethrin", "Compound"),
    ("Compound::DB00002", "ivermectin", "Compound"),
    ("Compound::DB00003", "aspirin", "Compound"),
    ("Disease::DOID:1", "scabies", "Disease"),
    ("Disease::DOID:2", "head lice infestation", "Disease"),
    ("Gene::1", "HMGB3", "Gene"),
    ("Gene::2", "GABRA1", "Gene"),
    ("Side Effect::C1", "Pruritus", "Side Effect"),
]
EDGES = [
    ("Compound::DB00001", "CtD", "Disease::DOID:1"),
    ("Compound::DB00002", "CtD", "Disease::DOID:1"),
    ("Compound::DB00002", "CtD", "Disease::DOID:2"),
    ("Compound::DB00001", "CbG", "Gene::2"),
    ("Compound::DB00002", "CbG", "Gene::2"),
    ("Compound::DB00003", "CbG", "Gene::1"),
    ("Disease::DOID:1", "DaG", "Gene::1"),
    ("Disease::DOID:2", "DaG", "Gene::2"),
    ("Gene::1", "GiG", "Gene::2"),
    ("Gene::2", "Gr>G", "Gene::1"),
    ("Compound::DB00001", "CcSE", "Side Effect::C1"),
    ("Compound::DB00003", "CcSE", "Side Effect::C1"),
    ("Compound::DB00001", "CrC", "Compound::DB00002"),
    ("Compound::DB00001", "CtD", "Disease::DOID:1"),  # a duplicate
    ("Compound::DB00009", "CtD", "Disease::DOID:1"),  # a node the nodes file lacks
]


def write_hetionet(folder: Path) -> tuple[Path, Path]:
    """Write the nodes file (plain TSV) and the gzipped edges file under Hetionet's own names."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes, edges = folder / "hetionet-v1.0-nodes.tsv", folder / "hetionet-v1.0-edges.sif.gz"
    nodes.write_text("id\tname\tkind\n" + "".join("\t".join(row) + "\n" for row in NODES))
    edges.write_bytes(gzip.compress(("source\tmetaedge\ttarget\n" + "".join(
        "\t".join(row) + "\n" for row in EDGES)).encode()))
    return nodes, edges
