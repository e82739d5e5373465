"""Are the explanations true? Remove a prediction's most influential training triples, train again, measure.

``kgtrace faithfulness RUN_DIR``: :func:`check_faithfulness` with :class:`FaithfulnessSettings`;
removal methods in :data:`METHODS` (TracIn proponents with the last-layer or all parameters,
random triples, GradRollback's neighbourhood baseline); training again from scratch or
fine-tuning from an early checkpoint (:mod:`.retrain`); the measures (score, rank,
GradRollback's PD and TC, MRR drop) in :mod:`.metrics`.

``kgtrace faithfulness RUN_DIR --lds``: :func:`check_lds` with :class:`LdsSettings`, the linear
datamodeling score of the attribution methods in :data:`ATTRIBUTIONS` (:mod:`.lds`).
"""

from kgtrace.attribution.methods import ATTRIBUTIONS
from kgtrace.faithfulness.experiment import FaithfulnessSettings, check_faithfulness
from kgtrace.faithfulness.lds import LdsSettings, LdsSummary, check_lds
from kgtrace.faithfulness.methods import METHODS
from kgtrace.faithfulness.metrics import Measures, agreement, changes, summarize

__all__ = ["ATTRIBUTIONS", "METHODS", "FaithfulnessSettings", "LdsSettings", "LdsSummary", "Measures", "agreement",
           "changes", "check_faithfulness", "check_lds", "summarize"]
