"""Stage 1 — the benchmark config: built-in default, YAML loading and validation.

A config is a workload description: shared settings (dtype, dropout_p, softmax_scale, causal, ops)
plus a list of shapes. It expands into :class:`Case` objects, one per (op, shape), that every env
times identically.

YAML schema (every key optional; a missing key keeps the built-in default)::

    title: "my comparison"
    dtype: fp16             # fp16 | bf16 (flash-attn 2.x supports only these); torch's names
                            # float16, bfloat16, torch.float16, torch.bfloat16 (and half) mean the same
    dropout_p: 0.0          # 0 <= dropout_p < 1
    softmax_scale: null     # null -> 1/sqrt(head_dim), as flash-attn does
    causal: false
    ops: [fwd, bwd]
    impls: [flash_attn]     # also: flash_attn+compile (torch.compile of the call), sdpa (torch's
                            # scaled_dot_product_attention: same torch in every env = an A/A control)
    input: embed            # embed: inputs are (batch, seqlen, embed_dim), split into heads in the call
                            # heads: inputs are already (batch, seqlen, nheads, head_dim)
    func: func              # the entry point timed (FUNCS): func | varlen | kvcache | qkvpacked | kvpacked |
                            # varlen_qkvpacked | varlen_kvpacked; also per shape (op_fields has the rules)
    shapes:
      - {batch: 2, seqlen: 50, nheads: 16, embed_dim: 256}
      - {batch: 4, seqlen_q: 128, seqlen_k: 512, nheads: 32, nheads_k: 8, head_dim: 64, causal: true}
      - {func: varlen, seqlens: [128, 512, 64], nheads: 16, head_dim: 64}   # or {n, min, max, seed}
      - {func: kvcache, batch: 8, seqlen_q: 1, seqlen_k: 4096, nheads: 16, nheads_k: 2, head_dim: 128,
         cache_seqlens: 1000, append_kv: false, page_block_size: null}     # kvcache: ops [fwd] only
    sampling:
      time_budget_s: 60     # wall-clock budget for the timing phase (s)
      min_effect: 0.05      # smallest ratio change called faster/slower (0.05 = 5 %)
      set_seconds: 1.0      # lockstep cycles per process set (s, at least: on while the next set starts); a set is one fresh worker per env
      max_sets: auto        # a cap on process sets; auto: 40 per minute of time_budget_s (more for sets under 1 s), at least 40: the budget or decided verdicts stop first
      burst_ms: 5           # each worker's turn in a cycle (ms of calls)
      alpha: 0.05           # family-wise error rate of a run's verdicts per clock
      workers_per_env: auto # worker processes per env in each set, averaged (auto: 1; more: see Sampling)
      host_every: 2         # the host clock is cycled in one sweep of N (wall, which decides, in every sweep)
      max_repeats: 4        # a noisier case's wall clock up to N times per sweep (runner.cycle_weights); 1: each once
      host_precision: 0.05  # a decided host comparison is cycled until its interval is within this share of its ratio
      speed_adjust: true    # compare bursts at one reference CPU speed (stats.SpeedSlope); false: plain medians
      prefetch_spawn: cycles  # when the next set's workers start: during this set's cycles, or after them
      prefetch_depth: auto  # sets whose workers start ahead of their turn (auto: Sampling.depth_for, 2-4 where spare cores hold them, else 1)
      preimport: true       # later sets' workers import, while they start, the modules earlier sets' set-ups loaded
      cuda_at_start: false  # later sets' workers create their CUDA context while they start, not in their set's set-up
      cpu_state: all        # turns a wall/host ratio counts: all, or usual (both bursts at the CPU speed most of the first set ran at)
      cpu_hop: false        # move a set's workers, between cycles, to a CPU of the set pool that runs fast now (lockstep.Hopper)
      probe_share: estimated  # how much of a set's between-worker probe difference the adjustment counts: estimated from earlier sets (stats.probe_share), or full
      min_burst_samples: 1  # the fewest timed samples a burst holds (a burst of long calls runs on until it has them)

Axes: any list value of dtype, causal, dropout_p or softmax_scale (top level), or of a shape key
(batch, seqlen, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, embed_dim, causal, dtype) is an
axis: the config expands to every combination (cartesian product; :func:`expand_axes` gives the
order). ``ops`` and ``impls`` were lists already: every value is its own case. E.g.
``{batch: [2, 512], seqlen: [50, 150, 300], nheads: 16, embed_dim: 256}`` with ``dtype: [fp16, bf16]``
is 2 x 3 x 2 = 12 shapes, 24 cases with ``ops: [fwd, bwd]``. More than :data:`MAX_CASES` cases are
refused unless the caller allows them (``--yes``). ``seqlens`` and ``cache_seqlens`` are lists by
nature (one length per sequence / batch entry): they are axes only as a list of lists.

Built-in configs (``matrix_runner/configs/*.yaml``) are found by name: ``load_config("varlen")``.

Errors: :class:`ConfigError` (a ``ValueError``) naming the key, the value and the rule.
"""
from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError

#: The clocks a case is timed with, µs per call (worker.py, DEVELOPERS.md "Measurement method"):
#: wall (call + synchronize), host (until the call returns), device (the profiler's kernel time),
#: graph (CUDA-graph replay). One list for the runner, the results, the report.
METRICS = ("wall_us", "host_us", "device_us", "graph_us")
#: The clocks timed in lockstep cycles (paired per cycle); device and graph are timed once per set.
CYCLED = ("wall_us", "host_us")
#: The clocks a table shows side by side (graph_us is a detail of the report's case rows).
SHOWN = METRICS[:3]

DTYPES = ("fp16", "bf16")
#: torch's names for the two dtypes, accepted in a config and stored as the short ones (case ids
#: keep ``fp16`` / ``bf16``).
DTYPE_ALIASES = {"float16": "fp16", "half": "fp16", "torch.float16": "fp16", "torch.half": "fp16",
                 "bfloat16": "bf16", "torch.bfloat16": "bf16"}
#: Top-level settings whose list value is an axis (``ops`` and ``impls`` are lists anyway).
TOP_AXES = ("dtype", "causal", "dropout_p", "softmax_scale")
#: Largest number of cases (shapes x ops x impls after expanding the axes) accepted without
#: ``--yes``: at ~1 s of cycles per case and process set, 500 cases already need a long budget.
MAX_CASES = 500
#: What is timed: flash_attn_func (default); torch.compile of the same call (default mode; the fix
#: suggested upstream for the Python overhead); torch's scaled_dot_product_attention on the same
#: inputs — the same torch in every env, so it is a built-in A/A control of the comparison.
IMPLS = ("flash_attn", "flash_attn+compile", "sdpa")
IMPL_SUFFIX = {"flash_attn+compile": "compile", "sdpa": "sdpa"}
OPS = ("fwd", "bwd")
#: Entry points (a case's ``func``) -> the flash_attn function timed. ``func`` is the default, so
#: configs without ``func`` keep their cases and case ids.
FUNCS = {"func": "flash_attn_func", "varlen": "flash_attn_varlen_func", "kvcache": "flash_attn_with_kvcache",
         "qkvpacked": "flash_attn_qkvpacked_func", "kvpacked": "flash_attn_kvpacked_func",
         "varlen_qkvpacked": "flash_attn_varlen_qkvpacked_func", "varlen_kvpacked": "flash_attn_varlen_kvpacked_func"}
#: Entry points without a backward (flash_attn_with_kvcache is inference only).
FWD_ONLY_FUNCS = ("kvcache",)
#: Head dims flash-attn 2.x dispatches to: a call runs the kernel of the smallest one that is >= its
#: head_dim rounded up to a multiple of 8 (``HEADDIM_SWITCH`` in csrc/flash_attn/src/static_switch.h
#: of 2.6.3 and 2.7.0.post2; 2.6.3 pads to a multiple of 8 in C++, 2.7 in Python). Both ship stale
#: hdim224 files that neither builds nor dispatches to. Source builds read the list from the
#: version's own static_switch.h (:func:`matrix_runner.build.read_dispatch`); this is the fallback.
KERNEL_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256)
MAX_HEAD_DIM = 256


class ConfigError(UsageError):
    """A config value breaks a rule. The message names the key, the value and the rule."""


def causal_pairs(sq: int, sk: int) -> int:
    """(query, key) pairs a bottom-right aligned causal mask lets through for ``sq`` queries and ``sk``
    keys (flash-attn >= 2.1; :meth:`Case.flops`)."""
    return sq * sk - sq * (sq - 1) // 2 if sq <= sk else sk * (sk + 1) // 2


@dataclass(frozen=True)
class Case:
    """One timed call: an op on one shape with the shared settings.

    Shapes: q is (batch, seqlen_q, nheads, head_dim), k and v are (batch, seqlen_k, nheads_k, head_dim).
    With ``layout == "embed"`` the inputs are (batch, seqlen, nheads*head_dim) tensors and the split
    into heads (a ``view``) happens inside the timed call, as in the workload that started matrix-run.
    """

    op: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    head_dim: int
    dtype: str = "fp16"
    causal: bool = False
    dropout_p: float = 0.0
    softmax_scale: float | None = None
    layout: str = "embed"
    impl: str = "flash_attn"
    #: Entry point (:data:`FUNCS`); the fields below belong to some of them (:func:`op_fields`).
    func: str = "func"
    #: varlen*: tokens per sequence (q and k alike); batch = len, seqlen_q = seqlen_k = max.
    seqlens: tuple[int, ...] | None = None
    #: kvcache: tokens already in the cache per batch entry (passed as an int32 tensor);
    #: None: not passed, the whole cache (seqlen_k tokens) is attended.
    cache_seqlens: tuple[int, ...] | None = None
    #: kvcache: seqlen_q new k/v tokens are passed and written into the cache after cache_seqlens.
    append_kv: bool = False
    #: kvcache: paged cache of blocks of this many tokens (a multiple of 256), with a block_table
    #: (None: contiguous); without cache_seqlens, cache_seqlens = seqlen_k is passed.
    page_block_size: int | None = None

    @property
    def id(self) -> str:
        """Stable identifier shared by every env, e.g. ``fwd-b2-sq50-sk50-h16-hk16-d16-fp16``."""
        s = (f"{self.op}-b{self.batch}-sq{self.seqlen_q}-sk{self.seqlen_k}-h{self.nheads}"
             f"-hk{self.nheads_k}-d{self.head_dim}-{self.dtype}")
        if self.causal:
            s += "-causal"
        if self.dropout_p:
            s += f"-p{self.dropout_p:g}"
        if self.softmax_scale is not None:
            s += f"-s{self.softmax_scale:g}"
        if self.impl != "flash_attn":
            s += "-" + IMPL_SUFFIX[self.impl]
        if self.func != "func":  # ids of flash_attn_func cases are those of every earlier run
            s = s.replace(f"{self.op}-", f"{self.op}-{self.func}-", 1) + _func_id_suffix(self)
        return s

    @property
    def scale(self) -> float:
        """softmax_scale actually used: the configured one, else 1/sqrt(head_dim) (flash-attn's default)."""
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def kernel_head_dim(self) -> int:
        """Head dim of the kernel flash-attn dispatches to (see :data:`KERNEL_HEAD_DIMS`)."""
        return kernel_head_dim(self.head_dim)

    @property
    def label(self) -> str:
        """Short human label: ``B2 S50 H16 D16`` (+ seqlen_k, nheads_k, causal when they differ)."""
        s = f"B{self.batch} S{self.seqlen_q}"
        if self.seqlen_k != self.seqlen_q:
            s += f"/{self.seqlen_k}"
        s += f" H{self.nheads}"
        if self.nheads_k != self.nheads:
            s += f"/{self.nheads_k}"
        s += f" D{self.head_dim}"
        if self.causal:
            s += " causal"
        if self.impl != "flash_attn":
            s += f" [{IMPL_SUFFIX[self.impl]}]"
        if self.func != "func":
            s = f"{self.func} " + s + _func_label_suffix(self)
        return s

    def flops(self) -> float:
        """FLOPs of one call: 4·H·D per (query, key) pair attended (two matmuls), summed over the
        batch; bwd is 2.5x fwd (flash-attn's benchmarks/benchmark_flash_attention.py's factor).

        Non-causal, a sequence of Sq queries and Sk keys attends Sq·Sk pairs. Causal, the mask is
        bottom-right aligned (flash-attn >= 2.1): query row r sees Sk - Sq + r + 1 keys, so
        Sq·Sk - Sq(Sq-1)/2 pairs where Sq <= Sk, and Sk(Sk+1)/2 where Sq > Sk (the first Sq - Sk rows
        see none) -- :func:`causal_pairs`. For Sq = Sk = n that is n(n+1)/2, (n+1)/n of the n²/2
        flash-attn's benchmark counts; for decode-like shapes (Sq << Sk) the halving was wrong by up
        to 2x, and func and kvcache calls of the same work had read 2x apart (new-user trial).
        varlen*: per sequence, Sq = Sk = L_i. kvcache: per batch entry, Sk = the keys attended
        (cache_seqlens[i], + Sq when appending)."""
        hd = 4.0 * self.nheads * self.head_dim
        if self.func == "kvcache":
            pairs = [(self.seqlen_q, k) for k in self.keys_attended()]
        elif self.seqlens is not None:
            pairs = [(n, n) for n in self.seqlens]
        else:
            pairs = [(self.seqlen_q, self.seqlen_k)] * self.batch
        f = hd * sum(causal_pairs(sq, sk) if self.causal else sq * sk for sq, sk in pairs)
        return f * (2.5 if self.op == "bwd" and self.func != "kvcache" else 1.0)

    def keys_attended(self) -> list[int]:
        """kvcache: keys each batch entry attends to: cache_seqlens[i] (seqlen_k when not passed),
        + seqlen_q when the new k/v are appended."""
        lens = list(self.cache_seqlens) if self.cache_seqlens is not None else [self.seqlen_k] * self.batch
        return [n + (self.seqlen_q if self.append_kv else 0) for n in lens]

    def kv_read_bytes(self) -> int | None:
        """kvcache: bytes of k_cache and v_cache a call must read, given cache_seqlens: the sum over
        batch entries of K_i (:meth:`keys_attended`) · nheads_k · head_dim · 2 (k and v) · 2 bytes
        (fp16/bf16). A lower bound of the HBM traffic (q, the output and split-KV partial results
        are not counted; a paged block is counted only for the tokens used). None for other funcs."""
        if self.func != "kvcache":
            return None
        return sum(self.keys_attended()) * self.nheads_k * self.head_dim * 2 * 2

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        d["softmax_scale"] = self.scale
        return d


def kernel_head_dim(head_dim: int, dispatch: tuple[int, ...] = KERNEL_HEAD_DIMS) -> int:
    """Kernel head dim for ``head_dim``: round up to a multiple of 8, then to the next size in
    ``dispatch`` (the version's ``HEADDIM_SWITCH`` list). Raises ConfigError above the largest."""
    padded = -(-head_dim // 8) * 8
    for d in sorted(dispatch):
        if padded <= d:
            return d
    raise ConfigError(f"head_dim {head_dim} is above flash-attn's limit of {MAX_HEAD_DIM}")


@dataclass
class Sampling:
    """How long to sample (runner module doc). ``time_budget_s``, ``set_seconds``: seconds of wall
    clock; ``burst_ms``: milliseconds; ``alpha``: family-wise error rate per clock."""

    time_budget_s: float = 60.0
    min_effect: float = 0.05
    #: Seconds of lockstep cycles per process set. Measured side by side (H200, 2026-12-03, seed and
    #: A/A runs, benchmarks/results/h200-runs-12-03-sets.txt): with the next sets' workers started
    #: two sets ahead (``prefetch_depth``), 1.5 s sets last 1.8-2.0 s once kernel time is decided
    #: and a minute holds 19-24 of them instead of 12-13 of 3 s; a batch-2 set's log ratio spreads
    #: hardly more with half the cycles (its spread is mostly between processes), so the seed
    #: run's batch-2 fwd intervals narrowed from a median of +-4.5-4.8 % to +-3.4 % (six runs).
    #: 1.0 s with the workers three sets ahead (H200, 2026-12-03 afternoon, three seed and three
    #: A/A runs each, alternated with 1.5 s in the same device calls; benchmarks/results/
    #: h200-runs-12-03-s10.txt): 26-30 sets a minute instead of 21-23; seed batch-2 fwd median
    #: +-3.8 % vs +-4.5 % (max 5.3 vs 6.5), bwd +-3.5 vs +-3.8 %, batch 512 alike; A/A batch-2 fwd
    #: wider, +-1.85 vs +-1.52 % (an A/A set's spread is mostly its own cycles', fewer in a shorter
    #: set; six runs vs seven), bwd +-2.52 vs +-2.44 %: a trade for the comparisons that differ.
    set_seconds: float = 1.0
    #: Most process sets. In a config ``auto`` (the default): :data:`MAX_SETS_PER_MINUTE` per minute of
    #: ``time_budget_s``, at least that many (:meth:`follow_budget`), so that the budget, not this
    #: cap, ends a longer run (a minute holds 24-32 sets on the H200): with a fixed 40, a run given
    #: ``--time-budget 240`` would stop at its 40th set, ~75-90 s in, as would a ``--resume
    #: --time-budget 120`` of a one-minute run (the 150 s A/A runs of 2026-12-06 held 77-82 sets,
    #: reports/h200-aa-150s-12-06-*; longer budgets are how a run narrows its intervals,
    #: benchmarks/results/budget-forecast-12-06.txt).
    max_sets: int = 40
    #: Whether ``max_sets`` follows the budget (config ``max_sets: auto`` and no ``--max-sets``).
    max_sets_auto: bool = False
    burst_ms: float = 5.0
    alpha: float = 0.05
    #: A decided comparison is sampled on until its interval's upper end is within this share of its
    #: ratio, and the run goes on (within its budget) until every one is: precise ratios, not just verdicts.
    precision: float = 0.01
    #: The same for the host clock's comparisons (it explains a wall difference, the wall clock
    #: decides it): a decided host comparison whose interval's upper end is within this share of its
    #: ratio is no longer cycled, and its cycles go to the wall items still being narrowed. 0.01
    #: (until 2026-12-03 evening, as the wall clock) kept nearly every host item in the cycles; 1.0
    #: (drop once decided) was measured (see ``max_repeats``) and left the seed's host intervals at
    #: median +-16 % (batch 2) and +-33 % (batch 512) instead of +-5 % and +-8 %: too loose to say how
    #: much of a difference is host overhead. 0.05 keeps a decided host interval sampled to +-5 %;
    #: in an A/A run it acts nearly as 1.0 did (a "same" host interval lies inside +-5 % of 1 already).
    #: 0.05 on the H200 (2026-12-03 night, 13 runs, benchmarks/results/h200-runs-12-03-m4.txt): seed
    #: host intervals +-5.1 % (batch 2) and +-10.6 % (batch 512), medians in the CPU's fast state.
    host_precision: float = 0.05
    #: Most process sets that take a case's kernel time (profiler pass) and CUDA-graph clock (both
    #: are also skipped once decided). Kernel time hardly varies between processes, but glitched
    #: profiler sets (seed run: B512 S300 bwd [0.44, 2.95]) kept the profiler in every set of a run;
    #: the glitch was the next set's set-ups running on the GPU beside the profiled calls (fixed
    #: 2026-12-01: runner._Set.await_setups; since then kernel time is decided within 6-7 sets).
    clock_sets: int = 12
    #: Most times one case's wall clock is timed per sweep of a set's cycles (:func:`runner.cycle_weights`:
    #: in proportion to its per-cycle variance in earlier sets); 1 = every case once per sweep.
    #: Measured (H200): with 3 s sets (2026-12-01) it did not help -- a batch-2 set's spread was
    #: between sets, not within, and the batch-512 intervals widened; with 1.5 s sets (2026-12-03,
    #: benchmarks/results/h200-runs-12-03-sets.txt) a set's own cycles are a larger share of its
    #: spread, and 2 narrowed the batch-2 wall intervals (A/A median +-1.4 % fwd, +-2.5 % bwd vs
    #: +-1.9 %, +-2.8 % over 4 and 6 runs; 9-12 of 12 A/A intervals inside +-3 % vs 8-10; seed
    #: batch-2 fwd +-3.0 % vs +-3.4 %) at some cost to the seed's batch-512 fwd (+-1.7 % vs +-1.5 %).
    #: 4 since 2026-12-03 evening, with ``host_precision`` 0.05 (H200, alternated in the same device
    #: calls, benchmarks/results/h200-runs-12-03-r4.txt: max_repeats 4 with host items dropped once
    #: decided vs the default then, 5 A/A pairs and 2 seed pairs): the batch-2 wall items got 9.4
    #: cycles per set instead of 7.0; A/A batch-2 bwd median +-1.82 % vs +-2.24 % (max 2.20 vs
    #: 5.25), fwd +-1.23 % vs +-1.62 %, batch 512 alike (+-0.95 %); 12 of 12 A/A intervals inside
    #: +-3 % in 4 of 5 runs vs 2 of 5; seed batch-2 fwd +-2.03 % vs +-2.73 %, batch-512 fwd +-1.26 %
    #: vs +-1.05 % (two runs each). With host_precision 0.05 (13 runs that night, not alternated,
    #: h200-runs-12-03-m4.txt): A/A batch-2 fwd +-1.22 %, bwd +-1.67 % (fast state), 12 of 12 inside
    #: +-3 % in three runs in a row; seed batch-2 fwd +-2.46 % (fast state), 7.9 wall cycles per set.
    max_repeats: int = 4
    #: The host clock (dispatch overhead; it explains a wall difference, the wall clock decides it)
    #: is cycled in one sweep of ``host_every``, the wall clock in every sweep. Measured (H200,
    #: 2026-12-01, reports/h200-variant-host4-*): 4 gave each wall item ~7.8 cycles per set instead
    #: of ~6.4, but no narrower wall intervals in 3 A/A + 2 seed runs (batch-2 median ±5.3 % fwd,
    #: ±4.5 % bwd vs ±5.0 %, ±5.7 % at 2), while the host intervals widened (median ±15 % vs ±11 %)
    #: and 1-2 of 12 seed host comparisons were left ambiguous, so the default stays 2.
    host_every: int = 2
    #: Each burst's value is taken at a reference CPU speed read by the speed probe between its
    #: samples (stats.SpeedSlope); False: the bursts' plain medians (the raw ones are kept either way).
    speed_adjust: bool = True
    #: When the next process set's workers are started (they import torch and the subject on spare
    #: cores): ``cycles`` -- during this set's cycles (their start then costs nothing); ``after`` --
    #: once this set's cycles are over (the import load on other vCPUs can slow the set's own vCPU
    #: under a hypervisor: benchmarks/cpu_contention.py).
    prefetch_spawn: str = "cycles"
    #: A set's workers import, before their hello, the modules the set-ups of earlier sets' workers
    #: of their env loaded (runner: the *pre-import*; worker.preimport), so a subject's lazy imports
    #: run while the previous set is timed instead of in this set's set-up: flash-attn 2.7.0.post2's
    #: first call imports torch._dynamo (~1 s of its 1.1-1.5 s set-up per set on the H200).
    preimport: bool = True
    #: A set's workers create their CUDA context while they start (sets ahead of their turn, on
    #: spare cores, beside another set's cycles: worker.cuda_at_start) instead of in their first
    #: set-up, which their set waits for (~0.34 s of a 1.5 s set on the H200, 2026-12-04). Off:
    #: alternated with the default on the H200 (2026-12-04, 4 seed + 4 A/A runs each,
    #: benchmarks/results/h200-runs-12-04.txt) it gave 10 % more sets, but a context made on the GPU
    #: beside a set's cycles disturbed the batch-512 bursts: A/A batch-512 fwd median +-1.79 % vs
    #: +-0.98 %, seed batch-512 bwd +-2.66 % vs +-1.46 %, 4 "ambiguous" A/A verdicts vs none.
    cuda_at_start: bool = False
    #: Which lockstep cycles a wall/host comparison counts: ``all`` (default), or ``usual`` -- only
    #: the cycles whose two bursts both ran at the comparison's usual CPU speed (the speed probe
    #: within 1.3x of the shorth mode of its first set's readings: stats.usual_speed,
    #: stats.STATE_REACH; needs ``speed_adjust``, which takes the readings); the others are left out
    #: and counted (``state_dropped``). Why: the H200 machine's vCPU runs at two speeds (probe ~3.4 and ~7.5 µs), and a call whose wall time is part
    #: host, part kernel has a different ratio in each (batch-512 S50 fwd 2.7.0.post2/2.6.3, the
    #: turns of the 27 seed runs of 2026-12-04: median 1.114 where both versions ran fast, 1.199 where
    #: both ran slow), so a set's value moves with the share of its turns that hit the slow state:
    #: most of the batch-512 fwd set spread. With ``usual`` the ratio is the one at the speed most of
    #: the comparison's first set ran at (fixed for the run). Replayed on the 54 H200 runs of 2026-12-04
    #: (benchmarks/cpu_state_replay.py, benchmarks/results/cpu-state-replay-12-04.txt): in the 7
    #: fast-state seed runs the batch-512 fwd intervals narrowed from a median of +-1.21 % to +-0.61 %
    #: (<= 1 % in 15 of 21 instead of 5), but the A/A runs lost the turns left out (fast state: all
    #: 12 wall intervals inside +-3 % in 2 of 10 runs instead of 8), and in the slow state it gained
    #: nothing (seed +-2.03 % vs +-1.88 %). Live, alternated with the default (H200, 2026-12-04
    #: afternoon, 22 runs, all in the slow state, benchmarks/results/h200-runs-12-04-d.txt): seed
    #: batch-512 fwd median +-1.94 % vs +-2.10 %, batch-2 fwd +-4.37 % vs +-3.67 %. CPU self-check with
    #: it (benchmarks/results/cpu-selfcheck-cpu-state-usual.txt): A/A 0/40 not "same", --quick 0/8
    #: faster/slower, planted 4/4 found. Not the default.
    cpu_state: str = "all"
    #: Move a process set, between its cycles, to a CPU of the set pool that a scout process reads
    #: at the fast speed now, whenever the set's own probe readings turn slow (lockstep.Hopper: the
    #: measurements behind it); with --cpus auto the pool is then half the CPUs beside the driver's,
    #: at least 4 (lockstep.pool_size). Needs
    #: ``speed_adjust`` (the readings it judges by) and does nothing unpinned or with one set CPU.
    #: Measured side by side with the default (H200, 2026-12-04, 9 pairs of runs,
    #: benchmarks/results/h200-runs-12-04-e.txt): the sets' cycles at the slow level fell from a
    #: median of 70 % of a run to 41 %, and the seed batch-2 intervals narrowed (forward median
    #: +-2.31 % vs +-2.94 %), but batch-512 forward did not (+-1.73 % both), the worst intervals grew
    #: (+-6.77 % vs +-4.17 %) and the A/A ones widened a little (batch-2 bwd +-2.36 % vs +-1.91 %);
    #: sets with more moves had wider cycle spreads (batch-2 within-set SD of cycle log ratios, sets
    #: mostly fast, 0.047 with 0-5 moves vs 0.076 with more than 15: benchmarks/hop_spread.py; a
    #: correlation, sets move after slow cycles). Not the default.
    cpu_hop: bool = False
    #: The fewest timed samples a burst holds (worker ``burst``: a burst of ``burst_ms`` is timed as
    #: samples of about ``burst_ms``/8 and at least one call each, until its time is up): 1, the
    #: default, as every run so far; more makes a burst of long calls run on until it holds that many,
    #: so that its median passes over a stalled sample. Why (H200, 2026-12-05, the burst trace of
    #: three A/A runs: benchmarks/burst_samples.py): a 5 ms burst held a median of 2 samples of
    #: batch-512 S300 backward (~3.1 ms a call) and 4 of S150 backward, 1-3 % of batch-512 samples were
    #: 1.4x their case's median or more, and one such sample was its burst's and, with about two
    #: cycles of such a case a set, its set's value (A/A intervals of +-5-11 % from one set). With 5,
    #: that case's bursts take ~15 ms instead of ~6. On the H200, alternated with the default
    #: (2026-12-05, benchmarks/variant-min-samples5.yaml, benchmarks/results/h200-runs-12-05-b.txt):
    #: in two seed pairs no narrowing (batch-512 forward median +-2.11 % vs +-1.81 %), one A/A pair
    #: 12 vs 11 of 12 inside +-3 %; too few to decide: an option, not the default.
    min_burst_samples: int = 1
    #: How much of a process set's *between-worker* speed-probe difference (one worker's probe reading
    #: higher than its partner's over the whole set) the speed adjustment counts: ``estimated`` (the
    #: default) -- the share the earlier pinned sets' plain call ratios followed (stats.probe_share;
    #: once stats.PROBE_SHARE_MIN_SETS = 3 earlier pinned sets give it; before that, and in a set that
    #: ran unpinned, all of it); ``full`` -- all of it, as if it were CPU speed the calls felt (the
    #: within-set slope applied to it; the default until the evening of 2026-12-04). Why: on the 2-core CPU machine a
    #: worker's probe can read 20-25 % slower than its partner's for a whole set while their calls
    #: match, and ``full`` turned that into a 20-25 % A/A set ratio (CPU self-check 2026-12-04 evening,
    #: A/A 8 of 40 comparisons not "same", all from such sets); on the H200 the share over a run is ~1
    #: (median 0.94 over 65 runs), the workers of a set meeting different CPU speeds, so there it
    #: changes little. Replayed offline (benchmarks/probe_center_replay.py --min-sets 3,
    #: benchmarks/results/probe-center-replay-12-04-b.txt): CPU self-check A/A "same" 36 of 36 vs 27 of 36
    #: with ``full``, 1 of 72 intervals excluding 1 vs 0; the H200's 65 default runs nearly as run (A/A
    #: "same" 341 of 348 both, A/A batch-2 median +-1.95 % vs +-1.92 %, seed batch-2 fwd +-3.46 % vs
    #: +-3.44 %). Live on the CPU machine (benchmarks/results/cpu-selfcheck-s26.txt): two self-checks,
    #: A/A 0 of 40 not "same" each; on their cycles ``full`` gave batch-2 intervals of median +-1.51 % and
    #: +-1.65 % against +-1.33 % and +-1.44 %. Not yet run live on the H200 at 3 sets (two runs at 8:
    #: benchmarks/results/h200-runs-12-04-g.txt). With ``speed_adjust: false`` there is no adjustment
    #: to share, and the default falls back to ``full``. Since 2026-12-05 ``estimated`` does not carry
    #: its share beyond the differences it was estimated on: a set's difference counts only up to
    #: stats.PROBE_SHARE_REACH (3) times the earlier sets' largest, and in the first sets, before a
    #: share, a set-wide one only up to stats.PROBE_FIRST_REACH (the report counts the sets held).
    probe_share: str = "estimated"
    #: Not a config key: the earlier pinned sets before ``estimated`` gives a share, where a --resume
    #: keeps the one its run started with (settings.probe_share_min_sets; 8 for runs made before the
    #: late evening of 2026-12-04); None: stats.PROBE_SHARE_MIN_SETS.
    probe_share_min_sets: int | None = None
    #: Workers per env in each process set: a set's value averages its processes (one worker
    #: process of a version can sit a few % off another). None (auto): 1. Measured side by side
    #: (H200, 2026-12-02, default config, 60 s; benchmarks/results/h200-lockstep-runs-12-02.txt):
    #: with 1 per env a set's cycles hold ~12 cycles of each case instead of ~5.7 with 2, and the
    #: batch-2 set log ratios spread less (set SD 0.022-0.038 vs 0.034-0.055 over three A/A runs
    #: each), so the batch-2 wall intervals were narrower (median +-5.0 % vs +-7.0 %, 11 vs 10
    #: sets); the per-process offsets that 2 average did not show up as a larger between-set part.
    #: Until then the default was 2 where spare cores let the next set start during a set.
    workers_per_env: int | None = None
    #: Seconds of cycles in a ``--quick`` run's single set.
    quick_set_seconds: float = 2.0
    #: Seconds a set costs beyond its cycles (correctness, graph, profiler while undecided; start
    #: and set-up overlap the previous set), for planning (H200, seed config, one worker per env,
    #: pre-import: 4.0-4.4 s per set of 3 s of cycles after the first, 13 sets in 60 s, in the
    #: runs of 2026-12-03, reports/h200-2.6.3-vs-2.7.0.post2-12-03-pre-2..4 and h200-aa-29..35;
    #: 1.9 before the pre-import, when sets lasted 4.5-5.3 s).
    #: 1.0-1.2 in the 1.0 and 1.5 s runs of 2026-12-03 afternoon (timing seconds / sets - set_seconds).
    SET_OVERHEAD_S = 1.1
    #: A set's cycles may run up to this many times ``set_seconds`` while the next set's workers are
    #: still importing (runner._cycles: on the 2-core CPU machine the import took ~3.6 s beside 1-2 s
    #: of cycles, and the next set's start waited for it idle).
    EXTEND_FACTOR = 5.0
    #: Seconds the next set's workers take to start (import torch and the subject), estimated before
    #: anything is timed (pipeline: the driver's own torch import x workers per spare core); 0: unknown.
    start_s: float = 0.0
    #: Whether the next set's workers start during a set (spare cores; else after it).
    prefetch: bool = True
    #: How many sets ahead workers are started (spawned on spare cores; only the next set's are
    #: set up, after this set's cycles): with 1, a set lasts at least as long as the next set's
    #: workers take to import torch, the subject and the pre-import (~2.8 s for 2.7.0.post2 on the
    #: H200, so cycles shorter than that only made sets wait); with 2 they have two sets' time,
    #: with 3 (1.0 s sets) three. None (auto): :meth:`depth_for`.
    prefetch_depth: int | None = None
    #: Seconds of the budget spent before the first set (the driver's probe and plan).
    before_s: float = 0.0
    #: Seconds the run's results take to be put together after its last set (the comparisons of
    #: every clock: pipeline measures it on each partial results write, the runner's budget check
    #: keeps it back; H200, 2026-12-04: ~0.1 s, and one A/A run ended at 60.1 s without it).
    finish_s: float = 0.0
    #: The planned number of sets fixed by an earlier part of this run (``--resume``): kept, so
    #: the confidence sequence's mixing stays the one its first sets were judged with.
    planned: int | None = None

    @staticmethod
    def depth_for(spare: int, n_workers: int, start_s: float = 0.0, set_seconds: float = 0.0) -> int:
        """The auto prefetch depth: 1 where the ``spare`` cores hold fewer than two sets' workers
        (``n_workers`` each); else the fewest sets ahead whose cycles (``set_seconds`` each) outlast
        a worker's start (``start_s``; 0 = unknown), at least 2 (one set importing beside the next
        one waiting), at most 4 and at most as many sets' workers as the spare cores hold."""
        room = spare // max(1, n_workers)
        if room < 2:
            return 1
        want = math.ceil(start_s / set_seconds) if start_s > 0 and set_seconds > 0 else 2
        return max(2, min(4, room, want))

    def follow_budget(self) -> None:
        """With ``max_sets_auto``: ``max_sets`` = :func:`auto_max_sets` of the budget and set length."""
        if self.max_sets_auto:
            self.max_sets = auto_max_sets(self.time_budget_s, self.set_seconds)

    @property
    def planned_sets(self) -> int:
        """Sets the budget should hold (>= 4): the confidence sequence is tuned to be narrowest
        there (stats.lai_mixing). Fixed from the settings and the machine's pace before anything is
        measured (never from measured times of the cases, so the intervals keep their level): a set
        lasts its cycles, or as long as the next set's workers take to start where that is longer
        (``EXTEND_FACTOR`` cap), plus ``SET_OVERHEAD_S``; the first set also waits for its own
        workers. Tuned for too many sets the sequence is much wider at the few it gets (at 7 sets,
        tuned for 17: 2.79 vs 2.22 set SDs at alpha 0.05/4); tuned for a few too few it is ~2 % wider."""
        if self.planned is not None:
            return self.planned
        per = self.set_estimate_s
        first = per + max(0.0, self.start_s) if self.prefetch else per
        n = 1 + (self.time_budget_s - self.before_s - first) / per
        return max(4, min(self.max_sets, round(n)))

    @property
    def max_set_seconds(self) -> float:
        """Most ``set_seconds`` the budget takes: half of it (an interval needs two process sets)."""
        return self.time_budget_s / 2

    @property
    def max_burst_ms(self) -> float:
        """Most ``burst_ms`` a set's cycles take: half of ``set_seconds`` (a set holds at least one
        cycle of two workers' bursts)."""
        return 500 * self.set_seconds

    @property
    def set_estimate_s(self) -> float:
        """Seconds a process set after the first should last, from the settings and the machine's
        pace (:attr:`planned_sets`): its cycles, or as long as the next set's workers take to start
        where that is longer (``EXTEND_FACTOR`` cap), plus ``SET_OVERHEAD_S``; without prefetch the
        workers' start is added."""
        start = max(0.0, self.start_s)
        if self.prefetch:
            # workers spawned ``depth`` sets ahead have that many sets' cycles to start in
            ahead = start / max(1, self.prefetch_depth or 1)
            return max(self.set_seconds, min(ahead, self.EXTEND_FACTOR * self.set_seconds)) + self.SET_OVERHEAD_S
        return self.set_seconds + start + self.SET_OVERHEAD_S


@dataclass
class Config:
    """A validated config: settings, shapes expanded into :class:`Case` objects, sampling rules."""

    title: str
    cases: list[Case]
    sampling: Sampling = field(default_factory=Sampling)
    source: str = "built-in default"
    #: ``explain:`` settings over explain.DEFAULTS (``--explain``: e.g. ``profile_s``, ``sampler_cycles``)
    explain: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


#: The workload that started matrix-run: batch 2 and 512, seqlen 50-300, 16 heads, embed_dim 256
#: (head_dim 16, dispatched to the hdim32 kernels), fp16, non-causal, no dropout, fwd and bwd.
DEFAULT_CONFIG: dict[str, Any] = {
    "title": "flash-attn: small-batch host overhead (batch 2 and 512, seqlen 50-300, 16 heads, embed_dim 256)",
    "dtype": "fp16",
    "dropout_p": 0.0,
    "softmax_scale": None,
    "causal": False,
    "ops": ["fwd", "bwd"],
    "input": "embed",
    "shapes": [
        {"batch": 512, "seqlen": 50, "nheads": 16, "embed_dim": 256},
        {"batch": 512, "seqlen": 150, "nheads": 16, "embed_dim": 256},
        {"batch": 512, "seqlen": 300, "nheads": 16, "embed_dim": 256},
        {"batch": 2, "seqlen": 50, "nheads": 16, "embed_dim": 256},
        {"batch": 2, "seqlen": 150, "nheads": 16, "embed_dim": 256},
        {"batch": 2, "seqlen": 300, "nheads": 16, "embed_dim": 256},
    ],
    "sampling": {"time_budget_s": 60.0, "min_effect": 0.05, "set_seconds": 1.0, "max_sets": "auto", "burst_ms": 5.0,
                 "alpha": 0.05},
}

_TOP_KEYS = {"title", "dtype", "dropout_p", "softmax_scale", "causal", "ops", "input", "shapes", "sampling", "impls",
             "func", "explain"}
#: ``explain:`` keys (the explain pass's settings, matrix_runner/explain.py DEFAULTS: there they are
#: documented) and whether each is a whole number.
_EXPLAIN_KEYS = {"rounds": True, "burst_ms": False, "profile_s": False, "rate": True, "count_calls": True,
                 "warmup_s": False, "sampler_cycles": True, "sampler_loop_s": False, "sampler_lead_s": False}
#: ``explain:`` keys that may be 0 (the others must be > 0: a zero profile or loop measures nothing)
_EXPLAIN_MAY_BE_ZERO = {"warmup_s", "sampler_lead_s"}
#: upper bounds, with why
_EXPLAIN_MAX = {"rate": (10000, "py-spy samples per second; beyond ~1000 it misses samples"),
                "profile_s": (600, "seconds sampled per env"), "sampler_loop_s": (1, "seconds of one loop turn"),
                "burst_ms": (1000, "ms per layer burst")}
_SHAPE_KEYS = {"batch", "seqlen", "seqlen_q", "seqlen_k", "nheads", "nheads_k", "head_dim", "embed_dim",
               "causal", "dtype"} | {"func", "seqlens", "cache_seqlens", "append_kv", "page_block_size"}
_SAMPLING_KEYS = {"time_budget_s", "min_effect", "set_seconds", "max_sets", "burst_ms", "alpha", "workers_per_env",
                  "host_every", "max_repeats", "speed_adjust", "prefetch_spawn", "preimport",
                  "prefetch_depth", "host_precision", "cuda_at_start", "cpu_state", "cpu_hop", "probe_share",
                  "min_burst_samples"}
#: Keys of the earlier sampling design (one worker process per round), with what replaced them.
_OLD_SAMPLING_KEYS = {"min_rounds": "the anytime-valid intervals need no minimum: remove it",
                      "max_rounds": "use max_sets (process sets of one worker per env)"}


def _err(where: str, value: Any, rule: str) -> ConfigError:
    """``where = value: rule``, the value as the YAML that gave it spells it (null, true, false; a
    new-user trial read ``cpu_state = True`` for ``cpu_state: yes``)."""
    shown = {None: "null", True: "true", False: "false"}.get(value, repr(value)) if isinstance(value, (bool, type(None))) \
        else repr(value)
    return ConfigError(f"{where} = {shown}: {rule}")


#: A number in exponent form that YAML 1.1 (PyYAML) leaves a string: no dot or an unsigned exponent.
_EXP_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")
#: Least seconds of cycles per process set (a set is fresh workers set up for every case: below
#: this it holds hardly a cycle; 1e-9 gave sets of 0 cycles, new-user trial 2026-12-03).
MIN_SET_SECONDS = 0.1
#: ``sampling.max_sets: auto``: this many process sets per minute of the time budget (and at least
#: this many): above the 24-32 a minute the H200 holds, so the budget stops a run first.
MAX_SETS_PER_MINUTE = 40


def auto_max_sets(time_budget_s: float, set_seconds: float = 1.0) -> int:
    """``sampling.max_sets: auto``: :data:`MAX_SETS_PER_MINUTE` per minute of the budget for sets of
    1 s of cycles or longer, proportionally more for shorter ones (0.5 s sets: 80 a minute; the
    H200 held 35-48 of them a minute, reports/h200-variant-sets05-*), and at least
    :data:`MAX_SETS_PER_MINUTE` (60 s: 40; 240 s: 160)."""
    per_minute = MAX_SETS_PER_MINUTE / min(1.0, max(set_seconds, 1e-9))
    return max(MAX_SETS_PER_MINUTE, math.ceil(per_minute * time_budget_s / 60.0 - 1e-9))


#: Most times a case's wall clock may come up in one sweep of a set's cycles (sampling.max_repeats).
MAX_REPEATS = 8
#: The command-line flags that set a ``sampling`` key over the config, flag -> key (the argparse
#: attribute is the flag's name, ``--time-budget`` -> ``time_budget``): pipeline applies them and a
#: resumed run takes them from its settings, the report names the ones a run was given.
SAMPLING_FLAGS = {"--min-effect": "min_effect", "--max-sets": "max_sets", "--set-seconds": "set_seconds",
                  "--burst-ms": "burst_ms", "--time-budget": "time_budget_s", "--workers-per-env": "workers_per_env"}
#: Most ``sampling.min_burst_samples``.
MAX_BURST_SAMPLES = 32
#: Most worker processes per env in one process set: every worker of a set shares one CPU core and
#: takes a burst in turn, so K per env makes each worker's turn come K times less often (with 2 envs
#: and 8 each, a 1.0 s set holds ~12 cycles of 16 bursts); beyond that a set times too few cycles.
MAX_WORKERS_PER_ENV = 8
#: Why, in the errors of the config and of --workers-per-env.
WORKERS_PER_ENV_WHY = "a set's workers share one CPU core and take turns: more per env leave each too few cycles"


def _exp_hint(v: Any, integer: bool = False) -> str:
    """A note for a number YAML read as a string (``1e9``: YAML 1.1 needs a dot and a signed exponent);
    for an integer setting, write the digits out (``1.0e+9`` is a float there)."""
    if not (isinstance(v, str) and _EXP_NUMBER.match(v.strip())):
        return ""
    if integer:
        try:
            digits = f"{int(float(v)):d}"
        except (ValueError, OverflowError):
            digits = "the digits"
        return f" (YAML reads a number like 1e9 as a string: write the integer out, {digits})"
    return (" (YAML reads a number like 1e9 or 1.0e9 as a string: write it with a dot and a signed "
            "exponent, 1.0e+9 or 1.0e-9)")


def _pos_int(where: str, v: Any, alt: str = "") -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise _err(where, v, "must be a positive integer" + (f" {alt}" if alt else "") + _exp_hint(v, integer=True))
    return v


def _pos_number(where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise _err(where, v, "must be a positive number" + _exp_hint(v))
    return float(v)


def _prefetch_depth(v: Any) -> int | None:
    if v in (None, "auto"):
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4:
        raise _err("sampling.prefetch_depth", v,
                   "must be 1-4 or auto (each set ahead keeps its workers waiting on spare cores)")
    return v


def _bool(where: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _err(where, v, "must be true or false")
    return v


def _dtype(where: str, v: Any) -> str:
    """``fp16`` or ``bf16``; torch's names (``float16``, ``torch.bfloat16``, ...) map to them."""
    if isinstance(v, str) and v.strip().lower() in DTYPE_ALIASES:
        return DTYPE_ALIASES[v.strip().lower()]
    if v not in DTYPES:
        raise _err(where, v, f"must be one of {', '.join(DTYPES)} (or torch's float16, bfloat16; flash-attn 2.x "
                             "kernels exist only for these)")
    return v


#: Shape keys whose value is a list by nature (one length per sequence / per batch entry): an axis
#: of them is a list of such lists.
LIST_VALUED = {"seqlens", "cache_seqlens"}


def _axis(where: str, v: Any) -> list:
    """The values of one key: a list is an axis (>= 1 value), anything else is one value. For the
    :data:`LIST_VALUED` keys only a list of lists (or of distributions) is an axis."""
    if where.rsplit(".", 1)[-1] in LIST_VALUED and not (isinstance(v, list) and v and
                                                         all(isinstance(x, (list, dict)) for x in v)):
        return [v]
    if isinstance(v, list):
        if not v:
            raise _err(where, v, "an axis (list) needs at least one value; give a value or a list of values")
        return v
    return [v]


def expand_axes(top: dict[str, Any], shapes: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Expand the axes (list values) of the raw config mappings into one plain mapping per shape.

    ``top``: the top-level mapping (its :data:`TOP_AXES` keys are used); ``shapes``: the ``shapes``
    entries, each a mapping. Yields ``(where, shape)`` with ``where`` = ``shapes[i]`` and ``shape``
    the entry with one value per key plus the top-level ``dtype``, ``causal``, ``dropout_p`` and
    ``softmax_scale`` (an entry's own ``dtype`` / ``causal`` wins over the top level's). Values are
    not validated here. Order (stable): entry by entry; within an entry the cartesian product of its
    keys in the order written (the first key varies slowest), then of the top-level axes in
    :data:`TOP_AXES` order. An empty list raises ConfigError.
    """
    top_vals = {k: _axis(k, top[k]) for k in TOP_AXES if k in top}
    for i, s in enumerate(shapes):
        w = f"shapes[{i}]"
        keys = list(s) + [k for k in top_vals if k not in s]
        values = [_axis(f"{w}.{k}", s[k]) if k in s else top_vals[k] for k in keys]
        for combo in itertools.product(*values):
            yield w, dict(zip(keys, combo))


def count_cases(top: dict[str, Any], shapes: list[dict[str, Any]], n_ops: int = 1, n_impls: int = 1) -> int:
    """How many cases :func:`expand_axes` makes of these mappings, times ``n_ops`` x ``n_impls``,
    without expanding them (a product can be astronomically large)."""
    top_n = {k: len(_axis(k, top[k])) for k in TOP_AXES if k in top}
    n = 0
    for i, s in enumerate(shapes):
        m = math.prod(len(_axis(f"shapes[{i}].{k}", v)) for k, v in s.items())
        n += m * math.prod(c for k, c in top_n.items() if k not in s)
    return n * n_ops * n_impls


def _too_many(top: dict, shapes: list, n_ops: int, n_impls: int, n: int, limit: int) -> ConfigError:
    """The refusal of a config of ``n`` > ``limit`` cases: its axes, and how to narrow or accept it."""
    axes = [f"{k} {len(top[k])}" for k in TOP_AXES if isinstance(top.get(k), list) and len(top[k]) > 1]
    for i, s in enumerate(shapes):
        ax = [f"{k} {m}" for k, v in s.items() if (m := len(_axis(f"shapes[{i}].{k}", v))) > 1]
        if ax:
            axes.append(f"shapes[{i}]: " + " x ".join(ax))
    ax_s = "; ".join(axes) if axes else "no list values"
    return ConfigError(f"the config expands to {n:,} cases (axes: {ax_s}; ops {n_ops}, impls {n_impls}), more "
                       f"than {limit}: pass --yes to time them all (each case needs its share of --time-budget), "
                       "or narrow it: fewer values in a list (dtype, causal, batch, seqlen, nheads, head_dim, ...), "
                       "fewer shapes, or ops: [fwd]")


def _dropout(where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise _err(where, v, "must be a number with 0 <= dropout_p < 1")
    return float(v)


def _scale(where: str, v: Any) -> float | None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0
                          or not math.isfinite(v)):
        raise _err(where, v, "must be null (1/sqrt(head_dim)) or a positive number")
    return None if v is None else float(v)


def _unknown(where: str, d: dict, allowed: set) -> None:
    extra = sorted(set(d) - allowed, key=str)
    if extra:
        import difflib

        def named(k) -> str:  # each unknown key, with the allowed one it most likely means
            near = difflib.get_close_matches(str(k), sorted(allowed), n=1, cutoff=0.6)
            return repr(k) + (f" (did you mean {near[0]!r}?)" if near else "")
        # every unknown key at once (second new-user trial: two typos took two runs to find)
        raise ConfigError(f"{where}: unknown key{'s' if len(extra) > 1 else ''} {', '.join(named(k) for k in extra)}; "
                          f"allowed keys: {', '.join(sorted(allowed))}")


def _lens_tag(lens: tuple[int, ...]) -> str:
    """Up to 8 lengths spelled out (``512.1024``), else their count and a CRC-32 (``n64-1a2b3c4d``)."""
    if len(lens) <= 8:
        return ".".join(map(str, lens))
    import zlib

    return f"n{len(lens)}-{zlib.crc32(','.join(map(str, lens)).encode()):08x}"


def _func_id_suffix(c: Case) -> str:
    s = ""
    if c.seqlens is not None:
        s += "-L" + _lens_tag(c.seqlens)
    if c.cache_seqlens is not None:
        s += "-c" + (str(c.cache_seqlens[0]) if len(set(c.cache_seqlens)) == 1 else _lens_tag(c.cache_seqlens))
    if c.append_kv:
        s += "-append"
    if c.page_block_size:
        s += f"-page{c.page_block_size}"
    return s


def _func_label_suffix(c: Case) -> str:
    s = ""
    if c.seqlens is not None:
        s += f" L{min(c.seqlens)}-{max(c.seqlens)} (sum {sum(c.seqlens)})"
    if c.func == "kvcache":
        # the cache as configured, then what the call appends (new-user trial: "cache 201 +append" for
        # cache_seqlens 200 read as a cache of 201); the keys attended are their sum
        k = [n - (c.seqlen_q if c.append_kv else 0) for n in c.keys_attended()]
        s += f" cache {min(k)}" + (f"-{max(k)}" if max(k) != min(k) else "")
        if c.append_kv:
            s += f"+{c.seqlen_q} append"
        if c.page_block_size:
            s += f" paged {c.page_block_size}"
    return s


def _func(where: str, v: Any) -> str:
    if v not in FUNCS:
        raise _err(where, v, f"must be one of {', '.join(FUNCS)} (the flash_attn entry point timed)")
    return v


def varlen_shape(w: str, s: dict, func_default: str) -> dict:
    """A varlen* shape's ``seqlens`` -> the shape with ``batch`` and ``seqlen`` filled in.

    ``seqlens`` is a list of tokens per sequence, or a distribution ``{n, min, max, seed}``: n lengths
    drawn uniformly from [min, max] with Python's ``random.Random(seed)`` (same lengths on every
    machine and in every env; seed default 0). batch and seqlen(_q/_k) come from the lengths: a
    shape that gives them too is refused."""
    func = _func(f"{w}.func", s.get("func", func_default))
    if not func.startswith("varlen"):
        if "seqlens" in s:
            raise _err(f"{w}.seqlens", s["seqlens"], f"is for func varlen, varlen_qkvpacked, varlen_kvpacked (this shape's func is {func})")
        return s
    if "seqlens" not in s:
        raise ConfigError(f"{w}: func {func} needs seqlens: a list of tokens per sequence ([512, 1024, ...]) "
                          "or a distribution {n: 8, min: 64, max: 2048, seed: 0}")
    for k in ("batch", "seqlen", "seqlen_q", "seqlen_k"):
        if k in s:
            raise ConfigError(f"{w}: func {func} takes batch and seqlen from seqlens; remove {k!r}")
    lens = s["seqlens"]
    if isinstance(lens, dict):
        _unknown(f"{w}.seqlens", lens, {"n", "min", "max", "seed"})
        for k in ("n", "min", "max"):
            if k not in lens:
                raise ConfigError(f"{w}.seqlens: a distribution needs n, min and max (seed optional), e.g. "
                                  "{n: 8, min: 64, max: 2048, seed: 0}")
        n, lo, hi = (_pos_int(f"{w}.seqlens.{k}", lens[k]) for k in ("n", "min", "max"))
        if lo > hi:
            raise _err(f"{w}.seqlens.min", lo, f"must be <= max ({hi})")
        seed = lens.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise _err(f"{w}.seqlens.seed", seed, "must be an integer")
        import random

        rng = random.Random(seed)
        lens = [rng.randint(lo, hi) for _ in range(n)]
    elif not isinstance(lens, list) or not lens:
        raise _err(f"{w}.seqlens", lens, "must be a non-empty list of positive integers or {n, min, max, seed}")
    lens = [_pos_int(f"{w}.seqlens[{i}]", x) for i, x in enumerate(lens)]
    return {**s, "batch": len(lens), "seqlen": max(lens), "seqlens": lens}


def op_fields(w: str, s: dict, func_default: str, batch: int, sq: int, sk: int, nheads: int, nheads_k: int,
              ops: list, impls: list, dropout: float) -> dict:
    """Validate one shape's entry-point fields (func, seqlens, cache_seqlens, append_kv,
    page_block_size) against its sizes; returns the extra :class:`Case` keyword arguments.

    The entry points other than ``func`` take their inputs as (..., nheads, head_dim) tensors
    (``input: embed`` applies to ``func`` only) and are timed by flash-attn itself (no sdpa impl).
    """
    func = _func(f"{w}.func", s.get("func", func_default))
    if func == "func":
        for k in ("cache_seqlens", "append_kv", "page_block_size"):
            if k in s:
                raise _err(f"{w}.{k}", s[k], "is for func kvcache (flash_attn_with_kvcache)")
        return {}
    extra: dict = {"func": func, "layout": "heads"}
    if "sdpa" in impls:
        raise ConfigError(f"{w}: impl sdpa is an A/A control of func only; remove sdpa from impls for a config "
                          f"with func {func}")
    if func in FWD_ONLY_FUNCS:
        if "bwd" in ops:
            raise ConfigError(f"{w}: func {func} ({FUNCS[func]}) has no backward: use ops: [fwd] in a config "
                              "with kvcache shapes")
        if dropout:
            raise _err("dropout_p", dropout, f"{FUNCS[func]} has no dropout: set dropout_p: 0")
    if func.startswith("varlen"):
        extra["seqlens"] = tuple(s["seqlens"])
    if func in ("qkvpacked", "varlen_qkvpacked"):
        if nheads_k != nheads or sq != sk:
            raise ConfigError(f"{w}: func {func} packs q, k and v in one tensor: it needs nheads_k = nheads "
                              f"({nheads_k} vs {nheads}) and seqlen_q = seqlen_k ({sq} vs {sk}); use kvpacked or func")
    if func != "kvcache":
        for k in ("cache_seqlens", "append_kv", "page_block_size"):
            if k in s:
                raise _err(f"{w}.{k}", s[k], f"is for func kvcache (this shape's func is {func})")
        return extra
    append = _bool(f"{w}.append_kv", s.get("append_kv", False))
    cs = s.get("cache_seqlens")
    if cs is None and append:
        cs = sk - sq  # a full cache after the append
        if cs < 0:
            raise ConfigError(f"{w}: append_kv needs seqlen_k (the cache's size, {sk}) >= seqlen_q ({sq})")
    if cs is None and s.get("page_block_size") is not None:
        cs = sk  # paged without cache_seqlens would attend every token of the whole blocks: pass seqlen_k
    if cs is not None:
        lens = [cs] * batch if isinstance(cs, int) and not isinstance(cs, bool) else cs
        if not isinstance(lens, list) or len(lens) != batch:
            raise _err(f"{w}.cache_seqlens", cs, f"must be an integer or a list of {batch} (batch) integers, "
                       "tokens already in each batch entry's cache; or null for the whole cache")
        for i, n in enumerate(lens):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise _err(f"{w}.cache_seqlens[{i}]", n, "must be an integer >= 0")
            if n + (sq if append else 0) > sk:
                raise _err(f"{w}.cache_seqlens[{i}]", n, f"plus the {sq if append else 0} appended tokens must fit "
                           f"the cache of seqlen_k = {sk} tokens")
        extra["cache_seqlens"] = tuple(lens)
    if append:
        extra["append_kv"] = True
    pb = s.get("page_block_size")
    if pb is not None:
        pb = _pos_int(f"{w}.page_block_size", pb)
        if pb % 256:  # flash_api.cpp of 2.5.x-2.8.x: "Paged KV cache block size must be divisible by 256"
            raise _err(f"{w}.page_block_size", pb, "must be a multiple of 256 (flash-attn 2.x's paged KV rule)")
        extra["page_block_size"] = pb
    return extra


def parse_config(data: Any, source: str = "<dict>", max_cases: int | None = MAX_CASES) -> Config:
    """Validate a config mapping (already parsed YAML) over the built-in default and expand its cases.

    Raises ConfigError for any value that breaks a rule (positive sizes, head_dim <= 256, nheads
    divisible by nheads_k, embed_dim divisible by nheads, dtype fp16/bf16, 0 <= dropout_p < 1, ...),
    and for more than ``max_cases`` cases after expanding the axes (None: no limit; ``--yes``).
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys (title, shapes, ...), "
                          f"got {type(data).__name__}")
    _unknown(source, data, _TOP_KEYS)
    merged = {**DEFAULT_CONFIG, **data}
    if "title" not in data and "shapes" in data:  # the default title describes the default shapes only
        merged["title"] = f"flash-attn comparison ({Path(source).name if source.endswith(('.yaml', '.yml')) else source})"
    title = merged["title"]
    if not isinstance(title, str):
        raise _err("title", title, "must be a string")
    for v in _axis("dtype", merged["dtype"]):
        _dtype("dtype", v)
    for dropout in _axis("dropout_p", merged["dropout_p"]):
        _dropout("dropout_p", dropout)
    for scale in _axis("softmax_scale", merged["softmax_scale"]):
        _scale("softmax_scale", scale)
    for v in _axis("causal", merged["causal"]):
        _bool("causal", v)
    ops = merged["ops"]
    if isinstance(ops, str):
        ops = [ops]
    if not isinstance(ops, list) or not ops or any(o not in OPS for o in ops):
        raise _err("ops", merged["ops"], "must be a non-empty list of fwd, bwd")
    impls = merged.get("impls", ["flash_attn"])
    if isinstance(impls, str):
        impls = [impls]
    if not isinstance(impls, list) or not impls or any(i not in IMPLS for i in impls):
        raise _err("impls", merged.get("impls"), f"must be a non-empty list of {', '.join(IMPLS)}")
    layout = merged["input"]
    if layout not in ("embed", "heads"):
        raise _err("input", layout, "must be 'embed' (batch, seqlen, embed_dim) or 'heads' (batch, seqlen, nheads, head_dim)")
    func_default = merged.get("func", "func")
    shapes = merged["shapes"]
    if not isinstance(shapes, list) or not shapes:
        raise _err("shapes", shapes, "must be a non-empty list of mappings")

    for i, s in enumerate(shapes):
        w = f"shapes[{i}]"
        if not isinstance(s, dict):
            raise _err(w, s, "must be a mapping like {batch: 2, seqlen: 50, nheads: 16, head_dim: 64}")
        _unknown(w, s, _SHAPE_KEYS)
    n = count_cases(merged, shapes, len(ops), len(impls))
    if max_cases is not None and n > max_cases:
        raise _too_many(merged, shapes, len(ops), len(impls), n, max_cases)

    cases: list[Case] = []
    seen: set[str] = set()
    for w, s in expand_axes(merged, shapes):
        s = varlen_shape(w, s, func_default)
        for k in ("batch", "nheads"):
            if k not in s:
                raise ConfigError(f"{w}: missing key {k!r} (each shape needs batch, seqlen, nheads and head_dim or embed_dim)")
        batch = _pos_int(f"{w}.batch", s["batch"])
        nheads = _pos_int(f"{w}.nheads", s["nheads"])
        nheads_k = _pos_int(f"{w}.nheads_k", s.get("nheads_k", nheads))
        if nheads % nheads_k:
            raise _err(f"{w}.nheads_k", nheads_k, f"nheads ({nheads}) must be divisible by nheads_k (GQA/MQA groups)")
        if "seqlen" in s and ("seqlen_q" in s or "seqlen_k" in s):
            raise ConfigError(f"{w}: give either seqlen or seqlen_q/seqlen_k, not both")
        if "seqlen" in s:
            sq = sk = _pos_int(f"{w}.seqlen", s["seqlen"])
        elif "seqlen_q" in s:
            sq = _pos_int(f"{w}.seqlen_q", s["seqlen_q"])
            sk = _pos_int(f"{w}.seqlen_k", s.get("seqlen_k", sq))
        else:
            raise ConfigError(f"{w}: missing key 'seqlen' (or seqlen_q and seqlen_k)")
        if ("head_dim" in s) == ("embed_dim" in s):
            raise ConfigError(f"{w}: give exactly one of head_dim or embed_dim (= nheads * head_dim)")
        if "embed_dim" in s:
            e = _pos_int(f"{w}.embed_dim", s["embed_dim"])
            if e % nheads:
                raise _err(f"{w}.embed_dim", e, f"must be divisible by nheads ({nheads}): head_dim = embed_dim / nheads")
            head_dim = e // nheads
        else:
            head_dim = _pos_int(f"{w}.head_dim", s["head_dim"])
        if head_dim > MAX_HEAD_DIM:
            if "embed_dim" in s:  # the key the user wrote, not the one derived from it (new-user trial)
                raise _err(f"{w}.embed_dim", s["embed_dim"],
                           f"with nheads {nheads} gives head_dim {head_dim} = embed_dim / nheads, above "
                           f"{MAX_HEAD_DIM} (flash-attn 2.x's largest kernel): give more nheads or a smaller embed_dim")
            raise _err(f"{w}.head_dim", head_dim, f"must be <= {MAX_HEAD_DIM} (flash-attn 2.x's largest kernel)")
        # the top-level values were checked above: an error here is the entry's own value
        s_causal = _bool(f"{w}.causal", s["causal"])
        s_dtype = _dtype(f"{w}.dtype", s["dtype"])
        dropout, scale = _dropout("dropout_p", s["dropout_p"]), _scale("softmax_scale", s["softmax_scale"])
        extra = op_fields(w, s, func_default, batch, sq, sk, nheads, nheads_k, ops, impls, float(dropout))
        for impl in impls:
            for op in ops:
                c = Case(op=op, batch=batch, seqlen_q=sq, seqlen_k=sk, nheads=nheads, nheads_k=nheads_k,
                         head_dim=head_dim, dtype=s_dtype, causal=s_causal, dropout_p=dropout,
                         softmax_scale=scale, **{"layout": layout, **extra}, impl=impl)
                if c.id in seen:
                    raise ConfigError(f"{w}: duplicate of an earlier shape ({c.label} {c.dtype}) -- the same case twice "
                                      f"({c.op}, {impl}): a shape written twice, or a list naming one value twice "
                                      "(ops, impls, or dtype fp16 and float16); remove one")
                seen.add(c.id)
                cases.append(c)

    samp = merged.get("sampling") or {}
    if not isinstance(samp, dict):
        raise _err("sampling", samp, "must be a mapping")
    for k, why in _OLD_SAMPLING_KEYS.items():
        if k in samp:
            raise _err(f"sampling.{k}", samp[k], f"is no longer used: {why}")
    _unknown("sampling", samp, _SAMPLING_KEYS)
    sd = {**DEFAULT_CONFIG["sampling"], **samp}
    for k in ("time_budget_s", "set_seconds", "burst_ms", "min_effect", "alpha"):
        v = sd[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise _err(f"sampling.{k}", v, "must be a positive number" + _exp_hint(v))
    sampling = Sampling(
        time_budget_s=float(sd["time_budget_s"]),
        min_effect=float(sd["min_effect"]),
        set_seconds=float(sd["set_seconds"]),
        max_sets=MAX_SETS_PER_MINUTE if sd["max_sets"] == "auto" else _pos_int("sampling.max_sets", sd["max_sets"], "or auto"),
        max_sets_auto=sd["max_sets"] == "auto",
        burst_ms=float(sd["burst_ms"]),
        alpha=float(sd["alpha"]),
        workers_per_env=(None if sd.get("workers_per_env") in (None, "auto")
                         else _pos_int("sampling.workers_per_env", sd["workers_per_env"], "or auto")),
        host_every=_pos_int("sampling.host_every", sd.get("host_every", Sampling.host_every)),
        max_repeats=_pos_int("sampling.max_repeats", sd.get("max_repeats", Sampling.max_repeats)),
        speed_adjust=_bool("sampling.speed_adjust", sd.get("speed_adjust", Sampling.speed_adjust)),
        prefetch_spawn=sd.get("prefetch_spawn", Sampling.prefetch_spawn),
        preimport=_bool("sampling.preimport", sd.get("preimport", Sampling.preimport)),
        cuda_at_start=_bool("sampling.cuda_at_start", sd.get("cuda_at_start", Sampling.cuda_at_start)),
        cpu_state=sd.get("cpu_state", Sampling.cpu_state),
        cpu_hop=_bool("sampling.cpu_hop", sd.get("cpu_hop", Sampling.cpu_hop)),
        probe_share=sd.get("probe_share", Sampling.probe_share if sd.get("speed_adjust", True) is not False
                           else "full"),  # nothing to share without the adjustment
        prefetch_depth=_prefetch_depth(sd.get("prefetch_depth")),
        host_precision=_pos_number("sampling.host_precision", sd.get("host_precision", Sampling.host_precision)),
        min_burst_samples=_pos_int("sampling.min_burst_samples", sd.get("min_burst_samples", Sampling.min_burst_samples)),
    )
    sampling.follow_budget()  # the config's own budget (a --time-budget is followed in pipeline)
    if sampling.min_burst_samples > MAX_BURST_SAMPLES:
        raise _err("sampling.min_burst_samples", sampling.min_burst_samples,
                   f"must be at most {MAX_BURST_SAMPLES} (a burst of long calls runs on until it holds that many "
                   "samples: more would let one case's bursts crowd the others out of a set's cycles)")
    if sampling.host_precision > 1:
        raise _err("sampling.host_precision", sampling.host_precision,
                   "must be a fraction at most 1 (0.05: a decided host comparison is cycled until its interval is "
                   "within 5 % of its ratio; 1: dropped from the cycles as soon as it is decided)")
    if sampling.workers_per_env is not None and sampling.workers_per_env > MAX_WORKERS_PER_ENV:
        raise _err("sampling.workers_per_env", sampling.workers_per_env,
                   f"must be at most {MAX_WORKERS_PER_ENV} or auto ({WORKERS_PER_ENV_WHY})")
    if sampling.max_repeats > MAX_REPEATS:
        raise _err("sampling.max_repeats", sampling.max_repeats,
                   f"must be at most {MAX_REPEATS} (times a noisier case's wall clock comes up per sweep; "
                   "beyond that one case crowds the others out of a set's cycles)")
    if sampling.set_seconds < MIN_SET_SECONDS:
        raise _err("sampling.set_seconds", sampling.set_seconds,
                   f"must be at least {MIN_SET_SECONDS:g} (s of cycles per process set; below that a set of fresh "
                   "workers holds hardly a cycle)")
    if sampling.burst_ms > sampling.max_burst_ms:
        raise _err("sampling.burst_ms", sampling.burst_ms,
                   f"must be at most {sampling.max_burst_ms:g} (ms; half of sampling.set_seconds: a set's "
                   "cycles hold at least one cycle of two workers' bursts)")
    if sampling.set_seconds > sampling.max_set_seconds:
        raise _err("sampling.set_seconds", sampling.set_seconds,
                   f"must be at most half of sampling.time_budget_s ({sampling.time_budget_s:g} s): an interval "
                   "needs at least two process sets")
    if sampling.cpu_state not in ("all", "usual"):
        raise _err("sampling.cpu_state", sampling.cpu_state,
                   "must be all (every turn counts, the default) or usual (only the turns at the CPU's usual speed)")
    if sampling.cpu_state == "usual" and not sampling.speed_adjust:
        raise ConfigError("sampling.cpu_state: usual needs sampling.speed_adjust: true -- the speed probe's "
                          "readings it judges each turn by are taken only with it; remove one of the two")
    if sampling.cpu_hop and not sampling.speed_adjust:
        raise ConfigError("sampling.cpu_hop: true needs sampling.speed_adjust: true -- the speed probe's readings "
                          "it judges a set's CPU by are taken only with it; remove one of the two")
    if sampling.probe_share not in ("full", "estimated"):
        raise _err("sampling.probe_share", sampling.probe_share,
                   "must be estimated (the share of a set's between-worker probe difference the earlier sets' calls "
                   "followed counts: stats.probe_share, the default) or full (the whole difference counts)")
    if sampling.probe_share == "estimated" and not sampling.speed_adjust:
        raise ConfigError("sampling.probe_share: estimated needs sampling.speed_adjust: true -- it changes how much "
                          "of the speed probe's readings the adjustment counts; remove one of the two")
    if sampling.prefetch_spawn not in ("cycles", "after"):
        raise _err("sampling.prefetch_spawn", sampling.prefetch_spawn, "must be cycles or after")
    if not 0 < sampling.min_effect < 1:
        raise _err("sampling.min_effect", sampling.min_effect, "must be between 0 and 1 (0.05 = 5 %)")
    if not 0 < sampling.alpha < 0.5:
        raise _err("sampling.alpha", sampling.alpha, "must be between 0 and 0.5 (0.05: a run's verdicts on a clock wrong at most 5 % of the time, e-BY)")
    ex = merged.get("explain")
    ex = {} if ex is None else ex
    if not isinstance(ex, dict):
        raise _err("explain", ex, "must be a mapping of the explain pass's settings (e.g. explain: {profile_s: 12, "
                   "sampler_cycles: 80}); the pass itself is turned on by --explain")
    _unknown("explain", ex, set(_EXPLAIN_KEYS))
    for k, v in ex.items():
        lo = 0.0 if k in _EXPLAIN_MAY_BE_ZERO else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                or (lo is None and v <= 0) or (_EXPLAIN_KEYS[k] and (v != int(v) or v < 1)):
            what = ("must be a positive whole number" if _EXPLAIN_KEYS[k]
                    else ("must be a number >= 0" if lo is not None else "must be a positive number"))
            raise _err(f"explain.{k}", v, what + _exp_hint(v, integer=bool(_EXPLAIN_KEYS[k])))
        if k in _EXPLAIN_MAX and v > _EXPLAIN_MAX[k][0]:
            raise _err(f"explain.{k}", v, f"must be at most {_EXPLAIN_MAX[k][0]:g} ({_EXPLAIN_MAX[k][1]})")
    explain_settings = {k: (int(v) if _EXPLAIN_KEYS[k] else float(v)) for k, v in ex.items()}
    return Config(title=title, cases=cases, sampling=sampling, source=source, raw=merged, explain=explain_settings)


#: Built-in example configs (package data): ``--config NAME`` finds ``configs/NAME.yaml`` here.
BUILTIN_DIR = Path(__file__).with_name("configs")


def builtin_configs() -> list[str]:
    """Names of the built-in configs (``default``, ``kvcache-decode``, ``varlen``, ...)."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def builtin_config(name: str | Path) -> Path | None:
    """The built-in config file for ``name`` (``varlen`` or ``varlen.yaml``) when ``name`` is not an
    existing path and has no directory part; else None (a path is read as given)."""
    n = str(name)
    if Path(n).exists() or os.sep in n or "/" in n:
        return None
    p = BUILTIN_DIR / (n if n.endswith((".yaml", ".yml")) else n + ".yaml")
    return p if p.is_file() else None


def load_config(path: str | Path | None, max_cases: int | None = MAX_CASES) -> Config:
    """Load ``path`` (YAML) over the built-in default; ``None`` gives the built-in default.
    ``max_cases``: as :func:`parse_config` (None with ``--yes``).

    Raises ConfigError for a missing file, a YAML syntax error (with file, line and column) or a
    rule broken by a value.
    """
    if path is None:
        return parse_config({}, "built-in default")
    p = builtin_config(path) or Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        import difflib

        # a typo'd built-in name (new-user trial: `--config defualt` listed the names, suggested none)
        near = difflib.get_close_matches(Path(str(path)).stem, builtin_configs(), n=1, cutoff=0.6)
        raise ConfigError(f"--config {path}: cannot read the file ({e.strerror}); "
                          + (f"did you mean the built-in config {near[0]!r}? " if near else "")
                          + f"built-in configs by name: {', '.join(builtin_configs())}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"--config {path}: not UTF-8 text (byte {e.start}); save the YAML as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as e:
        raise ConfigError(f"{p}:{e.line}: key {e.key!r} appears twice in the same mapping; keep one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    if data is None:
        raise ConfigError(f"--config {path}: the file is empty; write the keys you want to change (README.md, "
                          "'Config'), or leave --config out for the built-in default")
    return parse_config(data, str(p), max_cases)


class _DuplicateKey(Exception):
    def __init__(self, key, line: int):
        super().__init__(key)
        self.key, self.line = key, line


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key that appears twice in one mapping (PyYAML keeps the last
    one silently, so a typo'd copy of ``shapes:`` would drop the first list)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for k_node, _ in node.value:
            k = self.construct_object(k_node, deep=deep)
            try:
                hash(k)
            except TypeError:
                continue
            if k in seen:
                raise _DuplicateKey(k, k_node.start_mark.line + 1)
            seen.add(k)
        return super().construct_mapping(node, deep=deep)
