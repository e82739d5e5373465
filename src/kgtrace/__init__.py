"""kgtrace: link prediction on knowledge graphs that shows why."""

__version__ = "0.1.0"
