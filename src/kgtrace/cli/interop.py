"""kgtrace import-pykeen and export-pykeen."""

from __future__ import annotations

import argparse

from kgtrace.cli.common import RawHelpFormatter, model_args
from kgtrace.core.specs import model_names, spec_named

IMPORT_PYKEEN_EPILOG = """\
SOURCE forms (any mix; folders are searched): a pipeline folder written by save_to_directory (its
training_triples/ gives the id maps and training triples, results.json the losses); training-loop
checkpoints (training_kwargs checkpoint_name=...; PyKEEN overwrites that file each epoch, so keep a copy
per epoch for a series); model checkpoints of callbacks='checkpoint' (one file per epoch, weights only).
Each checkpoint becomes an epoch checkpoint of the run, weighed by its learning rate in kgtrace explain;
checkpoints are read without running code. trained_model.pkl is a pickle and is read only with
--trust-pickle. Evaluation splits: --dataset names the data PyKEEN was trained on (its labels are
re-mapped to PyKEEN's ids; its train split must be PyKEEN's training triples); without it the run gets a
dataset folder of PyKEEN's training triples (plus validation_triples/ and testing_triples/ where SOURCE has
them, as export-pykeen writes), enough for kgtrace explain; evaluate needs a test split.
What came from where is recorded in RUN_DIR/pykeen_import.json.
"""


def add_import_pykeen_args(p: argparse.ArgumentParser) -> None:
    p.epilog = IMPORT_PYKEEN_EPILOG
    p.formatter_class = RawHelpFormatter
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="PyKEEN pipeline folder, checkpoint folder or checkpoint file (see below)")
    p.add_argument("--out", required=True, help="run folder to write (must not exist or be empty)")
    p.add_argument("--dataset", metavar="umls|PATH",
                   help="registered dataset or dataset folder with the valid and test splits (default: none; the run "
                        "keeps PyKEEN's training triples only)")
    p.add_argument("--model", choices=[name for name in model_names() if spec_named(name).pykeen],
                   help="the PyKEEN model class, when the weights cannot tell (default: from the weights)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a hyperparameter the weights do not fix, e.g. embedding_height=8 for ConvE (repeatable)")
    p.add_argument("--lr", type=float, help="learning rate of every checkpoint (default: the training-loop "
                                            "checkpoint's optimizer rate)")
    p.add_argument("--trust-pickle", action="store_true",
                   help="also read trained_model.pkl, which runs code named in the file when loaded")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")


def cmd_import_pykeen(args: argparse.Namespace) -> int:
    from kgtrace.interop.pykeen_import import import_pykeen

    report = import_pykeen(args.sources, args.out, dataset=args.dataset, model=args.model,
                           model_args=model_args(args.model_arg), lr=args.lr, trust_pickle=args.trust_pickle,
                           overwrite=args.overwrite)
    print(report.summary())
    return 0


def add_export_pykeen_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Write a kgtrace run as files PyKEEN loads: training_triples/ (and validation_triples/, "
                     "testing_triples/) via TriplesFactory.to_path_binary, model_state.pt and checkpoints/ as "
                     "{'state_dict', 'version'} files, config.json with the model class and model_kwargs. Load with "
                     "TriplesFactory.from_path_binary, model_resolver.make(config['model'], config['model_kwargs'], "
                     "triples_factory=...) and load_state_dict (docs/pykeen.md). Needs PyKEEN installed.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a kgtrace run folder")
    p.add_argument("--out", required=True, help="folder to write (must not exist or be empty)")
    p.add_argument("--checkpoint", default="best", help="the model written as model_state.pt: best, last or a file")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")


def cmd_export_pykeen(args: argparse.Namespace) -> int:
    from kgtrace.interop.pykeen_export import export_pykeen

    print(export_pykeen(args.run_dir, args.out, checkpoint=args.checkpoint, overwrite=args.overwrite).summary())
    return 0


