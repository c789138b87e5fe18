"""Slim-build stub generator, derived from each flash-attn version's own sources. Stdlib only.

A slim build compiles only the kernel files a config needs; every other kernel file of the
``flash_attn_2_cuda`` extension is dropped and replaced by *one* generated file that defines each
template specialization the dropped files defined, with a body that throws ``std::runtime_error``.
Nothing here is a per-version table:

- the kernel file list is the ``sources=[...]`` literal of the ``CUDAExtension(name="flash_attn_2_cuda")``
  call in the version's ``setup.py`` (read with :mod:`ast`, never executed);
- each dropped file is parsed (comments, ``#include`` lines, ``namespace X { ... }`` blocks,
  ``template<> R f<A...>(P) { ... }`` explicit specializations and ``template R f<A...>(P);``
  explicit instantiations); the stub repeats its namespace wrapping, template name, template
  arguments and signature (flash-attn 2.7.4+ wraps kernels in ``namespace FLASH_NAMESPACE``);
- the header that *declares* each template (flash.h) is found among the dropped files' directory's
  headers and checked against the specialization (namespace, number of template parameters,
  parameter types); a namespace name that is a macro gets the header that ``#define``s it.

Anything else (another directive, an unknown declaration form, a template declared nowhere or in
another namespace) raises :class:`StubError` naming the file and what was not understood, so that
``matrix-run plan`` fails for that env before anything is compiled.

An explicit instantiation (``template void f<...>(...);``, the split-KV files) cannot carry a body;
its stub is an explicit specialization of the same template with the same arguments, which defines
the same symbol (without the template's definition, which would pull in the kernels).

Used by ``build.py`` on an sdist (``.tar.gz``, at plan time) and by ``_build_shim.py`` on the
unpacked tree (at build time), which is why this module imports nothing from matrix_runner.
"""
from __future__ import annotations

import ast
import json
import os
import posixpath
import re
import tarfile
from dataclasses import dataclass, field

try:  # matrix-run's error hierarchy (errors.py); the build shim also runs this file as a plain script
    from .errors import StageFailed as _Base
except ImportError:
    _Base = RuntimeError

#: Kernel source names: ``flash_{fwd,fwd_split,bwd}_hdim{D}_{fp16,bf16}[_causal]_sm{NN}.cu``.
KERNEL_RE = re.compile(r"flash_(fwd_split|fwd|bwd)_hdim(\d+)_(fp16|bf16)(_causal)?_sm\d+\.cu$")
EXTENSION = "flash_attn_2_cuda"
STUB_FILE = "matrix_run_stubs.cu"
#: Headers that declare the class-type template arguments the kernel files use, by namespace prefix.
#: The header must be in the sdist (csrc/cutlass/include); an argument of another namespace fails.
TYPE_HEADERS = {"cutlass::": ("cutlass/numeric_types.h", "csrc/cutlass/include/cutlass/numeric_types.h")}


class StubError(_Base, ValueError):
    """The generator cannot handle this version's sources; the message names the file and why."""


def stem(path: str) -> str | None:
    """``csrc/.../flash_fwd_hdim32_fp16_sm80.cu`` -> ``fwd_hdim32_fp16`` (``_causal`` kept); None if
    the name is not a kernel file's."""
    m = KERNEL_RE.search(str(path).replace("\\", "/").rsplit("/", 1)[-1])
    if not m:
        return None
    kind, hd, dt, causal = m.groups()
    return f"{kind}_hdim{hd}_{dt}{causal or ''}"


# ---------------------------------------------------------------------------------------------
# Source trees: an unpacked directory or an sdist, addressed by paths relative to its top

class DirTree:
    """Files under a directory (the unpacked sdist the shim runs in)."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)
        self.name = self.root

    def read(self, rel: str) -> str | None:
        try:
            with open(os.path.join(self.root, rel), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def exists(self, rel: str) -> bool:
        return os.path.isfile(os.path.join(self.root, rel))

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(posixpath.join(rel, n) for n in os.listdir(os.path.join(self.root, rel)))
        except OSError:
            return []


class TarTree:
    """Files of an sdist (``.tar.gz``) without unpacking it; paths drop the top directory.

    One sequential pass reads the top-level files and those under ``csrc/flash_attn/`` into memory
    (a gzip stream read out of order is decompressed again from its start); other members are only
    listed."""

    PRELOAD = ("csrc/flash_attn/",)

    def __init__(self, sdist: str | os.PathLike):
        self.name = os.path.basename(os.fspath(sdist))
        self._names: set[str] = set()
        self._text: dict[str, str] = {}
        with tarfile.open(sdist) as tf:
            for m in tf:
                parts = m.name.split("/", 1)
                if len(parts) != 2 or not m.isfile():
                    continue
                rel = posixpath.normpath(parts[1])
                self._names.add(rel)
                if ("/" not in rel or rel.startswith(self.PRELOAD)) and m.size <= 4 << 20:
                    f = tf.extractfile(m)
                    if f is not None:
                        self._text[rel] = f.read().decode("utf-8", errors="replace")

    def read(self, rel: str) -> str | None:
        return self._text.get(posixpath.normpath(rel))

    def exists(self, rel: str) -> bool:
        return posixpath.normpath(rel) in self._names

    def listdir(self, rel: str) -> list[str]:
        rel = posixpath.normpath(rel)
        return sorted(p for p in self._names if posixpath.dirname(p) == rel)


# ---------------------------------------------------------------------------------------------
# setup.py: the extension's source list and arch handling

def kernel_sources(setup_text: str, name: str = "setup.py") -> list[str] | None:
    """Sources of the ``CUDAExtension(name="flash_attn_2_cuda", sources=[...])`` call that lists
    kernel files, read from setup.py's syntax tree (not executed).

    Returns None when setup.py has no ``CUDAExtension("flash_attn_2_cuda", ...)`` call at all
    (nothing to slim: the shim would see no such extension either).
    Raises StubError when it does but no such call has a literal list with kernel files in it, or
    when several do."""
    try:
        tree = ast.parse(setup_text, filename=name)
    except SyntaxError as e:
        raise StubError(f"{name}: not parseable as Python ({e.msg}, line {e.lineno})") from None
    found, unreadable = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if fn != "CUDAExtension":
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        ext_name = kw.get("name", node.args[0] if node.args else None)
        if not (isinstance(ext_name, ast.Constant) and ext_name.value == EXTENSION):
            continue
        src = kw.get("sources", node.args[1] if len(node.args) > 1 else None)
        try:
            sources = ast.literal_eval(src) if src is not None else None
        except ValueError:
            sources = None
        if isinstance(sources, list) and all(isinstance(s, str) for s in sources):
            if any(stem(s) for s in sources):
                found.append((node.lineno, sources))
        else:
            unreadable.append(node.lineno)
    if len(found) == 1:
        return found[0][1]
    if len(found) > 1:
        raise StubError(f"{name}: {len(found)} CUDAExtension({EXTENSION!r}) calls list kernel files "
                        f"(lines {', '.join(str(n) for n, _ in found)}); cannot tell which one is built")
    if unreadable:
        raise StubError(f"{name}: the sources of CUDAExtension({EXTENSION!r}) (line(s) "
                        f"{', '.join(map(str, unreadable))}) are not a literal list of kernel files")
    return None


def arch_handling(setup_text: str) -> dict:
    """How the version's setup.py chooses CUDA archs: the ``compute_XX`` archs of its ``-gencode``
    flags (commented-out lines skipped), and whether it reads ``FLASH_ATTN_CUDA_ARCHS`` (2.7.3+)."""
    code = "\n".join(line for line in setup_text.splitlines() if not line.lstrip().startswith("#"))
    archs = sorted(set(re.findall(r"arch=compute_(\d+)", code)), key=int)
    return {"setup_gencode_archs": archs, "reads_FLASH_ATTN_CUDA_ARCHS": "FLASH_ATTN_CUDA_ARCHS" in code}


def resolve_kernels(wanted: list[str], available: list[str], version: str = "?") -> tuple[list[str], list[str]]:
    """Map the kernel stems a config needs onto this version's kernel files.

    A version whose list has no ``_causal`` files (<= 2.5.x: causal is a runtime switch inside each
    file) serves a causal stem with the file of the same kind, head dim and dtype. Returns
    ``(sorted stems, notes)``; raises StubError naming the stems the list does not have."""
    have = set(available)
    any_causal = any(s.endswith("_causal") for s in have)
    out, notes, missing = set(), [], []
    for w in wanted:
        if w in have:
            out.add(w)
        elif w.endswith("_causal") and not any_causal and w[: -len("_causal")] in have:
            out.add(w[: -len("_causal")])
            notes.append(f"{w} -> {w[:-len('_causal')]} (flash-attn {version} has no separate causal kernel files)")
        else:
            missing.append(w)
    if missing:
        raise StubError(f"kernels {missing} are not in flash-attn {version}'s setup.py source list "
                        f"(it has {len(have)} kernel files)")
    return sorted(out), notes


# ---------------------------------------------------------------------------------------------
# C++ reading: just enough for flash-attn's generated kernel files and its declaration header

_TOKEN_RE = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|[A-Za-z_]\w*|\d[\w.\']*|::|->|\S')


def strip_comments(text: str) -> str:
    """Comments replaced by spaces (newlines kept, so line numbers hold); string literals untouched."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _directives(text: str) -> tuple[list[tuple[int, str]], str]:
    """``(directives, text)``: each preprocessor line (continuations joined) with its line number,
    and the text with those lines blanked."""
    lines = text.split("\n")
    out, dirs, i = list(lines), [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("#"):
            start, full = i, lines[i]
            out[i] = ""
            while full.rstrip().endswith("\\") and i + 1 < len(lines):
                full = full.rstrip()
                i += 1
                full = full[:-1] + " " + lines[i]
                out[i] = ""
            dirs.append((start + 1, " ".join(full.split())))
        i += 1
    return dirs, "\n".join(out)


@dataclass
class _Tok:
    text: str
    start: int
    end: int
    line: int


def _tokens(text: str) -> list[_Tok]:
    toks, line, last = [], 1, 0
    for m in _TOKEN_RE.finditer(text):
        line += text.count("\n", last, m.start())
        last = m.start()
        toks.append(_Tok(m.group(), m.start(), m.end(), line))
    return toks


def _norm(s: str) -> str:
    """Whitespace-normalized C++ text: tokens joined by one space, none around ``::``, ``<``, ``>``,
    ``,``-spaced like flash-attn's own code (``cutlass::half_t, 32, false``)."""
    t = " ".join(m.group() for m in _TOKEN_RE.finditer(s))
    t = re.sub(r"\s*::\s*", "::", t)
    t = re.sub(r"\s*,\s*", ", ", t)
    t = re.sub(r"\s*([<>()])\s*", r"\1", t)
    t = re.sub(r"\s*([&*])\s*(?=\w)", r" \1", t)  # `Flash_fwd_params &params`
    return t.strip()


@dataclass(frozen=True)
class Spec:
    """One template specialization a kernel file defines (or instantiates).

    ``namespace``: enclosing namespace names as written (``("FLASH_NAMESPACE",)`` or ``()``);
    ``form``: ``"specialization"`` (``template<> ... { body }``) or ``"instantiation"``
    (``template ...;``); ``ret``, ``name``, ``targs`` (each argument normalized), ``params`` (the
    function parameter list, normalized); ``file``, ``line``: where it was read."""

    namespace: tuple[str, ...]
    form: str
    ret: str
    name: str
    targs: tuple[str, ...]
    params: str
    file: str = field(default="", compare=False)
    line: int = field(default=0, compare=False)

    @property
    def signature(self) -> str:
        return f"{self.ret} {self.name}<{', '.join(self.targs)}>({self.params})"

    @property
    def qualified(self) -> str:
        return "::".join([*self.namespace, self.name]) + f"<{', '.join(self.targs)}>"


@dataclass
class KernelFile:
    """A parsed kernel file: its ``#include`` targets (as written, with quotes or brackets) and
    the specializations it defines."""

    path: str
    includes: list[str]
    specs: list[Spec]


def _split_top(toks: list[_Tok], text: str, sep: str = ",") -> list[str]:
    """Raw source pieces of ``toks`` split at top-level ``sep`` (nesting: () <> [] {})."""
    if not toks:
        return []
    parts, depth, begin = [], 0, toks[0].start
    for t in toks:
        if t.text in "(<[{":
            depth += 1
        elif t.text in ")>]}":
            depth -= 1
        elif t.text == sep and depth == 0:
            parts.append(text[begin:t.start])
            begin = t.end
    parts.append(text[begin:toks[-1].end])
    return parts


def _match(toks: list[_Tok], i: int, open_: str, close: str, what: str, where: str) -> int:
    """Index of the token closing the ``open_`` at ``i``; StubError when it is never closed."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].text == open_:
            depth += 1
        elif toks[j].text == close:
            depth -= 1
            if depth == 0:
                return j
    raise StubError(f"{where}:{toks[i].line}: unclosed {open_!r} in {what}")


def parse_kernel_file(text: str, path: str) -> KernelFile:
    """Parse a kernel file of flash-attn's generated form (see the module doc).

    Raises StubError naming ``path``, the line and the construct when the file holds anything
    else: a directive other than ``#include``/``#pragma once``, a template definition, a
    declaration that is neither an explicit specialization nor an explicit instantiation, an
    anonymous namespace, unbalanced braces, or no specialization at all."""
    name = posixpath.basename(path)
    dirs, body = _directives(strip_comments(text))
    includes = []
    for line, d in dirs:
        m = re.fullmatch(r"#\s*include\s*(\"[^\"]+\"|<[^>]+>)", d)
        if m:
            includes.append(m.group(1))
        elif re.fullmatch(r"#\s*pragma\s+once", d):
            continue
        else:
            raise StubError(f"{name}:{line}: preprocessor directive {d!r} not understood "
                            "(only #include and #pragma once are)")
    toks = _tokens(body)
    specs: list[Spec] = []
    ns: list[tuple[str, ...]] = []  # the open namespace blocks, each with the names it opened
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.text == "namespace":
            j = i + 1
            parts = []
            while j < len(toks) and toks[j].text != "{":
                parts.append(toks[j].text)
                j += 1
            if not parts or j >= len(toks) or not all(re.fullmatch(r"[A-Za-z_]\w*|::", p) for p in parts) \
                    or parts[0] == "::" or parts[-1] == "::":
                what = "an anonymous namespace" if not parts else f"namespace {' '.join(parts)!r}"
                raise StubError(f"{name}:{t.line}: {what} not understood (a named namespace block is)")
            ns.append(tuple(p for p in parts if p != "::"))
            i = j + 1
        elif t.text == "}":
            if not ns:
                raise StubError(f"{name}:{t.line}: '}}' closes nothing")
            ns.pop()
            i += 1
        elif t.text == ";":
            i += 1
        elif t.text == "template":
            spec, i = _parse_template(toks, i, body, [n for b in ns for n in b], path)
            specs.append(spec)
        else:
            snippet = " ".join(body[t.start:toks[min(i + 8, len(toks)) - 1].end].split())
            raise StubError(f"{name}:{t.line}: {snippet!r} not understood (a kernel file may hold only "
                            "namespace blocks, explicit specializations and explicit instantiations)")
    if ns:
        raise StubError(f"{name}: namespace block not closed")
    if not specs:
        raise StubError(f"{name}: defines no template specialization (nothing to stub)")
    return KernelFile(path, includes, specs)


def _parse_template(toks: list[_Tok], i: int, text: str, ns: list[str], path: str) -> tuple[Spec, int]:
    name = posixpath.basename(path)
    line = toks[i].line
    i += 1
    if i < len(toks) and toks[i].text == "<":
        if i + 1 < len(toks) and toks[i + 1].text == ">":
            form, i = "specialization", i + 2
        else:
            close = _match(toks, i, "<", ">", "a template parameter list", name)
            raise StubError(f"{name}:{line}: template definition 'template{text[toks[i].start:toks[close].end]}' "
                            "not understood (only explicit specializations template<> and explicit "
                            "instantiations are)")
    else:
        form = "instantiation"
    j = i
    while j < len(toks) and toks[j].text not in ("<", "(", ";", "{"):
        j += 1
    if j >= len(toks) or toks[j].text != "<" or j - i < 2 or not re.fullmatch(r"[A-Za-z_]\w*", toks[j - 1].text) \
            or toks[j - 2].text == "::":
        snippet = " ".join(text[toks[i - 1].start:toks[min(j, len(toks) - 1)].end].split())
        raise StubError(f"{name}:{line}: {snippet!r} not understood (expected 'template<> RET NAME<ARGS>(PARAMS)' "
                        "or 'template RET NAME<ARGS>(PARAMS);' with an unqualified NAME)")
    ret = _norm(text[toks[i].start:toks[j - 2].end])
    fname = toks[j - 1].text
    close = _match(toks, j, "<", ">", f"{fname}'s template arguments", name)
    targs = tuple(_norm(a) for a in _split_top(toks[j + 1:close], text))
    if not targs or any(not a for a in targs):
        raise StubError(f"{name}:{line}: empty template argument in {fname}<...>")
    k = close + 1
    if k >= len(toks) or toks[k].text != "(":
        raise StubError(f"{name}:{line}: {fname}<...> is not followed by a parameter list")
    pclose = _match(toks, k, "(", ")", f"{fname}'s parameters", name)
    params = _norm(text[toks[k].end:toks[pclose].start])
    k = pclose + 1
    if form == "specialization":
        if k >= len(toks) or toks[k].text != "{":
            raise StubError(f"{name}:{line}: explicit specialization {fname}<...> has no body "
                            "(a declaration only: nothing is defined here)")
        k = _match(toks, k, "{", "}", f"{fname}'s body", name) + 1
    else:
        if k >= len(toks) or toks[k].text != ";":
            raise StubError(f"{name}:{line}: explicit instantiation of {fname}<...> not ended by ';'")
        k += 1
    return Spec(tuple(ns), form, ret, fname, targs, params, path, line), k


@dataclass(frozen=True)
class Decl:
    """A header's declaration of a function template: ``header`` (relative to the sdist top),
    ``namespace``, ``tparams`` (template parameters, normalized), ``ret``, ``params``."""

    header: str
    namespace: tuple[str, ...]
    tparams: tuple[str, ...]
    ret: str
    params: str


def _namespace_at(text: str, pos: int) -> tuple[str, ...]:
    """Names of the namespace blocks open at ``pos`` in comment- and directive-free ``text``."""
    stack: list[str | None] = []
    toks = _tokens(text[:pos])
    for idx, t in enumerate(toks):
        if t.text == "{":
            k = idx - 1
            parts = []
            while k >= 0 and re.fullmatch(r"[A-Za-z_]\w*|::", toks[k].text) and toks[k].text != "namespace":
                parts.insert(0, toks[k].text)
                k -= 1
            stack.append("::".join(p for p in parts if p != "::") if k >= 0 and toks[k].text == "namespace" else None)
        elif t.text == "}" and stack:
            stack.pop()
    return tuple(n for s in stack if s for n in s.split("::"))


def find_declarations(tree, directory: str, names: set[str]) -> tuple[dict[str, Decl], dict[str, str]]:
    """Declarations (without a body) of the function templates ``names`` in ``directory``'s
    headers, and the macros those headers ``#define`` (name -> header). A name declared in several
    headers keeps the first one (sorted by path)."""
    decls: dict[str, Decl] = {}
    macros: dict[str, str] = {}
    for rel in tree.listdir(directory):
        if not rel.endswith((".h", ".hpp", ".cuh")):
            continue
        raw = tree.read(rel) or ""
        dirs, body = _directives(strip_comments(raw))
        for _, d in dirs:
            m = re.match(r"#\s*define\s+([A-Za-z_]\w*)", d)
            if m:
                macros.setdefault(m.group(1), rel)
        for nm in names - set(decls):
            for m in re.finditer(r"\btemplate\s*<([^<>]*)>\s*([\w:\s]+?)\s+" + re.escape(nm) + r"\s*\(([^()]*)\)\s*;", body):
                tparams = tuple(_norm(p) for p in m.group(1).split(",") if p.strip())
                decls[nm] = Decl(rel, _namespace_at(body, m.start()), tparams, _norm(m.group(2)), _norm(m.group(3)))
                break
    return decls, macros


def _param_types(params: str) -> list[str]:
    """Parameter types of a normalized parameter list (names dropped)."""
    out = []
    for p in (x.strip() for x in params.split(",")):
        if p and p != "void":
            toks = _TOKEN_RE.findall(p)
            if len(toks) > 1 and re.fullmatch(r"[A-Za-z_]\w*", toks[-1]):
                toks = toks[:-1]
            out.append(" ".join(toks))
    return out


# ---------------------------------------------------------------------------------------------
# The stub file

@dataclass
class Stubs:
    """What :func:`generate` produced: ``path`` of the stub file (relative to the tree's top),
    its ``text``, the ``specs`` it defines, ``includes`` and the ``decls`` it relied on."""

    path: str
    text: str
    specs: list[Spec]
    includes: list[str]
    decls: dict[str, Decl]


def generate(tree, dropped: list[str], version: str) -> Stubs:
    """Stub file text for the ``dropped`` kernel files (paths relative to the tree's top).

    Raises StubError (naming the file and what was not understood) when a dropped file cannot be
    read or parsed, when its templates are not declared by a header of its directory with the same
    namespace, template parameter count and parameter types, or when a template argument's type
    has no known header."""
    files: list[KernelFile] = []
    for rel in dropped:
        text = tree.read(rel)
        if text is None:
            raise StubError(f"{rel}: listed in setup.py but not in {tree.name}")
        files.append(parse_kernel_file(text, rel))
    dirs = sorted({posixpath.dirname(f.path) for f in files})
    if len(dirs) > 1:
        raise StubError(f"dropped kernel files lie in several directories ({', '.join(dirs)}); "
                        "one stub file cannot use their relative includes")
    directory = dirs[0] if dirs else "csrc/flash_attn/src"
    specs = [s for f in files for s in f.specs]
    decls, macros = find_declarations(tree, directory, {s.name for s in specs})
    for s in specs:
        d = decls.get(s.name)
        where = f"{posixpath.basename(s.file)}:{s.line}"
        if d is None:
            raise StubError(f"{where}: no header in {directory} declares template {s.name} (without defining "
                            "it); the stub would need the kernels' own definition")
        if d.namespace != s.namespace:
            raise StubError(f"{where}: {s.name} is specialized in namespace {'::'.join(s.namespace) or '(global)'} "
                            f"but {d.header} declares it in {'::'.join(d.namespace) or '(global)'}")
        if len(d.tparams) != len(s.targs):
            raise StubError(f"{where}: {s.name}<{', '.join(s.targs)}> has {len(s.targs)} template arguments, "
                            f"{d.header} declares {len(d.tparams)} ({', '.join(d.tparams)})")
        if _param_types(d.params) != _param_types(s.params) or d.ret != s.ret:
            raise StubError(f"{where}: {s.signature} does not match {d.header}'s declaration "
                            f"{d.ret} {s.name}({d.params})")
    # includes: <stdexcept>, the headers defining namespace macros (as the kernel files include
    # them), the headers of class-type template arguments, then the declaring headers
    incl = ["<stdexcept>"]
    written = {inc for f in files for inc in f.includes}
    for n in dict.fromkeys(n for s in specs for n in s.namespace):
        if n in macros:
            h = posixpath.relpath(macros[n], directory)
            if f'"{h}"' not in written:
                raise StubError(f"namespace macro {n} is defined in {macros[n]}, which the kernel files do not include")
            incl.append(f'"{h}"')
        elif not re.fullmatch(r"[A-Za-z_]\w*", n):
            raise StubError(f"namespace {n!r} not understood")
    for a in dict.fromkeys(a for s in specs for a in s.targs):
        if re.fullmatch(r"-?\d+[uUlL]*|true|false", a):
            continue
        hdr = next((v for k, v in TYPE_HEADERS.items() if a.startswith(k)), None)
        if hdr is None:
            raise StubError(f"template argument {a!r} ({posixpath.basename(next(s.file for s in specs if a in s.targs))}): "
                            "no known header declares it")
        if not tree.exists(hdr[1]):
            raise StubError(f"template argument {a!r}: {hdr[1]} is not in {tree.name}")
        incl.append(f"<{hdr[0]}>")
    for d in decls.values():
        incl.append(f'"{posixpath.relpath(d.header, directory)}"')
    incl = list(dict.fromkeys(incl))
    # no version in the text: versions whose dropped files are identical get an identical stub file,
    # one compile-cache entry (compcache.py); the env that raises it names its version anyway
    lines = ["// Generated by matrix-run from this flash-attn version's own kernel files: the template",
             "// specializations of the kernel files left out of this slim build, each with its file's",
             "// namespace, template arguments and signature; calling one throws std::runtime_error.",
             *(f"#include {h}" for h in incl), ""]
    cur: tuple[str, ...] = ()
    for s in specs:
        if s.namespace != cur:
            lines += [*(f"}}  // namespace {n}" for n in reversed(cur))] + ([""] if cur else [])
            lines += [f"namespace {n} {{" for n in s.namespace] + ([""] if s.namespace else [])
            cur = s.namespace
        msg = (f"matrix-run slim build: flash-attn kernel {s.name}<{', '.join(s.targs)}> "
               f"({posixpath.basename(s.file)}) was not compiled into this build; add a shape that needs it "
               f"to the config, or rebuild with --build full")
        lines.append(f"// {posixpath.basename(s.file)}:{s.line}: explicit {s.form}")
        lines.append(f"template<> {s.ret} {s.name}<{', '.join(s.targs)}>({s.params}) {{")
        lines.append(f"    throw std::runtime_error({json.dumps(msg)});")
        lines.append("}")
        lines.append("")
    lines += [f"}}  // namespace {n}" for n in reversed(cur)]
    return Stubs(posixpath.join(directory, STUB_FILE), "\n".join(lines).rstrip("\n") + "\n", specs, incl, decls)


# ---------------------------------------------------------------------------------------------
# The whole slim plan for a version

@dataclass
class SlimPlan:
    """A slim build of one sdist: ``kernels`` (the resolved stems kept), ``keep``/``drop`` (source
    paths), ``stubs`` (None when nothing is dropped), ``notes``, ``arch`` (see :func:`arch_handling`).
    ``kernels`` is None when setup.py builds no flash_attn_2_cuda extension (nothing to slim)."""

    kernels: list[str] | None
    keep: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    stubs: Stubs | None = None
    notes: list[str] = field(default_factory=list)
    arch: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"kernels": self.kernels, "kept_files": len(self.keep), "stubbed_files": len(self.drop),
                "stub_specializations": len(self.stubs.specs) if self.stubs else 0, **self.arch}


def plan_tree(tree, kernels: list[str], version: str, sources: list[str] | None = None) -> SlimPlan:
    """Resolve ``kernels`` against the version's kernel list and generate the stubs for the rest.

    ``sources``: the extension's source list (the shim passes the one setup.py really built);
    default: read from the tree's setup.py. Raises StubError with the reason."""
    setup = tree.read("setup.py")
    if setup is None:
        raise StubError(f"{tree.name}: no setup.py at the top")
    if sources is None:
        sources = kernel_sources(setup)
    arch = arch_handling(setup)
    if sources is None:
        return SlimPlan(None, notes=[f"setup.py builds no {EXTENSION} extension: nothing to slim"], arch=arch)
    kern = [s for s in sources if stem(s)]
    stems = [stem(s) for s in kern]
    dup = sorted({s for s in stems if stems.count(s) > 1})
    if dup:
        raise StubError(f"setup.py lists kernel files of the same name twice: {dup}")
    resolved, notes = resolve_kernels(list(kernels), stems, version)
    keep = [s for s in kern if stem(s) in resolved]
    drop = [s for s in kern if stem(s) not in resolved]
    stubs = generate(tree, drop, version) if drop else None
    return SlimPlan(resolved, keep, drop, stubs, notes, arch)


def plan_sdist(sdist: str | os.PathLike, kernels: list[str], version: str) -> SlimPlan:
    """:func:`plan_tree` on an sdist (``.tar.gz``) without unpacking or building it."""
    try:
        tree = TarTree(sdist)
    except (OSError, tarfile.TarError, EOFError) as e:
        raise StubError(f"{os.path.basename(os.fspath(sdist))}: cannot be read as an sdist ({e})") from None
    return plan_tree(tree, kernels, version)
