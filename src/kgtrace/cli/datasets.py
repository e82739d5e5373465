"""``kgtrace datasets``: the datasets kgtrace knows by name, and where each one is."""

from __future__ import annotations

import argparse
import os

from kgtrace.cli.common import parse_list
from kgtrace.data.registry import DATASETS, MIRROR_ENV, cached, fetch, source_url


def add_datasets_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fetch", metavar="NAMES", default=None,
                   help="download (or copy from the mirror) and unpack these datasets now, comma-separated "
                        "(all: every remote one); otherwise the first use fetches them")
    p.add_argument("--citations", action="store_true", help="also print each dataset's licence and citation")


def cmd_datasets(args: argparse.Namespace) -> int:
    remote = tuple(name for name, entry in DATASETS.items() if not entry.bundled)
    if args.fetch:
        names = remote if args.fetch.strip() == "all" else parse_list(args.fetch, "--fetch", allowed=remote)
        for name in names:
            print(f"{name}: {fetch(name)}")
    print(f"{'name':<10} {'entities':>8} {'relations':>9} {'train':>9} {'valid':>7} {'test':>7}  where")
    for name, entry in DATASETS.items():
        c = entry.counts
        print(f"{name:<10} {c['entities']:>8,} {c['relations']:>9,} {c['train']:>9,} {c['valid']:>7,} {c['test']:>7,}  "
              f"{_where(name)}")
        if args.citations:
            print(f"{'':<10} {entry.title}: {entry.description}; {entry.licence}; cite {entry.citation}")
    mirror = os.environ.get(MIRROR_ENV)
    print(f"remote datasets are fetched from {'the mirror ' + mirror if mirror else 'their public URLs'} "
          f"({MIRROR_ENV} names a local mirror folder or URL)")
    return 0


def _where(name: str) -> str:
    entry = DATASETS[name]
    if entry.bundled:
        return "bundled"
    folder = cached(name)
    return f"cached in {folder}" if folder else f"not fetched yet (from {source_url(entry)})"
