"""The faithfulness plot: PD, TC and MRR drop against k, one line per (variant, method)."""

from __future__ import annotations

from collections.abc import Sequence

from kgtrace.display.plots import pyplot
from kgtrace.faithfulness.results import FaithfulnessRow

PANELS = (("pd", "PD: probability dropped (%)", 100.0), ("tc", "TC: no longer top-1 (%)", 100.0),
          ("mrr_drop", "MRR drop (filtered, tail)", 1.0))
COLORS = {"tracin-last": "tab:blue", "tracin-all": "tab:purple", "random": "tab:grey", "neighbourhood": "tab:orange"}
CONTROL = "none"


def faithfulness_figure(table: Sequence[FaithfulnessRow]):
    """A figure of a faithfulness check's table rows (`FaithfulnessResult.table`).

    Colour: the method; line: solid for retraining, dashed for fine-tuning; the control
    (nothing removed) is a dotted level.
    """
    fig, axes = pyplot().subplots(1, len(PANELS), figsize=(12, 4.0), dpi=100)
    lines: dict[tuple[str, str], list[FaithfulnessRow]] = {}
    for row in table:
        lines.setdefault((row.variant, row.method), []).append(row)
    ks = sorted({row.k for row in table if row.method != CONTROL})
    for ax, (key, title, scale) in zip(axes, PANELS):
        for (variant, method), rows in lines.items():
            rows = sorted(rows, key=lambda r: r.k)
            style = "-" if variant == "retrain" else "--"
            label = method if variant == "retrain" else f"{method}, {variant}"
            if method == CONTROL:
                ax.axhline(scale * getattr(rows[0], key), color="black", linestyle=":", linewidth=1,
                           label=f"nothing removed, {variant}")
                continue
            ax.plot([r.k for r in rows], [scale * getattr(r, key) for r in rows], style, marker="o",
                    color=COLORS.get(method), label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("k: training triples removed")
        if ks:
            ax.set_xscale("log")
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.minorticks_off()
        if scale == 100.0:
            ax.set_ylim(-3, 103)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(4, max(1, len(names))), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * (1 + (len(names) - 1) // 4), 1, 1))
    return fig
