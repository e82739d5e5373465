"""kgtrace: link prediction on knowledge graphs that shows why.

The public API, re-exported from the packages that own it::

    kgtrace.pipeline                                      train, then rank the test split: one call (PyKEEN's)
    kgtrace.TrainConfig, kgtrace.train, kgtrace.resume    training into a run folder
    kgtrace.load_run                                      any run folder: an embedding run's Run (model, dataset,
                                                          checkpoints), a prover run's ProverRun
    kgtrace.evaluate                                      filtered rank metrics of any scorer
    kgtrace.predict, kgtrace.score_triples                a run's best candidates; scores and ranks of triples
    kgtrace.explain                                       which training triples drove a prediction, in names
                                                          (any attribution method; typed Explanations)
    kgtrace.TracIn                                        training triples' influence on predictions
    kgtrace.load_dataset, kgtrace.prepare                 datasets
    kgtrace.MODELS, kgtrace.build_model                   the model registry
"""

from kgtrace.attribution import TracIn
from kgtrace.attribution.explanations import explain
from kgtrace.attribution.results import Explanations
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError, DataError, KgtraceError
from kgtrace.data.dataset import Dataset, load_dataset
from kgtrace.data.prepare import prepare
from kgtrace.evaluation.evaluate import evaluate
from kgtrace.evaluation.predict import predict, score_triples
from kgtrace.models import MODELS, build_model
from kgtrace.prover.run import ProverRun
from kgtrace.runs.embedding import Run
from kgtrace.training.loop import resume, train
from kgtrace.workflows.any_run import load_any_run as load_run
from kgtrace.workflows.pipelines import PipelineResult, pipeline

__version__ = "0.1.0"

__all__ = [
    "MODELS", "ConfigError", "DataError", "Dataset", "Explanations", "KgtraceError", "PipelineResult", "ProverRun",
    "Run", "TrainConfig", "TracIn", "build_model", "evaluate", "explain", "load_dataset", "load_run", "pipeline",
    "predict", "prepare", "resume", "score_triples", "train",
]
