"""kgtrace report: a run folder as one self-contained HTML page (config, training, metrics, ranks, explanations)."""

from kgtrace.report.build import build_html, write_report

__all__ = ["build_html", "write_report"]
