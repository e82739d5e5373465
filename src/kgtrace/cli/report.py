"""kgtrace doctor and report."""

from __future__ import annotations

import argparse


def add_doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                   help="a run folder written by kgtrace train (default: a small ConvE trained for one epoch on UMLS "
                        "in a temporary folder)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where to compile and run (auto: CUDA when available, where CUDA graphs are checked too)")


def cmd_doctor(args: argparse.Namespace) -> int:
    from kgtrace.workflows.doctor import doctor, format_table

    checks = doctor(args.run_dir, args.device)
    print(format_table(checks))
    return 0 if all(c.ok for c in checks) else 1



def add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (with test_metrics.json, test_ranks.tsv and "
                                                     "explain/*.json where written)")
    p.add_argument("--out", metavar="FILE.html", help="the page to write (default: RUN_DIR/report.html)")
    p.add_argument("--faithfulness", action="append", default=[], metavar="DIR",
                   help="also show this kgtrace faithfulness --out folder (repeatable; folders inside RUN_DIR are "
                        "always shown)")


def cmd_report(args: argparse.Namespace) -> int:
    from kgtrace.report import write_report

    print(f"wrote {write_report(args.run_dir, args.out, args.faithfulness)}")
    return 0


