"""Configuration as frozen dataclasses that validate themselves.

A config is built from defaults, then a YAML file, then command-line flags (each
layer overriding the last); ``validate`` collects every problem and raises once.
The resolved config is written into the run folder, so a run can always be
reproduced and reloaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from kgtrace.core.errors import ConfigError, option_off
from kgtrace.core.io import atomic_write_text
from kgtrace.core.specs import model_named, model_names

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
TRAINING_MODES = ("kvsall", "kvsall-ce", "1vsall", "negative-sampling")
#: How label smoothing spreads eps (training.loss.smoothed_label_values): PyKEEN's, or the ConvE authors' code's.
SMOOTHING_STYLES = ("pykeen", "conve")
OPTIMIZERS = ("adam", "adagrad")
MAX_SEED = 2**63 - 1  # torch.manual_seed takes 64-bit seeds
DEVICES = ("auto", "cpu", "cuda")


def option(default: Any, help: str) -> Any:
    """A config field with its default and its help (the command line's, read back by `help_of`)."""
    return field(default=default, metadata={"help": help})


def help_of(cls: type, name: str) -> str:
    """The help text of field ``name`` of config dataclass ``cls`` ({models}: the registered model names)."""
    text = next(f for f in fields(cls) if f.name == name).metadata["help"]
    return text.replace("{models}", " | ".join(model_names()))


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run."""

    dataset: str = option("umls", "a registered dataset (umls, kinships, nations, fb15k237, wn18rr, hetionet; `kgtrace datasets` "
                                        "lists them) or a dataset folder")
    model: str = option("conve", "model: {models}")  # {models}: the registered names (help_of fills them in)
    model_args: dict[str, Any] = field(default_factory=dict, metadata={"help": "constructor keywords of the model"})
    epochs: int = option(100, "number of epochs")
    batch_size: int = option(128, "queries per optimizer step")
    steps_per_epoch: int = option(0, "cap each epoch at this many optimizer steps over a fresh shuffle of the "
                                     "queries (0: a full pass); for smoke runs and timings on very large graphs")
    lr: float = option(1e-3, "learning rate")
    optimizer: str = option("adam", "adam, or adagrad (LibKGE's default)")
    sparse: bool = option(False, "negative-sampling with adagrad: the embedding tables get sparse gradients, so a "
                                 "step computes and updates only the rows it read (the dense update's result, up to "
                                 "float summation order); for graphs of millions of entities")
    lr_decay: float = option(1.0, "multiply the learning rate by this after each epoch, or with lr_patience when "
                                  "validation stalls (1.0: constant)")
    lr_patience: int = option(0, "decay the learning rate only when validation MRR has not improved for more than "
                                 "this many validations (PyTorch's ReduceLROnPlateau, as LibKGE does; needs "
                                 "eval_every); 0: after every epoch")
    weight_decay: float = option(0.0, "weight decay (L2 penalty, applied by the optimizer)")
    label_smoothing: float = option(0.1, "label smoothing of the KvsAll labels (either loss; 1vsall has none)")
    label_smoothing_style: str = option("pykeen", "pykeen (positives 1 - eps, negatives eps / (E - 1)) or conve (the "
                                                  "ConvE authors' code: 1/E added to every label after scaling by "
                                                  "1 - eps)")
    training: str = option("kvsall", "kvsall (all known answers of a query are positives, binary cross-entropy per "
                                     "entity), kvsall-ce (the same answers, one softmax cross-entropy against them "
                                     "spread evenly: LibKGE's KvsAll with kl, PyKEEN's LCWA with CrossEntropyLoss), "
                                     "1vsall (softmax per triple) or negative-sampling (softmax of each triple's "
                                     "answer among it and sampled entities: LibKGE's negative_sampling with kl)")
    negatives_tail: int = option(0, "negative-sampling: entities drawn uniformly (with replacement, unfiltered) "
                                    "against each triple's tail (LibKGE's num_samples.o)")
    negatives_head: int = option(0, "negative-sampling: the same against each triple's head (num_samples.s)")
    adversarial_temperature: float = option(0.0, "negative-sampling: 0 takes the softmax of each answer among its "
                                                 "candidates; alpha > 0 RotatE's self-adversarial loss instead "
                                                 "(-log sigmoid of the answer's score, minus the drawn candidates' "
                                                 "log sigmoid of minus theirs weighted by a softmax of alpha times "
                                                 "their scores, held constant; Sun et al. 2019)")
    entity_chunk: int = option(0, "compute the KvsAll loss in entity chunks of this size to bound memory (0: off)")
    seed: int = option(0, "random seed (weights, query order, dropout)")
    device: str = option("auto", "auto (CUDA when available), cpu or cuda")
    precision: str = option("fp32", "fp32, tf32 (float32 kept, CUDA's matrix products and convolutions in TF32; CUDA "
                                    "only), bf16 (autocast) or fp16 (autocast with a gradient scaler, CUDA only)")
    checkpoint_every: int = option(5, "save a checkpoint every K epochs (the last epoch is always saved)")
    eval_every: int = option(5, "validate every K epochs (0: never)")
    patience: int = option(0, "stop after this many validations without improvement (0: never)")
    threads: int = option(0, "CPU threads for torch (0: torch's default)")
    memory_budget: str = option("2GB", "memory for ranking during validation, e.g. 2GB")
    compile: bool | None = option(None, "run the training step and validation ranking through torch.compile (same "
                                        "results as eager; counters in RUN_DIR/compile_stats.json); --no-compile runs "
                                        "eagerly; unset: on CUDA yes, unless the captured step runs (then no), on a "
                                        "CPU no (kgtrace.compute.compile.compile_default)")
    captured_step: bool | None = option(None, "run each training step as one program over examples kept on the "
                                              "device, captured once as a CUDA graph and replayed (no host work per "
                                              "step; same results as the step by step loop); on a CPU the same "
                                              "program runs uncaptured; unset: on CUDA where the settings allow it "
                                              "(adam, not fp16, not sparse, no entity_chunk)")

    def __post_init__(self) -> None:
        if isinstance(self.model, str) and self.model not in model_names() and model_named(self.model):
            object.__setattr__(self, "model", model_named(self.model))  # PyKEEN's spelling ("ConvE"): the registered
        self.validate()  # a TrainConfig cannot be built invalid

    def validate(self) -> "TrainConfig":
        """Return self, or raise ConfigError listing every invalid setting (wrong types first, all at once)."""
        problems = type_problems(self)
        if problems:  # the value checks below compare numbers: they need the right types
            raise ConfigError(problems)
        positive = ("epochs", "batch_size", "checkpoint_every")
        for name in positive:
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)}: must be at least 1")
        for name in ("steps_per_epoch", "eval_every", "patience", "lr_patience", "threads", "entity_chunk", "seed"):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)}: must be 0 or more")
        if self.seed > MAX_SEED:
            problems.append(f"seed={self.seed}: at most 2**63 - 1 (torch's seeds are 64-bit); fix: e.g. seed 0")
        if not 0 < self.lr < math.inf:
            problems.append(f"lr={self.lr}: must be a positive finite number, e.g. 0.001")
        if not 0 < self.lr_decay <= 1:
            problems.append(f"lr_decay={self.lr_decay}: must be in (0, 1]; 1.0 keeps the rate constant")
        if not 0 <= self.label_smoothing < 1:
            problems.append(f"label_smoothing={self.label_smoothing}: must be in [0, 1), e.g. 0.1")
        if not 0 <= self.weight_decay < math.inf:
            problems.append(f"weight_decay={self.weight_decay}: must be a finite number, 0 or more")
        problems += choice_problems(self, "model", model_names())
        problems += choice_problems(self, "optimizer", OPTIMIZERS)
        if self.lr_patience and not self.eval_every:
            problems.append(f"lr_patience={self.lr_patience}: counts validations, but eval_every is 0; set eval_every")
        problems += choice_problems(self, "precision", PRECISIONS)
        problems += choice_problems(self, "training", TRAINING_MODES)
        problems += choice_problems(self, "label_smoothing_style", SMOOTHING_STYLES)
        problems += choice_problems(self, "device", DEVICES)
        problems += self._negatives_problems()
        problems += self._sparse_problems()
        if self.entity_chunk and self.training != "kvsall":
            problems.append(f"entity_chunk={self.entity_chunk}: only applies to training=kvsall; set it to 0")
        if self.entity_chunk and self.precision == "fp16":
            problems.append(f"entity_chunk={self.entity_chunk}: runs its own backward passes, which the fp16 "
                            "gradient scaler cannot scale; use precision bf16 or fp32, or entity_chunk 0")
        if self.compile is not None and not isinstance(self.compile, bool):
            problems.append(f"compile={self.compile!r}: must be true or false (or unset: on CUDA only)")
        elif self.compile and self.entity_chunk:
            problems.append(f"entity_chunk={self.entity_chunk}: runs its own backward passes, which are not compiled; "
                            "set entity_chunk 0 or compile false")
        if self.captured_step is not None and not isinstance(self.captured_step, bool):
            problems.append(f"captured_step={self.captured_step!r}: must be true or false (or unset: on CUDA where "
                            "the settings allow it)")
        elif self.captured_step:
            problems += self.captured_step_problems()
        try:
            parse_size(self.memory_budget)
        except ValueError as e:
            problems.append(str(e))
        if problems:
            raise ConfigError(problems)
        return self

    def captured_step_problems(self) -> list[str]:
        """What keeps these settings from the captured step (kgtrace.training.graphed); empty: nothing."""
        fix = "set captured_step false (--no-captured-step)"
        problems = []
        if self.precision == "fp16":
            problems.append(f"precision=fp16: its gradient scaler checks the gradients on the host every step; use "
                            f"bf16 or fp32, or {fix}")
        if self.optimizer != "adam":
            problems.append(f"optimizer={self.optimizer}: torch's {self.optimizer} cannot be captured in a CUDA "
                            f"graph; use adam, or {fix}")
        if self.sparse:
            problems.append(f"sparse=true: sparse gradients change their shape every step; {fix}")
        if self.entity_chunk:
            problems.append(f"entity_chunk={self.entity_chunk}: the chunked loss runs its own backward passes; {fix}")
        return problems

    def _negatives_problems(self) -> list[str]:
        """negatives_tail/head: set with training negative-sampling (at least one side), 0 otherwise."""
        for name in ("negatives_tail", "negatives_head"):
            if getattr(self, name) < 0:
                return [f"{name}={getattr(self, name)}: must be 0 or more"]
        given = self.negatives_tail or self.negatives_head
        if self.training == "negative-sampling" and not given:
            return ["training=negative-sampling: draws no negatives; set negatives_tail and negatives_head "
                    "(--negatives-tail 256 --negatives-head 256; 0 on one side trains that side not at all)"]
        if self.training != "negative-sampling" and given:
            return [f"negatives_tail={self.negatives_tail}, negatives_head={self.negatives_head}: only apply to "
                    f"training=negative-sampling; set them to 0 (training={self.training} scores every entity)"]
        temperature = self.adversarial_temperature
        if not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
                and math.isfinite(temperature) and temperature >= 0):
            return [f"adversarial_temperature={temperature!r}: must be a number >= 0 (0: off; RotatE's recipes: 1)"]
        if temperature and self.training != "negative-sampling":
            return [f"adversarial_temperature={temperature}: weighs drawn negatives, so needs "
                    f"training=negative-sampling (training={self.training} scores every entity); set it to 0"]
        return []

    def _sparse_problems(self) -> list[str]:
        """sparse: only where a step reads a few rows, with an optimizer whose sparse update is its dense one."""
        if not self.sparse:
            return []
        problems = []
        if self.training != "negative-sampling":
            problems.append(f"sparse=true: training={self.training} scores every entity, so every row of the entity "
                            "table has a gradient; set training negative-sampling, or sparse false")
        if self.optimizer != "adagrad":
            problems.append(f"sparse=true: needs optimizer adagrad, whose update of the rows read equals its dense "
                            f"update; {self.optimizer}'s does not (torch's SparseAdam is lazy Adam: a row's moments "
                            "stand still in the steps that do not read it); set optimizer adagrad, or sparse false")
        if self.weight_decay:
            problems.append(f"sparse=true: weight_decay={self.weight_decay} changes every row at every step, which a "
                            "sparse step cannot; set weight_decay 0, or sparse false")
        if self.compile:
            problems.append(f"sparse=true: sparse gradients are not compiled; fix: {option_off('--compile')}")
        return problems

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# What a YAML value of each annotated type may be; an int is a float too (lr: 1), a bool is neither.
_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "bool | None": (bool, type(None)),
          "dict[str, Any]": (dict,)}
_EXAMPLES = {"int": "a whole number, e.g. 10", "float": "a number, e.g. 0.001", "str": "text",
             "bool": "true or false", "bool | None": "true or false (or unset)",
             "dict[str, Any]": "a mapping, e.g. {embedding_dim: 200}"}


def type_problems(config: Any) -> list[str]:
    """One line per field of a config dataclass whose value has the wrong type (``epochs: 1.5``, ``lr: "abc"``)."""
    problems = []
    for f in fields(config):
        value, allowed = getattr(config, f.name), _TYPES.get(str(f.type))
        if allowed is None:
            continue
        wrong_bool = isinstance(value, bool) and bool not in allowed
        if wrong_bool or not isinstance(value, allowed):
            problems.append(f"{f.name}={value!r}: must be {_EXAMPLES[str(f.type)]}")
    return problems


def choice_problems(config: Any, key: str, choices: tuple[str, ...]) -> list[str]:
    value = getattr(config, key)
    return [] if value in choices else [f"{key}={value!r}: must be one of {', '.join(choices)}"]


def parse_size(text: str | int) -> int:
    """'2GB', '512MB', '1.5GiB' or a byte count -> bytes (powers of 1024, as memory is counted)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"memory_budget={text!r}: not a size; write e.g. 2GB, 512MB or a byte count")
    number, unit = float(match.group(1)), (match.group(2) or "b").lower().rstrip("b").rstrip("i")
    return int(number * 1024 ** "_kmgt".index(unit or "_"))


def from_sources(cls: type, file: str | Path | None, overrides: dict[str, Any]):
    """Build ``cls`` from defaults <- YAML ``file`` <- ``overrides`` (None values skipped), validated."""
    values: dict[str, Any] = {}
    if file is not None:
        values.update(read_yaml(file))
    values.update({k: v for k, v in overrides.items() if v is not None})
    problems = unknown_keys(cls, values, f"{file}: " if file is not None else "")
    names = {f.name for f in fields(cls)}
    try:
        config = cls(**{k: v for k, v in values.items() if k in names}).validate()
    except ConfigError as e:  # name the file where a bad value came from it (problems start with "key=")
        from_file = {k for k in values if overrides.get(k) is None} if file is not None else set()
        problems += [f"{file}: {p}" if re.split("[=:]", p, maxsplit=1)[0] in from_file else p for p in e.problems]
    if problems:
        raise ConfigError(problems)
    return config


def unknown_keys(cls: type, values: dict[str, Any], where: str = "") -> list[str]:
    """One line per key of ``values`` that ``cls`` has no field for, with the closest field names."""
    known = sorted(f.name for f in fields(cls))
    problems = []
    for key in sorted(set(values) - set(known), key=str):
        close = difflib.get_close_matches(str(key), known, n=2, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else f"valid settings are {', '.join(known)}"
        problems.append(f"{where}{key}: unknown setting; {hint}")
    return problems


class _NoAliasLoader(yaml.SafeLoader):
    """yaml.safe_load's loader without aliases (``*name``): a few hundred bytes of nested aliases expand to
    gigabytes once the settings are copied or written out, and kgtrace's settings never need one."""

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(f"an alias (*{event.anchor}) at line {event.start_mark.line + 1}: settings files "
                                 "take no aliases; write the values out")
        return super().compose_node(parent, index)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"config={path}: no such file; give a YAML file of settings"])
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_NoAliasLoader) or {}
    except UnicodeDecodeError:
        raise ConfigError([f"config={path}: not UTF-8 text; give a YAML file of settings (e.g. a run's "
                           "config.yaml)"]) from None
    except yaml.YAMLError as e:
        raise ConfigError([f"config={path}: not valid YAML ({e}); fix the file's syntax"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"config={path}: must be a mapping of setting: value"])
    return data


def write_yaml(data: dict[str, Any], path: str | Path) -> None:
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
