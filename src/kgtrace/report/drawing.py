"""A small drawing of an explained triple: its two entities and the influential training edges around them.

Deterministic layout: the test triple's head and tail sit fixed left and right of the
centre; every other entity sits on a circle around them, in order of first appearance,
labelled outside the circle. Proponent edges are green, opponent edges red (width grows
with |influence|), and the test edge is a thick dashed blue arrow. Only the strongest
``DRAWN`` proponents and opponents are drawn (the tables list them all).
"""

from __future__ import annotations

import math

from matplotlib.patches import FancyArrowPatch

from kgtrace.plots import plt, png_bytes

PRO, OPP, TEST = "#1a7f4b", "#c0392b", "#2b6cb0"
LABEL_CHARS = 28
DRAWN = 6
RADIUS = 1.5


def short(text: str, limit: int = LABEL_CHARS) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def layout(test_head: str, test_tail: str, others: list[str]) -> dict[str, tuple[float, float]]:
    """Positions: the test entities at (-0.6, 0) and (0.6, 0), the others evenly on a circle of radius RADIUS."""
    pos = {test_head: (-0.6, 0.0), test_tail: (0.6, 0.0)}
    rest = [e for e in dict.fromkeys(others) if e not in pos]
    for i, entity in enumerate(rest):
        angle = math.pi / 2 + 2 * math.pi * i / max(len(rest), 1)
        pos[entity] = (RADIUS * math.cos(angle), RADIUS * math.sin(angle))
    return pos


def _edges(item: dict) -> list[tuple[str, str, str, str, float]]:
    """(head, tail, relation name, colour, |influence|) of the DRAWN strongest proponents and opponents."""
    edges = []
    for kind, colour in (("proponents", PRO), ("opponents", OPP)):
        for e in sorted(item.get(kind, []), key=lambda e: -abs(e["influence"]))[:DRAWN]:
            edges.append((e["head"], e["tail"], e.get("relation_name", e["relation"]), colour, abs(e["influence"])))
    return edges


def _arrow(ax, a, b, colour: str, width: float, rad: float, style: str = "-", zorder: float = 2) -> None:
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, color=colour, lw=width, linestyle=style,
                                 connectionstyle=f"arc3,rad={rad}", shrinkA=14, shrinkB=14, alpha=0.85, zorder=zorder))


def _self_loop(ax, p, colour: str, width: float) -> None:
    ax.add_patch(plt.Circle((p[0], p[1] + 0.2), 0.2, fill=False, color=colour, lw=width, alpha=0.85, zorder=2))


def _edge_label(ax, a, b, rad: float, text: str, colour: str) -> None:
    """The relation name near the middle of an arc (arc3 bends by rad times the chord, to its left)."""
    mx, my = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
    dx, dy = b[0] - a[0], b[1] - a[1]
    x, y = mx + rad * dy / 2, my - rad * dx / 2
    ax.text(x, y, short(text, 20), fontsize=7, color=colour, ha="center", va="center", parse_math=False, zorder=3.6,
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})


def _draw_edges(ax, pos: dict, edges: list) -> None:
    """Influential edges; edges sharing a pair of entities bend apart so that none hides another."""
    largest = max((e[4] for e in edges), default=0.0) or 1.0
    seen: dict[frozenset, int] = {}
    for head, tail, relation, colour, size in edges:
        width = 0.8 + 3.2 * size / largest
        if head == tail:
            _self_loop(ax, pos[head], colour, width)
            continue
        n = seen[frozenset((head, tail))] = seen.get(frozenset((head, tail)), 0) + 1
        rad = 0.15 * (n if n % 2 else -n) + (0.25 if {head, tail} == set(list(pos)[:2]) else 0)
        _arrow(ax, pos[head], pos[tail], colour, width, rad)
        if len(edges) <= DRAWN:  # few edges: room for their relation names
            _edge_label(ax, pos[head], pos[tail], rad, relation, colour)


def _label_place(x: float, y: float, main: bool) -> dict:
    """Text position and alignment: below the test head, above the test tail, radially outside on the circle."""
    if main:
        below = x < 0
        return {"x": x, "y": y - 0.2 if below else y + 0.2, "ha": "center", "va": "top" if below else "bottom"}
    norm = math.hypot(x, y) or 1.0
    ha = "center" if abs(x) < 0.3 else ("left" if x > 0 else "right")
    va = "center" if abs(y) < 0.3 else ("bottom" if y > 0 else "top")
    return {"x": x + 0.14 * x / norm, "y": y + 0.14 * y / norm, "ha": ha, "va": va}


def _draw_nodes(ax, pos: dict, names: dict[str, str], test: tuple[str, str]) -> None:
    for entity, (x, y) in pos.items():
        main = entity in test
        ax.scatter([x], [y], s=280 if main else 110, color=TEST if main else "#9aa5b1", zorder=4,
                   edgecolors="white", linewidths=1.5)
        place = _label_place(x, y, main)
        ax.text(place.pop("x"), place.pop("y"), short(names.get(entity, entity)), **place,
                fontsize=9 if main else 8, fontweight="bold" if main else "normal", parse_math=False, zorder=5,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "#d0d7de", "alpha": 0.9})


def _names(item: dict) -> dict[str, str]:
    """Entity label -> readable name, from the test triple and its influencers."""
    names = {}
    for entry in [item["test"], *item.get("proponents", []), *item.get("opponents", [])]:
        for side in ("head", "tail"):
            names[entry[side]] = entry.get(f"{side}_name") or entry[side]
    return names


def subgraph_png(item: dict) -> bytes:
    """The drawing of one explanation item (as ``kgtrace explain`` writes it), as PNG bytes."""
    test = item["test"]
    edges = _edges(item)
    pos = layout(test["head"], test["tail"], [e for h, t, *_ in edges for e in (h, t)])
    fig, ax = plt.subplots(figsize=(6.4, 4.3), dpi=100)
    if test["head"] != test["tail"]:
        _arrow(ax, pos[test["head"]], pos[test["tail"]], TEST, 3.5, 0.0, "--", zorder=3.5)
        _edge_label(ax, pos[test["head"]], pos[test["tail"]], 0.0, test.get("relation_name", test["relation"]), TEST)
    _draw_edges(ax, pos, edges)
    _draw_nodes(ax, pos, _names(item), (test["head"], test["tail"]))
    handles = [plt.Line2D([], [], color=c, lw=2.5, linestyle=s) for c, s in ((TEST, "--"), (PRO, "-"), (OPP, "-"))]
    ax.legend(handles, ["test triple", "proponent", "opponent"], loc="lower center", ncol=3, fontsize=7.5,
              frameon=False, bbox_to_anchor=(0.5, -0.04))
    ax.set_xlim(-3.1, 3.1)
    ax.set_ylim(-2.05, 1.95)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout(pad=0.3)
    return png_bytes(fig)
