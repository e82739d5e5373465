"""Training-data attribution: TracInCP influence of training triples on predictions.

Public names: `TracIn`, `TopK`, `select_parameters`, and the projected
index `build_index` / `ProjectedIndex`.
"""

from kgtrace.attribution.index import ProjectedIndex, build_index
from kgtrace.attribution.params import select_parameters
from kgtrace.attribution.topk import TopK
from kgtrace.attribution.tracin import TracIn

__all__ = ["ProjectedIndex", "TopK", "TracIn", "build_index", "select_parameters"]
