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

Clocks per case, all in µs per call:

- ``wall_us``: ``call(); synchronize()`` timed with ``time.perf_counter_ns``; a burst of ~B ms is
  timed as samples of ``inner`` such calls (~B/8 ms each, >= 1 call), and the burst's value is the
  median of its samples.
- ``host_us``: the time until the call returns, without synchronizing; the device is synchronized
  *before* each timed call (outside the timing) so the launch queue is empty: host dispatch overhead.
- ``device_us`` (CUDA only): the summed GPU time of every kernel/memset/memcpy the call launched, from
  ``torch.profiler`` (CUPTI); one sample per profiled call; kernel names are kept.
- ``graph_us`` (CUDA only): the call captured ``inner`` times in a CUDA graph, replayed and timed with
  CUDA events: the GPU floor without host overhead.

Inputs are rotated over several sets when one set is smaller than twice the GPU's L2, so the timed
calls do not all hit a warm L2.
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
#: Fewest samples of the CUDA-graph clock.
MIN_SAMPLES = 5


#: ``<env>/matrix-run-subject.json`` (written by the env builder, matrix_runner/subjects.py): which
#: package of the flash_attn namespace this env times; absent = flash-attn 2.x.
SUBJECT_MARKER = "matrix-run-subject.json"


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
    if mod != "flash_attn" and not mod.startswith("flash_attn."):
        raise RuntimeError(f"subject function {mod}:{attr} is outside the flash_attn namespace")
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
    if sub["package"] != "flash-attn":  # a pure-Python subject inside the flash_attn namespace (FA4)
        try:
            import importlib
            import importlib.metadata

            func = attention_func()  # sets the subject's environment before the first import
            m = importlib.import_module(sub["module"])
            fa = {"version": importlib.metadata.version(sub["package"]), "file": getattr(m, "__file__", None),
                  "ext_file": None, "subject": sub["package"]}
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
    except Exception as e:  # noqa: BLE001
        info["error"] = f"import flash_attn failed: {type(e).__name__}: {e}"
    return info


class Bench:
    """Builds the timed call for one case and measures each clock. All times in µs per call."""

    def __init__(self, case: dict, device: str, seed: int):
        import torch

        flash_attn_func = attention_func()
        self.torch = torch
        self.case = case
        self.cuda = device == "cuda"
        self.dev = torch.device(device)
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[case["dtype"]]
        b, sq, sk = case["batch"], case["seqlen_q"], case["seqlen_k"]
        h, hk, d = case["nheads"], case["nheads_k"], case["head_dim"]
        params = inspect.signature(flash_attn_func).parameters
        kw = {"dropout_p": case["dropout_p"], "softmax_scale": case["softmax_scale"], "causal": case["causal"]}
        # Keyword arguments only, filtered by the installed version's signature (window_size,
        # softcap, alibi_slopes, deterministic appeared over 2.x); defaults are left to the version.
        self.kwargs = {k: v for k, v in kw.items() if k in params}
        if case["dropout_p"] and "dropout_p" not in params:
            raise RuntimeError("this flash_attn_func has no dropout_p parameter")
        g = torch.Generator(device=self.dev).manual_seed(seed)
        set_bytes = _set_bytes(case)
        l2 = 50 * 2**20
        if self.cuda:
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", l2) or l2
        nsets = 1 if not self.cuda else max(1, min(8, math.ceil(2 * l2 / max(set_bytes, 1))))
        self.nsets = nsets
        embed = case.get("layout", "embed") == "embed"

        def mk(*shape):
            return torch.randn(*shape, generator=g, device=self.dev, dtype=torch.float32).to(self.dtype)

        self.sets = []
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
        self.i = 0

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
        return statistics.median(times[len(times) // 2:]) / 1e3

    def wall_samples(self, inner: int, budget_s: float) -> list:
        """Synchronized µs per call, samples of ``inner`` calls for ``budget_s`` s (>= 1 sample)."""
        pc, call, sync = time.perf_counter_ns, self.call, self.sync
        out = []
        t_end = pc() + int(budget_s * 1e9)
        while not out or pc() < t_end:
            t0 = pc()
            for _ in range(inner):
                call()
                sync()
            out.append((pc() - t0) / inner / 1e3)
        return out

    def host_samples(self, inner: int, budget_s: float) -> list:
        """Host dispatch µs per call (device idle before each call), like :meth:`wall_samples`."""
        pc, call, sync = time.perf_counter_ns, self.call, self.sync
        out = []
        t_end = pc() + int(budget_s * 1e9)
        while not out or pc() < t_end:
            tot = 0
            for _ in range(inner):
                sync()
                t0 = pc()
                call()
                tot += pc() - t0
            sync()
            out.append(tot / inner / 1e3)
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

    def graph(self, per_call_us: float, budget_s: float) -> dict:
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        inner = max(1, min(64, int(math.ceil(TARGET_SAMPLE_US / max(per_call_us, 1e-3)))))
        with torch.cuda.stream(s):
            if self.case["op"] == "bwd":
                # the backward must be captured on the stream its forward ran on, with leaves (and
                # their grad accumulators) created there too, not on the legacy default stream
                for st in self.sets:
                    st[0], st[1], st[2] = (t.detach().requires_grad_(True) for t in st[:3])
                    st[3] = self.torch_fwd(st)
            for _ in range(3):
                self.call()
        torch.cuda.current_stream().wait_stream(s)
        self.sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(inner):
                self.call()
        self.sync()
        g.replay()
        self.sync()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = max(MIN_SAMPLES, min(500, int(budget_s * 1e6 / (inner * max(per_call_us, 1e-3)))))
        out = []
        for _ in range(n):
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            out.append(e0.elapsed_time(e1) * 1e3 / inner)
        del g
        return {"samples": out, "inner": inner}

    def torch_fwd(self, st):
        out = self.fa(*self.split(st[0], st[1], st[2]), **self.kwargs)
        return out[0] if isinstance(out, tuple) else out

    # -- correctness ----------------------------------------------------------------------------
    def correctness(self) -> dict:
        """Max abs and relative (Frobenius) error of this version's output (fwd) or gradients (bwd)
        against an fp32 reference computed with torch on the same inputs. µs are not involved."""
        torch = self.torch
        c = self.case
        if c["dropout_p"]:
            return {"skipped": "dropout_p > 0: outputs are random"}
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
        if c["causal"]:  # flash-attn >= 2.1 aligns the causal mask to the bottom-right corner
            i = torch.arange(sq, device=scores.device)[:, None]
            j = torch.arange(sk, device=scores.device)[None, :]
            scores = scores.masked_fill(j > i + (sk - sq), float("-inf"))
        ref = (scores.softmax(-1) @ vf).transpose(1, 2)
        if c["op"] == "fwd":
            pairs = [("out", out.float(), ref)]
        else:
            g = torch.randn(ref.shape, device=ref.device, dtype=torch.float32)
            got = torch.autograd.grad(out, (xq, xk, xv), g.to(out.dtype))
            exp = torch.autograd.grad(ref, (rq, rk, rv), g)
            pairs = [(n, a.float(), e) for n, a, e in zip(("dq", "dk", "dv"), got, exp)]
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
    if "only supports CUDA" in msg or "on CUDA" in msg or "must be on CUDA" in msg or "CUDA" in msg and "cpu" in msg.lower():
        return "device-unsupported"
    return "error"


def _error_fields(rec: dict, e: BaseException) -> None:
    rec["status"] = "error"
    rec["error_kind"] = _classify(e)
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    rec["error"] = f"{type(e).__name__}: {first[:500]}"
    rec["traceback"] = traceback.format_exc()[-2000:]


def _set_bytes(case: dict) -> int:
    """Bytes of one input set of ``case``: q (batch, seqlen_q, nheads, head_dim) plus k and v
    (batch, seqlen_k, nheads_k, head_dim), 2 bytes per element (fp16/bf16)."""
    b, sq, sk = case["batch"], case["seqlen_q"], case["seqlen_k"]
    h, hk, d = case["nheads"], case["nheads_k"], case["head_dim"]
    return (b * sq * h * d + 2 * b * sk * hk * d) * 2


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

    def handle(self, cmd: dict) -> dict:
        op = cmd.get("cmd")
        cid = cmd.get("case")
        rec: dict = {"type": op, "case": cid, "status": "ok"}
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
                           seconds=round(time.perf_counter() - t0, 3))
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
                samples = fn(inner, ms / 1e3)
                rec.update(us=statistics.median(samples), n=len(samples), inner=inner)
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
                            rec["graph_us"] = b.graph(self.per_call[cid], BUDGETS["graph"])
                            break
                        except Exception as e:  # noqa: BLE001
                            err = f"graph_us unavailable: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
                            b.torch.cuda.synchronize()
                    else:
                        notes.append(err)
                rec["notes"] = notes
            elif op == "device":
                self.device_started = True
                b = self.benches[cid]
                b.warmup(0.0, min_calls=3)
                d = b.device(int(cmd.get("calls") or BUDGETS["device_calls"]))
                rec["kernels"] = d.pop("kernels")
                rec["device_us"] = d
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


def serve() -> int:
    """Lockstep worker (``worker.py serve``). Commands arrive on stdin, one JSON object per line;
    each gets exactly one reply on the original stdout, one JSON object per line (everything else
    the process prints to stdout goes to stderr, the log). First reply, unasked: ``hello`` with the
    probe (or ``fatal``). Commands (``case`` is a case id):

    - ``config {device, seed, quick}``; ``pin {cpu}`` (every thread of the process to one CPU);
    - ``setup {case, spec, warmup_s?}``: inputs, warm-up (``warmup_s``, default
      ``BUDGETS["setup_warmup"]``, at least 6 calls), calibration -> ``per_call_us``; commands may be
      sent ahead of their replies (the driver queues a prefetched set's config and set-ups);
    - ``burst {case, clock: wall|host, ms}``: a few untimed calls, then ~``ms`` of timed calls in
      samples of ~ms/8 -> ``us`` (median of the samples, µs per call), ``n``, ``inner``;
    - ``finish {case}``: correctness against an fp32 reference and the CUDA-graph clock;
    - ``device {case}``: kernel time from the profiler; after the first, bursts are refused (one
      profiler session slowed every later 2.6.3 call 2.4x on the H200);
    - ``release {case}``; ``quit``.
    A reply with ``status: error`` fails that case only; the worker goes on."""
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(rec: dict) -> None:
        proto.write(json.dumps(rec) + "\n")
        proto.flush()

    _die_with_parent()
    info = probe()
    send({"type": "hello", "schema": SERVE_SCHEMA, "pid": os.getpid(), "probe": info})
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="matrix-run timing worker (runs inside one env)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("probe")
    sub.add_parser("serve")
    a = ap.parse_args(argv)
    if a.cmd == "probe":
        print(json.dumps(probe()))
        return 0
    return serve()


if __name__ == "__main__":
    sys.exit(main())
