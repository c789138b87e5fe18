"""Version requests: what ``--versions`` and ``--torch`` ask for (:class:`EnvRequest`, one per env:
a flash-attn version, a local sdist or wheel, another subject's ``PACKAGE==VERSION``, an FA3 source
tree), the version x torch matrix, and the check, before anything is built, that each requested
version and pinned torch exists."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from .. import fa3, subjects, wheels
from ..errors import UsageError
from .record import load_record
from .venv import local_version

if TYPE_CHECKING:  # annotations only: plan imports this module
    from .plan import Options


LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


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
    raw_of: dict[str, str] = {}  # label -> the item as written (a duplicate's message names both)
    if text and any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise UsageError(f"--versions {text!r}: control characters are not allowed")
    items = [x.strip() for x in (text or "").split(",")]
    if any(items) and not all(items):  # "2.6.3,,2.7.0.post2": an item lost to a typo was ignored
        raise UsageError(f"--versions {text!r}: item {items.index('') + 1} is empty; remove the extra comma "
                         "or put the version that belongs there")
    items = [x for x in items if x]
    if not items:
        raise UsageError("--versions: give at least one flash-attn version, e.g. --versions 2.6.3,2.7.0.post2")
    for it in items:
        package = subjects.DEFAULT
        if re.match(r"=[^=]", it):  # "=2.6.3": LABEL=VERSION with the label left out (new-user trial)
            raise UsageError(f"--versions: {it!r} has an empty label before '='; write LABEL=VERSION (e.g. "
                             f"a{it}) or the version alone ({it[1:]})")
        if re.match(r"\s*(~=|!=|[<>]=?|=)", it):  # ">=2.6": a specifier, which would read as label '>'
            raise UsageError(f"--versions: {it!r} is a version specifier; matrix-run times exact versions: write each "
                             "one, e.g. --versions 2.6.3,2.7.0.post2")
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
                v = Version(ver)
            except InvalidVersion:
                raise UsageError(f"--versions: {it!r}: {ver!r} is not a PEP 440 version") from None
            if v.local:
                raise UsageError(f"--versions: {it!r}: {ver} carries a local build label (+{v.local}); give "
                                 f"{pkg}=={v.public}")
            ver = str(v)
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
                v = Version(ver)
                if v.local:  # 2.6.3+cu12 and 2.6.3+cu13 became two envs of one wheel: a silent A/A
                    raise UsageError(f"--versions: {it!r}: {ver} carries a local build label (+{v.local}); matrix-run "
                                     "picks the build of a version for this machine's torch and CUDA itself (its "
                                     f"wheel key): give {v.public}, or the path of a wheel file to time that build")
                ver = str(v)
                if "=" not in it:  # an unlabeled version is labeled by its normal form ("v2.6.3" and
                    # "2.6.3" are one env, not a silent A/A run: new-user trial), or by an earlier one of
                    # the same PEP 440 version (2.6.3.0 and 2.6.3: second trial, two envs)
                    label = next((r.label for r in out if r.label == r.version and wheels.same_version(r.version, ver)), ver)
            except InvalidVersion:
                sub = subjects.SUBJECTS.get(subjects.normalize(ver))  # a subject named without its version
                lab = f"{label}=" if "=" in it else ""
                hint = ("" if sub is None or sub.package == subjects.DEFAULT else
                        f"; for {sub.package} write {lab}{sub.package}@/path/to/flash-attention" if sub.tree else
                        f"; for {sub.package} write {lab}{sub.package}==VERSION (e.g. {lab}{sub.package}==4.0.0b36)")
                raise UsageError(f"--versions: {ver!r} is not a PEP 440 version (like 2.6.3 or 2.7.0.post2) "
                                 "nor a path to a flash-attn sdist or wheel" + hint) from None
        if not LABEL_RE.match(label) or label in (".", ".."):
            raise UsageError(f"--versions: label {label!r} may only use letters, digits and . _ + -, must start "
                             "with a letter or digit and have at most 64 characters (it names the env directory)")
        if any(r.label == label for r in out):
            first = raw_of.get(label, label)
            same = (f" ({first!r} and {it!r} are one version, {label})" if "=" not in it and first != it else "")
            raise UsageError(f"--versions: label {label!r} appears twice{same}; use LABEL=VERSION to name each env "
                             "(e.g. a=2.6.3,b=2.6.3 for an A/A run)")
        out.append(EnvRequest(label, ver))
        raw_of[label] = it
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


def _version_here(r: EnvRequest, opts: "Options") -> bool:
    """Whether request ``r`` (flash-attn or another subject installed from the index) can be had
    without an index: a wheel of it in --find-links or the wheel cache, a flash-attn sdist of it
    there, or an ok env whose record asked for the same spec."""
    dist = r.package.replace("-", "_")  # as in wheel file names
    version = r.version
    have = wheels.wheel_versions(opts.find_links, dist) | wheels.wheel_versions(
        [opts.cache_dir / "wheels", opts.cache_dir / "sdists"], dist, recursive=True)
    if any(wheels.same_version(v, version) for v in have):
        return True
    if r.package == subjects.DEFAULT and wheels.find_sdist(
            [*opts.find_links, opts.cache_dir / "wheels", opts.cache_dir / "sdists"], version):
        return True
    if opts.envs_dir.is_dir():
        for d in opts.envs_dir.iterdir():
            rec = load_record(d) if d.is_dir() else None
            if rec and rec.get("requested") == r.spec and rec.get("status") == "ok":
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
    warnings = _check_torch_pins(opts, timeout) + _check_subject_pins(reqs, opts, timeout)
    want = [r for r in reqs if not r.is_path and r.package == subjects.DEFAULT]  # other subjects: above
    missing = [r for r in want if not _version_here(r, opts)]
    if not missing:
        return warnings
    return warnings + _check_listed("flash-attn", [(r.version, f"--versions: flash-attn {r.version}") for r in missing],
                                    lambda: wheels.index_versions(opts.index_url, timeout=timeout), opts.index_url,
                                    empty="(the index lists no flash-attn sdist)")


def _check_listed(what: str, wanted: list[tuple[str, str]], listing, index: str, hint: str = "",
                  empty: str = "(none listed)") -> list[str]:
    """The one index check of :func:`check_versions`: ``wanted`` = (version, how the error names it);
    ``listing()`` asks ``index`` for the versions of ``what`` it lists. A version it does not list
    raises UsageError naming the nearest ones (+ ``hint``); an index that cannot be asked gives the
    warning returned (the run goes on)."""
    try:
        listed = sorted(listing())
    except Exception as e:  # noqa: BLE001 - an index we cannot ask must not stop an otherwise good run
        why = getattr(e, "reason", None) or e
        return [f"could not check that {what} {', '.join(v for v, _ in wanted)} exist(s) on {index} "
                f"({type(e).__name__}: {why}); going on"]
    for v, name in wanted:
        if not any(wheels.same_version(x, v) for x in listed):
            near = wheels.nearest_versions(v, listed)
            raise UsageError(f"{name} is not on {index}; nearest: {', '.join(near) if near else empty}{hint}")
    return []


def _check_subject_pins(reqs: list[EnvRequest], opts: "Options", timeout: float) -> list[str]:
    """Every ``PACKAGE==VERSION`` of another subject installed from the index (FA4:
    ``flash-attn-4==4.0.0b36``; not FA3, built from a source tree) must exist on ``opts.index_url``,
    asked once per package before anything is built: UsageError naming the nearest releases (a
    new-user trial: ``flash-attn-4==99`` failed only at its env's install, after the others were
    built). One to be had here (:func:`_version_here`) needs no index; an index that cannot be asked
    only warns. Returns the warnings."""
    todo: dict[str, list[EnvRequest]] = {}
    for r in reqs:
        if not (r.is_path or r.package == subjects.DEFAULT or r.subject.tree or _version_here(r, opts)):
            todo.setdefault(r.package, []).append(r)
    out = []
    for package, rs in todo.items():
        out += _check_listed(package, [(r.version, f"--versions: {package} {r.version} ({r.label})") for r in rs],
                             lambda p=package: wheels.project_versions(p, opts.index_url, timeout=timeout),
                             opts.index_url)
    return out


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
    files: list[str] = []

    def listing() -> set[str]:
        files[:] = wheels.project_files("torch", index, timeout=timeout)
        found = wheels.file_versions(files)
        if not found:
            raise ValueError(f"{index} lists no torch file")
        return found

    warns = _check_listed("torch", [(t, f"--torch {t}: torch {t}") for t in pins], listing, index,
                          hint="" if opts.torch_index else " (a CUDA build comes from --torch-index, e.g. "
                                                           "https://download.pytorch.org/whl/cu130)")
    if not warns:
        _check_torch_wheels(pins, files, index)
    return warns


def _check_torch_wheels(pins: list[str], files: list[str], index: str, here: set | None = None) -> None:
    """UsageError for a pinned torch whose wheels on ``index`` (``files``: its file names) are all for
    another Python or platform than envs are made with (:func:`wheels.wheel_fits`; new-user trial:
    ``--torch 1.0.0`` planned fine and failed at its env's install), naming the Pythons its wheels
    are for and the nearest releases that have one for this. A pin with no wheel listed at all is
    left to the install (an index may list sdists only)."""
    import sys

    from packaging.utils import parse_wheel_filename

    whl = [f for f in files if f.endswith(".whl")]
    fits = [f for f in whl if wheels.wheel_fits(f, here)]
    for t in pins:
        mine = [f for f in whl if wheels.same_version(wheels.file_version(f) or "", t)]
        if not mine or any(f in fits for f in mine):
            continue
        pys = sorted({tag.interpreter for f in mine for tag in parse_wheel_filename(f)[3]})
        near = wheels.nearest_versions(t, sorted(wheels.file_versions(fits)))
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise UsageError(f"--torch {t}: torch {t} on {index} has no wheel for this Python ({py}) and platform (its "
                         f"wheels are for {', '.join(pys)}): nothing could install it into an env; nearest with one: "
                         f"{', '.join(near) if near else '(none listed)'}")
