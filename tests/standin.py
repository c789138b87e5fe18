"""A stand-in ``flash_attn`` package for CPU tests: same import names and ``flash_attn_func``
signature as flash-attn 2.x, computed with torch, plus a *planted* host overhead (a busy-wait of a
known number of µs in every forward call) and optional planted faults.

``make_source(dir, version, overhead_us, ...)`` writes a source tree; ``build_wheel`` and
``build_sdist`` turn it into real distributions with setuptools. The sdist's setup.py imports torch
and records the torch it was built against in ``flash_attn/_build_info.py`` (as flash-attn's
compiled extension is tied to its build-time torch).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SETUP = '''
import os
from setuptools import setup
try:
    import torch
    built_with = torch.__version__
except Exception:
    built_with = None
with open(os.path.join("flash_attn", "_build_info.py"), "w") as f:
    f.write(f"TORCH_AT_BUILD = {built_with!r}\\n")
setup(name="flash_attn", version=@VERSION@, packages=["flash_attn"], py_modules=["flash_attn_2_cuda"])
'''

INIT = '''
__version__ = @VERSION@
PLANTED_HOST_OVERHEAD_US = @OVERHEAD@
from flash_attn.flash_attn_interface import flash_attn_func
'''

EXT = '''
"""Stand-in for flash-attn's compiled extension (the real one is a CUDA .so)."""
STANDIN = True
'''

INTERFACE = '''
import os
import time

import torch
import torch.nn.functional as F

import flash_attn_2_cuda  # noqa: F401  (the real package imports its extension here too)
from flash_attn import PLANTED_HOST_OVERHEAD_US

_FAULT = @FAULT@
_FAULT_BATCH = @FAULT_BATCH@


def _spin(us):
    end = time.perf_counter_ns() + int(us * 1000)
    while time.perf_counter_ns() < end:
        pass


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q: (batch, seqlen_q, nheads, head_dim); k, v: (batch, seqlen_k, nheads_k, head_dim)."""
    if _FAULT and q.shape[0] == _FAULT_BATCH:
        if _FAULT == "crash":
            os.abort()
        if _FAULT == "hang":
            time.sleep(3600)
        if _FAULT == "raise":
            raise RuntimeError("stand-in: planted error")
    if PLANTED_HOST_OVERHEAD_US:
        _spin(PLANTED_HOST_OVERHEAD_US)
    h, hk = q.shape[2], k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    if hk != h:
        kt = kt.repeat_interleave(h // hk, dim=1)
        vt = vt.repeat_interleave(h // hk, dim=1)
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j <= i + (sk - sq)
    out = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), attn_mask=mask,
                                         dropout_p=dropout_p, scale=softmax_scale)
    return out.to(q.dtype).transpose(1, 2)
'''


def make_source(root: Path, version: str, overhead_us: float = 0.0, fault: str | None = None,
                fault_batch: int = 13) -> Path:
    """Write a stand-in source tree for ``version`` under ``root``; returns its directory."""
    d = Path(root) / f"flash_attn-{version}"
    (d / "flash_attn").mkdir(parents=True, exist_ok=True)
    subst = {"@VERSION@": repr(version), "@OVERHEAD@": repr(float(overhead_us)), "@FAULT@": repr(fault),
             "@FAULT_BATCH@": repr(fault_batch)}

    def fill(text: str) -> str:
        for k, v in subst.items():
            text = text.replace(k, v)
        return textwrap.dedent(text)

    (d / "setup.py").write_text(fill(SETUP))
    (d / "flash_attn" / "__init__.py").write_text(fill(INIT))
    (d / "flash_attn" / "flash_attn_interface.py").write_text(fill(INTERFACE))
    (d / "flash_attn_2_cuda.py").write_text(textwrap.dedent(EXT))
    return d


def build_wheel(src: Path, dest: Path) -> Path:
    """Build a wheel of the stand-in into ``dest`` with pip (no isolation, setuptools from this env)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(dest), str(src)], check=True, capture_output=True)
    return next(dest.glob("flash_attn-*.whl"))


def build_sdist(src: Path, dest: Path) -> Path:
    """Build ``flash_attn-VERSION.tar.gz`` (a real sdist, setup.py at its top) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dest)], cwd=src, check=True,
                   capture_output=True)
    return next(dest.glob("flash_attn-*.tar.gz"))
