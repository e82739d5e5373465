"""A small drug-repurposing graph in KGX (JSON lines): drugs, diseases and genes with Biolink categories and names.

Drugs treat diseases, drugs affect genes, genes are associated with diseases, genes interact; a
drug tends to treat the diseases its genes are associated with (a mechanism a model can learn).
Metformin is ``CHEBI:6801``, as in the users' graphs. ``prepare_drugs`` holds some ``biolink:treats``
edges out as the test split.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DRUG, DISEASE, GENE = "biolink:SmallMolecule", "biolink:Disease", "biolink:Gene"
DRUGS = ["metformin", "risperidone", "rosiglitazone", "olanzapine", "aspirin", "ibuprofen", "permethrin",
         "ivermectin", "donepezil", "memantine", "insulin glargine", "atorvastatin", "lisinopril", "haloperidol",
         "clozapine", "pioglitazone", "galantamine", "simvastatin", "amlodipine", "sitagliptin", "levodopa",
         "ropinirole"]
DISEASES = ["type 2 diabetes mellitus", "Alzheimer disease", "schizophrenia", "scabies", "hypertension",
            "hypercholesterolemia", "Parkinson disease", "colorectal cancer", "obesity", "bipolar disorder",
            "head lice infestation", "migraine"]
GENES = ["INS", "PRKAA2", "DRD2", "HTR2A", "PPARG", "ACHE", "GRIN1", "HMGCR", "ACE", "PTGS2", "GABRA1", "SLC6A3",
         "APP", "APOE", "LEP", "TH", "CACNA1C", "DPP4", "KCNJ11", "TNF"]
CHEBI = {"metformin": "CHEBI:6801"}


def nodes() -> list[dict]:
    drugs = [{"id": CHEBI.get(name, f"CHEBI:{100 + i}"), "name": name, "category": [DRUG, "biolink:ChemicalEntity"]}
             for i, name in enumerate(DRUGS)]
    diseases = [{"id": f"MONDO:{i:07d}", "name": name, "category": [DISEASE]} for i, name in enumerate(DISEASES)]
    genes = [{"id": f"NCBIGene:{1000 + i}", "name": name, "category": [GENE]} for i, name in enumerate(GENES)]
    return drugs + diseases + genes


def edges(seed: int = 0) -> list[dict]:
    """Each gene is tied to one or two diseases; each drug affects two or three genes and treats most of their
    diseases; some genes interact."""
    rng = random.Random(seed)
    ids = {node["name"]: node["id"] for node in nodes()}
    gene_diseases = {gene: rng.sample(DISEASES, rng.choice((1, 2))) for gene in GENES}
    found = []
    for gene, diseases in gene_diseases.items():
        found += [(ids[gene], "biolink:gene_associated_with_condition", ids[d]) for d in diseases]
    for drug in DRUGS:
        genes = rng.sample(GENES, rng.choice((2, 3)))
        found += [(ids[drug], "biolink:affects", ids[g]) for g in genes]
        treated = sorted({d for g in genes for d in gene_diseases[g]})
        found += [(ids[drug], "biolink:treats", ids[d]) for d in treated if rng.random() < 0.8]
    for _ in range(12):
        a, b = rng.sample(GENES, 2)
        found.append((ids[a], "biolink:interacts_with", ids[b]))
    return [{"subject": s, "predicate": p, "object": o} for s, p, o in dict.fromkeys(found)]


def write_drugs(folder: Path) -> tuple[Path, Path]:
    """nodes.jsonl and edges.jsonl in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    node_file, edge_file = folder / "nodes.jsonl", folder / "edges.jsonl"
    node_file.write_text("".join(json.dumps(n) + "\n" for n in nodes()))
    edge_file.write_text("".join(json.dumps(e) + "\n" for e in edges()) + "")
    return node_file, edge_file


def prepare_args(folder: Path, out: Path) -> list[str]:
    """``kgtrace prepare`` arguments that hold a third of the ``biolink:treats`` edges out as the test split."""
    node_file, edge_file = write_drugs(folder)
    return ["prepare", "--nodes", str(node_file), "--edges", str(edge_file), "--out", str(out), "--split", "predicate",
            "--holdout-predicate", "biolink:treats", "--holdout-fraction", "0.3"]
