"""Are the explanations true? Remove a prediction's most influential training triples, train again, measure.

``kgtrace faithfulness RUN_DIR``: :func:`check_faithfulness` with :class:`FaithfulnessSettings`;
removal methods in :data:`METHODS` (TracIn proponents with the last-layer or all parameters,
random triples, GradRollback's neighbourhood baseline); training again from scratch or
fine-tuning from an early checkpoint (:mod:`.retrain`); the measures (score, rank,
GradRollback's PD and TC, MRR drop) in :mod:`.metrics`.
"""

from kgtrace.faithfulness.experiment import FaithfulnessSettings, check_faithfulness
from kgtrace.faithfulness.methods import METHODS
from kgtrace.faithfulness.metrics import Measures, agreement, changes, summarize

__all__ = ["METHODS", "FaithfulnessSettings", "Measures", "agreement", "changes", "check_faithfulness", "summarize"]
