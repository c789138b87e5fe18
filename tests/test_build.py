"""Slim-build pieces: kernel sets, head-dim dispatch, stub generation, arch flags, job sizing."""
import io
import tarfile

import pytest

from matrix_runner import _build_shim as shim
from matrix_runner import build
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


def test_stub_file_defines_each_dropped_specialization(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "csrc/flash_attn/src").mkdir(parents=True)
    fwd = tmp_path / "csrc/flash_attn/src/flash_fwd_hdim64_bf16_causal_sm80.cu"
    fwd.write_text('#include "flash_fwd_launch_template.h"\n\ntemplate<>\nvoid run_mha_fwd_<cutlass::bfloat16_t, 64, true>'
                   '(Flash_fwd_params &params, cudaStream_t stream) {\n    run_mha_fwd_hdim64<cutlass::bfloat16_t, true>(params, stream);\n}\n')
    split = tmp_path / "csrc/flash_attn/src/flash_fwd_split_hdim32_fp16_sm80.cu"
    split.write_text('#include "flash_fwd_launch_template.h"\n\ntemplate void run_mha_fwd_splitkv_dispatch<cutlass::half_t, 32, false>'
                     '(Flash_fwd_params &params, cudaStream_t stream);\n')
    n = shim.write_stubs([str(fwd), str(split)], "2.6.3")
    text = (tmp_path / shim.STUB_NAME).read_text()
    assert n == 2
    assert "template<> void run_mha_fwd_<cutlass::bfloat16_t, 64, true>(Flash_fwd_params &params, cudaStream_t stream) {" in text
    assert "template<> void run_mha_fwd_splitkv_dispatch<cutlass::half_t, 32, false>(Flash_fwd_params &params, cudaStream_t stream) {" in text
    assert text.count("throw std::runtime_error(") == 2
    assert "flash_fwd_hdim64_bf16_causal_sm80.cu) was not compiled" in text
    assert '#include "flash.h"' in text and "#include <cutlass/numeric_types.h>" in text


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
