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
from types import SimpleNamespace

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
"""Stand-in for flash-attn's compiled extension (the real one is a CUDA .so): ``fwd`` has the
real ``flash_attn_2_cuda.fwd`` argument list (2.6/2.7: q, k, v, out, alibi_slopes, dropout_p,
softmax_scale, causal, window_size_left, window_size_right, return_softmax, gen) and returns
(out, softmax_lse, S_dmask, rng_state); only ``out`` carries data here."""
import torch
import torch.nn.functional as F

STANDIN = True


def fwd(q, k, v, out, alibi_slopes, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
        return_softmax, gen):
    o = reference(q, k, v, dropout_p, softmax_scale, causal)
    # distinct tensors: a custom op's outputs may not alias each other
    return o.contiguous(), torch.empty(0), torch.empty(0), torch.empty(0)


def reference(q, k, v, dropout_p, softmax_scale, causal):
    """q: (batch, seqlen_q, nheads, head_dim); k, v: (batch, seqlen_k, nheads_k, head_dim); computed in
    fp32 with torch's SDPA, returned in q's dtype and layout."""
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
    o = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), attn_mask=mask,
                                       dropout_p=dropout_p, scale=softmax_scale)
    return o.to(q.dtype).transpose(1, 2)
'''

INTERFACE = '''
"""Stand-in flash_attn_interface with flash-attn 2.x's layers: ``flash_attn_func`` (public) ->
``FlashAttnFunc.apply`` (autograd Function) -> ``_wrapped_flash_attn_forward`` (2.7+: the custom op
``torch.ops.flash_attn._flash_attn_forward`` made by ``torch.library.custom_op`` where torch >= 2.4;
else the Python function) -> ``_flash_attn_forward`` (Python body) -> ``flash_attn_gpu.fwd`` (the
"extension"). The planted host cost is a busy-wait in the function named @PLANT_FN@, called from
the layer @PLANT_AT@."""
import os
import time
from typing import Optional, Tuple

import torch

import flash_attn_2_cuda as flash_attn_gpu
from flash_attn import PLANTED_HOST_OVERHEAD_US

_FAULT = @FAULT@
_FAULT_BATCH = @FAULT_BATCH@
_PLANT_AT = @PLANT_AT@


def @PLANT_FN_NAME@(us):
    """The planted host cost: a busy-wait of ``us`` µs in this function's own frame."""
    end = time.perf_counter_ns() + int(us * 1000)
    while time.perf_counter_ns() < end:
        pass


def _plant(where):
    if PLANTED_HOST_OVERHEAD_US and _PLANT_AT == where:
        @PLANT_FN_NAME@(PLANTED_HOST_OVERHEAD_US)


def maybe_contiguous(x):
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


def _flash_attn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, softmax_scale: float,
                        causal: bool, window_size_left: int, window_size_right: int,
                        alibi_slopes: Optional[torch.Tensor], return_softmax: bool
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _plant("python")
    q, k, v = [maybe_contiguous(x) for x in (q, k, v)]
    out, softmax_lse, S_dmask, rng_state = flash_attn_gpu.fwd(
        q, k, v, None, alibi_slopes, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
        return_softmax, None)
    return out, softmax_lse, S_dmask, rng_state


if @CUSTOM_OP@ and hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    _flash_attn_forward = torch.library.custom_op("flash_attn::_flash_attn_forward", mutates_args=())(
        _flash_attn_forward)
    _wrapped_flash_attn_forward = torch.ops.flash_attn._flash_attn_forward
else:
    _wrapped_flash_attn_forward = _flash_attn_forward


class FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
                return_softmax):
        _plant("autograd")
        if softmax_scale is None:
            softmax_scale = q.shape[-1] ** (-0.5)
        out, softmax_lse, S_dmask, rng_state = _wrapped_flash_attn_forward(
            q, k, v, dropout_p, softmax_scale, causal, window_size[0], window_size[1], alibi_slopes,
            return_softmax and dropout_p > 0)
        if any(ctx.needs_input_grad[:3]):
            # the reference's own graph, for the backward: a backward then costs what torch's SDPA
            # backward costs (recomputing the forward in it, as flash-attn does, doubled the bwd call
            # and its noise on a loaded 2-core machine)
            with torch.enable_grad():
                qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
                ctx.ref = (qq, kk, vv, flash_attn_gpu.reference(qq, kk, vv, dropout_p, softmax_scale, causal))
        return out

    @staticmethod
    def backward(ctx, dout):
        qq, kk, vv, o = ctx.ref
        dq, dk, dv = torch.autograd.grad(o, (qq, kk, vv), dout, retain_graph=True)
        return dq, dk, dv, None, None, None, None, None, None, None


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
    _plant("public")
    return FlashAttnFunc.apply(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
                               return_attn_probs)


#: q (batch, sq, h, d), k/v (batch, sk, hk, d) -> (batch, sq, h, d), causal bottom-right: the
#: "extension"'s fp32 reference
_attn = flash_attn_gpu.reference


def _varlen(q, k, v, cu_q, cu_k, dropout_p, softmax_scale, causal):
    """q (total_q, h, d), k/v (total_k, hk, d): attention per sequence cu[i]:cu[i+1]."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    outs = [_attn(q[a:b][None], k[c:d][None], v[c:d][None], dropout_p, softmax_scale, causal)[0]
            for a, b, c, d in zip(cq[:-1], cq[1:], ck[:-1], ck[1:])]
    return torch.cat(outs, 0)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    _plant("public")
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, softmax_scale, causal)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv (batch, seqlen, 3, nheads, head_dim)."""
    _plant("public")
    q, k, v = qkv.unbind(2)
    return _attn(q, k, v, dropout_p, softmax_scale, causal)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv (batch, seqlen_k, 2, nheads_k, head_dim)."""
    _plant("public")
    k, v = kv.unbind(2)
    return _attn(q, k, v, dropout_p, softmax_scale, causal)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                     causal=False, window_size=(-1, -1), alibi_slopes=None,
                                     deterministic=False, return_attn_probs=False):
    """qkv (total, 3, nheads, head_dim)."""
    _plant("public")
    q, k, v = qkv.unbind(1)
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, dropout_p, softmax_scale, causal)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv (total_k, 2, nheads_k, head_dim)."""
    _plant("public")
    k, v = kv.unbind(1)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, softmax_scale, causal)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """q (batch, seqlen_q, h, d); k_cache/v_cache (batch, seqlen_cache, hk, d), or paged
    (num_blocks, page_block_size, hk, d) with block_table (batch, blocks per sequence); k/v new
    tokens (batch, seqlen_new, hk, d) written into the cache in place after cache_seqlens."""
    _plant("public")
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
                fault_batch: int = 13, plant_fn: str = "_spin", plant_at: str = "public",
                custom_op: bool = False, omit: tuple = ()) -> Path:
    """Write a stand-in source tree for ``version`` under ``root``; returns its directory.

    ``overhead_us``: µs of busy-wait per forward call, in a function named ``plant_fn`` (a Python
    identifier) called from the layer ``plant_at``: ``public`` (``flash_attn_func``), ``autograd``
    (``FlashAttnFunc.forward``) or ``python`` (``_flash_attn_forward``). ``custom_op``: wrap
    ``_flash_attn_forward`` with ``torch.library.custom_op`` as flash-attn 2.7+ does (where torch
    has it, >= 2.4). Every entry point of flash-attn 2.x is there (computed with torch), less those named
    in ``omit`` ("not in this version"). ValueError for an unknown ``plant_at`` or a ``plant_fn`` that is no identifier."""
    if plant_at not in ("public", "autograd", "python"):
        raise ValueError(f"plant_at {plant_at!r}: give public, autograd or python")
    if not plant_fn.isidentifier():
        raise ValueError(f"plant_fn {plant_fn!r} is not a Python identifier")
    d = Path(root) / f"flash_attn-{version}"
    (d / "flash_attn").mkdir(parents=True, exist_ok=True)
    subst = {"@VERSION@": repr(version), "@OVERHEAD@": repr(float(overhead_us)), "@FAULT@": repr(fault),
             "@FAULT_BATCH@": repr(fault_batch),
             "@PLANT_FN_NAME@": plant_fn, "@PLANT_FN@": plant_fn, "@PLANT_AT@": repr(plant_at),
             "@CUSTOM_OP@": repr(bool(custom_op)), "@OMIT@": repr(tuple(omit))}

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


#: The planted code's in-context cost (µs per call): the stand-in's flash_attn_func on CPU tensors in
#: one process, 400 paired blocks of 20 calls with the planted cost off and on (order alternated); the
#: median of the paired differences. Args: source dir, planted µs, batch, seqlen, nheads, head_dim.
_TRUTH = r"""
import statistics, sys, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
import flash_attn
from flash_attn import flash_attn_interface as fi
us = float(sys.argv[2])
b, s, h, d = map(int, sys.argv[3:7])
q = torch.randn(b, s, h, d, dtype=torch.float16)
k, v = torch.randn_like(q), torch.randn_like(q)
diffs, t = [], {}
for rep in range(int(sys.argv[7])):
    for val in ((0.0, us) if rep % 2 == 0 else (us, 0.0)):
        fi.PLANTED_HOST_OVERHEAD_US = val
        t0 = time.perf_counter_ns()
        for _ in range(20):
            flash_attn.flash_attn_func(q, k, v)
        t[val] = (time.perf_counter_ns() - t0) / 20 / 1000
    diffs.append(t[us] - t[0.0])
print(statistics.median(diffs))
"""


def in_context_us(src: Path, us: float, batch: int, seqlen: int, nheads: int, head_dim: int,
                  blocks: int = 400, cpus: set | None = None) -> float:
    """What the planted busy-wait of ``us`` µs costs inside the stand-in's forward call, measured now
    in one process by switching it off and on in alternating blocks (µs per call); ``cpus``: pinned
    to those CPUs (a run's set cores). On the 2-core CI machine a nominal 5 µs costs ~5.6-7.5 µs in
    the call, 20 µs 20.9-28.1 µs and 300 µs 330-390 µs, by the hour: a deadline busy-wait ends late
    whenever an interrupt, a steal or another task spans its deadline, so its mean cost follows the
    machine's load at the moment (2026-12-03: 20.9-21.4 µs in the self-check of 14:34 UTC,
    benchmarks/results/cpu-selfcheck-s17.txt; 22.9 µs unpinned and 23.8 µs on either core in an
    ad-hoc check half an hour later). Tests compare what a run finds with this, taken just before
    and after the run, not with the nominal."""
    import os
    import subprocess
    import sys

    cp = subprocess.run([sys.executable, "-c", _TRUTH, str(src), str(us), str(batch), str(seqlen), str(nheads),
                         str(head_dim), str(blocks)], capture_output=True, text=True, check=True,
                        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    return float(cp.stdout.strip())


# ------------------------------------------------------------------------------ FA3 / FA4 stand-ins
#: Source text of ``attention(q, k, v, softmax_scale, causal) -> (out, lse)`` for the stand-in FA3 and
#: FA4 interfaces: (batch, seqlen, heads, dim) in, computed in fp32 (GQA: k/v heads repeated; causal
#: aligned bottom-right as flash-attn does), out in q's dtype.
ATTENTION = '''
def attention(q, k, v, softmax_scale, causal):
    scale = softmax_scale or 1.0 / math.sqrt(q.shape[-1])
    qt, kt, vt = (t.transpose(1, 2).float() for t in (q, k, v))
    if kt.shape[1] != qt.shape[1]:
        rep = qt.shape[1] // kt.shape[1]
        kt, vt = kt.repeat_interleave(rep, 1), vt.repeat_interleave(rep, 1)
    s = qt @ kt.transpose(-1, -2) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq).logical_not(), float("-inf"))
    return (torch.softmax(s, -1) @ vt).transpose(1, 2).to(q.dtype), torch.logsumexp(s, -1)
'''

FA3_SETUP = '''
"""Stand-in of FlashAttention 3's hopper/setup.py: reads the same FLASH_ATTENTION_DISABLE_* switches,
writes flash_attn_config.py as the real one does, and packages flash_attn_3 + flash_attn_interface.
Refuses to run unless FLASH_ATTENTION_FORCE_BUILD=TRUE (the real one would try a download)."""
import os
from setuptools import setup
flags = {
@SWITCHES@
}
if os.getenv("FLASH_ATTENTION_FORCE_BUILD") != "TRUE":
    raise SystemExit("stand-in: FLASH_ATTENTION_FORCE_BUILD is not TRUE: the real setup.py would download a wheel")
with open("flash_attn_config.py", "w") as f:
    f.write(f"CONFIG = {{'build_flags': {flags!r}}}\\n")
with open(os.path.join("..", "README.md")) as f:  # the real one reads the repository's README
    f.read()
setup(name="flash_attn_3", version=@VERSION@, packages=["flash_attn_3"],
      py_modules=["flash_attn_interface", "flash_attn_config"])
'''

FA3_INTERFACE = '''
"""Stand-in of FA3's flash_attn_interface: flash_attn_func(q, k, v, softmax_scale=None, causal=False,
...) -> out, computed with torch; refuses, as a slim build would, what its build switches left out."""
import math
import torch
import flash_attn_3._C  # noqa: F401 - the real module imports its extension here
from flash_attn_config import CONFIG

FLAGS = CONFIG["build_flags"]


def _need(flag, what):
    if FLAGS.get("FLASHATTENTION_DISABLE_" + flag):
        raise RuntimeError(f"this FA3 build has no {what} (FLASH_ATTENTION_DISABLE_{flag})")


def round_up_headdim(d):
    for h in (64, 96, 128, 192, 256):
        if d <= h and not FLAGS.get(f"FLASHATTENTION_DISABLE_HDIM{h}"):
            return h
    return 256


def _fwd(q, k, v, softmax_scale, causal):
    h = round_up_headdim(q.shape[-1])
    _need(f"HDIM{h}", f"head dim {h} kernels")
    if q.dtype == torch.float16:
        _need("FP16", "fp16 kernels")
    return attention(q, k, v, softmax_scale, causal)[0]


class _Func(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal):
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            out = _fwd(qq, kk, vv, softmax_scale, causal)
        ctx.save_for_backward(qq, kk, vv, out)
        return out.detach()

    @staticmethod
    def backward(ctx, dout):
        _need("BACKWARD", "backward kernels")
        qq, kk, vv, out = ctx.saved_tensors
        dq, dk, dv = torch.autograd.grad(out, (qq, kk, vv), dout, retain_graph=True)
        return dq, dk, dv, None, None


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    return _Func.apply(q, k, v, softmax_scale, causal)
'''


def make_fa3_tree(root: Path, version: str = "3.0.0", cutlass: bool = True, marker: str = "") -> Path:
    """Write a stand-in flash-attention checkout holding FA3's ``hopper/`` under ``root``; returns
    the repository root. Its setup.py reads the real switch names (fa3.SWITCHES); its
    flash_attn_func refuses head dims, fp16 or backward its build left out. ``cutlass``: write
    csrc/cutlass/include/cutlass/cutlass.h (False: the submodule "not checked out"). ``marker``:
    text that changes the tree's identity."""
    from matrix_runner import fa3

    d = Path(root) / "flash-attention"
    h = d / "hopper"
    (h / "flash_attn_3").mkdir(parents=True, exist_ok=True)
    (h / "instantiations").mkdir(exist_ok=True)
    (d / "README.md").write_text("FlashAttention (stand-in)\n" + marker)
    (h / "__init__.py").write_text(f"__version__ = {version!r}\n")
    lines = "\n".join(f'    "FLASHATTENTION_DISABLE_{n}": os.getenv("FLASH_ATTENTION_DISABLE_{n}", "FALSE") == "TRUE",'
                      for n in fa3.SWITCHES)  # spelled out, as the real setup.py does (plan reads the names)
    (h / "setup.py").write_text(textwrap.dedent(FA3_SETUP).replace("@SWITCHES@", lines)
                                .replace("@VERSION@", repr(version)))
    (h / "flash_attn_interface.py").write_text(textwrap.dedent(FA3_INTERFACE) + ATTENTION)
    (h / "flash_attn_3" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (h / "flash_attn_3" / "_C.py").write_text("STANDIN = True  # the real one is the compiled extension\n")
    for f in ("flash_fwd_hdim64_bf16_sm90.cu", "flash_fwd_hdim64_fp16_sm90.cu", "flash_bwd_hdim64_bf16_sm90.cu",
              "flash_bwd_hdim64_fp16_sm90.cu", "flash_fwd_hdim128_bf16_sm90.cu"):
        (h / "instantiations" / f).write_text("// stand-in\n")
    if cutlass:
        (d / "csrc/cutlass/include/cutlass").mkdir(parents=True, exist_ok=True)
        (d / "csrc/cutlass/include/cutlass/cutlass.h").write_text("// stand-in\n")
    return d


def venv_env(root: Path, label: str, src: Path) -> SimpleNamespace:
    """An env without uv for driver-side tests: a venv over the stand-in's sources ``src``, then
    this interpreter's site dirs (torch), as ``--torch inherit`` does (a venv's
    --system-site-packages sees the base interpreter's, which lacks torch under tox or a venv).
    Returns an object with what the runner reads of an env: ``label``, ``python``, and an ok
    status whose import was checked (no torch axis)."""
    from matrix_runner import envs

    v = root / f"venv-{label}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True)
    sp = next(v.glob("lib/python*/site-packages"))
    (sp / "standin.pth").write_text("\n".join([str(src), *envs.driver_site_dirs()]) + "\n")
    return SimpleNamespace(label=label, python=str(v / "bin" / "python"), status="ok", error=None,
                           import_checked=True, axis=None)
