"""The uv venv of one env and the interpreters around it: finding and running uv, creating the venv
and making torch visible in it (inherited or pinned), installing a wheel or a subject into it, the
env's interpreter, the driver's site dirs, the worker's probe, whether a module imports in the env,
and the fingerprint of what decides what the env imports. Also :class:`EnvError`, what preparing an
env raises (defined here, the lowest module that raises it)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .. import wheels
from ..errors import StageFailed
from ..lockstep import WORKER
from ..proc import Stopped, capture, run_logged
from .record import RECORD, is_matrix_run_env

if TYPE_CHECKING:  # annotations only: plan and requests import this module
    from .plan import Options
    from .requests import EnvRequest


#: Installed with a pinned torch; a source build needs the first three (flash-attn's setup.py imports
#: them), ninja makes torch's extension build parallel, psutil is imported only without MAX_JOBS.
BUILD_DEPS = ("setuptools", "wheel", "packaging", "ninja", "psutil")


class EnvError(StageFailed):
    """Preparing one env failed; ``tail`` holds the relevant log lines (the other envs go on)."""

    def __init__(self, msg: str, tail: str = "", log: str | None = None):
        super().__init__(msg)
        self.tail = tail
        self.log = log


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


#: uv's own transient failures, retried once by :func:`_uv`: two uv processes that query one Python
#: interpreter at once race on uv's interpreter cache (a fresh-clone CI run, 2026-12-05: "failed to
#: rename file from .../interpreter-v5/.../.tmpXXXX ...: No such file or directory", which failed an
#: env and its test; the same command run again succeeds).
UV_TRANSIENT = ("failed to rename file",)


def _uv(args: list[str], log: Path, timeout: float = 1800, offline: bool = False) -> None:
    """Run ``uv ARGS``, its output appended to ``log``; EnvError naming the log on failure. A failure
    of uv's own cache (:data:`UV_TRANSIENT`) is retried once."""
    extra = {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1"}
    if offline:
        extra["UV_OFFLINE"] = "1"
    for attempt in (1, 2):
        r = run_logged([find_uv(), *args], env_extra=extra, log=log, timeout=timeout)
        if r.returncode == 0:
            return
        if attempt == 1 and any(m in (r.tail or "") for m in UV_TRANSIENT):
            continue
        raise EnvError(f"uv {args[0]} {args[1] if len(args) > 1 else ''} failed (exit {r.returncode}); log: {log}",
                       r.tail, str(log))


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


def env_python(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


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


def _importable(py: Path, mod: str) -> bool:
    try:
        return capture([str(py), "-c", f"import {mod}"], timeout=60).returncode == 0
    except Stopped:
        raise
    except Exception:  # noqa: BLE001
        return False


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
