"""The projected TracIn index: unbiased projections, error falling with dim, resumable builds, refusals."""

import json

import pytest
import torch

from kgtrace.attribution import TracIn, build_index
from kgtrace.attribution import index as index_module
from kgtrace.attribution.factors import Factors, Outer, Part, dot
from kgtrace.attribution.index import ProjectedIndex, Projector
from kgtrace.core.errors import KgtraceError
from kgtrace.runs.embedding import load_run


@pytest.fixture(scope="module")
def run(tiny_conve):
    return load_run(tiny_conve)


def test_projection_is_unbiased_and_touches_only_the_linear_input():
    """Averaged over seeds, projected inner products approach the exact ones; other blocks stay exact."""
    g = torch.Generator().manual_seed(0)
    f = Factors(3, torch.randn(3, 5, generator=g), {"entity": (torch.tensor([[0, 1], [1, 1], [2, 0]]),
                                                                torch.randn(3, 2, 4, generator=g))},
                [Outer.whole(torch.randn(2, 6, generator=g), torch.tensor([0, 1, 1]), torch.randn(3, 3, generator=g))])
    exact = dot(f, f)
    projected = [Projector(64, seed)(f) for seed in range(400)]
    mean = torch.stack([dot(p, p) for p in projected]).mean(0)
    assert ((mean - exact).abs().max() / exact.abs().max()) < 0.03
    one = projected[0]
    assert one.outer[0].parts[0].a.shape == (3, 64) and torch.equal(one.outer[0].delta, f.outer[0].delta)
    assert torch.equal(one.dense, f.dense) and one.rows is f.rows
    assert torch.equal(Projector(64, 0)(f).outer[0].parts[0].a, one.outer[0].parts[0].a)  # same seed, same map


def test_projection_of_an_input_in_parts_equals_that_of_the_whole_input():
    """An index built from whole fc inputs stays valid for queries whose factors split the input (ConvE's bands)."""
    g = torch.Generator().manual_seed(1)
    a, delta = torch.randn(4, 7, generator=g), torch.randn(4, 3, generator=g)
    heads, cols_head, cols_rest = torch.tensor([0, 1, 0, 1]), torch.tensor([0, 3, 5]), torch.tensor([1, 2, 4, 6])
    head_rows = torch.stack([a[0, cols_head], a[1, cols_head]])  # [2, 3]: the head part's distinct values
    a[2, cols_head], a[3, cols_head] = a[0, cols_head], a[1, cols_head]  # triples 0 and 2 share head 0, 1 and 3 head 1
    whole = Factors(4, outer=[Outer.whole(a, torch.arange(4), delta)])
    parts = [Part(head_rows, heads, cols_head), Part(a[:, cols_rest], torch.arange(4), cols_rest)]
    split = Factors(4, outer=[Outer(delta, parts)])
    torch.testing.assert_close(Projector(16, 3)(split).outer[0].parts[0].a, Projector(16, 3)(whole).outer[0].parts[0].a)
    torch.testing.assert_close(dot(split, split), dot(whole, whole))
    torch.testing.assert_close(dot(whole, split), dot(whole, whole))  # a whole input is cut like the parts it meets
    torch.testing.assert_close(dot(split, whole), dot(whole, whole))


def test_a_layers_bias_stays_exact_after_projection():
    """A bias riding in the outer factor is a column of ones after the projected input, not projected itself."""
    g = torch.Generator().manual_seed(2)
    a, delta = torch.randn(2, 6, generator=g), torch.randn(3, 4, generator=g)
    with_bias = Factors(3, outer=[Outer.whole(a, torch.tensor([0, 1, 1]), delta, bias=True)])
    projected = Projector(16, 5)(with_bias)
    plain = Projector(16, 5)(Factors(3, outer=[Outer.whole(a, torch.tensor([0, 1, 1]), delta)]))
    assert torch.equal(projected.outer[0].parts[0].a, torch.cat([plain.outer[0].parts[0].a, torch.ones(3, 1)], dim=1))
    bias_part = delta @ delta.T  # what the bias adds to every inner product, exactly
    torch.testing.assert_close(dot(projected, projected), dot(plain, plain) + bias_part)


def test_index_approximates_exact_influence_better_with_more_dims(run, tmp_path):
    test = run.dataset.test[:20]
    exact = TracIn(run).influence(test)
    errors = []
    for dim in (32, 2048):
        index = build_index(run, tmp_path / f"d{dim}", dim=dim, dtype="float32")
        approx = index.influence(test)
        assert approx.shape == exact.shape
        errors.append(((approx - exact).norm() / exact.norm()).item())
    assert errors[1] < errors[0] / 3 and errors[1] < 0.2
    top = index.top_k(test, k=3)
    full = index.influence(test)
    torch.testing.assert_close(top[0].proponent_influence, torch.topk(full[0], 3).values)


def test_killed_build_resumes_and_incomplete_index_is_refused(run, tmp_path, monkeypatch):
    folder = tmp_path / "index"
    monkeypatch.setattr(index_module, "SAVE_EVERY_S", 0.0)
    real = TracIn._factorise
    calls = {"n": 0}

    def dying(self, model, triples):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(self, model, triples)

    monkeypatch.setattr(TracIn, "_factorise", dying)
    with pytest.raises(KeyboardInterrupt):
        build_index(run, folder, dim=64, chunk_size=400)
    assert not (folder / "index.json").exists()
    with pytest.raises(KgtraceError, match="not a complete TracIn index"):
        ProjectedIndex(folder, run)
    progress = json.loads((folder / "progress.json").read_text())
    assert progress["chunks"] == {"1": 4}  # nations has 1,592 training triples: four chunks of the first checkpoint
    calls["n"] = 0
    monkeypatch.setattr(TracIn, "_factorise", lambda self, m, t: calls.__setitem__("n", calls["n"] + 1) or real(self, m, t))
    resumed = build_index(run, folder, dim=64, chunk_size=400)
    assert calls["n"] == 4  # only the second checkpoint's chunks were left
    monkeypatch.setattr(TracIn, "_factorise", real)
    fresh = build_index(run, tmp_path / "fresh", dim=64, chunk_size=400)
    test = run.dataset.test[:5]
    torch.testing.assert_close(resumed.influence(test), fresh.influence(test))
    with pytest.raises(KgtraceError, match="already holds a complete index"):
        build_index(run, folder, dim=64)
    meta = json.loads((folder / "index.json").read_text())
    del meta["layout"]  # as an earlier kgtrace wrote it
    (folder / "index.json").write_text(json.dumps(meta))
    with pytest.raises(KgtraceError, match="built by an earlier kgtrace.*build it again"):
        ProjectedIndex(folder, run)
