"""Stage 2a — where a flash-attn wheel comes from: the wheel key, the cache, find-links, releases, PyPI.

Resolution order for one env (shown by ``matrix-run plan`` before anything is built):

1. ``--find-links`` dirs: a ``flash_attn-VERSION-*.whl`` whose key is compatible (see below);
2. matrix-run's own wheel cache (``--wheel-cache``, default ``~/.cache/matrix-run/wheels``);
3. the prebuilt release wheel, named as that version's setup.py names it (skipped with ``--offline``);
4. a source build from the sdist (found in ``--find-links`` or downloaded from the index).

**Wheel key.** A flash-attn wheel contains a C++/CUDA extension compiled against one torch: it
only imports under the same torch version, CUDA major, C++11 ABI and Python. The key is
``(flash_attn, torch, torch_cuda, cxx11abi, python_tag, platform, archs, kernels)``. A wheel is
*compatible* with a wanted key when the first six fields are equal and its archs and kernel set
contain the wanted ones ("all" contains everything). Every wheel matrix-run builds or caches
carries a sidecar ``<wheel>.matrix-run.json`` with its key; a wheel without one is checked against
the ``+cuXXtorchX.Ycxx11abiBOOL`` local version that release wheels carry, and otherwise used as
"unverified" (the import preflight then decides).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

SIDECAR_SUFFIX = ".matrix-run.json"
KEY_FIELDS_EXACT = ("flash_attn", "torch", "torch_cuda", "cxx11abi", "python_tag", "platform", "sdist_sha256")
RELEASE_URL = "https://github.com/Dao-AILab/flash-attention/releases/download/v{version}/{wheel}"
DEFAULT_INDEX = "https://pypi.org/simple"


def default_cache_dir() -> Path:
    """``$MATRIX_RUN_CACHE`` or ``$XDG_CACHE_HOME/matrix-run`` or ``~/.cache/matrix-run``."""
    if os.environ.get("MATRIX_RUN_CACHE"):
        return Path(os.environ["MATRIX_RUN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "matrix-run"


def key_id(key: dict) -> str:
    """16 hex digits of sha256 over the key's canonical JSON."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def compatible(have: dict, want: dict) -> str | None:
    """None when a wheel with key ``have`` may be installed for key ``want``, else the reason why not."""
    for f in KEY_FIELDS_EXACT:
        if have.get(f) != want.get(f):
            return f"{f} {have.get(f)!r} != wanted {want.get(f)!r}"
    for f in ("archs", "kernels"):
        h, w = have.get(f), want.get(f)
        if h == "all":
            continue
        if w == "all" or not set(w or []) <= set(h or []):
            return f"{f} {h!r} does not cover wanted {w!r}"
    return None


def same_version(a: str, b: str) -> bool:
    """PEP 440 equality of public versions (``2.7.0.post2`` == ``2.7.0-post2``, ``2.13`` == ``2.13.0``;
    local labels ignored)."""
    try:
        return Version(Version(a).public) == Version(Version(b).public)
    except InvalidVersion:
        return a == b


_LOCAL_RE = re.compile(r"^cu(\d+)torch(\d+)\.(\d+)cxx11abi(TRUE|FALSE)$", re.IGNORECASE)


@dataclass
class WheelCandidate:
    """A wheel file found somewhere, with what is known of its key."""

    path: Path
    origin: str  # "find-links" | "cache"
    key: dict | None
    verified: bool
    reason: str | None = None  # why it does not fit (None: it fits)


def read_sidecar(wheel: Path) -> dict | None:
    p = wheel.with_name(wheel.name + SIDECAR_SUFFIX)
    if p.is_file():
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None
    return None


def _check_local_tag(wheel: Path, want: dict) -> tuple[bool, str | None]:
    """(verified, reason) from a release wheel's local version ``+cu12torch2.4cxx11abiFALSE``."""
    try:
        _, ver, _, tags = parse_wheel_filename(wheel.name)
    except Exception:  # noqa: BLE001
        return False, "not a valid wheel file name"
    pytags = {t.interpreter for t in tags}
    if not ({want["python_tag"], "py3"} & pytags):
        return True, f"python tag {sorted(pytags)} != wanted {want['python_tag']}"
    if not ver.local:
        return False, None
    raw_local = wheel.name.split("+", 1)[1].split("-", 1)[0] if "+" in wheel.name else ""
    m = _LOCAL_RE.match(raw_local)
    if not m:
        return False, None
    cu, tmaj, tmin, abi = m.groups()
    abi = abi.upper()
    want_torch = ".".join(want["torch"].split("+")[0].split(".")[:2])
    if f"{tmaj}.{tmin}" != want_torch:
        return True, f"built for torch {tmaj}.{tmin}, env has {want_torch}"
    if want.get("torch_cuda") and not cu.startswith(str(want["torch_cuda"]).split(".")[0]):
        return True, f"built for CUDA {cu}, torch has {want['torch_cuda']}"
    if (abi == "TRUE") != bool(want["cxx11abi"]):
        return True, f"cxx11abi {abi} != torch's {want['cxx11abi']}"
    return True, None


def scan_wheels(dirs: list[Path], version: str, want: dict, origin: str = "find-links") -> list[WheelCandidate]:
    """Every ``flash_attn`` wheel of ``version`` under ``dirs`` (recursively for the cache), with
    whether it fits ``want``; fitting, verified ones first."""
    out: list[WheelCandidate] = []
    for d in dirs:
        if not d.is_dir():
            continue
        files = d.rglob("*.whl") if origin == "cache" else d.glob("*.whl")
        for w in sorted(files):
            try:
                name, ver, _, _ = parse_wheel_filename(w.name)
            except Exception:  # noqa: BLE001
                continue
            if name != canonicalize_name("flash-attn") or not same_version(str(ver), version):
                continue
            side = read_sidecar(w)
            if side and isinstance(side.get("key"), dict):
                out.append(WheelCandidate(w, origin, side["key"], True, compatible(side["key"], want)))
            else:
                verified, reason = _check_local_tag(w, want)
                out.append(WheelCandidate(w, origin, None, verified, reason))
    out.sort(key=lambda c: (c.reason is not None, not c.verified))
    return out


def find_sdist(dirs: list[Path], version: str) -> Path | None:
    """A ``flash_attn-VERSION.tar.gz`` sdist under ``dirs``, if any."""
    for d in dirs:
        if not d.is_dir():
            continue
        for f in sorted(d.glob("*.tar.gz")):
            try:
                name, ver = parse_sdist_filename(f.name)
            except Exception:  # noqa: BLE001
                continue
            if name == canonicalize_name("flash-attn") and same_version(str(ver), version):
                return f
    return None


def release_wheel_name(version: str, torch_version: str, torch_cuda: str | None, cxx11abi: bool,
                       python_tag: str, platform: str = "linux_x86_64") -> str | None:
    """The prebuilt wheel name flash-attn's setup.py (``get_wheel_url``) asks GitHub releases for.

    Rule read from the setup.py of 2.6.3 (CUDA tag ``118`` for CUDA 11, ``123`` for 12) and of
    2.7.0.post2 (CUDA major only: ``11`` or ``12``); other versions are assumed to follow the rule
    of the nearer of the two. Returns None without a CUDA torch (no release wheel exists).
    """
    if not torch_cuda:
        return None
    cuda_major = int(str(torch_cuda).split(".")[0])
    v = Version(version)
    if v < Version("2.7.0"):
        cu = "118" if cuda_major == 11 else "123"
    else:
        cu = str(cuda_major)
    tv = Version(torch_version.split("+")[0])
    abi = "TRUE" if cxx11abi else "FALSE"
    return f"flash_attn-{version}+cu{cu}torch{tv.major}.{tv.minor}cxx11abi{abi}-{python_tag}-{python_tag}-{platform}.whl"


def download(url: str, dest: Path, timeout: float = 30.0) -> Path:
    """Download ``url`` to ``dest`` atomically (temp file + rename), in chunks of up to 1 MiB. ``timeout``
    (s) bounds each connect and read. Stops within one chunk (or one stalled read) when matrix-run
    is interrupted (``proc.stopping()``), raising ``proc.Stopped``; the partial file is removed.
    Raises urllib errors."""
    from .proc import Stopped, stopping

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=timeout) as r:
            while True:
                if stopping():
                    raise Stopped(f"interrupted: download of {url} stopped")
                chunk = r.read1(1 << 20)  # what has arrived, up to 1 MiB
                if not chunk:
                    break
                f.write(chunk)
        os.chmod(tmp, 0o644)  # a public file: readable like any download (mkstemp makes it 0600)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def index_versions(index_url: str = DEFAULT_INDEX, timeout: float = 20.0) -> dict[str, dict]:
    """``{version: sdist file record}`` for flash-attn on a PEP 691 (JSON simple API) index."""
    req = urllib.request.Request(f"{index_url.rstrip('/')}/flash-attn/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        data = json.load(r)
    out: dict[str, dict] = {}
    for f in data.get("files", []):
        fn = f.get("filename", "")
        if fn.endswith(".tar.gz") and not f.get("yanked"):
            try:
                _, ver = parse_sdist_filename(fn)
            except Exception:  # noqa: BLE001
                continue
            out[str(ver)] = f
    return out


def wheel_versions(dirs: list[Path], dist: str, recursive: bool = False) -> set[str]:
    """Versions (as written, local labels kept) of the ``DIST-*.whl`` files in ``dirs`` (``dist`` as in
    wheel file names: ``flash_attn``, ``torch``); ``recursive``: below them too (the wheel cache)."""
    out: set[str] = set()
    for d in dirs:
        if not d.is_dir():
            continue
        for w in (d.rglob if recursive else d.glob)(f"{dist}-*.whl"):
            try:
                out.add(str(parse_wheel_filename(w.name)[1]))
            except Exception:  # noqa: BLE001 - not a wheel name
                continue
    return out


def project_versions(project: str, index_url: str, timeout: float = 20.0) -> set[str]:
    """Public versions of ``project`` that ``index_url`` lists (not yanked), from its sdists and
    wheels (:func:`project_files`, :func:`file_versions`). Raises what urllib raises when the index
    cannot be asked, ValueError when the page lists no file of the project."""
    out = file_versions(project_files(project, index_url, timeout))
    if not out:
        raise ValueError(f"{index_url} lists no {project} file")
    return out


def file_versions(names: list[str]) -> set[str]:
    """The public versions of the sdist and wheel file ``names`` (a wheel's local label,
    ``torch-2.9.1+cu130-...``, dropped); other names are skipped."""
    out: set[str] = set()
    for fn in names:
        v = file_version(fn)
        if v is not None:
            out.add(v)
    return out


def file_version(fn: str) -> str | None:
    """The public version of an sdist or wheel file name, None for another name."""
    try:
        ver = parse_wheel_filename(fn)[1] if fn.endswith(".whl") else parse_sdist_filename(fn)[1]
    except Exception:  # noqa: BLE001 - not a distribution file name
        return None
    return str(ver.public)


def wheel_fits(fn: str, here: set | None = None) -> bool:
    """Whether the wheel file ``fn`` installs into this interpreter (one of its tags is in ``here``,
    default :func:`packaging.tags.sys_tags`: the Python, ABI and platform envs are made with, as
    envs.create_venv gives them this interpreter)."""
    from packaging.tags import sys_tags

    try:
        tags = parse_wheel_filename(fn)[3]
    except Exception:  # noqa: BLE001 - not a wheel name
        return False
    return bool(tags & (here if here is not None else set(sys_tags())))


def project_files(project: str, index_url: str, timeout: float = 20.0) -> list[str]:
    """File names ``index_url`` lists for ``project`` (not yanked): PEP 691 JSON when the index
    answers it, else the PEP 503 HTML page's links (the PyTorch indexes,
    ``https://download.pytorch.org/whl/cu130``, answer HTML). Raises what urllib raises when the
    index cannot be asked."""
    req = urllib.request.Request(f"{index_url.rstrip('/')}/{project}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.5"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        ctype, body = r.headers.get("Content-Type", ""), r.read()
    names: list[str] = []
    if "json" in ctype:
        names = [f.get("filename", "") for f in json.loads(body).get("files", []) if not f.get("yanked")]
    else:
        for m in re.finditer(r"<a\b([^>]*)>([^<]+)</a>", body.decode("utf-8", "replace"), re.IGNORECASE):
            if "data-yanked" not in m.group(1):
                names.append(m.group(2).strip())
    return names


def nearest_versions(version: str, available: list[str], n: int = 3) -> list[str]:
    """The ``n`` available versions closest to ``version``, for error messages: by release tuple
    (per-component distance, the major first), except above every available version the newest
    ones, newest first, and below every one the oldest (new-user trial: 3.0.0, 99.0.0 and torch 9.9.9
    named 2.0.x, the smallest minor difference); first of all, a version written with the same
    characters but its dots elsewhere (2.70.post2: 2.7.0.post2)."""
    vs = []
    for v in dict.fromkeys(available):
        try:
            vs.append((v, Version(v)))
        except InvalidVersion:  # not a release name: never suggested
            continue
    vs.sort(key=lambda kv: kv[1])
    # a misplaced or missing dot first (new-user trial: 2.70.post2 named 2.8.3.post2, 2.8.3.post1,
    # 2.8.3 and not 2.7.0.post2): the same characters once dots and dashes are dropped
    squash = lambda s: re.sub(r"[.\-_]", "", s.lower())  # noqa: E731
    typo = [v for v, _ in vs if squash(v) == squash(version) and v != version][:n]
    return typo + [v for v in _nearest_by_release(version, vs, n) if v not in typo][:n - len(typo)]


def _nearest_by_release(version: str, vs: list, n: int) -> list[str]:
    """:func:`nearest_versions` by release tuple; ``vs``: (name, Version) sorted by version."""
    try:
        target = Version(version)
    except InvalidVersion:
        return [v for v, _ in vs[-n:]]
    if vs and target > vs[-1][1]:
        return [v for v, _ in vs[::-1][:n]]
    if vs and target < vs[0][1]:
        return [v for v, _ in vs[:n]]
    t = target.release + (0,) * (4 - len(target.release))

    def dist(kv):
        r = kv[1].release + (0,) * (4 - len(kv[1].release))
        return tuple(abs(a - b) for a, b in zip(r, t))

    return [v for v, _ in sorted(vs, key=dist)[:n]]


def fetch_sdist(version: str, cache: Path, index_url: str = DEFAULT_INDEX) -> Path:
    """Download flash-attn ``version``'s sdist into ``cache/sdists`` (sha256-checked), or reuse it.

    Raises LookupError naming the nearest versions when the index has no such version."""
    dest_dir = cache / "sdists"
    cached = find_sdist([dest_dir], version)
    if cached:
        return cached
    files = index_versions(index_url)
    match = next((files[v] for v in files if same_version(v, version)), None)
    if match is None:
        near = nearest_versions(version, list(files))
        raise LookupError(f"flash-attn {version} is not on {index_url}; nearest: {', '.join(near)}")
    dest = dest_dir / match["filename"]
    with FileLock(str(dest) + ".lock"):
        if not dest.exists():
            download(match["url"], dest, timeout=120)
            want = match.get("hashes", {}).get("sha256")
            if want and sha256_file(dest) != want:
                dest.unlink()
                raise RuntimeError(f"sha256 mismatch for {match['filename']} from {index_url}")
    return dest


def cache_store(cache: Path, wheel: Path, key: dict, build: dict) -> Path:
    """Copy ``wheel`` into ``cache/wheels/<key_id>/`` with its sidecar, atomically and under a lock.

    Returns the cached wheel's path. Concurrent matrix-run processes serialize on the key's lock."""
    kid = key_id(key)
    d = cache / "wheels" / kid
    d.mkdir(parents=True, exist_ok=True)
    dest = d / wheel.name
    with FileLock(str(d) + ".lock"):
        # the sidecar lands first: a wheel is never visible (scans look for *.whl) without its key
        side = {"schema": "matrix-runner/wheel/1", "key": key, "key_id": kid, "sha256": sha256_file(wheel),
                "build": build}
        stmp = d / (".tmp-" + wheel.name + SIDECAR_SUFFIX)
        stmp.write_text(json.dumps(side, indent=1, sort_keys=True))
        os.replace(stmp, dest.with_name(dest.name + SIDECAR_SUFFIX))
        tmp = d / (".tmp-" + wheel.name)
        shutil.copyfile(wheel, tmp)
        os.replace(tmp, dest)
    return dest
