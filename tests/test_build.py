"""Slim-build pieces: kernel sets, head-dim dispatch, stub generation, arch flags, job sizing."""
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import urllib.error
from pathlib import Path

import pytest

from matrix_runner import _build_shim as shim
from matrix_runner import build, machine, stubgen
from matrix_runner.config import parse_config

SWITCH = """
#define HEADDIM_SWITCH(HEADDIM, ...)   \\
  [&] {                                    \\
    if (HEADDIM <= 32) {                   \\
      constexpr static int kHeadDim = 32;  \\
      return __VA_ARGS__();                \\
    } else if (HEADDIM <= 64) {            \\
      constexpr static int kHeadDim = 64;  \\
      return __VA_ARGS__();                \\
    } else if (HEADDIM <= 256) {           \\
      constexpr static int kHeadDim = 256; \\
      return __VA_ARGS__();                \\
    }                                      \\
  }()
"""


def cases(**kw):
    shape = {"batch": 2, "seqlen": 50, "nheads": 16}
    shape.update({k: v for k, v in kw.items() if k in ("head_dim", "embed_dim", "causal", "dtype")})
    top = {k: v for k, v in kw.items() if k in ("ops", "dropout_p")}
    return parse_config({**top, "shapes": [shape]}).cases


def test_default_config_needs_three_hdim32_fp16_kernels():
    from matrix_runner.config import load_config
    assert build.kernel_set(load_config(None).cases) == ["bwd_hdim32_fp16", "fwd_hdim32_fp16", "fwd_split_hdim32_fp16"]


@pytest.mark.parametrize("kw,expected", [
    ({"head_dim": 16, "ops": ["fwd"]}, ["fwd_hdim32_fp16", "fwd_split_hdim32_fp16"]),
    ({"head_dim": 60, "ops": ["fwd"]}, ["fwd_hdim64_fp16", "fwd_split_hdim64_fp16"]),
    ({"head_dim": 57, "ops": ["fwd"]}, ["fwd_hdim64_fp16", "fwd_split_hdim64_fp16"]),  # padded to 64
    ({"head_dim": 200, "ops": ["fwd"], "dtype": "bf16"}, ["fwd_hdim256_bf16", "fwd_split_hdim256_bf16"]),
    ({"head_dim": 128, "ops": ["bwd"], "causal": True}, ["bwd_hdim128_fp16_causal", "fwd_hdim128_fp16_causal",
                                                          "fwd_split_hdim128_fp16_causal"]),
    ({"head_dim": 64, "ops": ["fwd"], "dropout_p": 0.1}, ["fwd_hdim64_fp16"]),  # no split-KV with dropout
])
def test_kernel_set(kw, expected):
    assert build.kernel_set(cases(**kw)) == expected


def test_head_dim_200_goes_to_256_not_the_stale_224(tmp_path):
    # 2.6.3 / 2.7.0.post2 ship hdim224 files but dispatch 192 -> 256
    assert build.kernel_set(cases(head_dim=200, ops=["fwd"]))[0] == "fwd_hdim256_fp16"


def test_read_dispatch_from_sdist(tmp_path):
    sd = tmp_path / "flash_attn-9.9.9.tar.gz"
    with tarfile.open(sd, "w:gz") as tf:
        data = SWITCH.encode()
        ti = tarfile.TarInfo("flash_attn-9.9.9/csrc/flash_attn/src/static_switch.h")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    assert build.read_dispatch(sd) == (32, 64, 256)
    assert build.kernel_set(cases(head_dim=100, ops=["fwd"]), build.read_dispatch(sd))[0] == "fwd_hdim256_fp16"
    assert build.read_dispatch(None) == (32, 64, 96, 128, 160, 192, 256)


FLASH_H_OLD = """#pragma once
#include <cuda.h>
struct Flash_fwd_params {};
struct Flash_bwd_params {};
template<typename T, int Headdim, bool Is_causal> void run_mha_fwd_(Flash_fwd_params &params, cudaStream_t stream);
template<typename T, int Headdim, bool Is_causal> void run_mha_fwd_splitkv_dispatch(Flash_fwd_params &params, cudaStream_t stream);
template<typename T, int Headdim, bool Is_causal> void run_mha_bwd_(Flash_bwd_params &params, cudaStream_t stream);
"""
NS_CONFIG_H = "#pragma once\n#ifndef FLASH_NAMESPACE\n#define FLASH_NAMESPACE flash\n#endif\n"
FLASH_H_NS = ('#pragma once\n#include "namespace_config.h"\nnamespace FLASH_NAMESPACE {\n'
              + FLASH_H_OLD.split("#include <cuda.h>\n", 1)[1] + "}  // namespace FLASH_NAMESPACE\n")
FWD = ('#include "flash_fwd_launch_template.h"\n\ntemplate<>\nvoid run_mha_fwd_<cutlass::bfloat16_t, 64, true>'
       '(Flash_fwd_params &params, cudaStream_t stream) {\n    run_mha_fwd_hdim64<cutlass::bfloat16_t, true>(params, stream);\n}\n')
SPLIT = ('#include "flash_fwd_launch_template.h"\n\ntemplate void run_mha_fwd_splitkv_dispatch<cutlass::half_t, 32, false>'
         '(Flash_fwd_params &params, cudaStream_t stream);\n')
SRC = "csrc/flash_attn/src"


def tree(root, files: dict, flash_h=FLASH_H_OLD, extra: dict | None = None):
    """A minimal unpacked flash-attn tree under ``root``: flash.h, namespace_config.h, cutlass's
    numeric_types.h (empty) and the given kernel files (name -> text) in csrc/flash_attn/src."""
    (root / SRC).mkdir(parents=True, exist_ok=True)
    (root / "csrc/cutlass/include/cutlass").mkdir(parents=True, exist_ok=True)
    (root / "csrc/cutlass/include/cutlass/numeric_types.h").write_text("#pragma once\n")
    (root / SRC / "flash.h").write_text(flash_h)
    (root / SRC / "namespace_config.h").write_text(NS_CONFIG_H)
    for name, text in {**files, **(extra or {})}.items():
        (root / SRC / name).write_text(text)
    return [f"{SRC}/{n}" for n in files]


def test_stub_file_defines_each_dropped_specialization(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dropped = tree(tmp_path, {"flash_fwd_hdim64_bf16_causal_sm80.cu": FWD, "flash_fwd_split_hdim32_fp16_sm80.cu": SPLIT})
    n = shim.write_stubs(dropped, "2.6.3")
    text = (tmp_path / shim.STUB_NAME).read_text()
    assert n == 2
    assert "template<> void run_mha_fwd_<cutlass::bfloat16_t, 64, true>(Flash_fwd_params &params, cudaStream_t stream) {" in text
    # the explicit instantiation becomes an explicit specialization of the same template and arguments
    assert "template<> void run_mha_fwd_splitkv_dispatch<cutlass::half_t, 32, false>(Flash_fwd_params &params, cudaStream_t stream) {" in text
    assert "// flash_fwd_split_hdim32_fp16_sm80.cu:3: explicit instantiation" in text
    assert text.count("throw std::runtime_error(") == 2
    assert "flash_fwd_hdim64_bf16_causal_sm80.cu) was not compiled" in text
    assert '#include "flash.h"' in text and "#include <cutlass/numeric_types.h>" in text
    assert "namespace " not in text.split("\n#include", 1)[1] and "namespace_config.h" not in text  # the files use none


def test_stub_keeps_the_files_namespace_and_its_macro_header(tmp_path):
    """flash-attn 2.7.4+ (PR #1419): kernels inside `namespace FLASH_NAMESPACE`, a macro of namespace_config.h."""
    def wrap(t):
        head, body = t.split("\n\n", 1)
        return f'#include "namespace_config.h"\n{head}\n\nnamespace FLASH_NAMESPACE {{\n\n{body}\n}} // namespace FLASH_NAMESPACE'
    dropped = tree(tmp_path, {"flash_fwd_hdim64_bf16_causal_sm80.cu": wrap(FWD), "flash_fwd_split_hdim32_fp16_sm80.cu": wrap(SPLIT)},
                   flash_h=FLASH_H_NS)
    stubs = stubgen.generate(stubgen.DirTree(tmp_path), dropped, "2.8.3")
    assert [s.namespace for s in stubs.specs] == [("FLASH_NAMESPACE",)] * 2
    assert stubs.includes == ["<stdexcept>", '"namespace_config.h"', "<cutlass/numeric_types.h>", '"flash.h"']
    body = stubs.text.split("namespace FLASH_NAMESPACE {", 1)[1]
    assert body.count("template<> void ") == 2 and body.rstrip().endswith("}  // namespace FLASH_NAMESPACE")
    assert stubs.path == f"{SRC}/matrix_run_stubs.cu"


@pytest.mark.parametrize("name,text,flash_h,why", [
    ("flash_fwd_hdim32_fp16_sm80.cu", "#if 1\n" + FWD + "#endif\n", FLASH_H_OLD, "flash_fwd_hdim32_fp16_sm80.cu:1: preprocessor directive '#if 1' not understood"),
    ("flash_fwd_hdim32_fp16_sm80.cu", "namespace {\n" + FWD + "}\n", FLASH_H_OLD, "flash_fwd_hdim32_fp16_sm80.cu:1: an anonymous namespace not understood"),
    ("flash_fwd_hdim32_fp16_sm80.cu", "template<typename T> void f(T x) {}\n", FLASH_H_OLD, "template definition 'template<typename T>' not understood"),
    ("flash_fwd_hdim32_fp16_sm80.cu", FWD + "void helper();\n", FLASH_H_OLD, "flash_fwd_hdim32_fp16_sm80.cu:7: 'void helper();' not understood"),
    ("flash_fwd_hdim32_fp16_sm80.cu", '#include "x.h"\n', FLASH_H_OLD, "defines no template specialization"),
    ("flash_fwd_hdim32_fp16_sm80.cu", "namespace flash {\n" + FWD + "}\n", FLASH_H_OLD,
     "run_mha_fwd_ is specialized in namespace flash but csrc/flash_attn/src/flash.h declares it in (global)"),
    ("flash_fwd_hdim32_fp16_sm80.cu", FWD.replace(", 64, true>", ", 64>"), FLASH_H_OLD,
     "run_mha_fwd_<cutlass::bfloat16_t, 64> has 2 template arguments, csrc/flash_attn/src/flash.h declares 3"),
    ("flash_fwd_hdim32_fp16_sm80.cu", FWD.replace("run_mha_fwd_<", "run_mha_fwd_v2<"), FLASH_H_OLD,
     "no header in csrc/flash_attn/src declares template run_mha_fwd_v2"),
    ("flash_fwd_hdim32_fp16_sm80.cu", FWD.replace("cutlass::bfloat16_t, 64", "cute::tfloat32_t, 64"), FLASH_H_OLD,
     "template argument 'cute::tfloat32_t' (flash_fwd_hdim32_fp16_sm80.cu): no known header declares it"),
])
def test_what_the_generator_does_not_understand_fails_naming_the_file(tmp_path, name, text, flash_h, why):
    dropped = tree(tmp_path, {name: text}, flash_h=flash_h)
    with pytest.raises(stubgen.StubError) as e:
        stubgen.generate(stubgen.DirTree(tmp_path), dropped, "9.9.9")
    assert why in str(e.value)


SETUP = """
from torch.utils.cpp_extension import CUDAExtension
ext_modules = []
if os.environ.get("ROCM"):
    ext_modules.append(CUDAExtension(name="flash_attn_2_cuda", sources=renamed_sources))
else:
    ext_modules.append(CUDAExtension(
        name="flash_attn_2_cuda",
        sources=["csrc/flash_attn/flash_api.cpp", @FILES@],
        extra_compile_args={"nvcc": ["-gencode", "arch=compute_80,code=sm_80"]},
    ))
    # cc_flag.append("arch=compute_75,code=sm_75")
"""


def test_kernel_sources_come_from_setup_py_literal_list():
    files = '"csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.cu", "csrc/flash_attn/src/flash_bwd_hdim32_fp16_sm80.cu"'
    text = SETUP.replace("@FILES@", files)
    assert stubgen.kernel_sources(text) == ["csrc/flash_attn/flash_api.cpp", "csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.cu",
                                            "csrc/flash_attn/src/flash_bwd_hdim32_fp16_sm80.cu"]
    assert stubgen.arch_handling(text) == {"setup_gencode_archs": ["80"], "reads_FLASH_ATTN_CUDA_ARCHS": False}
    assert stubgen.kernel_sources("from setuptools import setup\nsetup(name='flash_attn')\n") is None  # nothing to slim
    with pytest.raises(stubgen.StubError, match="not a literal list of kernel files"):
        stubgen.kernel_sources(SETUP.replace('["csrc/flash_attn/flash_api.cpp", @FILES@]', "glob('csrc/*.cu')"))


def test_resolve_kernels_against_the_versions_list():
    old = ["fwd_hdim32_fp16", "fwd_split_hdim32_fp16", "bwd_hdim32_fp16"]  # <= 2.5.x: causal is a runtime switch
    got, notes = stubgen.resolve_kernels(["fwd_hdim32_fp16_causal", "fwd_split_hdim32_fp16_causal"], old, "2.5.9.post1")
    assert got == ["fwd_hdim32_fp16", "fwd_split_hdim32_fp16"] and len(notes) == 2
    with pytest.raises(stubgen.StubError, match=r"kernels \['fwd_hdim160_fp16'\] are not in flash-attn 2.8.3's setup.py"):
        stubgen.resolve_kernels(["fwd_hdim160_fp16"], old + ["fwd_hdim32_fp16_causal"], "2.8.3")


def test_stem_and_arch_patch():
    assert shim.stem("csrc/flash_attn/src/flash_bwd_hdim128_bf16_causal_sm80.cu") == "bwd_hdim128_bf16_causal"
    assert shim.stem("csrc/flash_attn/src/flash_fwd_split_hdim32_fp16_sm80.cu") == "fwd_split_hdim32_fp16"
    assert shim.stem("csrc/flash_attn/flash_api.cpp") is None
    flags = ["-O3", "-gencode", "arch=compute_80,code=sm_80", "--use_fast_math", "-gencode", "arch=compute_90,code=sm_90"]
    assert shim.patch_archs(flags, ["90"]) == ["-O3", "--use_fast_math", "-gencode", "arch=compute_90,code=sm_90"]


def test_jobs_bounded_by_cores_and_memory(monkeypatch):
    monkeypatch.setattr(machine, "cpu_count", lambda: 16)
    monkeypatch.setattr(machine, "mem_available_gb", lambda: 120.0)
    j = build.choose_jobs(2, 5)
    assert j["max_jobs"] == 5  # 13 jobs fit in memory, 8 per build by cores, only 5 compile units
    monkeypatch.setattr(machine, "mem_available_gb", lambda: 20.0)
    assert build.choose_jobs(2, 5)["max_jobs"] == 1  # 20 GB / 9 GB = 2 jobs shared by 2 builds


def test_estimate_slim_vs_full():
    slim = build.estimate_seconds(["bwd_hdim32_fp16", "fwd_hdim32_fp16", "fwd_split_hdim32_fp16"], 1, 5)
    # flash-attn's own build: every kernel file for sm_80 and sm_90, 8 jobs (two builds on 16 cores)
    full = build.estimate_seconds("all", 2, 8)
    assert 330 <= slim <= 370  # the fwd_split file (340 s measured) is the critical path
    assert full / slim > 10


# ---------------------------------------------------------------------------------------------
# The generator over the real sdists (PyPI ships flash-attn as an sdist only)

REAL_VERSIONS = ["2.5.9.post1", "2.6.3", "2.7.0.post2", "2.7.4.post1", "2.8.3", "2.8.3.post2"]
KEPT = ["bwd_hdim32_fp16", "fwd_hdim32_fp16", "fwd_split_hdim32_fp16"]  # the default config's kernels
SDIST_CACHE = Path(os.environ.get("MATRIX_RUN_TEST_SDISTS", "~/.cache/matrix-run/test-sdists")).expanduser()


def real_sdist(version: str) -> Path:
    """flash-attn ``version``'s sdist from PyPI (sha256-checked), cached under SDIST_CACHE/sdists so
    reruns are offline. Skips only when PyPI cannot be reached and the sdist is not cached."""
    from matrix_runner import wheels
    try:
        return wheels.fetch_sdist(version, SDIST_CACHE)
    except (urllib.error.URLError, OSError) as e:  # a version PyPI lacks is a LookupError: a failure
        pytest.skip(f"PyPI unreachable ({getattr(e, 'reason', e)}) and flash_attn-{version}.tar.gz not in {SDIST_CACHE}")


# An independent reading of the kernel files (plain regexes, not stubgen's parser): the set of
# (namespace, form, template name, template arguments, parameter list) a file defines.
_SPEC = re.compile(r"template\s*(<\s*>)?\s*void\s+(\w+)\s*<([^<>]*)>\s*\(([^()]*)\)")


def _norm(s: str) -> str:
    return re.sub(r"\s*([,&*<>])\s*", r"\1", " ".join(s.split()))


def specs_of_file(text: str) -> set[tuple]:
    text = re.sub(r"//[^\n]*", "", text)
    ns = tuple(re.findall(r"\bnamespace\s+(\w+)\s*\{", text))  # the generated files open at most one block
    return {(ns, "specialization" if m.group(1) else "instantiation", m.group(2), _norm(m.group(3)), _norm(m.group(4)))
            for m in _SPEC.finditer(text)}


def specs_of_stub(text: str) -> dict[str, set[tuple]]:
    """Stub definitions by the kernel file their comment and message name."""
    out: dict[str, set[tuple]] = {}
    ns: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if m := re.fullmatch(r"namespace (\w+) \{", line):
            ns.append(m.group(1))
        elif re.fullmatch(r"\}\s*// namespace \w+", line):
            ns.pop()
        elif line.startswith("template"):
            (fname, form), = re.findall(r"^// (\S+\.cu):\d+: explicit (\w+)$", lines[i - 1])
            m = re.fullmatch(r"template<> void (\w+)<([^<>]*)>\(([^()]*)\) \{", line)
            assert m, line
            assert lines[i + 1].startswith("    throw std::runtime_error(") and f"({fname}) was not compiled" in lines[i + 1]
            assert lines[i + 2] == "}"
            out.setdefault(fname, set()).add((tuple(ns), form, m.group(1), _norm(m.group(2)), _norm(m.group(3))))
    assert not ns
    return out


@pytest.mark.parametrize("version", REAL_VERSIONS)
def test_stubs_of_real_sdists_define_exactly_what_each_dropped_file_defined(version):
    sd = real_sdist(version)
    plan = build.slim_plan(sd, KEPT, version)
    with tarfile.open(sd) as tf:
        files = {m.name.split("/", 1)[1]: tf.extractfile(m).read().decode() for m in tf.getmembers()
                 if m.isfile() and m.name.count("/") >= 1 and (m.name.endswith("/setup.py") or "/csrc/flash_attn/src/flash_" in m.name)}
    listed = re.findall(r'"(csrc/flash_attn/src/flash_\w+\.cu)"', files["setup.py"])
    assert sorted(plan.keep + plan.drop) == sorted(listed)
    assert sorted(shim.stem(p) for p in plan.keep) == KEPT == plan.kernels
    got = specs_of_stub(plan.stubs.text)
    assert sorted(got) == sorted(p.rsplit("/", 1)[1] for p in plan.drop)
    want_total = 0
    for p in plan.drop:
        want = specs_of_file(files[p])
        assert want, p
        assert got[p.rsplit("/", 1)[1]] == want, p
        want_total += len(want)
    assert plan.stubs.text.count("throw std::runtime_error(") == want_total == len(plan.stubs.specs)
    namespaced = any('"namespace_config.h"' in files[p] for p in plan.drop)
    assert ('#include "namespace_config.h"' in plan.stubs.text) == namespaced
    print(f"{version}: {len(plan.keep)} kept, {len(plan.drop)} files stubbed, {want_total} specializations, "
          f"namespace {'FLASH_NAMESPACE' if namespaced else '(global)'}")


def _nvcc_flags(src: Path) -> list[str]:
    import torch.utils.cpp_extension as ce
    inc = [src / "csrc/flash_attn", src / "csrc/flash_attn/src", src / "csrc/cutlass/include", *map(Path, ce.include_paths())]
    return ["-std=c++17", "-w", "-c", *(f"-I{p}" for p in inc)]


def _nm(obj: Path, defined: bool) -> set[str]:
    cp = subprocess.run(["nm", "-C", "--extern-only", "--defined-only" if defined else "--undefined-only", str(obj)],
                        capture_output=True, text=True, check=True)
    return {line.split(" ", 2)[-1] if defined else line.split("U ", 1)[1]
            for line in cp.stdout.splitlines() if "run_mha_" in line}


@pytest.mark.skipif(not shutil.which("nvcc") or not shutil.which("nm"), reason="nvcc (CUDA toolkit) or nm not on PATH")
@pytest.mark.parametrize("version", ["2.6.3", "2.8.3"])
def test_real_stub_compiles_and_defines_the_symbols_callers_need(version, tmp_path):
    """nvcc compiles the stub against the version's own headers, and the stub defines exactly the
    symbols that a caller of the dropped specializations (like flash_api.cpp) links against.

    Before 2.7.4 flash.h includes ATen/cuda/CUDAGraphsUtils.cuh, which needs the CUDA build of
    torch's c10/cuda headers and cuSPARSE/cuBLAS headers: skipped where they are missing (a CPU torch)."""
    import torch.utils.cpp_extension as ce
    sd = real_sdist(version)
    plan = build.slim_plan(sd, KEPT, version)
    with tarfile.open(sd) as tf:
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(tmp_path, **kw)
    src = next(p for p in tmp_path.iterdir() if (p / "setup.py").is_file())
    flash_h = (src / "csrc/flash_attn/src/flash.h").read_text()
    if "CUDAGraphsUtils.cuh" in flash_h and not any((Path(p) / "c10/cuda/impl/cuda_cmake_macros.h").is_file()
                                                    for p in ce.include_paths()):
        pytest.skip(f"flash-attn {version}'s flash.h includes ATen/cuda/CUDAGraphsUtils.cuh, which needs a CUDA torch's "
                    "c10/cuda headers (this torch has none); the structural test covers this version")
    stub = src / plan.stubs.path
    stub.write_text(plan.stubs.text)
    # a caller written from the dropped files' own text (not from the stub): one call per specialization
    calls = [f"#include {h}" for h in plan.stubs.includes if h != "<stdexcept>"]
    for i, p in enumerate(plan.drop):
        for ns, _form, name, targs, params in specs_of_file((src / p).read_text()):
            names = [re.findall(r"\w+", x)[-1] for x in params.split(",")]
            calls += [*(f"namespace {n} {{" for n in ns),
                      f"void matrix_run_call_{i}_{name}({params.replace(',', ', ')}) {{ {name}<{targs}>({', '.join(names)}); }}",
                      *("}" for _ in ns)]
    caller = src / "csrc/flash_attn/src/matrix_run_caller.cu"
    caller.write_text("\n".join(calls) + "\n")
    procs = [subprocess.Popen(["nvcc", *_nvcc_flags(src), str(f), "-o", str(f.with_suffix(".o"))],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for f in (stub, caller)]
    for f, proc in zip((stub, caller), procs):
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, f"nvcc {f.name} failed:\n{out[-4000:]}"
    defined, needed = _nm(stub.with_suffix(".o"), True), _nm(caller.with_suffix(".o"), False)
    assert len(needed) == len(plan.stubs.specs) and defined == needed


def _sdist(path: Path, files: dict[str, str]) -> Path:
    top = path.name.removesuffix(".tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            ti = tarfile.TarInfo(f"{top}/{name}")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def test_plan_fails_the_env_when_the_generator_cannot_handle_its_sdist(tmp_path):
    """`matrix-run plan` runs the generator on the sdist: a kernel file it does not understand fails
    that env with the file and the reason, before anything is built; a real sdist plans its stubs."""
    from conftest import run_cli
    kernels = {}
    for d in (32, 64):
        kernels[f"flash_fwd_hdim{d}_fp16_sm80.cu"] = FWD.replace("cutlass::bfloat16_t, 64, true", f"cutlass::half_t, {d}, false")
        kernels[f"flash_fwd_split_hdim{d}_fp16_sm80.cu"] = SPLIT.replace(", 32,", f", {d},")
    kernels["flash_fwd_hdim64_fp16_sm80.cu"] = "#ifdef FLASHATTENTION_ENABLE_HDIM64\n" + kernels["flash_fwd_hdim64_fp16_sm80.cu"] + "#endif\n"
    files = {"setup.py": SETUP.replace("@FILES@", ", ".join(f'"{SRC}/{n}"' for n in kernels)),
             f"{SRC}/flash.h": FLASH_H_OLD, "csrc/cutlass/include/cutlass/numeric_types.h": "",
             **{f"{SRC}/{n}": t for n, t in kernels.items()}}
    bad = _sdist(tmp_path / "flash_attn-9.9.9.tar.gz", files)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ops: [fwd]\nshapes: [{batch: 2, seqlen: 50, nheads: 4, head_dim: 32}]\n")

    def plan(sd):
        cp = run_cli("plan", "--versions", str(sd), "--config", str(cfg), "--json", "--envs-dir", str(tmp_path / "envs"),
                     "--wheel-cache", str(tmp_path / "cache"), "--offline", "--build", "slim", "--archs", "90")
        return cp, json.loads(cp.stdout)[0]

    cp, item = plan(bad)
    assert cp.returncode == 3 and item["method"] == "failed", cp.stdout + cp.stderr
    assert item["error"].startswith("the slim build cannot be generated from flash_attn-9.9.9.tar.gz: flash_fwd_hdim64_fp16_sm80.cu:1: "
                                    "preprocessor directive '#ifdef FLASHATTENTION_ENABLE_HDIM64' not understood")
    cp, item = plan(real_sdist("2.8.3"))
    assert cp.returncode == 0 and item["method"] == "source-slim", cp.stdout + cp.stderr
    assert item["kernels"] == ["fwd_hdim32_fp16", "fwd_split_hdim32_fp16"]
    assert any(n.startswith("slim: 2 kernel files kept, 70 stubbed (70 specializations)") for n in item["notes"]), item["notes"]


BUILD_LOG = """running bdist_wheel
running build_ext
[1/3] /usr/local/cuda/bin/nvcc -c /tmp/w/flash_attn-2.8.3/csrc/flash_attn/src/matrix_run_stubs.cu -o stubs.o
FAILED: /tmp/w/flash_attn-2.8.3/build/temp.linux-x86_64-cpython-312/csrc/flash_attn/src/matrix_run_stubs.o
/tmp/w/flash_attn-2.8.3/csrc/flash_attn/src/matrix_run_stubs.cu(6): error: run_mha_fwd_ is not a template
  template<> void run_mha_fwd_<cutlass::half_t, 32, false>(Flash_fwd_params &params, cudaStream_t stream) {
                  ^

/tmp/w/flash_attn-2.8.3/csrc/flash_attn/src/matrix_run_stubs.cu(6): error: run_mha_fwd_ is not a template
/tmp/w/flash_attn-2.8.3/csrc/flash_attn/src/matrix_run_stubs.cu(9): catastrophic error: cannot open source file "x.h"
2 errors detected in the compilation of "/tmp/w/flash_attn-2.8.3/csrc/flash_attn/src/matrix_run_stubs.cu".
[2/3] c++ -c /tmp/w/flash_attn-2.8.3/csrc/flash_attn/flash_api.cpp
FAILED: flash_api.o
/tmp/w/flash_attn-2.8.3/csrc/flash_attn/flash_api.cpp:41:5: error: 'foo' was not declared in this scope
   41 |     foo();
      |     ^~~
/tmp/w/flash_attn-2.8.3/csrc/flash_attn/flash_api.cpp:50:1: error: expected ';' before '}' token
ninja: build stopped: subcommand failed.
""" + "".join(f"  building 'x{i}' ...\n" for i in range(190)) + """Traceback (most recent call last):
  File "/env/lib/python3.12/site-packages/torch/utils/cpp_extension.py", line 2100, in _run_ninja_build
    subprocess.run(
subprocess.CalledProcessError: Command '['ninja', '-v', '-j', '5']' returned non-zero exit status 1.
error: command '/usr/local/cuda/bin/nvcc' failed with exit code 1
RuntimeError: Error compiling objects for extension
"""


def _failing_build(tmp_path, monkeypatch, log_text: str):
    from matrix_runner import proc
    sd_root = tmp_path / "sd" / "flash_attn-2.8.3"
    sd_root.mkdir(parents=True)
    (sd_root / "setup.py").write_text("raise SystemExit(1)\n")
    sdist = tmp_path / "flash_attn-2.8.3.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(sd_root, arcname="flash_attn-2.8.3")
    log = tmp_path / "logs" / "b.log"
    log.parent.mkdir()

    def fake_run_logged(argv, *, cwd=None, env_extra=None, log=None, timeout=None):
        Path(log).write_text(log_text)
        return proc.Result(1, False, 1.0, proc.tail_of(log), log)

    monkeypatch.setattr(build, "run_logged", fake_run_logged)
    with pytest.raises(build.BuildError) as e:
        build.source_build(python=Path("/nonexistent/python"), sdist=sdist, workdir=tmp_path / "w", version="2.8.3",
                           kernels=["fwd_hdim32_fp16"], archs=["90"], jobs={"max_jobs": 1, "nvcc_threads": 1}, log=log)
    return e.value, log


def test_a_failed_build_shows_the_first_compiler_errors_not_the_traceback(tmp_path, monkeypatch):
    err, log = _failing_build(tmp_path, monkeypatch, BUILD_LOG)
    assert str(err) == ("source build of flash-attn 2.8.3 failed (exit code 1): matrix_run_stubs.cu(6): error: "
                        f"run_mha_fwd_ is not a template; log: {log}")
    assert err.tail.splitlines() == [
        "first compiler errors:",
        "matrix_run_stubs.cu(6): error: run_mha_fwd_ is not a template",
        "  template<> void run_mha_fwd_<cutlass::half_t, 32, false>(Flash_fwd_params &params, cudaStream_t stream) {",
        "                  ^",
        'matrix_run_stubs.cu(9): catastrophic error: cannot open source file "x.h"',
        "flash_api.cpp:41:5: error: 'foo' was not declared in this scope",
        "   41 |     foo();",
        "      |     ^~~",
        f"full log: {log}"]
    assert "Traceback" not in err.tail and "RuntimeError" not in err.tail


def test_a_failed_build_without_compiler_errors_shows_the_logs_tail(tmp_path, monkeypatch):
    err, log = _failing_build(tmp_path, monkeypatch, "running bdist_wheel\nerror: invalid command 'bdist_wheel'\n")
    assert str(err) == f"source build of flash-attn 2.8.3 failed (exit code 1); log: {log}"
    assert err.tail == "running bdist_wheel\nerror: invalid command 'bdist_wheel'"


FAKE_NINJA = r'''
import sys, time
def w(s):
    sys.stdout.write(s)
    sys.stdout.flush()
w("running build_ext\n")
time.sleep(0.8)
w("[1/3] /usr/local/cuda/bin/nvcc -ccbin c++ -c /w/src/foo_1.cu -o /w/build/foo_1.o -O3\n")
time.sleep(0.8)
w("[2/3] /usr/local/cuda/bin/nvcc -c /w/src/fo")  # a line the follower sees in two parts
time.sleep(0.8)
w("o_2.cu -o /w/build/foo_2.o\nfoo_2.cu(3): warning #177-D: variable declared but never referenced\n")
time.sleep(0.8)
w("[3/3] c++ -MMD -c /w/src/foo_3.cu -o /w/build/foo_3.o")  # the last line, without a newline
'''


def test_a_source_build_reports_each_finished_compile_unit_while_it_runs(tmp_path, monkeypatch):
    import sys
    import time
    from matrix_runner import proc
    sd_root = tmp_path / "sd" / "flash_attn-2.8.3"
    sd_root.mkdir(parents=True)
    (sd_root / "setup.py").write_text("raise SystemExit(1)\n")
    sdist = tmp_path / "flash_attn-2.8.3.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(sd_root, arcname="flash_attn-2.8.3")
    log = tmp_path / "logs" / "b.log"
    log.parent.mkdir()
    log.write_text("[7/9] an earlier step's line -c old.cu (before this build: not its progress)\n")
    ended = []

    def fake_run_logged(argv, *, cwd=None, env_extra=None, log=None, timeout=None):
        dist = Path(cwd).parent / "dist"
        dist.mkdir()
        (dist / "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
        res = proc.run_logged([sys.executable, "-c", FAKE_NINJA], log=log, timeout=120)
        ended.append(time.monotonic())
        return res

    monkeypatch.setattr(build, "run_logged", fake_run_logged)
    calls = []
    wheel, _ = build.source_build(python=Path("/nonexistent/python"), sdist=sdist, workdir=tmp_path / "w",
                                  version="2.8.3", kernels=["fwd_hdim32_fp16"], archs=["90"],
                                  jobs={"max_jobs": 1, "nvcc_threads": 1}, log=log,
                                  on_progress=lambda m: calls.append((m, time.monotonic())), estimate_s=350)
    assert wheel.name.endswith(".whl")
    msgs = [m for m, _ in calls]
    assert [m.split(", ")[0] for m in msgs] == ["compiling: 1/3 done (foo_1.cu just finished)",
                                                "compiling: 2/3 done (foo_2.cu just finished)",
                                                "compiling: 3/3 done (foo_3.cu just finished)"]
    assert re.fullmatch(r"compiling: 1/3 done \(foo_1\.cu just finished\), \d s of est\. 5 min 50 s", msgs[0])
    assert msgs[2].startswith("compiling: 3/3 done (foo_3.cu just finished), linking and packaging, ")
    assert calls[0][1] < ended[0]  # followed while the build ran, not read afterwards


def test_ninja_status_lines_and_progress_wording():
    line = ("[2/5] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile --dependency-output x.o.d "
            "-ccbin gcc -c /cache/build/slot-0/src/csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.cu -o x.o")
    assert build.ninja_unit(line) == (2, 5, "flash_fwd_hdim32_fp16_sm80.cu")
    assert build.ninja_unit("[5/5] c++ -shared a.o b.o -o x.so") == (5, 5, None)
    # torch's nvcc rule as it ran on the H200 (the console said "-c just finished")
    assert build.ninja_unit("[1/5] /tmp/site/bin/sccache /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile "
                            "--dependency-output /b/flash_fwd_hdim32_fp16_sm80.o.d -I/x -c -c "
                            "/s/csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.cu -o /b/flash_fwd_hdim32_fp16_sm80.o "
                            "-gencode arch=compute_90,code=sm_90") == (1, 5, "flash_fwd_hdim32_fp16_sm80.cu")
    assert build.ninja_unit("  [1/5] indented is not ninja's") is None
    assert (build.unit_message(2, 5, "flash_fwd_hdim32_fp16_sm80.cu", 190, 350)
            == "compiling: 2/5 done (flash_fwd_hdim32_fp16_sm80.cu just finished), 3 min 10 s of est. 5 min 50 s")
    assert build.unit_message(1, 5, None, 29.4, None) == "compiling: 1/5 done, 29 s"
    assert (build.unit_message(5, 5, "flash_api.cpp", 400, 350)
            == "compiling: 5/5 done (flash_api.cpp just finished), linking and packaging, 6 min 40 s, over est. 5 min 50 s")


def test_uv_retries_its_own_cache_race_once_and_nothing_else(monkeypatch, tmp_path):
    """A fresh-clone CI run failed an env on uv's interpreter-cache race ("failed to rename file
    ... No such file or directory"); the same command succeeds when run again. Other failures are
    not retried, and a second race fails."""
    from types import SimpleNamespace

    from matrix_runner.envs import venv
    from matrix_runner.errors import StageFailed
    race = ("error: Failed to query Python interpreter\n  cause: failed to rename file from "
            "/root/.cache/uv/interpreter-v5/x/.tmpAB to /root/.cache/uv/interpreter-v5/x/y.msgpack: No such file")
    for script, ok, calls in (([race, ""], True, 2), (["error: No solution found", ""], False, 1),
                              ([race, race], False, 2), ([""], True, 1)):
        seq = list(script)
        seen = []

        def fake(argv, **kw):
            seen.append(argv)
            tail = seq.pop(0)
            return SimpleNamespace(returncode=0 if not tail else 2, tail=tail)
        monkeypatch.setattr(venv, "run_logged", fake)
        monkeypatch.setattr(venv, "find_uv", lambda: "uv")
        if ok:
            venv._uv(["venv", "x"], tmp_path / "log")
        else:
            with pytest.raises(StageFailed, match="uv venv x failed"):
                venv._uv(["venv", "x"], tmp_path / "log")
        assert len(seen) == calls, (script, seen)
