"""Preparing each env as planned (:func:`prepare_env`, under the env's file lock): reuse it, or create
the venv, obtain the wheel (find-links, cache, release download, or a source build into the wheel
cache in a build slot) or let uv install the subject, install it, run the static preflight and write
the env record; the outcome is an :class:`EnvResult` (one entry of results.json's ``envs``). Also
the ``here`` backend (:func:`prepare_here`)."""
from __future__ import annotations

import shutil
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

from .. import build as buildmod
from .. import compcache, fa3, subjects, wheels
from ..config import Case
from ..proc import Stopped, stopping
from .plan import (
    Options,
    PlanItem,
    _tree_wheel,
    plan_env,
    torch_identity,
    waits_for_cache,
)
from .preflight import preflight, static_preflight
from .record import RECORD, RECORD_SCHEMA, is_matrix_run_env, load_record, write_record
from .requests import EnvRequest
from .venv import (
    BUILD_DEPS,
    EnvError,
    _importable,
    create_venv,
    env_python,
    fingerprint,
    install_subject,
    install_wheel,
    probe,
)


@dataclass
class EnvResult:
    """Outcome of preparing one env; becomes one entry of results.json's ``envs``."""

    label: str
    requested: str
    env_dir: str
    python: str | None = None
    status: str = "pending"  # ok | failed | skipped
    error: str | None = None
    error_tail: str | None = None
    probe: dict | None = None
    build: dict = field(default_factory=dict)
    plan: dict | None = None
    #: the flash_attn version the env must import (None: not checked, e.g. the ``here`` backend)
    version: str | None = None
    #: False until a full import of flash_attn in the env passed :func:`check_probe`
    import_checked: bool = True
    #: ``{version, torch}`` in a version x torch matrix (EnvRequest.axis); None without a torch axis
    axis: dict | None = None

    def to_dict(self) -> dict:
        p = self.probe or {}
        fa = p.get("flash_attn") or {}
        t = p.get("torch") or {}
        return {
            "label": self.label, "requested_version": self.requested, "env_dir": self.env_dir,
            "python": p.get("python"), "python_executable": self.python,
            "flash_attn_version": fa.get("version"), "flash_attn_file": fa.get("file"),
            "flash_attn_ext_file": fa.get("ext_file"), "subject": fa.get("subject") or subjects.DEFAULT,
            "torch": t.get("version"), "torch_cuda": t.get("cuda"), "gpu": (t.get("gpu") or {}).get("name"),
            "status": self.status, "error": self.error, "error_tail": self.error_tail,
            "import_checked": self.import_checked, "build": self.build, "plan": self.plan, "axis": self.axis,
        }


Progress = Callable[[str, str], None]


@dataclass
class Prepared:
    """What preparing one env produced; :func:`prepare_env` alone fills its :class:`EnvResult` from it
    and writes the env record."""

    #: merged into ``EnvResult.build``: how the env was obtained (reused, wheel and its sha256, the build)
    build: dict
    #: the static preflight's probe, or the reused env's
    probe: dict
    #: the env's interpreter
    python: str
    #: ``EnvResult.import_checked``: False until the env's first worker passed the full import check
    import_checked: bool
    #: the env record to write; None: the existing one stands
    record: dict | None = None


def prepare_env(req: EnvRequest, item: PlanItem, opts: Options, driver_probe: dict, cases: list[Case],
                progress: Progress = lambda label, msg: None) -> EnvResult:
    """Carry out ``item`` for ``req``. Never raises for env-local failures: returns a failed result
    with the reason and the log's last lines, so other envs go on."""
    res = EnvResult(req.label, req.version, str(item.env_dir), plan=item.to_dict(), version=item.version, axis=req.axis)
    step = {"now": "planning"}
    outer_progress = progress

    def progress(label: str, msg: str) -> None:  # remember the step, for an interrupt's message
        step["now"] = msg
        outer_progress(label, msg)

    logdir = opts.envs_dir / ".logs"
    logdir.mkdir(parents=True, exist_ok=True)
    log = logdir / f"{req.label}.log"
    t0 = time.monotonic()
    kept_note: dict = {}  # _kept_until_replaced: "restored" once an earlier env went back
    res.build = {"method": item.method, "seconds": 0.0, "reused": False, "key": item.key, "key_id": item.key_id,
                 "log": str(log)}
    try:
        if item.method == "failed":
            raise EnvError(item.error or "no way to obtain this version")
        with FileLock(str(opts.envs_dir / f".{req.label}.lock")):
            if item.method != "reuse" and load_record(item.env_dir) and not opts.rebuild:
                # another matrix-run may have finished this env while we waited for the lock
                fresh = plan_env(req, cases, opts, driver_probe)
                if fresh.method == "reuse":
                    item = fresh
                    res.build.update({"method": "reuse", "plan_changed": "built by another process meanwhile"})
            tid = torch_identity(opts, driver_probe, req)
            done: Prepared | None = None
            rebuilt: dict = {}
            if item.method == "reuse":
                progress(req.label, "checking the existing env")
                try:
                    done = _prepare_reused(req, item)
                except EnvError as e:
                    progress(req.label, f"existing env is broken ({e}); rebuilding")
                    rebuilt = {"rebuilt_because": str(e)}
                    res.build.update(rebuilt)  # every kind of env (the flash-attn path also records it in the env)
                    item = plan_env(req, cases, replace(opts, rebuild=True), driver_probe)
                    # how it is obtained now (new-user trial: the rebuilt env was reported "reuse, 0.2 s")
                    res.build.update({"method": item.method, "key": item.key, "key_id": item.key_id})
                    if item.method == "failed":
                        raise EnvError(item.error or "no way to rebuild this env") from None
            if done is None:
                with _kept_until_replaced(item.env_dir, kept_note) as kept:
                    progress(req.label, "creating venv (uv)")
                    py = create_venv(item.env_dir, driver_probe.get("executable") or sys.executable, tid, opts, log)
                    res.python = str(py)  # set now: a failure from here on still names the env's python
                    if req.package != subjects.DEFAULT and req.subject.tree:
                        done = _prepare_tree(req, item, opts, py, tid, driver_probe, progress, log)
                    elif req.package != subjects.DEFAULT:
                        done = _prepare_subject(req, item, opts, py, tid, driver_probe, progress, log)
                    else:
                        done = _prepare_flash_attn(req, item, opts, py, tid, driver_probe, progress, log, rebuilt)
                    if done.record is not None:  # the new env is whole once its record is written
                        res.probe, res.python, res.import_checked = done.probe, done.python, done.import_checked
                        write_record(item.env_dir / RECORD, done.record)
                        done.record = None
                    kept.replaced = True
            res.probe, res.python, res.import_checked = done.probe, done.python, done.import_checked
            if done.record is not None:  # after the result is filled: a failed write still reports the probe
                write_record(item.env_dir / RECORD, done.record)
            res.build.update(done.build)
        res.status = "ok"
        if not res.build.get("wheel_sha256"):  # a reused env: the record says which wheel it holds
            res.build["wheel_sha256"] = ((load_record(item.env_dir) or {}).get("wheel") or {}).get("sha256")
    except (EnvError, buildmod.BuildError, wheels.urllib.error.URLError, LookupError, OSError, Stopped) as e:
        res.status = "failed"
        res.error = str(e)
        if isinstance(e, wheels.urllib.error.URLError):  # new-user trial: "<urlopen error [Errno 111] Connection
            # refused>" alone, naming neither what was fetched nor from where
            res.error = (f"{step['now']}: could not reach the network: {getattr(e, 'reason', e)} (the index: "
                         f"--index-url {opts.index_url}; release wheels: github.com); check the URL and the "
                         "network, or carry the files: matrix-run wheelhouse on a machine with network, then "
                         "--find-links DIR --offline here")
        res.error_tail = getattr(e, "tail", "") or None
        if stopping():  # a step cut short by Ctrl-C fails in its own words (e.g. "no setuptools"): say what happened
            res.error, res.error_tail = f"interrupted while {step['now']}", None
        if kept_note.get("restored"):  # say so (new-user trial: nothing told the user the old env survived)
            res.error += f"; the env that was in {item.env_dir} before is kept as it was"
    res.build["seconds"] = round(time.monotonic() - t0, 2)
    return res


class _Kept:
    """What :func:`_kept_until_replaced` set aside; ``replaced``: the new env is whole."""

    def __init__(self, aside: Path | None):
        self.aside, self.replaced = aside, False


@contextmanager
def _kept_until_replaced(env_dir: Path, note: dict | None = None):
    """An existing matrix-run env at ``env_dir`` is moved aside (``.<name>.previous`` beside it) while
    a new one is made there, deleted once the new one is whole (``kept.replaced``), and put back if
    making it failed or was interrupted (the half-made one deleted; ``note["restored"]`` then). A new-user trial's
    ``--torch 1.0`` (no wheel for its Python) had deleted both of a run's working envs before uv
    failed. A directory that is not a matrix-run env is left where it is (create_venv refuses it).
    The env goes back to its own path, so nothing in it has to move (a venv is not relocatable)."""
    aside = None
    if env_dir.exists() and is_matrix_run_env(env_dir):
        aside = env_dir.with_name(f".{env_dir.name}.previous")
        if aside.exists():
            shutil.rmtree(aside)
        env_dir.rename(aside)
    kept = _Kept(aside)
    try:
        yield kept
    finally:
        if aside is not None:
            if kept.replaced:
                shutil.rmtree(aside, ignore_errors=True)
            else:
                shutil.rmtree(env_dir, ignore_errors=True)
                aside.rename(env_dir)
                if note is not None:
                    note["restored"] = True


def _prepare_reused(req: EnvRequest, item: PlanItem) -> Prepared:
    """An env the plan reuses: its record's probe when nothing in it changed since its preflight passed
    (the fingerprint), else the full preflight, with the record to update. Raises EnvError when the
    preflight fails (the env is broken: :func:`prepare_env` rebuilds it)."""
    env_dir = item.env_dir
    rec = load_record(env_dir) or {}
    fp = fingerprint(env_dir)
    if fp and rec.get("fingerprint") == fp and rec.get("probe"):
        # nothing in the env changed since its preflight passed: skip the ~2 s re-import
        # (the worker probes again, and checks the import if it was never checked)
        return Prepared({"reused": True, "preflight": "fingerprint unchanged"}, rec["probe"],
                        str(env_python(env_dir)), bool(rec["probe"].get("import_checked", True)))
    p = preflight(env_python(env_dir), env_dir, req, item.version)
    return Prepared({"reused": True, "preflight": "import checked"}, p, str(env_python(env_dir)), True,
                    {**rec, "fingerprint": fingerprint(env_dir), "probe": p, "status": "ok", "import_error": None})


def _pinned_torch_key(py: Path, tid: dict, key: dict) -> tuple[dict, dict]:
    """A wheel key with the torch the env holds: with a pinned torch (``--torch X.Y.Z``) its CUDA
    version and C++ ABI are known only once it is installed, so the venv's torch is probed and put
    into the key (both wheel paths: flash-attn 2 and a tree subject). Returns (key, the probed torch;
    {} with an inherited torch, whose key the plan already knew)."""
    if tid["mode"] != "pinned":
        return dict(key), {}
    tp = probe(py).get("torch") or {}
    return {**key, "torch_cuda": tp.get("cuda"), "cxx11abi": tp.get("cxx11abi"),
            "torch": tp.get("version", key.get("torch", tid["version"]))}, tp


def _prepare_flash_attn(req, item, opts, py, tid, driver_probe, progress, log, rebuilt: dict) -> Prepared:
    """Obtain flash-attn's wheel (find-links, cache, the release wheel, or a source build into the
    cache), install it into the new venv ``py`` and run the static preflight; the record names the
    wheel with its key, and the build info (``rebuilt``: why a reused env was rebuilt, first)."""
    env_dir = item.env_dir
    info: dict = dict(rebuilt)
    key, tp = _pinned_torch_key(py, tid, item.key)
    if tp:
        tid = {**tid, "cuda": tp.get("cuda"), "cxx11abi": tp.get("cxx11abi")}
    wheel: Path | None = None
    sha = None
    if item.method in ("find-links", "cache", "local-wheel", "reuse") and item.wheel and not item.wheel.startswith("http"):
        wheel = Path(item.wheel)
    elif item.method == "prebuilt":
        progress(req.label, "downloading the release wheel")
        dest = opts.cache_dir / "downloads" / item.prebuilt
        if not dest.exists():
            wheels.download(item.wheel, dest, timeout=60)
        wheel = wheels.cache_store(opts.cache_dir, dest, item.key, {"method": "prebuilt", "url": item.wheel})
    else:
        wheel, built = _build_into_cache(req, item, key, opts, py, progress, log)
        info.update(built)
    sha = _install(req, py, wheel, opts, log, progress)
    progress(req.label, "preflight: finding flash_attn in the env")
    p = static_preflight(py, env_dir, item.version,
                         driver_probe.get("torch") if tid["mode"] == "inherit" else (tp or None))
    record = {"schema": RECORD_SCHEMA, "label": req.label, "requested": req.version, "torch": tid,
              "fingerprint": fingerprint(env_dir), "probe": p,
              "python": p.get("python"), "status": "ok",
              "wheel": {"file": str(wheel), "sha256": sha, "key": key if item.method != "local-wheel" else {},
                        "origin": item.method, "unverified": item.wheel_unverified},
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "build": info}
    return Prepared({"wheel": str(wheel), "wheel_sha256": sha, **info}, p, str(py), False, record)


def _install(req, py: Path, wheel: Path, opts: Options, log: Path, progress) -> str:
    """Install ``wheel`` into the env (uv, no deps; both wheel paths: flash-attn 2 and a tree subject);
    returns its sha256."""
    progress(req.label, f"installing {wheel.name}")
    install_wheel(py, wheel, opts, log)
    return wheels.sha256_file(wheel)


def _prepare_subject(req, item, opts, py, tid, driver_probe, progress, log) -> Prepared:
    """Install a subject other than flash-attn (:func:`install_subject`), write the worker's subject
    marker, and run the static preflight on the subject's module; the record to write goes with it."""
    progress(req.label, f"installing {req.spec} with uv")
    t0 = time.monotonic()
    install_subject(py, req, tid, opts, log)
    info = {"method": "resolve", "subject": req.package, "seconds": round(time.monotonic() - t0, 1)}
    p, record = _finish_subject_env(req, item, py, tid, driver_probe, progress, req.version, {"build": info})
    return Prepared(info, p, str(py), False, record)


def _finish_subject_env(req, item, py, tid, driver_probe, progress, version: str, extra: dict) -> tuple[dict, dict]:
    """The end of a subject's env (FA4 and FA3 alike): the worker's subject marker, the static
    preflight on the subject's module, and the env record (``extra`` on top: ``build``, and ``wheel``
    for an installed wheel). Returns the probe and the record to write."""
    write_record(item.env_dir / subjects.MARKER, subjects.marker(req.subject, version, str(item.env_dir)))
    progress(req.label, f"preflight: finding {req.subject.module} in the env")
    p = static_preflight(py, item.env_dir, version,
                         driver_probe.get("torch") if tid["mode"] == "inherit" else None, req.subject)
    record = {"schema": RECORD_SCHEMA, "label": req.label, "requested": req.spec, "torch": tid,
              "subject_key": item.key, "fingerprint": fingerprint(item.env_dir), "probe": p,
              "python": p.get("python"), "status": "ok",
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra}
    return p, record


def _prepare_tree(req, item, opts, py, tid, driver_probe, progress, log) -> Prepared:
    """Obtain the tree subject's wheel (find-links, cache, or a build from the tree into the cache),
    install it, write the worker's subject marker, run the static preflight; the env record to write
    goes with it."""
    t0 = time.monotonic()
    key, _ = _pinned_torch_key(py, tid, item.key)
    info: dict = {"subject": req.package, "tree": key["tree"]}
    if item.method in ("cache", "find-links", "reuse") and item.wheel and Path(item.wheel).is_file():
        wheel = Path(item.wheel)
    else:
        wheel, built = _build_tree_into_cache(req, item, key, opts, py, progress, log)
        info.update(built)
    sha = _install(req, py, wheel, opts, log, progress)
    info.update({"method": item.method, "seconds": round(time.monotonic() - t0, 1)})
    p, record = _finish_subject_env(req, item, py, tid, driver_probe, progress, item.version,
                                    {"wheel": {"file": str(wheel), "sha256": sha, "key": key, "origin": item.method},
                                     "build": info})
    return Prepared({"wheel": str(wheel), "wheel_sha256": sha, **info}, p, str(py), False, record)


def _require_build_deps(py: Path) -> None:
    """EnvError unless the env can import what setup.py imports (BUILD_DEPS[:3]); both source builds."""
    missing = [m for m in BUILD_DEPS[:3] if not _importable(py, m)]
    if missing:
        what = ", ".join(missing)
        raise EnvError(f"a source build needs {what} in the env: install {'it' if len(missing) == 1 else 'them'} "
                       f"in the interpreter running matrix-run (`python -m pip install {' '.join(missing)}`; "
                       "--torch inherit) or put the wheels in --find-links")


#: How long a build the plan has waiting for another build's kernel files gives that build to take
#: their compile locks (its venv, torch and build requirements come first: seconds to a minute).
PLANNED_START_S = 120.0


def _let_the_planned_build_start(locks: list, on_wait: Callable[[], None], timeout: float = PLANNED_START_S,
                                 poll: float = 0.5) -> bool:
    """For a build that waits for another build of the same run (envs.plan.waits_for_cache): return
    as soon as one of the shared units' ``locks`` is held by someone else (the planned build has
    started compiling: the caller then blocks on it and takes the compile cache's hits), or after
    ``timeout`` s with none held (the other build failed or never started: compile them here).
    Without this the builds raced for the locks and the one the plan sized as waiting could win
    (H200, 2026-12-02: 2.7.0.post2 compiled the shared files with the 4 jobs planned for waiting,
    its slowest file in a second wave, 487 s, while 2.6.3 with its 5 jobs waited;
    benchmarks/results/h200-ops-12-02.txt). Returns whether another build was seen holding one."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        for lk in locks:
            try:
                lk.acquire(timeout=0)
            except Timeout:
                return True
            lk.release()
        if time.monotonic() >= deadline:
            return False
        if not said:
            on_wait()
            said = True
        time.sleep(poll)


def _build_tree_into_cache(req, item, key, opts, py, progress, log) -> tuple[Path, dict]:
    """Build the tree subject's wheel (fa3.py: the tree's build files only, its DISABLE switches, no
    download) in a build slot and store it in the wheel cache under ``key``. Returns the cached wheel
    and what goes into the env's build info (``built_by_other_process``, or ``source_build``, ``jobs``
    and ``switches``). Raises BuildError."""
    kid = wheels.key_id(key)
    (opts.cache_dir / "wheels").mkdir(parents=True, exist_ok=True)
    with FileLock(str(opts.cache_dir / "wheels" / f"{kid}.build.lock")):
        found = _tree_wheel(opts, key)  # another matrix-run process may have built it meanwhile
        if found is not None:
            return found, {"built_by_other_process": True}
        _require_build_deps(py)
        tree = fa3.open_tree(req.version)
        if tree.tree_id != key["tree"]:
            raise EnvError(f"{req.version} changed since the plan (tree {tree.tree_id}, planned {key['tree']}): run again")
        env, _ = fa3.build_env(key["disabled"], tree.available_switches)
        if item.method == "source-nocuda":
            env["FLASH_ATTENTION_SKIP_CUDA_BUILD"] = "TRUE"
        jobs = item.jobs or buildmod.choose_jobs(1, 8)
        cc = compcache.shim_settings((item.compile_cache or {}).get("sccache"), opts.cache_dir) if opts.compile_cache else None
        with ExitStack() as stack:
            workdir = _acquire_slot(opts, stack)
            what = ("its Python part only: no CUDA" if item.method == "source-nocuda" else
                    f"{len(item.kernels)} kernel files, MAX_JOBS={jobs['max_jobs']}, est. {item.estimate_s or '?'} s"
                    f"{', compile cache' if cc else ''}")
            progress(req.label, f"building FA3 from {Path(req.version).name} ({what})")
            wheel, manifest = buildmod.tree_build(python=py, tree=tree, workdir=workdir, jobs=jobs, log=log,
                                                  extra_env=env, compile_cache=cc, cache_root=opts.cache_dir,
                                                  on_progress=lambda msg: progress(req.label, msg),
                                                  estimate_s=item.estimate_s)
            manifest["predicted_kernel_files"] = item.kernels
            info = {"source_build": manifest, "jobs": jobs, "switches": env}
            cached = wheels.cache_store(opts.cache_dir, wheel, key, {"method": item.method, "manifest": manifest,
                                                                    "jobs": jobs, "tree": str(req.version)})
            shutil.rmtree(workdir, ignore_errors=True)
        return cached, info


def _build_into_cache(req, item, key, opts, py, progress, log) -> tuple[Path, dict]:
    """Build flash-attn's wheel from its sdist (downloaded first when the plan had none) in a build
    slot, slim or full as planned, and store it in the wheel cache under ``key``. Returns the cached
    wheel and what goes into the env's build info (``built_by_other_process``, or ``dispatch``,
    ``warning``, ``compile_cache_note``, ``source_build``, ``jobs``, ``sdist``, ``sdist_sha256``).
    Raises BuildError."""
    info: dict = {}
    kid = wheels.key_id(key)
    (opts.cache_dir / "wheels").mkdir(parents=True, exist_ok=True)
    with FileLock(str(opts.cache_dir / "wheels" / f"{kid}.build.lock")):
        # another matrix-run process may have built this key while we waited for the lock
        for c in wheels.scan_wheels([opts.cache_dir / "wheels"], item.version, key, origin="cache"):
            if c.reason is None:
                return c.path, {"built_by_other_process": True}
        sdist = Path(item.sdist) if item.sdist else None
        if sdist is None:
            progress(req.label, "downloading the sdist")
            sdist = wheels.fetch_sdist(item.version, opts.cache_dir, opts.index_url)
        kernels = item.kernels
        if kernels != "all":  # re-derive with the sdist's own dispatch list
            info["dispatch"] = list(buildmod.read_dispatch(sdist))
        if kernels != [] and not _importable(py, "ninja"):
            info["warning"] = "ninja is not importable in the env: torch builds the extension serially"
        _require_build_deps(py)
        jobs = item.jobs or buildmod.choose_jobs(1, 8)
        plan_cc = item.compile_cache or {}
        cc = compcache.shim_settings(plan_cc.get("sccache"), opts.cache_dir) if opts.compile_cache else None
        keys = dict(plan_cc.get("keys") or {})
        if cc and not keys:
            info["compile_cache_note"] = ("no content keys (full build, or the sdist was downloaded after the plan): "
                                          "sccache still caches; the ledger that predicts hits is not updated")
        with ExitStack() as stack:
            # an identical compile unit is compiled once: wait for a build that is compiling it now
            if cc and keys:
                lock_dir = compcache.cache_dir(opts.cache_dir) / "locks"
                lock_dir.mkdir(parents=True, exist_ok=True)
                locks = [FileLock(str(lock_dir / f"{k[:32]}.lock")) for k in sorted(set(keys.values()))]
                if waits_for_cache(item):  # the plan has another build of this run compile them first
                    _let_the_planned_build_start(locks, lambda: progress(
                        req.label, "waiting for another build compiling the same kernel files (compile cache)"))
                for lk in locks:
                    try:
                        lk.acquire(timeout=0)
                    except Timeout:
                        progress(req.label, "waiting for another build compiling the same kernel files (compile cache)")
                        lk.acquire()
                    stack.callback(lk.release)
            workdir = _acquire_slot(opts, stack)
            progress(req.label, f"building from source ({'slim: ' + str(len(kernels)) + ' kernel files' if kernels != 'all' else 'full'}, "
                                f"MAX_JOBS={jobs['max_jobs']}, est. {item.estimate_s or '?'} s"
                                f"{', compile cache' if cc else ''})")
            extra = {"FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"} if item.method == "source-nocuda" else None
            wheel, manifest = buildmod.source_build(python=py, sdist=sdist, workdir=workdir, version=item.version,
                                                    kernels=kernels if kernels != [] else "all",
                                                    archs=item.archs if item.archs != [] else "all", jobs=jobs,
                                                    log=log, extra_env=extra, compile_cache=cc,
                                                    cache_root=opts.cache_dir,
                                                    on_progress=lambda msg: progress(req.label, msg),
                                                    estimate_s=item.estimate_s)
            if cc and keys and not (manifest.get("compile_cache") or {}).get("off"):
                secs = {}  # ninja's log names objects: flash_fwd_hdim32_fp16_sm80.o, matrix_run_stubs.o
                for n, t in (manifest.get("compile_seconds") or {}).items():
                    src = n[:-2] + ".cu" if n.endswith(".o") else n
                    secs[buildmod.stubgen.stem(src) or ("stubs" if n.startswith("matrix_run_stubs") else n)] = t
                compcache.record(opts.cache_dir, keys, item.version, secs)
                manifest.setdefault("compile_cache", {})["expected_hits"] = sorted(plan_cc.get("expected_hits") or {})
            info.update({"source_build": manifest, "jobs": jobs, "sdist": str(sdist),
                         "sdist_sha256": wheels.sha256_file(sdist)})
            cached = wheels.cache_store(opts.cache_dir, wheel, key, {"method": item.method, "manifest": manifest,
                                                                    "jobs": jobs, "sdist": sdist.name})
            shutil.rmtree(workdir, ignore_errors=True)
        return cached, info


def _acquire_slot(opts: Options, stack: ExitStack) -> Path:
    """The first free build directory ``<cache>/build/slot-N`` (held until ``stack`` closes). Builds
    run in these version-free paths so that the compile cache's keys (which carry absolute include
    paths) match across versions (compcache.py); with every slot busy, wait for slot 0."""
    slots = compcache.slot_dirs(opts.cache_dir)
    slots[0].parent.mkdir(parents=True, exist_ok=True)
    for d in slots:
        lk = FileLock(str(d) + ".lock")
        try:
            lk.acquire(timeout=0)
        except Timeout:
            continue
        stack.callback(lk.release)
        return d
    lk = FileLock(str(slots[0]) + ".lock")
    lk.acquire()
    stack.callback(lk.release)
    return slots[0]


def prepare_here(req: EnvRequest, driver_probe: dict) -> EnvResult:
    """The ``here`` backend (for tox and other env managers): the interpreter running matrix-run is
    the env. Nothing is built; the preflight checks the imported flash_attn version."""
    res = EnvResult(req.label, req.version, sys.prefix, python=sys.executable)
    res.build = {"method": "here", "seconds": 0.0, "reused": True}
    p = driver_probe
    fa = (p or {}).get("flash_attn") or {}
    if p.get("error"):
        res.status, res.error = "failed", f"preflight: {p['error']}"
    elif req.version != "here" and not wheels.same_version(str(fa.get("version")), req.version):
        res.status, res.error = "failed", (f"preflight: this interpreter imports flash_attn {fa.get('version')}, "
                                           f"not the requested {req.version}")
    else:
        res.status, res.probe = "ok", p
    return res
