"""``kgtrace doctor [RUN_DIR]``: check every compiled entry point before relying on it.

Each entry point is built as the commands build it (the same functions, model, batch sizes,
device and compile mode), from the run's configuration; without RUN_DIR, from a small ConvE
trained for one epoch on the bundled UMLS in a temporary folder:

* ``rank_side``: all-entity ranking of the validation split, as ``train --compile`` validates
  (its batch from the run's memory budget; ``evaluate --compile`` ranks the test split with
  the same function);
* ``train_kvsall`` / ``train_1vsall``: the training step (``train --compile``) at the run's
  batch size and at the epoch's remainder, which gets its own call (training never pads:
  `kgtrace.training.compiled`);
* TracIn's gradient functions for the run's model (``explain --compile``, path auto, params last);
* ``captured_step``: the whole training step captured as a CUDA graph (`kgtrace.training.graphed`,
  ``train --captured-step``, with the run's ``compile``): CAPTURED_EPOCHS epochs of CAPTURED_STEPS
  steps from the run's weights, against the step by step loop from the same weights and random
  state; it fails when an epoch's loss differs by more than 1e-4 relative, the parameters after them
  by more than PARAMETER_TOLERANCE (norm of the difference over the norm), its compiled loss
  recompiled, or (on CUDA) a step after the warm-ups ran without its graph. On a CPU the same program
  runs uncaptured.

Each is called again and again with fresh values: the row-independent ones with a full
batch, a padded last chunk (1 and batch - 1 rows) and more than a batch; the training calls
at their sizes. Calls of all entry points are interleaved, as in a command that calls several
compiled graphs in one step. A row of the table fails when:

* parity: a call's outputs differ from the eager function's on the same inputs (losses and
  factors by more than 1e-4 relative to the largest value; ranks as `rank_parity`:
  ``num_candidates`` and ``nonfinite`` exactly, ``greater`` and ``equal`` by no more than the
  row's candidates whose eager score lies within 1e-4 x the row's largest |score| of the true
  answer's score, which rounding alone can move across it; rows that differ within that band are
  counted in a note under the table, as Inductor may compute the scores in another order). The eager
  training step runs on a twin of the model from the same random state, so that dropout draws
  the same masks, and the gradient over all parameters is compared too, by the norm of the
  difference over the norm of the gradient (at most 1e-3): a pre-activation within rounding of
  a ReLU's kink passes its gradient on one side and not on the other, which moves single
  gradient entries by up to 1e-3 of the largest while the norm moves by about 1e-5;
* held outputs: outputs kept from the first call after warm-up changed during later calls
  (what a CUDA-graph replay does to outputs not cloned at the boundary);
* recompilations after warm-up, graph breaks, or static buffers that moved;
* on CUDA: the mode is not "reduce-overhead", or Inductor skipped CUDA graphs
  (its ``cudagraph_skips`` counter grew): `cuda_graph_problems`.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from kgtrace.attribution import TracIn
from kgtrace.attribution.compiled import ENTRY_POINTS, entry_points_for
from kgtrace.attribution.grads import ScoreHRT
from kgtrace.compute.compile import CompiledCall
from kgtrace.compute.precision import precision_context
from kgtrace.compute.system import resolve_device
from kgtrace.core.config import TrainConfig, parse_size
from kgtrace.data.answers import AnswerIndex
from kgtrace.evaluation.compiled import balanced_batch, compiled_ranker, filter_mask, rank_chunk
from kgtrace.evaluation.sides import query_chunk_size, side_queries
from kgtrace.runs.embedding import load_run
from kgtrace.training.batches import Batches
from kgtrace.training.compiled import ROWS, step_inputs, step_static, train_call
from kgtrace.training.graphed import GraphedTraining
from kgtrace.training.loop import new_state, train
from kgtrace.training.step import run_epoch

__all__ = ["Check", "Probe", "RankParity", "captured_step_check", "cuda_graph_problems", "doctor", "format_table",
           "near_candidates", "rank_parity", "run_probes"]

TOLERANCE = 1e-4  # relative to the largest eager value of an output; for ranks, the width of the rounding band
RANK_OUTPUTS = ("greater", "equal", "num_candidates", "nonfinite")  # rank_chunk's outputs, in order
BANDED = ("greater", "equal")  # the rank outputs that rounding of the scores can move
GRADIENT_TOLERANCE = 1e-3  # norm of the difference over the norm of the eager gradient
# Adam turns rounding differences of gradients near zero into steps of up to lr, which later steps carry on:
# after a dozen steps the parameters drift apart by about 1e-3 of their norm (tests/test_graphed_train.py).
PARAMETER_TOLERANCE = 2e-2
CAPTURED_EPOCHS, CAPTURED_STEPS = 2, 6
TINY_CONVE = {"embedding_dim": 32, "embedding_height": 4, "output_channels": 8}


@dataclass
class Probe:
    """One entry point, ready to be checked: its call, how to run it compiled and eagerly, and on what."""

    call: CompiledCall
    compiled: Callable[[dict[str, Tensor]], tuple[Tensor, ...]]  # through the command's own code path
    eager: Callable[[dict[str, Tensor]], tuple[Tensor, ...]]  # the same outputs, eagerly
    sample: Callable[[int], dict[str, Tensor]]  # inputs of n rows, fresh values each time
    sizes: tuple[int, ...]  # rows per call, the first one the warm-up
    mode: Callable[[], AbstractContextManager]  # grad mode and autocast of the command
    held: int = 0  # how many leading outputs are the call's own (checked for being held); 0: all
    gradient: bool = False  # the last output is a flat gradient, compared by norm (module docstring)
    ranks: bool = False  # rank_chunk's counts; eager adds near_candidates: compared by rank_parity


@dataclass
class Check:
    """One row of the doctor's table."""

    entry_point: str
    batch_size: int
    calls: int
    sizes: list[int]
    max_error: float  # largest relative difference to eager over every call and output (the gradient's aside);
    # for a ranking, the largest count difference beyond the rounding band (rank_parity)
    recompilations: int
    graph_breaks: int
    compile_seconds: float
    problems: list[str] = field(default_factory=list)
    gradient_error: float | None = None  # largest norm-relative gradient difference (training steps); captured_step:
    # the parameters' after its epochs
    rounding_rows: int | None = None  # rows whose greater/equal differed within the rounding band; None: no ranking

    @property
    def ok(self) -> bool:
        return not self.problems


def relative_error(got: Tensor, expected: Tensor) -> float:
    """Largest |got - expected| over the largest |expected| (float); 0 or inf for exact types."""
    if got.shape != expected.shape:
        return float("inf")
    if not expected.is_floating_point():
        return 0.0 if torch.equal(got, expected) else float("inf")
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    diff = float((got.float() - expected.float()).abs().max()) if expected.numel() else 0.0
    return diff / max(scale, 1e-30)


@dataclass
class RankParity:
    """How a ranking's counts compare with eager's, over one or more calls (`rank_parity`)."""

    # output -> (rows, largest difference) beyond what rounding explains; only the outputs that differ so
    beyond: dict[str, tuple[int, int]] = field(default_factory=dict)
    rounding: int = 0  # rows whose greater/equal differed, each by no more than its candidates in the band
    shapes: list[tuple[str, str]] = field(default_factory=list)  # output, its shape and eager's where they differ

    def __add__(self, other: RankParity) -> RankParity:
        beyond = dict(self.beyond)
        for name, (rows, largest) in other.beyond.items():
            before = beyond.get(name, (0, 0))
            beyond[name] = (before[0] + rows, max(before[1], largest))
        return RankParity(beyond, self.rounding + other.rounding, self.shapes + other.shapes)

    @property
    def error(self) -> float:
        """The largest count difference beyond the band; 0 when rounding explains all, inf for a wrong shape."""
        if self.shapes:
            return float("inf")
        return float(max((largest for _, largest in self.beyond.values()), default=0))

    def problems(self) -> list[str]:
        """One line per output that differs beyond what rounding explains, in rank_chunk's order."""
        lines = [f"{name} differs from eager: {shape}" for name, shape in dict.fromkeys(self.shapes)]
        for name in (n for n in RANK_OUTPUTS if n in self.beyond):
            rows, largest = self.beyond[name]
            why = (f"{largest} more than the row's candidates within {TOLERANCE:g} x its largest |score| of the "
                   "true answer's score" if name in BANDED else f"{largest}, where it must be equal")
            lines.append(f"{name} differs from eager on {rows} row(s), by up to {why}")
        return lines


def near_candidates(scores: Tensor, answers: Tensor, filtered: Tensor) -> Tensor:
    """Candidates per row whose score lies within the rounding band of the true answer's: [B] long.

    scores [B, E] float (eager), answers [B] long, filtered [B, E] bool as rank_chunk takes them.
    The band is TOLERANCE x the row's largest |score|; candidates are the entities rank_chunk
    counts, neither filtered nor the true answer. Rounding the scores in another order moves a
    score by far less than the band, so only these can change sides of the true answer's score.
    """
    band = TOLERANCE * scores.abs().amax(dim=1, keepdim=True)  # [B, 1]
    columns = torch.arange(scores.shape[1], device=scores.device)
    is_true = columns.unsqueeze(0) == answers.unsqueeze(1)  # [B, E]
    true_scores = scores.gather(1, answers.unsqueeze(1))  # [B, 1]
    near = (scores - true_scores).abs() <= band
    return (near & ~(filtered | is_true)).sum(dim=1)


def rank_parity(got: tuple[Tensor, ...], expected: tuple[Tensor, ...]) -> RankParity:
    """Compare one ranking call with eager: exact where only the filter matters, within the band elsewhere.

    got: rank_chunk's greater, equal, num_candidates (long) and nonfinite (bool), each [B];
    expected: eager's same four and `near_candidates` [B]. num_candidates and nonfinite
    must be equal; greater and equal may each differ by up to the row's near candidates.
    """
    *counts, near = expected
    parity = RankParity()
    moved = torch.zeros(near.shape, dtype=torch.bool, device=near.device)  # greater/equal differ
    unexplained = moved.clone()
    for name, g, e in zip(RANK_OUTPUTS, got, counts):
        if g.shape != e.shape:
            parity.shapes.append((name, f"shape {list(g.shape)}, eager {list(e.shape)}"))
            continue
        difference = (g.long() - e.long()).abs()  # [B]
        beyond = (difference - near).clamp(min=0) if name in BANDED else difference
        if name in BANDED:
            moved |= difference > 0
            unexplained |= beyond > 0
        if bool(beyond.any()):
            parity.beyond[name] = (int((beyond > 0).sum()), int(beyond.max()))
    parity.rounding = int((moved & ~unexplained).sum())
    return parity


def norm_error(got: Tensor, expected: Tensor) -> float:
    """||got - expected|| / ||expected||; inf for another shape."""
    if got.shape != expected.shape:
        return float("inf")
    return float((got.float() - expected.float()).norm()) / max(float(expected.float().norm()), 1e-30)


def cuda_graph_problems(device: torch.device, mode: str, skipped: int) -> list[str]:
    """CUDA-graph checks of one entry point: on CUDA the mode must record graphs and none may be skipped."""
    if device.type != "cuda":
        return []
    problems = []
    if mode != "reduce-overhead":
        problems.append(f"mode {mode!r} on CUDA records no CUDA graphs; expected 'reduce-overhead'")
    if skipped:
        problems.append(f"Inductor skipped CUDA graphs {skipped} time(s) (see TORCH_LOGS=perf_hints)")
    return problems


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def run_probes(probes: list[Probe]) -> list[Check]:
    """Run every probe's calls, interleaved round-robin, and check them (see the module docstring)."""
    pointers = [{k: b.data_ptr() for k, b in p.call.buffers.items()} for p in probes]
    errors = [[0.0, 0.0] for _ in probes]  # outputs, gradient
    parities = [RankParity() for _ in probes]  # of the probes of ranks
    held: list[tuple[tuple[Tensor, ...], list[Tensor]] | None] = [None] * len(probes)
    skips = _cudagraph_skips()
    for step in range(max(len(p.sizes) for p in probes)):
        for i, probe in enumerate(probes):
            if step >= len(probe.sizes):
                continue
            inputs = probe.sample(probe.sizes[step])
            with probe.mode():
                devices = [probe.call.device] if probe.call.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):  # eager and compiled draw the same numbers
                    expected = probe.eager(inputs)
                got = probe.compiled(inputs)
            if probe.ranks:
                parities[i] += rank_parity(got, expected)
            else:
                plain = len(got) - probe.gradient
                errors[i][0] = max([errors[i][0]] + [relative_error(g, e) for g, e in zip(got[:plain], expected[:plain])])
            if probe.gradient:
                errors[i][1] = max(errors[i][1], norm_error(got[-1], expected[-1]))
            if step == 1:  # the first call after warm-up: keep its outputs and a copy to compare against
                own = got[: probe.held or len(got)]
                held[i] = (own, [t.clone() for t in own])
    skipped = _cudagraph_skips() - skips
    return [_check(p, *errors[i], parities[i], held[i], pointers[i], skipped) for i, p in enumerate(probes)]


def _check(probe: Probe, error: float, gradient_error: float, parity: RankParity, held, pointers: dict[str, int],
           skipped: int) -> Check:
    stats = probe.call.stats
    problems = []
    if probe.ranks:
        error = parity.error
        problems += parity.problems()
    elif error > TOLERANCE:
        problems.append(f"differs from eager: relative error {error:.3g} > {TOLERANCE:g}")
    if gradient_error > GRADIENT_TOLERANCE:
        problems.append(f"gradient differs from eager: relative norm {gradient_error:.3g} > {GRADIENT_TOLERANCE:g}")
    if held is not None and not all(torch.equal(a, b) for a, b in zip(*held)):
        problems.append("an output held from an earlier call was overwritten by a later call")
    if stats.recompilations:
        problems.append(f"{stats.recompilations} recompilation(s) after warm-up (run with TORCH_LOGS=recompiles)")
    if stats.graph_breaks:
        problems.append(f"{stats.graph_breaks} graph break(s)")
    if {k: b.data_ptr() for k, b in probe.call.buffers.items()} != pointers:
        problems.append("static buffers moved")
    problems += cuda_graph_problems(probe.call.device, probe.call.mode, skipped)
    return Check(probe.call.name, probe.call.batch_size, stats.calls, sorted(stats.input_sizes), error,
                 stats.recompilations, stats.graph_breaks, stats.compile_seconds, problems,
                 gradient_error if probe.gradient else None, parity.rounding if probe.ranks else None)


def format_table(checks: list[Check]) -> str:
    """The doctor's report: one row per entry point, then each problem and note, then a verdict.

    ``max err``: the largest relative difference to eager, or for a ranking the largest count
    difference beyond the rounding band (`rank_parity`).
    """
    rows = [("entry point", "batch", "calls", "sizes", "max err", "grad err", "recompiles", "breaks", "compile s",
             "result")]
    for c in checks:
        error = _number(c.max_error) if c.rounding_rows is None else f"{c.max_error:g}"
        rows.append((c.entry_point, str(c.batch_size), str(c.calls), ",".join(map(str, c.sizes)), error,
                     "-" if c.gradient_error is None else _number(c.gradient_error), str(c.recompilations),
                     str(c.graph_breaks), f"{c.compile_seconds:.1f}", "ok" if c.ok else "FAILED"))
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if j in (0, 3, 9) else cell.rjust(w)
                       for j, (cell, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines += [f"{c.entry_point} (batch {c.batch_size}): {p}" for c in checks for p in c.problems]
    lines += [f"{c.entry_point} (batch {c.batch_size}): note: {_rounding_note(c.rounding_rows)}" for c in checks
              if c.rounding_rows]
    failed = sum(not c.ok for c in checks)
    lines.append(f"{len(checks) - failed} of {len(checks)} entry points passed" + (f"; {failed} FAILED" if failed else ""))
    return "\n".join(lines)


def _number(x: float) -> str:
    return f"{x:.1e}" if x else "0"


def _rounding_note(rows: int) -> str:
    return (f"greater/equal differed from eager on {rows} row(s), each by no more than its candidates within "
            f"{TOLERANCE:g} x the row's largest |score| of the true answer's score (rounding; accepted)")


# ----------------------------------------------------------------------------- the entry points of a run


def rank_probe(run, device: torch.device, memory_budget: int, gen: torch.Generator) -> Probe:
    """The compiled ranking of the validation split, as ``kgtrace train --compile`` validates
    (``kgtrace evaluate --compile`` runs the same function on the test split)."""

    ds, model = run.dataset, run.model.to(device).eval()
    sides = [side_queries(ds.valid, ds.num_relations, side) for side in ("head", "tail")]
    queries, answers = torch.cat([s.queries for s in sides]), torch.cat([s.answers for s in sides])
    known = AnswerIndex.build(ds.known_triples("valid"), ds.num_relations)
    batch = balanced_batch(len(ds.valid), query_chunk_size(model.num_entities, memory_budget))
    call = compiled_ranker(model, batch, device)

    def sample(n: int) -> dict[str, Tensor]:
        at = torch.randint(len(answers), (n,), generator=gen)
        rows, cols = known.lookup(queries[at])
        return {"queries": queries[at], "answers": answers[at].to(device),
                "filtered": filter_mask(rows.to(device), cols.to(device), n, model.num_entities)}

    def eager(inputs: dict[str, Tensor]) -> tuple[Tensor, ...]:
        """rank_chunk's four counts [B], then the candidates within the rounding band [B] (rank_parity)."""
        queries, answers, filtered = inputs["queries"].to(device), inputs["answers"], inputs["filtered"]
        valid = torch.ones(len(answers), dtype=torch.bool, device=device)
        counts = rank_chunk(model, queries, answers, filtered, valid)
        return (*counts, near_candidates(model.score_t(queries).float(), answers, filtered))

    return Probe(call, lambda inputs: call(model, **inputs), eager, sample, _row_sizes(batch), torch.inference_mode,
                 ranks=True)


def train_probes(run, device: torch.device, gen: torch.Generator) -> list[Probe]:
    """The training step at the run's batch size and at the epoch's remainder, as ``kgtrace train --compile``."""

    config, ds = run.config, run.dataset
    batches = Batches.build(ds.train, ds.num_relations, config.training)
    twins = [copy.deepcopy(run.model).to(device).train() for _ in range(2)]  # eager, compiled: kept in step
    rows_fn = ROWS[config.training]

    def step(model: nn.Module, run_rows: Callable) -> tuple[Tensor, Tensor]:
        """Per-row losses [n] and the gradient of their sum over every parameter, flattened [P].

        One flat gradient: its error is measured against the whole gradient's scale, as some
        parameters' gradients vanish mathematically (bn0.weight before bn1) and are rounding noise.
        """
        model.zero_grad(set_to_none=True)
        rows = run_rows(model)
        rows.sum().backward()
        return rows.detach(), torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])

    def probe(size: int) -> Probe:
        call = train_call(twins[1], config.training, size, device, (config.negatives_tail, config.negatives_head))

        def sample(n: int) -> dict[str, Tensor]:
            pos = torch.randperm(len(batches), generator=gen)[:n]
            return step_inputs(batches, pos, config, ds.num_entities, device)

        def eager(inputs: dict[str, Tensor]) -> tuple[Tensor, ...]:
            rows = len(next(iter(inputs.values())))  # the first input's rows: queries, or triples
            valid = torch.ones(rows, dtype=torch.bool, device=device)
            on_device = {k: v.to(device) for k, v in inputs.items()}
            return step(twins[0], lambda m: rows_fn(*step_static(m, config), **on_device, valid=valid))

        def compiled(inputs: dict[str, Tensor]) -> tuple[Tensor, ...]:
            return step(twins[1], lambda m: call(*step_static(m, config), **inputs)[0])

        def mode() -> AbstractContextManager:
            stack = ExitStack()
            stack.enter_context(torch.enable_grad())
            stack.enter_context(precision_context(config.precision, device))
            return stack

        return Probe(call, compiled, eager, sample, (size,) * 4, mode, held=1, gradient=True)

    sizes = [min(config.batch_size, len(batches)), len(batches) % config.batch_size]
    return [probe(size) for size in sizes if size]


def tracin_probes(run, device: torch.device, gen: torch.Generator) -> list[Probe]:
    """TracIn's compiled gradient functions for the run's model, as ``kgtrace explain --compile`` (params last)."""

    tracin = TracIn(run, device=device, compile=True)
    model = copy.deepcopy(run.model).to(device).eval()  # TracIn's own copy has the architecture, not the weights
    return [_tracin_probe(tracin, model, name, gen)
            for name in entry_points_for(tracin.model, tracin.path, tracin.names)]


def _tracin_probe(tracin, model: nn.Module, name: str, gen: torch.Generator) -> Probe:

    fn, key, _ = ENTRY_POINTS[name]
    train = tracin.train
    static = (ScoreHRT(model), tuple(tracin.names)) if key == "triples" else (model,)
    call = tracin.compiled.call(name)

    def eager_fn(x: Tensor) -> tuple[Tensor, ...]:  # the entry point's own function, uncompiled, every row real
        out = fn(*static, **{key: x}, valid=torch.ones(len(x), dtype=torch.bool, device=x.device))
        return out if isinstance(out, tuple) else (out,)

    def sample(n: int) -> dict[str, Tensor]:
        triples = train[torch.randint(len(train), (n,), generator=gen)]
        return {key: triples if key == "triples" else triples[:, :2]}

    return Probe(call, lambda inputs: call(*static, **inputs), lambda inputs: eager_fn(inputs[key]), sample,
                 _row_sizes(call.batch_size), torch.no_grad)


def captured_step_check(run, device: torch.device) -> Check:
    """The captured training step against the step by step loop (module docstring: ``captured_step``)."""
    config = TrainConfig(**{**run.config.to_dict(), "device": device.type, "steps_per_epoch": CAPTURED_STEPS,
                            "captured_step": True, "eval_every": 0, "entity_chunk": 0})
    ds = run.dataset
    batches = Batches.build(ds.train, ds.num_relations, config.training)
    losses, models, drivers = {}, {}, {}
    for captured in (False, True):
        state = new_state(TrainConfig(**{**config.to_dict(), "compile": captured and config.compile}), ds, device)
        state.model.load_state_dict(run.model.state_dict())
        epoch = GraphedTraining(batches, device) if captured else run_epoch
        torch.manual_seed(0)  # both draw the same dropout masks
        losses[captured] = [epoch(state, batches, config, device, False) for _ in range(CAPTURED_EPOCHS)]
        models[captured], drivers[captured] = state.model, epoch
    programs = list(drivers[True].programs.values())
    calls = [p.call for p in programs if p.call is not None]
    error = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[True], losses[False]))
    flat = [torch.cat([p.detach().reshape(-1) for p in models[c].parameters()]) for c in (True, False)]
    drift = norm_error(*flat)
    problems = []
    if error > TOLERANCE:
        problems.append(f"an epoch's loss differs from the step by step loop's: relative error {error:.3g} > {TOLERANCE:g}")
    if drift > PARAMETER_TOLERANCE:
        problems.append(f"parameters differ from the step by step loop's: relative norm {drift:.3g} > "
                        f"{PARAMETER_TOLERANCE:g}")
    recompilations = sum(c.stats.recompilations for c in calls)
    if recompilations:
        problems.append(f"{recompilations} recompilation(s) of the compiled loss (run with TORCH_LOGS=recompiles)")
    if device.type == "cuda" and not all(p.graph is not None for p in programs if p.runs > 2):
        problems.append("a step after the warm-ups ran without its captured CUDA graph")
    steps = sum(p.runs for p in programs)
    return Check("captured_step", config.batch_size, steps, sorted(p.batch_size for p in programs), error,
                 recompilations, sum(c.stats.graph_breaks for c in calls), sum(c.stats.compile_seconds for c in calls),
                 problems, gradient_error=drift)


def _row_sizes(batch: int) -> tuple[int, ...]:
    """Warm-up, then a full batch, padded last chunks of 1 and batch - 1 rows, two batches and one more."""
    return tuple(n for n in (batch, batch, 1, batch - 1, 2 * batch + 1, batch) if n > 0)


def doctor(run_dir: str | Path | None = None, device: str = "auto", log=print) -> list[Check]:
    """Check every compiled entry point of the run in ``run_dir`` (None: a tiny ConvE on UMLS); see the module doc."""

    where = torch.device(resolve_device(device))
    with tempfile.TemporaryDirectory(prefix="kgtrace-doctor-") as scratch:
        if run_dir is None:
            run_dir = tiny_run(Path(scratch) / "run", where, log)
        run = load_run(run_dir, device=where)
        gen = torch.Generator().manual_seed(0)
        torch.manual_seed(0)  # the dropout masks: the same check every time
        log(f"compiling each entry point of {run_dir} ({type(run.model).__name__}, {where}); this takes a while")
        probes = [rank_probe(run, where, parse_size(run.config.memory_budget), gen), *train_probes(run, where, gen),
                  *tracin_probes(run, where, gen)]
        checks = run_probes(probes)
        if not run.config.captured_step_problems():
            checks.append(captured_step_check(run, where))
        return checks


def tiny_run(out: Path, device: torch.device, log) -> Path:
    """A small ConvE trained for one epoch on UMLS (eagerly), with one epoch checkpoint."""

    config = TrainConfig(dataset="umls", model="conve", model_args=dict(TINY_CONVE), epochs=1, eval_every=0,
                         checkpoint_every=1, device=device.type)
    log(f"no RUN_DIR: training a small ConvE on UMLS for one epoch into {out}")
    train(config, out, progress=False, log=lambda *_: None)
    return out
