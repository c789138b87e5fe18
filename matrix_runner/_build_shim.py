"""Source-build shim: runs flash-attn's own setup.py with a slimmed kernel list. Stdlib + torch only.

Run by the env's interpreter, from the unpacked sdist's directory::

    python _build_shim.py SETTINGS.json

SETTINGS: ``{"dist_dir": ..., "kernels": "all" | [stems], "archs": "all" | ["90", ...],
"manifest": path, "compile_cache": null | {"sccache": path, "dir": path}, "extension": name}``
(``extension``: flash_attn_2_cuda, or FA3's flash_attn_3._C, whose sources are recorded, not slimmed:
FA3 is slimmed by its own DISABLE switches, see fa3.py). The shim replaces ``torch.utils.cpp_extension.CUDAExtension`` before
setup.py imports it, so the version's own source list, flags and packaging are used unchanged,
except that

- for the ``flash_attn_2_cuda`` extension, kernel files (``flash_{fwd,fwd_split,bwd}_hdim*_*.cu``)
  not in ``kernels`` are dropped and replaced by *one* generated file,
  ``csrc/flash_attn/src/matrix_run_stubs.cu``, which defines each dropped template specialization
  with a body that throws ``std::runtime_error`` naming the kernel (pybind turns it into Python's
  RuntimeError). All stubs go into one file: one file per stub costs ~14 s of nvcc each. The stubs
  are generated from the dropped files' own text by ``stubgen.py`` (namespace, template arguments
  and signature as each file wrote them), the same generator ``matrix-run plan`` runs on the sdist.
- ``-gencode arch=compute_XX,code=sm_XX`` pairs are replaced by the requested archs.

- with ``compile_cache``, nvcc and the C++ compiler run through sccache (:func:`compiler_env`; why
  this way: ``compcache.py``). torch's own automatic ccache/sccache wrapping is always turned off
  (``TORCH_NO_COMPILER_WRAPPER=1``), so a build without the cache compiles as it always did.

It then runs ``setup.py bdist_wheel --dist-dir DIST`` and writes a manifest of what it kept.
A setting it cannot honour (a wanted kernel not in this version's list, a kernel file the stub
generator does not understand) stops the build with exit 3, before anything is compiled.
"""
from __future__ import annotations

import json
import os
import runpy
import shutil
import sys

try:  # run as a script by the env's interpreter (matrix_runner need not be importable there)
    import stubgen
except ImportError:  # imported as matrix_runner._build_shim (tests)
    from . import stubgen

KERNEL_RE = stubgen.KERNEL_RE
STUB_NAME = f"csrc/flash_attn/src/{stubgen.STUB_FILE}"
stem = stubgen.stem


def generate_stubs(dropped: list[str], version: str) -> "stubgen.Stubs":
    """Write the stub file for the dropped kernel sources (paths relative to the current directory,
    the unpacked sdist); returns what was written (``.path``, ``.specs``). Raises stubgen.StubError."""
    stubs = stubgen.generate(stubgen.DirTree("."), dropped, version)
    with open(stubs.path, "w", encoding="utf-8") as f:
        f.write(stubs.text)
    return stubs


def write_stubs(dropped: list[str], version: str) -> int:
    """:func:`generate_stubs`; returns how many specializations the stub file holds."""
    return len(generate_stubs(dropped, version).specs)


def compiler_env(sccache: str, cuda_home: str | None, bindir: str) -> dict:
    """Environment that makes torch's ninja build run nvcc and the C++ compiler through sccache:
    ``PYTORCH_NVCC`` is written verbatim as ninja's nvcc command (torch's ``_write_ninja_file``),
    ``CXX`` becomes a launcher script in ``bindir`` (a ``CXX`` with a space is shell-quoted as one
    word by torch >= 2.10). Without a CUDA_HOME only the C++ compiler is wrapped."""
    os.makedirs(bindir, exist_ok=True)
    cxx = os.environ.get("CXX", "c++")
    real = shutil.which(cxx) or cxx
    launcher = os.path.join(bindir, "sccache-c++")  # torch's compiler check runs it with -v: sccache passes that on
    with open(launcher, "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\nexec "{sccache}" "{real}" "$@"\n')
    os.chmod(launcher, 0o755)
    env = {"CXX": launcher, "TORCH_NO_COMPILER_WRAPPER": "1"}
    if cuda_home:
        env["PYTORCH_NVCC"] = f"{sccache} {os.path.join(cuda_home, 'bin', 'nvcc')}"
        # a CUDA torch adds `-MD -MF $out.d` to nvcc for ninja's header deps, "not supported by sccache"
        # per torch's own comment (sccache 0.16 caches it: checked with nvcc 13.0); a one-shot build
        # needs no header deps, so leave the flag out for older sccache versions
        env["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] = "1"
    return env


def patch_archs(flags: list[str], archs: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(flags):
        if flags[i] == "-gencode" and i + 1 < len(flags):
            i += 2
            continue
        if flags[i].startswith("-gencode=") or flags[i].startswith("--generate-code"):
            i += 1
            continue
        out.append(flags[i])
        i += 1
    for a in archs:
        out += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    return out


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        st = json.load(f)
    manifest: dict = {"kept": [], "stubbed": [], "stub_specializations": 0, "archs": st["archs"]}
    version = st.get("version", "?")

    os.environ["TORCH_NO_COMPILER_WRAPPER"] = "1"  # torch never picks a wrapper from PATH by itself
    import torch.utils.cpp_extension as ce

    cc = st.get("compile_cache")
    if cc:
        cuda_home = ce.CUDA_HOME or os.environ.get("CUDA_HOME")  # a CPU torch leaves ce.CUDA_HOME None
        wrap = compiler_env(cc["sccache"], cuda_home, os.path.join(os.path.dirname(st["manifest"]), "bin"))
        os.environ.update(wrap)
        manifest["compile_cache"] = {"sccache": cc["sccache"], "dir": cc["dir"], "env": wrap}
    orig = ce.CUDAExtension

    extension = st.get("extension") or "flash_attn_2_cuda"

    def patched(name, sources, *args, **kwargs):
        if name != extension:
            return orig(name, sources, *args, **kwargs)
        sources = [str(s) for s in sources]
        if extension != "flash_attn_2_cuda":  # FA3: setup.py's switches chose the sources; nothing to slim here
            manifest["sources"] = sources
            manifest["kept"] = [os.path.basename(s) for s in sources if "instantiations" in s]
            return orig(name, sources, *args, **kwargs)
        kern = [s for s in sources if stem(s)]
        other = [s for s in sources if not stem(s)]
        if st["kernels"] != "all":
            try:
                want, notes = stubgen.resolve_kernels(st["kernels"], [stem(s) for s in kern], version)
                keep = [s for s in kern if stem(s) in want]
                drop = [s for s in kern if stem(s) not in want]
                stubs = generate_stubs(drop, version) if drop else None
            except stubgen.StubError as e:
                print(f"matrix-run: slim build of flash-attn {version} stopped before compiling: {e}", file=sys.stderr)
                sys.exit(3)
            manifest["kernel_notes"] = notes
            manifest["stubbed"] = [stem(s) for s in drop]
            manifest["stub_specializations"] = len(stubs.specs) if stubs else 0
            sources = other + keep + ([stubs.path] if stubs else [])
            kern = keep
        manifest["kept"] = [stem(s) for s in kern]
        manifest["sources"] = sources
        if st["archs"] != "all":
            eca = kwargs.get("extra_compile_args") or {}
            if isinstance(eca, dict) and "nvcc" in eca:
                eca["nvcc"] = patch_archs(list(eca["nvcc"]), st["archs"])
                manifest["nvcc_flags"] = eca["nvcc"]
        return orig(name, sources, *args, **kwargs)

    ce.CUDAExtension = patched
    if shutil.which("git") is None:  # FA3's setup.py runs `git submodule update` unchecked: a missing git raises
        bindir = os.path.join(os.path.dirname(st["manifest"]), "bin")
        os.makedirs(bindir, exist_ok=True)
        with open(os.path.join(bindir, "git"), "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\necho 'matrix-run: no git here; nothing to update' >&2\nexit 1\n")
        os.chmod(os.path.join(bindir, "git"), 0o755)
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    sys.argv = ["setup.py", "bdist_wheel", "--dist-dir", st["dist_dir"]]
    sys.path.insert(0, os.getcwd())
    try:
        runpy.run_path("setup.py", run_name="__main__")
    finally:
        with open(st["manifest"], "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
