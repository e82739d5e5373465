"""kgtrace report in a real browser: headless Chromium renders the page offline and every image decodes."""

import re
import shutil
import subprocess

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
    assert count == page.read_text().count("data:image/png;base64,") == 4
    assert 'data-images-loaded="true"' in dom
