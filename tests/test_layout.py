"""The package's layout: a module's file name says one thing across the whole tree."""

from collections import defaultdict
from pathlib import Path

import kgtrace

PACKAGE = Path(kgtrace.__file__).parent

# A name may repeat only where its modules play the same role in parallel packages.
SAME_ROLE = {
    "__init__": "each package's front",
    "compiled": "the torch.compile'd kernels of training, ranking and attribution",
    "sharded": "ranking and training over the processes of a distributed job",
    "results": "the typed results of attribution and of faithfulness",
    "reference": "the slow readable reference of TracIn and of the SLD engines",
    "config": "the validated settings of training and of the prover",
    "conve": "ConvE's model and ConvE's closed-form gradients",
    "evaluate": "the library's ranking and the CLI command that calls it",
    "explain": "a prover run's proofs and the CLI command that explains any run",
}


def test_module_names_repeat_only_for_the_same_role_in_parallel_packages():
    where = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        where[path.stem].append(str(path.relative_to(PACKAGE)))
    repeated = {name: sorted(paths) for name, paths in where.items() if len(paths) > 1}
    unexplained = {name: paths for name, paths in repeated.items() if name not in SAME_ROLE}
    assert not unexplained, f"modules sharing a name with no stated common role: {unexplained}"
    stale = set(SAME_ROLE) - set(repeated)
    assert not stale, f"SAME_ROLE lists names no longer repeated: {stale}"
