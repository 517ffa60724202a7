"""Pages opened in headless Chromium, as a person would open them (skipped where there is none)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SKIP = ("needs headless Chromium: `apt-get install -y chromium` (scripts/install.sh does it with "
        "JFA_PROF_BROWSER_TESTS=1), or set JFA_PROF_CHROMIUM to a Chrome/Chromium binary")


def chromium() -> str | None:
    for name in (os.environ.get("JFA_PROF_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def dump_dom(page: Path, profile: Path, *, window: tuple[int, int] = (1600, 1000)) -> tuple[str, str]:
    """(the DOM after the page's scripts ran, the browser's log) of `page` in a window of `window` pixels."""
    browser = chromium()
    if browser is None:
        pytest.skip(SKIP)
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", f"--window-size={window[0]},{window[1]}",
         # Lets the page's scripts run to the end before the DOM is dumped.
         "--virtual-time-budget=30000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Uncaught" not in proc.stderr, [line for line in proc.stderr.splitlines() if "Uncaught" in line]
    return proc.stdout, proc.stderr
