"""The env's identity record and its locks: the record file (``matrix-run-env.json``: what was asked
for, the torch, the wheel and its key, the probe, the fingerprint, the status) and how it is read and
written, which directories are envs matrix-run made, ``matrix-run envs list``'s rows, and the lock
files that keep ``envs clean`` away from an env a run is preparing or timing with."""
from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path

from filelock import FileLock, Timeout

RECORD = "matrix-run-env.json"
RECORD_SCHEMA = "matrix-runner/env/1"


def load_record(env_dir: Path) -> dict | None:
    try:
        return json.loads((env_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None


def write_record(path: Path, data: dict) -> None:
    """Write an env record (or another JSON file of the env, like its subject marker) atomically (the
    same temp-file, fsync and rename as results.json)."""
    from ..results import write_json

    write_json(path, data)


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


def reuse_state(env_dir: Path, rec: dict | None) -> str | None:
    """What a cheap look finds in an env whose record says ok, before a run checks it for real
    (prepare._prepare_reused: the import preflight, and a rebuild when that fails): None when nothing
    that decides its imports changed since its check (the fingerprint, venv.fingerprint); else a
    sentence for ``plan`` and ``envs list`` (new-user trial: an env with its python deleted was listed
    "ok" and planned "reuse")."""
    from .venv import env_python, fingerprint

    if not env_python(env_dir).exists():
        return "broken: its python is missing (the next run rebuilds it)"
    if (rec or {}).get("fingerprint") and fingerprint(env_dir) != rec["fingerprint"]:
        return "changed since its check (the next run checks its import again, and rebuilds it if that fails)"
    return None


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
            # no record: a venv whose build failed or was cut short (is_matrix_run_env); its record is
            # written last, so the next run builds it again (new-user trial: listed as "no record")
            status = rec.get("status")
            state = reuse_state(d, rec) if status == "ok" else None
            if state:  # a missing python makes it broken; changed files leave it ok, to be checked again
                status = state if state.startswith("broken") else f"ok, {state}"
            elif not status:
                status = (f"unfinished: its build failed or was cut short (log: {d.parent / '.logs' / (d.name + '.log')}); "
                          "the next run builds it again")
            out.append({"label": d.name, "requested": rec.get("requested"), "status": status,
                        "torch": (rec.get("torch") or {}).get("version"), "python": rec.get("python"),
                        "wheel": Path((rec.get("wheel") or {}).get("file") or "-").name,
                        "created": rec.get("created"), "size_mb": round(size / 2**20, 1), "path": str(d)})
    return out
