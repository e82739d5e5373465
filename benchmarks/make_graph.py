"""Write realistically shaped biomedical graphs for the scale benchmarks, reproducibly from a seed; prints JSON.

    python benchmarks/make_graph.py hetionet --out graphs/hetionet [--seed 0]
    python benchmarks/make_graph.py robokop --out graphs/robokop [--nodes 2000000] [--edges 16000000] [--tsv]

``hetionet``: Hetionet v1.0's real 47,031 nodes (ids, names, kinds, from
``../shared/datasets/hetionet-schema``) and each of its 24 edge types with its real edge count,
drawn between nodes of the right kinds and touching as many distinct source and target nodes as
the real edge type does (``metaedges.tsv``). Written in Hetionet's own format:
``hetionet-v1.0-nodes.tsv`` and ``hetionet-v1.0-edges.sif.gz`` (``source metaedge target``).

``robokop``: a KGX export shaped like a ROBOKOP subgraph: nodes with Biolink category lineages
(``biolink:NamedThing|...|biolink:Disease``) and names; edges with Biolink predicates between
the categories they join in ROBOKOP, qualifiers on ``biolink:affects`` (``object_aspect_qualifier``,
``object_direction_qualifier``, ``qualified_predicate``) and a ``primary_knowledge_source``.
Written as ``nodes.jsonl`` / ``edges.jsonl`` (and ``nodes.tsv`` / ``edges.tsv`` with ``--tsv``).

Degrees are heavy-tailed in both: every node has a popularity drawn from a Zipf law (exponent
``--zipf``), the nodes an edge type touches are drawn by popularity, and so are its edges among
them; so hubs are hubs in every relation they take part in, as in the real graphs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

SCHEMA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "hetionet-schema"

# ROBOKOP-like node categories: (leaf, share of nodes, CURIE prefix, name stem); lineages root first.
LINEAGES = {
    "Gene": ["NamedThing", "BiologicalEntity", "GeneOrGeneProduct", "Gene"],
    "Protein": ["NamedThing", "BiologicalEntity", "GeneOrGeneProduct", "GeneProduct", "Protein"],
    "SmallMolecule": ["NamedThing", "ChemicalEntity", "MolecularEntity", "SmallMolecule"],
    "Disease": ["NamedThing", "BiologicalEntity", "DiseaseOrPhenotypicFeature", "Disease"],
    "PhenotypicFeature": ["NamedThing", "BiologicalEntity", "DiseaseOrPhenotypicFeature", "PhenotypicFeature"],
    "AnatomicalEntity": ["NamedThing", "BiologicalEntity", "OrganismalEntity", "AnatomicalEntity"],
    "Cell": ["NamedThing", "BiologicalEntity", "OrganismalEntity", "AnatomicalEntity", "Cell"],
    "CellularComponent": ["NamedThing", "BiologicalEntity", "OrganismalEntity", "AnatomicalEntity",
                          "CellularComponent"],
    "BiologicalProcess": ["NamedThing", "BiologicalEntity", "BiologicalProcessOrActivity", "BiologicalProcess"],
    "Pathway": ["NamedThing", "BiologicalEntity", "BiologicalProcessOrActivity", "BiologicalProcess", "Pathway"],
    "OrganismTaxon": ["NamedThing", "OrganismTaxon"],
}
NODE_KINDS = (  # leaf, share, CURIE prefix, name stem
    ("Gene", 0.22, "NCBIGene", "gene"), ("Protein", 0.20, "UniProtKB", "protein"),
    ("SmallMolecule", 0.30, "CHEBI", "compound"), ("Disease", 0.03, "MONDO", "disease"),
    ("PhenotypicFeature", 0.02, "HP", "phenotype"), ("AnatomicalEntity", 0.015, "UBERON", "anatomy"),
    ("Cell", 0.005, "CL", "cell type"), ("CellularComponent", 0.005, "GO", "component"),
    ("BiologicalProcess", 0.02, "GO", "process"), ("Pathway", 0.005, "REACT", "pathway"),
    ("OrganismTaxon", 0.18, "NCBITaxon", "taxon"),
)
AFFECTS_QUALIFIERS = {  # biolink:affects edges carry one of each
    "object_aspect_qualifier": ("activity", "abundance", "expression", "activity_or_abundance"),
    "object_direction_qualifier": ("increased", "decreased"),
}
EDGE_KINDS = (  # predicate, subject leaf, object leaf, share of edges, share of the nodes of each kind touched
    ("biolink:interacts_with", "Gene", "Gene", 0.16, 0.8),
    ("biolink:physically_interacts_with", "Protein", "Protein", 0.08, 0.6),
    ("biolink:affects", "SmallMolecule", "Gene", 0.12, 0.3),
    ("biolink:participates_in", "Gene", "BiologicalProcess", 0.08, 0.8),
    ("biolink:actively_involved_in", "Gene", "Pathway", 0.03, 0.7),
    ("biolink:expressed_in", "Gene", "AnatomicalEntity", 0.08, 0.8),
    ("biolink:located_in", "Protein", "CellularComponent", 0.04, 0.6),
    ("biolink:gene_product_of", "Protein", "Gene", 0.03, 0.9),
    ("biolink:in_taxon", "Gene", "OrganismTaxon", 0.06, 0.9),
    ("biolink:has_phenotype", "Disease", "PhenotypicFeature", 0.05, 0.9),
    ("biolink:gene_associated_with_condition", "Gene", "Disease", 0.04, 0.6),
    ("biolink:treats", "SmallMolecule", "Disease", 0.004, 0.02),
    ("biolink:contraindicated_in", "SmallMolecule", "Disease", 0.002, 0.02),
    ("biolink:causes", "SmallMolecule", "PhenotypicFeature", 0.03, 0.1),
    ("biolink:correlated_with", "Disease", "SmallMolecule", 0.03, 0.2),
    ("biolink:related_to", "SmallMolecule", "SmallMolecule", 0.05, 0.5),
    ("biolink:occurs_together_in_literature_with", "SmallMolecule", "Gene", 0.05, 0.3),
    ("biolink:subclass_of", "Disease", "Disease", 0.02, 0.9),
    ("biolink:subclass_of", "PhenotypicFeature", "PhenotypicFeature", 0.01, 0.9),
    ("biolink:subclass_of", "BiologicalProcess", "BiologicalProcess", 0.02, 0.9),
    ("biolink:subclass_of", "SmallMolecule", "SmallMolecule", 0.02, 0.3),
    ("biolink:part_of", "Cell", "AnatomicalEntity", 0.004, 0.9),
)
SOURCES = ("infores:ctd", "infores:drugcentral", "infores:string", "infores:gtex", "infores:hpo-annotations",
           "infores:textminingkp", "infores:chebi", "infores:reactome", "infores:go-cam", "infores:monarchinitiative")


@dataclass(frozen=True)
class Pool:
    """Nodes of one kind as global indices, with their popularity."""

    index: np.ndarray  # [n] int64
    weight: np.ndarray  # [n] float64, sums to 1


def zipf_weights(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """Popularity of n nodes: 1 / rank^exponent over a random order of ranks, normalised."""
    ranks = rng.permutation(n).astype(np.float64) + 1.0
    weights = ranks ** -exponent
    return weights / weights.sum()


def touched(rng: np.random.Generator, pool: Pool, count: int) -> Pool:
    """``count`` distinct nodes of ``pool``, drawn by popularity: the nodes one edge type touches."""
    count = min(count, len(pool.index))
    chosen = rng.choice(len(pool.index), size=count, replace=False, p=pool.weight)
    weight = pool.weight[chosen]
    return Pool(pool.index[chosen], weight / weight.sum())


def draw_pairs(rng: np.random.Generator, sources: Pool, targets: Pool, count: int) -> np.ndarray:
    """``count`` distinct (source, target) pairs [count, 2] of global indices, no self-loops.

    Every touched node gets an edge first (as far as ``count`` allows), so the edge type touches
    them all; the rest are drawn by popularity at both ends, repeats and self-loops redrawn. Where
    the touched nodes hold fewer distinct pairs than ``count`` (tiny graphs), fewer are returned.
    """
    cover = np.concatenate([
        np.stack([sources.index, rng.choice(targets.index, size=len(sources.index), p=targets.weight)], 1),
        np.stack([rng.choice(sources.index, size=len(targets.index), p=sources.weight), targets.index], 1),
    ])
    pairs = _distinct(cover[rng.permutation(len(cover))])[:count]
    for _ in range(50):
        if len(pairs) >= count:
            break
        want = int((count - len(pairs)) * 1.3) + 16
        more = np.stack([rng.choice(sources.index, size=want, p=sources.weight),
                         rng.choice(targets.index, size=want, p=targets.weight)], 1)
        pairs = _distinct(np.concatenate([pairs, more]))[:count]
    if len(pairs) < count:  # popularity so skewed that the pairs repeat: top up uniformly
        more = np.stack([rng.choice(sources.index, size=4 * count), rng.choice(targets.index, size=4 * count)], 1)
        pairs = _distinct(np.concatenate([pairs, more]))[:count]
    return pairs


def _distinct(pairs: np.ndarray) -> np.ndarray:
    """Pairs without self-loops and repeats, in first-seen order."""
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    _, first = np.unique(pairs[:, 0] * (1 << 32) + pairs[:, 1], return_index=True)
    return pairs[np.sort(first)]


# ---------------------------------------------------------------- Hetionet-shaped


def hetionet(out: Path, seed: int, exponent: float) -> dict:
    """Hetionet's real nodes, and edges of its 24 types with their real counts, in Hetionet's format."""
    rng = np.random.default_rng(seed)
    nodes = pl.read_csv(SCHEMA / "hetionet-v1.0-nodes.tsv.gz", separator="\t", quote_char=None, infer_schema=False)
    metaedges = pl.read_csv(SCHEMA / "metaedges.tsv", separator="\t", quote_char=None)
    popularity = zipf_weights(rng, nodes.height, exponent)
    kinds = nodes["kind"].to_numpy()
    pools = {}
    for kind in np.unique(kinds):
        index = np.flatnonzero(kinds == kind)
        pools[kind] = Pool(index, popularity[index] / popularity[index].sum())
    ids = nodes["id"].to_numpy()
    frames = []
    for row in metaedges.iter_rows(named=True):
        source_kind, _, target_kind = (part.strip() for part in row["metaedge"].replace(">", "-").split(" - "))
        sources = touched(rng, pools[source_kind], row["source_nodes"])
        targets = touched(rng, pools[target_kind], row["target_nodes"])
        pairs = draw_pairs(rng, sources, targets, row["edges"])
        frames.append(pl.DataFrame({"source": ids[pairs[:, 0]], "metaedge": row["abbreviation"],
                                    "target": ids[pairs[:, 1]]}))
    edges = pl.concat(frames)
    out.mkdir(parents=True, exist_ok=True)
    nodes.write_csv(out / "hetionet-v1.0-nodes.tsv", separator="\t", quote_style="never")
    with gzip.open(out / "hetionet-v1.0-edges.sif.gz", "wb", compresslevel=6) as f:
        edges.write_csv(f, separator="\t", quote_style="never")
    return {"graph": "hetionet", "out": str(out), "nodes": nodes.height, "edges": edges.height,
            "edge_types": metaedges.height, "max_degree": _max_degree(edges["source"], edges["target"])}


# ---------------------------------------------------------------- ROBOKOP-shaped


def robokop(out: Path, seed: int, exponent: float, num_nodes: int, num_edges: int, tsv: bool) -> dict:
    """A KGX graph of ``num_nodes`` Biolink-typed nodes and ``num_edges`` edges."""
    rng = np.random.default_rng(seed)
    shares = np.array([share for _, share, _, _ in NODE_KINDS])
    sizes = np.floor(shares / shares.sum() * num_nodes).astype(np.int64)
    sizes[0] += num_nodes - sizes.sum()
    popularity = zipf_weights(rng, num_nodes, exponent)
    nodes, pools, start = [], {}, 0
    for (leaf, _, prefix, stem), size in zip(NODE_KINDS, sizes):
        index = np.arange(start, start + size)
        pools[leaf] = Pool(index, popularity[index] / popularity[index].sum())
        number = pl.int_range(start + 1, start + size + 1, eager=True)  # global, so that two kinds never share an id
        nodes.append(pl.select(id=pl.format(f"{prefix}:{{}}", number), name=pl.format(f"{stem} {{}}", number),
                               category=pl.lit("|".join(f"biolink:{c}" for c in LINEAGES[leaf]))))
        start += size
    node_frame = pl.concat(nodes)
    edge_shares = np.array([kind[3] for kind in EDGE_KINDS])
    counts = np.floor(edge_shares / edge_shares.sum() * num_edges).astype(np.int64)
    counts[0] += num_edges - counts.sum()
    ids = node_frame["id"]
    frames = []
    for (predicate, subject, obj, _, reach), count in zip(EDGE_KINDS, counts):
        sources = touched(rng, pools[subject], max(1, int(reach * len(pools[subject].index))))
        targets = touched(rng, pools[obj], max(1, int(reach * len(pools[obj].index))))
        pairs = draw_pairs(rng, sources, targets, int(count))
        frames.append(_edge_frame(rng, ids, pairs, predicate))
    edges = pl.concat(frames, how="diagonal")
    edges = edges.with_columns(primary_knowledge_source=pl.Series(rng.choice(SOURCES, size=edges.height)))
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(node_frame.with_columns(pl.col("category").str.split("|")), out / "nodes.jsonl")
    _write_jsonl(edges, out / "edges.jsonl")
    if tsv:
        node_frame.write_csv(out / "nodes.tsv", separator="\t", quote_style="never")
        edges.write_csv(out / "edges.tsv", separator="\t", quote_style="never", null_value="")
    return {"graph": "robokop", "out": str(out), "nodes": node_frame.height, "edges": edges.height,
            "predicates": len({kind[0] for kind in EDGE_KINDS}),
            "qualified_edges": int(edges["object_aspect_qualifier"].is_not_null().sum()),
            "max_degree": _max_degree(edges["subject"], edges["object"])}


def _edge_frame(rng: np.random.Generator, ids: pl.Series, pairs: np.ndarray, predicate: str) -> pl.DataFrame:
    frame = pl.DataFrame({"subject": ids.gather(pairs[:, 0]), "predicate": predicate, "object": ids.gather(pairs[:, 1])})
    if predicate != "biolink:affects":
        return frame
    qualifiers = {name: pl.Series(rng.choice(values, size=len(pairs))) for name, values in AFFECTS_QUALIFIERS.items()}
    return frame.with_columns(**qualifiers, qualified_predicate=pl.lit("biolink:causes"))


def _write_jsonl(frame: pl.DataFrame, path: Path) -> None:
    """One JSON object per row, leaving out absent (null) fields as KGX exports do."""
    parts = []
    for name, dtype in frame.schema.items():
        if dtype == pl.List(pl.String):
            value = pl.lit('["') + pl.col(name).list.join('", "') + pl.lit('"]')
        else:  # the generated labels hold no quotes or backslashes to escape
            value = pl.lit('"') + pl.col(name).cast(pl.String) + pl.lit('"')
        parts.append(pl.when(pl.col(name).is_not_null()).then(pl.lit(f'"{name}": ') + value))
    fields = pl.concat_list(parts).list.drop_nulls().list.join(", ")
    lines = frame.select(line=pl.lit("{") + fields + pl.lit("}"))
    lines.write_csv(path, include_header=False, quote_style="never")


def _max_degree(subjects: pl.Series, objects: pl.Series) -> int:
    return int(pl.concat([subjects, objects]).value_counts()["count"].max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graph", choices=("hetionet", "robokop"))
    parser.add_argument("--out", type=Path, required=True, help="folder to write the graph into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zipf", type=float, default=0.9, help="exponent of the node popularity law")
    parser.add_argument("--nodes", type=int, default=2_000_000, help="robokop: nodes")
    parser.add_argument("--edges", type=int, default=16_000_000, help="robokop: edges")
    parser.add_argument("--tsv", action="store_true", help="robokop: also write KGX TSV files")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.graph == "hetionet":
        result = hetionet(args.out, args.seed, args.zipf)
    else:
        result = robokop(args.out, args.seed, args.zipf, args.nodes, args.edges, args.tsv)
    print(json.dumps({**result, "seed": args.seed, "zipf": args.zipf, "seconds": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
