"""Rule files: read, check against a dataset's relations, write.

Two line formats are read (blank lines and ``#`` comments are skipped; a ``#`` after a rule
starts a comment too):

* kgtrace's: ``CONFIDENCE  HEAD :- BODY1, BODY2``, e.g. ``0.83  r(X,Y) :- s(X,Z), t(Z,Y)``;
* the prototype's: ``NAME:CONFIDENCE:BODY1 , BODY2 -> HEAD``, e.g. ``r7:0.83:s(X,Z) , t(Z,Y) -> r(X,Y)``.

Atoms are ``relation(A,B)`` with relation labels as in the dataset (or integer ids) and
variables as arguments: names starting with an upper-case letter or ``_``. An argument in double
quotes is a constant, an entity label of the dataset (AnyBURL's acyclic rules:
``0.42  treats(X,"scabies") :- interacts_with(X,"permethrin")``). A rule's head has two distinct
variables, or one variable and one constant; each head variable occurs in the body; the body has 1
to ``max_body`` atoms; the confidence is in (0, 1]. Every problem of a file is reported at once,
each as ``FILE:LINE: problem; fix: ...``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kgtrace.core.errors import ConfigError, KgtraceError
from kgtrace.core.io import atomic_write_text
from kgtrace.data.lookup import lookup_problem
from kgtrace.data.vocab import Vocab
from kgtrace.prover.logic import VARIABLE_NAMES, Atom, Rule, constant_of, constant_term

__all__ = ["DEFAULT_MAX_BODY", "RuleSet", "format_rule", "parse_rules", "read_rules", "write_rules"]

DEFAULT_MAX_BODY = 2
_TERM = r'("[^"]*"|[^\s(),"]+)'
_ATOM = re.compile(rf"\s*([^\s(),]+)\s*\(\s*{_TERM}\s*,\s*{_TERM}\s*\)\s*")
_BEFORE_COMMENT = re.compile(r'(?:[^#"]|"[^"]*")*')  # a line up to its '#' comment, quoted constants kept whole
_VARIABLE = re.compile(r"[A-Z_][A-Za-z0-9_]*")
_LABEL_FORBIDDEN = re.compile(r"[\s(),#]")
_CONSTANT_FORBIDDEN = re.compile(r'["\n]')


@dataclass(frozen=True)
class RuleSet:
    """Rules over one dataset's relations, in file order (the engines try them in this order)."""

    rules: tuple[Rule, ...]
    num_relations: int

    def __len__(self) -> int:
        return len(self.rules)

    @property
    def max_body(self) -> int:
        return max((len(rule.body) for rule in self.rules), default=1)

    @property
    def max_free(self) -> int:
        return max((rule.num_free for rule in self.rules), default=0)

    @property
    def has_constants(self) -> bool:
        return any(rule.has_constants for rule in self.rules)

    def require_variables(self) -> None:
        """Refuse rules that name entities: the SLD engines (BFS, the policy) unify rules over variables only."""
        named = [rule for rule in self.rules if rule.has_constants]
        if named:
            where = named[0].source or "a rule built in code"
            raise ConfigError([f"{where}: {len(named)} rule(s) name an entity (AnyBURL's acyclic rules); fix: rank "
                               "with them by rule application (kgtrace prove apply), or drop them for bfs and policy"])

    def by_head(self) -> list[list[int]]:
        """Rule indices per head relation [R], in file order."""
        heads: list[list[int]] = [[] for _ in range(self.num_relations)]
        for i, rule in enumerate(self.rules):
            heads[rule.head].append(i)
        return heads


# ----------------------------------------------------------------------------- reading


def read_rules(path: str | os.PathLike, relations: Vocab, *, entities: Vocab | None = None,
               max_body: int = DEFAULT_MAX_BODY) -> RuleSet:
    """Read a rule file (either format, mixed freely) against the dataset's relation labels (and entity labels,
    which rules with constants need)."""
    path = Path(path)
    if not path.is_file():
        raise KgtraceError(f"{path}: no such rule file. Fix: pass a rule file, or mine one with "
                           "kgtrace rules mine --dataset NAME --out rules.txt")
    text = path.read_text(encoding="utf-8-sig")
    return parse_rules(text.splitlines(), relations, entities=entities, source=str(path), max_body=max_body)


def parse_rules(lines: Iterable[str], relations: Vocab, *, entities: Vocab | None = None, source: str = "<rules>",
                max_body: int = DEFAULT_MAX_BODY) -> RuleSet:
    """Parse rule lines; ConfigError lists every bad line as SOURCE:LINE: problem; fix."""
    rules, problems = [], []
    for number, line in enumerate(lines, 1):
        before = _BEFORE_COMMENT.match(line)
        text = (before.group(0) if before else line).strip()
        if not text:
            continue
        where = f"{source}:{number}"
        try:
            rules.append(_parse_line(text, relations, entities, where, max_body))
        except _LineError as error:
            problems.append(f"{where}: {error.problem}; fix: {error.fix}")
    if problems:
        raise ConfigError(problems)
    return RuleSet(tuple(rules), len(relations))


class _LineError(Exception):
    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem, self.fix = problem, fix


def _parse_line(text: str, relations: Vocab, entities: Vocab | None, where: str, max_body: int) -> Rule:
    if ":-" in text:
        confidence_text, clause = (text.split(None, 1) + [""])[:2]
        head_text, _, body_text = clause.partition(":-")
        name = ""
    elif "->" in text:
        name, _, rest = text.partition(":")
        confidence_text, _, clause = rest.partition(":")
        body_text, _, head_text = clause.rpartition("->")
        name = name.strip()
    else:
        raise _LineError(f"{text!r} is not a rule",
                         "write 'CONFIDENCE  r(X,Y) :- s(X,Z), t(Z,Y)' or 'NAME:CONFIDENCE:s(X,Z) , t(Z,Y) -> r(X,Y)'")
    confidence = _confidence(confidence_text.strip())
    head = _atoms(head_text, "head")
    if len(head) != 1:
        raise _LineError(f"the head {head_text.strip()!r} must be one atom", "write one head atom, e.g. r(X,Y)")
    body = _atoms(body_text, "body")
    if not 1 <= len(body) <= max_body:
        raise _LineError(f"the body has {len(body)} atoms", f"use 1 to {max_body} body atoms (max_body={max_body})")
    return _build_rule(head[0], body, confidence, relations, entities, name, where)


def _confidence(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _LineError(f"confidence {text!r} is not a number", "start the rule with its confidence, e.g. 0.83") from None
    if not 0.0 < value <= 1.0:
        raise _LineError(f"confidence {value} is outside (0, 1]", "give a confidence above 0 and at most 1")
    return value


def _atoms(text: str, part: str) -> list[tuple[str, str, str]]:
    """'s(X,Z), t(Z,Y)' -> [(label, var, var), ...]; atoms separated by commas."""
    atoms, position = [], 0
    text = text.strip()
    while position < len(text):
        match = _ATOM.match(text, position)
        if not match:
            raise _LineError(f"cannot read the {part} {text!r} at {text[position:]!r}",
                             "write atoms as relation(A,B) separated by commas")
        atoms.append(match.groups())
        position = match.end()
        if position < len(text):
            if text[position] != ",":
                raise _LineError(f"expected ',' between atoms of the {part} {text!r}", "separate atoms by commas")
            position += 1
    if not atoms:
        raise _LineError(f"the {part} is empty", f"write at least one atom in the {part}")
    return atoms


def _build_rule(head: tuple[str, str, str], body: list[tuple[str, str, str]], confidence: float,
                relations: Vocab, entities: Vocab | None, name: str, where: str) -> Rule:
    labels = [head[0]] + [atom[0] for atom in body]
    ids = []
    for label in labels:
        relation, problem = lookup_problem(relations, label, "relation", "relation")
        if problem:
            what, _, hint = problem.partition("; ")
            raise _LineError(what, hint or "use a relation label of the dataset")
        ids.append(relation)
    arguments = [head[1], head[2]] + [term for atom in body for term in atom[1:]]
    bad = [term for term in arguments if not term.startswith('"') and not _VARIABLE.fullmatch(term)]
    if bad:
        raise _LineError(f"{bad[0]!r} is neither a variable nor a quoted constant",
                         f'name variables with a capital letter (X, Y, Z) and quote entity labels ("{bad[0]}")')
    constant = _constants(arguments, entities)
    head_variables = [term for term in head[1:] if term not in constant]
    if head[1] == head[2] or not head_variables:
        raise _LineError(f"the head r({head[1]},{head[2]}) needs two distinct variables or a variable and a constant",
                         "write r(X,Y), r(X,\"entity\") or r(\"entity\",X)")
    local = {variable: k for k, variable in enumerate(head_variables)}
    for term in arguments[2:]:  # body-only variables from 2, with one head variable or two
        if term not in constant and term not in local:
            local[term] = 2 + len(local) - len(head_variables)
    in_body = set(arguments[2:])
    unbound = [v for v in head_variables if v not in in_body]
    if unbound:
        raise _LineError(f"the head variable {unbound[0]} does not occur in the body",
                         "use every head variable in the body (range-restricted rules)")
    term = {**local, **constant}
    atoms: tuple[Atom, ...] = tuple((ids[i + 1], term[a], term[b]) for i, (_, a, b) in enumerate(body))
    return Rule(ids[0], atoms, confidence, name, where, head_args=(term[head[1]], term[head[2]]))


def _constants(arguments: list[str], entities: Vocab | None) -> dict[str, int]:
    """The quoted arguments as local terms (`constant_term`)."""
    quoted = sorted({term for term in arguments if term.startswith('"')})
    if quoted and entities is None:
        raise _LineError(f"{quoted[0]} is a constant, which needs the dataset's entities",
                         "read the rules with the dataset (kgtrace prove apply does)")
    found = {}
    for term in quoted:
        entity, problem = lookup_problem(entities, term[1:-1], "constant", "entity", allow_ids=False)
        if problem:
            what, _, hint = problem.partition("; ")
            raise _LineError(what, hint or "quote an entity label of the dataset")
        found[term] = constant_term(entity)
    return found


# ----------------------------------------------------------------------------- writing


def format_rule(rule: Rule, relation_labels: tuple[str, ...] | list[str], digits: int = 6,
                entity_labels: tuple[str, ...] | list[str] | None = None) -> str:
    """The kgtrace text form, e.g. ``0.830000  r(X,Y) :- s(X,Z), t(Z,Y)``; constants quoted (``r(X,"scabies")``),
    from ``entity_labels``."""
    def term(local: int) -> str:
        if local >= 0:
            return VARIABLE_NAMES[local] if local < len(VARIABLE_NAMES) else f"V{local}"
        if entity_labels is None:
            raise KgtraceError("format_rule: a rule with constants needs entity_labels")
        return f'"{entity_labels[constant_of(local)]}"'

    def atom(relation: int, a: int, b: int) -> str:
        return f"{relation_labels[relation]}({term(a)},{term(b)})"

    body = ", ".join(atom(*a) for a in rule.body)
    return f"{rule.confidence:.{digits}f}  {atom(rule.head, *rule.head_args)} :- {body}"


def write_rules(path: str | os.PathLike, rules: Iterable[Rule], relation_labels: tuple[str, ...],
                comments: Iterable[str] | None = None, header: Iterable[str] = (),
                entity_labels: tuple[str, ...] | None = None) -> None:
    """Write rules in the kgtrace format, atomically; ``comments`` (one per rule) go after a '#'; rules with
    constants name them from ``entity_labels``."""
    bad = [label for label in relation_labels if _LABEL_FORBIDDEN.search(label)]
    if bad:
        raise KgtraceError(f"relation label {bad[0]!r} holds a space, parenthesis, comma or '#', which the rule "
                           "format cannot write. Fix: relabel the relation (rel_dict) without them")
    rules = list(rules)
    named = {constant_of(t) for rule in rules for t in (*rule.head_args, *(x for a in rule.body for x in a[1:])) if t < 0}
    bad = [entity_labels[e] for e in sorted(named) if _CONSTANT_FORBIDDEN.search(entity_labels[e])] \
        if entity_labels is not None else []
    if bad:
        raise KgtraceError(f"entity label {bad[0]!r} holds a double quote or a line break, which a rule's quoted "
                           "constant cannot hold. Fix: relabel the entity (node_dict), or learn without constants")
    notes = list(comments) if comments is not None else [""] * len(rules)
    lines = [f"# {line}\n" for line in header]
    lines += [format_rule(rule, relation_labels, entity_labels=entity_labels) + (f"  # {note}" if note else "") + "\n"
              for rule, note in zip(rules, notes)]
    atomic_write_text(path, lines)
