"""An embedding run's model, for the prover: the hybrid's second scorer, or the policy's starting embeddings."""

from __future__ import annotations

import torch
from torch import nn

from kgtrace.core.errors import KgtraceError
from kgtrace.data.dataset import Dataset
from kgtrace.runs.embedding import load_run


def embedding_model(run_dir: str, dataset: Dataset, device: torch.device | str) -> nn.Module:
    """The best model of an embedding run over the same id maps as ``dataset``."""
    run = load_run(run_dir, device=device)
    if (run.dataset.entities.digest(), run.dataset.relations.digest()) != (dataset.entities.digest(),
                                                                           dataset.relations.digest()):
        raise KgtraceError(f"embedding_run={run_dir}: its id maps differ from the prover's dataset, so scores would "
                           "belong to other triples. Fix: use an embedding run trained on the same dataset")
    return run.model
