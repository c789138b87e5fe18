"""A stand-in ``flash_attn`` package for CPU tests: same import names and ``flash_attn_func``
signature as flash-attn 2.x (and its varlen, kvcache and packed entry points), computed with torch, plus a *planted* host overhead (a busy-wait of a
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
from flash_attn import flash_attn_interface as _fi
for _n in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"):
    if hasattr(_fi, _n):
        globals()[_n] = getattr(_fi, _n)
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
    return _attn(q, k, v, dropout_p, softmax_scale, causal)


def _attn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
    """q (batch, sq, h, d), k/v (batch, sk, hk, d) -> (batch, sq, h, d); causal bottom-right."""
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


def _varlen(q, k, v, cu_q, cu_k, dropout_p, softmax_scale, causal):
    """q (total_q, h, d), k/v (total_k, hk, d): attention per sequence cu[i]:cu[i+1]."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    outs = [_attn(q[a:b][None], k[c:d][None], v[c:d][None], dropout_p, softmax_scale, causal)[0]
            for a, b, c, d in zip(cq[:-1], cq[1:], ck[:-1], ck[1:])]
    return torch.cat(outs, 0)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    if PLANTED_HOST_OVERHEAD_US:
        _spin(PLANTED_HOST_OVERHEAD_US)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, softmax_scale, causal)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv (batch, seqlen, 3, nheads, head_dim)."""
    if PLANTED_HOST_OVERHEAD_US:
        _spin(PLANTED_HOST_OVERHEAD_US)
    q, k, v = qkv.unbind(2)
    return _attn(q, k, v, dropout_p, softmax_scale, causal)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv (batch, seqlen_k, 2, nheads_k, head_dim)."""
    if PLANTED_HOST_OVERHEAD_US:
        _spin(PLANTED_HOST_OVERHEAD_US)
    k, v = kv.unbind(2)
    return _attn(q, k, v, dropout_p, softmax_scale, causal)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                     causal=False, window_size=(-1, -1), alibi_slopes=None,
                                     deterministic=False, return_attn_probs=False):
    """qkv (total, 3, nheads, head_dim)."""
    if PLANTED_HOST_OVERHEAD_US:
        _spin(PLANTED_HOST_OVERHEAD_US)
    q, k, v = qkv.unbind(1)
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, dropout_p, softmax_scale, causal)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv (total_k, 2, nheads_k, head_dim)."""
    if PLANTED_HOST_OVERHEAD_US:
        _spin(PLANTED_HOST_OVERHEAD_US)
    k, v = kv.unbind(1)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, softmax_scale, causal)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """q (batch, seqlen_q, h, d); k_cache/v_cache (batch, seqlen_cache, hk, d), or paged
    (num_blocks, page_block_size, hk, d) with block_table (batch, blocks per sequence); k/v new
    tokens (batch, seqlen_new, hk, d) written into the cache in place after cache_seqlens."""
    if PLANTED_HOST_OVERHEAD_US:
        _spin(PLANTED_HOST_OVERHEAD_US)
    b = q.shape[0]
    if cache_seqlens is None:
        lens = [k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]] * b
    elif isinstance(cache_seqlens, int):
        lens = [cache_seqlens] * b
    else:
        lens = cache_seqlens.tolist()
    outs = []
    for i in range(b):
        if block_table is not None:
            kc, vc = (c[block_table[i].long()].reshape(-1, *c.shape[2:]) for c in (k_cache, v_cache))
        else:
            kc, vc = k_cache[i], v_cache[i]
        n = lens[i]
        if k is not None:  # append in place, as flash-attn does
            kc[n:n + k.shape[1]] = k[i]
            vc[n:n + v.shape[1]] = v[i]
            if block_table is not None:  # scatter the gathered copy back into the pages
                page = k_cache.shape[1]
                for j, blk in enumerate(block_table[i].long().tolist()):
                    k_cache[blk] = kc[j * page:(j + 1) * page]
                    v_cache[blk] = vc[j * page:(j + 1) * page]
            n += k.shape[1]
        outs.append(_attn(q[i:i + 1], kc[None, :n], vc[None, :n], 0.0, softmax_scale, causal))
    return torch.cat(outs, 0)


for _n in @OMIT@:  # entry points this stand-in version lacks ("not in this version")
    del globals()[_n]
'''


def make_source(root: Path, version: str, overhead_us: float = 0.0, fault: str | None = None,
                fault_batch: int = 13, omit: tuple = ()) -> Path:
    """Write a stand-in source tree for ``version`` under ``root``; returns its directory. Every
    entry point of flash-attn 2.x is there (computed with torch), less those named in ``omit``;
    each forward call spins ``overhead_us`` µs first (the planted host cost)."""
    d = Path(root) / f"flash_attn-{version}"
    (d / "flash_attn").mkdir(parents=True, exist_ok=True)
    subst = {"@VERSION@": repr(version), "@OVERHEAD@": repr(float(overhead_us)), "@FAULT@": repr(fault),
             "@FAULT_BATCH@": repr(fault_batch),
             "@OMIT@": repr(tuple(omit))}

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
