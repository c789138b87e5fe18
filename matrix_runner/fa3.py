"""Stage 2c — FlashAttention 3 from a source tree of the flash-attention repository.

FA3 is not on PyPI: it is the repository's ``hopper/`` directory (distribution ``flash_attn_3``,
modules ``flash_attn_interface`` and ``flash_attn_3._C``), built against the env's torch with the
CUTLASS headers of the ``csrc/cutlass`` submodule. ``--versions fa3=flash-attn-3@PATH`` names it:
PATH is a checkout (submodule included) or an archive of one (``.tar.gz``/``.tgz``/``.tar``/``.zip``).

A full FA3 build compiles ~450 kernel files (hours). Its ``hopper/setup.py`` has build switches,
``FLASH_ATTENTION_DISABLE_{BACKWARD,SPLIT,PAGEDKV,APPENDKV,LOCAL,SOFTCAP,PACKGQA,FP16,FP8,VARLEN,
CLUSTER,HDIM64,...,HDIM256,SM80,HDIMDIFF64,HDIMDIFF192}``: :func:`switches` turns on every switch the
config's cases do not need, so a *slim* FA3 build compiles a handful of files. The rule is that a
slim build runs the same kernels a full build would for these cases (read from ``hopper/`` at
commit 0251105a, 2026-08-15):

- head dims: ``flash_attn_interface.round_up_headdim`` and the C++ dispatch take the smallest
  enabled of 64, 96, 128, 192, 256 that is >= head_dim; keeping the smallest one >= each case's
  head_dim keeps the kernel a full build would pick (head_dim > 256: not supported);
- bf16 kernels are always built; fp16 only if a case is fp16; fp8 never (no fp8 cases);
- backward only with a bwd case; varlen only with a varlen entry point; split-KV, paged KV and
  appended KV only for kvcache cases that can reach them (``flash_attn_func`` passes
  ``num_splits=1``: the split kernels are never run for it);
- PackGQA only with a case where nheads_k < nheads (its heuristic returns false otherwise, and is
  always on for split/paged calls); clusters only where ``flash_fwd_launch_template.h`` enables
  them (16-bit, head dim >= 128, not causal, not varlen, no split, no paged KV);
- sliding window (LOCAL), softcap, sm80 kernels, head-dim-v variants (HDIMDIFF*): no case uses them.

:func:`kernel_files` predicts setup.py's source list for those switches from its own naming rule
(checked against the tree's ``hopper/instantiations``); the build's manifest records the list
setup.py really compiled (``_build_shim.py``).
"""
from __future__ import annotations

import hashlib
import itertools
import re
import shutil
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .config import Case
from .errors import UsageError

#: FA3's head dims (``HEAD_DIMENSIONS_BWD`` in hopper/setup.py), each with its DISABLE switch.
HDIMS = (64, 96, 128, 192, 256)
#: Every switch matrix-run may set, in setup.py's order (``FLASH_ATTENTION_DISABLE_<NAME>``).
SWITCHES = ("BACKWARD", "SPLIT", "PAGEDKV", "APPENDKV", "LOCAL", "SOFTCAP", "PACKGQA", "FP16", "FP8",
            "VARLEN", "CLUSTER", "HDIM64", "HDIM96", "HDIM128", "HDIM192", "HDIM256", "SM80",
            "HDIMDIFF64", "HDIMDIFF192")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.xz", ".zip")
#: Seconds of one nvcc job per FA3 file, for estimates only, from ninja's log of matrix-run's slim FA3
#: build on the H200 host (nvcc 13.0, sm_90a, 6 jobs, NVCC_THREADS 1, head dim 64): fwd 116-120 s,
#: bwd 128-132 s, flash_prepare_scheduler.cu 80 s, flash_api_stable.cpp 17 s (build 137 s;
#: benchmarks/results/h200-fa3-build.txt). Larger head dims compile longer: estimates are lower bounds.
EST_FILE_S = {"fwd": 120.0, "bwd": 132.0, "other": 80.0}


class TreeError(UsageError):
    """The path is not a usable FA3 source tree; the message says what is missing and what to do."""


@dataclass
class SourceTree:
    """A flash-attention checkout or archive holding ``hopper/``.

    ``files``: paths relative to the repository root (POSIX) that the build needs (``hopper/``,
    ``csrc/cutlass/include/``, the root README.md that setup.py reads); ``version``: hopper's
    ``__version__``; ``tree_id``: 16 hex digits of sha256 over those files' paths and bytes (what
    identifies the built wheel, as an sdist's sha256 does)."""

    path: Path
    version: str
    setup_text: str
    instantiations: list[str]
    files: list[str]
    tree_id: str
    prefix: str = ""  # the repository root inside an archive ("flash-attention-<sha>/")

    @property
    def available_switches(self) -> list[str]:
        """The DISABLE switch names this tree's hopper/setup.py reads."""
        return sorted(set(re.findall(r"FLASH_ATTENTION_DISABLE_([A-Z0-9]+)", self.setup_text)))


#: Build outputs a checkout may hold under hopper/ (never part of the tree's identity).
_OUTPUTS = ("hopper/build/", "hopper/dist/", "hopper/flash_attn_config.py")


def _wanted(rel: str) -> bool:
    if rel.startswith(_OUTPUTS) or "__pycache__/" in rel or ".egg-info/" in rel or rel.endswith((".so", ".o", ".pyc")):
        return False
    return (rel.startswith(("hopper/", "csrc/cutlass/include/"))
            or rel in ("README.md", "LICENSE", "csrc/cutlass/LICENSE.txt"))


def is_archive(p: Path) -> bool:
    return p.is_file() and p.name.endswith(ARCHIVE_SUFFIXES)


def open_tree(path: str | Path) -> SourceTree:
    """Read an FA3 source tree (a directory: the repository root or its ``hopper/``; or an archive
    of the repository). Raises TreeError naming what is missing: no ``hopper/setup.py``, no
    ``hopper/__init__.py`` version, or no CUTLASS headers (``csrc/cutlass/include/cutlass/cutlass.h``:
    the submodule was not checked out)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise TreeError(f"{path}: no such file or directory")
    blobs: dict[str, bytes] = {}
    prefix = ""
    if p.is_dir():
        root = p.parent if (p / "setup.py").is_file() and p.name == "hopper" else p
        if not (root / "hopper" / "setup.py").is_file():
            raise TreeError(f"{path}: no hopper/setup.py: give the root of a flash-attention checkout (FA3 lives "
                            "in its hopper/ directory) or an archive of one")
        files = [f for d in ("hopper", "csrc/cutlass/include") if (root / d).is_dir() for f in (root / d).rglob("*")]
        files += [root / n for n in ("README.md", "LICENSE", "csrc/cutlass/LICENSE.txt")]
        for f in sorted(files):
            rel = f.relative_to(root).as_posix()
            if f.is_file() and _wanted(rel):
                blobs[rel] = f.read_bytes()
        p = root
    elif is_archive(p):
        try:
            blobs, prefix = _read_archive(p)
        except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError) as e:
            raise TreeError(f"{path}: cannot read the archive ({type(e).__name__}: {e})") from None
        if "hopper/setup.py" not in blobs:
            raise TreeError(f"{path}: the archive holds no hopper/setup.py (at its top or one directory down): "
                            "give an archive of the flash-attention repository")
    else:
        raise TreeError(f"{path}: not a directory nor an archive ({', '.join(ARCHIVE_SUFFIXES)})")
    init = blobs.get("hopper/__init__.py", b"").decode("utf-8", "replace")
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", init, re.MULTILINE)
    if not m:
        raise TreeError(f"{path}: hopper/__init__.py has no __version__ = '...': is this FlashAttention 3's tree?")
    if "csrc/cutlass/include/cutlass/cutlass.h" not in blobs:
        raise TreeError(f"{path}: no CUTLASS headers (csrc/cutlass/include/cutlass/cutlass.h): the csrc/cutlass "
                        "submodule is not checked out; run `git submodule update --init csrc/cutlass` in the "
                        "checkout (a GitHub source archive leaves submodules out)")
    h = hashlib.sha256()
    for rel in sorted(blobs):
        h.update(rel.encode() + b"\0" + hashlib.sha256(blobs[rel]).digest())
    inst = sorted(PurePosixPath(r).name for r in blobs if r.startswith("hopper/instantiations/") and r.endswith(".cu"))
    return SourceTree(p.resolve(), m.group(1), blobs["hopper/setup.py"].decode("utf-8", "replace"), inst,
                      sorted(blobs), h.hexdigest()[:16], prefix)


def _read_archive(p: Path) -> tuple[dict[str, bytes], str]:
    """The archive's wanted files by path relative to the repository root, and that root's prefix
    inside the archive (``""`` or one top directory)."""
    entries: dict[str, bytes] = {}
    if p.name.endswith(".zip"):
        with zipfile.ZipFile(p) as z:
            for n in z.namelist():
                if not n.endswith("/"):
                    entries[n] = z.read(n)
    else:
        with tarfile.open(p) as tf:
            for m in tf.getmembers():
                if m.isfile():
                    f = tf.extractfile(m)
                    if f is not None:
                        entries[m.name.lstrip("./")] = f.read()
    prefix = ""
    if "hopper/setup.py" not in entries:
        tops = sorted({n.split("/", 1)[0] for n in entries if "/" in n})
        roots = [t for t in tops if f"{t}/hopper/setup.py" in entries]
        if len(roots) > 1:
            raise TreeError(f"{p}: the archive holds {len(roots)} flash-attention trees ({', '.join(roots)}): "
                            "give an archive of one")
        prefix = roots[0] + "/" if roots else ""
    out = {}
    for n, b in entries.items():
        if n.startswith(prefix):
            rel = n[len(prefix):]
            if _wanted(rel):
                out[rel] = b
    return out, prefix


def materialize(tree: SourceTree, dest: Path) -> Path:
    """Write the tree's build files under ``dest`` (emptied first); returns ``dest``. Only the files
    of :attr:`SourceTree.files` are written: hopper/, the CUTLASS headers, README.md."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if tree.path.is_dir():
        for rel in tree.files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree.path / rel, dest / rel)
    else:
        blobs, _ = _read_archive(tree.path)
        for rel, b in blobs.items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(b)
    return dest


def round_up_hdim(head_dim: int) -> int:
    """The FA3 head dim a case's ``head_dim`` runs with (all head dims built); ValueError above 256."""
    for h in HDIMS:
        if head_dim <= h:
            return h
    raise ValueError(f"head_dim {head_dim}: FlashAttention 3 supports head_dim <= 256")


def switches(cases: list[Case]) -> tuple[list[str], list[str]]:
    """The DISABLE switches (names without ``FLASH_ATTENTION_DISABLE_``) a slim FA3 build sets for
    ``cases``, and notes on what was kept and why (rules: module doc). ValueError for a case FA3
    cannot run (head_dim > 256, a dtype other than fp16/bf16)."""
    keep: set[str] = set()
    why: list[str] = []
    hd = set()
    for c in cases:
        if c.dtype not in ("fp16", "bf16"):
            raise ValueError(f"case {c.id}: dtype {c.dtype}: matrix-run times FA3 in fp16/bf16 only")
        h = round_up_hdim(c.head_dim)
        hd.add(h)
        keep.add(f"HDIM{h}")
        if c.dtype == "fp16":
            keep.add("FP16")
        if c.op == "bwd":
            keep.add("BACKWARD")
        func = c.func or "func"
        if func.startswith("varlen"):
            keep.add("VARLEN")
        if func == "kvcache":
            keep.update({"SPLIT", "PACKGQA"})  # num_splits=0: the heuristic; split calls always pack GQA
            if c.page_block_size:
                keep.add("PAGEDKV")
            if c.append_kv:
                keep.add("APPENDKV")
        if c.nheads_k < c.nheads:
            keep.add("PACKGQA")
        if h >= 128 and not c.causal and not func.startswith("varlen") and func != "kvcache":
            keep.add("CLUSTER")
    disabled = [s for s in SWITCHES if s not in keep]
    why.append(f"head dims {', '.join(map(str, sorted(hd)))} kept (FA3 rounds head_dim up to 64/96/128/192/256)")
    kept = [s for s in ("FP16", "BACKWARD", "VARLEN", "SPLIT", "PAGEDKV", "APPENDKV", "PACKGQA", "CLUSTER") if s in keep]
    if kept:
        why.append("kept: " + ", ".join(k.lower() for k in kept))
    return disabled, why


def kernel_files(tree: SourceTree, disabled: list[str]) -> tuple[list[str], list[str]]:
    """hopper/setup.py's kernel files for the switches (its own naming rule, sm90 files; with SM80
    enabled its sm80 files too), and those of them missing from the tree's instantiations (a tree
    whose setup.py follows another rule: the estimate is then only a guess)."""
    off = set(disabled)
    hd = [h for h in HDIMS if f"HDIM{h}" not in off]
    def on(switch: str, suffix: str) -> list[str]:
        return [""] + ([suffix] if switch not in off else [])
    fwd_dt = ["bf16"] + (["fp16"] if "FP16" not in off else []) + (["e4m3"] if "FP8" not in off else [])
    bwd_dt = ["bf16"] + (["fp16"] if "FP16" not in off else [])
    softcap_all = [""] if "SOFTCAP" in off else ["_softcapall"]
    files = [f"flash_fwd_hdim{h}_{dt}{pg}{sp}{sc}{pq}_sm90.cu"
             for h, dt, sp, pg, sc, pq in itertools.product(hd, fwd_dt, on("SPLIT", "_split"), on("PAGEDKV", "_paged"),
                                                             on("SOFTCAP", "_softcap"), on("PACKGQA", "_packgqa"))
             if not (pq and (pg or sp))]
    if "BACKWARD" not in off:
        files += [f"flash_bwd_hdim{h}_{dt}{sc}_sm90.cu" for h, dt, sc in itertools.product(hd, bwd_dt, softcap_all)]
    if "SM80" not in off:
        files += [f"flash_fwd_hdim{h}_{dt}{pg}{sp}{sc}_sm80.cu"
                  for h, dt, sp, pg, sc in itertools.product(hd, ["bf16"] + (["fp16"] if "FP16" not in off else []),
                                                             on("SPLIT", "_split"), on("PAGEDKV", "_paged"), softcap_all)]
        if "BACKWARD" not in off:
            files += [f"flash_bwd_hdim{h}_{dt}{sc}_sm80.cu" for h, dt, sc in itertools.product(hd, bwd_dt, on("SOFTCAP", "_softcap"))]
    have = set(tree.instantiations)
    return files, [f for f in files if f not in have]


def estimate_seconds(files: list[str], max_jobs: int) -> float:
    """Wall seconds of a build of ``files`` plus flash_api and the scheduler (and the combine kernel
    with split), ``max_jobs`` nvcc jobs at once (longest-first schedule)."""
    from .build import schedule

    costs = [EST_FILE_S["bwd" if "_bwd_" in f else "fwd"] for f in files] + [EST_FILE_S["other"]] * 2
    return schedule(costs, max(1, max_jobs)) + 15.0


def build_env(disabled: list[str], available: list[str]) -> tuple[dict, list[str]]:
    """The environment for hopper/setup.py: each switch it reads set to TRUE, never a download
    (``FLASH_ATTENTION_FORCE_BUILD``: no prebuilt-wheel fetch; ``FLASH_ATTENTION_OFFLINE_BUILD``: no
    NVIDIA toolchain fetch for CUDA 12.x), and the switches this tree does not know (left out)."""
    env = {"FLASH_ATTENTION_FORCE_BUILD": "TRUE", "FLASH_ATTENTION_OFFLINE_BUILD": "TRUE"}
    unknown = []
    for s in disabled:
        if s in available:
            env[f"FLASH_ATTENTION_DISABLE_{s}"] = "TRUE"
        else:
            unknown.append(s)
    return env, unknown
