"""The report's sections, one function each: read a run folder's file, return the section's HTML body.

A missing input gives a notice naming the file and the command that writes it; a file
that cannot be parsed gives a notice with the parser's message. Neither stops the report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import yaml

from kgtrace.attribution.methods import method_note
from kgtrace.attribution.results import Explanation, Explanations, Influencer
from kgtrace.core.layout import RunLayout
from kgtrace.data.lookup import NamedTriple
from kgtrace.display.plots import png_bytes, rank_histogram_figure, training_curve_figure
from kgtrace.faithfulness.plot import faithfulness_figure
from kgtrace.faithfulness.results import AgreementRow, FaithfulnessResult, FaithfulnessRow, LdsResult, LdsRow
from kgtrace.prover.proofs import Proofs, TripleProof
from kgtrace.prover.rule_paths import KIND as PATHS_KIND
from kgtrace.prover.rule_paths import GraphPaths, TriplePaths
from kgtrace.report.drawing import DRAWN, DRAWN_RULES, OPP, PATH, PRO, TEST, paths_svg, subgraph_svg
from kgtrace.report.html import esc, image, missing, number, rank_text, table

SIDES = ("head", "tail", "both")
POLICIES = ("realistic", "optimistic", "pessimistic")
METRICS = (("mrr", "MRR"), ("mr", "MR"), ("hits_at_1", "Hits@1"), ("hits_at_3", "Hits@3"), ("hits_at_10", "Hits@10"))
CONFIG_COLUMNS = 2
EXPLAIN_TITLES = {"test": "Test triples", "predicted": "Best new predictions"}
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, IndexError, yaml.YAMLError, pl.exceptions.PolarsError)


def unreadable(path: Path, error: Exception, command: str) -> str:
    """The notice of a file that exists but cannot be read."""
    return missing(f"{path.name} could not be read ({type(error).__name__}: {error})", command)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The epoch records of metrics.jsonl (blank lines skipped)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ----------------------------------------------------------------------------- config


def _flatten(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested mappings as dotted keys, e.g. model_args.embedding_dim."""
    rows = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            rows.extend(_flatten(value, f"{prefix}{key}."))
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def config_section(run_dir: Path) -> str:
    """config.yaml as a two-column table of settings."""
    path = RunLayout(run_dir).config
    if not path.is_file():
        return missing(f"{path.name} is missing", f"kgtrace train --out {run_dir}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError("expected a mapping of settings")
    cells = [(f"<code>{esc(k)}</code>", f"<b>{esc(json.dumps(v) if isinstance(v, list | dict) else v)}</b>")
             for k, v in _flatten(data)]
    return (f"<details><summary>the {len(cells)} settings of the run (config.yaml)</summary>"
            + table(("setting", "value") * CONFIG_COLUMNS, _side_by_side(cells, CONFIG_COLUMNS)) + "</details>")


def _side_by_side(pairs: list[tuple[str, str]], columns: int) -> list[list[str]]:
    """Rows that show ``pairs`` in ``columns`` column pairs, read down each pair; the last is padded with blanks."""
    height = -(-len(pairs) // columns)
    padded = pairs + [("", "")] * (height * columns - len(pairs))
    return [[cell for col in range(columns) for cell in padded[col * height + row]] for row in range(height)]


# ----------------------------------------------------------------------------- training


def training_section(run_dir: Path) -> str:
    """The training curve re-plotted from metrics.jsonl, and the last epoch's figures."""
    path = RunLayout(run_dir).metrics
    if not path.is_file():
        return missing(f"{path.name} is missing", f"kgtrace train --out {run_dir}")
    records = read_records(path)
    if not records:
        return missing(f"{path.name} has no epoch yet", f"kgtrace train --out {run_dir}")
    last = records[-1]
    valid = [r for r in records if "valid_mrr" in r]
    facts = f"{len(records)} epochs, final loss <b>{number(last['loss'], 5)}</b>, " \
            f"{number(sum(r.get('seconds', 0.0) for r in records), 1)} s of training"
    note = ""
    if valid:
        best = max(valid, key=lambda r: r["valid_mrr"])
        facts += f"; best validation MRR <b>{number(best['valid_mrr'])}</b> at epoch {number(best['epoch'])}"
        note = ('<p class="facts">Validation ranks are filtered with the training and validation triples only: the '
                "test triples stay unseen until the end, so a test triple that answers a validation query counts "
                "against it. That is why validation MRR sits below the test MRR, which is filtered with all three "
                "splits.</p>")
    return f'<p class="facts">{facts}</p>{note}' + image(png_bytes(training_curve_figure(records)), "training curve")


# ----------------------------------------------------------------------------- metrics


def metrics_section(run_dir: Path, name: str = "test_metrics.json") -> str:
    """Filtered test metrics: one row per side and tie policy (realistic in bold)."""
    path = run_dir / name
    if not path.is_file():
        return missing(f"{name} is missing", f"kgtrace evaluate {run_dir} --out {path}")
    metrics = json.loads(path.read_text(encoding="utf-8"))
    rows, classes = [], []
    for side in (s for s in SIDES if s in metrics):
        policies = [p for p in POLICIES if p in metrics[side]]
        cells = {p: [number(metrics[side][p].get(key), 2 if key == "mr" else 4) for key, _ in METRICS] for p in policies}
        if len({tuple(c) for c in cells.values()}) == 1:  # no tie changes a rank: one row says it all
            rows.append([esc(side), "all three agree"] + cells[policies[0]])
            classes.append("main")
            continue
        for policy in policies:
            rows.append([esc(side), esc(policy)] + cells[policy])
            classes.append("main" if policy == "realistic" else "")
    candidates = metrics.get("candidates", "?")
    against = "all entities" if candidates == "all" else f"{esc(candidates)} sampled entities"
    sides = " and ".join(side for side in ("head", "tail") if side in metrics)
    facts = (f"{number(metrics.get('num_queries', '?'))} test triples, each ranked ({sides}) against {against}, "
             "filtered: the other known true answers (train, valid and test) are left out of the ranking.")
    if metrics.get("restricted"):
        facts += (" Candidates are restricted by node category: each relation's heads and tails only among the "
                  "categories it takes in training (a drug's <i>treats</i> answers are diseases).")
        every = metrics.get("unrestricted", {}).get("both", {}).get("realistic", {})
        if every:
            facts += (f" Against every entity (the figure the field publishes): MRR <b>{number(every.get('mrr'))}"
                      f"</b>, Hits@10 <b>{number(every.get('hits_at_10'))}</b>.")
    ties = ('<p class="facts">Ties: when candidates score exactly as the true answer, <i>realistic</i> ranks it in '
            "the middle of them (the figure to quote), <i>optimistic</i> first and <i>pessimistic</i> last; a side "
            "shows one row when the three agree.</p>")
    ranked = table(("side", "ties") + tuple(n for _, n in METRICS), rows,
                   numeric=(False, False) + (True,) * len(METRICS), row_classes=classes)
    return f'<p class="facts">{facts}</p>{chance(metrics)}{DEFINITIONS}{ties}{ranked}'


DEFINITIONS = ('<dl class="defs">'
               "<dt>rank</dt><dd>where the true answer comes among the candidates scored by the model: 1 is best</dd>"
               "<dt>MRR</dt><dd>mean reciprocal rank: the mean of 1 / rank, from 0 to 1 (1: every answer first)</dd>"
               "<dt>MR</dt><dd>mean rank: lower is better; one bad rank moves it a lot</dd>"
               "<dt>Hits@k</dt><dd>the share of test triples whose answer ranks k or better</dd>"
               "<dt>adjusted MRR</dt><dd>MRR rescaled so that a model scoring at random gets 0 and a perfect one 1 "
               "(Berrendorf et al.): it compares graphs and candidate sets of different sizes</dd></dl>")


def chance(metrics: dict) -> str:
    """The model's MRR beside its adjusted MRR and the MRR a random ranking of the same candidates would expect."""
    both = metrics.get("both", {}).get("realistic", {})
    mrr, adjusted = both.get("mrr"), both.get("adjusted_mrr")
    if not all(isinstance(v, int | float) and v == v for v in (mrr, adjusted)) or adjusted >= 1:
        return ""
    random_mrr = (mrr - adjusted) / (1 - adjusted)  # adjusted = (mrr - E) / (1 - E), solved for E
    return (f'<p class="facts">How good: MRR <b>{number(mrr)}</b> (both sides, realistic ties) against '
            f"<b>{number(random_mrr)}</b> for a random ranking of the same candidates; adjusted MRR "
            f"<b>{number(adjusted)}</b> (0: no better than chance, 1: perfect).</p>")


# ----------------------------------------------------------------------------- ranks


def ranks_section(run_dir: Path, name: str = "test_ranks.tsv") -> str:
    """Histogram of the realistic filtered ranks per side, from the per-query table."""
    path = run_dir / name
    if not path.is_file():
        return missing(f"{name} is missing", f"kgtrace evaluate {run_dir} --per-query {path}")
    frame = pl.read_csv(path, separator="\t", infer_schema_length=0)
    ranks = {side: frame.filter(pl.col("side") == side)["rank_realistic"].cast(pl.Float64).to_numpy()
             for side in ("head", "tail") if (frame["side"] == side).any()}
    if not ranks:
        return missing(f"{name} has no ranked query", f"kgtrace evaluate {run_dir} --per-query {path}")
    every = np.concatenate(list(ranks.values()))
    facts = f"{len(every):,} queries; median rank <b>{number(float(np.median(every)), 1)}</b>, " \
            f"rank 1 for <b>{100 * float(np.mean(every <= 1)):.1f}%</b>"
    return f'<p class="facts">{facts}</p>' + image(png_bytes(rank_histogram_figure(ranks)), "rank histogram")


# ----------------------------------------------------------------------------- explanations


def explain_title(path: Path) -> str:
    """A section title from an explain file's stem: known stems have their own, others are title-cased; a paths
    file's (NAME.paths.json) is its NAME's, marked as paths."""
    stem, paths = (path.stem[:-6], True) if path.stem.endswith(".paths") else (path.stem, False)
    title = EXPLAIN_TITLES.get(stem, stem.replace("_", " ").replace("-", " ").title())
    return f"{title}: paths in the graph" if paths else title


def label(text: object) -> str:
    """Escaped text kept on one line: a label (snake_case, CURIE) is never broken inside."""
    return f'<span class="label">{esc(text)}</span>'


def _entity(key: str, name: str) -> str:
    """The readable name of an entity, with its label in small print when they differ."""
    return label(name) if name == key else f'{label(name)} <span class="rel">({label(key)})</span>'


SHARES = {"head": "its head", "tail": "its tail", "both": "both", "neither": "neither"}
INFLUENCE_HEADER = ("#", "training row", "head", "relation", "tail", "shares with the triple", "influence")


def _influence_rows(entries: tuple[Influencer, ...], kind: str, largest: float) -> list[list[str]]:
    bar = "pro" if kind == "proponents" else "opp"
    rows = []
    for i, e in enumerate(entries, 1):
        t, width = e.triple, round(60 * abs(e.influence) / largest) if largest else 0
        rows.append([str(i), esc(e.train_index), _entity(t.head, t.head_name),
                     f'<span class="rel">{label(t.relation_name)}</span>', _entity(t.tail, t.tail_name),
                     esc(SHARES.get(e.shares, e.shares)),
                     f'<span class="bar {bar}" style="width:{width}px"></span>{number(e.influence, 5)}'])
    return rows


def influence_tables(item: Explanation) -> str:
    """Proponents and opponents of one item, with readable names and bars scaled to the largest |influence|."""
    largest = max((abs(e.influence) for e in item.proponents + item.opponents), default=0.0)
    parts = []
    for kind, entries, cls in (("proponents", item.proponents, "kind-pro"), ("opponents", item.opponents, "kind-opp")):
        if entries:
            rows = _influence_rows(entries, kind, largest)
            parts.append(f'<div><h3 class="{cls}">{kind.title()}</h3><div class="scroll">'
                         + table(INFLUENCE_HEADER, rows, numeric=(True, True, False, False, False, False, True))
                         + "</div></div>")
    return "".join(parts) or "<p>No influential training triple was recorded.</p>"


def proof_steps(item: TripleProof) -> str:
    """A prover's proof of one triple (``kgtrace explain PROVER_RUN``): its steps as a table, or why there is none."""
    if not item.proved:
        return f"<p>The {esc(item.method)} prover found no proof within {esc(item.depth_limit)} steps.</p>"
    rows = [[str(i), esc(step.goal), esc(step.resolved_with()), esc(step.goals_after)]
            for i, step in enumerate(item.steps, 1)]
    return (f'<p class="facts">proved in {len(rows)} steps, confidence <b>{number(item.confidence)}</b> '
            f'({esc(item.method)} prover)</p>'
            + table(("#", "goal", "resolved with", "goals left"), rows, numeric=(True, False, False, False)))


SPLIT_NOTES = {"train": "a training triple: its strongest proponent is itself",
               "valid": "a validation triple", "test": "a test triple (never trained on)",
               None: "a new prediction (in no split)"}  # '': a file that did not record it, no note
SIGN_NOTE = ("Positive: training on that triple raised the prediction's score; negative: it lowered it. "
             "<i>Proponents</i> are the training triples of highest influence, <i>opponents</i> those of lowest: "
             "where fewer triples lowered the score than the list holds, opponents go on with those that raised "
             "it least (proponents likewise with those that lowered it least), and the sign tells them apart. "
             "Sizes compare within one prediction. A prediction's "
             "probability is the sigmoid of its score; what makes it a prediction is its rank among all "
             "candidates (training on every entity at once, with label smoothing, keeps probabilities modest).")


def influence_note(method: str) -> str:
    """What the influence column means for ``method`` (files written before methods were recorded: TracIn)."""
    name, what = method_note(method)
    return f"{esc(name)} of a training triple on a prediction (<code>{esc(method)}</code>): {esc(what)}. {SIGN_NOTE}"
LEGEND = ((TEST, ' stroke-dasharray="7 4"', "explained triple"), (PRO, "", "proponent"), (OPP, "", "opponent"))
PATH_LEGEND = ((TEST, ' stroke-dasharray="7 4"', "explained triple"), (PATH, "", "fact of a path"))
Key = tuple[str, str, str]  # (head, relation, tail) labels


def _legend(entries: tuple = LEGEND, note: str = f"the strongest {DRAWN} of each; width grows with |influence|") -> str:
    keys = "".join(f'<svg width="26" height="10"><line x1="1" y1="5" x2="25" y2="5" stroke="{colour}" '
                   f'stroke-width="3"{dash}/></svg> {text} &nbsp; ' for colour, dash, text in entries)
    return f'<p class="facts legend">{keys}{note}; hover a name for all of it</p>'


def _title(t: NamedTriple) -> str:
    return (f"{_entity(t.head, t.head_name)} <span class=\"rel\">\u2014 {label(t.relation_name)}"
            f" \u2192</span> {_entity(t.tail, t.tail_name)}")


def explanation(item: Explanation, proofs: dict[Key, TripleProof] | None = None,
                paths: dict[Key, TriplePaths] | None = None) -> str:
    """One explained triple: title, probability and ranks, the drawing, the influence tables (and its proof and the
    paths that imply it, if any)."""
    t = item.triple
    facts = (f"probability <b>{number(item.probability, 3)}</b> (score {number(item.score)}, a logit: probability = "
             f"sigmoid(score)) &middot; filtered rank (realistic): tail <b>{rank_text(item.rank_tail)}</b>, "
             f"head <b>{rank_text(item.rank_head)}</b>"
             f" &middot; checkpoints {esc(', '.join(map(str, item.checkpoints)))}")
    if item.split != "":
        facts += f" &middot; {esc(SPLIT_NOTES.get(item.split, item.split))}"
    proof = (proofs or {}).get((t.head, t.relation, t.tail))
    proved = f'<h3>Proof</h3>{proof_steps(proof)}' if proof else ""
    found = (paths or {}).get((t.head, t.relation, t.tail))
    implied = f"<h3>Paths in the graph that imply it</h3>{paths_block(found)}" if found else ""
    return (f'<div class="triple"><h3>{_title(t)}</h3><p class="facts">{facts}</p>'
            f'<figure class="drawing">{subgraph_svg(item)}</figure>{_legend()}'
            f'<div class="influencers">{influence_tables(item)}</div>{proved}{implied}</div>')


def paths_block(item: TriplePaths) -> str:
    """The paths that imply one triple: the drawing of the strongest rules' paths and a table of every rule listed."""
    if not item.rules:
        return "<p>No rule of the file predicts this triple.</p>"
    rows = [[str(i), number(r.confidence, 3), esc(r.text), str(r.count),
             esc(" ; ".join(f.text() for f in r.groundings[0]) if r.groundings else "")]
            for i, r in enumerate(item.rules, 1)]
    note = (f"the first path of each of the {min(DRAWN_RULES, len(item.rules))} strongest rules; "
            "width grows with the rule's confidence")
    return (f'<p class="facts">{len(item.rules)} rule(s) predict it, strongest first: {esc(PATHS_KIND)}</p>'
            f'<figure class="drawing">{paths_svg(item)}</figure>{_legend(PATH_LEGEND, note)}<div class="scroll">'
            + table(("#", "confidence", "rule", "paths", "a path"), rows, numeric=(True, True, False, True, False))
            + "</div>")


def _by_triple(files: list[Path], items_of) -> dict:
    """(head, relation, tail) -> item, over the items ``items_of`` finds in each file's JSON (none: ``()``)."""
    found = {}
    for path in files:
        try:
            items = items_of(json.loads(path.read_text(encoding="utf-8")))
        except READ_ERRORS:  # the file's own section says what is wrong with it
            continue
        found.update((item.key(), item) for item in items)
    return found


def paths_in(files: list[Path]) -> dict[Key, TriplePaths]:
    """(head, relation, tail) -> the paths that imply it, from every paths file among ``files`` (explain --rules)."""
    return _by_triple(files, lambda data: GraphPaths.from_dict(data) if GraphPaths.holds(data) else ())


def proofs_in(files: list[Path]) -> dict[Key, TripleProof]:
    """(head, relation, tail) -> proof, from every explain file a prover run wrote ({"proofs": [...]})."""
    return _by_triple(files, lambda data: Proofs.from_dict(data) if isinstance(data, dict) and "proofs" in data else ())


def explain_section(path: Path, proofs: dict[Key, TripleProof] | None = None,
                    paths: dict[Key, TriplePaths] | None = None) -> str:
    """Every explained triple of one ``kgtrace explain --out FILE.json``: attributions (each beside its proof and
    its paths when ``proofs`` or ``paths`` hold them), a prover run's proofs, or paths alone."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if GraphPaths.holds(data):
        found = GraphPaths.from_dict(data)
        return (f'<p class="facts">{len(found)} triple(s) from <code>{esc(path.name)}</code>, by the rules of '
                f'<code>{esc(found.rules)}</code></p>'
                + "".join(f'<div class="triple"><h3>{_title(item.triple)}</h3>{paths_block(item)}</div>'
                          for item in found))
    if "proofs" in data:
        found = Proofs.from_dict(data)
        return f'<p class="facts">{len(found)} proof(s) from <code>{esc(path.name)}</code></p>' + "".join(
            f'<div class="triple"><h3>{label(item.relation)}({label(item.head)}, '
            f'{label(item.tail)})</h3>{proof_steps(item)}</div>' for item in found)
    items = Explanations.from_dict(data)
    if not len(items):
        return "<p>The file lists no explained triple.</p>"
    note = influence_note(items[0].method)
    if items[0].method_reason:  # explain --method auto says why it chose the method
        note += f" Method chosen: {esc(items[0].method_reason)}."
    return (f'<p class="facts">{len(items)} triple(s) from <code>{esc(path.name)}</code>. {note}</p>'
            + "".join(explanation(item, proofs, paths) for item in items))


# ----------------------------------------------------------------------------- faithfulness

FAITHFULNESS_COLUMNS = (("variant", "variant", None), ("method", "method", None), ("k", "k", None),
                        ("n", "n", None), ("pd", "PD %", 100.0), ("tc", "TC %", 100.0),
                        ("score_drop", "score drop", 1.0), ("rank_change", "rank change", 1.0),
                        ("mrr_drop", "MRR drop", 1.0), ("seconds", "s / training", 1.0))
AGREEMENT_COLUMNS = (("cheap", "cheap option", None), ("method", "method", None), ("k", "k", None), ("n", "n", None),
                     ("pd_agreement", "PD agrees %", 100.0), ("tc_agreement", "TC agrees %", 100.0),
                     ("score_drop_pearson", "score drop r", 1.0), ("prob_drop_pearson", "prob. drop r", 1.0))


def _cells(row: FaithfulnessRow | AgreementRow, columns: tuple) -> list[str]:
    """A row's cells: text escaped, numbers scaled (percent) and rounded; NaN and None as a dash."""
    cells = []
    for key, _, scale in columns:
        value = getattr(row, key)
        if scale is None or not isinstance(value, int | float) or value != value:
            cells.append("&ndash;" if value is None or value != value else esc(value))
        else:
            cells.append(number(scale * value, 1 if scale == 100.0 else 3))
    return cells


def faithfulness_section(folder: Path) -> str:
    """A faithfulness folder's checks: the removal table and plot (faithfulness.json), the LDS table (lds.json)."""
    body = removal_section(folder) if (folder / "faithfulness.json").is_file() else ""
    if (folder / "lds.json").is_file():
        body += lds_section(folder)
    return body


def removal_section(folder: Path) -> str:
    """The table of a faithfulness check (kgtrace faithfulness --out FOLDER), its plot, and the agreement table."""
    data = FaithfulnessResult.read(folder / "faithfulness.json")
    facts = (f"{len(data.predictions.triples)} predictions ({esc(data.predictions.how)}); methods "
             f"{esc(', '.join(data.settings.methods))}; trained again up to epoch {number(data.epochs)} "
             f"(<code>{esc(folder.name)}</code>). PD: share of predictions whose probability dropped; TC: share "
             "no longer top-1; method <i>none</i> is the control, trained again with nothing removed.")
    numeric = tuple(scale is not None or key in ("k", "n") for key, _, scale in FAITHFULNESS_COLUMNS)
    body = f'<p class="facts">{facts}</p>' + table(tuple(t for _, t, _ in FAITHFULNESS_COLUMNS),
                                                    [_cells(r, FAITHFULNESS_COLUMNS) for r in data.table], numeric)
    body += image(png_bytes(faithfulness_figure(data.table)), "faithfulness: PD, TC and MRR drop against k")
    if data.agreement:
        numeric = tuple(scale is not None or key in ("k", "n") for key, _, scale in AGREEMENT_COLUMNS)
        body += "<h3>Fine-tuning against retraining</h3>" + table(
            tuple(t for _, t, _ in AGREEMENT_COLUMNS), [_cells(r, AGREEMENT_COLUMNS) for r in data.agreement],
            numeric)
    return body


def lds_section(folder: Path) -> str:
    """The linear datamodeling score of each method (kgtrace faithfulness --lds), best first, with what it means."""
    data = LdsResult.read(folder / "lds.json")
    facts = (f"Linear datamodeling score: {number(data.subsets)} models trained from scratch, each on a random "
             f"{number(100 * data.fraction)}% of the training triples; for each of {len(data.predictions)} "
             "predictions, the Spearman correlation over those models between the prediction's score (or its "
             "log-probability among all tails) and the sum of a method's attributions over the model's training "
             "triples. 1: the method orders the retrained models as they really score the prediction; 0: no better "
             "than chance. The interval is a bootstrap over the predictions.")
    rows: dict[str, dict[str, LdsRow]] = {}
    for row in data.rows:
        rows.setdefault(row.method, {})[row.output] = row
    ordered = sorted(rows.items(), key=lambda item: -_sort_lds(item[1].get("score")))
    cells = [[esc(method), *(_lds_cell(r.get(output)) for output in ("score", "log_prob")),
              number(next(iter(r.values())).seconds, 3)] for method, r in ordered]
    body = "<h3>Linear datamodeling score</h3>" + f'<p class="facts">{facts}</p>'
    body += table(("method", "LDS, score", "LDS, log-probability", "s"), cells, (False, True, True, True))
    for method, error in data.errors.items():
        body += f'<p class="facts">{esc(method)}: not scored: {esc(error)}</p>'
    return body


def _sort_lds(row: LdsRow | None) -> float:
    """A method's LDS on the score for sorting, best first; -2 (below any) when missing."""
    return -2.0 if row is None or row.lds != row.lds else row.lds


def _lds_cell(row: LdsRow | None) -> str:
    """'0.412 [0.35, 0.47]': the mean LDS and its interval; a dash when missing or undefined."""
    if row is None or row.lds != row.lds:
        return "&ndash;"
    return f"{row.lds:.3f} [{row.low:.2f}, {row.high:.2f}]"
