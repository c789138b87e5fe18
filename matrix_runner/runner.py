"""Stage 3 (driver side) — the run's timing phase: lockstep process sets, and when to stop.

A *process set* is one fresh worker per env, all pinned to one CPU core (lockstep module doc). Per
set: the workers start while an earlier set is still timed, on spare cores (the *prefetch*, up to
``Sampling.prefetch_depth`` sets ahead: a worker's start outlasted 1.5 s of cycles on the H200, so
with one set ahead a set could not be shorter than it; they
import torch and the subject during its cycles, and the modules that earlier sets' set-ups of
their env loaded -- the *pre-import*, ``Sampling.preimport``: flash-attn 2.7+'s custom op imports
torch._dynamo on its first call; their config and every case's set-up -- CUDA
context, inputs, first calls, calibration -- are queued to them after its cycles, so no CUDA work of
theirs overlaps a cycle or a profiled kernel, and a set's start mostly collects replies), then *cycles*: each cycle gives
every worker of the set a burst (~``burst_ms`` of calls) of one (case, clock) in turn, in a
balanced random order (a random permutation, then its reverse for that item's next cycle), for
``set_seconds`` (with ``Sampling.max_repeats`` > 1, a noisier case's wall clock more often:
:func:`cycle_weights`), and on while the next set's workers are still importing (up to
``Sampling.EXTEND_FACTOR`` x ``set_seconds``: on a machine with few cores the import outlasts the cycles, and
the next set would wait for it idle; the set's ``extended_s`` says by how much); then each worker
checks correctness and takes the CUDA-graph clock of every case, and (CUDA, while undecided, in at
most ``Sampling.clock_sets`` sets) the profiler pass for kernel time, last, since a profiler session
slows later calls in its process. Sets run one after another on the quietest cores (``--cpus``),
until every wall-time comparison is decided by its anytime-valid interval (stats.set_compare) and
that interval is within ``Sampling.precision`` (1 %) of its ratio, or the time budget or ``max_sets``
is reached: a run does not stop at its first decided verdicts while its budget can still narrow
them (H200: a seed run that stopped once all 12 were decided, after 7 sets, left batch-2 intervals
of ±14-23 %; the interval stays valid whenever the run stops). Items whose wall and host comparisons are all decided
are no longer sampled in later sets. The budget is checked before each set (the next one must fit,
by the sets so far) and while a set's cases are set up: a set-up still running at the budget ends
the run there, naming the case and blaming nobody (a GPU-sized config on a 2-core CPU took 200 s to
set up one case); a set that has begun its cycles finishes them.

Faults: a worker that crashes or hangs (no reply within ``case_timeout`` s) fails the case it was
working on in that env; the set ends (the cycles already timed are kept; a worker lost before the
cycles ends the set before them, as the rest could time only one side) and the next set retries
that case once; a second fault fails it for the run. Once every case has failed, the run stops. A case whose worker reports an error (a
kernel not built, out of memory) fails at once. A worker that cannot start (import error, no CUDA)
fails its env; one that dies or hangs at start in an env that has imported before ends that set
and the next set tries again (the second time, the env fails). With one env left there is nothing
to compare: one set times it (a run of one env by request times sets to its budget: run_all's ``alone``). SIGINT/SIGTERM end the set in progress with :class:`Interrupted`; everything timed
so far is kept, and ``--resume`` continues with new sets.
"""
from __future__ import annotations

import json
import math
import random
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import envs as envmod
from . import lockstep, machine, proc, stats
from .config import CYCLED, METRICS, Case, Sampling
from .envs import EnvResult
from .worker import CUDA_AT_START_ENV

#: Seconds a worker may take to start (import torch and the subject) before it is stopped.
START_TIMEOUT_S = 180.0


@dataclass
class CaseData:
    """Everything measured for one (env, case): per metric, set id -> data (wall/host: cycle id ->
    burst median µs; device/graph: list of µs samples)."""

    env: str
    case: Case
    sets: dict = field(default_factory=lambda: {m: {} for m in METRICS})
    #: wall/host: set id -> cycle id -> the CPU-speed probe's µs over the same bursts (worker.speed_probe)
    refs: dict = field(default_factory=lambda: {m: {} for m in CYCLED})
    #: wall/host: set id -> cycle id -> the bursts' plain medians (µs per call); ``sets`` holds them
    #: at the reference CPU speed (stats.SpeedSlope), which the comparisons use
    raw: dict = field(default_factory=lambda: {m: {} for m in CYCLED})
    #: wall/host: set id -> {"beta", "center"} of the speed adjustment at the set's last cycle
    speed: dict = field(default_factory=lambda: {m: {} for m in CYCLED})
    #: wall/host: set id -> cycle id -> the slope that cycle's bursts were adjusted with (this run's
    #: sets only, not written: apply_probe_share shifts each cycle by its own slope)
    cycle_beta: dict = field(default_factory=lambda: {m: {} for m in CYCLED})
    kernels: list | None = None
    correctness: list = field(default_factory=list)
    status: str = "pending"  # pending | ok | error
    error: str | None = None
    error_kind: str | None = None
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    faults: int = 0
    inner: dict = field(default_factory=dict)
    clock_seconds: dict = field(default_factory=dict)
    #: sharded runs: the GPU the case was timed on (index, uuid, name, shard, SM clocks seen)
    gpu: dict | None = None
    #: set id -> the ms of this case's first synchronized call in each of the set's fresh worker
    #: processes (their set-up: lazy init, autograd set-up, a JIT subject's compile or cache load);
    #: reported on its own (results ``first_call_ms``), never part of the timed samples
    first_call: dict = field(default_factory=dict)

    @property
    def rounds(self) -> dict:
        """Per metric, one list of µs values per set (for summaries and charts)."""
        return {m: [list(v.values()) if isinstance(v, dict) else list(v) for v in d.values()]
                for m, d in self.sets.items()}

    def fail(self, kind: str, msg: str) -> None:
        self.status, self.error_kind, self.error = "error", kind, msg
class GpuMonitor:
    """Samples the GPU's SM clock and throttle reasons once a second during a round (NVML via
    nvidia-ml-py when importable, else nvidia-smi). Idle (0x1) is not counted as throttling."""

    IGNORED = 0x1  # GPU idle

    def __init__(self, enabled: bool, index: int = 0):
        self.enabled, self.index = enabled, index
        self._stop = threading.Event()
        self.samples: list[tuple[float, int]] = []
        self._nvml = None
        if enabled:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
            except Exception:  # noqa: BLE001
                self._nvml = None

    def _read(self) -> tuple[float, int] | None:
        if self._nvml:
            nv, h = self._nvml
            try:
                return (float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                        int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)))
            except Exception:  # noqa: BLE001
                return None
        return machine.sm_clock(self.index)

    def __enter__(self):
        self.samples = []
        self._stop.clear()
        if self.enabled:
            self._t = threading.Thread(target=self._loop, daemon=True)
            self._t.start()
        return self

    def _loop(self):
        while not self._stop.wait(1.0):
            r = self._read()
            if r:
                self.samples.append(r)

    def __exit__(self, *exc):
        if self.enabled:
            self._stop.set()
            self._t.join(timeout=15)

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        clocks = [c for c, _ in self.samples]
        mask = 0
        for _, r in self.samples:
            mask |= r
        return {"sm_clock_mhz_min": min(clocks), "sm_clock_mhz_max": max(clocks),
                "throttle_mask": hex(mask & ~self.IGNORED), "throttled": bool(mask & ~self.IGNORED & ~0x4),
                "n": len(self.samples)}


class Interrupted(Exception):
    """The run was stopped (SIGINT/SIGTERM): measured cases are kept, nothing more is started."""


class _SetFailed(Exception):
    """The set is given up and the next one tries again: a worker of the set could not start (died or
    hung) in an env known to import, or the workers left after set-up cover no comparison."""


class _BudgetSpent(Exception):
    """The run's time budget ran out while the set's cases were being set up (inputs, first calls):
    nothing more is timed; the set's record says where (:func:`_run_set`)."""


def _import_check(env: EnvResult, hello: dict) -> str | None:
    """The full preflight of an env whose import was not checked yet (envs module doc), on its first
    worker's ``hello`` probe. On success the env's probe becomes the worker's (torch, GPU) and the
    record is updated; on failure the env is marked failed and the error returned."""
    p = hello.get("probe") if isinstance(hello.get("probe"), dict) else {"error": "the worker's hello has no probe"}
    err = envmod.check_probe(p, env.env_dir, env.version)
    if err:
        err = f"preflight (first worker in the env): {err}"
        env.status, env.error = "failed", err
    else:
        env.probe, env.import_checked = {**p, "import_checked": True}, True
    try:
        envmod.record_import_check(env.env_dir, p, err)
    except OSError:
        pass
    return err


def comparisons_now(data: dict, labels: list[str], cases: list[Case], sampling: Sampling, metric: str,
                    quick: bool = False, family_extra: int = 0, pairs: list | None = None,
                    unguarded: frozenset = frozenset()) -> dict:
    """``{(baseline, candidate, case id): stats.set_compare result}`` for ``metric`` over the data so
    far, for the run's ``pairs`` (stats.comparison_pairs; default: every env against the first), with
    the run's family (every ok pair x case of this metric, plus ``family_extra``: the comparisons of
    the run timed elsewhere -- other shards -- so that the levels are the whole run's), the decided
    ones narrowed together (stats.select_family, e-BY: what the run reports at the end).
    ``unguarded``: ids of the sets that ran unpinned (stats.unpinned_sets: the glitch guard leaves
    them whole, as results.comparisons judges the run)."""
    todo = [(base, cand, c) for base, cand in stats.pairs_among(labels, pairs) for c in cases
            if data[(base, c.id)].status == "ok" and data[(cand, c.id)].status == "ok"]
    out = {}
    for base, cand, c in todo:
        b, k = data[(base, c.id)].sets[metric], data[(cand, c.id)].sets[metric]
        rb, rk = data[(base, c.id)].raw.get(metric), data[(cand, c.id)].raw.get(metric)
        out[(base, cand, c.id)] = stats.set_compare(b, k, min_effect=sampling.min_effect, family_size=len(todo) + family_extra,
                                              family_alpha=sampling.alpha, n_target=sampling.planned_sets,
                                              cycles=metric in CYCLED, provisional=quick,
                                              plain=(rb, rk) if rb and rk else None, unguarded_sets=unguarded,
                                              probes=((data[(base, c.id)].refs.get(metric), data[(cand, c.id)].refs.get(metric))
                                                      if sampling.cpu_state == "usual" and metric in CYCLED else None))
    stats.select_family(list(out.values()), family_alpha=sampling.alpha, family_size=len(todo) + family_extra,
                        min_effect=sampling.min_effect)
    return out


def _undecided(cmp: dict) -> set:
    return {key for key, v in cmp.items() if v is None or v["verdict"] in ("ambiguous", "provisional")}


def _settled(cmp: dict, sampling: Sampling, metric: str = "wall_us") -> set:
    """The comparisons that need no more sampling: decided, and the interval's upper end within
    ``sampling.precision`` (host clock: ``sampling.host_precision``) of the ratio (the run's stop
    rule, and what :func:`_cycles` drops)."""
    prec = sampling.host_precision if metric == "host_us" else sampling.precision
    return {k for k in set(cmp) - _undecided(cmp) if cmp[k]["ci_high"] / cmp[k]["ratio"] - 1 <= prec}


def _learn(learned: dict, label: str, rep: dict) -> None:
    """Add the modules a worker of env ``label`` reported loading (``imported``, worker.LEARNED_FROM)
    to ``learned[label]``, in load order, once each."""
    names = rep.get("imported") if isinstance(rep, dict) else None
    if not names:
        return
    have = learned.setdefault(label, {})  # an ordered set
    for n in names:
        if isinstance(n, str) and n not in have and n != "__main__":
            have[n] = None


def _steal_since(j0: tuple | None, cpus: list | None) -> float | None:
    """CPU steal on ``cpus`` (the set's core; the whole machine when unpinned: None) since the
    :func:`machine.cpu_jiffies` reading ``j0``, as a share rounded to 0.01 %; None where unknown."""
    steal = machine.steal_share(j0, machine.cpu_jiffies(cpus))
    return round(steal, 4) if steal is not None else None


def _stretch_to(st: "_Set", cpu: int | None) -> None:
    """sampling.cpu_hop: close the set's steal stretch on the CPU it was on (its steal and total
    ticks added to ``st.steal_sum``) and open one on ``cpu`` (None: close only). A hopping set's steal
    is so over the time it spent on each CPU, not over the CPUs' idle time too (review: summed over
    every CPU a set visited for the whole set, a set spread over 10 CPUs read a tenth of its steal,
    below the report's warning)."""
    if st.steal_at is not None and st.steal_sum is not None:
        c0, r0 = st.steal_at
        r1 = machine.cpu_jiffies([c0])
        if r0 and r1 and r1[1] >= r0[1]:
            st.steal_sum = [st.steal_sum[0] + r1[0] - r0[0], st.steal_sum[1] + r1[1] - r0[1]]
        else:
            st.steal_sum = None  # unknown (no /proc/stat steal column)
    st.steal_at = (cpu, machine.cpu_jiffies([cpu])) if cpu is not None else None


def _stretch_share(st: "_Set") -> float | None:
    """The hopping set's steal share over its stretches (:func:`_stretch_to`), rounded to 0.01 %;
    None where unknown or no tick passed."""
    _stretch_to(st, None)
    if not st.steal_sum or st.steal_sum[1] <= 0:
        return None
    return round(max(0.0, min(1.0, st.steal_sum[0] / st.steal_sum[1])), 4)


def _preimport_path(work: Path, label: str) -> Path:
    """Where env ``label``'s list of modules to pre-import is kept (in the run's work dir, so a
    ``--resume`` starts from it)."""
    return work / ("preimport-" + re.sub(r"[^A-Za-z0-9._+-]", "_", label) + ".json")


def _preimport_files(work: Path, learned: dict) -> dict:
    """Env label -> a JSON file listing the modules its workers loaded after their start so far
    (:func:`_learn`), for the next set's workers to import while they start (worker.preimport)."""
    out = {}
    for label, names in learned.items():
        if not names:
            continue
        f = _preimport_path(work, label)
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(names)))
        tmp.replace(f)
        out[label] = f
    return out


class _Closer:
    """The threads stopping a run's finished workers (one per set closed), and how long each set's
    workers took from the signal to the last one reaped (s): the last set's and the prefetched sets'
    are stopped after the budget's last check, so :meth:`reserve` is what that check keeps back."""

    #: the reserve is the largest of this many latest reap times (a CUDA context's teardown varies)
    RECENT = 5

    def __init__(self):
        self.threads: list[threading.Thread] = []
        self.seconds: list[float] = []
        self._lock = threading.Lock()

    def stop(self, workers: list) -> None:
        """Signal ``workers`` (SIGTERM) now and reap them in a background thread, timed."""
        t0 = time.monotonic()
        for w in workers:
            w.terminate()

        def reap():
            for w in workers:
                w.close()
            with self._lock:
                self.seconds.append(time.monotonic() - t0)

        t = threading.Thread(target=reap, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self, timeout: float = 10.0) -> None:
        """Wait for every worker signalled so far to be reaped (each thread up to ``timeout`` s)."""
        while self.threads:
            self.threads.pop().join(timeout=timeout)

    def reserve(self) -> float:
        """Seconds to keep back for stopping the workers alive when the run stops: the largest of
        the :data:`RECENT` latest reap times, 0 before any set was closed."""
        with self._lock:
            return max(self.seconds[-self.RECENT:], default=0.0)


class _Set:
    """One process set: ``per_env`` workers per env (see module doc). Worker keys are the env label,
    or ``label#j`` with several per env."""

    def __init__(self, sid: int, envs: list[EnvResult], work: Path, other_cpus: set | None, per_env: int,
                 env_extra: dict | None, closing: _Closer, preimport: dict | None = None):
        self.sid, self.envs, self.work = sid, envs, work
        #: lockstep cycles completed so far (an interrupted set reports the ones it keeps)
        self.cycles_done = 0
        #: (cycle, cpu) for each move of the set's workers between cycles (sampling.cpu_hop)
        self.hops: list[tuple[int, int]] = []
        #: sampling.cpu_hop: [steal, total] ticks of the stretches closed so far, and the open one's
        #: (cpu, machine.cpu_jiffies reading) (runner._stretch_to)
        self.steal_sum: list | None = [0, 0]
        self.steal_at: tuple | None = None
        self.hop_began = False  # its cycles began with sampling.cpu_hop
        #: stops finished workers: the run's own (shards run concurrently)
        self.closing = closing
        self.t0 = time.monotonic()
        self.workers: dict[str, lockstep.Worker] = {}
        self.label_of: dict[str, str] = {}
        #: worker key -> ids of the cases whose set-up was queued by :meth:`preload`, in order
        self.preloaded: dict[str, list[str]] = {}
        # the envs' workers start, set up and pin in an order rotated by set, so no env is always
        # first: over the 37 committed H200 A/A runs, with the first label's workers always spawned
        # first, bwd B2 S300 read -0.42 % +- 0.15 (SE), 28 of 37 below 1 (maybe chance among 12
        # cases); rotated, an order effect is spread evenly over the sets instead of biasing the ratio
        k = sid % len(envs) if envs else 0
        for e in envs[k:] + envs[:k]:
            for j in range(per_env):
                key = e.label if per_env == 1 else f"{e.label}#{j}"
                try:
                    self.workers[key] = lockstep.Worker(key, e.python, work / f"s{sid}-{key}.log", other_cpus,
                                                        env_extra=env_extra,
                                                        preimport=(preimport or {}).get(e.label))
                except proc.Stopped:
                    raise Interrupted() from None
                self.label_of[key] = e.label

    def preload(self, cases: list[Case], config: dict, skip: Callable[[str, str], bool] | None = None) -> None:
        """Queue each worker's ``config`` and the set-up of ``cases`` while the worker still imports
        (the set is prefetched during the previous one, after its cycles): inputs, first calls and
        calibration then run on spare cores while the previous set's profiler starts up (its profiled
        calls wait for them: :meth:`await_setups`), and the set
        starts with its replies (nearly) waiting. The warm-up
        is the 6-call minimum (``warmup_s`` 0): the GPU work this adds to the running set is a few
        ms. A worker that is already gone is left to the set's start, which reports it. ``skip(env
        label, case id)``: a case that worker does not set up (its env failed it for good)."""
        for key, w in self.workers.items():
            mine = [c for c in cases if skip is None or not skip(self.label_of[key], c.id)]
            w.queue_commands([config] + [{"cmd": "setup", "case": c.id, "spec": c.to_dict(), "warmup_s": 0.0}
                                         for c in mine])
            self.preloaded[key] = [c.id for c in mine]

    def await_setups(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) until every worker has answered its hello, its config and the
        set-ups :meth:`preload` queued, keeping the replies for the set's start
        (:meth:`lockstep.Worker.read_ahead`). The running set calls this before its profiler pass
        times kernels: the set-ups' CUDA work (contexts, first calls) running on the same GPU
        inflated kernel times up to 2.6x (H200, 2026-12-01: B512 S300 bwd 2,840 µs in quiet sets,
        3,500-9,000 µs in 7 of 11 sets of an A/A run whose profiler pass overlapped them)."""
        end = time.monotonic() + timeout
        for key, w in self.workers.items():
            if key in self.preloaded:
                w.read_ahead((0 if w.hello else 1) + 1 + len(self.preloaded[key]),
                             max(0.0, end - time.monotonic()))

    def started(self) -> bool:
        """Whether every worker has written its first reply (hello: torch and the subject imported),
        without waiting (:meth:`lockstep.Worker.has_reply`)."""
        return all(w.hello is not None or w.has_reply() for w in self.workers.values())

    def close(self, park: set | None = None) -> None:
        """Stop the set's workers: all are signalled at once, and reaped in the background (the next
        set waits for it before its cycles: a CUDA context's teardown disturbs bursts). ``park``:
        CPUs to move them to first, off the set's core, which the next set may use (on a 2-core
        machine their teardown slowed the next set's bursts)."""
        ws = list(self.workers.values())
        if park:
            for w in ws:
                lockstep.move_process(w.pid, park)
        self.closing.stop(ws)


def run_all(envs: list[EnvResult], cases: list[Case], sampling: Sampling, *, device: str, quick: bool,
            work: Path, case_timeout: float, stop: threading.Event, data: dict, sets: list,
            cpus: dict | None = None, on_set: Callable[[dict], None] = lambda r: None,
            on_progress: Callable[[str], None] = lambda msg: None, elapsed_s: float = 0.0,
            seed: int = 0, family_extra: int = 0, gpu_index: int = 0, worker_env: dict | None = None,
            timing: dict | None = None, alone: bool = False) -> str:
    """Time ``cases`` in the ok ``envs`` in lockstep process sets and return why sampling stopped.

    ``data`` (filled here) maps ``(env_label, case_id)`` to :class:`CaseData`; ``sets`` receives one
    record per process set; both are up to date whenever ``on_set`` is called, so the caller can
    write partial results. ``cpus`` is :func:`lockstep.plan_cpus`' plan (None: unpinned). To resume,
    pass the earlier run's ``data`` and ``sets`` and its timing seconds as ``elapsed_s``.

    One shard of a run (shard module; several may run at once in threads of one driver):
    ``family_extra`` comparisons of the other shards join the family (stats.select_family), ``gpu_index`` is the
    nvidia-smi index of the GPU whose clocks are sampled, ``worker_env`` is added to every worker's
    environment (``CUDA_VISIBLE_DEVICES``). The driver's CPU pinning applies to the calling thread.
    ``timing`` (a dict) receives ``close_s``: seconds from the loop's stop to the last worker reaped,
    and ``close_reserve_s``: what the budget's last check kept back for that stop (:class:`_Closer`:
    the longest of the latest sets' reap times; without it, H200 runs of 2026-12-03 night ended up
    to 0.7 s past a 60 s budget), and ``finish_reserve_s``: what it kept back for the results put
    together after the run (``Sampling.finish_s``).

    ``alone``: the run times one env by request (``--backend here`` in a tox env, or one version):
    its sets go on to the budget or ``max_sets``, so that a merged comparison of such runs
    (results.merge, ``tox -e report``) has sets on each side (new-user trial: one set each, and the
    merged report could only say "provisional"). Without it, one env left after the others failed
    is timed in one set (nothing in the run to compare it with)."""
    if not envs:
        return "no env could be timed"
    work.mkdir(parents=True, exist_ok=True)
    cpus = cpus or {"pinned": False, "set_cpus": [], "driver_cpu": None}
    for e in envs:
        for c in cases:
            data.setdefault((e.label, c.id), CaseData(e.label, c))
    rng = random.Random(seed + len(sets))
    max_sets = 1 if quick else sampling.max_sets
    t_call = time.monotonic()
    t0 = t_call - elapsed_s
    resumed_call = bool(sets)  # a --resume: its sets get set up whatever the budget left (below)
    monitor = GpuMonitor(device == "cuda", gpu_index)
    closing = _Closer()  # this run's finished workers, being stopped
    before_aff = machine.allowed_cpus()
    if cpus.get("pinned") and cpus.get("driver_cpu") is not None:
        lockstep.set_affinity(0, {cpus["driver_cpu"]})
    others = set(cpus.get("spare_cpus") or []) or None  # where the next set's workers start
    # where a finished set's workers exit: off every set core (the driver's CPU where nothing is spare)
    park = others or ({cpus["driver_cpu"]} if cpus.get("pinned") and cpus.get("driver_cpu") is not None else None)
    if sampling.workers_per_env is None:  # auto (config.Sampling.workers_per_env)
        sampling.workers_per_env = 1
    if device == "cuda" and sampling.cuda_at_start and not quick:  # contexts made while workers start
        worker_env = {**(worker_env or {}), CUDA_AT_START_ENV: "1"}
    labels = [e.label for e in envs]
    durations: list[float] = []
    slopes = restored_slopes(data)  # (case id, metric) -> stats.SpeedSlope, over every set of this run
    share_cache: dict = {}  # set id -> its share_points (sampling.probe_share: estimated; apply_probe_share)
    # the sets whose workers are starting or waiting, next first (Sampling.prefetch_depth)
    pending: list[_Set] = []
    depth = sampling.prefetch_depth or Sampling.depth_for(len(others or ()), len(envs) * sampling.workers_per_env,
                                                          sampling.start_s, sampling.set_seconds)
    reason = None
    kept = 0.0  # the reserve for the stop at the budget's latest check (_Closer.reserve)
    # env label -> the modules its workers' set-ups loaded (_learn), an ordered set; a --resume
    # starts from what the earlier part learned (its preimport files in the same work dir)
    learned: dict = {}
    for e in envs:
        try:
            learned[e.label] = dict.fromkeys(str(x) for x in json.loads(_preimport_path(work, e.label).read_text()))
        except (OSError, ValueError, TypeError):
            pass

    def preimports() -> dict | None:
        return _preimport_files(work, learned) if sampling.preimport and not quick else None

    # sampling.cpu_hop: a scout reads the set CPUs' speeds and the set moves to a fast one (lockstep.Hopper)
    hopper = None
    if sampling.cpu_hop:  # why it did nothing, if it did nothing, goes into the results (report.probe_note)
        idle = lockstep.hop_idle(cpus)
        if idle is None:
            try:
                hopper = lockstep.Hopper(cpus["set_cpus"], work / "scout.log")
            except (OSError, proc.Stopped) as ex:
                idle = f"its CPU scout could not start ({ex})"
        if idle is not None and timing is not None:
            timing["cpu_hop_idle"] = idle
    t_turn = time.monotonic()
    try:
        while True:
            sid = len(sets)
            if durations:  # a set's share of the run: its own seconds and the driver's work around it
                durations[-1] = max(durations[-1], time.monotonic() - t_turn)
            t_turn = time.monotonic()
            labels = [e.label for e in envs]
            pairs = stats.comparison_pairs([(e.label, e.axis) for e in envs])
            wall_cmp = comparisons_now(data, labels, cases, sampling, "wall_us", quick, family_extra, pairs,
                                       stats.unpinned_sets(sets))
            if sets and len(labels) >= 2 and wall_cmp and len(_settled(wall_cmp, sampling)) == len(wall_cmp):
                reason = (f"all wall-time verdicts decided, every interval within ±{sampling.precision:.0%} of its "
                          "ratio (anytime-valid intervals)")
                break
            if not labels:
                reason = "no env could be timed (every env failed its import check)"
                break
            if sets and not _todo(data, cases, labels, pairs):  # new-user trial: 27 more sets that timed nothing
                reason = "every case failed (its error is in the report): nothing left to time"
                break
            if not alone and len(labels) < 2 and any(cd.sets["wall_us"] for (lab, _), cd in data.items() if lab in labels):
                reason = "one env: nothing to compare, one process set timed it"
                break
            if sum(1 for s in sets if s.get("status") != "interrupted") >= max_sets:
                reason = "quick: one process set" if quick else f"max_sets {max_sets} reached"
                break
            elapsed = time.monotonic() - t0
            # the first set starts cold (no prefetch); a set's duration counts from one turn of this
            # loop to the next (the comparisons and the partial results written between sets: a
            # 60 s H200 run of 11 sets spent 1.9 s there, and ended at 60.25 s counting set times only)
            # after the cold first set alone, the planned pace where it is shorter (new-user trial: a
            # 20 s budget on 2 cores stopped after one 9 s set whose successors took ~4.5 s)
            typical = (durations[1:] or [min(durations[0], sampling.set_estimate_s)]) if durations else []
            # and the stop after the last set: the workers then alive are stopped and reaped (the
            # run's close_s; H200 runs without this reserve ended up to 0.7 s past a 60 s budget)
            kept = closing.reserve()
            # and the results put together after it (Sampling.finish_s)
            if typical and elapsed + sum(typical) / len(typical) + kept + sampling.finish_s > sampling.time_budget_s:
                reason = f"time budget {sampling.time_budget_s:g} s: another process set would overrun it"
                break
            if stop.is_set():
                raise Interrupted()
            cur = pending.pop(0) if pending else _Set(sid, envs, work, others, sampling.workers_per_env,
                                                      worker_env, closing, preimports())
            cpu = cpus["set_cpus"][sid % len(cpus["set_cpus"])] if cpus.get("pinned") else None

            def prefetch(stage: str, _sid=sid):
                """``spawn``: start the workers of the next ``depth`` sets that have none yet (they
                import during this set's cycles, and wait); ``setup``: queue the next set's config
                and set-ups (CUDA work: after this set's cycles); ``await``: wait until those
                set-ups are over (before this set's profiler pass); ``started``: whether the next
                set's workers have all said hello (True when none is starting), without waiting."""
                if stage == "started":
                    return not pending or pending[0].started()
                if quick or stop.is_set() or others is None:  # no spare core: start after this set
                    return None
                if stage == "await":
                    if pending:
                        pending[0].await_setups(case_timeout)
                elif stage == "spawn":
                    while len(pending) < depth:
                        pending.append(_Set(_sid + 1 + len(pending), envs, work, others, sampling.workers_per_env,
                                            worker_env, closing, preimports()))
                elif pending:
                    # not the cases under retry after a fault: their set-up waits for this set's outcome
                    labs = [e.label for e in envs]
                    # nor, per worker, those its env failed for good (the others still time them: _todo)
                    pending[0].preload([c for c in _todo(data, cases, labs, pairs)
                                        if not any(data[(lab, c.id)].status == "error" and _retried(data[(lab, c.id)])
                                                   for lab in labs)],
                                       _config_cmd(device, seed, _sid + 1, quick),
                                       skip=lambda lab, cid: _failed(data.get((lab, cid))))

            with monitor:
                rec = _run_set(cur, cases, data, sampling, device=device, quick=quick, cpu=cpu,
                               case_timeout=case_timeout, stop=stop, rng=rng, on_progress=on_progress,
                               prefetch=prefetch, seed=seed, labels=labels, park=park, slopes=slopes, pairs=pairs,
                               learned=learned, unguarded=stats.unpinned_sets(sets), hopper=hopper,
                               share_cache=share_cache,
                               # set-ups: within the budget, counted from the run's start as the budget
                               # is, less what stopping the workers and writing the results take
                               # (second new-user trial: a 20 s budget ended at 21.5 s in a set-up);
                               # a --resume of a run near its budget: from this call's start, so its
                               # set still gets set up and timed
                               deadline=(t_call + sampling.time_budget_s) if resumed_call else
                               (t0 + sampling.time_budget_s - closing.reserve() - sampling.finish_s))
            rec["gpu"] = monitor.summary()
            sets.append(rec)
            durations.append(rec["seconds"])
            failed = [e for e in envs if e.status == "failed"]
            if failed:
                for e in failed:
                    for c in cases:
                        data.pop((e.label, c.id), None)
                envs = [e for e in envs if e.status != "failed"]
                while pending:  # started with the failed env's workers
                    pending.pop().close()
            on_set(rec)
            if rec["status"] == "interrupted":
                raise Interrupted()
            if rec["status"] == "budget":
                reason = rec["error"]
                break
    except (Interrupted, KeyboardInterrupt):
        stop.set()
        reason = "interrupted"
    except Exception as e:  # noqa: BLE001 - a driver bug or a full disk must not lose what was measured
        import traceback

        log = work / "driver-error.txt"
        try:
            log.write_text(traceback.format_exc())
        except OSError:
            pass
        reason = f"driver error ({type(e).__name__}: {e}; traceback in {log})"
    finally:
        t_close = time.monotonic()
        if hopper is not None:
            hopper.close()
        while pending:
            pending.pop().close()
        closing.join()
        if before_aff:
            lockstep.set_affinity(0, before_aff)
        if timing is not None:  # after the last set: the workers still alive stopped and reaped (s)
            timing["close_reserve_s"] = round(kept, 3)
            timing["finish_reserve_s"] = round(sampling.finish_s, 3)
            timing["close_s"] = round(time.monotonic() - t_close, 3)
    return reason


def _run_set(st: _Set, cases: list[Case], data: dict, sampling: Sampling, *, device: str, quick: bool,
             cpu: int | None, case_timeout: float, stop: threading.Event, rng: random.Random,
             on_progress, prefetch, seed: int, labels: list[str], park: set | None = None,
             slopes: dict | None = None, pairs: list | None = None, deadline: float | None = None,
             learned: dict | None = None, unguarded: frozenset = frozenset(),
             hopper: lockstep.Hopper | None = None, share_cache: dict | None = None) -> dict:
    """Run one process set to its end; returns its record. Faults are handled as the module doc says.
    ``deadline`` (monotonic s: the run's start + the time budget, less the stop's and the results'
    reserves; a resumed call's start + the budget) bounds the set-up of the set's
    cases too: a set-up still running then ends the set and the run (status ``budget``; a GPU-sized
    config on a CPU spent 200 s setting up one case under a 20 s budget before), without blaming the
    case. ``unguarded``: the earlier sets that ran unpinned (comparisons_now). ``hopper``
    (sampling.cpu_hop): the set starts on the pool CPU read fastest and moves between cycles
    (lockstep.Hopper); its record's ``cpu`` is where it started, ``hops`` how often it moved."""
    sid = st.sid
    st.t0 = time.monotonic()  # the set's own time: its workers may have started during the previous set
    rec = {"set": sid, "cpu": cpu, "pinned": cpu is not None, "status": "ok", "error": None,
           "workers": {}, "cycles": 0, "seconds": 0.0, "phase_s": {}, "steal": None}
    j0 = None  # /proc/stat at the start of the cycles (machine.cpu_jiffies)
    lap = [time.monotonic()]

    def phase(name: str) -> None:
        now = time.monotonic()
        rec["phase_s"][name] = round(rec["phase_s"].get(name, 0.0) + now - lap[0], 3)
        lap[0] = now

    live: dict[str, lockstep.Worker] = {}  # worker key -> worker
    envs = {e.label: e for e in st.envs}
    lab_of = st.label_of

    def fault(key: str, cid: str | None, ex: lockstep.WorkerFault, what: str) -> None:
        if stop.is_set():  # the interrupt stopped the worker (SIGTERM): not the case's fault
            raise Interrupted()
        live.pop(key, None)
        rec["workers"].setdefault(key, {})["error"] = f"{what}: {ex}"
        if cid is None:
            return
        cd = data[(lab_of[key], cid)]
        cd.faults += 1
        msg = (f"the worker was stopped after --case-timeout {case_timeout:g} s during {what}"
               if ex.kind == "timeout" else f"{what}: {ex}")
        cd.fail(ex.kind, msg)
        cd.notes.append(f"set {sid}: {msg}")

    def env_failed(key: str, msg: str, transient: bool = False) -> None:
        """The worker ``key`` could not start. ``transient`` (it died or hung, in an env whose import
        was already checked): the set is given up and the next one tries again, once; otherwise, or
        the second time, the env fails."""
        if stop.is_set():  # the interrupt stopped the worker: not the env's fault
            raise Interrupted()
        env = envs[lab_of[key]]
        st.workers[key].kill()
        rec["workers"][key] = {"error": msg}
        if transient and env.import_checked and not getattr(env, "start_faults", 0):
            env.start_faults = 1
            rec["status"], rec["error"] = "failed", f"{key}: {msg}; the next set tries again"
            raise _SetFailed()
        env.status, env.error = "failed", msg

    try:
        on_progress(f"set {sid}: starting workers")
        for key, w in st.workers.items():
            if stop.is_set():
                raise Interrupted()
            env = envs[lab_of[key]]
            if env.status == "failed":
                w.kill()
                continue
            what = "worker did not start"
            try:  # hello (the env probe), the import check, then the config command
                hello = w.hello or w.wait_hello(max(case_timeout, START_TIMEOUT_S))
                if hello.get("type") != "fatal":
                    if not env.import_checked and _import_check(env, hello):
                        w.kill()
                        rec["workers"][key] = {"pid": w.pid, "error": env.error}
                        continue
                    what = "worker failed at start"
                    if key in st.preloaded:  # config was queued by the prefetch: its reply comes first
                        hello = w.reply(START_TIMEOUT_S)
                    else:
                        hello = w.request(_config_cmd(device, seed, sid, quick), START_TIMEOUT_S)
            except lockstep.WorkerFault as ex:
                env_failed(key, f"{what}: {ex}", transient=True)
                continue
            if hello.get("type") == "fatal":
                env_failed(key, str(hello.get("error")))
                continue
            live[key] = w
            rec["workers"][key] = {"pid": w.pid}
            pre = (w.hello or {}).get("preimport")
            if isinstance(pre, dict):  # modules imported at its start, learned from earlier sets (_learn)
                rec["workers"][key]["preimport"] = {k: v for k, v in pre.items() if k != "first_failures" or v}
            cu = (w.hello or {}).get("cuda_at_start")
            if isinstance(cu, dict):  # its CUDA context, made while it started (Sampling.cuda_at_start)
                rec["workers"][key]["cuda_at_start"] = cu
        phase("start")
        failed = [e for e in envs.values() if e.status == "failed"]
        if failed:  # the set goes on with the envs that started (run_all drops the failed ones after it)
            rec["error"] = "; ".join(f"{e.label}: {e.error}" for e in failed)
            if len(failed) == len(envs):
                rec["status"] = "failed"
                return rec
        todo = _todo(data, cases, list(envs), pairs)
        todo_ids = {c.id for c in todo}
        # set-up (workers not yet pinned to one core: it is not timed)
        on_progress(f"set {sid}: setting up {len(todo)} case(s)")
        bad: set = set()  # case ids whose set-up failed in some worker

        set_up: dict = {}  # case id -> {env label: seconds its worker's set-up of it took} (took)

        def took(key: str, cid: str, rep: dict) -> None:
            cd = data[(lab_of[key], cid)]
            if rep.get("status") != "ok":
                cd.fail(rep.get("error_kind") or "error", rep.get("error") or "set-up failed")
                if rep.get("traceback"):
                    cd.notes.append(str(rep["traceback"])[-1200:])
                bad.add(cid)
                return
            cd.seconds += float(rep.get("seconds") or 0)
            if learned is not None:
                _learn(learned, lab_of[key], rep)
            ms = rep.get("first_call_ms")
            if isinstance(ms, (int, float)) and math.isfinite(ms):
                cd.first_call.setdefault(sid, []).append(round(float(ms), 3))
            set_up.setdefault(cid, {}).setdefault(lab_of[key], float(rep.get("seconds") or 0))

        def setup_reply(key: str, cid: str) -> dict:
            """A set-up's reply, waited for at most until the run's deadline (then _BudgetSpent)."""
            t_wait = case_timeout
            if deadline is not None:
                t_wait = min(case_timeout, max(0.5, deadline - time.monotonic()))
            try:
                return live[key].reply(t_wait)
            except lockstep.WorkerFault as ex:
                if ex.kind == "timeout" and t_wait < case_timeout and not stop.is_set():
                    case = data[(lab_of[key], cid)].case
                    # another env's worker that set this case up in this set says it is not the case's size
                    # (new-user trial: a hung set-up was told to raise the budget, which could not help
                    # below the 300 s --case-timeout)
                    done = {lab: s for lab, s in (set_up.get(cid) or {}).items() if lab != lab_of[key]}
                    hint = ("raise --time-budget (where one case's set-up takes most of it, use smaller cases on "
                            "this device)")
                    if done:
                        other, s = next(iter(done.items()))
                        hint = (f"{other}'s worker set it up in {s * 1e3:,.0f} ms in this set, so {lab_of[key]}'s may hang "
                                f"in it: --case-timeout S (now {case_timeout:g} s) fails a case whose set-up or burst "
                                "takes longer than S and goes on with the others; else " + hint)
                    raise _BudgetSpent(
                        f"time budget {sampling.time_budget_s:g} s spent while set {sid} set up case "
                        f"{case.label} {case.op} (inputs and first calls; waiting on {lab_of[key]}'s worker, "
                        f"{time.monotonic() - st.t0:.0f} s into the set): the cases set up so far were not "
                        f"timed; {hint}") from None
                raise

        for key in list(live):  # the replies to set-ups queued by the prefetch, in their order
            for cid in st.preloaded.get(key, []):
                if key not in live:
                    break
                try:
                    rep = setup_reply(key, cid)
                except lockstep.WorkerFault as ex:
                    fault(key, cid, ex, "set-up")
                    bad.add(cid)
                    break
                if cid in todo_ids:
                    took(key, cid, rep)
        for c in todo:  # the rest: each case in every worker at once (not where it failed for good)
            sent = []
            for key in list(live):
                if c.id in st.preloaded.get(key, []) or _failed(data.get((lab_of[key], c.id))):
                    continue
                if stop.is_set():
                    raise Interrupted()
                try:
                    live[key].send({"cmd": "setup", "case": c.id, "spec": c.to_dict()})
                    sent.append(key)
                except lockstep.WorkerFault as ex:
                    fault(key, c.id, ex, "set-up")
                    bad.add(c.id)
            for key in sent:
                try:
                    rep = setup_reply(key, c.id)
                except lockstep.WorkerFault as ex:
                    fault(key, c.id, ex, "set-up")
                    bad.add(c.id)
                    continue
                took(key, c.id, rep)
        ready = [c for c in todo if c.id not in bad]
        phase("setup")
        # the previous set's workers have exited (their CUDA teardown disturbed the first bursts of
        # a set on the H200), then the next set's workers start importing on spare cores
        st.closing.join()
        phase("teardown")
        if sampling.prefetch_spawn == "cycles":
            prefetch("spawn")
        phase("prefetch")
        if cpu is not None and hopper is not None:  # the pool's fastest CPU now (sampling.cpu_hop)
            cpu = hopper.place(cpu)
            rec["cpu"] = cpu
        if cpu is not None:  # every thread of every worker of the set to the set's core
            for key, w in list(live.items()):
                try:
                    rep = w.request({"cmd": "pin", "cpu": cpu}, case_timeout)
                except lockstep.WorkerFault as ex:
                    fault(key, None, ex, "pinning")
                    continue
                if rep.get("status") != "ok":
                    rec["pinned"] = False
                    rec["error"] = f"pinning failed: {rep.get('error')}"
        ok_labels = [lab for lab in labels if envs.get(lab) is None or envs[lab].status != "failed"]
        live_labels = {lab_of[k] for k in live}
        run_pairs = [(b, k) for b, k in stats.pairs_among(labels, pairs) if b in ok_labels and k in ok_labels]
        if run_pairs and not any(b in live_labels and k in live_labels for b, k in run_pairs):
            # a worker lost in set-up or pinning (its case faulted): the rest could only time one side
            # (new-user trial: 4 sets of 405 cycles of one env, used by no comparison); the next set retries
            lost = sorted(lab for lab in ok_labels if lab not in live_labels)
            rec["status"] = "failed"  # the workers' own errors say why (rec["workers"]: the report shows both)
            rec["error"] = (f"{', '.join(lost)}: no worker left after set-up: no cycles, nothing to pair; "
                            "the next set tries again")
            on_progress(f"set {sid}: ended before its cycles: {rec['error']}")
            raise _SetFailed()
        t_cyc = time.monotonic()
        # CPU steal on the set's core over its cycles (the hypervisor running something else: a
        # 2-core CPU VM had 20-50 % in the minutes its A/A intervals widened to +-10-20 %)
        steal_cpus = [cpu] if cpu is not None else None
        unguarded_now = unguarded | ({sid} if not rec["pinned"] else frozenset())  # this set too, if unpinned
        hopping = hopper is not None and cpu is not None
        j0 = machine.cpu_jiffies(steal_cpus)
        if hopping:  # steal over the stretches on each CPU the set moves to (_stretch_to)
            _stretch_to(st, cpu)
            st.hop_began = True
        try:
            rec["cycles"] = _cycles(st, live, ready, data, sampling, quick=quick, case_timeout=case_timeout, stop=stop,
                                    rng=rng, on_progress=on_progress, fault=fault, labels=labels, pairs=pairs,
                                    slopes=slopes if slopes is not None else {},
                                    unguarded=unguarded_now, hopper=hopper if cpu is not None and rec["pinned"] else None,
                                    more=(lambda: not prefetch("started")) if sampling.prefetch_spawn == "cycles" else None)
        finally:  # whatever of the set's cycles ran (an interrupt keeps them) is taken at the estimated share
            t_cyc_end = time.monotonic()
            if sampling.speed_adjust:  # what a --resume carries each slope on from (restored_slopes)
                keep_slopes(data, labels, sid, slopes or {})
            share = apply_probe_share(data, labels, ready, sid, sampling, unpinned=unguarded_now, cache=share_cache)
            if share is not None:  # an interrupted set too (it has no cycles count: new-user trial)
                rec["probe_share"] = round(share, 4)
            held = {c for (_, c), cd in data.items() if "held" in (cd.speed["wall_us"].get(sid) or {})}
            if held:  # its probe difference lay beyond what the share was estimated on (apply_probe_share)
                rec["probe_held"] = len(held)
        budget = sampling.quick_set_seconds if quick else sampling.set_seconds
        rec["extended_s"] = round(max(0.0, t_cyc_end - t_cyc - budget), 3)
        rec["steal"], j0 = (_stretch_share(st) if hopping else _steal_since(j0, steal_cpus)), None
        phase("cycles")
        if sampling.prefetch_spawn == "after":
            prefetch("spawn")
        # correctness and the graph clock, then the profiler pass: on each env's first worker
        first = {}
        for key in live:
            first.setdefault(lab_of[key], key)
        on_progress(f"set {sid}: correctness and graph clock")
        graph_todo = _needed(data, labels, ready, sampling, "graph_us", pairs) if device == "cuda" else set()
        for c in ready:
            for lab, key in first.items():
                cd = data[(lab, c.id)]
                if key not in live or cd.status != "ok" or (cd.correctness and c.id not in graph_todo):
                    continue
                t1 = time.monotonic()
                try:
                    rep = live[key].request({"cmd": "finish", "case": c.id, "correctness": not cd.correctness,
                                             "graph": c.id in graph_todo}, case_timeout)
                except lockstep.WorkerFault as ex:
                    fault(key, c.id, ex, "correctness check and graph clock")
                    continue
                _clock(cd, "finish", time.monotonic() - t1)
                if rep.get("correctness"):
                    cd.correctness.append(rep["correctness"])
                gr = rep.get("graph_us")
                if gr and gr.get("samples"):
                    cd.sets["graph_us"][sid] = [float(x) for x in gr["samples"]]
                    # calls per replay, the GPU-side hold before the start event and the samples
                    # dropped because the host's submission outlasted it (worker.Bench.graph), per set
                    cd.inner.setdefault("graph_us", {})[str(sid)] = {
                        k: gr.get(k) for k in ("inner", "hold_us", "launch_us", "dropped")}
                for n in rep.get("notes") or []:
                    if n not in cd.notes:
                        cd.notes.append(n)
        phase("finish")
        # the next set's CUDA work (context, inputs, first calls) overlaps the profiler's start-up,
        # never the cycles (on the H200 it made 30 % of the last quarter's bursts outliers, up to
        # 3x) nor the profiled calls (prefetch("await") below)
        prefetch("setup")
        dev_todo = _needed(data, labels, ready, sampling, "device_us", pairs) if device == "cuda" else set()
        if dev_todo:
            on_progress(f"set {sid}: kernel time (profiler)")
            # the profiler's start-up (~0.9 s per process on the H200) in every profiling worker at
            # once, off the set's core (the set's timing is over; kernel durations are GPU clocks);
            # then the profiled calls one worker at a time, so no two profile the GPU together
            inits = []
            for key in first.values():
                if key not in live:
                    continue
                if park:
                    lockstep.move_process(live[key].pid, park)
                try:
                    live[key].send({"cmd": "device_init"})
                    inits.append(key)
                except lockstep.WorkerFault as ex:
                    live.pop(key, None)
                    rec["workers"].setdefault(key, {})["error"] = f"profiler start-up: {ex}"
            for key in inits:
                try:
                    live[key].reply(case_timeout)
                except lockstep.WorkerFault as ex:
                    live.pop(key, None)
                    rec["workers"].setdefault(key, {})["error"] = f"profiler start-up: {ex}"
            # the next set's set-ups ran beside the profiler's start-up (CPU work here); its kernels
            # are timed only once they are over, with the GPU to itself
            prefetch("await")
            phase("device_init")
            for c in ready:
                if c.id not in dev_todo:
                    continue
                for lab, key in first.items():
                    cd = data[(lab, c.id)]
                    if key not in live or cd.status != "ok":
                        continue
                    t1 = time.monotonic()
                    try:
                        rep = live[key].request({"cmd": "device", "case": c.id}, case_timeout)
                    except lockstep.WorkerFault as ex:
                        live.pop(key, None)
                        cd.notes.append(f"device_us (set {sid}): the worker failed in the profiler pass: {ex}")
                        continue
                    _clock(cd, "device", time.monotonic() - t1)
                    d = rep.get("device_us")
                    if rep.get("status") == "ok" and d and d.get("samples"):
                        cd.sets["device_us"][sid] = [float(x) for x in d["samples"]]
                        cd.kernels = rep.get("kernels") or cd.kernels
                        if d.get("note") and d["note"] not in cd.notes:
                            cd.notes.append(d["note"])
                    elif rep.get("status") != "ok":
                        n = f"device_us unavailable: {rep.get('error')}"
                        if n not in cd.notes:
                            cd.notes.append(n)
        phase("device")
    except _SetFailed:
        pass
    except _BudgetSpent as ex:
        phase("setup")  # the time it waited (it had counted as "close": new-user trial)
        rec["status"], rec["error"] = "budget", str(ex)
    except Interrupted:
        rec["cycles"] = max(rec["cycles"], st.cycles_done)  # the cycles kept (the report compares them)
        if j0 is not None:  # stopped during its cycles: the steal over the ones kept
            rec["steal"] = _stretch_share(st) if hopping else _steal_since(j0, steal_cpus)
            phase("cycles")  # their time (it had counted as "close": new-user trial)
        rec["status"] = "interrupted"
        rec["error"] = "stopped by a signal; the cycles timed so far are kept"
    finally:
        if hopper is not None:
            hopper.leave()
            if st.hop_began:  # its cycles began: its moves, and the scout's state (a stopped scout or
                # no reading fresh enough leaves a set where it started, with 0 moves)
                rec["hops"] = len(st.hops)
                rec["hop_cpus"] = sorted({rec["cpu"]} | {c for _, c in st.hops})
                rec["scout"] = hopper.health()
        st.close(park)
        phase("close")
        rec["seconds"] = round(time.monotonic() - st.t0, 2)
    return rec


def _todo(data: dict, cases: list[Case], labels: list[str], pairs: list | None = None) -> list[Case]:
    """The cases a set times: ok, pending or retried once after a fault (not :func:`_failed`) in
    every env; or, where it failed for good in some env, in the others while they hold a comparison
    pair (stats.pairs_among ``pairs``) without it. A case that fails in one of three versions is
    still compared between the other two (new-user trial: 2.8.3's failure at batch 2 had dropped
    the case from every version's timing, 2.7.0.post2 vs 2.6.3 included)."""
    out = []
    for c in cases:
        ok = [lab for lab in labels if not _failed(data.get((lab, c.id)))]
        if len(ok) == len(labels) or any(b in ok and k in ok for b, k in stats.pairs_among(labels, pairs)):
            out.append(c)
    return out


def _failed(cd: CaseData | None) -> bool:
    """A case record (None: its env's records were dropped, the env failed) that failed for good:
    error, and not a fault retried once (:func:`_retried`). Its env's workers skip the case."""
    return cd is None or (cd.status == "error" and not _retried(cd))


def _config_cmd(device: str, seed: int, sid: int, quick: bool) -> dict:
    """A set's workers' ``config`` command (each set its own input seed)."""
    return {"cmd": "config", "device": device, "seed": seed + 1000 * sid, "quick": quick}


def _retried(cd: CaseData) -> bool:
    """A case failed by one worker fault (crash or hang): timed again in the next set (module doc)."""
    return cd.status == "error" and cd.error_kind in ("crash", "timeout") and cd.faults < 2


def _clock(cd: CaseData, name: str, seconds: float) -> None:
    cd.clock_seconds[name] = round(cd.clock_seconds.get(name, 0.0) + seconds, 3)


def _needed(data: dict, labels: list[str], cases: list[Case], sampling: Sampling, metric: str,
            pairs: list | None = None) -> set:
    """Ids of the cases whose ``metric`` still needs sets: some ok env has none of it yet, or a
    comparison of it is undecided. Used for the profiler pass and the graph clock (kernel time hardly
    varies between processes: the same to 0.1 µs in 12 of 12 H200 cases; each pass costs ~0.05-0.1 s
    per case and worker), so the time goes to the lockstep cycles once they are decided."""
    out = set()
    und = {cid for _, _, cid in _undecided(comparisons_now(data, labels, cases, sampling, metric, pairs=pairs))}
    for c in cases:
        cds = [data[(lab, c.id)] for lab in labels if data[(lab, c.id)].status == "ok"]
        if cds and all(len(cd.sets[metric]) >= sampling.clock_sets for cd in cds):
            continue  # enough sets of this clock (Sampling.clock_sets)
        if any(not cd.sets[metric] for cd in cds) or c.id in und:
            out.add(c.id)
    return out


def cycle_weights(data: dict, labels: list[str], cases: list[Case], max_repeats: int,
                  pairs: list | None = None) -> dict:
    """How many times each case's wall clock is timed per sweep of the next set's cycles: case id ->
    1..``max_repeats``: round(v / v_ref), clamped, where v is the case's per-cycle variance of the
    paired log ratio (pooled within the sets timed so far; the largest over the candidates) and
    v_ref the lower quartile of the cases' v.

    Why: a set's log ratio is a trimmed mean over its cycles, and per cycle a host-bound batch-2
    case varies ~10x more than a batch-512 one (H200, seed config: per-cycle SD 0.05-0.13 vs
    0.015-0.04), so cycles in proportion to variance (Neyman allocation for equal precision,
    capped; the lower quartile as reference so one very quiet case does not send everything else
    to the cap) even out the intervals where a set's own cycles are a large share of its spread.
    Measured (H200): with 3 s sets (2026-12-01, reports/h200-variant-weights-lq-aa-1..3 vs
    h200-aa-4..7) the batch-2 cases got ~12 cycles per set instead of ~6 and their sets' spread
    did not shrink (it was between sets), while the batch-512 ones, down to ~3, got wider; with
    1.5 s sets (2026-12-03) the batch-2 intervals narrowed (``Sampling.max_repeats``, default 2
    since). The weights use only
    earlier sets, so a set's cycles are fixed before it is timed; before any data every case gets 1."""
    var = {}
    for c in cases:
        best = None
        for b_lab, cand in stats.pairs_among(labels, pairs):
            base, cd = data.get((b_lab, c.id)), data.get((cand, c.id))
            if base is None or cd is None:
                continue
            ss, df = 0.0, 0
            for sid, b in base.sets["wall_us"].items():
                k = cd.sets["wall_us"].get(sid)
                if not k:
                    continue
                d = [math.log(y) - math.log(x) for x, y in stats._paired(b, k)]
                if len(d) >= 2:
                    mu = sum(d) / len(d)
                    ss += sum((v - mu) ** 2 for v in d)
                    df += len(d) - 1
            if df >= 3:
                v = ss / df
                best = v if best is None else max(best, v)
        if best is not None and math.isfinite(best) and best > 0:
            var[c.id] = best
    out = {c.id: 1 for c in cases}
    if len(var) < 2:
        return out
    vs = sorted(var.values())
    ref = vs[(len(vs) - 1) // 4]  # lower quartile (the smallest of 2-4 cases)
    for cid, v in var.items():
        out[cid] = max(1, min(max_repeats, round(v / ref)))
    return out


def _cycles(st: _Set, live: dict, cases: list[Case], data: dict, sampling: Sampling, *, quick: bool,
            case_timeout: float, stop: threading.Event, rng: random.Random, on_progress, fault,
            labels: list[str], slopes: dict, more: Callable[[], bool] | None = None,
            pairs: list | None = None, unguarded: frozenset = frozenset(),
            hopper: lockstep.Hopper | None = None) -> int:
    """The set's lockstep cycles for ``sampling.set_seconds`` (quick: ``quick_set_seconds``), and
    on while ``more()`` says the next set's workers are still starting (up to ``EXTEND_FACTOR`` x that
    time: the start would otherwise wait idle for them); returns how many ran. A cycle is one (case, clock) item: every worker of the set times a burst of it, in
    a random order, reversed for that item's next cycle. With several workers per env, an env's
    value of a cycle is the geometric mean of its workers' bursts. Each burst's value is taken at the
    reference CPU speed (``sampling.speed_adjust``: stats.SpeedSlope, fixed from the earlier bursts
    of the item for every burst of a cycle); its plain median is kept in ``CaseData.raw``. A comparison decided and within
    ``sampling.precision`` drops its item for this set; the host clock is sampled in one sweep of
    ``sampling.host_every``;
    a case's wall clock comes up :func:`cycle_weights` times per sweep (1 unless ``max_repeats`` > 1).
    A worker fault ends the cycles (the set's other data stay). ``unguarded``: the sets, this one
    included where it runs unpinned, that the glitch guard leaves whole (comparisons_now). ``hopper``
    (sampling.cpu_hop): after each cycle the set's workers may move to a faster CPU of the pool
    (lockstep.Hopper.after_cycle; recorded in ``st.hops`` as (cycle, cpu))."""
    sid, lab_of = st.sid, st.label_of
    budget = sampling.quick_set_seconds if quick else sampling.set_seconds
    items = []
    run_pairs = stats.pairs_among(labels, pairs)
    for m in CYCLED:
        done: set = set()
        if len(labels) >= 2 and not quick:
            done = _settled(comparisons_now(data, labels, cases, sampling, m, pairs=run_pairs, unguarded=unguarded),
                            sampling, m)
        for c in cases:  # while a comparison of it, between envs that have not failed it, is undecided
            if not run_pairs or any((base, cand, c.id) not in done for base, cand in run_pairs
                                    if not (_failed(data.get((base, c.id))) or _failed(data.get((cand, c.id))))):
                items.append((c, m))
    if not items:
        return 0
    reps = cycle_weights(data, labels, cases, sampling.max_repeats, run_pairs) if not quick and sampling.max_repeats > 1 else {}
    keys = list(live)
    t_end = time.monotonic() + budget
    t_cap = t_end + (sampling.EXTEND_FACTOR - 1) * budget

    def over() -> bool:
        """The set's cycles are over: ``budget`` s are up and the next set's workers have started
        (``more`` is false) or the set has run ``Sampling.EXTEND_FACTOR`` x its budget."""
        now = time.monotonic()
        return now >= t_end and (more is None or now >= t_cap or not more())

    n = 0
    flip: dict = {}
    sweep = 0
    on_progress(f"set {sid}: lockstep cycles ({len(items)} case-clock items)")
    while items and not over():
        # the host clock in one sweep of Sampling.host_every: wall decides the run, host explains it
        now = [it for it in items if it[1] == "wall_us" or sweep % sampling.host_every == 0] or list(items)
        now = [it for it in now for _ in range(reps.get(it[0].id, 1) if it[1] == "wall_us" else 1)]
        sweep += 1
        rng.shuffle(now)
        for c, m in now:
            if stop.is_set():
                raise Interrupted()
            if any(k not in live for k in keys):
                return n  # a worker was lost: the set ends
            # the workers of the envs that have not failed this case for good (_todo: a pair of them)
            ks = [k for k in keys if not _failed(data.get((lab_of[k], c.id)))]
            if len(ks) < len(keys):
                healthy = {lab_of[k] for k in ks}
                if not any(b in healthy and q in healthy for b, q in run_pairs or stats.pairs_among(labels, pairs)):
                    continue
            item = (c.id, m)
            slope = slopes.setdefault(item, stats.SpeedSlope())
            beta, center = slope.beta_center() if sampling.speed_adjust else (0.0, 0.0)
            fits = []
            if item in flip:
                order = [k for k in reversed(flip.pop(item)) if k in ks]
            else:
                order = list(ks)
                rng.shuffle(order)
                flip[item] = order
            got: dict = {}
            refs: dict = {}
            raws: dict = {}
            for key in order:
                cd = data[(lab_of[key], c.id)]
                t1 = time.monotonic()
                try:
                    cmd = {"cmd": "burst", "case": c.id, "clock": m[:-3], "ms": sampling.burst_ms,
                           "beta": beta, "center": center, "probe": sampling.speed_adjust}
                    if sampling.min_burst_samples > 1:  # Sampling.min_burst_samples (1: the protocol as before)
                        cmd["min_samples"] = sampling.min_burst_samples
                    rep = live[key].request(cmd, case_timeout)
                except lockstep.WorkerFault as ex:
                    fault(key, c.id, ex, f"a {m[:-3]} burst")
                    return n
                _clock(cd, m[:-3], time.monotonic() - t1)
                if rep.get("status") != "ok":
                    cd.fail(rep.get("error_kind") or "error", rep.get("error") or "burst failed")
                    if rep.get("traceback"):
                        cd.notes.append(str(rep["traceback"])[-1200:])
                    got = {}
                    break
                try:
                    us = float(rep["us"])
                    adj = float(rep.get("adj_us", us))
                except (KeyError, TypeError, ValueError):  # a malformed reply fails its case, not the run
                    cd.fail("protocol", f"a {m[:-3]} burst: the worker's reply could not be read: {str(rep)[:200]}")
                    got = {}
                    break
                got.setdefault(lab_of[key], []).append(adj)
                raws.setdefault(lab_of[key], []).append(us)
                fits.append((key, rep.get("fit"), rep.get("x_median")))
                ref = rep.get("ref_us")
                refs.setdefault(lab_of[key], []).append(float(ref) if isinstance(ref, (int, float)) else math.nan)
                cd.inner[m] = rep.get("inner")
            for lab, vals in got.items():
                cd = data[(lab, c.id)]
                value = _geomean(vals)
                if value is None:
                    continue
                cd.sets[m].setdefault(sid, {})[n] = value
                for store, per in ((cd.raw, raws), (cd.refs, refs)):  # plain medians, probe readings
                    v = _geomean(per.get(lab) or [])
                    if v is not None:
                        store[m].setdefault(sid, {})[n] = v
                cd.speed[m][sid] = {"beta": round(beta, 4), "center": round(center, 4)}
                cd.cycle_beta[m].setdefault(sid, {})[n] = beta
                if cd.status != "ok":
                    if cd.status == "error":
                        cd.notes.append(f"set {sid}: timed again after the earlier fault")
                    cd.status, cd.error, cd.error_kind = "ok", None, None
            for key, fit, xm in fits:  # after the cycle: its bursts all used the same slope
                slope.add((sid, key), fit, xm)
            if hopper is not None and got:  # both bursts of every cycle on one core: move between cycles
                was = hopper.at  # where the set is
                to = hopper.after_cycle(refs)
                if to is not None:
                    moved = [lockstep.move_process(live[key].pid, {to}) > 0 for key in keys if key in live]
                    if moved and all(moved):
                        st.hops.append((n, to))
                        _stretch_to(st, to)
                    else:  # the OS refused (or a worker is gone): back where the set still is
                        for key in keys:
                            if key in live:
                                lockstep.move_process(live[key].pid, {was})
                        hopper.mark(was)
            n += 1
            st.cycles_done = n
            if over():
                break
    return n


def share_points(data: dict, labels: list[str], cases: list[Case], sid: int, metric: str = "wall_us") -> dict:
    """(case id, env label) -> (beta, dm, dy) of set ``sid``: over the cycles every env timed, dm = the
    mean of the env's log probe reading (µs) less the envs' mean, dy = the same difference of the
    plain log burst medians (µs), beta the case's speed slope at the set's end; :func:`stats.probe_share`
    takes (beta * dm, dy)."""
    out = {}
    for c in cases:
        cds = [data.get((lab, c.id)) for lab in labels]
        if any(cd is None for cd in cds):
            continue
        sp = cds[-1].speed[metric].get(sid)
        refs = [cd.refs[metric].get(sid) or {} for cd in cds]
        raws = [cd.raw[metric].get(sid) or {} for cd in cds]
        ks = [k for k in raws[0] if all(k in r and k in f and r[k] > 0 and f[k] > 0 for r, f in zip(raws, refs))]
        if not sp or not ks or len(cds) < 2:
            continue
        beta = float(sp.get("beta") or 0.0)
        dms = [0.0] * len(cds)
        dys = [0.0] * len(cds)
        for k in ks:
            lx = [math.log(f[k]) for f in refs]
            ly = [math.log(r[k]) for r in raws]
            mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
            for i in range(len(cds)):
                dms[i] += (lx[i] - mx) / len(ks)
                dys[i] += (ly[i] - my) / len(ks)
        for lab, dm, dy in zip(labels, dms, dys):
            out[(c.id, lab)] = (beta, dm, dy)
    return out


def apply_probe_share(data: dict, labels: list[str], cases: list[Case], sid: int, sampling: Sampling,
                      unpinned: frozenset = frozenset(), cache: dict | None = None) -> float | None:
    """``sampling.probe_share: estimated``: set ``sid``'s speed-adjusted values (wall and host) taken
    with only the share (:func:`stats.probe_share`) of its between-worker probe difference that the
    calls felt in the earlier *pinned* sets (their :func:`share_points`; ``cache``: set id -> those,
    kept across calls): each (env, case, clock) cycle value times exp(beta_k * (dm - share * d)),
    beta_k the slope that cycle was adjusted with (``CaseData.cycle_beta``; a --resume's first cycles
    ran with none), dm its :func:`share_points` probe difference (log µs), d = dm held to
    +-``stats.PROBE_SHARE_REACH`` times the largest |dm| of the earlier sets (the share is not carried
    beyond the differences it was estimated on; a held d is kept as ``held``); the set's mean log
    shift is kept as ``between`` in ``CaseData.speed``. Returns the share, or None where the option is off, the speed
    is not adjusted, the set has one env or timed nothing, it ran unpinned (``unpinned``: its workers did not share a
    core, so their probe difference is CPU speed: the whole of it counts) or fewer than
    ``sampling.probe_share_min_sets`` (a resumed run's own; else stats.PROBE_SHARE_MIN_SETS) earlier
    pinned sets give the share: until then the whole difference counts, as with ``full``, but an env's
    set-wide difference (the median of its cases' dm) only up to +-``stats.PROBE_FIRST_REACH``: each
    of its cases' dm less the excess."""
    if sampling.probe_share != "estimated" or not sampling.speed_adjust or len(labels) < 2 or sid in unpinned:
        return None
    if not any(cd.sets["wall_us"].get(sid) for (lab, _), cd in data.items() if lab in labels):
        return None  # the set timed nothing: no share taken
    cache = {} if cache is None else cache
    earlier = sorted({s for (lab, _), cd in data.items() if lab in labels for s in cd.raw["wall_us"]
                      if s < sid and s not in unpinned})
    estimated = len(earlier) >= (sampling.probe_share_min_sets or stats.PROBE_SHARE_MIN_SETS)
    share, reach = 1.0, stats.PROBE_FIRST_REACH  # too few earlier sets: all of it counts, up to the first reach
    if estimated:
        groups: dict = {}
        seen = 0.0  # the largest |dm| of the earlier sets, any case and env
        for s in earlier:
            if s not in cache:
                cache[s] = share_points(data, labels, cases, s)
            for key, (beta, dm, dy) in cache[s].items():
                groups.setdefault(key, []).append((beta * dm, dy))
                seen = max(seen, abs(dm))
        share = stats.probe_share(list(groups.values()))
        reach = stats.PROBE_SHARE_REACH * seen
    for m in CYCLED:
        pts = share_points(data, labels, cases, sid, m)
        excess: dict = {}  # before a share: env -> its set-wide difference (median over cases) beyond the reach
        if not estimated:
            for lab in labels:
                ds = [dm for (_, lb), (_, dm, _) in pts.items() if lb == lab]
                whole = statistics.median(ds) if ds else 0.0
                excess[lab] = whole - max(-reach, min(reach, whole))
        for (cid, lab), (beta, dm, _) in pts.items():
            cd = data[(lab, cid)]
            vals = cd.sets[m].get(sid)
            # the share is not carried beyond what it was estimated on; before one, only a set-wide
            # difference beyond the first reach is held (one case's few cycles can differ by CPU speed)
            counted = max(-reach, min(reach, dm)) if estimated else dm - excess[lab]
            if not isinstance(vals, dict) or not vals or beta <= 0 or (share >= 1.0 and counted == dm):
                continue
            betas = cd.cycle_beta[m].get(sid) or {}
            shifts = {k: float(betas.get(k, beta)) * (dm - share * counted) for k in vals}
            cd.sets[m][sid] = {k: v * math.exp(shifts[k]) for k, v in vals.items()}
            cd.speed[m][sid]["between"] = round(sum(shifts.values()) / len(shifts), 5)
            if counted != dm:  # results.json: speed_by_set[set]["held"], the dm counted (report.probe_note)
                cd.speed[m][sid]["held"] = round(counted, 5)
    return share if estimated else None


def _geomean(vals: list) -> float | None:
    """Geometric mean of an env's workers' values of one cycle (µs); None when there are none or one
    is not a positive finite number."""
    if not vals or any(not math.isfinite(v) or v <= 0 for v in vals):
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def keep_slopes(data: dict, labels: list[str], sid: int, slopes: dict) -> None:
    """At set ``sid``'s end: each (case, clock) slope's state (:meth:`stats.SpeedSlope.state`) into the
    set's speed record of every env that timed it, for :func:`restored_slopes`."""
    for (cid, m), sl in slopes.items():
        now = None
        for lab in labels:
            cd = data.get((lab, cid))
            rec = cd.speed[m].get(sid) if cd is not None and m in cd.speed else None
            if isinstance(rec, dict):
                now = now or sl.state()
                rec.update(now)


def restored_slopes(data: dict) -> dict:
    """(case id, metric) -> :class:`stats.SpeedSlope` carried on from the earlier sets in ``data`` (a
    --resume's; empty for a new run): from the latest set's speed record of the case
    (:meth:`stats.SpeedSlope.restored`), one per case and clock as the cycles keep them."""
    out: dict = {}
    for (_, cid), cd in data.items():
        for m in CYCLED:
            recs = cd.speed[m]
            if (cid, m) in out or not recs:
                continue
            last = recs[max(recs)]
            if isinstance(last, dict) and "fit_n" in last:
                out[(cid, m)] = stats.SpeedSlope.restored(last)
    return out


def case_data_from_record(rec: dict, case: Case) -> CaseData:
    """A :class:`CaseData` rebuilt from one entry of results.json's ``cases`` (for --resume)."""
    cd = CaseData(rec["env"], case)
    metrics = rec.get("metrics") or {}
    for m in METRICS:
        by_set = (metrics.get(m) or {}).get("by_set") or {}
        for sid, v in by_set.items():
            if isinstance(v, dict):
                cd.sets[m][int(sid)] = {int(k): float(x) for k, x in v.items() if x is not None}
            else:
                cd.sets[m][int(sid)] = [float(x) for x in v if x is not None]
    corr = rec.get("correctness") or {}
    if corr.get("tensors"):
        cd.correctness = [corr["tensors"]]
    elif corr.get("skipped"):
        cd.correctness = [{"skipped": corr["skipped"]}]
    for m in CYCLED:
        for name, into in (("ref_by_set", cd.refs), ("raw_by_set", cd.raw)):
            for sid, v in ((metrics.get(m) or {}).get(name) or {}).items():
                into[m][int(sid)] = {int(k): float(x) for k, x in v.items() if x is not None}
        for sid, v in ((metrics.get(m) or {}).get("speed_by_set") or {}).items():
            cd.speed[m][int(sid)] = dict(v)
    cd.status = rec.get("status") if rec.get("status") in ("ok", "error") else "pending"
    cd.error, cd.error_kind = rec.get("error"), rec.get("error_kind")
    cd.kernels = rec.get("kernels")
    cd.notes = list(rec.get("notes") or [])
    cd.seconds = float(rec.get("seconds") or 0.0)
    cd.faults = int(rec.get("faults") or 0)
    cd.inner = dict(rec.get("inner") or {})
    cd.clock_seconds = dict(rec.get("clock_seconds") or {})
    fc = (rec.get("first_call_ms") or {}).get("by_set") or {}
    cd.first_call = {int(k): [float(x) for x in v if isinstance(x, (int, float))] for k, v in fc.items()
                     if isinstance(v, list)}
    return cd


def data_from_results(doc: dict, cases: list[Case]) -> dict:
    """``{(env, case id): CaseData}`` from a results.json document, for the cases of ``cases``
    (matched by case id; records of other cases are left out)."""
    by_id = {c.id: c for c in cases}
    out = {}
    for rec in doc.get("cases") or []:
        c = by_id.get(rec.get("id"))
        if c is not None and rec.get("env"):
            out[(rec["env"], c.id)] = case_data_from_record(rec, c)
    return out


def install_signal_handlers(stop: threading.Event) -> Callable[[], None]:
    """SIGINT (Ctrl-C) and SIGTERM stop the run cleanly: the first sets ``stop`` and SIGTERMs every
    running worker, build and install (``proc.terminate_all``; no new command starts), so the
    caller can write what was measured; a second one SIGKILLs them. Neither waits for anything
    (``proc.signal_all``: a second signal can arrive inside the first handler -- GNU ``timeout``
    signals the driver and then its process group -- and a wait there deadlocked the driver).
    Returns a function that restores the previous handlers. Does nothing outside the main thread."""
    import signal

    count = [0]

    def handler(signum, frame):
        count[0] += 1
        stop.set()
        proc.signal_all(signal.SIGTERM if count[0] == 1 else signal.SIGKILL)

    prev = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            prev[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass

    def restore() -> None:
        for sig, h in prev.items():
            signal.signal(sig, h)

    return restore
