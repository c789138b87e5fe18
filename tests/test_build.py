"""Slim-build pieces: kernel sets, head-dim dispatch, stub generation, arch flags, job sizing."""
import io
import tarfile

import pytest

from matrix_runner import _build_shim as shim
from matrix_runner import build, stubgen
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
    monkeypatch.setattr(build.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(build, "mem_available_gb", lambda: 120.0)
    j = build.choose_jobs(2, 5)
    assert j["max_jobs"] == 5  # 13 jobs fit in memory, 8 per build by cores, only 5 compile units
    monkeypatch.setattr(build, "mem_available_gb", lambda: 20.0)
    assert build.choose_jobs(2, 5)["max_jobs"] == 1  # 20 GB / 9 GB = 2 jobs shared by 2 builds


def test_estimate_slim_vs_full():
    slim = build.estimate_seconds(["bwd_hdim32_fp16", "fwd_hdim32_fp16", "fwd_split_hdim32_fp16"], 1, 5)
    # flash-attn's own build: every kernel file for sm_80 and sm_90, 8 jobs (two builds on 16 cores)
    full = build.estimate_seconds("all", 2, 8)
    assert 330 <= slim <= 370  # the fwd_split file (340 s measured) is the critical path
    assert full / slim > 10
