"""Headless Chromium for the report tests: load a page, run a check script in it, read back what
the script wrote into the DOM (``--dump-dom``), or take a screenshot.

Every run gets a private profile folder (removed afterwards), a wall-clock bound, and is ended by
its own process id.  Chromium refuses to run as root without ``--no-sandbox``; the page is a local
file we wrote ourselves."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

TIMEOUT_S = 120
RESULT_ID = "browser-check-result"


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str], url: str) -> str:
    binary = chromium()
    assert binary, "chromium is not installed (scripts/install.sh --test installs it)"
    profile = tempfile.mkdtemp(prefix="agent-envs-chromium-")
    cmd = [
        binary,
        "--headless",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
        *(["--no-sandbox"] if os.geteuid() == 0 else []),
        *args,
        url,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the browser and its helpers only
        proc.communicate()
        raise AssertionError(f"chromium did not finish within {TIMEOUT_S} s") from None
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert proc.returncode == 0, f"chromium exited with {proc.returncode}: {err.decode(errors='replace')[-2000:]}"
    return out.decode("utf-8", "replace")


def _with_script(page: Path, folder: str, script: str) -> Path:
    copy = Path(folder) / page.name
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>"), encoding="utf-8")
    return copy


def check_page(page: Path, script: str) -> dict[str, Any]:
    """Load a copy of ``page`` with ``script`` (a JS function expression) appended, call it on the
    load event and return what it returned, with the errors the page's collector logged."""
    probe = (
        "<script>window.addEventListener('load', function () {"
        f"  var out = document.createElement('pre'); out.id = '{RESULT_ID}';"
        "  var result; try { result = (" + script + ")(); } catch (e) { result = {exception: String(e)}; }"
        "  out.textContent = JSON.stringify({result: result, errors: window.reportErrors || ['no error collector']});"
        "  document.body.appendChild(out);"
        "});</script>"
    )
    with tempfile.TemporaryDirectory(prefix="agent-envs-page-") as folder:
        dom = _run(["--virtual-time-budget=10000", "--dump-dom"], _with_script(page, folder, probe).as_uri())
    found = re.search(rf'<pre id="{RESULT_ID}">(.*?)</pre>', dom, re.S)
    assert found, f"the check script left no result in the DOM; DOM tail: {dom[-1500:]}"
    import html as html_lib

    return json.loads(html_lib.unescape(found.group(1)))


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 1800, script: str = "") -> Path:
    """A PNG of the page's first screen; ``script`` (inline JS) can first arrange what is shown."""
    with tempfile.TemporaryDirectory(prefix="agent-envs-page-") as folder:
        copy = _with_script(page, folder, f"<script>{script}</script>" if script else "")
        _run(
            [
                f"--window-size={width},{height}",
                "--virtual-time-budget=5000",
                f"--screenshot={png}",
                "--hide-scrollbars",
            ],
            copy.as_uri(),
        )
    assert png.is_file() and png.stat().st_size > 0, "chromium wrote no screenshot"
    return png
