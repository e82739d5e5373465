"""HTML building blocks of the report: escaped text, tables, embedded images, the page around the sections.

Every piece of text that can come from user data goes through `esc`; images are
embedded as base64 PNG data URIs, so the page needs nothing but itself.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence

from kgtrace.display.numbers import rank_number

CSS = """
:root { --ink: #1f2933; --muted: #61707f; --line: #e3e8ee; --accent: #2b6cb0; --pro: #1a7f4b; --opp: #c0392b; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--ink);
       background: #f5f7fa; }
header { background: linear-gradient(120deg, #1e3a5f, #2b6cb0); color: #fff; padding: 28px 40px 22px; }
header h1 { margin: 0 0 4px; font-size: 26px; font-weight: 600; }
header .sub { opacity: .85; font-size: 14px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin-top: 18px; }
.card { background: rgba(255,255,255,.14); border-radius: 8px; padding: 8px 16px; min-width: 120px; }
.card b { display: block; font-size: 22px; font-weight: 600; }
.card span { font-size: 12px; text-transform: uppercase; letter-spacing: .05em; opacity: .85; }
nav { padding: 10px 40px; background: #fff; border-bottom: 1px solid var(--line); font-size: 14px; }
nav a { color: var(--accent); margin-right: 18px; text-decoration: none; }
main { max-width: 1400px; margin: 0 auto; padding: 12px 32px 40px; display: grid;
       grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 22px; }
section.wide { grid-column: 1 / -1; }
section { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 18px 24px; }
h2 { margin: 0 0 12px; font-size: 20px; font-weight: 600; }
h3 { margin: 22px 0 6px; font-size: 16px; font-weight: 600; }
table { border-collapse: collapse; font-size: 13.5px; margin: 6px 0 10px; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { color: var(--muted); font-weight: 600; background: #fafbfc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.main td { font-weight: 600; }
.missing { background: #fff8e6; border-left: 4px solid #e0a800; padding: 10px 14px; border-radius: 4px; }
.missing code, p code { background: #f0f2f5; padding: 1px 5px; border-radius: 3px; }
figure { margin: 8px 0; }
.label { white-space: nowrap; }
.scroll { overflow-x: auto; }
figure.drawing { text-align: center; }
figure.drawing svg { max-width: 100%; height: auto; }
.legend svg { vertical-align: middle; }
figure img { max-width: 100%; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
.triple { border-top: 1px solid var(--line); padding-top: 6px; margin-top: 18px; }
.facts { color: var(--muted); font-size: 13.5px; }
.facts b { color: var(--ink); }
.rel { color: var(--muted); font-style: italic; }
.influencers h3 { margin-top: 14px; }
.bar { display: inline-block; height: 9px; border-radius: 2px; vertical-align: middle; margin-right: 6px; }
.pro { background: var(--pro); } .opp { background: var(--opp); }
.kind-pro { color: var(--pro); } .kind-opp { color: var(--opp); }
footer { color: var(--muted); font-size: 12px; text-align: center; padding: 0 0 24px; }
details > summary { cursor: pointer; color: var(--accent); }
dl.defs { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; font-size: 13.5px; margin: 6px 0; }
dl.defs dt { font-weight: 600; } dl.defs dd { margin: 0; color: var(--muted); }
@media (max-width: 760px) {
  header { padding: 18px 14px 14px; } header h1 { font-size: 20px; overflow-wrap: anywhere; }
  header .sub { overflow-wrap: anywhere; }
  .card { min-width: 0; flex: 1 1 40%; padding: 6px 10px; } .card b { font-size: 18px; }
  nav { padding: 8px 14px; overflow-x: auto; white-space: nowrap; }
  main { grid-template-columns: minmax(0, 1fr); padding: 8px 6px 24px; gap: 12px; }
  section { padding: 12px 10px; }
  dl.defs { grid-template-columns: 1fr; } dl.defs dd { margin-bottom: 4px; }
}
"""

# Marks <html data-images-loaded="true"> once every image has decoded (headless browsers check it).
IMAGES_LOADED_SCRIPT = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var ok = images.every(function (img) { return img.complete && img.naturalWidth > 0; });
  document.documentElement.setAttribute("data-images-loaded", ok ? "true" : "false");
  document.documentElement.setAttribute("data-image-count", String(images.length));
});
"""


def esc(value: object) -> str:
    """Text (anything, via str) escaped for HTML content and attribute values."""
    return html.escape(str(value), quote=True)


def number(value: object, digits: int = 4) -> str:
    """A float with ``digits`` decimals, an int as is, anything else as text (escaped)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return esc(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.{digits}f}"


def rank_text(value: object) -> str:
    """`kgtrace.display.numbers.rank_number`, escaped for the page."""
    return esc(rank_number(value))


def table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[bool] = (),
          row_classes: Sequence[str] = ()) -> str:
    """A table of cells that are already HTML (escape them first); ``numeric`` right-aligns columns."""
    numeric = list(numeric) + [False] * (len(header) - len(numeric))
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{esc(row_classes[i])}"' if i < len(row_classes) and row_classes[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if numeric[j] else f"<td>{c}</td>" for j, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    # In a box of its own that scrolls sideways: a wide table never widens the page on a narrow screen.
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def image(png: bytes, alt: str, width: int | None = None) -> str:
    """An <img> whose source is the PNG itself, as a base64 data URI."""
    data = base64.b64encode(png).decode("ascii")
    size = f' width="{width}"' if width else ""
    return f'<figure><img alt="{esc(alt)}"{size} src="data:image/png;base64,{data}"></figure>'


def missing(what: str, command: str) -> str:
    """The notice of a section whose input is missing: what is missing and the command that makes it."""
    return f'<p class="missing">{esc(what)}. Make it with <code>{esc(command)}</code></p>'


def section(anchor: str, title: str, body: str, wide: bool = False) -> str:
    """A titled section, reachable as #anchor; a wide one spans both columns of the page."""
    cls = ' class="wide"' if wide else ""
    return f'<section id="{esc(anchor)}"{cls}><h2>{esc(title)}</h2>{body}</section>'


def page(title: str, subtitle: str, cards: Sequence[tuple[str, str]],
         sections: Sequence[tuple[str, str, str, bool]], footer: str) -> str:
    """The whole document: header with summary cards, a table of contents, the sections (anchor, title, body, wide)."""
    card_html = "".join(f"<div class=\"card\"><b>{esc(value)}</b><span>{esc(label)}</span></div>"
                        for label, value in cards)
    links = "".join(f'<a href="#{esc(anchor)}">{esc(name)}</a>' for anchor, name, *_ in sections)
    body = "".join(section(*parts) for parts in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{CSS}</style><script>{IMAGES_LOADED_SCRIPT}</script></head>"
            f"<body><header><h1>{esc(title)}</h1><div class=\"sub\">{esc(subtitle)}</div>"
            f"<div class=\"cards\">{card_html}</div></header><nav>{links}</nav><main>{body}</main>"
            f"<footer>{esc(footer)}</footer></body></html>\n")
