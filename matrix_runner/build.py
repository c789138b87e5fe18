"""Stage 2b — source builds of flash-attn: the kernel set a config needs, job sizing, the build itself.

A *slim* build compiles only the kernel files the config's cases dispatch to, for the visible GPU's
arch; every other kernel becomes a stub that raises a RuntimeError naming itself (see
``_build_shim.py``). A *full* build compiles the version's whole list.

Kernel files are named ``flash_{fwd,fwd_split,bwd}_hdim{D}_{fp16,bf16}[_causal]_sm80.cu``; we name a
kernel by its stem without ``flash_`` and ``_sm80.cu``, e.g. ``fwd_split_hdim32_fp16``.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Callable

from . import compcache, machine, stubgen
from .config import KERNEL_HEAD_DIMS, Case, kernel_head_dim
from .errors import StageFailed
from .proc import run_logged
from .stubgen import StubError  # noqa: F401 - raised by slim_plan, caught by envs/plan.py

#: Seconds of one nvcc job per kernel file and arch, used for estimates only. Measured from ninja's
#: log of matrix-run's slim builds on the H200 host (nvcc 13.0, sm_90, 5 jobs, hdim32 fp16):
#: fwd 193-195 s, fwd_split 336-346 s, bwd 187-190 s, flash_api.cpp 28-29 s, the one stub file 9.5 s
#: (reports/h200-2.6.3-vs-2.7.0.post2/results.json, envs[].build.source_build.compile_seconds).
#: Larger head dims compile longer (hdim128 fwd: 176-251 s in shared notes), so full-build
#: estimates from these are lower bounds.
EST_FILE_S = {"fwd": 195.0, "fwd_split": 340.0, "bwd": 190.0}
EST_API_S = 29.0
EST_STUB_S = 10.0
EST_OVERHEAD_S = 10.0
#: Kernel files in 2.6.3's and 2.7.0.post2's setup.py (3 kinds x 7 head dims x 2 dtypes x 2 causal).
FULL_KERNEL_COUNT = 84
NVCC_JOB_GB = 9.0  # flash-attn's setup.py: "each JOB peak memory cost is ~8-9GB when threads = 4"


def read_dispatch(sdist: Path | None) -> tuple[int, ...]:
    """Head dims of ``HEADDIM_SWITCH`` in the sdist's csrc/flash_attn/src/static_switch.h.

    Falls back to :data:`KERNEL_HEAD_DIMS` when there is no sdist or the macro is not found."""
    if sdist is None or not Path(sdist).is_file():
        return KERNEL_HEAD_DIMS
    try:
        with tarfile.open(sdist) as tf:
            for m in tf.getmembers():
                if m.name.endswith("csrc/flash_attn/src/static_switch.h"):
                    text = tf.extractfile(m).read().decode()
                    block = text.split("#define HEADDIM_SWITCH", 1)[1].split("}()", 1)[0]
                    dims = tuple(int(x) for x in re.findall(r"kHeadDim\s*=\s*(\d+)", block))
                    if dims:
                        return dims
    except (OSError, tarfile.TarError, IndexError, ValueError):
        pass
    return KERNEL_HEAD_DIMS


def kernel_set(cases: list[Case], dispatch: tuple[int, ...] = KERNEL_HEAD_DIMS) -> list[str]:
    """Kernel stems the cases need, sorted (see :func:`case_kernels`)."""
    need = set()
    for c in cases:
        need.update(case_kernels(c, dispatch))
    return sorted(need)


def case_kernels(c: Case, dispatch: tuple[int, ...] = KERNEL_HEAD_DIMS) -> list[str]:
    """Kernel stems one case dispatches to, from flash_api.cpp of 2.5.9-2.8.3 (same in each):

    - every fwd runs ``fwd`` and, with dropout_p == 0, maybe ``fwd_split`` (``run_mha_fwd``: the
      split-KV kernel when ``num_splits_heuristic`` picks > 1 split, e.g. small batch*nheads);
      a bwd case also runs its forward, and ``bwd``;
    - kvcache (``mha_fwd_kvcache``): always ``fwd_split`` when new k/v are appended or the cache is
      paged (``force_split_kernel``; paged KV is a runtime branch of the split kernels, no files of
      its own), else the heuristic decides, so ``fwd`` and ``fwd_split``;
    - seqlen_q == 1 (decode; varlen: the longest sequence is 1) drops causal (``is_causal = false``
      in mha_fwd, mha_varlen_fwd and mha_fwd_kvcache): the non-causal files.
    """
    if getattr(c, "impl", "flash_attn") == "sdpa":
        return []  # torch's own kernels
    causal = c.causal and c.seqlen_q > 1
    tail = f"hdim{kernel_head_dim(c.head_dim, dispatch)}_{c.dtype}{'_causal' if causal else ''}"
    func = getattr(c, "func", "func")
    if func == "kvcache":
        if c.append_kv or c.page_block_size:
            return [f"fwd_split_{tail}"]
        return [f"fwd_{tail}", f"fwd_split_{tail}"]
    need = [f"fwd_{tail}"]
    if not c.dropout_p:
        need.append(f"fwd_split_{tail}")
    if c.op == "bwd":
        need.append(f"bwd_{tail}")
    return need


def slim_plan(sdist: Path, kernels: list[str], version: str) -> stubgen.SlimPlan:
    """Run the slim build's stub generator on ``sdist`` (``.tar.gz``) without building anything:
    ``kernels`` resolved against its setup.py's kernel list, the files to drop and the stub file
    for them (see :mod:`stubgen`). ``plan`` calls this so that what the generator cannot handle
    fails that env, with the reason, before anything is compiled. Raises StubError."""
    return stubgen.plan_sdist(sdist, kernels, version)


def choose_jobs(n_builds: int, n_units: int) -> dict:
    """MAX_JOBS per build and NVCC_THREADS, bounded by cores and memory (an nvcc job can peak near
    8-9 GB) and shared by ``n_builds`` parallel builds. Returns the numbers and the reasoning."""
    cores = machine.cpu_count()
    mem = machine.mem_available_gb()
    total = max(1, min(cores, int(mem // NVCC_JOB_GB)))
    per = max(1, min(total // max(n_builds, 1), n_units))
    return {"max_jobs": per, "nvcc_threads": 1, "cores": cores, "mem_available_gb": round(mem, 1),
            "why": f"{cores} cores, {mem:.0f} GB available / {NVCC_JOB_GB:g} GB per nvcc job, "
                   f"{n_builds} parallel build(s), {n_units} compile units"}


def estimate_seconds(kernels: list[str] | str, n_archs: int, max_jobs: int, hits: set[str] | None = None) -> float:
    """Rough build time (s): list scheduling of per-file costs (:data:`EST_FILE_S`) over ``max_jobs``.

    ``hits``: kernel stems (and ``"stubs"`` for the stub file) expected from the compile cache; each
    costs :data:`compcache.EST_HIT_S` instead of its compile (see :mod:`compcache`)."""
    hits = hits or set()
    if kernels == "all":
        costs = [EST_FILE_S[k] for k in ("fwd", "fwd_split", "bwd") for _ in range(FULL_KERNEL_COUNT // 3)]
    else:
        costs = [compcache.EST_HIT_S if k in hits else EST_FILE_S["fwd_split" if k.startswith("fwd_split") else k.split("_")[0]]
                 for k in kernels]
        costs.append(min(EST_STUB_S, compcache.EST_HIT_S) if "stubs" in hits else EST_STUB_S)
    costs = [c * max(n_archs, 1) for c in costs] + [EST_API_S]
    return schedule(costs, max_jobs) + EST_OVERHEAD_S


def schedule(costs: list[float], jobs: int) -> float:
    """Makespan (s) of compile jobs of ``costs`` seconds on ``jobs`` parallel lanes, longest first
    (how ninja's queue behaves closely enough for an estimate)."""
    lanes = [0.0] * max(1, jobs)
    for c in sorted(costs, reverse=True):
        lanes[lanes.index(min(lanes))] += c
    return max(lanes)


def ninja_times(src: Path) -> dict[str, float]:
    """Per-file compile seconds from the ``.ninja_log`` torch's extension build leaves under ``build/``
    (columns: start ms, end ms, mtime, output, hash). Empty when the build did not use ninja."""
    out: dict[str, float] = {}
    for log in Path(src).glob("build/**/.ninja_log"):
        for line in log.read_text(errors="replace").splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
                name = Path(parts[3]).name
                out[name] = round((int(parts[1]) - int(parts[0])) / 1000.0, 1)
    return out



#: ninja's status line, default ``NINJA_STATUS`` ``[%f/%t] `` (finished/total edges), then the command
#: (torch runs ``ninja -v``). With its output going to a file (not a smart terminal) ninja prints it
#: when the edge FINISHES, followed by that command's output: ``[2/5]`` means 2 of 5 jobs are done.
_NINJA_STATUS = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")


_SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")


def ninja_unit(line: str) -> tuple[int, int, str | None] | None:
    """``(finished, total, source file name)`` of a ninja status line of the build log, else None.
    The name is that of the command's one token with a source suffix (.cu, .cpp, ...; ``-o``'s
    object and ``--dependency-output``'s .d are not): taking ``-c``'s argument named ``-c`` on the
    H200 (the console said "-c just finished" for every unit); None when there is none (a link)."""
    m = _NINJA_STATUS.match(line.rstrip("\r\n"))
    if not m:
        return None
    src = next((Path(t).name for t in (x.strip("'\"") for x in m[3].split()) if t.endswith(_SOURCE_SUFFIXES)), None)
    return int(m[1]), int(m[2]), src


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def unit_message(done: int, total: int, name: str | None, elapsed: float, estimate_s: float | None) -> str:
    """What a build's progress says when ninja reports a finished compile unit, e.g. ``compiling: 2/5
    done (flash_fwd_hdim32_fp16_sm80.cu just finished), 3 min 10 s of est. 5 min 50 s``."""
    msg = f"compiling: {done}/{total} done" + (f" ({name} just finished)" if name else "")
    if done >= total:
        msg += ", linking and packaging"
    msg += f", {_duration(elapsed)}"
    if estimate_s:
        msg += f" of est. {_duration(estimate_s)}" if elapsed <= estimate_s else f", over est. {_duration(estimate_s)}"
    return msg


class LogFollower:
    """Follows a build log from its current end while the build runs (a thread polling every
    ``interval`` s, and once more on exit) and calls ``on_unit(done, total, name)`` once per ninja
    status line (:func:`ninja_unit`), so at most once per compile unit. A failing callback is ignored:
    progress never fails a build."""

    def __init__(self, log: Path, on_unit: Callable[[int, int, str | None], None], interval: float = 0.5):
        self.log, self.on_unit, self.interval = Path(log), on_unit, interval
        self.pos = self.log.stat().st_size if self.log.exists() else 0
        self.buf = b""
        self.seen: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"follow {self.log.name}", daemon=True)

    def __enter__(self) -> "LogFollower":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.poll(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self, final: bool = False) -> None:
        try:
            with open(self.log, "rb") as f:
                f.seek(0, 2)
                if f.tell() < self.pos:  # the log was replaced: read it from the start
                    self.pos, self.buf = 0, b""
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return
        self.pos += len(data)
        *lines, self.buf = (self.buf + data).split(b"\n")
        if final and self.buf:
            lines.append(self.buf)
            self.buf = b""
        for raw in lines:
            unit = ninja_unit(raw.decode("utf-8", "replace"))
            if unit is None or unit[:2] in self.seen:
                continue
            self.seen.add(unit[:2])
            try:
                self.on_unit(*unit)
            except Exception:  # noqa: BLE001 - a display's error must not stop the build
                pass


#: A compiler's error line: nvcc ``file.cu(6): error: ...`` (also ``catastrophic error``, ``error #20-D``),
#: gcc/clang ``file.cpp:41:5: error: ...`` (also ``fatal error``). setuptools' ``error: command ...
#: failed`` names no file and line: not a compiler error.
_COMPILER_ERROR = re.compile(r"^(?P<file>\S[^:(]*?)(?:\(\d+\)|:\d+(?::\d+)?): (?:catastrophic |fatal )?error\b[^:]*:")


def compiler_errors(log: Path | None, max_errors: int = 3, context: int = 2) -> list[str]:
    """The first ``max_errors`` distinct compiler error lines of a build log, each with up to
    ``context`` indented lines after it (the source line and the caret), file paths shortened to the
    file name. Empty when the log has none (the build failed elsewhere: the log's tail tells)."""
    if log is None or not Path(log).is_file():
        return []
    out: list[str] = []
    seen: set[str] = set()
    lines = Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
    for i, ln in enumerate(lines):
        m = _COMPILER_ERROR.match(ln)
        if not m:
            continue
        short = Path(m["file"]).name + ln[m.end("file"):]
        if short in seen:  # one header's error repeats for every file that includes it
            continue
        seen.add(short)
        out.append(short)
        for nxt in lines[i + 1:i + 1 + context]:
            if not nxt.strip() or not nxt[0].isspace():
                break
            out.append(nxt.rstrip())
        if len(seen) >= max_errors:
            break
    return out


class BuildError(StageFailed):
    """A source build failed; ``log`` is the build log's path, ``tail`` the lines to show: the first
    compiler errors when the log has any, else its last lines."""

    def __init__(self, msg: str, log: Path | None = None, tail: str = ""):
        super().__init__(msg)
        self.log = log
        self.tail = tail


def source_build(*, python: Path, sdist: Path, workdir: Path, version: str, kernels, archs,
                 jobs: dict, log: Path, extra_env: dict | None = None, timeout: float | None = None,
                 compile_cache: dict | None = None, cache_root: Path | None = None,
                 on_progress: Callable[[str], None] | None = None,
                 estimate_s: float | None = None) -> tuple[Path, dict]:
    """Build a flash-attn wheel from ``sdist`` with the env interpreter ``python``.

    The sdist is unpacked into ``workdir/src`` whatever its version (the compile cache keys on
    preprocessed text, which carries absolute include paths: see :mod:`compcache`). The build runs
    without build isolation (flash-attn's setup.py imports torch, which must be the env's) and with
    ``FLASH_ATTENTION_FORCE_BUILD=TRUE`` (no release download). ``compile_cache``: the shim settings of
    :func:`compcache.shim_settings` (None: no cache), ``cache_root`` matrix-run's cache root (for
    sccache's server settings and counters; the manifest's ``compile_cache.stats`` are this build's
    hits and misses). ``on_progress``: called with :func:`unit_message` (``estimate_s`` the build's
    estimate) each time ninja reports a finished compile unit in the log, while the build runs.
    Returns ``(wheel_path, manifest)``. Raises BuildError with the log's tail on failure.
    """
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    with tarfile.open(sdist) as tf:
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(workdir, **kw)
    roots = [p for p in workdir.iterdir() if (p / "setup.py").is_file()]
    if not roots:
        raise BuildError(f"{sdist.name}: no setup.py at the top of the sdist")
    src = workdir / "src"
    roots[0].rename(src)
    env = {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}
    if archs != "all":
        env["FLASH_ATTN_CUDA_ARCHS"] = ";".join(archs)  # honoured from flash-attn 2.7.3
        env["TORCH_CUDA_ARCH_LIST"] = ";".join(f"{a[:-1]}.{a[-1]}" for a in archs)
    env.update(extra_env or {})
    settings = {"kernels": kernels, "archs": archs, "version": version, "extension": "flash_attn_2_cuda"}
    return _run_setup(python=python, workdir=workdir, setup_dir=src, what=f"flash-attn {version}", settings=settings,
                      env=env, jobs=jobs, log=log, timeout=timeout, compile_cache=compile_cache, cache_root=cache_root,
                      on_progress=on_progress, estimate_s=estimate_s)


def tree_build(*, python: Path, tree, workdir: Path, jobs: dict, log: Path, extra_env: dict | None = None,
               timeout: float | None = None, compile_cache: dict | None = None, cache_root: Path | None = None,
               on_progress: Callable[[str], None] | None = None, estimate_s: float | None = None) -> tuple[Path, dict]:
    """Build FlashAttention 3's wheel from a source tree (``fa3.SourceTree``) with the env interpreter
    ``python``: the tree's build files are written to ``workdir/src`` (a version-free path, as for
    sdists), hopper/setup.py runs there with ``extra_env`` (its DISABLE switches: fa3.build_env) and
    its own arch flags (sm_90a), through the same shim and compile cache as :func:`source_build`.
    Returns ``(wheel_path, manifest)`` (manifest ``sources``: what setup.py compiled). Raises BuildError."""
    from . import fa3

    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    src = fa3.materialize(tree, workdir / "src")
    settings = {"kernels": "all", "archs": "all", "version": tree.version, "extension": "flash_attn_3._C"}
    return _run_setup(python=python, workdir=workdir, setup_dir=src / "hopper", what=f"FlashAttention 3 {tree.version}",
                      settings=settings, env=dict(extra_env or {}), jobs=jobs, log=log, timeout=timeout,
                      compile_cache=compile_cache, cache_root=cache_root, on_progress=on_progress, estimate_s=estimate_s)


def _run_setup(*, python: Path, workdir: Path, setup_dir: Path, what: str, settings: dict, env: dict, jobs: dict,
               log: Path, timeout: float | None, compile_cache: dict | None, cache_root: Path | None,
               on_progress: Callable[[str], None] | None, estimate_s: float | None) -> tuple[Path, dict]:
    """Run ``setup_dir/setup.py bdist_wheel`` through ``_build_shim.py`` (the one way both builds
    run): no build isolation, MAX_JOBS/NVCC_THREADS from ``jobs``, git kept inside ``workdir``, the
    compile cache's server when ``compile_cache`` is set. ``env`` goes on top."""
    dist = workdir / "dist"
    manifest_path = workdir / "manifest.json"
    settings = {**settings, "dist_dir": str(dist), "manifest": str(manifest_path), "compile_cache": compile_cache}
    (workdir / "settings.json").write_text(json.dumps(settings))
    shim = Path(__file__).with_name("_build_shim.py")
    env = {
        "MAX_JOBS": str(jobs["max_jobs"]),
        "NVCC_THREADS": str(jobs["nvcc_threads"]),
        # setup.py runs `git submodule update`: never let it find a repository above the sources
        "GIT_CEILING_DIRECTORIES": str(workdir),
        "PYTHONNOUSERSITE": "1",
        **env,
    }
    # torch.utils.cpp_extension runs `ninja --version`: the env's and matrix-run's bin dirs go first
    path_dirs = [str(Path(python).parent), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    env["PATH"] = os.pathsep.join(dict.fromkeys(p for p in path_dirs if p))
    before, cache_note = None, None
    if compile_cache:
        sccache, root = compile_cache["sccache"], Path(cache_root or Path(compile_cache["dir"]).parent)
        if compcache.start_server(sccache, root, log):
            env.update(compcache.server_env(root))
            before = compcache.stats(sccache, root)
        else:  # a client without its server fails every compile: build without the cache instead
            cache_note = (f"sccache's server did not start (port {compcache.server_env(root)['SCCACHE_SERVER_PORT']}; "
                          f"see {log}): built without the compile cache; MATRIX_RUN_SCCACHE_PORT picks another port")
            compile_cache = None
            settings["compile_cache"] = None
            (workdir / "settings.json").write_text(json.dumps(settings))
    t0 = time.monotonic()
    follow = contextlib.nullcontext()
    if on_progress is not None:
        follow = LogFollower(log, lambda done, total, name: on_progress(
            unit_message(done, total, name, time.monotonic() - t0, estimate_s)))
    with follow:
        res = run_logged([str(python), str(shim), str(workdir / "settings.json")], cwd=setup_dir, env_extra=env,
                         log=log, timeout=timeout)
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if compile_cache:
        after = compcache.stats(sccache, root)
        manifest.setdefault("compile_cache", {})["stats"] = compcache.delta(before, after)
    elif cache_note:
        manifest["compile_cache"] = {"off": cache_note}
    manifest["seconds"] = round(time.monotonic() - t0, 1)
    manifest["compile_seconds"] = ninja_times(setup_dir)
    wheels = sorted(dist.glob("*.whl")) if dist.is_dir() else []
    if res.returncode != 0 or not wheels:
        why = "timed out" if res.timed_out else f"exit code {res.returncode}"
        errors = compiler_errors(log)
        if errors:  # the compiler's words, not the tail of setuptools' traceback far below them
            raise BuildError(f"source build of {what} failed ({why}): {errors[0]}; log: {log}", log,
                             "\n".join(["first compiler errors:", *errors, f"full log: {log}"]))
        raise BuildError(f"source build of {what} failed ({why}); log: {log}", log, res.tail)
    return wheels[0], manifest
