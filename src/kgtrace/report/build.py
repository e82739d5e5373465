"""write_report: one self-contained HTML page (inline CSS, images as data URIs) summarising a run folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import yaml

from kgtrace.core.errors import KgtraceError
from kgtrace.core.io import atomic_write_text
from kgtrace.core.layout import RunLayout
from kgtrace.report import sections as s
from kgtrace.report.html import missing, page


def _guarded(build: Callable[[], str], path: Path, command: str) -> str:
    """A section's body, or a notice when its input file cannot be read."""
    try:
        return build()
    except s.READ_ERRORS as e:
        return s.unreadable(path, e, command)


def _explain_sections(run_dir: Path) -> list[tuple[str, str, str, bool]]:
    """One section per explain/*.json, or one notice saying how to make one."""
    known = list(s.EXPLAIN_TITLES)  # test triples, then predictions, then other files by name
    files = sorted(RunLayout(run_dir).explain.glob("*.json"),
                   key=lambda p: (known.index(p.stem) if p.stem in known else len(known), p.name))
    if not files:
        command = f"kgtrace explain {run_dir} --triples FILE --out {run_dir / 'explain' / 'test.json'}"
        return [("explain", "Explanations", missing("explain/*.json is missing: no triple was explained", command), True)]
    command = f"kgtrace explain {run_dir} --triples FILE --out FILE.json"
    proofs = s.proofs_in(files)  # a prover run's proofs written here show beside the attributions
    paths = s.paths_in(files)  # and explain --rules' paths too, so NAME.paths.json beside NAME.json needs no section
    shown = [p for p in files if not (p.name.endswith(".paths.json") and p.with_name(p.name[:-11] + ".json").is_file())]
    return [(f"explain-{i}", s.explain_title(p), _guarded(lambda p=p: s.explain_section(p, proofs, paths), p, command),
             True) for i, p in enumerate(shown)]


CHECK_FILES = ("faithfulness.json", "lds.json")  # what kgtrace faithfulness writes (removals; --lds)


def faithfulness_folders(run_dir: Path, extra: list[str | Path] = ()) -> list[Path]:
    """Folders of faithfulness checks to show (removals, LDS or both): those directly inside the run folder, then
    ``extra`` ones."""
    inside = sorted({p.parent for name in CHECK_FILES for p in run_dir.glob(f"*/{name}")})
    given = [Path(p) for p in extra]
    missing_given = [str(p) for p in given if not any((p / name).is_file() for name in CHECK_FILES)]
    if missing_given:
        raise KgtraceError(f"--faithfulness {', '.join(missing_given)}: no faithfulness.json or lds.json there. Fix: "
                           "give the --out folder of kgtrace faithfulness")
    return list(dict.fromkeys(p.resolve() for p in inside + given))


def _faithfulness_sections(folders: list[Path]) -> list[tuple[str, str, str, bool]]:
    """One wide section per faithfulness folder (none when there is none: the check is optional)."""
    command = "kgtrace faithfulness RUN_DIR --out FOLDER"
    titled = len(folders) > 1
    return [(f"faithfulness-{i}", "Faithfulness" + (f" ({p.name})" if titled else ""),
             _guarded(lambda p=p: s.faithfulness_section(p), p, command), True)
            for i, p in enumerate(folders)]


def _read_quietly(path: Path, parse) -> dict:
    """A mapping parsed from ``path``, or {} if it is missing or unreadable (the header only shows what it finds)."""
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except (*s.READ_ERRORS, FileNotFoundError):
        return {}
    return data if isinstance(data, dict) else {}


def _cards(run_dir: Path) -> list[tuple[str, str]]:
    """Summary figures for the page header: dataset, model, epochs, realistic test MRR and Hits@10."""
    layout = RunLayout(run_dir)
    config = _read_quietly(layout.config, yaml.safe_load)
    metrics = _read_quietly(layout.test_metrics, json.loads)
    both = metrics.get("both", {}).get("realistic", {})
    among = " (by category)" if metrics.get("restricted") else ""
    cards = [(label, str(config[key])) for label, key in (("dataset", "dataset"), ("model", "model"),
                                                           ("epochs", "epochs")) if key in config]
    cards += [(label + among, f"{both[key]:.3f}") for label, key in (("test MRR", "mrr"), ("test Hits@10", "hits_at_10"))
              if isinstance(both.get(key), int | float)]
    return cards


def build_html(run_dir: str | Path, faithfulness: list[str | Path] = ()) -> str:
    """The report page of ``run_dir`` as a string; ``faithfulness``: check folders outside the run folder to show too."""
    run_dir = Path(run_dir)
    folders = faithfulness_folders(run_dir, faithfulness)
    train, layout = f"kgtrace train --out {run_dir}", RunLayout(run_dir)
    sections = [
        ("training", "Training", _guarded(lambda: s.training_section(run_dir), layout.metrics, train), False),
        ("metrics", "Test metrics", _guarded(lambda: s.metrics_section(run_dir), layout.test_metrics,
                                             f"kgtrace evaluate {run_dir} --out {layout.test_metrics}"), False),
        ("ranks", "Rank histogram", _guarded(lambda: s.ranks_section(run_dir), layout.test_ranks,
                                             f"kgtrace evaluate {run_dir} --per-query {layout.test_ranks}"), False),
        *_explain_sections(run_dir),
        *_faithfulness_sections(folders),
        ("config", "Configuration", _guarded(lambda: s.config_section(run_dir), layout.config, train), True),
    ]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return page(f"kgtrace report: {run_dir.resolve().name}", str(run_dir.resolve()), _cards(run_dir), sections,
                f"written by kgtrace report, {stamp}")


def write_report(run_dir: str | Path, out: str | Path | None = None, faithfulness: list[str | Path] = ()) -> Path:
    """Write the report of ``run_dir`` (default RUN_DIR/report.html) atomically; returns its path.

    faithfulness: folders of ``kgtrace faithfulness`` outside the run folder to show as well
    (those directly inside it are always shown).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise KgtraceError(f"{run_dir}: no such run folder. Fix: give a folder written by kgtrace train")
    target = RunLayout(run_dir).report if out is None else Path(out)
    if target.suffix.lower() not in (".html", ".htm"):
        raise KgtraceError(f"--out {target}: a report is an HTML page. Fix: name it .html, e.g. --out report.html")
    atomic_write_text(target, build_html(run_dir, faithfulness))
    return target
