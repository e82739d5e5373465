"""Everything else that runs on several threads in one process gives what one thread gives.

Besides TracIn's chunks side by side (tests/test_tracin_threads.py), kgtrace's work in one process is
concurrent only inside torch's operations (intra-op threads): evaluation, TRAK, influence functions,
the attribution methods the LDS scores, and the rule prover. Each is run here on 1, 2 and 4 threads.
Ranks and the prover's scores must be equal; attribution scores equal up to the rounding of a product
whose sums are split among threads (1e-9 relative in float64). The LDS's subset trainings run in
processes (tests/test_faithfulness.py and test_lds_with_two_processes_equals_one below).
"""

import pytest
import torch
from mined import mined

from kgtrace.attribution.influence import InfluenceFunction
from kgtrace.attribution.methods import METHOD_SPECS, AttributionInputs
from kgtrace.attribution.trak import trak
from kgtrace.core.config import TrainConfig
from kgtrace.evaluation.evaluate import evaluate
from kgtrace.faithfulness.lds import LdsSettings, check_lds
from kgtrace.prover.engine import VectorEngine
from kgtrace.prover.logic import EngineShapes
from kgtrace.prover.scorer import BfsScorer
from kgtrace.runs.embedding import load_run
from kgtrace.training.loop import train

THREADS = (1, 2, 4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Small DistMult and ConvE runs on UMLS (5,216 training triples), two checkpoints each."""
    out = {}
    for name, args in (("distmult", {"embedding_dim": 8}),
                       ("conve", {"embedding_dim": 16, "embedding_height": 4, "output_channels": 4})):
        folder = tmp_path_factory.mktemp(name)
        config = TrainConfig(dataset="umls", model=name, model_args=args, epochs=2, checkpoint_every=1, eval_every=0,
                             threads=1, device="cpu", seed=2, lr=0.01, batch_size=256)
        train(config, folder, progress=False, log=lambda *_: None)
        out[name] = load_run(folder)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """DistMult width 4 on Nations (276 parameters: the exact Hessian is small), checkpoints at 2 and 4."""
    folder = tmp_path_factory.mktemp("tiny") / "run"
    train(TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 4}, epochs=4, lr=0.05,
                      checkpoint_every=2, eval_every=0, threads=1, device="cpu"), folder, progress=False,
          log=lambda *_: None)
    return folder


def on_threads(torch_threads, compute):
    """compute() on each of THREADS."""
    results = []
    for threads in THREADS:
        torch_threads(threads)
        results.append(compute())
    return results


def assert_same_attributions(results):
    first = results[0]
    assert first.abs().max() > 0
    for other in results[1:]:
        torch.testing.assert_close(other, first, rtol=1e-9, atol=1e-12 * first.abs().max().item())


@pytest.mark.parametrize("model", ["distmult", "conve"])
def test_evaluation_ranks_are_equal(runs, model, torch_threads):
    run = runs[model]
    known = run.dataset.all_triples()
    results = on_threads(torch_threads, lambda: evaluate(run.model, run.dataset.test, known=known))
    for other in results[1:]:
        assert other == results[0]


def test_trak_is_equal(runs, torch_threads):
    run = runs["distmult"]
    test = run.dataset.test[:5]
    assert_same_attributions(on_threads(torch_threads, lambda: trak(run, test)))


def test_influence_functions_are_equal(tiny, torch_threads):
    run = load_run(tiny)
    test = run.dataset.test[:5]
    assert_same_attributions(on_threads(torch_threads, lambda: InfluenceFunction(run).influence(test)))


@pytest.mark.parametrize("method", ["tracin-last", "grad-cos", "influence-fisher"])
def test_the_lds_attribution_methods_are_equal(runs, method, torch_threads):
    run = runs["conve"] if method == "influence-fisher" else runs["distmult"]
    test = run.dataset.test[:4]
    assert_same_attributions(on_threads(torch_threads,
                                        lambda: METHOD_SPECS[method].compute(run, test, AttributionInputs()).double()))


def test_the_prover_scores_are_equal(torch_threads):
    ds, rules = mined("nations", 6)
    scorer = BfsScorer(VectorEngine(ds.train, rules, ds.num_entities, EngineShapes(max_atoms=6, max_history=4)), 3)
    test = ds.test[:30]
    results = on_threads(torch_threads, lambda: (scorer.score_t(test[:, :2]), scorer.score_hrt(test)))
    assert results[0][1].max() > 0  # some triples are proved: the comparison can fail
    for tails, ground in results[1:]:
        assert torch.equal(tails, results[0][0]) and torch.equal(ground, results[0][1])


def test_lds_with_two_processes_equals_one(tiny, tmp_path):
    """The LDS's subset trainings in a pool of two processes give the scores of one process."""
    summaries = [check_lds(tiny, tmp_path / f"jobs{jobs}", LdsSettings(subsets=4, sample=3, methods=("tracin-last",),
                                                                       bootstrap=20, jobs=jobs),
                           progress=False, log=lambda *_: None) for jobs in (1, 2)]
    assert [(r.method, r.lds, r.low, r.high, r.n) for r in summaries[1].rows] == [
        (r.method, r.lds, r.low, r.high, r.n) for r in summaries[0].rows]
