"""Stage 2 — the env builder: one isolated uv venv per flash-attn version, with an identity record.

For each ``LABEL=VERSION`` the builder

1. *plans* (:func:`plan_env`): the wheel key for this env's torch/python/GPU, and where the wheel
   comes from (reuse of an existing env, ``--find-links``, the wheel cache, the release wheel, a
   slim or full source build) — printed before anything is built;
2. *prepares* (:func:`prepare_env`): reuses ``envs/LABEL`` when its record
   (``matrix-run-env.json``) matches, else creates it with ``uv venv``, makes the torch visible
   (``--torch inherit``: a ``.pth`` listing the driver interpreter's site dirs, so the env sees the
   same torch while its own packages win; ``--torch X.Y.Z``: ``uv pip install torch==X.Y.Z``),
   obtains the wheel, installs it with ``uv pip install --no-deps``, and
3. *preflights* in two steps: right after the install, a check that needs no torch import
   (~0.05 s: ``importlib`` finds flash_attn and its CUDA extension inside the env, with the requested
   version); then the first worker process of the env, which imports torch and flash_attn anyway,
   reports its probe and the runner applies the full check (:func:`check_probe`: imported from inside
   the env, the requested version, the extension loads) before anything is timed. A failure there
   fails the env, not the run, and marks the record so the next run rebuilds it. (Importing torch
   only for a separate preflight process cost ~1.7 s per env on the 2-core CI machine.)

Env records follow asv's idea of an environment identity: reuse only what provably matches.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout
from packaging.version import InvalidVersion, Version

from . import build as buildmod
from . import compcache, fa3, machine, subjects
from . import wheels
from .config import Case
from .errors import StageFailed, UsageError
from .lockstep import WORKER
from .proc import Stopped, capture, run_logged, stopping
from .worker import PROBE_SCHEMA

RECORD = "matrix-run-env.json"
RECORD_SCHEMA = "matrix-runner/env/1"
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
#: Installed with a pinned torch; a source build needs the first three (flash-attn's setup.py imports
#: them), ninja makes torch's extension build parallel, psutil is imported only without MAX_JOBS.
BUILD_DEPS = ("setuptools", "wheel", "packaging", "ninja", "psutil")


class EnvError(StageFailed):
    """Preparing one env failed; ``tail`` holds the relevant log lines (the other envs go on)."""

    def __init__(self, msg: str, tail: str = "", log: str | None = None):
        super().__init__(msg)
        self.tail = tail
        self.log = log


@dataclass
class EnvRequest:
    label: str
    version: str  # PEP 440 version, or a local path to an sdist/wheel/dir
    package: str = subjects.DEFAULT  # the subject's distribution (subjects.py)
    extras: tuple[str, ...] = ()  # its extras as written (flash-attn-4[cu13]); () = the subject's default
    #: this env's torch (``inherit`` or X.Y.Z) where ``--torch`` lists several (:func:`cross_torch`);
    #: None: ``Options.torch``
    torch: str | None = None
    #: the ``--versions`` label this env was crossed from (None: not crossed)
    group: str | None = None

    @property
    def axis(self) -> dict | None:
        """``{version, torch}``: where this env sits in a version x torch matrix (None: no torch axis)."""
        return {"version": self.group, "torch": self.torch} if self.group is not None else None

    @property
    def is_path(self) -> bool:
        return "/" in self.version or self.version.endswith((".whl", ".tar.gz"))

    @property
    def subject(self) -> "subjects.Subject":
        return subjects.get(self.package)

    @property
    def spec(self) -> str:
        """What was asked for, as a requirement where it is one (``flash-attn-4==4.0.0b36``,
        ``flash-attn-3@/path/to/flash-attention``)."""
        if self.package == subjects.DEFAULT:
            return self.version
        if self.subject.tree:
            return f"{self.package}@{self.version}"
        return f"{self.package}{'[' + ','.join(self.extras) + ']' if self.extras else ''}=={self.version}"


def parse_versions(text: str) -> list[EnvRequest]:
    """Parse ``--versions``: comma list of ``VERSION`` or ``LABEL=VERSION`` (A/A runs use two labels),
    or ``[LABEL=]PACKAGE==VERSION`` for a subject (``fa4=flash-attn-4==4.0.0b36``; subjects.py).

    A version is a PEP 440 version (normalized: ``2.7.0-post2`` becomes ``2.7.0.post2``), ``here``
    (``--backend here``), or the path of an existing flash-attn sdist (``.tar.gz``) or wheel
    (``.whl``) file. Raises UsageError for an empty list, a label that is not ``[A-Za-z0-9._+-]``
    (it names the env directory), a version that is none of these (``2.6.3;rm -rf ~``), control
    characters, or a duplicate label."""
    out: list[EnvRequest] = []
    if text and any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise UsageError(f"--versions {text!r}: control characters are not allowed")
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    if not items:
        raise UsageError("--versions: give at least one flash-attn version, e.g. --versions 2.6.3,2.7.0.post2")
    for it in items:
        package = subjects.DEFAULT
        tree = _tree_item(it)
        if tree is not None:  # [LABEL=]flash-attn-3@PATH (fa3.py)
            label, package, path = tree
            if any(r.label == label for r in out):
                raise UsageError(f"--versions: label {label!r} appears twice; name each FA3 tree, e.g. "
                                 "fa3a=flash-attn-3@DIR1,fa3b=flash-attn-3@DIR2")
            if not LABEL_RE.match(label) or label in (".", ".."):
                raise UsageError(f"--versions: label {label!r} may only use letters, digits and . _ + -, must start "
                                 "with a letter or digit and have at most 64 characters (it names the env directory)")
            out.append(EnvRequest(label, path, package))
            continue
        if "==" in it:  # [LABEL=]PACKAGE==VERSION (subjects.py)
            left, _, ver = it.partition("==")
            label, _, pkg = left.rpartition("=")
            extras: tuple[str, ...] = ()
            m = re.fullmatch(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([A-Za-z0-9._,\s-]*)\])?\s*", pkg)
            if m:
                pkg = m.group(1)
                extras = tuple(sorted(x.strip() for x in (m.group(2) or "").split(",") if x.strip()))
            try:
                package = subjects.get(pkg).package
            except KeyError as e:
                raise UsageError(f"--versions: {it!r}: {e.args[0]}; write [LABEL=]PACKAGE==VERSION, e.g. "
                                 "fa4=flash-attn-4==4.0.0b36") from None
            ver = ver.strip()
            if not ver or any(c in ver for c in "<>=!~*, ;"):
                raise UsageError(f"--versions: {it!r}: give one exact version after == (like 4.0.0b36)")
            try:
                ver = str(Version(ver))
            except InvalidVersion:
                raise UsageError(f"--versions: {it!r}: {ver!r} is not a PEP 440 version") from None
            label = label.strip() or (ver if package == subjects.DEFAULT else f"{package}-{ver}")
            if any(r.label == label for r in out):
                raise UsageError(f"--versions: label {label!r} appears twice; use LABEL=PACKAGE==VERSION to name each env")
            if not LABEL_RE.match(label) or label in (".", ".."):
                raise UsageError(f"--versions: label {label!r} may only use letters, digits and . _ + -, must start "
                                 "with a letter or digit and have at most 64 characters (it names the env directory)")
            if extras and package == subjects.DEFAULT:
                raise UsageError(f"--versions: {it!r}: flash-attn takes no extras here")
            out.append(EnvRequest(label, ver, package, extras))
            continue
        label, _, ver = it.partition("=") if "=" in it else (it, "", it)
        label, ver = label.strip(), ver.strip()
        if not ver:
            raise UsageError(f"--versions: {it!r} names no version (LABEL=VERSION)")
        if ver == "here":
            pass
        elif "/" in ver or ver.endswith((".whl", ".tar.gz")):
            p = Path(ver).expanduser()
            if not p.exists():
                raise UsageError(f"--versions: {ver!r} looks like a path but does not exist")
            if not p.is_file() or not p.name.endswith((".whl", ".tar.gz")):
                raise UsageError(f"--versions: {ver!r} is not a flash-attn sdist (.tar.gz) or wheel (.whl) file"
                                 + (" (for FlashAttention 3 from a checkout or archive of the repository write "
                                    f"{label if '=' in it else 'fa3'}=flash-attn-3@{ver})" if p.is_dir() or '.' in p.name else ""))
            if "=" not in it:
                label = local_version(p) or p.name.removesuffix(".tar.gz").removesuffix(".whl")
        else:
            try:
                ver = str(Version(ver))
            except InvalidVersion:
                raise UsageError(f"--versions: {ver!r} is not a PEP 440 version (like 2.6.3 or 2.7.0.post2) "
                                 "nor a path to a flash-attn sdist or wheel") from None
        if not LABEL_RE.match(label) or label in (".", ".."):
            raise UsageError(f"--versions: label {label!r} may only use letters, digits and . _ + -, must start "
                             "with a letter or digit and have at most 64 characters (it names the env directory)")
        if any(r.label == label for r in out):
            raise UsageError(f"--versions: label {label!r} appears twice; use LABEL=VERSION to name each env "
                             "(e.g. a=2.6.3,b=2.6.3 for an A/A run)")
        out.append(EnvRequest(label, ver))
    return out


def _tree_item(it: str) -> tuple[str, str, str] | None:
    """``(label, package, absolute path)`` of a ``[LABEL=]PACKAGE@PATH`` item whose package is built
    from a source tree (FA3, subjects.py); None for any other item. UsageError when PATH is not an
    FA3 source tree (fa3.open_tree says what is missing)."""
    left, at, path = it.partition("@")
    if not at:
        return None
    label, _, pkg = left.rpartition("=")
    try:
        sub = subjects.get(pkg)
    except KeyError:
        return None
    if not sub.tree:
        raise UsageError(f"--versions: {it!r}: {sub.package} is not built from a source tree; write "
                         f"{sub.package}==VERSION")
    path = path.strip()
    if not path:
        raise UsageError(f"--versions: {it!r}: give the path of a flash-attention checkout or archive after @")
    try:
        tree = fa3.open_tree(path)
    except fa3.TreeError as e:
        raise UsageError(f"--versions: {it!r}: {e}") from None
    return (label.strip() or "fa3"), sub.package, str(tree.path)


def _version_here(version: str, opts: "Options") -> bool:
    """Whether ``version`` can be had without an index: a wheel or sdist of it in --find-links or the
    wheel cache, or an env whose record asked for it."""
    dirs = [*opts.find_links, opts.cache_dir / "wheels", opts.cache_dir / "sdists"]
    have = wheels.wheel_versions(opts.find_links, "flash_attn") | wheels.wheel_versions(
        [opts.cache_dir / "wheels", opts.cache_dir / "sdists"], "flash_attn", recursive=True)
    if any(wheels.same_version(v, version) for v in have):
        return True
    if wheels.find_sdist(dirs, version):
        return True
    if opts.envs_dir.is_dir():
        for d in opts.envs_dir.iterdir():
            rec = load_record(d) if d.is_dir() else None
            if rec and rec.get("requested") == version and rec.get("status") == "ok":
                return True
    return False


def parse_torches(text: str | None) -> list[str]:
    """Parse ``--torch``: a comma list of ``inherit`` (the torch of the interpreter running matrix-run)
    and torch versions (``2.5.1``); one value gives every env that torch, several make a torch axis
    (:func:`cross_torch`). Raises UsageError for an empty item, a value that is neither, or a duplicate."""
    from packaging.version import InvalidVersion, Version

    items = [x.strip() for x in (text or "inherit").split(",")]
    out: list[str] = []
    for it in items:
        if it != "inherit":
            try:
                v = Version(it)
            except InvalidVersion:
                raise UsageError(f"--torch {text!r}: {it!r} is neither inherit nor a torch version like 2.5.1 "
                                 "(give a comma list, e.g. --torch inherit,2.5.1)") from None
            if v.local or any(c in it for c in "<>=!~* ;"):
                raise UsageError(f"--torch {text!r}: {it!r}: give a plain release like 2.5.1 "
                                 "(a CUDA variant comes from --torch-index)")
            it = str(v)
        if it in out:
            raise UsageError(f"--torch {text!r}: {it} appears twice")
        out.append(it)
    return out


def cross_torch(reqs: list[EnvRequest], torches: list[str]) -> list[EnvRequest]:
    """The envs of a version x torch matrix: with one torch, ``reqs`` unchanged (that torch is the
    run's ``Options.torch``); with several, one env per (request, torch), version-major, labelled
    ``LABEL+torchX.Y.Z`` (``LABEL+torch-inherit``), each remembering its ``group`` (the version's
    label) and ``torch``. The first version under the first torch is the baseline of the matrix
    (stats.comparison_pairs: versions are compared within one torch, torches within one version).
    Raises UsageError for a label too long for an env directory."""
    if len(torches) <= 1:
        return reqs
    out = []
    for r in reqs:
        for t in torches:
            label = f"{r.label}+torch{'-inherit' if t == 'inherit' else t}"
            if not LABEL_RE.match(label):
                raise UsageError(f"--versions/--torch: env label {label!r} is too long (at most 64 characters); "
                                 "give the version a shorter label (LABEL=VERSION)")
            out.append(EnvRequest(label, r.version, r.package, r.extras, torch=t, group=r.label))
    return out


def check_versions(reqs: list[EnvRequest], opts: "Options", timeout: float = 15.0) -> list[str]:
    """Check, before anything is built, that every requested PEP 440 version exists.

    A version found in --find-links, the wheel cache or an existing env needs no index. Otherwise,
    unless --offline, the index (``opts.index_url``, PEP 691 JSON) is asked once: a version it does
    not list raises UsageError naming the nearest ones. An index that cannot be asked (unreachable,
    not PEP 691, no flash-attn page) gives a warning and the run goes on. Returns the warnings.
    ``here`` is only valid with --backend here (this function is for the uv backend)."""
    for r in reqs:
        if r.version == "here":
            raise UsageError(f"--versions: {r.label}=here means the interpreter running matrix-run; "
                             "use it with --backend here")
    if opts.offline:
        return []
    warnings = _check_torch_pins(opts, timeout)
    want = [r for r in reqs if not r.is_path and r.package == subjects.DEFAULT]  # uv checks other subjects
    missing = [r for r in want if not _version_here(r.version, opts)]
    if not missing:
        return warnings
    try:
        files = wheels.index_versions(opts.index_url, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - an index we cannot ask must not stop an otherwise good run
        why = getattr(e, "reason", None) or e
        return warnings + [f"could not check that flash-attn {', '.join(r.version for r in missing)} exist(s) on "
                           f"{opts.index_url} ({type(e).__name__}: {why}); going on"]
    for r in missing:
        if not any(wheels.same_version(v, r.version) for v in files):
            near = wheels.nearest_versions(r.version, list(files))
            raise UsageError(f"--versions: flash-attn {r.version} is not on {opts.index_url}; nearest: "
                             f"{', '.join(near) if near else '(the index lists no flash-attn sdist)'}")
    return warnings


def _check_torch_pins(opts: Options, timeout: float) -> list[str]:
    """Every pinned ``--torch X.Y.Z`` must exist on the index it is installed from (``--torch-index``,
    else ``--index-url``), asked once before anything is built: UsageError naming the nearest
    releases when it is not listed; a warning when the index cannot be asked. A pin an env already
    holds, or one offered as a wheel in --find-links, needs no index. Returns the warnings."""
    pins = [t for t in opts.torches if t != "inherit"]
    have = wheels.wheel_versions(opts.find_links, "torch")  # a torch wheel offered with --find-links needs no index
    if opts.envs_dir.is_dir():
        have |= {((load_record(d) or {}).get("torch") or {}).get("version") for d in opts.envs_dir.iterdir() if d.is_dir()}
    pins = [t for t in pins if not any(h and wheels.same_version(str(h), t) for h in have)]
    if not pins:
        return []
    index = opts.torch_index or opts.index_url
    try:
        listed = wheels.project_versions("torch", index, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - an index we cannot ask must not stop an otherwise good run
        why = getattr(e, "reason", None) or e
        return [f"could not check that torch {', '.join(pins)} exist(s) on {index} ({type(e).__name__}: {why}); going on"]
    for t in pins:
        if not any(wheels.same_version(v, t) for v in listed):
            near = wheels.nearest_versions(t, sorted(listed))
            raise UsageError(f"--torch {t}: torch {t} is not on {index}; nearest: {', '.join(near)}"
                             + ("" if opts.torch_index else " (a CUDA build comes from --torch-index, e.g. "
                                "https://download.pytorch.org/whl/cu130)"))
    return []


def find_uv() -> str:
    """Path of the uv binary: ``$MATRIX_RUN_UV``, the ``uv`` package's binary, or ``uv`` on PATH."""
    if os.environ.get("MATRIX_RUN_UV"):
        return os.environ["MATRIX_RUN_UV"]
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except Exception:  # noqa: BLE001
        pass
    p = shutil.which("uv")
    if not p:
        raise EnvError("uv not found: pip install uv (or set MATRIX_RUN_UV to its path)")
    return p


def driver_site_dirs() -> list[str]:
    """Site dirs of the interpreter running matrix-run, in ``sys.path`` order (venv, conda or system)."""
    out = []
    for p in sys.path:
        if p and os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages") and os.path.isdir(p):
            if p not in out:
                out.append(p)
    return out


def probe(python: str | Path, timeout: float = 120.0) -> dict:
    """Run the worker's probe with ``python``; returns its JSON (``error`` set on failure)."""
    try:
        cp = capture([str(python), str(WORKER), "probe"], timeout=timeout)
    except Exception as e:  # noqa: BLE001
        return {"error": f"probe could not run: {e}", "torch": None, "flash_attn": None}
    for line in reversed(cp.stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {"error": f"probe failed (exit {cp.returncode}): {(cp.stderr or cp.stdout).strip()[-800:]}",
            "torch": None, "flash_attn": None}


def local_version(p: Path) -> str | None:
    """The flash-attn version in a local sdist's or wheel's file name (None if it is not flash_attn's)."""
    from packaging.utils import parse_sdist_filename, parse_wheel_filename

    try:
        name, ver = (parse_wheel_filename(p.name)[:2] if p.name.endswith(".whl") else parse_sdist_filename(p.name))
    except Exception:  # noqa: BLE001
        return None
    return str(ver) if name == "flash-attn" else None


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


def env_python(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def load_record(env_dir: Path) -> dict | None:
    try:
        return json.loads((env_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None


def _atomic_json(path: Path, data: dict) -> None:
    """Write an env record atomically (the same temp-file, fsync and rename as results.json)."""
    from .results import write_json

    write_json(path, data)


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


def install_subject(py: Path, req: EnvRequest, tid: dict, opts: Options, log: Path, dry_run: bool = False) -> None:
    """``uv pip install PACKAGE==VERSION`` into the env with its dependencies (--find-links first,
    then the index unless --offline); with an inherited torch, ``torch`` is excluded from the
    resolution (``--excludes``) so the env keeps seeing the driver's. Raises EnvError."""
    args = ["pip", "install", "--python", str(py), req.spec]
    if tid["mode"] == "inherit":
        ex = Path(log).with_name(f"{req.label}.excludes.txt")
        ex.write_text("torch\n")
        args += ["--excludes", str(ex)]
    for d in opts.find_links:
        args += ["--find-links", str(d)]
    if opts.offline:
        args += ["--no-index"]
    elif opts.index_url != wheels.DEFAULT_INDEX:
        args += ["--index-url", opts.index_url]
    if dry_run:
        args += ["--dry-run"]
    _uv(args, log, offline=opts.offline)


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
    if refuse_full:
        item.method = "failed"
        item.error = ("no GPU is visible to choose the CUDA archs of a slim build, and a full build of every "
                      "kernel takes hours: pass --archs (e.g. --archs 90) for a slim build, or --build full")
        return item
    if sdist is None and opts.offline:
        item.method = "failed"
        item.error = (f"no wheel for key {kid} and no flash_attn-{version}.tar.gz sdist in --find-links "
                      f"({', '.join(map(str, opts.find_links)) or 'none given'}) while --offline; "
                      "collect one with `matrix-run wheelhouse` on a connected machine")
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
    n_archs = len(arch_field) if arch_field != "all" else 2
    item.estimate_s = round(buildmod.estimate_seconds(kernels, n_archs, item.jobs["max_jobs"]))
    item.compile_cache = _plan_compile_cache(item, slim, tid, py, opts, planned_units)
    hits = set((item.compile_cache or {}).get("expected_hits") or {})
    if hits:
        item.compile_cache["estimate_cold_s"] = item.estimate_s
        item.estimate_s = round(buildmod.estimate_seconds(kernels, n_archs, item.jobs["max_jobs"], hits=hits))
    if mode == "full":
        item.notes.append("full build: every kernel file of the version (hours on few cores)")
    return item


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
    out["note"] = (f"compile cache: {len(hits)} of {len(keys)} compile units expected from the cache"
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


def _uv(args: list[str], log: Path, timeout: float = 1800, offline: bool = False) -> None:
    extra = {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1"}
    if offline:
        extra["UV_OFFLINE"] = "1"
    r = run_logged([find_uv(), *args], env_extra=extra, log=log, timeout=timeout)
    if r.returncode != 0:
        raise EnvError(f"uv {args[0]} {args[1] if len(args) > 1 else ''} failed (exit {r.returncode}); log: {log}",
                       r.tail, str(log))


def create_venv(env_dir: Path, python: str, tid: dict, opts: Options, log: Path) -> Path:
    """(Re)create ``env_dir`` with uv and make torch visible in it; returns the env's python.

    Raises EnvError when ``env_dir`` exists but is not an env matrix-run made (it is never deleted)."""
    if env_dir.exists():
        if not is_matrix_run_env(env_dir):
            raise EnvError(f"{env_dir} exists and is not a matrix-run env (no {RECORD} or pyvenv.cfg): "
                           "left untouched; move it or use another --envs-dir")
        shutil.rmtree(env_dir)
    _uv(["venv", "--no-project", "--quiet", "--python", python, str(env_dir)], log)
    py = env_python(env_dir)
    if tid["mode"] == "inherit":
        cp = capture([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        site = Path(cp.stdout.strip())
        # path lines are appended after the env's own site-packages: the env's packages win
        (site / "_matrix_run_inherit.pth").write_text("\n".join(tid["site_dirs"]) + "\n")
    else:
        # numpy: torch warns at import without it, and the inherited torch of another env usually has it
        args = ["pip", "install", "--python", str(py), f"torch=={tid['version']}", *BUILD_DEPS, "einops", "numpy"]
        if tid.get("index"):
            args += ["--index-url", tid["index"], "--extra-index-url", opts.index_url]
        for d in opts.find_links:
            args += ["--find-links", str(d)]
        _uv(args, log, offline=opts.offline)
    return py


def install_wheel(py: Path, wheel: Path, opts: Options, log: Path) -> None:
    _uv(["pip", "install", "--python", str(py), "--no-deps", "--reinstall", "--no-index", str(wheel)], log,
        offline=True)


def fingerprint(env_dir: Path) -> str | None:
    """sha256 over (path, size, mtime) of what decides what the env imports: pyvenv.cfg, the
    interpreter link, every ``.pth`` and the flash_attn package, dist-info and extension files.
    Returns None when the env has no site-packages (then the import preflight must run)."""
    import hashlib

    sites = list(env_dir.glob("lib/python*/site-packages"))
    if not sites:
        return None
    site = sites[0]
    files = [env_dir / "pyvenv.cfg", env_python(env_dir)]
    files += sorted(site.glob("*.pth"))
    files += sorted(site.glob("flash_attn_2_cuda*")) + sorted(site.glob("flash_attn-*.dist-info/*"))
    files += sorted((site / "flash_attn").rglob("*.py")) if (site / "flash_attn").is_dir() else []
    h = hashlib.sha256()
    for f in files:
        try:
            st = f.stat()
        except OSError:
            h.update(f"{f}:missing".encode())
            continue
        h.update(f"{f.relative_to(env_dir) if env_dir in f.parents else f}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


STATIC_PROBE = r"""
import importlib.metadata, importlib.util, json, sys
mod, dist, extname = (sys.argv[1:4] + [None, None, None])[:3] if len(sys.argv) > 1 else ("flash_attn", "flash_attn", "flash_attn_2_cuda")
out = {"python": sys.version.split()[0], "executable": sys.executable, "prefix": sys.prefix, "error": None}
try:
    fa = importlib.util.find_spec(mod)
    ext = importlib.util.find_spec(extname) if extname else None
    out["flash_attn"] = {"version": importlib.metadata.version(dist) if fa else None,
                         "file": fa.origin if fa else None, "ext_file": ext.origin if ext else None}
    if dist != "flash_attn":
        out["flash_attn"]["subject"] = dist
    if fa is None:
        out["error"] = f"{mod} is not installed in this env"
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def check_probe(p: dict, env_dir: Path | str, version: str | None) -> str | None:
    """The preflight rule, applied to a probe (the worker's, or :data:`STATIC_PROBE`'s): flash_attn
    and its extension ``flash_attn_2_cuda`` come from inside ``env_dir`` and flash_attn has the
    requested ``version`` (None or "local": any). Returns what is wrong, or None."""
    if p.get("error"):
        return str(p["error"])
    fa = p.get("flash_attn") or {}
    root = Path(env_dir).resolve()
    if fa.get("subject") not in (None, "flash_attn", subjects.DEFAULT):  # another subject (subjects.py)
        if not Path(fa.get("file") or "/").resolve().is_relative_to(root):
            return f"{fa['subject']} was imported from {fa.get('file')}, not from the env {root}"
        ext = subjects.SUBJECTS.get(fa["subject"], None)
        ext = ext.ext if ext else None
        if ext and not fa.get("ext_file"):
            return (f"{fa['subject']}'s compiled extension {ext} is not installed in the env: it was built without "
                    "CUDA (against a CPU-only torch), so its kernels cannot run; use an interpreter whose torch has "
                    "CUDA, on a machine with a GPU it supports")
        if ext and not Path(fa["ext_file"]).resolve().is_relative_to(root):
            return f"{ext} was imported from {fa['ext_file']}, not from the env {root}"
        if version not in (None, "local") and not wheels.same_version(str(fa.get("version")), version):
            return f"the env has {fa['subject']} {fa.get('version')}, not the requested {version}"
        return None
    if not Path(fa.get("file") or "/").resolve().is_relative_to(root):
        return f"flash_attn was imported from {fa.get('file')}, not from the env {root}"
    if not fa.get("ext_file"):
        return ("flash_attn's compiled extension flash_attn_2_cuda is not installed in the env: flash-attn was "
                "built without CUDA (against a CPU-only torch, or with FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE), so its "
                "kernels cannot run; use an interpreter whose torch has CUDA, on a machine with an NVIDIA GPU")
    if not Path(fa["ext_file"]).resolve().is_relative_to(root):
        return f"flash_attn_2_cuda was imported from {fa.get('ext_file')}, not from the env"
    if version not in (None, "local") and not wheels.same_version(str(fa.get("version")), version):
        return f"the env imports flash_attn {fa.get('version')}, not the requested {version}"
    return None


def preflight(py: Path, env_dir: Path, req: EnvRequest, version: str) -> dict:
    """Full preflight: run the worker's probe in the env (imports torch and flash_attn, ~2 s) and
    apply :func:`check_probe`. Returns the probe; raises EnvError otherwise."""
    p = probe(py)
    err = check_probe(p, env_dir, version)
    if err:
        raise EnvError(f"preflight: {err}")
    return p


def static_preflight(py: Path, env_dir: Path, version: str, torch_info: dict | None,
                     subject: "subjects.Subject | None" = None) -> dict:
    """Preflight without importing torch (:data:`STATIC_PROBE`, ~0.05 s): finds flash_attn and its
    extension inside the env with the requested version. Returns a probe-shaped dict (``torch``:
    ``torch_info``, the torch the env was made with) with ``import_checked`` False: the import itself
    is checked by the env's first worker (module doc). Raises EnvError when the check fails."""
    try:
        argv = [str(py), "-c", STATIC_PROBE]
        if subject is not None and subject.package != subjects.DEFAULT:
            argv += [subject.module, subject.package, *([subject.ext] if subject.ext else [])]
        cp = capture(argv, timeout=60)
        p = json.loads(cp.stdout.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001
        raise EnvError(f"preflight: the env's python could not run ({type(e).__name__}: {e})") from None
    err = check_probe(p, env_dir, version)
    if err:
        raise EnvError(f"preflight: {err}")
    return {"schema": PROBE_SCHEMA, **p, "torch": torch_info, "import_checked": False}


def record_import_check(env_dir: Path | str, p: dict, error: str | None) -> None:
    """Store the outcome of the full import check made by the env's first worker (probe ``p``) in
    the env record: on success the probe and a fresh fingerprint; on failure the error, and no
    fingerprint, so the next run re-checks and rebuilds the env. A missing record is left alone."""
    env_dir = Path(env_dir)
    rec = load_record(env_dir)
    if rec is None:
        return
    if error:
        rec.update({"fingerprint": None, "status": "import-failed", "import_error": error})
    else:
        rec.update({"probe": {**p, "import_checked": True}, "fingerprint": fingerprint(env_dir),
                    "import_error": None})
    _atomic_json(env_dir / RECORD, rec)


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
            res.build.update(_prepare_locked(req, item, opts, driver_probe, progress, log, res, cases))
        res.status = "ok"
        if not res.build.get("wheel_sha256"):  # a reused env: the record says which wheel it holds
            res.build["wheel_sha256"] = ((load_record(item.env_dir) or {}).get("wheel") or {}).get("sha256")
    except (EnvError, buildmod.BuildError, wheels.urllib.error.URLError, LookupError, OSError, Stopped) as e:
        res.status = "failed"
        res.error = str(e)
        res.error_tail = getattr(e, "tail", "") or None
        if stopping():  # a step cut short by Ctrl-C fails in its own words (e.g. "no setuptools"): say what happened
            res.error, res.error_tail = f"interrupted while {step['now']}", None
    res.build["seconds"] = round(time.monotonic() - t0, 2)
    return res


def _prepare_locked(req, item, opts, driver_probe, progress, log, res, cases) -> dict:
    env_dir = item.env_dir
    tid = torch_identity(opts, driver_probe, req)
    info: dict = {}
    if item.method == "reuse":
        progress(req.label, "checking the existing env")
        try:
            rec = load_record(env_dir) or {}
            fp = fingerprint(env_dir)
            if fp and rec.get("fingerprint") == fp and rec.get("probe"):
                # nothing in the env changed since its preflight passed: skip the ~2 s re-import
                # (the worker probes again, and checks the import if it was never checked)
                res.probe = rec["probe"]
                res.import_checked = bool(rec["probe"].get("import_checked", True))
                res.python = str(env_python(env_dir))
                return {"reused": True, "preflight": "fingerprint unchanged"}
            res.probe = preflight(env_python(env_dir), env_dir, req, item.version)
            res.python = str(env_python(env_dir))
            _atomic_json(env_dir / RECORD, {**rec, "fingerprint": fingerprint(env_dir), "probe": res.probe,
                                            "status": "ok", "import_error": None})
            return {"reused": True, "preflight": "import checked"}
        except EnvError as e:
            progress(req.label, f"existing env is broken ({e}); rebuilding")
            info["rebuilt_because"] = str(e)
            item = plan_env(req, cases, replace(opts, rebuild=True), driver_probe)
            if item.method == "failed":
                raise EnvError(item.error or "no way to rebuild this env") from None
    progress(req.label, "creating venv (uv)")
    py = create_venv(env_dir, driver_probe.get("executable") or sys.executable, tid, opts, log)
    res.python = str(py)
    if req.package != subjects.DEFAULT and req.subject.tree:
        return _prepare_tree(req, item, opts, py, tid, driver_probe, progress, log, res)
    if req.package != subjects.DEFAULT:
        return _prepare_subject(req, item, opts, py, tid, driver_probe, progress, log, res)
    key = item.key
    tp: dict = {}
    if tid["mode"] == "pinned":
        tp = probe(py).get("torch") or {}
        tid = {**tid, "cuda": tp.get("cuda"), "cxx11abi": tp.get("cxx11abi")}
        key = {**key, "torch_cuda": tp.get("cuda"), "cxx11abi": tp.get("cxx11abi"), "torch": tp.get("version", tid["version"])}
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
        wheel = _build_into_cache(req, item, key, opts, py, progress, log, info)
    progress(req.label, f"installing {wheel.name}")
    install_wheel(py, wheel, opts, log)
    sha = wheels.sha256_file(wheel)
    progress(req.label, "preflight: finding flash_attn in the env")
    res.probe = static_preflight(py, env_dir, item.version,
                                 driver_probe.get("torch") if tid["mode"] == "inherit" else (tp or None))
    res.import_checked = False
    record = {"schema": RECORD_SCHEMA, "label": req.label, "requested": req.version, "torch": tid,
              "fingerprint": fingerprint(env_dir), "probe": res.probe,
              "python": res.probe.get("python"), "status": "ok",
              "wheel": {"file": str(wheel), "sha256": sha, "key": key if item.method != "local-wheel" else {},
                        "origin": item.method, "unverified": item.wheel_unverified},
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "build": info}
    _atomic_json(env_dir / RECORD, record)
    return {"wheel": str(wheel), "wheel_sha256": sha, **info}


def _prepare_subject(req, item, opts, py, tid, driver_probe, progress, log, res) -> dict:
    """Install a subject other than flash-attn (:func:`install_subject`), write the worker's subject
    marker and the env record, and run the static preflight on the subject's module."""
    progress(req.label, f"installing {req.spec} with uv")
    t0 = time.monotonic()
    install_subject(py, req, tid, opts, log)
    info = {"method": "resolve", "subject": req.package, "seconds": round(time.monotonic() - t0, 1)}
    _finish_subject_env(req, item, py, tid, driver_probe, progress, res, req.version, {"build": info})
    return info


def _finish_subject_env(req, item, py, tid, driver_probe, progress, res, version: str, extra: dict) -> None:
    """The end of a subject's env (FA4 and FA3 alike): the worker's subject marker, the static
    preflight on the subject's module (into ``res``), the env record (``extra`` on top: ``build``,
    and ``wheel`` for an installed wheel)."""
    _atomic_json(item.env_dir / subjects.MARKER, subjects.marker(req.subject, version, str(item.env_dir)))
    progress(req.label, f"preflight: finding {req.subject.module} in the env")
    res.probe = static_preflight(py, item.env_dir, version,
                                 driver_probe.get("torch") if tid["mode"] == "inherit" else None, req.subject)
    res.import_checked = False
    record = {"schema": RECORD_SCHEMA, "label": req.label, "requested": req.spec, "torch": tid,
              "subject_key": item.key, "fingerprint": fingerprint(item.env_dir), "probe": res.probe,
              "python": res.probe.get("python"), "status": "ok",
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra}
    _atomic_json(item.env_dir / RECORD, record)


def _prepare_tree(req, item, opts, py, tid, driver_probe, progress, log, res) -> dict:
    """Obtain the tree subject's wheel (find-links, cache, or a build from the tree into the cache),
    install it, write the worker's subject marker and the env record, run the static preflight."""
    t0 = time.monotonic()
    key = dict(item.key)
    if tid["mode"] == "pinned":
        tp = probe(py).get("torch") or {}
        key.update({"torch_cuda": tp.get("cuda"), "cxx11abi": tp.get("cxx11abi"), "torch": tp.get("version", key["torch"])})
    info: dict = {"subject": req.package, "tree": key["tree"]}
    if item.method in ("cache", "find-links", "reuse") and item.wheel and Path(item.wheel).is_file():
        wheel = Path(item.wheel)
    else:
        wheel = _build_tree_into_cache(req, item, key, opts, py, progress, log, info)
    progress(req.label, f"installing {wheel.name}")
    install_wheel(py, wheel, opts, log)
    sha = wheels.sha256_file(wheel)
    info.update({"method": item.method, "seconds": round(time.monotonic() - t0, 1)})
    _finish_subject_env(req, item, py, tid, driver_probe, progress, res, item.version,
                        {"wheel": {"file": str(wheel), "sha256": sha, "key": key, "origin": item.method}, "build": info})
    return {"wheel": str(wheel), "wheel_sha256": sha, **info}


def _require_build_deps(py: Path) -> None:
    """EnvError unless the env can import what setup.py imports (BUILD_DEPS[:3]); both source builds."""
    missing = [m for m in BUILD_DEPS[:3] if not _importable(py, m)]
    if missing:
        raise EnvError(f"a source build needs {', '.join(missing)} in the env: install them in the interpreter "
                       "running matrix-run (--torch inherit) or put their wheels in --find-links")


def _build_tree_into_cache(req, item, key, opts, py, progress, log, info) -> Path:
    """Build the tree subject's wheel (fa3.py: the tree's build files only, its DISABLE switches, no
    download) in a build slot and store it in the wheel cache under ``key``. Raises BuildError."""
    kid = wheels.key_id(key)
    (opts.cache_dir / "wheels").mkdir(parents=True, exist_ok=True)
    with FileLock(str(opts.cache_dir / "wheels" / f"{kid}.build.lock")):
        found = _tree_wheel(opts, key)  # another matrix-run process may have built it meanwhile
        if found is not None:
            info["built_by_other_process"] = True
            return found
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
            info.update({"source_build": manifest, "jobs": jobs, "switches": env})
            cached = wheels.cache_store(opts.cache_dir, wheel, key, {"method": item.method, "manifest": manifest,
                                                                    "jobs": jobs, "tree": str(req.version)})
            shutil.rmtree(workdir, ignore_errors=True)
        return cached


def _build_into_cache(req, item, key, opts, py, progress, log, info) -> Path:
    kid = wheels.key_id(key)
    (opts.cache_dir / "wheels").mkdir(parents=True, exist_ok=True)
    with FileLock(str(opts.cache_dir / "wheels" / f"{kid}.build.lock")):
        # another matrix-run process may have built this key while we waited for the lock
        for c in wheels.scan_wheels([opts.cache_dir / "wheels"], item.version, key, origin="cache"):
            if c.reason is None:
                info["built_by_other_process"] = True
                return c.path
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
        return cached


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


def _importable(py: Path, mod: str) -> bool:
    try:
        return capture([str(py), "-c", f"import {mod}"], timeout=60).returncode == 0
    except Stopped:
        raise
    except Exception:  # noqa: BLE001
        return False


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


def is_matrix_run_env(d: Path) -> bool:
    """True for a directory matrix-run created: it has an env record, or is a venv whose build log
    matrix-run keeps (an env whose build failed before its record was written)."""
    if d.is_symlink() or not d.is_dir():
        return False
    if (d / RECORD).is_file():
        return True
    return (d / "pyvenv.cfg").is_file() and (d.parent / ".logs" / f"{d.name}.log").is_file()


def use_lock(envs_dir: Path, label: str) -> Path:
    """The lock file a run holds (shared) on env ``label`` for its whole duration, preparing and timing:
    ``envs clean`` removes no env whose lock it cannot take exclusively."""
    return Path(envs_dir) / f".{label}.use.lock"


def hold_envs(envs_dir: Path, labels: list[str], stack: ExitStack) -> None:
    """Hold every env of ``labels`` in use (a shared lock per env, so runs sharing an env do not wait
    for each other) until ``stack`` closes. Waits while ``envs clean`` is removing one of them."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): envs clean only sees the prepare lock
        return
    Path(envs_dir).mkdir(parents=True, exist_ok=True)
    for label in dict.fromkeys(labels):
        fd = os.open(use_lock(envs_dir, label), os.O_RDWR | os.O_CREAT, 0o644)
        stack.callback(os.close, fd)  # closing the file releases the lock
        fcntl.flock(fd, fcntl.LOCK_SH)


def try_exclusive(envs_dir: Path, label: str, stack: ExitStack) -> bool:
    """Take env ``label`` for removal (its use lock exclusively and its prepare lock, held until
    ``stack`` closes) without waiting: False when a running matrix-run holds it (timing with it or
    preparing it)."""
    prep = FileLock(str(Path(envs_dir) / f".{label}.lock"))
    try:
        prep.acquire(timeout=0)
    except Timeout:
        return False
    stack.callback(prep.release)
    try:
        import fcntl
    except ImportError:
        return True
    fd = os.open(use_lock(envs_dir, label), os.O_RDWR | os.O_CREAT, 0o644)
    stack.callback(os.close, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def list_envs(envs_dir: Path) -> list[dict]:
    """Records of every env under ``envs_dir`` (with size in MB), for ``matrix-run envs list``."""
    out = []
    if not envs_dir.is_dir():
        return out
    for d in sorted(envs_dir.iterdir()):
        if d.is_symlink():  # never follow a link out of --envs-dir
            out.append({"label": d.name, "requested": None, "status": f"symlink to {os.readlink(d)} (not an env)",
                        "torch": None, "python": None, "wheel": "-", "created": None, "size_mb": 0.0,
                        "path": str(d), "symlink": True})
            continue
        if d.is_dir() and not d.name.startswith("."):
            if not is_matrix_run_env(d):
                out.append({"label": d.name, "requested": None, "status": "not a matrix-run env (left alone)",
                            "torch": None, "python": None, "wheel": "-", "created": None, "size_mb": 0.0,
                            "path": str(d), "foreign": True})
                continue
            rec = load_record(d) or {}
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
            out.append({"label": d.name, "requested": rec.get("requested"), "status": rec.get("status", "no record"),
                        "torch": (rec.get("torch") or {}).get("version"), "python": rec.get("python"),
                        "wheel": Path((rec.get("wheel") or {}).get("file") or "-").name,
                        "created": rec.get("created"), "size_mb": round(size / 2**20, 1), "path": str(d)})
    return out
