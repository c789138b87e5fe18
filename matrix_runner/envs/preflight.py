"""The import preflight, in two steps (package doc): right after the install, :func:`static_preflight`
(:data:`STATIC_PROBE`: finds the subject's module and its extension inside the env, no torch import);
then the env's first worker's probe, checked by :func:`check_probe`, whose outcome
:func:`record_import_check` stores in the env record. :func:`preflight` is the full check made at
once (an env reused without a matching fingerprint)."""
from __future__ import annotations

import json
from pathlib import Path

from .. import subjects, wheels
from ..proc import capture
from ..worker import PROBE_SCHEMA
from .record import RECORD, load_record, write_record
from .requests import EnvRequest
from .venv import EnvError, fingerprint, probe

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
    write_record(env_dir / RECORD, rec)
