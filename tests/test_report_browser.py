"""kgtrace report in a real browser: headless Chromium renders the page offline, every image decodes, and the
drawings' labels, as the browser lays them out, neither overlap nor hide the explained edge's name."""

import html
import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from kgtrace.report import write_report

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")

# Offline and quiet: no first-run, sync, component or background network traffic.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """Run Chromium once with a fresh profile folder; fails the test on a non-zero exit."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.fixture
def page(full_run):
    return write_report(full_run)


def test_chromium_renders_a_screenshot(page, tmp_path):
    import matplotlib.image

    shot = tmp_path / "shot.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,4000", page.as_uri())
    assert shot.is_file() and shot.stat().st_size > 50_000
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (4000, 1280)
    assert pixels[..., :3].std() > 0.05  # not a blank page
    assert pixels[:80, :, :3].mean() < 0.6  # the dark header was painted


def test_every_image_decodes_offline(page, tmp_path):
    dom = chromium(tmp_path, "--run-all-compositor-stages-before-draw", "--virtual-time-budget=5000", "--dump-dom",
                   page.as_uri()).stdout
    count = int(re.search(r'data-image-count="(\d+)"', dom).group(1))
    assert count == page.read_text().count("data:image/png;base64,") == 2
    assert 'data-images-loaded="true"' in dom


# Appended to a copy of the page (not the page itself): records where the browser drew each drawing's labels.
MEASURE = """<script>
window.addEventListener("load", function () {
  var drawings = Array.prototype.map.call(document.querySelectorAll("svg.subgraph"), function (svg) {
    var labels = Array.prototype.map.call(svg.querySelectorAll("g.node-label, g.test-label, g.edge-label"),
      function (g) {
        var t = g.querySelector("text").getBoundingClientRect(), r = g.querySelector("rect").getBoundingClientRect();
        var top = document.elementFromPoint((t.left + t.right) / 2, (t.top + t.bottom) / 2);
        return {kind: g.getAttribute("class"), text: [t.left, t.top, t.right, t.bottom],
                rect: [r.left, r.top, r.right, r.bottom], on_top: g.contains(top)};
      });
    var b = svg.getBoundingClientRect();
    return {box: [b.left, b.top, b.right, b.bottom], labels: labels};
  });
  document.documentElement.setAttribute("data-drawings", JSON.stringify(drawings));
  var first = document.getElementById("explain-0");
  document.documentElement.setAttribute("data-explain-top", String(first.getBoundingClientRect().top));
});
</script>"""


def overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def measure(page, tmp_path) -> str:
    """The DOM of the page with MEASURE's records, after Chromium laid it out in a tall window."""
    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    return chromium(tmp_path, "--window-size=1280,12000", "--virtual-time-budget=5000", "--dump-dom",
                    measured.as_uri()).stdout


def test_drawings_keep_their_labels_apart_in_the_browser(page, tmp_path):
    drawings = json.loads(html.unescape(re.search(r'data-drawings="([^"]*)"', measure(page, tmp_path)).group(1)))
    assert len(drawings) == 2
    for drawing in drawings:
        labels = drawing["labels"]
        assert sum(label["kind"] == "test-label" for label in labels) == 1
        assert sum(label["kind"] == "node-label" for label in labels) >= 2
        for label in labels:
            x0, y0, x1, y1 = label["text"]
            assert x1 - x0 > 5 and y1 - y0 > 5, label  # drawn, with a size
            r = label["rect"]  # the text fits the box it was placed by
            assert r[0] - 0.5 <= x0 and x1 <= r[2] + 0.5 and r[1] - 0.5 <= y0 and y1 <= r[3] + 0.5, label
            b = drawing["box"]
            assert b[0] <= x0 and x1 <= b[2] and b[1] <= y0 and y1 <= b[3], label  # inside the figure
        texts = [label["text"] for label in labels]
        assert [(a, b) for i, a in enumerate(texts) for b in texts[i + 1:] if overlap(a, b)] == []
        test_label = next(label for label in labels if label["kind"] == "test-label")
        assert test_label["on_top"]  # the explained edge's name is what the browser shows there


def screenshots(page, tmp_path, height: int = 900) -> tuple:
    """Screenshots (pixel arrays) of the top of the page and of its first explanation, ``height`` pixels each."""
    import matplotlib.image

    top = round(float(re.search(r'data-explain-top="([\d.]+)"', measure(page, tmp_path)).group(1)))
    shot = tmp_path / "page.png"  # one tall screenshot, cut into the two views
    chromium(tmp_path, f"--screenshot={shot}", f"--window-size=1280,{top + height}", page.as_uri())
    pixels = matplotlib.image.imread(shot)
    return pixels[:height], pixels[top : top + height]


def test_screenshots_of_the_top_and_of_an_explanation(page, tmp_path):
    first, explained = screenshots(page, tmp_path)
    assert first.shape[:2] == explained.shape[:2] == (900, 1280)
    assert first[:80, :, :3].mean() < 0.6  # the top: the dark header
    assert explained[..., :3].std() > 0.05  # not a blank stretch of the page
    blue = (np.abs(explained[..., :3] - np.array([0x2B, 0x6C, 0xB0]) / 255).max(-1) < 0.02).sum()
    assert blue > 200  # the drawing: the explained triple's blue nodes and dashed edge


# Appended to a copy of the page: how wide the page and its images are once laid out, sent to the frame's parent.
WIDTHS = """<script>
window.addEventListener("load", function () {
  function widths(selector) {
    return Array.prototype.map.call(document.querySelectorAll(selector),
      function (e) { return e.getBoundingClientRect().width; });
  }
  parent.postMessage(JSON.stringify({page: document.documentElement.scrollWidth, view: window.innerWidth,
                                     images: widths("img"), drawings: widths("svg.subgraph")}), "*");
});
</script>"""

# A window holding the page in a frame of the width under test (Chromium's own windows are 500 px at least).
FRAME = """<!DOCTYPE html><html><body style="margin:0">
<iframe src="widths.html" style="width:{width}px;height:8000px;border:0"></iframe>
<script>window.addEventListener("message", function (e) {{
  document.documentElement.setAttribute("data-widths", e.data); }});</script></body></html>"""


@pytest.mark.parametrize("width", [1400, 390])
def test_the_page_fits_its_window_at_desktop_and_phone_widths(page, tmp_path, width):
    """Nothing widens the page past its window (wide tables scroll in their own box), and the plots and
    drawings keep a readable width."""
    (tmp_path / "widths.html").write_text(page.read_text().replace("</body>", WIDTHS + "</body>"))
    (tmp_path / "frame.html").write_text(FRAME.format(width=width))
    dom = chromium(tmp_path, "--window-size=1500,8000", "--virtual-time-budget=5000", "--dump-dom",
                   (tmp_path / "frame.html").as_uri()).stdout
    measured = json.loads(html.unescape(re.search(r'data-widths="([^"]*)"', dom).group(1)))
    assert measured["view"] == width and measured["page"] <= width
    assert len(measured["images"]) == 2 and len(measured["drawings"]) == 2
    # a phone shows them across its width, not as thumbnails
    assert min(measured["images"] + measured["drawings"]) >= min(300, 0.75 * width)
