"""An attribution method is one MethodSpec: registering a toy one offers it in explain, faithfulness and the LDS."""

from __future__ import annotations

import json

import pytest
import torch

from kgtrace.attribution.methods import (
    METHOD_SPECS,
    AttributionInputs,
    MethodSpec,
    explain_methods,
    lds_methods,
    method_note,
    register,
    removal_tops,
)
from kgtrace.cli import build_parser, main
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import ConfigError
from kgtrace.faithfulness.experiment import FaithfulnessSettings
from kgtrace.faithfulness.lds import LdsSettings
from kgtrace.faithfulness.removals import removal_methods
from kgtrace.training.loop import train


def same_relation(run, predictions, inputs):
    """1 for a training triple with the prediction's relation, else 0."""
    train_relations = run.dataset.train[:, 1]
    return torch.stack([(train_relations == r).double() for r in predictions[:, 1]])


TOY = MethodSpec("same-relation", same_relation, "Same relation", "1 for a training triple with the prediction's "
                 "relation", checkpoints="none", explain=True, lds=True, removal=True)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(METHOD_SPECS, TOY.name, TOY)  # gone again after the test
    return TOY


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("specs") / "run"
    config = TrainConfig(dataset="nations", model="distmult", model_args={"embedding_dim": 4}, epochs=2,
                         checkpoint_every=1, eval_every=0, threads=1, device="cpu")
    train(config, out, progress=False, log=lambda *_: None)
    return out


def test_a_registered_method_is_offered_everywhere(toy, small_run, tmp_path, capsys):
    assert "same-relation" in explain_methods() and "same-relation" in lds_methods()
    assert "same-relation" in removal_tops() and "same-relation" in removal_methods()
    assert "same-relation" in _explain_help()
    assert "same-relation" in LdsSettings().methods
    FaithfulnessSettings(methods=("same-relation",))  # a valid removal method
    assert method_note("same-relation") == ("Same relation", "1 for a training triple with the prediction's relation")
    out = tmp_path / "explained.json"
    assert main(["explain", str(small_run), "--test", "2", "--method", "same-relation", "--top-k", "3",
                 "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Same relation (--method same-relation): 1 for a training triple with the prediction's relation" in printed
    saved = json.loads(out.read_text())
    items = saved if isinstance(saved, list) else saved["explanations"]
    assert items[0]["method"] == "same-relation"
    assert {p["relation"] for p in items[0]["proponents"]} == {items[0]["test"]["relation"]}


def _explain_help() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["explain"].format_help()


def test_a_method_is_registered_once_and_needs_a_way_to_compute():
    with pytest.raises(ValueError, match="registered already"):
        register(METHOD_SPECS["trak"])
    with pytest.raises(ValueError, match="needs compute"):
        register(MethodSpec("nothing", None, "Nothing", "nothing"))


def test_every_method_says_what_its_values_are_and_which_checkpoints_it_reads():
    for name, spec in METHOD_SPECS.items():
        assert spec.name == name and spec.title and spec.meaning and spec.checkpoints in ("all", "last", "none")
        assert set(spec.reads) <= {"seed", "progress", "damping", "trak_dim", "trak_ridge"}
    assert explain_methods()[0] == "tracin" and METHOD_SPECS["tracin"].streaming


def test_attribution_inputs_cannot_be_built_invalid():
    with pytest.raises(ConfigError) as error:
        AttributionInputs(seed=-1, damping=0.0, trak_dim=0, trak_ridge=float("inf"))
    assert len(error.value.problems) == 4


def test_the_docs_table_of_methods_is_the_specs():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "tracin.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")
            and line.split("|")[1].strip().strip("`") in METHOD_SPECS]
    expected = []
    for name, spec in METHOD_SPECS.items():
        offered = ", ".join(k for k, v in (("explain", spec.explain), ("LDS", spec.lds), ("removal", spec.removal)) if v)
        expected.append(f"| `{name}` | {spec.title} | {spec.checkpoints} | {', '.join(spec.reads) or '-'} | "
                        f"{offered or '-'} |")
    assert rows == expected
