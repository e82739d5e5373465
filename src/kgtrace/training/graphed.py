"""The whole training step as one program over examples kept on the device, captured once as a CUDA graph.

A step of `kgtrace.training.step.run_epoch` does host work each time: it slices the epoch's
order, gathers the batch's queries and answers on the CPU, copies them over, and launches each
kernel of the forward, the loss, the backward and the optimizer one by one. On a GPU that host work,
not the arithmetic, sets the pace (a ConvE-200 step on FB15k-237 is ~0.1 ms of arithmetic).

Here every step is one program with no input from the host:

* the examples live on the device (`DeviceExamples`): the queries [N, 2], and KvsAll's
  positives as the CSR arrays of `AnswerIndex` (offsets [N + 1],
  answers [P]), or the single answers [N];
* the epoch's shuffled order is copied to the device once per epoch (the same ``randperm`` of the
  same generator as the eager loop, so the batches are the eager loop's); a device counter
  ``cursor`` says where the next batch starts, and the step advances it;
* the batch's positives are unpacked on the device into a fixed number L of (row, answer) slots
  (`batch_pairs`), L the most any batch of that size can have, and set in a [B, E] label mask
  (`label_mask`; unused slots write into a spare column, so no two slots write one place);
* the per-row loss is the compiled step's (`kgtrace.training.compiled.ROWS`), run as is or,
  with ``compile``, through torch.compile without its own CUDA graphs (``mode="default"``: Inductor's
  fused kernels inside this graph); its backward and the optimizer's step (fused Adam,
  ``capturable``, the learning rate a device tensor that the schedulers fill in place) follow, and
  the loss is added to a device total read once per epoch.

On CUDA each batch size's program is captured as a ``torch.cuda.CUDAGraph`` after two warm-up steps
(real steps, run as is on a side stream, as PyTorch's whole-network capture asks), and every later
step of that size is one ``replay()``: no host synchronisation and no per-kernel launch. An epoch has
at most two sizes (``batch_size`` and the remainder), so at most two graphs. On a CPU nothing is
captured and the same program runs step by step: that is how the tests check it against the eager
loop (tests/test_graphed_train.py), and the same test runs on CUDA, where the graph replays.

What the graph cannot hold is refused by ``TrainConfig.captured_step_problems``: fp16 (its gradient scaler reads
the gradients' finiteness on the host), Adagrad (torch's Adagrad is not capturable), sparse
gradients and the entity-chunked loss (its own backward passes); a distributed job (an all-reduce per
step) takes the step by step loop. Under autocast the cast-weight cache is off: a capture would keep the weights' first
casts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm import tqdm

from kgtrace.compute.precision import precision_context
from kgtrace.compute.system import bar_disable
from kgtrace.core.config import TrainConfig
from kgtrace.core.errors import KgtraceError
from kgtrace.training.batches import Batches
from kgtrace.training.compiled import ROWS, mean_of_rows, step_static, train_call
from kgtrace.training.loss import draw_candidates
from kgtrace.training.step import TrainState, epoch_batches

__all__ = ["DeviceExamples", "GraphedTraining", "StepProgram", "batch_pairs", "label_mask", "pairs_bound",
           "plain_optimizer_state"]

WARMUP_STEPS = 2  # real steps of a batch size run before its capture (cuBLAS handles, Adam's state, autograd's streams)


@dataclass(frozen=True)
class DeviceExamples:
    """An epoch's examples on the device; the same examples as `Batches`.

    queries [N, 2] (anchor, relation in [0, 2R); negative-sampling: (head, relation in [0, R))).
    offsets [N + 1] and positives [P] (kvsall, kvsall-ce): example i's answers are
    positives[offsets[i]:offsets[i + 1]]. answers [N] (1vsall, negative-sampling: the tail).
    """

    queries: Tensor
    offsets: Tensor | None
    positives: Tensor | None
    answers: Tensor | None

    @classmethod
    def build(cls, batches: Batches, device: torch.device) -> "DeviceExamples":
        index = batches.index
        if index is None:
            return cls(batches.queries.to(device), None, None, batches.answers.to(device))
        # Batches' kvsall queries are the index's, in its order: example i is index row i.
        return cls(batches.queries.to(device), index.offsets.to(device), index.answers.to(device), None)

    def counts(self) -> Tensor:
        """Positives per example [N] (kvsall modes)."""
        return self.offsets[1:] - self.offsets[:-1]


def pairs_bound(counts: Tensor, batch_size: int) -> int:
    """The most positives a batch of ``batch_size`` examples can hold: the sum of the largest counts."""
    return int(torch.topk(counts.cpu(), min(batch_size, len(counts))).values.sum()) if len(counts) else 0


def batch_pairs(starts: Tensor, counts: Tensor, positives: Tensor, slots: int) -> tuple[Tensor, Tensor, Tensor]:
    """The positives of a batch unpacked into ``slots`` fixed places, with no host synchronisation.

    Row b of the batch owns the slots ends[b] - counts[b] .. ends[b] - 1, ends = cumsum(counts); slot
    j belongs to row searchsorted(ends, j, right=True) and is its (j - first slot)-th positive. Slots
    past the batch's total are unused (``used`` False) and point at row B - 1's first answer, so
    every index stays valid.

    Args:
        starts: [B] each row's first place in ``positives``.
        counts: [B] each row's number of positives.
        positives: [P] all examples' answers.
        slots: L, at least counts.sum() (see `pairs_bound`).
    Returns:
        rows [L], answers [L] and used [L] bool.
    """
    ends = torch.cumsum(counts, 0)  # [B] one past each row's last slot
    slot = torch.arange(slots, device=counts.device)  # [L]
    rows = torch.searchsorted(ends, slot, right=True)  # [L] in [0, B]; B for unused slots
    used = rows < len(counts)
    rows = rows.clamp(max=len(counts) - 1)
    within = torch.where(used, slot - (ends[rows] - counts[rows]), 0)  # [L] the slot's place among its row's
    answers = positives[starts[rows] + within]  # [L]
    return rows, answers, used


def label_mask(rows: Tensor, answers: Tensor, used: Tensor, batch: int, num_entities: int) -> Tensor:
    """[B, E] bool, True at the batch's positives (`batch_pairs`' used slots).

    Unused slots write into a spare column E that is cut off: real slots are distinct places, so
    the write is a plain one, whichever order the device takes the slots in. (Pointing unused slots
    at a real place instead would have tens of thousands of them write, or in a backward pass
    accumulate, into one element: an accumulating index_put takes such a run one by one, 6 ms a step.)
    """
    mask = torch.zeros(batch, num_entities + 1, dtype=torch.bool, device=rows.device)  # [B, E + 1]
    # index_put_ of a device tensor: a Python True would be copied from the host, which a capture refuses
    mask.index_put_((rows, torch.where(used, answers, num_entities)), used.new_ones(()))
    return mask[:, :num_entities]  # [B, E]


class StepProgram:
    """One batch size's training step, reading the batch at ``cursor`` of the device ``order``.

    `run` runs one step: on a CPU the program itself, on CUDA its warm-up steps and then
    replays of its captured graph (module docstring). The step's loss is added to ``total``.
    """

    def __init__(self, *, model: nn.Module, optimizer: torch.optim.Optimizer, examples: DeviceExamples,
                 config: TrainConfig, batch_size: int, order: Tensor, cursor: Tensor, total: Tensor,
                 capture: bool):
        self.model, self.optimizer, self.examples, self.config = model, optimizer, examples, config
        self.batch_size, self.order, self.cursor, self.total = batch_size, order, cursor, total
        self.capture = capture
        self.within = torch.arange(batch_size, device=order.device)  # [B] places of the batch after cursor
        self.slots = pairs_bound(examples.counts(), batch_size) if examples.offsets is not None else 0
        self.valid = torch.ones(batch_size, dtype=torch.bool, device=order.device)
        self.static = step_static(model, config)  # the loss's leading arguments: the model, its label values
        # compile: Inductor's kernels, captured into this program's graph (no CUDA graphs of its own)
        self.call = train_call(model, config.training, batch_size, order.device,
                               (config.negatives_tail, config.negatives_head), mode="default") if config.compile else None
        self.runs = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.kept: list[Tensor | None] = []  # the captured step's gradients, kept alive with its graph

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        elif not self.capture:
            self.optimizer.zero_grad(set_to_none=True)
            self.step()
        elif self.runs < WARMUP_STEPS:
            self._warm_up()
        else:
            self._capture()
            self.graph.replay()
        self.runs += 1

    def step(self) -> None:
        """The program: batch assembly, forward and loss, backward, optimizer step; nothing read by the host."""
        pos = self.order[self.cursor + self.within]  # [B] example positions of this batch
        inputs = self.inputs(pos)
        with precision_context(self.config.precision, self.order.device, cache=False):
            if self.call is None:
                rows = ROWS[self.config.training](*self.static, **inputs, valid=self.valid)  # [B]
            else:
                (rows,) = self.call(*self.static, **inputs)  # [B]
            loss = mean_of_rows(rows, self.config, self.model.num_entities, self.batch_size)
        loss.backward()
        self.optimizer.step()
        self.total.add_(loss.detach().float())
        self.cursor.add_(self.batch_size)

    def inputs(self, pos: Tensor) -> dict[str, Tensor]:
        """The per-row loss's inputs for the examples at ``pos`` [B], built on the device (as step_inputs)."""
        ex, config = self.examples, self.config
        if config.training == "negative-sampling":
            triples = torch.cat([ex.queries[pos], ex.answers[pos].unsqueeze(1)], dim=1)  # [B, 3]
            tails, heads = draw_candidates(triples, config.negatives_tail, config.negatives_head,
                                           self.model.num_entities)
            return {"triples": triples, "tail_candidates": tails, "head_candidates": heads}
        if ex.offsets is None:
            return {"queries": ex.queries[pos], "answers": ex.answers[pos]}
        starts, counts = ex.offsets[pos], ex.offsets[pos + 1] - ex.offsets[pos]  # [B] each
        rows, answers, used = batch_pairs(starts, counts, ex.positives, self.slots)
        return {"queries": ex.queries[pos],
                "labels": label_mask(rows, answers, used, self.batch_size, self.model.num_entities)}

    def _warm_up(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.optimizer.zero_grad(set_to_none=True)
            self.step()
        torch.cuda.current_stream().wait_stream(side)

    def _capture(self) -> None:
        # Gradients None: the captured backward allocates them in the graph's pool and every replay
        # writes them afresh (no accumulation into another program's gradients).
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.step()
        except RuntimeError as error:  # an operation a capture refuses; never a silent fallback to the plain loop
            cause = (str(error).strip().splitlines() or [""])[0]
            raise KgtraceError(f"the captured training step could not be captured as a CUDA graph ({cause}). Fix: "
                               "train with --no-captured-step (the plain loop, same results), and report the "
                               "error") from error
        self.kept = [p.grad for group in self.optimizer.param_groups for p in group["params"]]
        self.graph = graph


class GraphedTraining:
    """Epochs of the captured step (the module docstring); called as ``run_epoch`` is.

    Args:
        capture: capture CUDA graphs (default: on CUDA); False runs the same program step by step.
    """

    def __init__(self, batches: Batches, device: torch.device, capture: bool | None = None):
        self.examples = DeviceExamples.build(batches, device)
        self.device = device
        self.capture = device.type == "cuda" if capture is None else capture
        self.order = torch.zeros(len(batches), dtype=torch.long, device=device)
        self.cursor = torch.zeros((), dtype=torch.long, device=device)
        self.total = torch.zeros((), dtype=torch.float32, device=device)
        self.programs: dict[int, StepProgram] = {}
        self.prepared: torch.optim.Optimizer | None = None

    def __call__(self, state: TrainState, batches: Batches, config: TrainConfig, device: torch.device, progress: bool) -> float:
        """One pass over the shuffled examples, as run_epoch; returns the mean batch loss."""
        state.model.train()
        self._prepare(state.optimizer)
        order = torch.randperm(len(batches), generator=state.shuffle)  # the eager loop's order
        sizes = [len(b) for b in epoch_batches(order, config, state.model)]
        self.order.copy_(order)
        self.cursor.zero_()
        self.total.zero_()
        bar = tqdm(sizes, desc=f"epoch {state.epoch + 1}/{config.epochs}", leave=False, disable=bar_disable(progress),
                   unit="batch")
        for size in bar:
            self._program(size, state, config).run()
            state.step += 1
        return float(self.total) / max(len(sizes), 1)  # the epoch's one synchronisation

    def _program(self, size: int, state: TrainState, config: TrainConfig) -> StepProgram:
        if size not in self.programs:
            self.programs[size] = StepProgram(model=state.model, optimizer=state.optimizer, examples=self.examples,
                                              config=config, batch_size=size, order=self.order, cursor=self.cursor,
                                              total=self.total, capture=self.capture)
        return self.programs[size]

    def _prepare(self, optimizer: torch.optim.Optimizer) -> None:
        """Make the optimizer capturable once: its learning rate a device tensor (schedulers fill it in place),
        its step counts on the device."""
        if not self.capture or self.prepared is optimizer:
            return
        for group in optimizer.param_groups:
            group["capturable"] = True
            group["lr"] = torch.tensor(float(group["lr"]), device=self.device)
            for p in group["params"]:
                step = optimizer.state.get(p, {}).get("step")
                if step is not None:
                    optimizer.state[p]["step"] = step.to(device=self.device, dtype=torch.float32)
        self.prepared = optimizer


def plain_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state_dict as an uncaptured run has it: learning rates as floats, ``capturable`` off,
    so that a checkpoint resumes the same on any device and with or without the captured step."""
    saved = optimizer.state_dict()
    saved["param_groups"] = [{**g, "lr": float(g["lr"]), **({"capturable": False} if "capturable" in g else {})}
                             for g in saved["param_groups"]]
    return saved
