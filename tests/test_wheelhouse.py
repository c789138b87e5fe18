"""`matrix-run wheelhouse`: sdists (sha256-checked against the index) and cached wheels with their
key sidecars, collected for an air-gapped node; a local PEP 691 index stands in for PyPI."""
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import run_cli

from matrix_runner import wheels


@pytest.fixture
def local_index(standins):
    sdists = {p.name: p.read_bytes() for p in standins["sdists"].glob("*.tar.gz")}
    state = {"corrupt": False}

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            port = self.server.server_address[1]
            if self.path == "/simple/flash-attn/":
                files = [{"filename": n, "url": f"http://127.0.0.1:{port}/f/{n}",
                          "hashes": {"sha256": hashlib.sha256(b).hexdigest()}} for n, b in sdists.items()]
                body, ctype = json.dumps({"meta": {"api-version": "1.0"}, "files": files}).encode(), \
                    "application/vnd.pypi.simple.v1+json"
            elif self.path.startswith("/f/") and self.path[3:] in sdists:
                body, ctype = sdists[self.path[3:]] + (b"x" if state["corrupt"] else b""), "application/gzip"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{srv.server_address[1]}/simple", "state": state}
    srv.shutdown()


def test_wheelhouse_collects_sdists_and_keyed_cache_wheels(local_index, standins, tmp_path):
    cache = tmp_path / "cache"
    wheel = next(standins["wheels"].glob("flash_attn-2.6.3-*.whl"))
    key = {"flash_attn": "2.6.3", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "cxx11abi": True,
           "python_tag": "cp312", "platform": "linux_x86_64", "archs": ["90"], "kernels": ["fwd_hdim32_fp16"]}
    wheels.cache_store(cache, wheel, key, {"method": "test"})
    out = tmp_path / "house"
    cp = run_cli("wheelhouse", "--versions", "2.6.3,2.7.0.post2", "-o", str(out), "--index-url", local_index["url"],
                 "--wheel-cache", str(cache), "--requirements", "", env={"NO_PROXY": "127.0.0.1"})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["flash_attn-2.6.3-py3-none-any.whl", "flash_attn-2.6.3-py3-none-any.whl.matrix-run.json",
                     "flash_attn-2.6.3.tar.gz", "flash_attn-2.7.0.post2.tar.gz"]
    assert json.loads((out / names[1]).read_text())["key"] == key
    for n in ("flash_attn-2.6.3.tar.gz", "flash_attn-2.7.0.post2.tar.gz"):
        assert (out / n).read_bytes() == (standins["sdists"] / n).read_bytes()


def test_wheelhouse_rejects_a_corrupt_download(local_index, tmp_path):
    local_index["state"]["corrupt"] = True
    cp = run_cli("wheelhouse", "--versions", "2.6.3", "-o", str(tmp_path / "h"), "--index-url", local_index["url"],
                 "--wheel-cache", str(tmp_path / "cache"), "--requirements", "", env={"NO_PROXY": "127.0.0.1"})
    assert cp.returncode == 3
    assert "sha256 mismatch for flash_attn-2.6.3.tar.gz" in " ".join(cp.stdout.split())
    assert not list((tmp_path / "h").glob("*.tar.gz")) and not list((tmp_path / "cache" / "sdists").glob("*.tar.gz"))
