"""One process of a distributed job started by tests/test_distributed.py (not a test module itself).

    python distributed_job.py api RUN_DIR OUT.pt       TracIn and ranking through the Python API; rank 0 saves
    python distributed_job.py fail RANK ARG...         kgtrace ARG..., with process RANK failing mid-command
    python distributed_job.py teardown ARG...          kgtrace ARG..., then exit 3 if its process group outlived it

The processes learn who they are from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...).
"""

import gc
import os
import sys
import weakref

import torch
import torch.distributed as dist

from kgtrace.attribution import TracIn
from kgtrace.cli import main
from kgtrace.compute.distributed import session
from kgtrace.core.errors import KgtraceError
from kgtrace.evaluation import sharded
from kgtrace.evaluation.evaluate import Candidates
from kgtrace.runs.embedding import load_run

# Small enough that the training set is streamed in several chunks and each side ranked in many.
TRACIN_CHUNK = 700
MEMORY_BUDGET = 32 << 10


def api(run_dir: str, out: str) -> int:
    torch.set_num_threads(1)
    with session("explain") as world:
        run = load_run(run_dir)
        ds = run.dataset
        ranks = sharded.rank_queries_sharded(run.model, ds.test, world=world, known=ds.known_triples("test"),
                                             memory_budget=MEMORY_BUDGET)
        sampled = sharded.rank_queries_sharded(run.model, ds.test, world=world, known=ds.known_triples("test"),
                                               candidates=Candidates(corruptions=20, seed=5),
                                               memory_budget=MEMORY_BUDGET)
        tracin = TracIn(run, chunk_size=TRACIN_CHUNK, world=world)
        result = {"influence": tracin.influence(ds.test[:4]), "self": tracin.self_influence(),
                  "top": [t.__dict__ for t in tracin.top_k(ds.test[:4], k=6)],
                  "counts": {name: {side: c.__dict__ for side, c in r.counts.items()}
                             for name, r in (("all", ranks), ("sampled", sampled))}}
        if world.is_main:
            torch.save(result, out)
    return 0


def fail(rank: str, argv: list[str]) -> int:
    if os.environ["RANK"] == rank:
        def broken(*args, **kwargs):
            raise KgtraceError(f"injected failure on rank {rank}")

        sharded._rank_part = broken  # the others are left waiting for this process's counts
    return main(argv)


def teardown(argv: list[str]) -> int:
    """kgtrace ARGV; exit 3 instead if destroy_process_group left the group alive (its gloo threads then
    die with the interpreter, which can abort the process: "terminate called without an active exception")."""
    groups = []
    init = dist.init_process_group

    def recording(*args, **kwargs):
        init(*args, **kwargs)
        groups.append(weakref.ref(dist.group.WORLD))

    dist.init_process_group = recording
    code = main(argv)
    gc.collect()
    if not groups or any(ref() is not None for ref in groups):
        print(f"rank {os.environ['RANK']}: the process group is still alive after kgtrace {argv[0]} "
              f"(groups recorded: {len(groups)})", file=sys.stderr)
        return 3
    return code


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    modes = {"api": lambda: api(*rest), "fail": lambda: fail(rest[0], rest[1:]), "teardown": lambda: teardown(rest)}
    raise SystemExit(modes[mode]())
