"""Our filtered evaluation equals PyKEEN's RankBasedEvaluator on the same weights (to 1e-6).

PyKEEN is an optional extra (`pip install -e .[pykeen]`); CI installs it, so these tests run there.
"""

import pytest
import torch

pykeen = pytest.importorskip("pykeen", reason="PyKEEN is not installed: pip install -e '.[pykeen]'")

from pykeen.evaluation import RankBasedEvaluator  # noqa: E402
from pykeen.losses import CrossEntropyLoss  # noqa: E402
from pykeen.models import ConvE as PyKEENConvE  # noqa: E402
from pykeen.models import DistMult as PyKEENDistMult  # noqa: E402
from pykeen.triples import CoreTriplesFactory  # noqa: E402

from kgtrace.data.dataset import load_dataset  # noqa: E402
from kgtrace.evaluation.evaluate import Candidates, evaluate  # noqa: E402
from kgtrace.interop.pykeen import pykeen_state_dict  # noqa: E402
from kgtrace.models import build_model  # noqa: E402
from kgtrace.training.loss import kvsall_ce, sampled_ce_rows  # noqa: E402

METRICS = {"mrr": "inverse_harmonic_mean_rank", "mr": "arithmetic_mean_rank", "hits_at_1": "hits_at_1",
           "hits_at_3": "hits_at_3", "hits_at_10": "hits_at_10"}


def factory(triples, ds, inverse):
    return CoreTriplesFactory.create(mapped_triples=triples, num_entities=ds.num_entities,
                                     num_relations=ds.num_relations, create_inverse_triples=inverse)


def pykeen_metrics(model, ds):
    evaluator = RankBasedEvaluator(filtered=True)
    result = evaluator.evaluate(model, ds.test, additional_filter_triples=[ds.train, ds.valid], batch_size=64,
                                use_tqdm=False)
    return {side: {tie: {ours: result.get_metric(f"{side}.{tie}.{theirs}") for ours, theirs in METRICS.items()}
                   for tie in ("realistic", "optimistic", "pessimistic")} for side in ("head", "tail", "both")}


def assert_same(ours, theirs):
    for side in ("head", "tail", "both"):
        for tie in ("realistic", "optimistic", "pessimistic"):
            for metric, value in theirs[side][tie].items():
                assert ours[side][tie][metric] == pytest.approx(value, rel=1e-6, abs=1e-6), (side, tie, metric)


@pytest.mark.parametrize("compile", [False, True])
def test_distmult_matches_pykeen(compile):
    ds = load_dataset("nations")
    torch.manual_seed(0)
    ours = build_model("distmult", ds.num_entities, ds.num_relations, embedding_dim=32).eval()
    theirs = PyKEENDistMult(triples_factory=factory(ds.train, ds, False), embedding_dim=32, random_seed=0)
    theirs.load_state_dict(pykeen_state_dict(ours, theirs.state_dict()))
    metrics = evaluate(ours, ds.test, known=ds.all_triples(), candidates=Candidates(compile=compile))
    assert_same(metrics.to_dict(), pykeen_metrics(theirs.eval(), ds))


def test_conve_matches_pykeen():
    ds = load_dataset("umls")
    torch.manual_seed(0)
    ours = build_model("conve", ds.num_entities, ds.num_relations, embedding_dim=200).eval()
    theirs = PyKEENConvE(triples_factory=factory(ds.train, ds, True), embedding_dim=200, random_seed=0)
    with torch.no_grad():
        # Give batch norm non-trivial running statistics so that eval mode is really exercised.
        for bn in (ours.bn0, ours.bn1, ours.bn2):
            bn.running_mean.uniform_(-0.1, 0.1)
            bn.running_var.uniform_(0.5, 1.5)
    theirs.load_state_dict(pykeen_state_dict(ours, theirs.state_dict()))
    metrics = evaluate(ours, ds.test, known=ds.all_triples())
    assert_same(metrics.to_dict(), pykeen_metrics(theirs.eval(), ds))


def test_kvsall_ce_is_pykeens_lcwa_cross_entropy():
    """kvsall-ce with the "pykeen" smoothing style is PyKEEN's CrossEntropyLoss on LCWA scores and labels."""
    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(9, 17, dtype=torch.float64, generator=gen) * 3
    labels = torch.rand(9, 17, generator=gen) < 0.25
    labels[torch.arange(9), torch.randint(17, (9,), generator=gen)] = True
    rows, cols = labels.nonzero(as_tuple=True)
    for eps in (0.0, 0.1):
        theirs = CrossEntropyLoss().process_lcwa_scores(scores, labels.double(), label_smoothing=eps, num_entities=17)
        torch.testing.assert_close(kvsall_ce(scores, rows, cols, eps), theirs, rtol=1e-12, atol=0.0)


def test_sampled_cross_entropy_is_pykeens_slcwa_cross_entropy():
    """Per row: the cross-entropy of column 0 among the gathered candidates, PyKEEN's sLCWA formula."""
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(6, 23, generator=gen, dtype=torch.float64)
    candidates = torch.randint(0, 23, (6, 5), generator=gen)
    candidates[0, 3] = candidates[0, 0]  # a draw equal to the answer counts as a negative, as in PyKEEN
    picked = scores.gather(1, candidates)
    expected = CrossEntropyLoss(reduction="mean").process_slcwa_scores(picked[:, :1], picked[:, 1:])
    torch.testing.assert_close(sampled_ce_rows(picked).mean(), expected, rtol=1e-12, atol=0)
    assert torch.equal(sampled_ce_rows(picked[:, :1]), torch.zeros(6, dtype=torch.float64))
