"""The plan of each env, made before anything is built (``matrix-run plan`` prints it): the run's
:class:`Options`, the torch identity, the wheel key for this env's torch/python/GPU, and where the
wheel comes from (:class:`PlanItem`: reuse of an existing env, ``--find-links``, the wheel cache,
the release wheel, a slim or full source build, a subject resolved by uv, an FA3 tree build), with
the compile cache's content keys and expected hits for a source build."""
from __future__ import annotations

import sys
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .. import build as buildmod
from .. import compcache, fa3, machine, subjects, wheels
from ..config import Case
from ..errors import UsageError
from .record import RECORD, RECORD_SCHEMA, is_matrix_run_env, load_record, reuse_state
from .requests import EnvRequest
from .venv import driver_site_dirs, local_version


def python_tag(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"cp{major}{minor}"


def gpu_archs_from_probe(p: dict) -> list[str] | None:
    gpu = ((p or {}).get("torch") or {}).get("gpu")
    if gpu and gpu.get("capability"):
        return [gpu["capability"].replace(".", "")]
    return machine.compute_capabilities()


@dataclass
class Options:
    """Settings shared by every env of a run (see ``matrix-run --help``)."""

    envs_dir: Path
    cache_dir: Path
    find_links: list[Path] = field(default_factory=list)
    offline: bool = False
    #: every ``--torch`` value (parse_torches); several: a torch axis (cross_torch)
    torches: list[str] = field(default_factory=lambda: ["inherit"])
    torch_index: str | None = None
    build: str = "auto"  # auto | slim | full
    archs: list[str] | None = None
    index_url: str = wheels.DEFAULT_INDEX
    rebuild: bool = False
    compile_cache: bool = True  # --no-compile-cache: False (see compcache.py)

    @property
    def torch(self) -> str:
        """The first ``--torch`` value: what an env without its own (EnvRequest.torch) gets."""
        return self.torches[0]


@dataclass
class PlanItem:
    """What :func:`prepare_env` will do for one env; shown by ``matrix-run plan``."""

    label: str
    version: str
    env_dir: Path
    method: str  # reuse | find-links | cache | prebuilt | source-slim | source-full | local-wheel | failed
    key: dict
    key_id: str
    kernels: list[str] | str
    archs: list[str] | str
    wheel: str | None = None
    sdist: str | None = None
    prebuilt: str | None = None
    estimate_s: float | None = None
    jobs: dict | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    #: source builds: {"sccache": path|None, "note", "keys": {unit: content key}, "expected_hits": {unit: from},
    #: "estimate_cold_s"} (see compcache.py); None for items that compile nothing
    compile_cache: dict | None = None
    #: the wheel (find-links or cache) carries no matrix-run key: nothing but its name says what it
    #: holds (the import preflight checks it); an env holding one is not reused by a later plan that
    #: is not offered the same wheel again
    wheel_unverified: bool = False

    def to_dict(self) -> dict:
        d = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        return d


def env_dir_for(opts: Options, label: str) -> Path:
    d = (opts.envs_dir / label).resolve()
    if d.parent != opts.envs_dir.resolve():
        raise UsageError(f"env label {label!r} would leave --envs-dir {opts.envs_dir}")
    return d


def torch_identity(opts: Options, driver_probe: dict, req: EnvRequest | None = None) -> dict:
    """The torch part of an env's identity: inherit (driver's torch) or a pinned version; ``req.torch``
    (a torch axis) before ``opts.torch``."""
    spec = (req.torch if req is not None and req.torch else None) or opts.torch
    if spec == "inherit":
        t = (driver_probe or {}).get("torch")
        if not t:
            raise UsageError("--torch inherit: the interpreter running matrix-run "
                             f"({sys.executable}) cannot import torch ({(driver_probe or {}).get('error')}); "
                             "install torch there or pin one with --torch X.Y.Z")
        return {"mode": "inherit", "version": t["version"], "cuda": t["cuda"], "cxx11abi": t["cxx11abi"],
                "site_dirs": driver_site_dirs()}
    return {"mode": "pinned", "version": spec, "index": opts.torch_index}


def same_torch(recorded: dict | None, tid: dict) -> bool:
    """Whether an env record's torch is the one :func:`torch_identity` asks for. A pinned torch is
    what was asked (version, index): the record also holds its CUDA version and C++ ABI, read after
    it was installed, which the plan cannot know (comparing whole dicts rebuilt every pinned env on
    every run). An inherited one must match entirely (the driver's torch may have changed)."""
    if not recorded:
        return False
    if tid.get("mode") == "pinned":
        return all(recorded.get(k) == tid.get(k) for k in ("mode", "version", "index"))
    return recorded == tid


def wanted_key(version: str, tid: dict, py: str, archs, kernels, platform_tag: str = "linux_x86_64") -> dict:
    try:
        fa = str(Version(version).public)
    except InvalidVersion:
        fa = version
    return {"flash_attn": fa,
            "torch": tid["version"], "torch_cuda": tid.get("cuda"), "cxx11abi": tid.get("cxx11abi"),
            "python_tag": python_tag(py), "platform": platform_tag, "archs": archs, "kernels": kernels}


def plan_env(req: EnvRequest, cases: list[Case], opts: Options, driver_probe: dict, n_builds_hint: int = 1,
             planned_units: dict | None = None) -> PlanItem:
    """Decide, without building anything, how ``req``'s env will be obtained (see module doc).
    An env directory that exists but is not a matrix-run env makes the item "failed": it would be
    refused when the env is created (it is never deleted). ``planned_units``: content key → label of
    the env planned first with that compile unit in this run (filled in here; see compcache.py)."""
    item = _plan_env(req, cases, opts, driver_probe, n_builds_hint, planned_units if planned_units is not None else {})
    d = item.env_dir
    if item.method == "reuse":
        state = reuse_state(d, load_record(d))
        if state:
            item.notes.append(f"existing env {state}")
    if item.method not in ("failed", "reuse") and (d.exists() or d.is_symlink()) and not is_matrix_run_env(d):
        item.method = "failed"
        item.error = (f"{d} exists and is not a matrix-run env (no {RECORD} or pyvenv.cfg): it is left untouched; "
                      "move it or use another --envs-dir")
    return item


def _plan_subject(req: EnvRequest, opts: Options, driver_probe: dict) -> PlanItem:
    """Plan of a subject other than flash-attn (subjects.py): uv resolves ``PACKAGE==VERSION`` and its
    dependencies into the env, the inherited torch excluded; reuse when the env's record matches."""
    env_dir = env_dir_for(opts, req.label)
    tid = torch_identity(opts, driver_probe, req)
    py = driver_probe.get("python") or sys.version.split()[0]
    auto_note = None
    if not req.extras:  # the extra that matches the torch's CUDA major (FA4: [cu13] for a CUDA 13 torch)
        extra = req.subject.cuda_extras.get(str(tid.get("cuda") or "").split(".")[0])
        if extra:
            req.extras = (extra,)
            auto_note = (f"torch {tid['version']} is CUDA {tid.get('cuda')}: installing {req.spec} "
                         "(write the extras yourself to choose others)")
    key = {"package": req.package, "extras": list(req.extras), "version": req.version, "torch": tid["version"],
           "torch_cuda": tid.get("cuda"), "python_tag": python_tag(py)}
    item = PlanItem(req.label, req.version, env_dir, "resolve", key, wheels.key_id(key),
                    "none (JIT)" if req.subject.jit else "none", "all")
    item.notes.append(f"{req.spec}: uv resolves it and its dependencies into the env"
                      + (" (the inherited torch excluded)" if tid["mode"] == "inherit" else "")
                      + (f"; {req.subject.note}" if req.subject.note else ""))
    if auto_note:
        item.notes.append(auto_note)
    if req.subject.jit:
        item.notes.append("kernels are compiled on each shape's first call (during set-up, never in the samples)")
    rec = load_record(env_dir)
    if rec and not opts.rebuild and rec.get("status") == "ok" and rec.get("subject_key") == key and same_torch(rec.get("torch"), tid):
        item.method = "reuse"
        return item
    if opts.offline and not opts.find_links:
        item.method = "failed"
        item.error = (f"{req.spec} is installed from wheels and --offline allows no index: pass --find-links DIR "
                      f"holding its wheels and their dependencies (`matrix-run wheelhouse --versions {req.label}={req.spec}` "
                      "on a connected machine)")
    item.estimate_s = 30
    return item


def _tree_wheel(opts: Options, key: dict) -> Path | None:
    """A wheel built from this very tree with these switches: in ``--find-links`` (carried from a
    build elsewhere, with its ``.matrix-run.json`` sidecar) or the wheel cache; matched by the whole
    key (:func:`wheels.read_sidecar`), never by name alone."""
    kid = wheels.key_id(key)
    for w in [*sorted((opts.cache_dir / "wheels" / kid).glob("*.whl")),
              *(w for d in opts.find_links if d.is_dir() for w in sorted(d.glob("flash_attn_3-*.whl")))]:
        side = wheels.read_sidecar(w)
        if side and side.get("key") == key:
            return w
    return None


def _plan_tree(req: EnvRequest, cases: list[Case], opts: Options, driver_probe: dict, n_builds_hint: int) -> PlanItem:
    """Plan of a subject built from a source tree (FA3, fa3.py): the tree's version and identity, the
    DISABLE switches the cases allow (``--build full``: none), the kernel files setup.py will compile
    for them, and where the wheel comes from (reuse, find-links, cache, or the build)."""
    env_dir = env_dir_for(opts, req.label)
    tid = torch_identity(opts, driver_probe, req)
    py = driver_probe.get("python") or sys.version.split()[0]
    item = PlanItem(req.label, "?", env_dir, "failed", {}, "", [], [])
    try:
        tree = fa3.open_tree(req.version)
    except fa3.TreeError as e:
        item.error = str(e)
        return item
    item.version = tree.version
    archs = opts.archs or gpu_archs_from_probe(driver_probe)
    nocuda = not tid.get("cuda") and tid["mode"] == "inherit"
    if archs and not nocuda and not any(a.startswith("90") for a in archs):
        item.error = (f"FlashAttention 3 runs on Hopper GPUs (sm_90) only; this run's GPU archs are "
                      f"{', '.join('sm_' + a for a in archs)}")
        return item
    try:
        disabled, notes = fa3.switches(cases)
    except ValueError as e:
        item.error = str(e)
        return item
    if opts.build == "full":
        disabled, notes = [], ["--build full: every kernel file of the tree (hours)"]
    _, unknown = fa3.build_env(disabled, tree.available_switches)
    effective = sorted(s for s in disabled if s not in unknown)  # only the switches this tree's setup.py reads
    files, missing = fa3.kernel_files(tree, effective)
    mode = "nocuda" if nocuda else ("full" if opts.build == "full" else "slim")
    key = {"package": req.package, "version": tree.version, "tree": tree.tree_id,
           "disabled": effective, "torch": tid["version"],
           "torch_cuda": tid.get("cuda"), "cxx11abi": tid.get("cxx11abi"), "python_tag": python_tag(py),
           "platform": "linux_x86_64", "archs": [] if nocuda else ["90a"]}
    item.key, item.key_id = key, wheels.key_id(key)
    item.kernels, item.archs = files, key["archs"]
    item.notes.append(f"{req.spec}: {req.subject.note}; tree {tree.tree_id} (hopper/ + CUTLASS headers, "
                      f"{len(tree.files)} files), version {tree.version}")
    item.notes.extend(notes)
    item.notes.append(f"switches: FLASH_ATTENTION_DISABLE_<X>=TRUE for X in {', '.join(key['disabled'])}"
                      if key["disabled"] else "no DISABLE switch")
    if unknown:
        item.notes.append(f"this tree's hopper/setup.py does not read DISABLE_{{{','.join(unknown)}}}: those "
                          "features are built")
    if missing:
        item.notes.append(f"{len(missing)} of the {len(files)} predicted kernel files are not in this tree's "
                          "instantiations (its setup.py follows another rule): the estimate is a guess")
    if tid["mode"] == "pinned":
        item.notes.append("torch is pinned: the key's torch CUDA version and ABI are read after torch is installed")
    rec = load_record(env_dir)
    if rec and not opts.rebuild and rec.get("status") == "ok" and rec.get("subject_key") == key \
            and same_torch(rec.get("torch"), tid):
        item.method = "reuse"
        item.wheel = (rec.get("wheel") or {}).get("file")
        return item
    found = None if opts.rebuild else _tree_wheel(opts, key)
    if found is not None:
        item.method = "cache" if (opts.cache_dir / "wheels") in found.parents else "find-links"
        item.wheel = str(found)
        return item
    item.method = f"source-{mode}"
    n_units = len(files) + 2
    item.jobs = buildmod.choose_jobs(n_builds_hint, n_units)
    if nocuda:
        item.estimate_s = 15
        item.notes.append(f"torch {tid['version']} has no CUDA: only FA3's Python part is built "
                          "(FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE), none of the kernel files above; real FA3 then "
                          "fails the import preflight (a CUDA torch compiles them for sm_90a)")
        return item
    item.estimate_s = round(fa3.estimate_seconds(files, item.jobs["max_jobs"]))
    item.notes.append(f"{mode}: {len(files)} kernel files ({', '.join(f.removesuffix('.cu') for f in files[:6])}"
                      f"{', ...' if len(files) > 6 else ''}) + flash_api + the scheduler, for sm_90a")
    sccache = compcache.find_sccache() if opts.compile_cache else None
    item.compile_cache = {"sccache": sccache,
                          "note": ("compile cache on (sccache): an identical FA3 file compiled before is a hit; "
                                   "hits are not predicted for FA3" if sccache else
                                   ("compile cache off (--no-compile-cache)" if not opts.compile_cache
                                    else compcache.NO_CACHE_NOTE))}
    return item


def _plan_env(req: EnvRequest, cases: list[Case], opts: Options, driver_probe: dict, n_builds_hint: int,
              planned_units: dict) -> PlanItem:
    if req.package != subjects.DEFAULT and req.subject.tree:
        return _plan_tree(req, cases, opts, driver_probe, n_builds_hint)
    if req.package != subjects.DEFAULT:
        return _plan_subject(req, opts, driver_probe)
    env_dir = env_dir_for(opts, req.label)
    tid = torch_identity(opts, driver_probe, req)
    py = driver_probe.get("python") or sys.version.split()[0]
    archs = opts.archs or gpu_archs_from_probe(driver_probe)
    sdist = None
    if req.is_path:
        p = Path(req.version).expanduser().resolve()
        if p.suffix == ".whl":
            item = PlanItem(req.label, local_version(p) or "local", env_dir, "local-wheel", {}, "local", "all", "all",
                            wheel=str(p))
            rec = load_record(env_dir)
            if rec and not opts.rebuild and (rec.get("wheel") or {}).get("sha256") == wheels.sha256_file(p) \
                    and same_torch(rec.get("torch"), tid) and rec.get("status") == "ok":
                item.method = "reuse"
            return item
        sdist = p
        version = local_version(p) or "local"
    else:
        version = req.version
        sdist = wheels.find_sdist(opts.find_links, version) or wheels.find_sdist([opts.cache_dir / "sdists"], version)
    mode = opts.build
    if mode == "auto":
        mode = "slim" if archs else "full"
    refuse_full = opts.build == "auto" and mode == "full" and (tid.get("cuda") or tid["mode"] == "pinned")
    if not tid.get("cuda") and tid["mode"] == "inherit" and opts.build == "auto":
        mode = "nocuda"  # a CPU-only torch: no CUDA extension can be built against it
    slim, slim_error = None, None
    if mode == "slim":
        kernels = buildmod.kernel_set(cases, buildmod.read_dispatch(sdist))
        if sdist is not None:  # the stub generator on the version's own sources, before anything is built
            try:
                slim = buildmod.slim_plan(sdist, kernels, version)
                kernels = slim.kernels if slim.kernels is not None else kernels
            except buildmod.StubError as e:
                slim_error = f"the slim build cannot be generated from {Path(sdist).name}: {e}"
    else:
        kernels = [] if mode == "nocuda" else "all"
    if mode == "nocuda":
        arch_field = []
    else:
        arch_field = sorted(archs) if (archs and mode == "slim") else (sorted(opts.archs) if opts.archs else "all")
    key = wanted_key(version, tid, py, arch_field, kernels)
    if req.is_path:  # a local (maybe patched) sdist: only wheels built from these very bytes fit
        key["sdist_sha256"] = wheels.sha256_file(sdist)
    kid = wheels.key_id(key)
    item = PlanItem(req.label, version, env_dir, "", key, kid, kernels, arch_field, sdist=str(sdist) if sdist else None)
    if mode in ("slim", "full") and not tid.get("cuda") and tid["mode"] == "inherit":
        item.notes.append(f"torch {tid.get('version')} here has no CUDA: a CUDA build of flash-attn cannot be made "
                          f"against it; this is what {'--build ' + opts.build if opts.build != 'auto' else 'the build'} "
                          "would compile where matrix-run runs on a CUDA build of torch")
    if tid["mode"] == "pinned":
        item.notes.append("torch is pinned: the key's torch CUDA version and ABI are read after torch is installed")
    # 1. find-links, 2. cache: the first wheel that fits the key
    found: wheels.WheelCandidate | None = None
    skipped: list[str] = []
    # a local sdist is built from its own bytes: --find-links wheels of the same version do not stand in
    for origin, dirs in (("find-links", [] if req.is_path else opts.find_links), ("cache", [opts.cache_dir / "wheels"])):
        for c in wheels.scan_wheels(dirs, version, key, origin=origin):
            if c.reason is None:
                found = c
                break
            skipped.append(f"skipped {c.path.name} ({origin}): {c.reason}")
        if found:
            break
    # 0. reuse the existing env when its record matches and no *different* find-links wheel is offered
    rec = load_record(env_dir)
    if rec and not opts.rebuild and _record_matches(rec, req, tid, key):
        have = (rec.get("wheel") or {}).get("sha256")
        same = found is not None and wheels.sha256_file(found.path) == have
        unverified = bool((rec.get("wheel") or {}).get("unverified"))
        if found is not None and found.origin == "find-links" and not same:
            item.notes.append(f"--find-links offers {found.path.name} with another sha256 than the env's wheel: "
                              "reinstalling")
        elif unverified and not same:
            # e.g. a stand-in or hand-made wheel: only its name said "flash_attn 2.6.3"
            item.notes.append(f"the env holds {Path(str((rec.get('wheel') or {}).get('file'))).name}, a wheel without a "
                              "matrix-run key, and this run does not offer it again: not reused")
        else:
            item.method = "reuse"
            item.wheel = rec.get("wheel", {}).get("file")
            item.wheel_unverified = unverified
            if unverified:
                item.notes.append(f"reusing an env whose wheel {Path(str(item.wheel)).name} has no matrix-run key")
            return item
    item.notes.extend(skipped)
    if found:
        item.method, item.wheel = found.origin, str(found.path)
        if not found.verified:
            item.wheel_unverified = True
            item.notes.append(f"{found.path.name} has no matrix-run key: the import preflight will check it")
        return item
    # 3. release wheel
    if not req.is_path and tid.get("cuda"):
        name = wheels.release_wheel_name(version, tid["version"], tid.get("cuda"), bool(tid.get("cxx11abi")),
                                         python_tag(py))
        item.prebuilt = name
        if name and not opts.offline:
            url = wheels.RELEASE_URL.format(version=version, wheel=name)
            ok, why = _url_exists(url)
            if ok:
                item.method, item.wheel = "prebuilt", url
                item.key = {**key, "archs": "all", "kernels": "all"}
                item.key_id = wheels.key_id(item.key)
                return item
            item.notes.append(f"release wheel {name}: {why}")
        elif opts.offline:
            item.notes.append("--offline: release wheels not tried")
    # 4. source build
    # nothing to build from comes first: --archs cannot mend it (new-user trial)
    if sdist is None and opts.offline:
        item.method = "failed"
        item.error = (f"no wheel for key {kid} and no flash_attn-{version}.tar.gz sdist in --find-links "
                      f"({', '.join(map(str, opts.find_links)) or 'none given'}) while --offline; "
                      "collect one with `matrix-run wheelhouse` on a connected machine")
        return item
    if refuse_full:
        item.method = "failed"
        item.error = ("no GPU is visible to choose the CUDA archs of a slim build, and a full build of every "
                      "kernel takes hours: pass --archs (e.g. --archs 90) for a slim build, or --build full")
        return item
    if slim_error:
        item.method, item.error = "failed", slim_error + " (--build full compiles every kernel file unchanged)"
        return item
    if slim is not None:
        item.notes.extend(slim.notes)
        if slim.kernels is not None:
            s = slim.summary()
            item.notes.append(f"slim: {s['kept_files']} kernel files kept, {s['stubbed_files']} stubbed "
                              f"({s['stub_specializations']} specializations); setup.py's -gencode archs "
                              f"{','.join(s['setup_gencode_archs']) or 'none'} replaced by {','.join(arch_field)}")
    elif mode == "slim":
        item.notes.append("the stub generator runs on the sdist once it is downloaded, before compiling")
    item.method = f"source-{mode}"
    n_units = (len(kernels) + 2) if kernels != "all" else buildmod.FULL_KERNEL_COUNT + 1
    item.jobs = buildmod.choose_jobs(n_builds_hint, n_units)
    if mode == "nocuda":
        item.estimate_s = 15
        item.notes.append(f"torch {tid['version']} has no CUDA: only flash-attn's Python part is built "
                          "(FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE); real flash-attn then fails the import preflight")
        return item
    item.compile_cache = _plan_compile_cache(item, slim, tid, py, opts, planned_units)
    _estimate(item)
    if mode == "full":
        item.notes.append("full build: every kernel file of the version (hours on few cores)")
    return item


def waits_for_cache(item: PlanItem) -> bool:
    """Whether a flash-attn 2 slim build gets every kernel file from another build of this run (it
    waits for that one, then hits the compile cache: only its own flash_api and stub units compile)."""
    cc = item.compile_cache or {}
    kernel_units = [u for u in (cc.get("keys") or {}) if u != "stubs"]
    hits = cc.get("expected_hits") or {}
    return bool(kernel_units) and all(u in hits and "this run" in hits[u] for u in kernel_units)


def share_jobs(items: list[PlanItem]) -> None:
    """Size each source build's MAX_JOBS by the builds that compile at the same time, once the whole
    run is planned (each env was planned with a share for every env of the run): a build that waits
    for another's kernel files (:func:`waits_for_cache`) takes no share (and gets jobs for its own
    two units, which it compiles after the other build). Why: on the H200 (16 cores,
    2026-12-02) 2.6.3, 2.7.0.post2 and 2.8.3 hdim128 builds got 4 jobs each for 5 compile units, so
    each compiled its slowest file (~420 s) after another one, while 2.7.0.post2's 4 jobs waited on
    2.6.3's files (benchmarks/results/h200-ops-build-12-02.txt). The estimates follow the new jobs."""
    builds = [it for it in items if it.method.startswith("source-") and it.jobs]
    waiting = [it for it in builds if waits_for_cache(it)]
    n = max(1, len(builds) - len(waiting))
    if not waiting or n == len(builds):
        return
    for it in builds:
        if it.kernels == "all" or not (it.compile_cache or {}).get("keys"):
            continue  # FA3 and full builds as planned
        # a waiting build compiles nothing until the other is done, then its own flash_api (and a
        # stub file the other did not compile): two units
        it.jobs = buildmod.choose_jobs(n, 2 if it in waiting else len(it.kernels) + 2)
        _estimate(it)


def _estimate(item: PlanItem) -> None:
    """A flash-attn 2 source build's estimate (s) from its kernel files, archs and MAX_JOBS, with the
    compile cache's expected hits (``compile_cache["estimate_cold_s"]``: without them)."""
    n_archs = len(item.archs) if item.archs != "all" else 2
    item.estimate_s = round(buildmod.estimate_seconds(item.kernels, n_archs, item.jobs["max_jobs"]))
    hits = set((item.compile_cache or {}).get("expected_hits") or {})
    if hits:
        item.compile_cache["estimate_cold_s"] = item.estimate_s
        item.estimate_s = round(buildmod.estimate_seconds(item.kernels, n_archs, item.jobs["max_jobs"], hits=hits))


def unit_context(item: PlanItem, tid: dict, py: str) -> dict:
    """What besides the sources decides a compiled object, for :func:`compcache.content_keys`: archs,
    the torch the headers come from, the Python tag (a pinned torch lives in each env: its include
    paths differ per env, so the env's label is part of the key there)."""
    ctx = {"archs": item.archs, "torch": tid.get("version"), "torch_cuda": tid.get("cuda"),
           "cxx11abi": tid.get("cxx11abi"), "python_tag": python_tag(py)}
    if tid.get("mode") == "pinned":
        ctx["env"] = item.label
    return ctx


def unit_keys(sdist: Path, slim, ctx: dict) -> dict[str, str]:
    """Content key per compile unit of a slim build (kept kernel files by stem, the stub file as
    ``"stubs"``); empty for a build with nothing to slim."""
    if slim is None or slim.kernels is None:
        return {}
    files = {buildmod.stubgen.stem(f): f for f in slim.keep}
    extra = {"stubs": slim.stubs.text} if slim.stubs is not None else {}
    return compcache.content_keys(Path(sdist), files, extra, ctx)


def _plan_compile_cache(item: PlanItem, slim, tid: dict, py: str, opts: Options, planned: dict) -> dict:
    """The compile-cache part of a source build's plan: whether there is one, the content keys of
    its units and those expected as hits (compiled by an earlier build: the ledger; or by an env
    planned before this one in the same run, whose build this one then waits for)."""
    if not opts.compile_cache:
        return {"sccache": None, "note": "compile cache off (--no-compile-cache)"}
    sccache = compcache.find_sccache()
    if not sccache:
        return {"sccache": None, "note": compcache.NO_CACHE_NOTE}
    out = {"sccache": sccache, "dir": str(compcache.cache_dir(opts.cache_dir)), "keys": {}, "expected_hits": {}}
    if item.method == "source-full" or not item.sdist:
        out["note"] = "compile cache on; hits are not predicted for this build (full build or sdist not yet downloaded)"
        return out
    try:
        keys = unit_keys(Path(item.sdist), slim, unit_context(item, tid, py))
    except (OSError, tarfile.TarError) as e:
        out["note"] = f"compile cache on; hits not predicted ({e})"
        return out
    out["keys"], out["context"] = keys, unit_context(item, tid, py)
    hits = {u: f"{e['version']} (earlier build)" for u, e in compcache.expected_hits(opts.cache_dir, keys).items()}
    for u, k in keys.items():
        if u not in hits and k in planned:
            hits[u] = f"env {planned[k]} (this run; one build waits for the other)"
    for k in keys.values():
        planned.setdefault(k, item.label)
    out["expected_hits"] = hits
    by_src: dict[str, list[str]] = {}
    for u, src in sorted(hits.items()):
        by_src.setdefault(src, []).append(u)
    out["note"] = (f"compile cache: {len(hits)} of {len(keys)} kernel and stub units expected from the cache (flash_api.cpp: every build compiles its own)"
                   + "".join(f"; {', '.join(us)} from {src}" for src, us in by_src.items()))
    return out


def _url_exists(url: str, timeout: float = 15.0) -> tuple[bool, str]:
    try:
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status == 200, f"HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return False, f"not published (HTTP {e.code})"
    except Exception as e:  # noqa: BLE001
        return False, f"unreachable ({type(e).__name__}: {getattr(e, 'reason', e)})"


def _record_matches(rec: dict, req: EnvRequest, tid: dict, key: dict) -> bool:
    if rec.get("schema") != RECORD_SCHEMA or rec.get("requested") != req.version:
        return False
    if not same_torch(rec.get("torch"), tid):
        return False
    have = (rec.get("wheel") or {}).get("key")
    if tid.get("mode") == "pinned" and have:
        # the plan's key cannot know a pinned torch's local version, CUDA and ABI (read after the
        # install, kept in the record): the recorded ones stand in where the release is the one asked
        t = rec.get("torch") or {}
        if wheels.same_version(str(have.get("torch")), str(tid.get("version"))):
            key = {**key, "torch": have.get("torch"), "torch_cuda": t.get("cuda"), "cxx11abi": t.get("cxx11abi")}
    if have == {} and req.is_path:
        return rec.get("status") == "ok"
    return bool(have) and wheels.compatible(have, key) is None and rec.get("status") == "ok"
