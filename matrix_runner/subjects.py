"""Subjects: the attention packages matrix-run can time, one per env, named in ``--versions``.

``--versions`` items (comma list, first = baseline)::

    2.8.3                         flash-attn 2.x (built, or a wheel; the default subject)
    fa2=2.8.3                     the same, labelled
    fa2=flash-attn==2.8.3         the same, spelled as a requirement
    fa4=flash-attn-4==4.0.0b36    another subject: PACKAGE==VERSION (exact pins only), labelled fa4
    fa4=flash-attn-4[cu13]==4.0.0b36   with extras (default: the extra for the torch's CUDA major, cu13 for 13.x)
    flash-attn-4==4.0.0b36        unlabelled: the label is flash-attn-4-4.0.0b36
    fa3=flash-attn-3@PATH         FlashAttention 3 from a flash-attention checkout or archive (fa3.py)

A subject other than flash-attn is pure Python from wheels: uv resolves ``PACKAGE==VERSION`` with its
dependencies into the env (from the index, or only ``--find-links`` with ``--offline``); the torch
the env inherits is excluded from the resolution (``uv pip install --excludes``), so uv never
installs a second torch. Nothing is compiled ahead of time (FA4 JIT-compiles each kernel on its
first call for a compile key, inside the worker's set-up warm-up, never in the timed samples).

FlashAttention 3 is not on PyPI: it is built from the repository's ``hopper/`` directory, slim
through its own DISABLE switches (:mod:`matrix_runner.fa3`).

The worker (stdlib + torch + the subject's modules only) learns its env's subject from ``<env>/matrix-run-subject.json``
(:func:`marker`), written when the env is made: the module to probe and the function to time.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

DEFAULT = "flash-attn"
MARKER = "matrix-run-subject.json"


@dataclass(frozen=True)
class Subject:
    package: str        # distribution name on PyPI (normalized: lower case, dashes)
    module: str         # imported by the worker's probe; inside :data:`NAMESPACES`
    func: str           # "module:attribute" of the flash_attn_func-compatible function timed
    ext: str | None     # compiled extension module that must load from the env (None: pure Python)
    source_build: bool  # matrix-run builds it from an sdist (slim builds, compile cache)
    jit: bool           # compiles kernels on first call per compile key
    note: str = ""
    #: extra installed when none is written, by the torch's CUDA major version
    cuda_extras: dict = field(default_factory=dict, hash=False, compare=False)
    #: the module holding the other entry points (varlen, kvcache, packed; worker OPS)
    ops_module: str = "flash_attn"
    #: built from a source tree of the repository (FA3: fa3.py), not from an sdist or wheels
    tree: bool = False


SUBJECTS = {
    "flash-attn": Subject("flash-attn", "flash_attn", "flash_attn:flash_attn_func", "flash_attn_2_cuda", True, False,
                          "FlashAttention 2.x"),
    # PyPI flash-attn-4 (4.0.0b36 checked): package flash_attn.cute on nvidia-cutlass-dsl, apache-tvm-ffi,
    # quack-kernels, torch-c-dlpack-ext; flash_attn_func(q, k, v, softmax_scale=None, causal=False, ...)
    # returns (out, lse). SM90 forward and backward.
    # Its [cu13] extra adds nvidia-cutlass-dsl-libs-cu13 (uv pip compile, 2026-12-01); without it only
    # the cu12 libraries come.
    "flash-attn-4": Subject("flash-attn-4", "flash_attn.cute", "flash_attn.cute.interface:flash_attn_func", None,
                            False, True, "FlashAttention 4 (CuTe DSL, JIT)", {"13": "cu13"},
                            "flash_attn.cute.interface"),
    # The repository's hopper/ (commit 0251105a checked): distribution flash_attn_3, modules
    # flash_attn_interface (flash_attn_func(q, k, v, softmax_scale=None, causal=False, ..., num_splits=1)
    # returns out; flash_attn_varlen_func, flash_attn_with_kvcache) and flash_attn_3._C. Hopper only.
    "flash-attn-3": Subject("flash-attn-3", "flash_attn_interface", "flash_attn_interface:flash_attn_func",
                            "flash_attn_3._C", True, False, "FlashAttention 3 (Hopper), built from a source tree",
                            {}, "flash_attn_interface", True),
}

#: Top-level modules a worker may import a subject from (the worker imports nothing else besides
#: the standard library and torch).
NAMESPACES = ("flash_attn", "flash_attn_interface", "flash_attn_3")


def normalize(name: str) -> str:
    """PEP 503 name normalization (``Flash_Attn_4`` -> ``flash-attn-4``)."""
    import re
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def get(package: str) -> Subject:
    """The subject of ``package``; raises KeyError naming the known ones."""
    p = normalize(package)
    if p not in SUBJECTS:
        raise KeyError(f"{package!r} is not a known subject (known: {', '.join(SUBJECTS)})")
    return SUBJECTS[p]


#: Environment a JIT subject's worker sets (if unset) before importing it, ``{env}`` = the env dir:
#: FA4 keeps its compiled kernels on disk, so the fresh workers of later process sets (and later
#: runs) load them instead of compiling each shape again (issue #11: FLASH_ATTENTION_CUTE_DSL_CACHE_*).
JIT_ENV = {"flash-attn-4": {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
                            "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "{env}/cute-dsl-cache"}}


def marker(subject: Subject, version: str, env_dir: str = "") -> dict:
    """The env's subject record the worker reads (``<env>/matrix-run-subject.json``): the subject,
    its version and the environment its worker sets before importing it (:data:`JIT_ENV`)."""
    env = {k: v.replace("{env}", str(env_dir)) for k, v in JIT_ENV.get(subject.package, {}).items()}
    return {**asdict(subject), "version": version, "env": env}
