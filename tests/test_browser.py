"""The report in a real browser: headless Chromium, network blocked, no DevTools.

What is checked, and how:
- console errors: Chromium logs every console message to stderr with ``--enable-logging=stderr``
  (``...:CONSOLE:...] "message", source: ...``); there must be none (the report has no script);
- network: ``--log-net-log`` records every URL request the browser makes; apart from the browser's
  own background requests (the same ones an empty page makes), there must be none. A control page
  with a remote image proves the check sees a fetch;
- rendering: ``--dump-dom`` gives the DOM after load (the verdict cells must be in it), and a
  screenshot at 1400x1800 must show the report (not blank; the red of a "slower" headline on it);
- printing: ``--print-to-pdf`` must produce a multi-page PDF.

Skipped (with the reason) where Chromium is not installed; .ci/run installs it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from matrix_runner import report, results

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "tests" / "fixtures" / "h200-first-run-results.json"
CHROMIUM = "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else shutil.which("chromium")

pytestmark = pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed (apt-get install -y chromium; "
                                                     ".ci/run does it)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars",
         '--host-resolver-rules=MAP * ~NOTFOUND', "--proxy-server=127.0.0.1:9",
         "--enable-logging=stderr", "--v=0"]
#: Requests Chromium makes by itself (sign-in, update and time checks), whatever the page.
BROWSER_HOSTS = {"accounts.google.com", "clients2.google.com", "clients1.google.com", "update.googleapis.com",
                 "clients2.googleusercontent.com", "optimizationguide-pa.googleapis.com", "redirector.gvt1.com",
                 "content-autofill.googleapis.com", "safebrowsingohttpgateway.googleapis.com", "www.google.com",
                 "android.clients.google.com", "edgedl.me.gvt1.com", "~notfound"}


def chromium(url: str, tmp: Path, *extra: str, timeout: float = 120) -> dict:
    """Run headless Chromium on ``url``; returns {stdout, stderr, console: [...], requests: [urls]}."""
    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp))
    netlog = tmp / f"netlog-{profile.name}.json"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--log-net-log={netlog}", *extra, url]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    console = [ln for ln in cp.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    urls = []
    if netlog.exists():
        text = netlog.read_text(errors="replace")
        urls = sorted(set(re.findall(r'"url":"([a-z][a-z0-9+.-]*://[^"]*)"', text)))
    return {"rc": cp.returncode, "stdout": cp.stdout, "stderr": cp.stderr, "console": console, "requests": urls}


def page_requests(urls: list[str]) -> list[str]:
    """The requests that a page made: not the browser's own, not the page file itself."""
    out = []
    for u in urls:
        m = re.match(r"([a-z][a-z0-9+.-]*)://([^/:?#]*)", u)
        scheme, host = m.group(1), m.group(2)
        if scheme in ("http", "https", "ws", "wss") and host not in BROWSER_HOSTS:
            out.append(u)
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("browser-report")
    res = results.load(H200)
    report.write_html(res, d, "results.json")
    shutil.copyfile(H200, d / "results.json")
    return d / "index.html"


def test_the_network_check_sees_a_fetch(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><title>x</title><p>x</p><img src="https://cdn.example.org/logo.png">'
                   '<script>console.error("boom")</script>')
    out = chromium(bad.as_uri(), tmp_path, "--screenshot=" + str(tmp_path / "bad.png"), "--window-size=400,300")
    assert page_requests(out["requests"]) == ["https://cdn.example.org/logo.png"]
    assert any('"boom"' in ln for ln in out["console"])


def test_report_renders_offline_with_no_console_errors_and_screenshot(rendered, tmp_path):
    shot = tmp_path / "report.png"
    out = chromium(rendered.as_uri(), tmp_path, f"--screenshot={shot}", "--window-size=1400,1800")
    assert out["console"] == [], out["console"]
    assert page_requests(out["requests"]) == [], out["requests"]
    assert shot.is_file(), out["stderr"][-2000:]
    shutil.copyfile(shot, "/tmp/report-screenshot.png")
    import numpy as np
    from PIL import Image

    im = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert im.shape == (1800, 1400, 3)
    # not blank: many distinct colours, and the headline's "slower" red band near the top
    assert len(np.unique(im.reshape(-1, 3), axis=0)) > 200
    top = im[:400]
    reds = int((np.abs(top - np.array([0xfd, 0xe2, 0xe1])).max(axis=2) < 4).sum())
    assert reds > 5000, "the red 'slower' headline is not on the first screen"


def test_report_dom_after_load_has_the_verdicts(rendered, tmp_path):
    out = chromium(rendered.as_uri(), tmp_path, "--dump-dom")
    dom = out["stdout"]
    res = json.loads(H200.read_text())
    b2 = next(c for c in res["comparisons"] if c["metric"] == "wall_us" and c["label"] == "B2 S300 H16 D16"
              and c["op"] == "fwd")
    assert f'data-ratio="{b2["ratio"]:.2f}"' in dom
    assert 'data-verdict="slower" data-attribution="host"' in dom
    assert dom.count("<svg") == 5 and "</html>" in dom
    assert out["console"] == []


def test_report_prints_to_a_multipage_pdf(rendered, tmp_path):
    pdf = tmp_path / "report.pdf"
    out = chromium(rendered.as_uri(), tmp_path, f"--print-to-pdf={pdf}", "--no-pdf-header-footer")
    assert pdf.is_file(), out["stderr"][-2000:]
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF")
    pages = len(re.findall(rb"/Type\s*/Page(?!s)", data))
    assert pages >= 3, pages
    assert page_requests(out["requests"]) == []


def test_site_index_renders_offline(tmp_path):
    from matrix_runner import publish

    out = publish.build_site(ROOT / "reports", tmp_path / "site")
    assert out["runs"]
    run = chromium((tmp_path / "site" / "index.html").as_uri(), tmp_path, "--dump-dom")
    assert run["console"] == [] and page_requests(run["requests"]) == []
    assert 'href="h200-2.6.3-vs-2.7.0.post2/index.html"' in run["stdout"]
