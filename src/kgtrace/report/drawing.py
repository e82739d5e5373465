"""A drawing of an explained triple, as inline SVG: its two entities and the influential training edges around them,
or the paths in the graph that imply it.

Layout: networkx's spring layout, seeded (the same item gives the same drawing), with the test
triple's head pinned left of the centre and its tail right of it, so that the test edge (a
dashed blue arrow) runs straight between them with its relation name on it. Proponent edges are
green, opponent edges red, wider with |influence|; edges between the same two entities bend
apart; only the strongest ``DRAWN`` proponents and opponents are drawn (the tables list them all). A drawing of
paths (`paths_svg`) draws the facts of the first path of each of the ``DRAWN_RULES`` strongest rules in purple,
wider for a stronger rule, each fact once.

Labels are placed one at a time, the test edge's first, then the nodes' (the test triple's
first) and, when few edges are drawn, the edges' relation names: each at the first spot around
its anchor where its box (measured with matplotlib's metrics of the page's font, with a margin)
meets no label placed before it and no node, so that no two labels overlap. Every node, edge and
label carries an SVG ``<title>`` with the full name, shown on hover; the figure is cut to its content.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import count

import networkx as nx
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import TextToPath

from kgtrace.attribution.results import Explanation
from kgtrace.data.lookup import NamedTriple
from kgtrace.prover.rule_paths import TriplePaths
from kgtrace.report.html import esc

PRO, OPP, TEST, PATH = "#1a7f4b", "#c0392b", "#2b6cb0", "#6b46c1"
MARKERS = {TEST: "test", PRO: "pro", OPP: "opp", PATH: "path"}  # an arrowhead per colour
FONT = "DejaVu Sans"  # the page's fallback font, and the one matplotlib measures with
LABEL_CHARS = 32
DRAWN = 6
DRAWN_RULES = 4
UNIT = 190.0  # pixels between the layout's unit positions: the test head and tail sit 2 units apart
NODE_R, TEST_R = 7.0, 11.0
MARGIN = 10.0


@dataclass(frozen=True)
class Box:
    """An axis-aligned rectangle in pixels (y down, as in SVG)."""

    x0: float
    y0: float
    x1: float
    y1: float

    def overlaps(self, other: "Box") -> bool:
        return self.x0 < other.x1 and other.x0 < self.x1 and self.y0 < other.y1 and other.y0 < self.y1

    @classmethod
    def around(cls, x: float, y: float, width: float, height: float) -> "Box":
        return cls(x - width / 2, y - height / 2, x + width / 2, y + height / 2)


@dataclass(frozen=True)
class Label:
    box: Box
    text: str
    title: str
    size: float
    colour: str
    kind: str  # the CSS class: node-label, test-label, edge-label
    bold: bool = False


def short(text: str, limit: int = LABEL_CHARS) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


@lru_cache(maxsize=4096)
def text_size(text: str, size: float, bold: bool = False) -> tuple[float, float]:
    """(width, height) in pixels of ``text`` in the page's font at ``size`` px, with room for the box's padding
    (and 10% for a browser whose font is a little wider)."""
    props = FontProperties(family=FONT, size=size, weight="bold" if bold else "normal")
    width, _, _ = TextToPath().get_text_width_height_descent(text, props, ismath=False)
    return 1.1 * width + 8.0, 1.35 * size + 4.0


def layout(test_head: str, test_tail: str, edges: list[tuple[str, str]]) -> dict[str, tuple[float, float]]:
    """Pixel positions (y down): the test head at (-UNIT, 0), the tail at (UNIT, 0), the others by a seeded
    spring layout around them. A test triple whose head is its tail sits at the centre.

    An edge that touches neither test entity is tied, for the layout only, head to the test head and tail
    to the test tail: a spring layout pushes unconnected parts far apart, and these belong beside the triple.
    """
    graph = nx.MultiGraph()
    graph.add_nodes_from([test_head, test_tail])
    graph.add_edges_from(edges)
    graph.add_edge(test_head, test_tail)
    for head, tail in edges:
        if not {head, tail} & {test_head, test_tail}:
            graph.add_edges_from([(head, test_head), (tail, test_tail)])
    fixed = {test_head: (-1.0, 0.0), test_tail: (1.0, 0.0)} if test_head != test_tail else {test_head: (0.0, 0.0)}
    if len(graph) > len(fixed):
        spread = nx.spring_layout(nx.Graph(graph), pos=fixed, fixed=list(fixed), k=0.6, iterations=200, seed=0)
    else:
        spread = fixed
    return {node: (UNIT * float(x), -UNIT * float(y)) for node, (x, y) in spread.items()}


def _edges(item: Explanation, names: dict[str, str]) -> list[tuple[str, str, str, str, float, str]]:
    """(head, tail, relation name, colour, |influence|, hover text) of the DRAWN strongest proponents and opponents."""
    edges = []
    for kind, entries, colour in (("proponent", item.proponents, PRO), ("opponent", item.opponents, OPP)):
        for e in sorted(entries, key=lambda e: -abs(e.influence))[:DRAWN]:
            t = e.triple
            hover = (f"{kind}: {names[t.head]} \u2014{t.relation_name}\u2192 {names[t.tail]} "
                     f"(influence {e.influence:+.3e})")
            edges.append((t.head, t.tail, t.relation_name, colour, abs(e.influence), hover))
    return edges


def _path_edges(item: TriplePaths, names: dict[str, str]) -> list[tuple[str, str, str, str, float, str]]:
    """(head, tail, relation name, colour, confidence, hover text) of the facts of the first path of each of the
    DRAWN_RULES strongest rules, each fact once (under its strongest rule)."""
    edges, seen = [], set()
    for number, found in enumerate(item.rules[:DRAWN_RULES], 1):
        for fact in found.groundings[0] if found.groundings else ():
            if (fact.head, fact.relation, fact.tail) in seen:
                continue
            seen.add((fact.head, fact.relation, fact.tail))
            hover = (f"rule {number} (confidence {found.confidence:.3f}): {found.text}; fact: {names[fact.head]} "
                     f"\u2014{fact.relation_name}\u2192 {names[fact.tail]}")
            edges.append((fact.head, fact.tail, fact.relation_name, PATH, found.confidence, hover))
    return edges


def _path_names(item: TriplePaths) -> dict[str, str]:
    """Entity label -> readable name, from the triple and the facts of its paths."""
    names = {item.triple.head: item.triple.head_name, item.triple.tail: item.triple.tail_name}
    for found in item.rules:
        for path in found.groundings:
            for fact in path:
                names.setdefault(fact.head, fact.head_name)
                names.setdefault(fact.tail, fact.tail_name)
    return names


def _names(item: Explanation) -> dict[str, str]:
    """Entity label -> readable name, from the test triple and its influencers."""
    names = {}
    for t in [item.triple, *(e.triple for e in item.proponents), *(e.triple for e in item.opponents)]:
        for label, name in ((t.head, t.head_name), (t.tail, t.tail_name)):
            if name != label or label not in names:  # a bare label never hides a name
                names[label] = name
    return names


def _place(label: Label, anchor: tuple[float, float], start: tuple[float, float], taken: list[Box],
           curves: Sequence[tuple[str, list[tuple[float, float]]]] = ()) -> Label:
    """``label`` moved to the first free spot: ``start`` (an offset from ``anchor``), then rings around it. A spot
    is free when its box meets no box in ``taken`` and no curve (title, points) but the label's own (same title)."""
    width, height = label.box.x1 - label.box.x0, label.box.y1 - label.box.y0
    x, y = anchor[0] + start[0], anchor[1] + start[1]
    for ring in count():
        steps = 1 if ring == 0 else 12 * ring
        for step in range(steps):
            angle = math.pi / 2 + 2 * math.pi * step / steps  # below first, then around
            box = Box.around(x + 9 * ring * math.cos(angle), y + 9 * ring * math.sin(angle), width, height)
            crossed = any(title != label.title and _crosses(points, box) for title, points in curves)
            if not crossed and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                return Label(box, label.text, label.title, label.size, label.colour, label.kind, label.bold)
    raise AssertionError("unreachable: the rings grow without bound")


def _label(text: str, title: str, size: float, colour: str, kind: str, bold: bool = False) -> Label:
    width, height = text_size(text, size, bold)
    return Label(Box.around(0, 0, width, height), text, title, size, colour, kind, bold)


def _curve(a: tuple[float, float], b: tuple[float, float], bend: float) -> tuple[float, float]:
    """The control point of a quadratic curve from a to b that bows ``bend`` times the chord to its left."""
    mx, my = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
    return mx + bend * (b[1] - a[1]), my - bend * (b[0] - a[0])


def _trim(a, c, b, r_a: float, r_b: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """The curve's ends pulled back along their tangents by the nodes' radii, so arrowheads touch the circles."""
    def pull(p, q, r):
        dx, dy = q[0] - p[0], q[1] - p[1]
        n = math.hypot(dx, dy) or 1.0
        return p[0] + r * dx / n, p[1] + r * dy / n
    return pull(a, c, r_a + 1), pull(b, c, r_b + 4)


def _points(start, c, end, count: int = 32) -> list[tuple[float, float]]:
    """``count`` + 1 points along the quadratic curve from ``start`` through control ``c`` to ``end``."""
    return [((1 - s) ** 2 * start[0] + 2 * (1 - s) * s * c[0] + s * s * end[0],
             (1 - s) ** 2 * start[1] + 2 * (1 - s) * s * c[1] + s * s * end[1])
            for s in (i / count for i in range(count + 1))]


def _crosses(points: list[tuple[float, float]], box: Box) -> bool:
    """Whether the polyline through ``points`` enters ``box`` (a segment's samples, 4 per segment, inside it)."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        for f in (0.0, 0.25, 0.5, 0.75, 1.0):
            x, y = x0 + f * (x1 - x0), y0 + f * (y1 - y0)
            if box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1:
                return True
    return False


BENDS = (0.0, 0.15, -0.15, 0.3, -0.3, 0.45, -0.45, 0.6, -0.6, 0.8, -0.8)  # tried in turn to clear other nodes


def _node_title(names: dict[str, str], node: str) -> str:
    return f"{names[node]} ({node})" if names[node] != node else node


class _Canvas:
    """What a drawing collects: edge and node shapes, placed labels, the boxes labels must avoid, its extent."""

    def __init__(self, pos: dict[str, tuple[float, float]], radius: dict[str, float], uid: str):
        self.pos, self.radius, self.uid = pos, radius, uid
        self.taken = [Box.around(x, y, 2 * radius[n] + 4, 2 * radius[n] + 4) for n, (x, y) in pos.items()]
        self.extent = list(self.taken)
        self.shapes: list[str] = []
        self.labels: list[Label] = []
        self.curves: list[tuple[str, list[tuple[float, float]]]] = []  # (title, points) of every edge drawn

    def edge(self, a_node: str, b_node: str, bend: float, colour: str, width: float, title: str, marker: str,
             dash: str = "") -> tuple[float, float]:
        """A curved arrow from a_node to b_node, bent further where it would cross another node; returns the
        curve's middle (where its label goes)."""
        a, b = self.pos[a_node], self.pos[b_node]
        tries = []  # (control point, start, end, points) of each bend tried, in BENDS' order
        for extra in BENDS:
            c = _curve(a, b, bend + extra)
            start, end = _trim(a, c, b, self.radius[a_node], self.radius[b_node])
            tries.append((c, start, end, _points(start, c, end)))
            if not self._crosses_a_node(tries[-1][3], (a_node, b_node)):
                break
        else:  # no bend clears them all: the one asked
            tries.append(tries[0])
        c, start, end, points = tries[-1]
        self.curves.append((title, points))
        self.extent.append(Box(min(a[0], b[0], c[0]), min(a[1], b[1], c[1]), max(a[0], b[0], c[0]),
                               max(a[1], b[1], c[1])))
        self.shapes.append(f'<path d="M{start[0]:.1f},{start[1]:.1f} Q{c[0]:.1f},{c[1]:.1f} {end[0]:.1f},{end[1]:.1f}" '
                           f'fill="none" stroke="{colour}" stroke-width="{width:.2f}" stroke-opacity="0.85"{dash} '
                           f'marker-end="url(#{marker}-{self.uid})"><title>{esc(title)}</title></path>')
        return 0.25 * a[0] + 0.5 * c[0] + 0.25 * b[0], 0.25 * a[1] + 0.5 * c[1] + 0.25 * b[1]

    def _crosses_a_node(self, points: list[tuple[float, float]], ends: tuple[str, str]) -> bool:
        """Whether the curve through ``points`` passes within a node's radius (and 3 px) of a node not its ends."""
        return any(math.hypot(x - self.pos[n][0], y - self.pos[n][1]) < self.radius[n] + 3
                   for n in self.pos if n not in ends for x, y in points)

    def loop(self, node: str, colour: str, width: float, title: str) -> tuple[float, float]:
        """A loop above ``node`` (a triple whose head is its tail); returns where its label goes."""
        (x, y), r = self.pos[node], self.radius[node]
        self.shapes.append(f'<path d="M{x - 5:.1f},{y - r:.1f} C{x - 24:.1f},{y - r - 34:.1f} {x + 24:.1f},'
                           f'{y - r - 34:.1f} {x + 5:.1f},{y - r - 2:.1f}" fill="none" stroke="{colour}" '
                           f'stroke-width="{width:.2f}" stroke-opacity="0.85"><title>{esc(title)}</title></path>')
        self.extent.append(Box(x - 24, y - r - 34, x + 24, y))
        return x, y - r - 30

    def place(self, label: Label, anchor: tuple[float, float], start: tuple[float, float] = (0, 0)) -> None:
        self.labels.append(_place(label, anchor, start, self.taken, self.curves))


def _draw_edges(canvas: _Canvas, edges: list, test_pair: frozenset) -> list[tuple]:
    """The edges around the triple (influencers or path facts), those between the same two entities bent apart (and
    clear of the test edge);
    returns (anchor, relation, hover, colour) for their labels."""
    largest = max((e[4] for e in edges), default=0.0) or 1.0
    seen: dict[frozenset, int] = {}
    anchors = []
    for h, t, relation, colour, size, hover in edges:
        width = 1.0 + 3.0 * size / largest
        if h == t:
            anchors.append((canvas.loop(h, colour, width, hover), relation, hover, colour))
            continue
        key = frozenset((h, t))
        n = seen[key] = seen.get(key, 0) + 1
        bend = 0.14 * ((n + 1) // 2) * (1 if n % 2 else -1) * (1 if (h, t) == tuple(sorted((h, t))) else -1)
        bend += 0.12 * (1 if bend >= 0 else -1) if key == test_pair else 0.0
        middle = canvas.edge(h, t, bend, colour, width, hover, MARKERS[colour])
        anchors.append((middle, relation, hover, colour))
    return anchors


def subgraph_svg(item: Explanation) -> str:
    """The drawing of one explained triple and its strongest influencers, as an inline ``<svg>`` element."""
    names = _names(item)
    edges = _edges(item, names)
    return _drawing(item.triple, names, edges, _uid({"ids": list(item.ids), **item.triple.to_dict()}),
                    named_edges=len(edges) <= DRAWN)


def paths_svg(item: TriplePaths) -> str:
    """The drawing of one triple and the paths in the graph that imply it, as an inline ``<svg>`` element."""
    names = _path_names(item)
    return _drawing(item.triple, names, _path_edges(item, names), _uid({"paths": item.triple.to_dict()}),
                    named_edges=True)  # a path reads by its relations: at most DRAWN_RULES x 3 facts, all named


def _uid(key: dict) -> str:
    """Marker ids unique per page: a digest of what the drawing shows."""
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]


def _drawing(triple: NamedTriple, names: dict[str, str], edges: list, uid: str, named_edges: bool) -> str:
    """The explained triple as a dashed arrow between its two entities, ``edges`` around it, then every label (the
    edges' relation names too when ``named_edges``)."""
    head, tail = triple.head, triple.tail
    pos = layout(head, tail, [(h, t) for h, t, *_ in edges])
    canvas = _Canvas(pos, {n: TEST_R if n in (head, tail) else NODE_R for n in pos}, uid)
    relation = triple.relation_name
    title = f"explained triple: {names[head]} \u2014{relation}\u2192 {names[tail]}"
    # Every edge first, then the labels, each clear of the edges it does not name: the test edge's label first.
    middle = canvas.edge(head, tail, 0.0, TEST, 3.0, title, "test", ' stroke-dasharray="7 4"') if head != tail else None
    anchors = _draw_edges(canvas, edges, frozenset((head, tail)))
    if middle is not None:
        canvas.place(_label(short(relation, 40), title, 12, TEST, "test-label", True), middle)
    for n in sorted(pos, key=lambda n: n not in (head, tail)):  # the test triple's entities first
        main = n in (head, tail)
        below = (0, canvas.radius[n] + 12) if pos[n][1] >= 0 or main else (0, -canvas.radius[n] - 12)
        canvas.place(_label(short(names[n]), _node_title(names, n), 13 if main else 12, "#1f2933", "node-label", main),
                     pos[n], below)
    if named_edges:
        for anchor, name, hover, colour in anchors:
            canvas.place(_label(short(name, 24), hover, 11, colour, "edge-label"), anchor)
    nodes = [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{canvas.radius[n]:.0f}" '
             f'fill="{TEST if n in (head, tail) else "#9aa5b1"}" stroke="#fff" stroke-width="2">'
             f'<title>{esc(_node_title(names, n))}</title></circle>' for n, (x, y) in pos.items()]
    return _svg(uid, canvas.shapes, nodes, canvas.labels, canvas.extent + [lab.box for lab in canvas.labels], title)


def _svg(uid: str, shapes: list[str], nodes: list[str], labels: list[Label], extent: list[Box], title: str) -> str:
    """The <svg> element: edges under nodes under labels (the test edge's label on top), cut to ``extent``."""
    x0, y0 = min(b.x0 for b in extent) - MARGIN, min(b.y0 for b in extent) - MARGIN
    x1, y1 = max(b.x1 for b in extent) + MARGIN, max(b.y1 for b in extent) + MARGIN
    markers = "".join(
        f'<marker id="{name}-{uid}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="5" markerHeight="5" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        for colour, name in MARKERS.items())
    texts = []
    for label in sorted(labels, key=lambda lab: lab.kind == "test-label"):
        b = label.box
        weight = ' font-weight="bold"' if label.bold else ""
        texts.append(f'<g class="{label.kind}"><title>{esc(label.title)}</title>'
                     f'<rect x="{b.x0:.1f}" y="{b.y0:.1f}" width="{b.x1 - b.x0:.1f}" height="{b.y1 - b.y0:.1f}" '
                     f'rx="4" fill="#fff" fill-opacity="0.92" stroke="#d0d7de"/>'
                     f'<text x="{(b.x0 + b.x1) / 2:.1f}" y="{(b.y0 + b.y1) / 2:.1f}" text-anchor="middle" '
                     f'dominant-baseline="central" font-size="{label.size:g}" fill="{label.colour}"{weight}>'
                     f'{esc(label.text)}</text></g>')
    return (f'<svg class="subgraph" role="img" aria-label="{esc(title)}" '
            f'width="{x1 - x0:.0f}" height="{y1 - y0:.0f}" viewBox="{x0:.1f} {y0:.1f} {x1 - x0:.1f} {y1 - y0:.1f}" '
            f'font-family="{FONT}, sans-serif"><defs>{markers}</defs>{"".join(shapes)}{"".join(nodes)}'
            f'{"".join(texts)}</svg>')
