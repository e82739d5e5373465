"""Training-data attribution: TracInCP influence of training triples on predictions.

Public names: :class:`TracIn`, :class:`TopK`, :func:`select_parameters`.
"""

from kgtrace.attribution.params import select_parameters
from kgtrace.attribution.tracin import TopK, TracIn

__all__ = ["TopK", "TracIn", "select_parameters"]
