"""Are the explanations true? Remove a prediction's most influential training triples, train again, measure.

``kgtrace faithfulness RUN_DIR``: `check_faithfulness` with `FaithfulnessSettings`;
removal methods in `removal_methods` (TracIn proponents with the last-layer or all parameters,
random triples, GradRollback's neighbourhood baseline, a proof's facts, the top of the attribution methods
that say so); training again from scratch or
fine-tuning from an early checkpoint (`.retrain`); the measures (score, rank,
GradRollback's PD and TC, MRR drop) in `.metrics`; it returns a `FaithfulnessResult`
(faithfulness.json: `FaithfulnessRow`, `AgreementRow` and `CellRow` rows).

``kgtrace faithfulness RUN_DIR --lds``: `check_lds` with `LdsSettings`, the linear
datamodeling score of the attribution methods of `kgtrace.attribution.methods.METHOD_SPECS` (`.lds`);
it returns an `LdsResult` (lds.json: `LdsRow` rows). Both results (`.results`) have
``to_dict()``, ``to_df()`` and ``read(path)`` of a written file.
"""

from __future__ import annotations

from kgtrace.faithfulness.experiment import FaithfulnessSettings, check_faithfulness
from kgtrace.faithfulness.lds import LdsSettings, check_lds
from kgtrace.faithfulness.metrics import Measures, agreement, changes, summarize
from kgtrace.faithfulness.removals import METHODS, removal_methods
from kgtrace.faithfulness.results import (
                                          AgreementRow,
                                          CellRow,
                                          ExplainedPredictions,
                                          FaithfulnessResult,
                                          FaithfulnessRow,
                                          LdsResult,
                                          LdsRow,
                                          RemovalSettings,
)

__all__ = ["METHODS", "AgreementRow", "CellRow", "ExplainedPredictions", "FaithfulnessResult", "FaithfulnessRow",
           "FaithfulnessSettings", "LdsResult", "LdsRow", "LdsSettings", "Measures", "RemovalSettings", "agreement",
           "changes", "check_faithfulness", "check_lds", "removal_methods", "summarize"]
