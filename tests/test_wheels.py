"""Wheel keys, compatibility, release names, find-links scanning."""
import json

from matrix_runner import wheels

KEY = {"flash_attn": "2.6.3", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "cxx11abi": True,
       "python_tag": "cp312", "platform": "linux_x86_64", "archs": ["90"],
       "kernels": ["bwd_hdim32_fp16", "fwd_hdim32_fp16", "fwd_split_hdim32_fp16"]}


def test_compatible_requires_same_torch_and_covering_kernels():
    assert wheels.compatible(KEY, KEY) is None
    assert "torch" in wheels.compatible({**KEY, "torch": "2.10.0+cu130"}, KEY)
    assert "cxx11abi" in wheels.compatible({**KEY, "cxx11abi": False}, KEY)
    assert "python_tag" in wheels.compatible({**KEY, "python_tag": "cp311"}, KEY)
    assert wheels.compatible({**KEY, "kernels": "all", "archs": "all"}, KEY) is None  # a full build covers all
    assert "kernels" in wheels.compatible(KEY, {**KEY, "kernels": KEY["kernels"] + ["fwd_hdim64_fp16"]})
    assert "archs" in wheels.compatible(KEY, {**KEY, "archs": ["80"]})
    assert "kernels" in wheels.compatible(KEY, {**KEY, "kernels": "all"})


def test_release_wheel_names_match_setup_py():
    # the names flash-attn's setup.py (get_wheel_url) asks GitHub releases for
    assert wheels.release_wheel_name("2.6.3", "2.4.1+cu121", "12.1", False, "cp310") == \
        "flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"
    assert wheels.release_wheel_name("2.6.3", "2.3.0", "11.8", True, "cp311") == \
        "flash_attn-2.6.3+cu118torch2.3cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"
    assert wheels.release_wheel_name("2.7.0.post2", "2.5.1+cu124", "12.4", False, "cp312") == \
        "flash_attn-2.7.0.post2+cu12torch2.5cxx11abiFALSE-cp312-cp312-linux_x86_64.whl"
    assert wheels.release_wheel_name("2.7.0.post2", "2.5.1+cpu", None, False, "cp312") is None


def test_scan_prefers_keyed_compatible_wheels(tmp_path):
    good = tmp_path / "flash_attn-2.6.3-cp312-cp312-linux_x86_64.whl"
    good.write_bytes(b"x")
    (tmp_path / (good.name + wheels.SIDECAR_SUFFIX)).write_text(json.dumps({"key": KEY}))
    other = tmp_path / "flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp312-cp312-linux_x86_64.whl"
    other.write_bytes(b"x")
    (tmp_path / "flash_attn-2.7.0.post2-cp312-cp312-linux_x86_64.whl").write_bytes(b"x")
    found = wheels.scan_wheels([tmp_path], "2.6.3", KEY)
    assert [c.path.name for c in found] == [good.name, other.name]
    assert found[0].reason is None and found[0].verified
    assert "built for torch 2.4" in found[1].reason


def test_cache_store_writes_sidecar_atomically(tmp_path):
    w = tmp_path / "flash_attn-2.6.3-cp312-cp312-linux_x86_64.whl"
    w.write_bytes(b"wheel-bytes")
    dest = wheels.cache_store(tmp_path / "cache", w, KEY, {"method": "source-slim"})
    side = json.loads((dest.parent / (dest.name + wheels.SIDECAR_SUFFIX)).read_text())
    assert side["key"] == KEY and side["key_id"] == wheels.key_id(KEY) == dest.parent.name
    assert side["sha256"] == wheels.sha256_file(w)
    assert [c.path for c in wheels.scan_wheels([tmp_path / "cache"], "2.6.3", KEY, origin="cache")] == [dest]


def test_nearest_versions():
    avail = ["2.5.9.post1", "2.6.0", "2.6.1", "2.6.3", "2.7.0.post2", "2.8.3"]
    assert wheels.nearest_versions("2.6.4", avail)[:2] == ["2.6.3", "2.6.1"]
    # new-user trial: above every release it named 2.0.x (the smallest minor difference); the newest
    # releases are the nearest there
    many = [f"2.{m}.{p}" for m in range(9) for p in range(3)] + ["1.0.5", "2.8.3"]
    assert wheels.nearest_versions("3.0.0", many) == ["2.8.3", "2.8.2", "2.8.1"]
    assert wheels.nearest_versions("99.0.0", many) == ["2.8.3", "2.8.2", "2.8.1"]
    assert wheels.nearest_versions("2.13", ["2.9.1", "2.10.0", "2.12.0", "2.13.0", "2.14.0"])[0] == "2.13.0"
    # new-user trial: 2.70.post2 (a misplaced dot) named 2.8.3.post2, 2.8.3.post1, 2.8.3
    fa = ["2.6.3", "2.7.0", "2.7.0.post1", "2.7.0.post2", "2.8.3", "2.8.3.post1", "2.8.3.post2"]
    assert wheels.nearest_versions("2.70.post2", fa) == ["2.7.0.post2", "2.8.3.post2", "2.8.3.post1"]
    assert wheels.nearest_versions("26.3", fa)[0] == "2.6.3"
    assert wheels.same_version("2.13", "2.13.0") and wheels.same_version("2.13.0+cpu", "2.13")
    assert not wheels.same_version("2.13.1", "2.13")


def test_download_stops_when_matrix_run_is_interrupted(tmp_path):
    # a release wheel trickling in (or a stalled mirror) must not hold Ctrl-C for minutes
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from matrix_runner import proc, wheels

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(10 ** 9))
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b"x" * 1024)
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    out: dict = {}

    def go():
        try:
            wheels.download(f"http://127.0.0.1:{srv.server_address[1]}/w.whl", tmp_path / "w.whl", timeout=30)
        except BaseException as e:  # noqa: BLE001
            out["e"] = e

    t = threading.Thread(target=go)
    t.start()
    time.sleep(0.5)
    assert t.is_alive()
    t0 = time.monotonic()
    proc._stopping.set()
    try:
        t.join(5)
        took = time.monotonic() - t0
    finally:
        proc._stopping.clear()
        srv.shutdown()
    assert not t.is_alive() and took < 2, took
    assert isinstance(out.get("e"), proc.Stopped) and "interrupted" in str(out["e"])
    assert not (tmp_path / "w.whl").exists() and not list(tmp_path.glob(".part-*"))
