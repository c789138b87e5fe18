"""Shared fixtures: stand-in flash_attn wheels and sdists (see standin.py), built once per session."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import standin  # noqa: E402

#: Planted host overhead of the "2.7.0.post2" stand-in, µs per forward call.
PLANTED_US = 300.0

TINY = """
title: tiny CPU workload
ops: [fwd, bwd]
shapes:
  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}
  - {batch: 2, seqlen_q: 16, seqlen_k: 32, nheads: 4, nheads_k: 2, head_dim: 32, causal: true}
sampling: {time_budget_s: 120, set_seconds: 1.0, max_sets: 6}
"""


@pytest.fixture(scope="session")
def standins(tmp_path_factory) -> dict:
    """Wheels and sdists of stand-in 2.6.3 (no overhead) and 2.7.0.post2 (PLANTED_US of host overhead)."""
    root = tmp_path_factory.mktemp("standin")
    out = {"wheels": root / "wheels", "sdists": root / "sdists"}
    for version, over in (("2.6.3", 0.0), ("2.7.0.post2", PLANTED_US)):
        src = standin.make_source(root / "src", version, over)
        standin.build_wheel(src, out["wheels"])
        if over:
            out["planted_src"] = src  # for standin.in_context_us
        standin.build_sdist(standin.make_source(root / "src-sdist", version, over), out["sdists"])
    return out


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    p.write_text(TINY)
    return p


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m matrix_runner ARGS` as a user would; returns the completed process (text)."""
    e = dict(os.environ)
    e["COLUMNS"] = "200"
    e.update(env or {})  # a test may set its own COLUMNS
    return subprocess.run([sys.executable, "-m", "matrix_runner", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=e)


def load_results(out_dir: Path) -> dict:
    return json.loads((out_dir / "results.json").read_text())


@contextmanager
def local_http(respond):
    """Serve HTTP on 127.0.0.1 for a test; ``respond(path, port)`` returns ``(body, content_type)`` or
    None (404). Yields the base URL ``http://127.0.0.1:PORT``."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            got = respond(self.path, self.server.server_address[1], self.headers)
            if got is None:
                self.send_error(404)
                return
            body, ctype = got
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
