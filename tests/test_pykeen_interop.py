"""PyKEEN interop: PyKEEN-trained models imported as kgtrace runs, and kgtrace runs exported to PyKEEN.

PyKEEN trains on kgtrace's bundled UMLS split, with its own (shuffled) id maps so that every
import has to re-map labels. Scores are compared through PyKEEN's public predict_t / predict_h
(its score_t takes internal relation ids, 2r with inverse triples).

PyKEEN is an optional extra (`pip install -e .[pykeen]`); CI installs it, so these tests run there.
"""

import copy
import json
import os
import pickle
import random
import shutil

import numpy as np
import pytest
import torch

pykeen = pytest.importorskip("pykeen", reason="PyKEEN is not installed: pip install -e '.[pykeen]'")

from pykeen.models import HolE, model_resolver  # noqa: E402
from pykeen.pipeline import pipeline  # noqa: E402
from pykeen.triples import TriplesFactory  # noqa: E402

import kgtrace  # noqa: E402
from kgtrace.cli import main  # noqa: E402
from kgtrace.core.errors import ConfigError  # noqa: E402
from kgtrace.data.dataset import load_dataset  # noqa: E402
from kgtrace.interop import pykeen as layout  # noqa: E402
from kgtrace.interop.pykeen_export import export_pykeen as kgtrace_export  # noqa: E402
from kgtrace.interop.pykeen_export import full_args  # noqa: E402
from kgtrace.interop.pykeen_import import hyperparameters  # noqa: E402
from kgtrace.interop.safe_load import Opaque, UnsafeFileError, load_weights_only  # noqa: E402

LR = 0.003
METRICS = {"mrr": "inverse_harmonic_mean_rank", "mr": "arithmetic_mean_rank", "hits_at_1": "hits_at_1",
           "hits_at_3": "hits_at_3", "hits_at_10": "hits_at_10"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def umls():
    return load_dataset("umls")


@pytest.fixture(scope="module")
def maps(umls):
    """PyKEEN's id maps: UMLS's labels in another order than kgtrace's."""
    entities, relations = list(umls.entities.labels), list(umls.relations.labels)
    random.Random(0).shuffle(entities)
    relations.reverse()
    return {label: i for i, label in enumerate(entities)}, {label: i for i, label in enumerate(relations)}


def factory(umls, maps, split, inverse):
    """A PyKEEN TriplesFactory of a kgtrace split, in PyKEEN's ids."""
    e2i, r2i = maps
    entity = torch.tensor([e2i[label] for label in umls.entities.labels])
    relation = torch.tensor([r2i[label] for label in umls.relations.labels])
    t = getattr(umls, split)
    mapped = torch.stack([entity[t[:, 0]], relation[t[:, 1]], entity[t[:, 2]]], dim=1)
    return TriplesFactory(mapped_triples=mapped, entity_to_id=e2i, relation_to_id=r2i, create_inverse_triples=inverse)


def train(umls, maps, model, model_kwargs, epochs, inverse, **training):
    splits = {name: factory(umls, maps, split, inverse)
              for name, split in (("training", "train"), ("validation", "valid"), ("testing", "test"))}
    # device: PyKEEN trains on a GPU when it sees one, and the scores are compared with runs loaded on the CPU.
    return pipeline(**splits, model=model, model_kwargs=model_kwargs, training_loop="lcwa", optimizer_kwargs={"lr": LR},
                    random_seed=0, device="cpu", training_kwargs={"num_epochs": epochs, "batch_size": 512, **training},
                    evaluation_kwargs={"batch_size": 512}, use_tqdm=False)


def checkpoint_kwargs(folder, loop=True, series=True):
    kwargs = {}
    if loop:  # the training loop's own checkpoint: overwritten every epoch; has optimizer (lr), epoch, id maps
        kwargs.update(checkpoint_name="loop.pt", checkpoint_directory=str(folder), checkpoint_frequency=0)
    if series:  # one weights-only file per epoch
        kwargs.update(callbacks="checkpoint", callbacks_kwargs={
            "schedule": "every", "schedule_kwargs": {"frequency": 1}, "root": str(folder)})
    return kwargs


@pytest.fixture(scope="module")
def conve(umls, maps, tmp_path_factory):
    """ConvE, 3 epochs: pipeline folder + a series of callback checkpoints + the loop checkpoint."""
    folder = tmp_path_factory.mktemp("pykeen-conve")
    result = train(umls, maps, "ConvE", {"embedding_dim": 32, "embedding_height": 4, "output_channels": 4}, 3, True,
                   **checkpoint_kwargs(folder / "checkpoints"))
    result.save_to_directory(folder / "pipeline")
    return folder, result


@pytest.fixture(scope="module")
def conve_run(conve, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "conve"
    assert main(["import-pykeen", str(conve[0]), "--out", str(out), "--dataset", "umls"]) == 0
    return out


@pytest.fixture(scope="module")
def distmult(umls, maps, tmp_path_factory):
    """DistMult, 2 epochs, the pipeline folder only: its weights are in trained_model.pkl."""
    folder = tmp_path_factory.mktemp("pykeen-distmult")
    result = train(umls, maps, "DistMult", {"embedding_dim": 16}, 2, False)
    result.save_to_directory(folder)
    return folder, result


@pytest.fixture(scope="module")
def complex_(umls, maps, tmp_path_factory):
    """ComplEx, 2 epochs as two pipeline calls resuming one loop checkpoint, a copy kept after each."""
    folder = tmp_path_factory.mktemp("pykeen-complex")
    for epochs in (1, 2):
        result = train(umls, maps, "ComplEx", {"embedding_dim": 16}, epochs, False,
                       **checkpoint_kwargs(folder / "live", series=False))
        shutil.copy(folder / "live" / "loop.pt", folder / f"loop-epoch{epochs}.pt")
    return folder, result


def pykeen_at(model, path):
    """A copy of PyKEEN ``model`` with the weights of a PyKEEN checkpoint file (ours, so trusted)."""
    data = torch.load(path, weights_only=False)
    model = copy.deepcopy(model)
    model.load_state_dict(data.get("model_state_dict") or data["state_dict"])
    return model.eval()


def assert_same_scores(run_model, pykeen_model, triples):
    """Every triple's tail row and head row of scores agree to 1e-5."""
    with torch.no_grad():
        pykeen_model.eval()
        torch.testing.assert_close(run_model.score_t(triples[:, :2]), pykeen_model.predict_t(triples[:, :2]),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(run_model.score_h(triples[:, 1:]), pykeen_model.predict_h(triples[:, 1:]),
                                   atol=1e-5, rtol=0)


def labels(ds, triples):
    return [(ds.entity_label(h), ds.relation_label(r), ds.entity_label(t)) for h, r, t in triples.tolist()]


# ----------------------------------------------------------------------------- ConvE: the whole path


def test_conve_import_keeps_pykeen_ids_and_scores(conve, conve_run, umls):
    folder, result = conve
    run = kgtrace.load_run(conve_run)
    assert labels(run.dataset, run.dataset.test) == labels(umls, umls.test)  # re-mapped through labels
    assert run.dataset.entities.labels == tuple(result.training.entity_id_to_label[i] for i in range(umls.num_entities))
    assert_same_scores(run.model, result.model, run.dataset.test)
    assert [(c.epoch, c.lr) for c in run.checkpoints] == [(1, LR), (2, LR), (3, LR)]
    # PyKEEN 1.11's callback names the file of epoch e checkpoint_{e+1}: each epoch holds its own weights.
    for info in run.checkpoints:
        model = kgtrace.load_run(conve_run, info.path).model
        assert_same_scores(model, pykeen_at(result.model, folder / "checkpoints" / f"checkpoint_{info.epoch + 1:07d}.pt"),
                           run.dataset.test[:50])
    provenance = json.loads((conve_run / "pykeen_import.json").read_text())
    assert provenance["hyperparameters"]["embedding_height"] == {"value": 4, "from": "the weights' shapes"}
    assert [json.loads(line)["loss"] for line in (conve_run / "metrics.jsonl").read_text().splitlines()] == result.losses


def test_conve_evaluate_equals_pykeen_metrics(conve, conve_run, tmp_path):
    out = tmp_path / "metrics.json"
    assert main(["evaluate", str(conve_run), "--out", str(out)]) == 0
    ours = json.loads(out.read_text())
    theirs = conve[1].metric_results  # the pipeline's filtered evaluation on test (train and valid filtered too)
    for side in ("head", "tail", "both"):
        for tie in ("realistic", "optimistic", "pessimistic"):
            for metric, name in METRICS.items():
                assert ours[side][tie][metric] == pytest.approx(theirs.get_metric(f"{side}.{tie}.{name}"),
                                                                rel=1e-6, abs=1e-6), (side, tie, metric)


@pytest.mark.timeout(900)  # compiles or trains several runs: minutes on a loaded 2-core machine
def test_conve_explain_runs_on_the_import(conve_run, umls, tmp_path):
    head, relation, tail = labels(umls, umls.test[:1])[0]
    out = tmp_path / "explain.json"
    assert main(["explain", str(conve_run), "--triple", head, relation, tail, "--top-k", "3", "--device", "cpu",
                 "--method", "tracin", "--no-progress", "--out", str(out)]) == 0
    assert len(json.loads(out.read_text())["explanations"][0]["proponents"]) == 3


def test_callback_series_alone_takes_pykeen_naming(conve, tmp_path):
    """Without a loop checkpoint to measure the file numbers against, checkpoint_{e+1} is epoch e."""
    folder, result = conve
    files = sorted(str(p) for p in (folder / "checkpoints").glob("checkpoint_*.pt"))
    out = tmp_path / "run"
    assert main(["import-pykeen", str(folder / "pipeline"), *files, "--out", str(out), "--lr", str(LR)]) == 0
    run = kgtrace.load_run(out)
    assert [(c.epoch, c.lr) for c in run.checkpoints] == [(1, LR), (2, LR), (3, LR)]
    assert_same_scores(run.model, result.model, run.dataset.train[:100])
    notes = json.loads((out / "pykeen_import.json").read_text())["notes"]
    assert any("epoch n - 1" in n for n in notes) and any("trained_model.pkl was not read" in n for n in notes)


def test_run_written_inside_the_source_is_not_read_back(conve, tmp_path):
    source = shutil.copytree(conve[0], tmp_path / "pykeen")
    for _ in range(2):  # the second import finds the first's run inside the source, and skips it
        assert main(["import-pykeen", str(source), "--out", str(source / "run"), "--dataset", "umls", "--overwrite"]) == 0


def test_imported_run_cannot_be_resumed(conve_run, capsys):
    assert main(["train", "--resume", "--out", str(conve_run), "--epochs", "4"]) == 2
    assert "holds weights only" in capsys.readouterr().err


# ----------------------------------------------------------------------------- DistMult: the pickle


def test_pickle_needs_trust(distmult, tmp_path, capsys):
    assert main(["import-pykeen", str(distmult[0]), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--trust-pickle" in err and "trained_model.pkl" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_distmult_from_trusted_pickle_without_dataset(distmult, umls, tmp_path):
    folder, result = distmult
    out = tmp_path / "run"
    assert main(["import-pykeen", str(folder), "--out", str(out), "--trust-pickle", "--lr", str(LR)]) == 0
    run = kgtrace.load_run(out)
    assert run.config.model == "distmult" and [(c.epoch, c.lr) for c in run.checkpoints] == [(2, LR)]
    assert sorted(labels(run.dataset, run.dataset.train)) == sorted(labels(umls, umls.train))  # PyKEEN's triples
    assert len(run.dataset.test) == 0
    test = torch.tensor([[run.dataset.entities.to_id[h], run.dataset.relations.to_id[r], run.dataset.entities.to_id[t]]
                         for h, r, t in labels(umls, umls.test)])
    assert_same_scores(run.model, result.model, test)


# ----------------------------------------------------------------------------- ComplEx: a series of loop checkpoints


def test_complex_from_loop_checkpoints(complex_, umls, tmp_path):
    folder, result = complex_
    out = tmp_path / "run"
    sources = [str(folder / "loop-epoch1.pt"), str(folder / "loop-epoch2.pt")]
    assert main(["import-pykeen", *sources, "--out", str(out), "--dataset", "umls"]) == 0
    run = kgtrace.load_run(out)
    assert run.config.model == "complex" and [(c.epoch, c.lr) for c in run.checkpoints] == [(1, LR), (2, LR)]
    assert_same_scores(run.model, result.model, run.dataset.test)
    first = kgtrace.load_run(out, run.checkpoints[0].path).model
    assert_same_scores(first, pykeen_at(result.model, folder / "loop-epoch1.pt"), run.dataset.test)


# ----------------------------------------------------------------------------- export


def load_in_pykeen(folder):
    """What the README tells a PyKEEN user to do with an export."""
    config = json.loads((folder / "config.json").read_text())
    training = TriplesFactory.from_path_binary(folder / "training_triples")
    model = model_resolver.make(config["model"], config["model_kwargs"], triples_factory=training)
    model.load_state_dict(torch.load(folder / "model_state.pt", weights_only=True)["state_dict"])
    return model.eval()


@pytest.fixture(scope="module")
def kgtrace_run(tmp_path_factory):
    """A ConvE trained by kgtrace, 2 epochs with a checkpoint each."""
    out = tmp_path_factory.mktemp("runs") / "trained"
    config = kgtrace.TrainConfig(dataset="umls", model="conve", epochs=2, eval_every=0, checkpoint_every=1,
                                 model_args={"embedding_dim": 32, "embedding_height": 4, "output_channels": 4})
    kgtrace.train(config, out, progress=False, log=lambda *_: None)
    return out


def test_export_loads_in_pykeen_and_imports_back(kgtrace_run, tmp_path):
    folder = tmp_path / "export"
    assert main(["export-pykeen", str(kgtrace_run), "--out", str(folder)]) == 0
    run = kgtrace.load_run(kgtrace_run)
    assert_same_scores(run.model, load_in_pykeen(folder), run.dataset.test)
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["checkpoint_0000001.pt", "checkpoint_0000002.pt"]
    back = tmp_path / "back"  # no --dataset: the export's own training, validation and testing triples
    assert main(["import-pykeen", str(folder), "--out", str(back)]) == 0
    again = kgtrace.load_run(back)
    assert [(c.epoch, c.lr) for c in again.checkpoints] == [(c.epoch, c.lr) for c in run.checkpoints]
    assert again.config.model_args == {**layout.PYKEEN_CONVE_DROPOUTS, **again.config.model_args}  # from config.json
    assert labels(again.dataset, again.dataset.test) == labels(run.dataset, run.dataset.test)
    with torch.no_grad():
        torch.testing.assert_close(again.model.score_t(again.dataset.test[:, :2]), run.model.score_t(run.dataset.test[:, :2]))
    assert main(["evaluate", str(back), "--out", str(tmp_path / "m.json")]) == 0


@pytest.mark.parametrize("model", ["distmult", "complex"])
def test_export_of_other_models(model, distmult, complex_, tmp_path):
    folder, result = {"distmult": distmult, "complex": complex_}[model]
    run_dir, export = tmp_path / "run", tmp_path / "export"
    sources = [str(folder), "--trust-pickle", "--lr", str(LR)] if model == "distmult" else [
        str(folder / "loop-epoch2.pt"), "--dataset", "umls"]
    assert main(["import-pykeen", *sources, "--out", str(run_dir)]) == 0
    assert main(["export-pykeen", str(run_dir), "--out", str(export)]) == 0
    run = kgtrace.load_run(run_dir)
    assert_same_scores(run.model, load_in_pykeen(export), run.dataset.train[:200])
    assert_same_scores(run.model, result.model, run.dataset.train[:200])


def test_inverse_relations_export_and_import_back(tmp_path):
    """A DistMult with its own inverse relations exports as PyKEEN's with inverse triples and comes back as one."""
    run_dir, export, back = tmp_path / "run", tmp_path / "export", tmp_path / "back"
    config = kgtrace.TrainConfig(dataset="umls", model="distmult", epochs=1, eval_every=0, threads=1, device="cpu",
                                 model_args={"embedding_dim": 8, "inverse_relations": True, "entity_dropout": 0.1})
    kgtrace.train(config, run_dir, progress=False, log=lambda *_: None)
    assert main(["export-pykeen", str(run_dir), "--out", str(export)]) == 0
    run = kgtrace.load_run(run_dir)
    assert json.loads((export / "config.json").read_text())["create_inverse_triples"] is True
    assert_same_scores(run.model, load_in_pykeen(export), run.dataset.test[:200])
    assert main(["import-pykeen", str(export), "--out", str(back)]) == 0
    again = kgtrace.load_run(back)
    assert again.config.model_args["inverse_relations"] is True
    with torch.no_grad():
        torch.testing.assert_close(again.model.score_h(run.dataset.test[:, 1:]), run.model.score_h(run.dataset.test[:, 1:]))


@pytest.mark.parametrize("name, args", [("conve", {"embedding_dim": 20, "embedding_height": 5, "output_channels": 3}),
                                        ("conve", {"embedding_dim": 20, "embedding_height": 2, "kernel_width": 5,
                                                   "apply_batch_normalization": False}),
                                        ("distmult", {"embedding_dim": 6}), ("complex", {"embedding_dim": 6}),
                                        ("transe", {"embedding_dim": 6}), ("transe", {"embedding_dim": 6, "scoring_norm": 2}),
                                        ("rotate", {"embedding_dim": 6, "margin": 0.0, "scoring_norm": 2}),
                                        ("tucker", {"embedding_dim": 6, "relation_dim": 4}),
                                        ("tucker", {"embedding_dim": 6, "relation_dim": 4, "batch_norm": False}),
                                        ("rescal", {"embedding_dim": 4})])
def test_layouts_round_trip(name, args, umls, maps):
    """kgtrace -> PyKEEN state dict scores alike, is recognised (where its keys tell it apart), and converts back to
    the same weights; the hyperparameters read back from it are the model's."""
    torch.manual_seed(0)
    ours = kgtrace.build_model(name, umls.num_entities, umls.num_relations, **args).eval()
    with torch.no_grad():
        for key, tensor in ours.state_dict().items():  # non-trivial biases and batch-norm statistics too
            if key.endswith("running_var"):
                tensor.uniform_(0.5, 1.5)
            elif tensor.is_floating_point():
                tensor.uniform_(-0.3, 0.3)
    pykeen_args = layout.pykeen_model_kwargs(name, full_args(name, args))
    inverse = layout.has_inverse_relations(name, args)
    theirs = model_resolver.make(layout.PYKEEN_NAMES[name], pykeen_args, random_seed=0,
                                 triples_factory=factory(umls, maps, "train", inverse))
    state = layout.pykeen_state_dict(ours, theirs.state_dict())
    theirs.load_state_dict(state)
    assert_same_scores(ours, theirs, umls.test[:20])
    told_apart = bool(layout.layout_of(name).marker)
    assert layout.recognise(state) == (name if told_apart else None) and not layout.check_keys(name, state)
    back = layout.kgtrace_state_dict(name, state, inverse=inverse and name != "conve")
    for key, value in ours.state_dict().items():  # RotatE's angles come back through atan2: to float rounding
        torch.testing.assert_close(back[key], value, rtol=0, atol=1e-6 if name == "rotate" else 0)
    # H = 5 and H = 2 fit the first ConvE's shapes alike (so its height must be given); the second's fits one.
    given = {"embedding_height": 5} if args.get("embedding_height") == 5 else {}
    recovered = hyperparameters(name, state, None, given)[0]
    full = full_args(name, args)
    assert recovered == {key: full[key] for key in recovered}
    if name == "conve":
        assert recovered == {**recovered, **pykeen_args}


@pytest.mark.parametrize("model, args", [("tucker", {"embedding_dim": 8, "relation_dim": 4}),
                                         ("rotate", {"embedding_dim": 8, "margin": 0.0, "scoring_norm": 2}),
                                         ("transe", {"embedding_dim": 8}), ("rescal", {"embedding_dim": 4})])
def test_new_models_export_to_pykeen_and_import_back(model, args, tmp_path):
    run_dir, export, back = tmp_path / "run", tmp_path / "export", tmp_path / "back"
    config = kgtrace.TrainConfig(dataset="umls", model=model, epochs=1, eval_every=0, threads=1, device="cpu",
                                 model_args=args)
    kgtrace.train(config, run_dir, progress=False, log=lambda *_: None)
    assert main(["export-pykeen", str(run_dir), "--out", str(export)]) == 0
    run = kgtrace.load_run(run_dir)
    assert_same_scores(run.model, load_in_pykeen(export), run.dataset.test[:100])
    assert main(["import-pykeen", str(export), "--out", str(back)]) == 0
    again = kgtrace.load_run(back)
    assert {k: again.config.model_args[k] for k in args} == args  # the shapes, the config's kwargs, PyKEEN's scoring
    with torch.no_grad():
        torch.testing.assert_close(again.model.score_h(run.dataset.test[:, 1:]), run.model.score_h(run.dataset.test[:, 1:]))


def test_export_refuses_what_pykeen_cannot_score(tmp_path):
    """A TransE with a margin scores differently in PyKEEN (which has none): export says so instead of writing."""
    run_dir = tmp_path / "run"
    config = kgtrace.TrainConfig(dataset="umls", model="transe", epochs=1, eval_every=0, threads=1, device="cpu",
                                 model_args={"embedding_dim": 8, "margin": 2.0})
    kgtrace.train(config, run_dir, progress=False, log=lambda *_: None)
    with pytest.raises(ConfigError, match="margin=2.0: PyKEEN's TransE scores as margin=0.0"):
        kgtrace_export(run_dir, tmp_path / "export")


# ----------------------------------------------------------------------------- bad input


def test_missing_source_and_busy_out(conve, conve_run, tmp_path, capsys):
    assert main(["import-pykeen", str(tmp_path / "nope"), "--out", str(tmp_path / "run")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["import-pykeen", str(conve[0]), "--out", str(conve_run), "--dataset", "umls"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_unknown_model_class(umls, maps, tmp_path, capsys):
    model = HolE(triples_factory=factory(umls, maps, "train", False), embedding_dim=8, random_seed=0)
    torch.save(model, tmp_path / "trained_model.pkl")
    assert main(["import-pykeen", str(tmp_path), "--out", str(tmp_path / "run"), "--trust-pickle"]) == 2
    assert "HolE" in capsys.readouterr().err
    # Without the pickle the weights alone do not say HolE; their key set is refused when foreign.
    state = dict(model.state_dict(), **{"relation_representations.1._embeddings.weight": torch.zeros(2, 8)})
    torch.save({"state_dict": state, "version": 1}, tmp_path / "checkpoint_0000002.pt")
    os.remove(tmp_path / "trained_model.pkl")
    assert main(["import-pykeen", str(tmp_path), "--out", str(tmp_path / "run"), "--lr", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "not a PyKEEN ConvE, DistMult, ComplEx, TransE, RotatE, TuckER, RESCAL" in err and "Traceback" not in err


@pytest.mark.parametrize("model, kwargs, inverse", [("TransE", {"embedding_dim": 8, "scoring_fct_norm": 2}, False),
                                                    ("RotatE", {"embedding_dim": 8}, False),
                                                    ("TuckER", {"embedding_dim": 8, "relation_dim": 4}, True),
                                                    ("RESCAL", {"embedding_dim": 6}, False)])
def test_pykeen_trained_models_of_the_new_kinds_import_and_explain(model, kwargs, inverse, umls, maps, tmp_path):
    """A model PyKEEN trained (one epoch of its pipeline) imports from its pickle with PyKEEN's label maps and
    settings, scores as PyKEEN does, and kgtrace explains a prediction of it."""
    result = train(umls, maps, model, kwargs, 1, inverse)
    result.save_to_directory(tmp_path / "pykeen")
    out = tmp_path / "run"
    assert main(["import-pykeen", str(tmp_path / "pykeen"), "--out", str(out), "--trust-pickle", "--lr", str(LR),
                 "--dataset", "umls"]) == 0
    run = kgtrace.load_run(out)
    assert run.config.model == model.lower()
    if model == "TransE":  # read from the object: PyKEEN's p
        assert run.config.model_args["scoring_norm"] == 2 and run.config.model_args["margin"] == 0.0
    test = torch.tensor([[run.dataset.entities.to_id[h], run.dataset.relations.to_id[r], run.dataset.entities.to_id[t]]
                         for h, r, t in labels(umls, umls.test[:100])])
    assert_same_scores(run.model, result.model, test)
    explained = kgtrace.explain(run, test[:1], method="tracin", top_k=3)
    assert len(explained) == 1 and explained[0].proponents


def test_dataset_with_other_labels_is_refused(conve, tmp_path, capsys):
    assert main(["import-pykeen", str(conve[0]), "--out", str(tmp_path / "run"), "--dataset", "nations"]) == 2
    err = capsys.readouterr().err
    assert "entity label(s) of the dataset are not in PyKEEN's entity_to_id" in err and "'brazil'" in err


def test_ambiguous_conve_height_asks_for_it():
    theirs = model_resolver.make("ConvE", {"embedding_dim": 64, "output_channels": 2}, random_seed=0,
                                 triples_factory=TriplesFactory.from_labeled_triples(
                                     np.array([["a", "r", "b"]]), create_inverse_triples=True))
    state = theirs.state_dict()
    assert layout.conve_heights(state) == [4, 8]
    with pytest.raises(ConfigError, match=r"fit \[4, 8\]"):
        hyperparameters("conve", state, None, {})
    assert hyperparameters("conve", state, None, {"embedding_height": 8})[0]["embedding_height"] == 8


# ----------------------------------------------------------------------------- reading pickles safely


class Payload:
    """Unpickling it would create a file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_protocol_5_files_load_as_saved_without_running_code(tmp_path):
    value = {"t": torch.randn(3, 2), "p": torch.nn.Parameter(torch.ones(2)), "s": "é" * 300, "b": b"\x00\xff",
             "nested": [(1, 2.5, None, True), {"k": torch.arange(4)}], "big": 2 ** 70,
             "np": np.random.RandomState(0).get_state()}
    torch.save(value, tmp_path / "p5.pt", pickle_protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "p5.pt", weights_only=True)  # why the transcoding is needed
    got = load_weights_only(tmp_path / "p5.pt")
    assert torch.equal(got["t"], value["t"]) and torch.equal(got["p"], value["p"]) and got["s"] == value["s"]
    assert got["b"] == value["b"] and got["big"] == value["big"] and got["nested"][0] == value["nested"][0]
    assert torch.equal(got["nested"][1]["k"], value["nested"][1]["k"])
    assert isinstance(got["np"][1], Opaque)  # numpy's array is not rebuilt: no numpy code runs

    marker = tmp_path / "marker"
    torch.save({"x": Payload(str(marker))}, tmp_path / "evil.pt", pickle_protocol=pickle.HIGHEST_PROTOCOL)
    try:
        load_weights_only(tmp_path / "evil.pt")
    except UnsafeFileError:
        pass
    assert not marker.exists()


# The table models' own inverse relations (E entities, R relations, random triples).
E, R = 23, 4


def random_triples(n):
    gen = torch.Generator().manual_seed(0)
    return torch.stack([torch.randint(0, E, (n,), generator=gen), torch.randint(0, R, (n,), generator=gen),
                        torch.randint(0, E, (n,), generator=gen)], dim=1)


@pytest.mark.parametrize("name", ["distmult", "complex", "transe", "rotate", "rescal"])
def test_pykeen_layouts_with_inverse_relations_round_trip(name):
    """PyKEEN's model created with inverse triples scores as ours (both directions), and its weights map back."""
    torch.manual_seed(0)
    implied = dict(layout.layout_of(name).implied)  # RotatE as PyKEEN scores it: no margin, the Euclidean norm
    ours = kgtrace.build_model(name, E, R, embedding_dim=4, inverse_relations=True, **implied).eval()
    factory = TriplesFactory(mapped_triples=random_triples(30), num_entities=E, num_relations=R,
                             entity_to_id={str(i): i for i in range(E)}, relation_to_id={str(i): i for i in range(R)},
                             create_inverse_triples=True)
    theirs = model_resolver.make(layout.PYKEEN_NAMES[name], {"embedding_dim": 4}, triples_factory=factory,
                                 random_seed=0)
    theirs.load_state_dict(layout.pykeen_state_dict(ours, theirs.state_dict()))
    theirs.eval()
    hrt = random_triples(9)
    with torch.no_grad():
        torch.testing.assert_close(theirs.predict_t(hrt[:, :2]), ours.score_t(hrt[:, :2]))
        torch.testing.assert_close(theirs.predict_h(hrt[:, 1:]), ours.score_h(hrt[:, 1:]))
    back = layout.kgtrace_state_dict(name, theirs.state_dict(), inverse=True)
    for key, value in ours.state_dict().items():
        torch.testing.assert_close(back[key], value, rtol=0, atol=1e-6)
