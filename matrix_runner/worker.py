"""Stage 3 — the timing worker. Runs *inside* each env's interpreter, by path.

It imports nothing but the standard library, torch and flash_attn (it is never imported from
matrix_runner by the env; the driver runs ``<env>/bin/python .../worker.py``).

Protocol (versioned like pyperf's worker protocol; schema :data:`SERVE_SCHEMA`):

``worker.py probe``
    prints one JSON object (schema ``matrix-runner/probe/1``) describing the interpreter, torch and
    the imported flash_attn (version, file, CUDA extension file); never raises.

``worker.py serve``
    a lockstep worker driven by the driver (matrix_runner/lockstep.py): one JSON command per line on
    stdin, exactly one JSON reply per command on stdout (see :func:`serve` for the commands and
    records). A reply with ``status: error`` fails that case only.

``worker.py scout --cpus 1,2,3``
    the CPU scout of ``sampling.cpu_hop`` (run by the driver's own interpreter, standard library
    only): reads every listed CPU's speed in turn, one JSON line per sweep on stdout (:func:`scout`).

Clocks per case, all in µs per call:

- ``wall_us``: ``call(); synchronize()`` timed with ``time.perf_counter_ns``; a burst of ~B ms is
  timed as samples of ``inner`` such calls (~B/8 ms each, >= 1 call), and the burst's value is the
  median of its samples. Between samples (never inside them) :func:`speed_probe` reads the CPU's
  speed of the moment; the reply also gives the burst's value at the driver's reference speed
  (:func:`speed_adjusted`, ``adj_us``) and the sums the driver's slope needs.
- ``host_us``: the time until the call returns, without synchronizing; the device is synchronized
  *before* each timed call (outside the timing) so the launch queue is empty: host dispatch overhead.
- ``device_us`` (CUDA only): the summed GPU time of every kernel/memset/memcpy the call launched, from
  ``torch.profiler`` (CUPTI); one sample per profiled call; kernel names are kept.
- ``graph_us`` (CUDA only): the call captured ``inner`` times in a CUDA graph (a power of two from
  the GPU time: :func:`graph_inner`), replayed and timed with CUDA events after a GPU-side hold, so
  the host's launch is outside them (:meth:`Bench.graph`): the GPU floor without host overhead.

Inputs are rotated over several sets when one set is smaller than twice the GPU's L2, so the timed
calls do not all hit a warm L2.

The call timed is the case's entry point (``func``): :data:`OPS` is the builder table (inputs,
keyword arguments filtered by the installed signature, fp32 reference per sequence); an entry point
or argument the version lacks fails the case with error_kind ``not-in-version``.
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import statistics
import sys
import time
import traceback

PROBE_SCHEMA = "matrix-runner/probe/1"

#: Per case and worker: seconds of warm-up at set-up (calibrates the burst's calls per sample),
#: profiled calls of the device pass, seconds of CUDA-graph replays.
BUDGETS = {"setup_warmup": 0.02, "device_calls": 8, "graph": 0.015}
#: Target µs of one CUDA-graph replay sample.
TARGET_SAMPLE_US = 1000.0
#: Most calls captured in one CUDA graph (worker.Bench.graph).
GRAPH_INNER_MAX = 64
#: Fewest samples of the CUDA-graph clock.
MIN_SAMPLES = 5
#: The CUDA-graph clock's GPU-side hold before its start event (µs, at least): the stream spins on
#: the GPU (``torch.cuda._sleep``) while the host submits the start event, the replay and the end
#: event, so the events bracket the graph's GPU work and not the host's launch of it (H200, batch 2:
#: without the hold 89 of 1,260 set medians read 1.5-5.9x the kernel time, the slow launches of some
#: worker processes; benchmarks/graph_clock_modes.py). Raised to 4x the replay's host launch time
#: measured in the process; a sample whose submission outlasted its hold is dropped.
GRAPH_HOLD_US = 100.0
#: Most µs of the hold (a process whose launch is slower than a quarter of this is not made to wait more).
GRAPH_HOLD_MAX_US = 5000.0
_SLEEP_CYCLES_PER_US: list = []  # torch.cuda._sleep's GPU clock cycles per µs, measured once per process


def graph_inner(one_call_us: float) -> int:
    """Calls per CUDA-graph replay for a call whose one-call graph replay takes ``one_call_us`` µs
    of GPU time: the power of two that makes a replay ~:data:`TARGET_SAMPLE_US` µs or more (at
    most :data:`GRAPH_INNER_MAX`; 1 for a call of TARGET_SAMPLE_US or more). A power of two, so
    processes whose one-call readings differ by a little pick the same number."""
    if not one_call_us > 0:
        return GRAPH_INNER_MAX
    want = TARGET_SAMPLE_US / one_call_us
    if want <= 1:
        return 1
    return min(GRAPH_INNER_MAX, 2 ** math.ceil(math.log2(want)))


def _sleep_cycles_per_us(torch) -> float:
    """GPU cycles of ``torch.cuda._sleep`` per µs on this device: timed once with CUDA events over a
    1,000,000-cycle spin (the SM clock, ~1.98 GHz on the H200: ~2,000 per µs)."""
    if not _SLEEP_CYCLES_PER_US:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)  # a first spin (module load)
        e0.record()
        torch.cuda._sleep(1_000_000)
        e1.record()
        e1.synchronize()
        _SLEEP_CYCLES_PER_US.append(1_000_000 / max(e0.elapsed_time(e1) * 1e3, 1e-3))
    return _SLEEP_CYCLES_PER_US[0]


#: ``<env>/matrix-run-subject.json`` (written by the env builder, matrix_runner/subjects.py): which
#: package of the flash_attn namespace this env times; absent = flash-attn 2.x.
SUBJECT_MARKER = "matrix-run-subject.json"
#: Top-level modules a subject may be imported from (the same as matrix_runner.subjects.NAMESPACES;
#: a test keeps them equal): FA2/FA4 ``flash_attn``, FA3 ``flash_attn_interface`` + ``flash_attn_3``.
NAMESPACES = ("flash_attn", "flash_attn_interface", "flash_attn_3")


def subject() -> dict:
    """This env's subject: ``{package, module, func ("module:attr"), ext}``; flash-attn 2.x by default."""
    try:
        with open(os.path.join(sys.prefix, SUBJECT_MARKER), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"package": "flash-attn", "module": "flash_attn", "func": "flash_attn:flash_attn_func",
                "ext": "flash_attn_2_cuda"}


def attention_func():
    """The function timed in this env (``flash_attn.flash_attn_func``, or the subject's, e.g. FA4's
    ``flash_attn.cute.interface.flash_attn_func``, which returns ``(out, lse)``)."""
    import importlib

    sub = subject()
    for k, v in (sub.get("env") or {}).items():  # e.g. FA4's kernel disk cache (subjects.JIT_ENV)
        os.environ.setdefault(k, v)
    mod, _, attr = sub["func"].partition(":")
    if mod.split(".")[0] not in NAMESPACES:
        raise RuntimeError(f"subject function {mod}:{attr} is outside {', '.join(NAMESPACES)}")
    return getattr(importlib.import_module(mod), attr)


def probe() -> dict:
    """Describe this interpreter, its torch and its flash_attn; errors are reported, never raised."""
    info: dict = {
        "schema": PROBE_SCHEMA,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "prefix": sys.prefix,
        "torch": None,
        "flash_attn": None,
        "error": None,
    }
    try:
        import torch

        info["torch"] = {
            "version": torch.__version__,
            "file": torch.__file__,
            "cuda": torch.version.cuda,
            "cxx11abi": bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False)),
            "cuda_available": bool(torch.cuda.is_available()),
        }
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info["torch"]["gpu"] = {
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "sm_count": p.multi_processor_count,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "l2_bytes": getattr(p, "L2_cache_size", None),
            }
    except Exception as e:  # noqa: BLE001 - reported to the driver
        info["error"] = f"import torch failed: {type(e).__name__}: {e}"
        return info
    sub = subject()
    if sub["package"] != "flash-attn":  # another subject (FA4: pure Python; FA3: its own extension)
        try:
            import importlib
            import importlib.metadata

            func = attention_func()  # sets the subject's environment before the first import
            m = importlib.import_module(sub["module"])
            ext = importlib.import_module(sub["ext"]) if sub.get("ext") else None  # FA3: flash_attn_3._C
            fa = {"version": importlib.metadata.version(sub["package"]), "file": getattr(m, "__file__", None),
                  "ext_file": getattr(ext, "__file__", None), "subject": sub["package"]}
            info["flash_attn"] = fa
            fa["func_params"] = list(inspect.signature(func).parameters)
        except Exception as e:  # noqa: BLE001
            info["error"] = f"import {sub['module']} failed: {type(e).__name__}: {e}"
        return info
    try:
        import flash_attn

        fa = {"version": getattr(flash_attn, "__version__", None), "file": flash_attn.__file__, "ext_file": None}
        info["flash_attn"] = fa
        import flash_attn_2_cuda  # the CUDA extension (the stand-in ships a module of that name)

        fa["ext_file"] = getattr(flash_attn_2_cuda, "__file__", None)
        from flash_attn import flash_attn_func

        fa["func_params"] = list(inspect.signature(flash_attn_func).parameters)
        # the entry points of OPS this version has (a missing one fails its cases: not-in-version)
        fa["entry_points"] = [o.fn for o in OPS.values() if hasattr(flash_attn, o.fn)]
    except Exception as e:  # noqa: BLE001
        info["error"] = f"import flash_attn failed: {type(e).__name__}: {e}"
    return info

class NotInVersion(RuntimeError):
    """The installed flash_attn lacks the entry point, or an argument, that a case needs: the case
    is reported as "not in this version" (error_kind ``not-in-version``), the worker goes on."""


def _flash_fn(name: str):
    """``flash_attn.<name>`` (or from ``flash_attn.flash_attn_interface``), or from the subject's
    ``ops_module`` (FA3: ``flash_attn_interface``); NotInVersion if absent."""
    import importlib

    sub = subject()
    ops = sub.get("ops_module") or "flash_attn"
    if ops != "flash_attn" and ops.split(".")[0] in NAMESPACES:
        m = importlib.import_module(ops)
        fn = getattr(m, name, None)
        if fn is None:
            raise NotInVersion(f"{sub.get('package')} {sub.get('version', '?')} has no {name}: not in this version")
        return fn
    import flash_attn

    fn = getattr(flash_attn, name, None)
    if fn is None:
        try:
            from flash_attn import flash_attn_interface

            fn = getattr(flash_attn_interface, name, None)
        except ImportError:
            fn = None
    if fn is None:
        raise NotInVersion(f"flash_attn {getattr(flash_attn, '__version__', '?')} has no {name}: not in this version")
    return fn


def _require(name: str, params, needed) -> None:
    """NotInVersion naming the arguments of ``needed`` that the signature ``params`` lacks."""
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [k for k in needed if k not in params]
    if missing:
        import flash_attn

        raise NotInVersion(f"{name} of flash_attn {getattr(flash_attn, '__version__', '?')} has no argument "
                           f"{', '.join(missing)}: not in this version")


def _cu(torch, lens, dev):
    """cu_seqlens: int32 (len(lens) + 1,) cumulative token offsets [0, l0, l0+l1, ...]."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=dev), out


def _segments(cu, *ts):
    """Per sequence, the rows cu[i]:cu[i+1] of each (total, ...) tensor in ``ts``."""
    return [tuple(t[a:b] for t in ts) for a, b in zip(cu[:-1], cu[1:])]


def _make_dense(case, mk, g, dev, packed=None):
    import torch  # noqa: F401

    b, sq, sk = case["batch"], case["seqlen_q"], case["seqlen_k"]
    h, hk, d = case["nheads"], case["nheads_k"], case["head_dim"]
    if packed == "qkv":
        return [mk(b, sq, 3, h, d)], {}
    return [mk(b, sq, h, d), mk(b, sk, 2, hk, d)], {}


def _make_varlen(case, mk, g, dev, packed=None):
    import torch

    h, hk, d = case["nheads"], case["nheads_k"], case["head_dim"]
    lens = case["seqlens"]
    tot = sum(lens)
    cu, cu_list = _cu(torch, lens, dev)
    aux = {"cu": cu, "cu_list": cu_list, "max": max(lens)}
    if packed == "qkv":
        return [mk(tot, 3, h, d)], aux
    if packed == "kv":
        return [mk(tot, h, d), mk(tot, 2, hk, d)], aux
    return [mk(tot, h, d), mk(tot, hk, d), mk(tot, hk, d)], aux


def _make_kvcache(case, mk, g, dev, packed=None):
    """q (batch, seqlen_q, nheads, head_dim); k_cache/v_cache (batch, seqlen_k, nheads_k, head_dim),
    or paged (batch * ceil(seqlen_k / page), page, nheads_k, head_dim) with a block_table (batch,
    ceil(seqlen_k / page)) int32 of a random permutation of the blocks (scattered pages);
    cache_seqlens int32 (batch,) or None; k/v (batch, seqlen_q, nheads_k, head_dim) when appending."""
    import torch

    b, sq, sk = case["batch"], case["seqlen_q"], case["seqlen_k"]
    h, hk, d = case["nheads"], case["nheads_k"], case["head_dim"]
    page = case.get("page_block_size")
    aux: dict = {"block_table": None}
    if page:
        nblk = -(-sk // page)
        aux["k_cache"], aux["v_cache"] = mk(b * nblk, page, hk, d), mk(b * nblk, page, hk, d)
        perm = torch.randperm(b * nblk, generator=g, device=dev)
        aux["block_table"] = perm.view(b, nblk).to(torch.int32)
    else:
        aux["k_cache"], aux["v_cache"] = mk(b, sk, hk, d), mk(b, sk, hk, d)
    cs = case.get("cache_seqlens")
    aux["cache_seqlens"] = None if cs is None else torch.tensor(list(cs), dtype=torch.int32, device=dev)
    aux["cache_list"] = list(cs) if cs is not None else [sk] * b
    aux["k"] = aux["v"] = None
    if case.get("append_kv"):
        aux["k"], aux["v"] = mk(b, sq, hk, d), mk(b, sq, hk, d)
    return [mk(b, sq, h, d)], aux


def _kvcache_args(L, a):
    out = {"q": L[0], "k_cache": a["k_cache"], "v_cache": a["v_cache"]}
    for k in ("k", "v", "cache_seqlens", "block_table"):
        if a[k] is not None:
            out[k] = a[k]
    return out


def _kvcache_dense(L, a):
    """Per batch entry: q, and the keys/values attended (the cache's first cache_seqlens[i]
    tokens, gathered through the block_table when paged, then the appended k/v)."""
    import torch

    q = L[0]
    out = []
    kc, vc, bt = a["k_cache"], a["v_cache"], a["block_table"]
    for i, n in enumerate(a["cache_list"]):
        if bt is not None:
            ki, vi = (c[bt[i].long()].reshape(-1, *c.shape[2:]) for c in (kc, vc))
        else:
            ki, vi = kc[i], vc[i]
        ki, vi = ki[:n].float(), vi[:n].float()
        if a["k"] is not None:
            ki, vi = torch.cat([ki, a["k"][i].float()]), torch.cat([vi, a["v"][i].float()])
        out.append((q[i], ki, vi))
    return out


class _Op:
    """One entry point: ``fn`` (flash_attn function name); ``make(case, mk, gen, device) ->
    (leaves, aux)``: a new input set (leaves: the tensors a backward differentiates; aux: the
    call's other inputs); ``args(leaves, aux)``: the call's inputs by keyword; ``dense(leaves,
    aux)``: per sequence (q (sq, h, d), k (sk, hk, d), v) for the fp32 reference; ``out``: the
    output's layout, "batched" (batch, seqlen_q, h, d) or "varlen" (total, h, d)."""

    def __init__(self, name, fn, leaves, make, args, dense, out="batched", bwd=True, dropout=True):
        self.name, self.fn, self.leaves, self.make, self.args, self.dense = name, fn, leaves, make, args, dense
        self.out, self.bwd, self.dropout = out, bwd, dropout


def _vl(a):
    return {"cu_seqlens_q": a["cu"], "cu_seqlens_k": a["cu"], "max_seqlen_q": a["max"], "max_seqlen_k": a["max"]}


#: The builder table: func (flash_attn_func, built by Bench._init_func) and every other entry point.
OPS = {o.name: o for o in (
    _Op("func", "flash_attn_func", ("q", "k", "v"), None, None, None),
    _Op("varlen", "flash_attn_varlen_func", ("q", "k", "v"),
        _make_varlen, lambda L, a: {"q": L[0], "k": L[1], "v": L[2], **_vl(a)},
        lambda L, a: _segments(a["cu_list"], *L), out="varlen"),
    _Op("qkvpacked", "flash_attn_qkvpacked_func", ("qkv",),
        lambda *x: _make_dense(*x, packed="qkv"), lambda L, a: {"qkv": L[0]},
        lambda L, a: list(zip(*L[0].unbind(2)))),
    _Op("kvpacked", "flash_attn_kvpacked_func", ("q", "kv"),
        lambda *x: _make_dense(*x, packed="kv"), lambda L, a: {"q": L[0], "kv": L[1]},
        lambda L, a: list(zip(L[0], *L[1].unbind(2)))),
    _Op("varlen_qkvpacked", "flash_attn_varlen_qkvpacked_func", ("qkv",),
        lambda *x: _make_varlen(*x, packed="qkv"),
        lambda L, a: {"qkv": L[0], "cu_seqlens": a["cu"], "max_seqlen": a["max"]},
        lambda L, a: _segments(a["cu_list"], *L[0].unbind(1)), out="varlen"),
    _Op("varlen_kvpacked", "flash_attn_varlen_kvpacked_func", ("q", "kv"),
        lambda *x: _make_varlen(*x, packed="kv"), lambda L, a: {"q": L[0], "kv": L[1], **_vl(a)},
        lambda L, a: _segments(a["cu_list"], L[0], *L[1].unbind(1)), out="varlen"),
    _Op("kvcache", "flash_attn_with_kvcache", ("q",), _make_kvcache, _kvcache_args, _kvcache_dense,
        bwd=False, dropout=False),
)}


def _ref_attn(q, k, v, scale: float, causal: bool):
    """fp32 attention of one sequence: q (sq, h, d), k and v (sk, hk, d) -> (sq, h, d); GQA by
    repeating k/v heads; the causal mask aligned to the bottom-right corner (flash-attn >= 2.1)."""
    h, hk = q.shape[1], k.shape[1]
    qf, kf, vf = q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1)
    if hk != h:
        kf, vf = kf.repeat_interleave(h // hk, dim=0), vf.repeat_interleave(h // hk, dim=0)
    scores = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        return (_causal_softmax(scores, sq, sk) @ vf).transpose(0, 1)
    return (scores.softmax(-1) @ vf).transpose(0, 1)


def _causal_softmax(scores, sq: int, sk: int):
    """softmax over the last dim of ``scores`` (..., sq, sk) under the causal mask aligned to the
    bottom-right corner (flash-attn >= 2.1). A query row with no key left (seqlen_q > seqlen_k: the
    first sq - sk rows) gets all-zero weights, so its output is 0 as flash-attn's is ("if the row of
    the mask is all zero, the output will be zero", flash_attn_func's docstring), and no NaN reaches
    the reference (a -inf row's softmax is NaN: the check had read its NaN error as 0.0, new-user trial)."""
    import torch

    i = torch.arange(sq, device=scores.device)[:, None]
    j = torch.arange(sk, device=scores.device)[None, :]
    masked = j > i + (sk - sq)
    empty = masked.all(-1, keepdim=True)  # (sq, 1): rows with no key
    p = scores.masked_fill(masked & ~empty, float("-inf")).masked_fill(empty, 0.0).softmax(-1)
    return p.masked_fill(empty, 0.0)


class Bench:
    """Builds the timed call for one case and measures each clock. All times in µs per call."""

    def __init__(self, case: dict, device: str, seed: int):
        import torch

        self.subject_func = attention_func()  # flash_attn_func, or the subject's (FA4)
        self.torch = torch
        self.case = case
        self.cuda = device == "cuda"
        self.dev = torch.device(device)
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[case["dtype"]]
        g = torch.Generator(device=self.dev).manual_seed(seed)
        set_bytes = _set_bytes(case)
        l2 = 50 * 2**20
        if self.cuda:
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", l2) or l2
        nsets = 1 if not self.cuda else max(1, min(8, math.ceil(2 * l2 / max(set_bytes, 1))))
        self.nsets = nsets

        def mk(*shape):
            return torch.randn(*shape, generator=g, device=self.dev, dtype=torch.float32).to(self.dtype)

        #: per input set: its leaves (the tensors a backward differentiates), then for bwd the
        #: forward's output and the incoming gradient; ``aux``: the call's other inputs per set
        self.sets: list = []
        self.aux: list = [{} for _ in range(nsets)]
        self.nleaves = 3
        self.op = OPS.get(case.get("func", "func"))
        if self.op is None:
            raise ValueError(f"unknown func {case.get('func')!r}; this worker knows {', '.join(['func', *OPS])}")
        if self.op.name == "func":
            self._init_func(mk, g)
        else:
            self._init_op(mk, g)
        self.i = 0

    def _init_func(self, mk, g):
        """flash_attn_func (and its sdpa / torch.compile variants) on (batch, seqlen, ...) inputs."""
        torch, case, nsets = self.torch, self.case, self.nsets
        flash_attn_func = self.subject_func

        b, sq, sk = case["batch"], case["seqlen_q"], case["seqlen_k"]
        h, hk, d = case["nheads"], case["nheads_k"], case["head_dim"]
        params = inspect.signature(flash_attn_func).parameters
        kw = {"dropout_p": case["dropout_p"], "softmax_scale": case["softmax_scale"], "causal": case["causal"]}
        # Keyword arguments only, filtered by the installed version's signature (window_size,
        # softcap, alibi_slopes, deterministic appeared over 2.x); defaults are left to the version.
        self.kwargs = {k: v for k, v in kw.items() if k in params}
        if case["dropout_p"] and "dropout_p" not in params:
            raise NotInVersion("flash_attn_func of this version has no dropout_p argument: not in this version")
        embed = case.get("layout", "embed") == "embed"
        for _ in range(nsets):
            if embed:
                xq, xk, xv = mk(b, sq, h * d), mk(b, sk, hk * d), mk(b, sk, hk * d)
            else:
                xq, xk, xv = mk(b, sq, h, d), mk(b, sk, hk, d), mk(b, sk, hk, d)
            self.sets.append([xq, xk, xv])
        kwargs = self.kwargs
        impl = case.get("impl", "flash_attn")
        if impl == "sdpa":
            import torch.nn.functional as F

            causal, scale, rep = case["causal"], case["softmax_scale"], h // hk
            mask = None
            if causal:  # bottom-right aligned, as flash-attn >= 2.1
                mask = (torch.arange(sk, device=self.dev)[None, :]
                        <= torch.arange(sq, device=self.dev)[:, None] + (sk - sq))

            def fa(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
                qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                if rep > 1:
                    kt, vt = kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1)
                o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, dropout_p=dropout_p, scale=scale)
                return o.transpose(1, 2)

            kwargs = {"dropout_p": case["dropout_p"]}
            self.kwargs = kwargs
        elif impl == "flash_attn+compile":
            fa = torch.compile(flash_attn_func)
        else:
            fa = flash_attn_func
        self.fa = fa
        self.first_call_ms = None

        def split(xq, xk, xv):
            # the split into heads is part of the timed call (a view, as in the user's model code)
            return xq.view(b, sq, h, d), xk.view(b, sk, hk, d), xv.view(b, sk, hk, d)

        self.split = split
        if case["op"] == "fwd":
            self.calls = [(lambda s=s: fa(*split(*s), **kwargs)) for s in self.sets]
        else:
            self.calls = []
            for s in self.sets:
                for t in s:
                    t.requires_grad_(True)
                out = fa(*split(*s), **kwargs)
                if isinstance(out, tuple):
                    out = out[0]
                grad = torch.randn(out.shape, generator=g, device=self.dev, dtype=torch.float32).to(self.dtype)
                s.extend([out, grad])
                self.calls.append(
                    lambda s=s: torch.autograd.grad(s[3], (s[0], s[1], s[2]), s[4], retain_graph=True))

    def _init_op(self, mk, g):
        """Every other entry point (:data:`OPS`): its inputs from the op's builder, every argument
        by keyword, filtered by the installed function's signature (an argument the case needs
        that the version lacks -> :class:`NotInVersion`)."""
        torch, case, op = self.torch, self.case, self.op
        fn = _flash_fn(op.fn)
        params = inspect.signature(fn).parameters
        settings = {"softmax_scale": case["softmax_scale"], "causal": case["causal"]}
        if op.dropout:
            settings["dropout_p"] = case["dropout_p"]
        for i in range(self.nsets):
            leaves, aux = op.make(case, mk, g, self.dev)
            self.sets.append(leaves)
            self.aux[i] = aux
        self.nleaves = len(op.leaves)
        tensors = op.args(self.sets[0], self.aux[0])
        # needed: every input, and each setting that differs from flash-attn's default
        needed = [*tensors, "softmax_scale"] + (["causal"] if case["causal"] else []) \
            + (["dropout_p"] if case["dropout_p"] else [])
        _require(op.fn, params, needed)
        self.kwargs = {k: v for k, v in settings.items() if k in params}
        kwargs = self.kwargs
        if case.get("impl") == "flash_attn+compile":
            fn = torch.compile(fn)
        self.fn = fn
        n = self.nleaves
        if case["op"] == "fwd":  # the keyword dicts are built once per input set, outside the timing
            self.calls = [(lambda a=a: fn(**a)) for a in ({**op.args(st, ax), **kwargs}
                                                            for st, ax in zip(self.sets, self.aux))]
            return
        if not op.bwd:
            raise ValueError(f"{op.fn} has no backward: time it with op fwd")
        self.calls = []
        for i, st in enumerate(self.sets):
            for t in st:
                t.requires_grad_(True)
            out = self.torch_fwd(i)
            grad = torch.randn(out.shape, generator=g, device=self.dev, dtype=torch.float32).to(self.dtype)
            st.extend([out, grad])
            self.calls.append(lambda st=st: torch.autograd.grad(st[n], tuple(st[:n]), st[n + 1], retain_graph=True))

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def call(self):
        self.i += 1
        return self.calls[self.i % self.nsets]()

    # -- clocks ---------------------------------------------------------------------------------
    def warmup(self, seconds: float, min_calls: int = 6) -> float:
        """Run the call until ``seconds`` have passed (at least 6 calls); returns the µs per
        synchronized call that calibrates the inner loops: the median of the *second half* of the
        warm-up calls, so one-off first-call costs (lazy init, autograd set-up, a custom op's first
        dispatch) do not inflate it. (Calibrating on the mean of all warm-up calls left the first
        case of a process with 5 samples of one call each, on the H200 and on CPU.)"""
        pc = time.perf_counter_ns
        t_end = time.perf_counter() + seconds
        times = []
        while len(times) < min_calls or time.perf_counter() < t_end:
            t0 = pc()
            self.call()
            self.sync()
            times.append(pc() - t0)
            if len(times) >= 100000:
                break
        if getattr(self, "first_call_ms", None) is None:  # this case's first synchronized call in this process
            self.first_call_ms = times[0] / 1e6
        return statistics.median(times[len(times) // 2:]) / 1e3

    def wall_samples(self, inner: int, budget_s: float, refs: list | None = None, min_samples: int = 1) -> list:
        """Synchronized µs per call, samples of ``inner`` calls for ``budget_s`` s, and on until there
        are ``min_samples`` (at least 1; ``Sampling.min_burst_samples``). With ``refs``, the CPU-speed
        probe (:func:`speed_probe`, µs) is timed before each sample and once after the last, outside
        the timed samples, and appended there."""
        pc, call, sync = time.perf_counter_ns, self.call, self.sync
        out = []
        n_min = max(1, min_samples)
        t_end = pc() + int(budget_s * 1e9)
        while len(out) < n_min or pc() < t_end:
            if refs is not None:
                refs.append(speed_probe())
            t0 = pc()
            for _ in range(inner):
                call()
                sync()
            out.append((pc() - t0) / inner / 1e3)
        if refs is not None:
            refs.append(speed_probe())
        return out

    def host_samples(self, inner: int, budget_s: float, refs: list | None = None, min_samples: int = 1) -> list:
        """Host dispatch µs per call (device idle before each call), like :meth:`wall_samples`."""
        pc, call, sync = time.perf_counter_ns, self.call, self.sync
        out = []
        n_min = max(1, min_samples)
        t_end = pc() + int(budget_s * 1e9)
        while len(out) < n_min or pc() < t_end:
            if refs is not None:
                refs.append(speed_probe())
            tot = 0
            for _ in range(inner):
                sync()
                t0 = pc()
                call()
                tot += pc() - t0
            sync()
            out.append(tot / inner / 1e3)
        if refs is not None:
            refs.append(speed_probe())
        return out

    #: Profiler activities of the kernel-time pass: GPU activity only (CUPTI kernel records), which
    #: skips recording and parsing every CPU op; :meth:`device` falls back to CPU + CUDA once (for
    #: the rest of the process) where a torch build reports no kernels that way.
    ACTIVITIES = ("CUDA",)

    def device(self, ncalls: int) -> dict:
        """Kernel time: ``ncalls`` synchronized calls under the torch profiler; per call, the sum of
        the GPU kernels' durations (µs, CUPTI timestamps) -> ``samples``, and per kernel name its mean
        µs per call -> ``kernels``. Raises RuntimeError when no GPU activity is recorded."""
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        evs: list = []
        for acts in (Bench.ACTIVITIES, ("CPU", "CUDA")):
            self.sync()
            with profile(activities=[getattr(ProfilerActivity, a) for a in acts]) as prof:
                for _ in range(ncalls):
                    self.call()
                    self.sync()
            for e in prof.events():
                dt = str(getattr(e, "device_type", ""))
                if dt.endswith("CUDA") and getattr(e, "time_range", None) is not None:
                    evs.append((e.time_range.start, e.time_range.end - e.time_range.start, e.name))
            if evs or acts == ("CPU", "CUDA"):
                break
            Bench.ACTIVITIES = ("CPU", "CUDA")
        evs.sort()
        if not evs:
            raise RuntimeError("the profiler recorded no GPU activity (CUPTI unavailable?)")
        per_name: dict = {}
        for _, dur, name in evs:
            per_name[name] = per_name.get(name, 0.0) + dur
        kernels = sorted(({"name": k, "us": v / ncalls} for k, v in per_name.items()), key=lambda r: -r["us"])
        note = None
        if len(evs) % ncalls == 0:
            k = len(evs) // ncalls
            samples = [sum(d for _, d, _ in evs[i * k:(i + 1) * k]) for i in range(ncalls)]
        else:  # the calls did not all launch the same number of kernels: keep the mean only
            samples = [sum(d for _, d, _ in evs) / ncalls]
            note = f"{len(evs)} GPU events over {ncalls} calls: per-call samples unavailable, mean kept"
        del torch
        return {"samples": samples, "inner": 1, "kernels": kernels, "kernels_per_call": len(evs) / ncalls,
                "note": note}

    def graph(self, budget_s: float, hold_us: float | None = None, inner: int | None = None) -> dict:
        """The CUDA-graph clock: the call captured ``inner`` times in one graph, replayed for
        ~``budget_s`` s; one sample = the replay's event-timed GPU time / ``inner`` (µs per call).

        ``inner`` (None: chosen here) is a power of two, from the GPU time of a one-call graph's
        replay: ~:data:`TARGET_SAMPLE_US` µs of calls per replay, at most :data:`GRAPH_INNER_MAX`.
        It must not follow the host: a replay has a fixed GPU cost of its own (~1-2 µs on the H200)
        that is divided by ``inner``, and ``inner`` taken from the warm-up's wall time per call (as
        before 2026-12-03 evening) varied from process to process with the host's speed (H200,
        batch 2, 20 runs: fwd S50 read 1.35x the kernel time in processes with inner 1, 1.06x with
        2-5, 0.95x with 16+), which kept graph comparisons "ambiguous"; from the GPU time every
        process of every version picks the same ``inner`` for a small case (64).

        Before each sample's start event the stream is held on the GPU for ``hold_us`` µs (None:
        :data:`GRAPH_HOLD_US` or 4x the replay's host launch time, whichever is more, at most
        :data:`GRAPH_HOLD_MAX_US`; 0: no hold), so the host's launch of the replay is not inside the
        events; a sample whose host submission took longer than its hold is dropped (``dropped``).
        Returns ``{samples, inner, hold_us, launch_us, dropped}`` (µs). Raises RuntimeError when
        every sample was dropped."""
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            if self.case["op"] == "bwd":
                # the backward must be captured on the stream its forward ran on, with leaves (and
                # their grad accumulators) created there too, not on the legacy default stream
                n = self.nleaves
                for i, st in enumerate(self.sets):
                    st[:n] = [t.detach().requires_grad_(True) for t in st[:n]]
                    st[n] = self.torch_fwd(i)
            for _ in range(3):
                self.call()
        torch.cuda.current_stream().wait_stream(s)
        self.sync()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        pc = time.perf_counter_ns

        def capture(k: int):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                for _ in range(k):
                    self.call()
            self.sync()
            g.replay()
            self.sync()
            launch = []
            for _ in range(3):  # the replay's host launch time (µs): the hold must outlast it
                t0 = pc()
                g.replay()
                launch.append((pc() - t0) / 1e3)
                self.sync()
            return g, statistics.median(launch)

        def hold_for(launch_us: float) -> float:
            if hold_us is not None:
                return hold_us
            return min(GRAPH_HOLD_MAX_US, max(GRAPH_HOLD_US, 4.0 * launch_us))

        def timed(g, hold: float, cycles: int) -> float | None:
            """One replay's GPU µs between the events; None when the host's submission of the
            events and the replay outlasted the hold (the launch may then be inside them)."""
            if cycles:
                torch.cuda._sleep(cycles)
            t0 = pc()
            e0.record()
            g.replay()
            e1.record()
            sub_us = (pc() - t0) / 1e3
            e1.synchronize()
            if cycles and sub_us >= hold:
                return None
            return e0.elapsed_time(e1) * 1e3

        def cycles_for(hold: float) -> int:
            return int(hold * _sleep_cycles_per_us(torch)) if hold > 0 else 0

        g = None
        if inner is None:
            g1, launch1 = capture(1)
            h1 = hold_for(launch1)
            one = [t for t in (timed(g1, h1, cycles_for(h1)) for _ in range(5)) if t is not None]
            t1 = statistics.median(one) if one else TARGET_SAMPLE_US
            inner = graph_inner(t1)
            if inner == 1:
                g, launch_us = g1, launch1
            else:
                del g1
        inner = max(1, min(GRAPH_INNER_MAX, int(inner)))
        if g is None:
            g, launch_us = capture(inner)
        hold = hold_for(launch_us)
        cycles = cycles_for(hold)
        first = timed(g, hold, cycles)
        per_replay = first if first is not None else TARGET_SAMPLE_US
        n = max(MIN_SAMPLES, min(500, int(budget_s * 1e6 / (per_replay + hold))))
        out, dropped = [], 0
        for _ in range(n):
            t = timed(g, hold, cycles)
            if t is None:
                dropped += 1
                continue
            out.append(t / inner)
        del g
        if not out:
            raise RuntimeError(f"every CUDA-graph sample's host submission outlasted its {hold:.0f} µs hold "
                               f"({dropped} of {n}); no graph clock")
        return {"samples": out, "inner": inner, "hold_us": round(hold, 1), "launch_us": round(launch_us, 1),
                "dropped": dropped}

    def torch_fwd(self, i: int):
        """The forward of input set ``i`` (its output tensor: the first of a tuple)."""
        st = self.sets[i]
        if self.op.name == "func":
            out = self.fa(*self.split(st[0], st[1], st[2]), **self.kwargs)
        else:
            out = self.fn(**self.op.args(st, self.aux[i]), **self.kwargs)
        return out[0] if isinstance(out, tuple) else out

    # -- correctness ----------------------------------------------------------------------------
    def correctness(self) -> dict:
        """Max abs and relative (Frobenius) error of this version's output (fwd) or gradients (bwd)
        against an fp32 reference computed with torch on the same inputs. µs are not involved."""
        torch = self.torch
        c = self.case
        if c["dropout_p"]:
            return {"skipped": "dropout_p > 0: outputs are random"}
        if self.op.name != "func":
            return self._errors(self._op_pairs())
        b, sq, sk, h, hk, d = c["batch"], c["seqlen_q"], c["seqlen_k"], c["nheads"], c["nheads_k"], c["head_dim"]
        # keep the check cheap for large shapes: first 2 batch entries
        bb = min(b, 2)
        st = self.sets[0]
        xq, xk, xv = (t.detach()[:bb].clone().requires_grad_(True) for t in st[:3])
        q, k, v = xq.view(bb, sq, h, d), xk.view(bb, sk, hk, d), xv.view(bb, sk, hk, d)
        out = self.fa(q, k, v, **self.kwargs)
        out = out[0] if isinstance(out, tuple) else out
        rq, rk, rv = (t.detach().float().requires_grad_(True) for t in (xq, xk, xv))
        qf = rq.view(bb, sq, h, d).transpose(1, 2)
        kf = rk.view(bb, sk, hk, d).transpose(1, 2).repeat_interleave(h // hk, dim=1)
        vf = rv.view(bb, sk, hk, d).transpose(1, 2).repeat_interleave(h // hk, dim=1)
        scores = (qf @ kf.transpose(-1, -2)) * c["softmax_scale"]
        # causal: the mask aligned to the bottom-right corner, a row with no key all 0 (_causal_softmax)
        p = _causal_softmax(scores, sq, sk) if c["causal"] else scores.softmax(-1)
        ref = (p @ vf).transpose(1, 2)
        if c["op"] == "fwd":
            pairs = [("out", out.float(), ref)]
        else:
            g = torch.randn(ref.shape, device=ref.device, dtype=torch.float32)
            got = torch.autograd.grad(out, (xq, xk, xv), g.to(out.dtype))
            exp = torch.autograd.grad(ref, (rq, rk, rv), g)
            pairs = [(n, a.float(), e) for n, a, e in zip(("dq", "dk", "dv"), got, exp)]
        return self._errors(pairs)

    def _op_pairs(self) -> list:
        """(name, this version's result, fp32 reference) of an entry point of :data:`OPS` on the
        first input set: its output (fwd) or the gradients of its leaves (bwd). The reference is
        :func:`_ref_attn` per sequence (``op.dense``) on fp32 copies of the leaves."""
        torch, op, c = self.torch, self.op, self.case
        st, ax, n = self.sets[0], self.aux[0], self.nleaves
        bwd = c["op"] == "bwd"
        xs = [t.detach().clone().requires_grad_(bwd) for t in st[:n]]
        out = self.fn(**op.args(xs, ax), **self.kwargs)
        out = out[0] if isinstance(out, tuple) else out
        rf = [t.detach().float().requires_grad_(bwd) for t in st[:n]]
        outs = [_ref_attn(q, k, v, c["softmax_scale"], c["causal"]) for q, k, v in op.dense(rf, ax)]
        ref = torch.cat(outs, 0) if op.out == "varlen" else torch.stack(outs, 0)
        if not bwd:
            return [("out", out.float(), ref)]
        g = torch.randn(ref.shape, device=ref.device, dtype=torch.float32)
        got = torch.autograd.grad(out, xs, g.to(out.dtype).reshape(out.shape))
        exp = torch.autograd.grad(ref, rf, g)
        return [("d" + name, a.float(), e) for name, a, e in zip(op.leaves, got, exp)]

    def _errors(self, pairs) -> dict:
        """Per (name, got, expected): max abs error, relative (Frobenius) error, all finite."""
        torch = self.torch
        res = {}
        for name, a, e in pairs:
            a = (a.reshape(e.shape) if a.shape != e.shape else a).detach()
            e = e.detach()
            diff = (a - e)
            res[name] = {
                "max_abs_err": float(diff.abs().max()),
                "rel_err": float(diff.norm() / e.norm().clamp_min(1e-30)),
                "finite": bool(torch.isfinite(a).all()),
            }
        return res


def _classify(e: BaseException) -> str:
    msg = str(e)
    name = type(e).__name__
    if "OutOfMemory" in name or "out of memory" in msg:
        return "oom"
    if "matrix-run slim build" in msg:
        return "kernel-not-built"
    if isinstance(e, NotInVersion):
        return "not-in-version"
    if "only supports CUDA" in msg or "on CUDA" in msg or "must be on CUDA" in msg or "CUDA" in msg and "cpu" in msg.lower():
        return "device-unsupported"
    return "error"


#: Error texts of a CUDA-graph capture broken by a host synchronization inside the call (a
#: ``.item()``, a ``.cpu()``, a blocking copy): CUDA's "operation not permitted when stream is
#: capturing" / cudaErrorStreamCaptureUnsupported / ...Invalidated, torch's "capture" checks.
_CAPTURE_SYNC = ("not permitted when stream is capturing", "StreamCapture", "stream is capturing",
                 "capture", "synchroniz")


def _graph_note(b, e: BaseException) -> str:
    """The note of a graph clock that could not be taken. A capture broken by a synchronization
    inside the call is a property of the version (upstream flash-attn #1664: varlen read max_seqlen
    with ``.item()``; #1164: CUDA graphs with varlen), said as such, not as a failure of the run."""
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    fn = getattr(getattr(b, "op", None), "fn", "the call")
    if any(k.lower() in str(e).lower() for k in _CAPTURE_SYNC):
        return (f"graph capture impossible in this version: {fn} synchronizes with the host inside the call "
                f"({type(e).__name__}: {first}); no graph clock (a finding: see flash-attn #1664, #1164)")
    return f"graph_us unavailable: {type(e).__name__}: {first}"


def _error_fields(rec: dict, e: BaseException) -> None:
    rec["status"] = "error"
    rec["error_kind"] = _classify(e)
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    rec["error"] = f"{type(e).__name__}: {first[:500]}"
    rec["traceback"] = traceback.format_exc()[-2000:]


def _set_bytes(case: dict) -> int:
    """Bytes of one input set of ``case``: q (batch, seqlen_q, nheads, head_dim) plus k and v
    (batch, seqlen_k, nheads_k, head_dim), 2 bytes per element (fp16/bf16). varlen*: total tokens
    (sum of seqlens) instead of batch * seqlen; kvcache paged: whole blocks of the cache."""
    b, sq, sk = case["batch"], case["seqlen_q"], case["seqlen_k"]
    h, hk, d = case["nheads"], case["nheads_k"], case["head_dim"]
    if case.get("seqlens"):
        tot = sum(case["seqlens"])
        return (tot * h * d + 2 * tot * hk * d) * 2
    page = case.get("page_block_size")
    kv_tokens = b * (-(-sk // page) * page if page else sk)
    return (b * sq * h * d + 2 * kv_tokens * hk * d) * 2


def _die_with_parent() -> None:
    """Linux: get SIGTERM when the driver dies (even by SIGKILL), so no worker is left orphaned."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG = 1
        if os.getppid() == 1:  # the driver already died before prctl
            sys.exit(3)
    except (OSError, AttributeError):
        pass


# -- the explain pass (driver: matrix_runner/explain.py) ------------------------------------------
#: Layers of a forward call, outermost first: ``public`` flash_attn_func; ``autograd``
#: FlashAttnFunc.apply; ``custom_op`` torch.ops.flash_attn._flash_attn_forward (flash-attn 2.7+ with
#: torch >= 2.4: torch.library.custom_op); ``python`` the Python body of _flash_attn_forward;
#: ``extension`` the compiled extension's ``fwd`` (flash_attn_2_cuda, called as flash_attn_gpu in 2.7+).
LAYER_KINDS = ("public", "autograd", "custom_op", "python", "extension")


def _frame_args(frame) -> list:
    """The positional arguments a Python frame was called with (at its ``call`` event)."""
    c = frame.f_code
    return [frame.f_locals[n] for n in c.co_varnames[:c.co_argcount]]


def discover_layers(b: "Bench") -> list:
    """Find the layers of the installed flash_attn's forward call for the case of ``b`` (a fwd
    flash_attn case), from the module itself: one call of ``flash_attn_func`` is traced with
    ``sys.setprofile`` (the arguments that ``FlashAttnFunc.forward`` and the Python
    ``_flash_attn_forward`` body receive are read from their frames) while the extension module's
    ``fwd`` attribute is swapped for a recorder (its arguments). Returns one dict per kind of
    :data:`LAYER_KINDS`, outermost first: ``{kind, name, exists, note, fn, args, kwargs}`` (``fn``
    etc. only where it exists; ``note`` says why a layer does not exist). Each layer is later called
    with the arguments its version passed it in that call: the same work, one layer less."""
    import types

    sub = subject()
    if sub["package"] != "flash-attn":  # FA3/FA4 wrap their kernels in other layers
        raise RuntimeError(f"layer timing knows flash-attn 2.x's layers (flash_attn_func, FlashAttnFunc, "
                           f"_flash_attn_forward, the extension's fwd); {sub['package']} has others: not split into "
                           "layers (its frame profile, call counts and first calls still are)")
    import flash_attn
    from flash_attn import flash_attn_interface as fi
    import torch

    q, k, v = b.split(*b.sets[0][:3])
    ext_alias, ext = None, None
    for name, obj in vars(fi).items():
        if isinstance(obj, types.ModuleType) and callable(getattr(obj, "fwd", None)):
            ext_alias, ext = name, obj
            break
    fcls = getattr(fi, "FlashAttnFunc", None)
    fwd_code = getattr(getattr(fcls, "forward", None), "__code__", None)
    body = getattr(fi, "_flash_attn_forward", None)
    raw = getattr(body, "_init_fn", body)  # torch.library.custom_op's CustomOpDef keeps the function as _init_fn
    raw_code = raw.__code__ if inspect.isfunction(raw) else None
    wrapped = getattr(fi, "_wrapped_flash_attn_forward", None)
    got: dict = {}

    def prof(frame, event, arg):
        if event == "call":
            if frame.f_code is fwd_code and "autograd" not in got:
                got["autograd"] = _frame_args(frame)[1:]  # without ctx
            elif frame.f_code is raw_code and "python" not in got:
                got["python"] = _frame_args(frame)

    orig = getattr(ext, "fwd", None)
    if ext is not None:
        def recorder(*a, **kw):
            got.setdefault("extension", (a, kw))
            return orig(*a, **kw)

        ext.fwd = recorder
    sys.setprofile(prof)
    try:
        flash_attn.flash_attn_func(q, k, v, **b.kwargs)
        b.sync()
    finally:
        sys.setprofile(None)
        if ext is not None:
            ext.fwd = orig

    def layer(kind, name, fn=None, args=(), kwargs=None, note=None):
        return {"kind": kind, "name": name, "exists": fn is not None, "note": note, "fn": fn,
                "args": list(args), "kwargs": dict(kwargs or {})}

    out = [layer("public", "flash_attn.flash_attn_func", flash_attn.flash_attn_func, (q, k, v), b.kwargs)]
    if fcls is None:
        out.append(layer("autograd", "FlashAttnFunc.apply", note="flash_attn_interface has no FlashAttnFunc"))
    elif "autograd" not in got:
        out.append(layer("autograd", "FlashAttnFunc.apply", note="FlashAttnFunc.forward is not on this call's path"))
    else:
        out.append(layer("autograd", "FlashAttnFunc.apply", fcls.apply, got["autograd"]))
    op_name = "torch.ops.flash_attn._flash_attn_forward"
    if wrapped is not None and not inspect.isfunction(wrapped) and "python" in got:
        out.append(layer("custom_op", op_name + " (torch.library.custom_op)", wrapped, got["python"]))
    elif wrapped is not None or body is not raw:
        why = ("flash-attn 2.7+ registers a torch.library.custom_op only where torch >= 2.4 has one"
               if not hasattr(getattr(torch, "library", None), "custom_op") else
               "this torch has torch.library.custom_op, but this build of flash_attn_interface did not register one")
        out.append(layer("custom_op", op_name, note="no custom op on this call's path: the wrapper calls the plain "
                         f"Python function here (torch {torch.__version__}; {why})"))
    else:
        out.append(layer("custom_op", op_name, note="this version has no custom op (no "
                         "torch.library.custom_op in flash_attn_interface)"))
    if "python" in got:
        out.append(layer("python", "flash_attn_interface._flash_attn_forward (Python body)", raw, got["python"]))
    else:
        out.append(layer("python", "flash_attn_interface._flash_attn_forward",
                         note="no Python _flash_attn_forward on this call's path"))
    ename = f"{ext.__name__}.fwd" + (f" (as {ext_alias})" if ext is not None and ext_alias != ext.__name__ else "") \
        if ext is not None else "extension fwd"
    if "extension" in got:
        a, kw = got["extension"]
        out.append(layer("extension", ename, orig, a, kw))
    else:
        out.append(layer("extension", ename, note="no extension module with fwd found in flash_attn_interface"
                         if ext is None else "the extension's fwd is not on this call's path"))
    return out


def host_burst(fn, args, kwargs, sync, ms: float) -> float:
    """Host µs per call of ``fn(*args, **kwargs)`` (the device synchronized before each call, outside
    the timing, as :meth:`Bench.host_samples`): 3 untimed calls, a calibration of calls per sample,
    then ~``ms`` of samples of ~ms/8 each; returns the median of the samples."""
    pc = time.perf_counter_ns
    t0 = pc()
    for _ in range(3):
        sync()
        fn(*args, **kwargs)
    sync()
    per = max((pc() - t0) / 3 / 1e3, 1e-3)
    inner = max(1, int(round(ms * 1e3 / BURST_SAMPLES / per)))
    out = []
    t_end = pc() + int(ms * 1e6)
    while not out or pc() < t_end:
        tot = 0
        for _ in range(inner):
            sync()
            t0 = pc()
            fn(*args, **kwargs)
            tot += pc() - t0
        sync()
        out.append(tot / inner / 1e3)
    return statistics.median(out)


def _explain_loop(b: "Bench", seconds: float, inner: int = 1) -> tuple:
    """Steady state for an out-of-process sampler: synchronized calls of the case for ``seconds``,
    timed in samples of ``inner`` calls; returns (calls, mean µs per call, median of the samples' µs
    per call). The median is what a frame's sampled share is scaled by: on a loaded machine the mean
    carries the time the process was preempted (2.7x on the 2-core CI machine under load), which
    scales every frame alike. The driver keeps only sampled stacks under this frame."""
    pc = time.perf_counter_ns
    n, t0 = 0, pc()
    end = t0 + int(seconds * 1e9)
    samples = []
    while pc() < end:
        ts = pc()
        for _ in range(inner):
            b.call()
            b.sync()
        samples.append((pc() - ts) / inner / 1e3)
        n += inner
    return n, (pc() - t0) / 1e3 / max(n, 1), statistics.median(samples)


def call_counts(b: "Bench", calls: int) -> dict:
    """Deterministic call counts (cProfile) of ``calls`` synchronized calls of the case: per function
    (Python and C, the worker's own frames left out) ``calls`` per timed call; ``total``: their sum.
    cProfile's own time inflation is irrelevant here: only counts are kept."""
    import cProfile
    import pstats

    b.warmup(0.0, min_calls=3)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        b.call()
        b.sync()
    pr.disable()
    me = os.path.abspath(__file__)
    rows = {}
    for (fname, line, func), (cc, nc, tt, ct, callers) in pstats.Stats(pr).stats.items():
        if fname == me or func == "<method 'disable' of '_lsprof.Profiler' objects>":
            continue
        key = func if fname == "~" else f"{func} ({_short_path(fname)})"
        rows[key] = rows.get(key, 0.0) + nc / calls
    return {"calls": calls, "per_call": rows, "total": sum(rows.values())}


def _short_path(path: str) -> str:
    """A file path as it reads across envs: the part after site-packages/ (or the last two parts)."""
    p = path.replace("\\", "/")
    if "site-packages/" in p:
        return p.rsplit("site-packages/", 1)[1]
    return "/".join(p.split("/")[-2:])


# -- the CPU-speed probe ------------------------------------------------------------------------
#: Iterations of :func:`speed_probe`'s loop (fixed: every worker of every version runs the same work).
PROBE_ITERS = 48


def _probe_work(n: int) -> int:
    d: dict = {}
    s = 0
    for i in range(n):
        d[i & 7] = i
        s += len(d) + (i ^ 3)
    return s


def speed_probe(n: int = PROBE_ITERS) -> float:
    """µs taken by a fixed piece of pure-Python work (``n`` loop iterations of dict stores, ``len``
    and integer ops: ~4-12 µs on the machines measured), run once untimed and timed the second
    time, so what it reads is the CPU's speed at that moment (frequency, a busy sibling
    hyperthread) and not how much of its code and data the preceding call evicted. It is the same
    code in every worker of every version; it runs between a burst's samples, never inside them.
    Returns µs."""
    _probe_work(n)
    pc = time.perf_counter_ns
    t0 = pc()
    _probe_work(n)
    return (pc() - t0) / 1e3


def speed_adjusted(samples: list, refs: list, beta: float, center: float) -> dict:
    """A burst's value at a reference CPU speed, and what the driver needs to estimate the slope.

    ``samples``: µs per call, one per sample; ``refs``: the probe's µs before each sample and after
    the last (len(samples) + 1). Per sample, x = mean log of its two bracketing probe readings and
    y = log of its µs; the returned ``adj_us`` is exp(median of y - beta * (x - center)): the burst's
    median µs per call moved to the probe level exp(center) along the slope ``beta`` (the driver
    fixes both from earlier bursts: stats.SpeedSlope). ``fit`` = [n, sum x, sum y, sum x^2,
    sum x*y] over the samples, for the driver's pooled within-worker slope; ``x_median`` the median
    x, for its centre."""
    xs, ys = [], []
    for i, v in enumerate(samples):
        a, b = refs[i], refs[i + 1]
        if v > 0 and a > 0 and b > 0:
            xs.append(0.5 * (math.log(a) + math.log(b)))
            ys.append(math.log(v))
    fit = [len(xs), sum(xs), sum(ys), sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys))]
    xmed = statistics.median(xs) if xs else None
    if not xs or beta == 0.0:  # no slope yet: the plain median
        return {"adj_us": statistics.median(samples), "fit": fit, "x_median": xmed}
    z = [y - beta * (x - center) for x, y in zip(xs, ys)]
    return {"adj_us": math.exp(statistics.median(z)), "fit": fit, "x_median": xmed}


#: ``MATRIX_RUN_BURST_TRACE=DIR``: every burst's raw samples and probe readings are appended, one
#: JSON line per burst, to ``DIR/<pid>.jsonl`` (a diagnostic for benchmarks/, off by default).
_TRACE = os.environ.get("MATRIX_RUN_BURST_TRACE")


def _trace(rec: dict) -> None:
    try:
        with open(os.path.join(_TRACE, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
    except OSError:
        pass


# -- lockstep serving (the current protocol) ----------------------------------------------------
SERVE_SCHEMA = "matrix-runner/lockstep/1"
#: Samples per burst: a burst of B ms is timed as samples of ~B/8 ms (at least one call each).
BURST_SAMPLES = 8


class Server:
    """One lockstep worker: holds every case of its process set, set up once, and answers the
    driver's commands one at a time (protocol in :func:`serve`). All times in µs per call."""

    def __init__(self, send):
        self.send = send
        self.benches: dict = {}
        self.per_call: dict = {}
        self.device_started = False
        self.device = "cpu"
        self.seed = 0
        self.quick = False
        self.layers: dict = {}

    def handle(self, cmd: dict) -> dict:
        op = cmd.get("cmd")
        cid = cmd.get("case")
        rec: dict = {"type": op, "case": cid, "status": "ok"}
        before = set(sys.modules) if op in LEARNED_FROM else None
        out = self._handle(op, cid, cmd, rec)
        if before is not None and len(sys.modules) != len(before):
            # in load order (sys.modules keeps insertion order): what a later set's workers of this
            # env import before they are needed (:func:`preimport`)
            out["imported"] = [m for m in list(sys.modules) if m not in before]
        return out

    def _handle(self, op: str, cid: str | None, cmd: dict, rec: dict) -> dict:
        """One command (``handle``); returns ``rec`` filled in, or a ``fatal`` record."""
        try:
            if op == "config":
                self.device, self.seed, self.quick = cmd["device"], int(cmd.get("seed", 0)), bool(cmd.get("quick"))
                import torch

                if self.device == "cuda" and not torch.cuda.is_available():
                    return {"type": "fatal", "error": "CUDA is not available in this env's torch "
                            f"({torch.__version__}); flash-attn needs an NVIDIA GPU"}
                torch.manual_seed(self.seed)
                if self.device == "cpu":
                    torch.set_num_threads(1)  # tiny CPU calls are dominated by thread wake-ups otherwise
            elif op == "pin":
                rec["threads"] = _pin_threads({int(cmd["cpu"])})
                rec["cpus"] = sorted(os.sched_getaffinity(0))
            elif op == "setup":
                t0 = time.perf_counter()
                b = Bench(cmd["spec"], self.device, self.seed)
                ws = cmd.get("warmup_s")
                self.per_call[cid] = b.warmup(BUDGETS["setup_warmup"] if ws is None else float(ws))
                self.benches[cid] = b
                rec.update(per_call_us=self.per_call[cid], input_sets=b.nsets,
                           seconds=round(time.perf_counter() - t0, 3), first_call_ms=b.first_call_ms)
            elif op == "burst":
                if self.device_started:
                    raise RuntimeError("burst after the profiler pass: the profiler slows later calls")
                b = self.benches[cid]
                ms = float(cmd["ms"])
                b.warmup(0.0, min_calls=int(cmd.get("warm_calls", 1)))
                per = self.per_call[cid]
                sample_us = max(ms * 1e3 / BURST_SAMPLES, 1.0)
                inner = max(1, int(round(sample_us / max(per, 1e-3))))
                fn = b.wall_samples if cmd["clock"] == "wall" else b.host_samples
                refs: list | None = [] if cmd.get("probe", True) else None  # the CPU-speed probe between samples
                t0 = time.monotonic_ns()
                samples = fn(inner, ms / 1e3, refs, int(cmd.get("min_samples", 1)))  # (at least 1: fn's rule)
                rec.update(us=statistics.median(samples), n=len(samples), inner=inner)
                if refs:
                    rec["ref_us"] = statistics.median(refs)
                    rec.update(speed_adjusted(samples, refs, float(cmd.get("beta") or 0.0),
                                              float(cmd.get("center") or 0.0)))
                if _TRACE:
                    _trace({"t0": t0, "t1": time.monotonic_ns(), "case": cid, "clock": cmd["clock"],
                            "inner": inner, "samples": samples, "refs": refs or []})
            elif op == "finish":
                b = self.benches[cid]
                notes: list = []
                if cmd.get("correctness", True):
                    try:
                        rec["correctness"] = b.correctness()
                    except Exception as e:  # noqa: BLE001
                        notes.append(f"correctness check failed to run: {type(e).__name__}: {e}")
                if b.cuda and cmd.get("graph", True):
                    err = None
                    for attempt in range(2):  # the first capture of a backward can fail on lazy init
                        try:
                            rec["graph_us"] = b.graph(BUDGETS["graph"])
                            break
                        except Exception as e:  # noqa: BLE001
                            err = _graph_note(b, e)
                            try:
                                b.torch.cuda.synchronize()
                            except Exception:  # noqa: BLE001 - an invalidated capture may report here once
                                pass
                    else:
                        notes.append(err)
                rec["notes"] = notes
            elif op == "device_init":
                # the profiler's one-off start in a process (CUPTI set-up: ~0.9 s on the H200), in an
                # empty session, so the driver can start it in every profiling worker at once
                self.device_started = True
                import torch
                from torch.profiler import ProfilerActivity, profile

                t0 = time.perf_counter()
                with profile(activities=[getattr(ProfilerActivity, a) for a in Bench.ACTIVITIES]):
                    torch.cuda.synchronize()
                rec["seconds"] = round(time.perf_counter() - t0, 3)
            elif op == "device":
                self.device_started = True
                b = self.benches[cid]
                b.warmup(0.0, min_calls=3)
                d = b.device(int(cmd.get("calls") or BUDGETS["device_calls"]))
                rec["kernels"] = d.pop("kernels")
                rec["device_us"] = d
            elif op == "layers":
                b = self.benches[cid]
                if b.case["op"] != "fwd" or b.case.get("impl", "flash_attn") != "flash_attn":
                    raise ValueError("layers: forward flash_attn cases only")
                if cid not in self.layers:
                    self.layers[cid] = discover_layers(b)
                ls = [x for x in self.layers[cid] if x["exists"]]
                order = ls[::-1] if cmd.get("reverse") else ls
                us = {x["kind"]: host_burst(x["fn"], x["args"], x["kwargs"], b.sync, float(cmd.get("ms", 5.0)))
                      for x in order}
                rec["us"] = {x["kind"]: us[x["kind"]] for x in ls}
                rec["layers"] = [{k: x[k] for k in ("kind", "name", "exists", "note")} for x in self.layers[cid]]
            elif op == "loop":
                b = self.benches[cid]
                b.warmup(0.0, min_calls=3)
                inner = max(1, int(round(1000.0 / max(self.per_call[cid], 1e-3))))  # ~1 ms samples
                n, mean, med = _explain_loop(b, float(cmd["seconds"]), inner)
                rec.update(calls=n, us_per_call=med, mean_us_per_call=mean, inner=inner)
            elif op == "counts":
                rec["counts"] = call_counts(self.benches[cid], int(cmd.get("calls", 200)))
            elif op == "release":
                self.benches.pop(cid, None)
            else:
                raise ValueError(f"unknown command {op!r}")
        except Exception as e:  # noqa: BLE001 - the case fails, the worker goes on
            _error_fields(rec, e)
            if rec["error_kind"] == "oom" and self.device == "cuda":
                import torch

                self.benches.pop(cid, None)
                torch.cuda.empty_cache()
        return rec


def _pin_threads(cpus: set) -> int:
    """Pin every thread of this process to ``cpus`` (Linux: each task of /proc/self/task; elsewhere
    the calling thread). All threads, not just this one: torch runs a backward on its autograd
    device thread, created at the first backward; left unpinned, the bwd calls of two workers
    of a set ran on unrelated cores (H200: per-cycle log-ratio SD 0.15-0.2 for bwd vs 0.04-0.08 for
    fwd). Returns how many threads were pinned; raises OSError where the OS forbids it."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    n = 0
    for t in tids:
        try:
            os.sched_setaffinity(t, cpus)
            n += 1
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    return n


#: Environment variable naming a JSON file: a list of module names this worker imports after torch
#: and the subject and before its hello (the driver's pre-import, runner module doc).
PREIMPORT_ENV = "MATRIX_RUN_PREIMPORT"
#: Commands whose replies list the modules they imported (``imported``): the one-off work a
#: later set's workers can do while the previous set is timed. Only the set-up: its modules are
#: loaded in every worker before its bursts anyway, so importing them earlier leaves the timed
#: process as it was. Not the profiler's start-up (``device_init``: it imports ``torch._dynamo``
#: and ~800 more modules, which a 2.6.3 process never loads on its own) nor the correctness check
#: and graph clock, which come after the bursts.
LEARNED_FROM = ("setup",)


#: Environment variable: when set, the worker creates its CUDA context (and torch's allocator state)
#: after the pre-import and before its hello (:func:`cuda_at_start`; ``Sampling.cuda_at_start``).
CUDA_AT_START_ENV = "MATRIX_RUN_CUDA_AT_START"


def cuda_at_start() -> dict:
    """Create this process's CUDA context now (``torch.cuda.init`` and one 1-element allocation,
    synchronized): ``{seconds}`` of wall time, or ``{seconds, error}``. Why: a fresh worker's first
    set-up paid ~0.34 s for it on the H200 (2026-12-04: the first case's set-up 0.34-0.37 s per
    process, the other eleven ~0.01-0.04 s each) while its set waited; done while the worker
    starts, sets ahead of its turn, it runs beside another set's cycles instead. No kernel of the
    subject runs, only the context's creation and one allocation."""
    t0 = time.perf_counter()
    try:
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the set-up reports a real CUDA problem itself
        return {"seconds": round(time.perf_counter() - t0, 3), "error": f"{type(e).__name__}: {str(e)[:200]}"}
    return {"seconds": round(time.perf_counter() - t0, 3)}


def preimport(path: str | None) -> dict | None:
    """Import the modules listed in the JSON file ``path`` (module names, in the order a worker of
    the same env first loaded them), each one best-effort: ``{n, imported, failed, seconds,
    first_failures}`` (seconds of wall time for the whole list; ``imported``: how many modules
    were newly loaded, the listed ones and what they imported in turn; ``failed``: names that
    raised, with the first three as ``"name: error"``). None when ``path`` is unset. Why:
    flash-attn 2.7+'s custom op imports ``torch._dynamo`` and ~800 other modules on its first call (1.8 s on the 2-core CPU machine, ~1 s on the H200: the bulk of
    2.7.0.post2's 1.1-1.5 s set-up per process set); imported here, during the previous set's cycles
    on a spare core, they cost the set's start nothing. Only imports: no call is made, so nothing
    runs on the GPU."""
    if not path:
        return None
    import importlib

    t0 = time.perf_counter()
    try:
        with open(path, encoding="utf-8") as f:
            names = [str(x) for x in json.load(f)]
    except (OSError, ValueError) as e:
        return {"n": 0, "imported": 0, "failed": 0, "seconds": 0.0,
                "first_failures": [f"{path}: {type(e).__name__}: {e}"]}
    failed, before = 0, len(sys.modules)
    errors: list = []
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a module that only loads as a side effect of another
            failed += 1
            if len(errors) < 3:
                errors.append(f"{name}: {type(e).__name__}: {str(e)[:120]}")
    return {"n": len(names), "imported": len(sys.modules) - before, "failed": failed,
            "seconds": round(time.perf_counter() - t0, 3), "first_failures": errors}


def serve() -> int:
    """Lockstep worker (``worker.py serve``). Commands arrive on stdin, one JSON object per line;
    each gets exactly one reply on the original stdout, one JSON object per line (everything else
    the process prints to stdout goes to stderr, the log). First reply, unasked: ``hello`` with the
    probe (or ``fatal``) and ``preimport`` (:func:`preimport`'s record where :data:`PREIMPORT_ENV`
    names a list of modules, imported before the hello; else null) and ``cuda_at_start``
    (:func:`cuda_at_start`'s record where :data:`CUDA_AT_START_ENV` is set; else null). The replies to the commands in
    :data:`LEARNED_FROM` list, as ``imported``, the modules the command loaded (absent when none).
    Commands (``case`` is a case id):

    - ``config {device, seed, quick}``; ``pin {cpu}`` (every thread of the process to one CPU);
    - ``setup {case, spec, warmup_s?}``: inputs, warm-up (``warmup_s``, default
      ``BUDGETS["setup_warmup"]``, at least 6 calls), calibration -> ``per_call_us``; commands may be
      sent ahead of their replies (the driver queues a prefetched set's config and set-ups);
    - ``burst {case, clock: wall|host, ms, beta, center, probe}``: a few untimed calls, then ~``ms``
      of timed calls in samples of ~ms/8 -> ``us`` (median of the samples, µs per call), ``n``,
      ``inner``; with ``probe`` (default true) also ``ref_us`` (the speed probe's median µs),
      ``adj_us`` (the value at the reference speed ``center`` along slope ``beta``), ``fit`` and
      ``x_median`` (:func:`speed_adjusted`);
    - ``finish {case}``: correctness against an fp32 reference and the CUDA-graph clock;
    - ``device_init``: the profiler's one-off start-up in an empty session (CUDA);
    - ``device {case}``: kernel time from the profiler; after it or ``device_init``, bursts are
      refused (one profiler session slowed every later 2.6.3 call 2.4x on the H200);
    - ``release {case}``; ``quit``.
    The explain pass (``--explain``; its own worker processes, after the timing phase; driver:
    ``matrix_runner/explain.py``) adds: ``layers {case, ms, reverse?}`` (a fwd flash_attn case: one
    host burst of ~``ms`` per layer of :func:`discover_layers`, in order or reversed -> ``us`` {kind:
    µs per call, median of the burst's samples} and ``layers`` [{kind, name, exists, note}]);
    ``loop {case, seconds}`` (synchronized calls for ``seconds`` while the driver samples the process
    with py-spy -> ``calls``, ``us_per_call`` (median of ~1 ms samples), ``mean_us_per_call``); ``counts {case, calls}`` (cProfile call counts per
    call, :func:`call_counts`). ``setup`` replies also give ``first_call_ms``: the case's first
    synchronized call in this process, ms (the first case of a process also pays its lazy imports).
    A reply with ``status: error`` fails that case only; the worker goes on."""
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(rec: dict) -> None:
        proto.write(json.dumps(rec) + "\n")
        proto.flush()

    _die_with_parent()
    info = probe()
    pre = preimport(os.environ.get(PREIMPORT_ENV)) if not info["error"] else None
    cu = cuda_at_start() if os.environ.get(CUDA_AT_START_ENV) and not info["error"] else None
    send({"type": "hello", "schema": SERVE_SCHEMA, "pid": os.getpid(), "probe": info, "preimport": pre,
          "cuda_at_start": cu})
    if info["error"]:
        send({"type": "fatal", "error": info["error"]})
        return 3
    srv = Server(send)
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
        except ValueError:
            send({"type": "fatal", "error": f"unreadable command {line[:200]!r}"})
            return 2
        if cmd.get("cmd") == "quit":
            send({"type": "bye"})
            return 0
        rep = srv.handle(cmd)
        send(rep)
        if rep.get("type") == "fatal":
            return 3
    return 0


def _cpu_list(path: str) -> set | None:
    """The CPU ids of a sysfs CPU list file (``0-5,7``); None where it cannot be read."""
    try:
        with open(path) as f:
            txt = f.read().strip()
        out = set()
        for part in txt.split(","):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
        return out
    except (OSError, ValueError):
        return None


def _online_cpus() -> set | None:
    """The online CPU ids (``/sys/devices/system/cpu/online``); None where unknown."""
    return _cpu_list("/sys/devices/system/cpu/online")


#: the scout's sweep record's schema (one JSON line per sweep: :func:`scout`)
SCOUT_SCHEMA = "matrix-runner/scout/1"


def scout(cpus: list[int], probe_ms: float = 1.0, every_ms: float = 20.0, stdin=None, stdout=None,
          sweeps: int | None = None) -> int:
    """Read the speed of every CPU in ``cpus`` in turn, for ``sampling.cpu_hop`` (the driver moves a
    process set to a CPU that reads fast now: lockstep.Hopper).

    One sweep: this process pins itself to each CPU in turn (except the one the driver says the set
    is on, which it leaves alone), runs :func:`speed_probe` back to back for ``probe_ms`` ms there and
    takes the median µs; then it writes one line ``{"schema": SCOUT_SCHEMA, "t": time.monotonic()
    at the sweep's end (s; the same clock as the driver's on Linux), "us": {cpu: median µs}}`` and
    sleeps the rest of ``every_ms`` ms. The set's CPU's SMT siblings are left alone too. Commands on stdin, one per line, read before each CPU: ``at N``
    (the set is on CPU N now: skip it; ``at -1``: skip none); end of input stops it. ``sweeps``: stop after that many
    (tests). Why (H200, benchmarks/core_hop.py): each vCPU switches by itself between two speeds
    and at any moment some read fast; a timing process that moved to the CPU a scout read fastest
    (1 ms per CPU every 25 ms) ran 95 % of its turns at the fast level against 55 % for one that
    stayed on one CPU, over the same 40 s. Returns 0."""
    import select

    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout
    fd = stdin.fileno()
    state = {"skip": -1, "buf": b""}

    def commands() -> bool:
        """Read what the driver wrote, without waiting; False at end of input."""
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                return False
            *lines, state["buf"] = (state["buf"] + chunk).split(b"\n")
            for line in lines:
                parts = line.split()
                if len(parts) == 2 and parts[0] == b"at":
                    try:
                        state["skip"] = int(parts[1])
                    except ValueError:
                        pass
        return True

    def siblings(c: int) -> set:
        """CPUs sharing ``c``'s physical core (SMT, from sysfs; ``{c}`` where unknown): probing one
        would slow the set on ``c``."""
        return (_cpu_list(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") or set()) | {c}

    cpus = list(dict.fromkeys(cpus))
    near: dict = {}
    n = 0
    while sweeps is None or n < sweeps:
        t0 = time.monotonic()
        out = {}
        if not commands():
            return 0
        for c in cpus:
            # before every CPU, not once a sweep: the set may have just moved onto the next one
            if not commands():
                return 0
            skip = state["skip"]
            if skip >= 0 and skip not in near:
                near[skip] = siblings(skip)
            if skip >= 0 and c in near[skip]:
                continue
            try:
                os.sched_setaffinity(0, {c})
            except (OSError, AttributeError, ValueError):
                continue
            end, vals = time.perf_counter() + probe_ms / 1e3, []
            while time.perf_counter() < end:
                vals.append(speed_probe())
            out[str(c)] = round(statistics.median(vals), 4)
        try:
            stdout.write(json.dumps({"schema": SCOUT_SCHEMA, "t": time.monotonic(), "us": out}) + "\n")
            stdout.flush()
        except (BrokenPipeError, OSError):  # the driver is gone
            return 0
        n += 1
        time.sleep(max(0.0, every_ms / 1e3 - (time.monotonic() - t0)))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="matrix-run timing worker (runs inside one env)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("probe")
    sub.add_parser("serve")
    sc = sub.add_parser("scout")
    sc.add_argument("--cpus", required=True, help="comma list of CPU ids this process may run on")
    sc.add_argument("--probe-ms", type=float, default=1.0)
    sc.add_argument("--every-ms", type=float, default=20.0)
    a = ap.parse_args(argv)
    if a.cmd == "scout":
        try:
            cpus = [int(c) for c in a.cpus.split(",") if c.strip()]
        except ValueError:
            ap.error(f"scout --cpus {a.cpus!r}: give a comma list of CPU ids, e.g. 1,2,3")
        # the machine's online CPUs, not this process's affinity: the driver starts it from its own,
        # pinned, CPU, and it pins itself to each CPU in turn (a CPU it may not use is skipped)
        online = _online_cpus()
        bad = [c for c in cpus if c < 0 or (online is not None and c not in online)]
        if not cpus or bad:
            ap.error(f"scout --cpus {a.cpus!r}: " + (f"no online CPU {bad} on this machine" if bad else "no CPU given"))
        if not (0 < a.probe_ms < 1e4 and 0 < a.every_ms < 1e6):
            ap.error("scout --probe-ms and --every-ms must be positive numbers of ms (probe under 10 s)")
    if a.cmd == "probe":
        print(json.dumps(probe()))
        return 0
    if a.cmd == "scout":
        return scout(cpus, a.probe_ms, a.every_ms)
    return serve()


if __name__ == "__main__":
    sys.exit(main())
