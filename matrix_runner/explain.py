"""Stage 3b/4b — the explain pass (``--explain``): which layers and Python frames make one version's
call cost more (issue #12). Off by default; it runs after the timing phase, in its own worker
processes, so nothing it measures or samples enters a verdict.

What it measures, per env (one fresh worker per env, all pinned to one set core where pinning works):

1. **First-call cost** (ms): the first synchronized call of each case in that fresh process (the
   ``setup`` reply's ``first_call_ms``). The first case set up also pays the process's one-off costs
   (lazy imports: flash-attn 2.7+ imports ``torch._dynamo`` on its custom op's first dispatch); the
   report marks it.
2. **Layer peeling** (forward flash_attn cases): :func:`worker.discover_layers` finds the layers
   the installed version has — ``public`` flash_attn_func, ``autograd`` FlashAttnFunc.apply,
   ``custom_op`` torch.ops.flash_attn._flash_attn_forward (2.7+ with torch >= 2.4), ``python`` the
   Python body of _flash_attn_forward, ``extension`` flash_attn_2_cuda.fwd — and says why a layer
   does not exist. Each layer is called with the arguments its version passed it, so a layer's time
   minus the next inner layer's is the cost of that *segment* (the wrapper code between them). Host
   clock (device synchronized before each call, outside the timing), µs per call. ``rounds`` rounds;
   in each, every env's worker times one ~``burst_ms`` host burst per layer (order of envs random,
   order of layers reversed every other round), so the envs' bursts of a round were taken ms apart
   on the same core: rounds are paired like lockstep cycles.
   **Interval** (a documented simpler interval than the main comparison's): per segment, the
   paired per-round differences candidate - baseline, their 20 % trimmed mean and its
   Tukey-McLaughlin 95 % t interval (``stats._trimmed_ci``, as results/1 used per round). It holds
   for these two worker processes only (one process per env: the process-to-process spread that the
   main comparison's sets capture is not in it) and is fixed-n, one comparison at a time.
3. **Differential frame profile**: the case with the smallest baseline per-call time (the most
   host-bound forward) runs steady loops of synchronized calls (:func:`worker._explain_loop`) while
   py-spy (an out-of-process sampler; ``py-spy record --format raw --function --nonblocking``, needs
   ptrace) samples the worker from the driver for ``profile_s`` seconds. Folded stacks are kept per
   env. A frame's µs per call = its share of the samples under ``_explain_loop`` x the sampled
   loops' µs per call (the median over the sampled loops of each loop's median of ~1 ms samples: a
   preemption lands in whatever frame runs, so it leaves the shares alone but inflates a mean);
   *self* counts samples where it is the innermost Python frame, *total* where it is anywhere on the
   stack. The differential view lists frames that appear, vanish, grow or shrink (self µs per call,
   candidate - baseline), with a binomial sampling error.

   **The sampler's effect on wall time** (the figure: it should be within ±2 %, shown with its
   interval). The CPU's speed drifts by several % over seconds (H200: one loop before and one with
   the sampler read -48 % and +17 %; loops before, with and after still read +2.2 % and +3.7 %
   with -1.2 % and -3.3 % of drift between the loops without it), so loops seconds apart cannot
   bound it. Two worker processes pinned to the same core and taking turns ms apart see the same
   speed, so the log ratio of their turns cancels the drift (H200: per-turn SD ~0.05-0.1 with 5-20
   ms turns). So the profiled env's worker X takes turns with a *twin* T (a second worker of the
   same env, set up with the same case) and a *partner* P (another env's worker: the baseline's;
   the baseline's own partner is the first candidate's), all on the same core, in *cycles*: one
   ``loop`` of ``sampler_loop_s`` (20 ms) each, the order a random permutation per cycle (a seeded
   random.Random). The effect is read from X/T (r below with T for P): the same code, so the ratio
   holds still when the CPU's speed moves, where X/P did not (two versions with different shares of
   host work drift apart as the speed changes; H200, 2.6.3/2.7.0.post2: -6.5 % [-8.5, -4.4] between
   the cycles before and after the sampler). T/P, both unsampled, is the versions' ratio at one
   moment: it puts the frames' sums at the timing phase's speed for the check that they add up
   (:func:`speed_matched`; each frame stays in µs per call of the sampled loop). Records written
   before the twins, and runs whose twin could not start, read the effect from X/P, as written
   here. ``sampler_cycles`` (K) cycles without the sampler (*off*), cycles
   while py-spy samples X (*on*: as long as py-spy runs, ``--duration profile_s``; a cycle counts
   only if it started ``sampler_lead_s`` after py-spy was started, its attach, and ended within
   ``profile_s`` of it, the others are ``on_edge``), then K cycles without it again (*off2*). X
   loops about a third of the sampled window (half without a twin); the samples under its loop
   were 760-980 per env on the H200 with the twins (1,180-1,380 with the partner alone) at the
   defaults. With a cycle's log ratio r = log(X µs / P µs):

       effect = exp(tmean(r | on) - tmean(r | off, off2)) - 1

   with tmean the 20 % trimmed mean, and its 95 % interval is Yuen's trimmed t interval of that
   difference (the on and the off cycles are two independent groups of unequal size and variance:
   winsorized variances, Welch-Satterthwaite df; ``scipy.stats.ttest_ind(trim=0.2)``), mapped
   through exp(.) - 1 (:func:`sampler_effect`, :func:`_yuen`). Trimmed because a cycle's log ratio
   is heavy-tailed (a preempted loop of either worker): on the committed H200 runs Welch's
   interval of plain means was 2-4x as wide around the same centre. At the defaults (12 s sampled,
   80+80 cycles without) ~170 on and 160 off cycles: with a per-cycle SD of 0.05 about ±1 %; the CPU test's runs read e.g. +0.5 % [-0.9, +2.0] while
   the plain loops of the same worker moved +4.5 %. It is read against ±2 % (``within``,
   ``over``, or ``undecided`` when the interval straddles a bound). The off cycles before and
   after bracket the sampled ones, so a slow drift of X/P itself (the processes, not the CPU)
   averages out to first order; off2 against off, the same way, is reported as that drift. What
   it assumes: the cycles are independent (adjacent turns are ms apart, so drift that survives the
   ratio is slow against a cycle, and the bracketing takes the linear part of it out), and that
   py-spy slows P no more than X (py-spy is the driver's child, not pinned to the workers' core; what
   it costs the core as a whole, both pay and the ratio cancels: it is the effect on the sampled process relative to an
   unsampled one, which is what could distort its frames). X's plain µs per call without / with the
   sampler (medians of its loops) are kept beside it. With one env there is no partner: one loop
   of ``profile_s`` without the sampler, one with, one without again (``loop_off`` / ``loop_on`` /
   ``loop_off2``; the effect against the geometric mean of the two without, "not measurable" when
   they differ by more than 2 %), as records written before the cycles have it.
4. **Call counts**: cProfile over ``count_calls`` calls of the same case (deterministic counts per
   function and call; cProfile's time inflation is irrelevant to counts), diffed between versions.

py-spy missing or refused (no ptrace): the profile is skipped with the reason in the report and on
the terminal; the rest goes on. Raw data lives in results.json under ``explain`` (schema
:data:`SCHEMA`); :func:`analyze` derives everything shown from it, so ``matrix-run explain RUN_DIR``
re-renders without measuring.
"""
from __future__ import annotations

import math
import os
import random
import shutil
import sys
import threading
import time
from pathlib import Path

from scipy import stats as sps

from . import lockstep, proc, stats

SCHEMA = "matrix-runner/explain/1"
#: Defaults: layer rounds, ms per layer burst, seconds sampled per env (py-spy's --duration: the
#: profiled worker loops about a third of it, taking turns with its twin and partner: 760-980 samples
#: under its loop on the H200 at 6 s; with 3 s and the partner alone, the CPU test's
#: planted 20 µs read 16.4-26.6 µs over 7 runs on the loaded 2-core machine, with 6 s 19.5-22.9 over
#: 4), py-spy samples per second, cProfile'd calls per env, set-up warm-up seconds per case; the
#: sampler effect (module doc, 3). ``profile_s`` 12 and ``sampler_cycles`` 80 (were 6 and 40): the
#: effect's trimmed interval on the H200 was ±0.5-1.0 % at 6 s / 40 (one of three 2.6.3 readings,
#: +1.2 % [+0.2, +2.2], reached past ±2 %) and ±0.5-0.6 % at 24 s / 160
#: (benchmarks/results/h200-sampler-trimmed.txt); each doubling adds ~20 s per env to ``--explain``.
DEFAULTS = {"rounds": 20, "burst_ms": 5.0, "profile_s": 12, "rate": 1000, "count_calls": 200, "warmup_s": 0.05,
            # K: cycles (one loop of the profiled worker, one of its twin, one of its partner) without
            # the sampler, before and again after the sampled ones (~65 ms a cycle: ~5 s each)
            "sampler_cycles": 80,
            # seconds of one worker's loop per turn (~20 of its ~1 ms samples; H200: turns of 5-20 ms
            # see the same CPU speed in both workers)
            "sampler_loop_s": 0.02,
            # seconds after py-spy's start before a sampled cycle counts (its attach; earlier cycles
            # were not sampled for sure)
            "sampler_lead_s": 0.3}
#: Segment names: the cost between a layer and the next inner layer that exists.
SEGMENTS = {"public": "Python wrapper (flash_attn_func)",
            "autograd": "autograd Function (FlashAttnFunc.apply + forward)",
            "custom_op": "custom-op dispatch (torch.library.custom_op)",
            "python": "Python _flash_attn_forward body",
            "extension": "extension call (fwd)"}
KINDS = tuple(SEGMENTS)
LOOP_FRAME = "_explain_loop"


def find_pyspy() -> str | None:
    """The py-spy executable: ``$MATRIX_RUN_PYSPY`` where set (a path; one that does not exist counts
    as missing), else on PATH, else next to this interpreter (a venv's bin/ that is not on PATH)."""
    env = os.environ.get("MATRIX_RUN_PYSPY")
    if env is not None:
        return env if env and Path(env).exists() else None
    p = shutil.which("py-spy")
    if p:
        return p
    cand = Path(sys.executable).parent / "py-spy"
    return str(cand) if cand.exists() else None


def _flash_cases(cases):
    return [c for c in cases if getattr(c, "impl", "flash_attn") == "flash_attn"]


def run(envs, cases, *, device: str, work: Path, case_timeout: float = 300.0, cpus: dict | None = None,
        settings: dict | None = None, on_progress=None) -> dict:
    """Measure the explain data (module doc) for ``envs`` (objects with ``label`` and ``python``; the
    first is the baseline) and ``cases`` (config.Case); worker logs in ``work``. Returns the raw
    record stored as results.json's ``explain`` (schema :data:`SCHEMA`). Never raises for a worker
    fault or a missing sampler: they become ``notes`` / ``profile.error``."""
    st = {**DEFAULTS, **(settings or {})}
    say = on_progress or (lambda m: None)
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    raw: dict = {"schema": SCHEMA, "settings": st, "device": device, "envs": [e.label for e in envs],
                 "first_call": {}, "setup_order": [], "per_call_us": {}, "layers": {}, "profile": None,
                 "counts": {}, "notes": []}
    fcases = _flash_cases(cases)
    raw["setup_order"] = [c.id for c in fcases]
    workers: dict = {}
    twins: dict = {}
    try:
        def start(key: str, python: str, log: Path) -> lockstep.Worker:
            w = lockstep.Worker(key, python, log)
            hello = w.wait_hello(case_timeout)
            if hello.get("type") != "hello":
                raise lockstep.WorkerDied(str(hello.get("error")))
            rep = w.request({"cmd": "config", "device": device, "seed": 0}, case_timeout)
            if rep.get("type") == "fatal":
                raise lockstep.WorkerDied(str(rep.get("error")))
            return w

        for e in envs:
            say(f"explain: starting {e.label}")
            try:
                workers[e.label] = start(e.label, e.python, work / f"explain-{e.label}.log")
            except (lockstep.WorkerFault, proc.Stopped) as ex:
                raw["notes"].append(f"{e.label}: explain worker failed to start: {ex}")
        # a twin per env (a second worker of the same version): the sampler's effect is read against
        # it, and the other version's worker gives the speed-free ratio between the versions
        if len(workers) > 1 and st.get("twins", True):
            for e in envs:
                if e.label not in workers:
                    continue
                say(f"explain: starting a twin of {e.label}")
                try:
                    twins[e.label] = start(f"{e.label}~twin", e.python, work / f"explain-{e.label}-twin.log")
                except (lockstep.WorkerFault, proc.Stopped) as ex:
                    raw["notes"].append(f"{e.label}: its twin worker (the sampler's reference) failed to start: {ex}")
        raw["pinned_cpu"] = None  # the one core every explain worker is pinned to (None: not pinned)
        if cpus and cpus.get("pinned") and cpus.get("set_cpus"):
            raw["pinned_cpu"] = cpus["set_cpus"][0]
            for lab, w in [*workers.items(), *((f"{k}~twin", v) for k, v in twins.items())]:
                try:
                    rep = w.request({"cmd": "pin", "cpu": cpus["set_cpus"][0]}, case_timeout)
                    if rep.get("status") != "ok":
                        raise lockstep.WorkerFault(str(rep.get("error")))
                except lockstep.WorkerFault as ex:
                    raw["notes"].append(f"{lab}: pin failed: {ex}")
                    raw["pinned_cpu"] = None
        ok: dict = {lab: set() for lab in workers}
        for c in fcases:  # first calls: the set-ups, in config order
            for lab, w in list(workers.items()):
                say(f"explain: set-up {c.label} {c.op} in {lab}")
                try:
                    rep = w.request({"cmd": "setup", "case": c.id, "spec": c.to_dict(), "warmup_s": st["warmup_s"]},
                                    case_timeout)
                except lockstep.WorkerFault as ex:
                    raw["notes"].append(f"{lab}: worker lost at set-up of {c.id}: {ex}")
                    workers.pop(lab)
                    continue
                if rep.get("status") == "ok":
                    ok[lab].add(c.id)
                    raw["first_call"].setdefault(c.id, {})[lab] = rep.get("first_call_ms")
                    raw["per_call_us"].setdefault(c.id, {})[lab] = rep.get("per_call_us")
                else:
                    raw["notes"].append(f"{lab}: {c.id} failed at set-up: {rep.get('error')}")
        rng = random.Random(0)
        for c in (c for c in fcases if c.op == "fwd"):  # layer peeling
            labs = [lab for lab in workers if c.id in ok[lab]]
            if not labs:
                continue
            rec = {lab: {"layers": None, "rounds": []} for lab in labs}
            for r in range(int(st["rounds"])):
                say(f"explain: layers of {c.label} fwd, round {r + 1}/{st['rounds']}")
                order = list(labs)
                if not order:
                    break
                rng.shuffle(order)
                for lab in order:
                    w = workers.get(lab)
                    if w is None:
                        continue
                    try:
                        rep = w.request({"cmd": "layers", "case": c.id, "ms": st["burst_ms"], "reverse": r % 2 == 1},
                                        case_timeout)
                    except lockstep.WorkerFault as ex:
                        raw["notes"].append(f"{lab}: worker lost timing the layers of {c.id}: {ex}")
                        workers.pop(lab)
                        continue
                    if rep.get("status") != "ok":  # once per env and case: the next rounds would say the same
                        raw["notes"].append(f"{lab}: layers of {c.id}: {rep.get('error')}")
                        labs = [x for x in labs if x != lab]
                        continue
                    rec[lab]["layers"] = rep["layers"]
                    rec[lab]["rounds"].append({"round": r, **rep["us"]})
            raw["layers"][c.id] = rec
        raw["profile"] = _profile(workers, ok, fcases, raw, st, work, case_timeout, say, twins=twins)
    finally:
        for w in [*workers.values(), *twins.values()]:
            w.close()
    raw["seconds"] = round(time.monotonic() - t0, 2)
    return raw


class _PartnerLost(Exception):
    """The partner worker of the sampler-effect cycles failed (not the profiled env's fault)."""


def _loop_rec(rep: dict) -> dict:
    return {k: rep.get(k) for k in ("us_per_call", "mean_us_per_call", "calls")}


def _start_pyspy(argv: list, log: Path, timeout: float):
    """py-spy in a thread (proc.run_logged blocks): returns (thread, box); the box gets ``res`` (the
    run's proc.Result) or ``exc`` (what run_logged raised, e.g. proc.Stopped) when the thread ends."""
    box: dict = {}

    def go():
        try:
            box["res"] = proc.run_logged(argv, log=log, timeout=timeout)
        except BaseException as ex:  # noqa: BLE001 - re-raised in the driver's thread
            box["exc"] = ex

    th = threading.Thread(target=go, name="explain-py-spy", daemon=True)
    th.start()
    return th, box


def _pyspy_argv(pyspy: str, pid: int, st: dict, secs: float, folded: Path) -> list:
    return [pyspy, "record", "--pid", str(pid), "--rate", str(int(st["rate"])), "--duration",
            str(int(math.ceil(secs))), "--format", "raw", "--function", "--nonblocking", "-o", str(folded)]


def _sampled_lockstep(lab, w, plab, pw, case, st, pyspy, folded, log, case_timeout, say, seed, tw=None):
    """Module doc, 3: the sampler's effect on ``lab``'s worker ``w``, read against the co-pinned
    partner ``pw`` (another env's worker) in cycles of one short ``loop`` each (order random per
    cycle): K cycles without the sampler, cycles while py-spy samples ``w`` (its profile), K cycles
    without it again. Returns (the record stored as the env's ``lockstep``, py-spy's proc.Result or
    None when it did not run). A fault of ``w`` raises lockstep.WorkerFault; of ``pw``,
    :class:`_PartnerLost` (after py-spy's run is over: the profile of ``w`` is still taken, from
    ``w``'s loops alone)."""
    secs, ls, k = float(st["profile_s"]), float(st["sampler_loop_s"]), int(st["sampler_cycles"])
    lead = float(st["sampler_lead_s"])
    rng = random.Random(seed)
    rec: dict = {"partner": plab, "loop_s": ls, "cycles_per_off_phase": k, "lead_s": lead, "cycles": []}
    twin = [tw] if tw is not None else []
    if twin:
        rec["twin"] = f"{lab}~twin"
    t0 = time.monotonic()
    lost: list = []

    def turn(who, ww, c):
        rep = ww.request({"cmd": "loop", "case": case.id, "seconds": ls}, case_timeout + ls)
        c[f"{who}_us"] = rep.get("us_per_call")
        if who == "x":
            c["x_mean_us"] = rep.get("mean_us_per_call")

    def cycle(phase):
        c = {"phase": phase, "t": round(time.monotonic() - t0, 4)}
        if lost:  # the partner is gone: the profiled worker's loops alone (its samples)
            c["order"] = "X"
            turn("x", w, c)
        else:
            order = ["X", "P"] + (["T"] if twin else [])
            rng.shuffle(order)
            c["order"] = "".join(order)
            for who in order:
                if who == "X":
                    turn("x", w, c)
                    continue
                if who == "T":
                    try:
                        turn("t", twin[0], c)
                    except lockstep.WorkerFault as ex:  # the twin is gone: partner-referenced from here
                        rec["twin_error"] = f"the twin worker was lost: {ex}"
                        twin.clear()
                        c["order"] = c["order"].replace("T", "")
                    continue
                try:
                    turn("p", pw, c)
                except lockstep.WorkerFault as ex:
                    lost.append(ex)
                    c["order"] = "X"
                    break
        c["end"] = round(time.monotonic() - t0, 4)
        rec["cycles"].append(c)
        return c

    say(f"explain: {lab} and {plab} take turns, {k} cycles of {ls * 1e3:g} ms loops (no sampler)")
    for _ in range(k):
        if lost:
            break
        cycle("off")
    # the sampled phase runs even without a partner (then the profiled worker's loops alone): the
    # folded profile is the samples of these loops, as before
    say(f"explain: py-spy on {lab} ({secs:g} s at {st['rate']} Hz), {lab} and {plab} taking turns")
    folded.unlink(missing_ok=True)
    th, box = _start_pyspy(_pyspy_argv(pyspy, w.pid, st, secs, folded), log, secs + 60)
    t_on = time.monotonic()
    try:
        while th.is_alive():
            c0 = time.monotonic()
            c = cycle("on")
            # counted only inside the sampling window for sure: after py-spy's attach (lead) and
            # before its --duration can have run out (it starts sampling after t_on)
            if c0 < t_on + lead or time.monotonic() > t_on + secs or not th.is_alive() or c["order"] == "X":
                c["phase"] = "on_edge"
    finally:
        th.join(secs + 90)
    if "exc" in box:
        raise box["exc"]
    res = box.get("res")
    rec["sampler_s"] = round(time.monotonic() - t_on, 3)
    say(f"explain: {lab} and {plab} take turns, {k} cycles (no sampler, after)")
    for _ in range(k):
        if lost:
            break
        cycle("off2")
    if lost:
        rec["error"] = f"the partner worker {plab} was lost: {lost[0]}"
        raise _PartnerLost(str(lost[0]), rec, res)
    return rec, res


def _sampled_bracket(lab, w, case, st, pyspy, folded, log, case_timeout, say, e):
    """The one-env fallback (no partner worker to read the effect against): one loop of ``secs``
    without the sampler, one with it, one without it again (module doc, 3). Fills ``e``'s
    ``loop_off`` / ``loop_on`` / ``loop_off2``; returns py-spy's proc.Result."""
    secs = float(st["profile_s"])
    say(f"explain: steady loop of {case.label} fwd in {lab} (no sampler)")
    e["loop_off"] = _loop_rec(w.request({"cmd": "loop", "case": case.id, "seconds": secs}, case_timeout + secs))
    say(f"explain: py-spy on {lab} ({secs:g} s at {st['rate']} Hz)")
    folded.unlink(missing_ok=True)
    w.send({"cmd": "loop", "case": case.id, "seconds": secs + 1.5})
    time.sleep(0.2)  # the loop is running
    res = proc.run_logged(_pyspy_argv(pyspy, w.pid, st, secs, folded), log=log, timeout=secs + 60)
    e["loop_on"] = _loop_rec(w.reply(case_timeout + secs))
    say(f"explain: steady loop of {case.label} fwd in {lab} (no sampler, after)")
    e["loop_off2"] = _loop_rec(w.request({"cmd": "loop", "case": case.id, "seconds": secs}, case_timeout + secs))
    return res


def _profile(workers, ok, fcases, raw, st, work, case_timeout, say, twins=None) -> dict | None:
    """The sampled steady loop, its sampler effect and the call counts of one case (module doc, 3
    and 4). ``workers`` (label -> lockstep.Worker, in env order) loses a worker that faults;
    ``twins`` (label -> a second worker of that env, or none) are set up with the profiled case and
    take turns as the sampler's reference."""
    twins = dict(twins or {})
    base = raw["envs"][0]
    per = raw["per_call_us"]
    cands = [c for c in fcases if c.op == "fwd" and all(c.id in ok.get(lab, ()) for lab in workers)]
    if not cands or not workers:
        return None
    case = min(cands, key=lambda c: (per.get(c.id) or {}).get(base) or math.inf)
    out: dict = {"case": case.id, "case_label": f"{case.label} fwd", "error": None, "sampler": None, "envs": {}}
    pyspy = find_pyspy()
    if pyspy is None:
        out["error"] = ("py-spy not found (pip install 'matrix-run[explain]' or py-spy): the frame profile was "
                        "skipped")
    else:
        out["sampler"] = {"tool": "py-spy", "path": pyspy, "rate_hz": st["rate"], "seconds": st["profile_s"],
                          "args": "record --format raw --function --nonblocking"}
    for lab, tw in list(twins.items()):
        try:
            rep = tw.request({"cmd": "setup", "case": case.id, "spec": case.to_dict(), "warmup_s": st["warmup_s"]},
                             case_timeout)
            if rep.get("status") != "ok":
                raise lockstep.WorkerFault(str(rep.get("error")))
        except lockstep.WorkerFault as ex:
            raw["notes"].append(f"{lab}: its twin worker could not set up {case.id}: {ex}")
            twins.pop(lab)
    for i, lab in enumerate(list(workers)):
        w = workers.get(lab)
        if w is None:  # lost earlier (as another env's partner)
            continue
        e: dict = {}
        out["envs"][lab] = e
        try:
            if pyspy is not None:
                folded, log = work / f"explain-{lab}.folded", work / f"explain-{lab}.py-spy.log"
                plab = next((x for x in workers if x != lab), None)
                if plab is None:
                    e["no_partner"] = ("no partner worker (one env's worker): the sampler's effect is read from "
                                       "one loop before, one with and one after the sampler")
                    res = _sampled_bracket(lab, w, case, st, pyspy, folded, log, case_timeout, say, e)
                else:
                    try:
                        e["lockstep"], res = _sampled_lockstep(lab, w, plab, workers[plab], case, st, pyspy, folded,
                                                               log, case_timeout, say, seed=1000 + i,
                                                               tw=twins.get(lab))
                    except _PartnerLost as pl:
                        e["lockstep"], res = pl.args[1], pl.args[2]
                        raw["notes"].append(f"{plab}: worker lost as the sampler-effect partner of {lab}: {pl.args[0]}")
                        workers.pop(plab, None)
                    e["lockstep"]["pinned_cpu"] = raw.get("pinned_cpu")
                if res is None or res.returncode != 0 or not folded.exists():
                    if res is not None:
                        tail = " ".join(res.tail.split())[-400:]
                        out["error"] = (f"py-spy failed on {lab} (exit {res.returncode}; ptrace refused? as non-root "
                                        f"see /proc/sys/kernel/yama/ptrace_scope): {tail}")
                else:
                    e["folded"] = folded.read_text()
                    e["pyspy_summary"] = " ".join(res.tail.split())[-300:]
            say(f"explain: call counts of {case.label} fwd in {lab}")
            rep = w.request({"cmd": "counts", "case": case.id, "calls": int(st["count_calls"])}, case_timeout)
            if rep.get("status") == "ok":
                e["counts"] = rep["counts"]
            else:
                raw["notes"].append(f"{lab}: call counts failed: {rep.get('error')}")
        except lockstep.WorkerFault as ex:
            raw["notes"].append(f"{lab}: worker lost in the profile pass: {ex}")
            workers.pop(lab, None)
    return out


# -- analysis (pure: raw record -> what the report shows) -----------------------------------------
def _median(x):
    x = sorted(v for v in x if v is not None and math.isfinite(v))
    if not x:
        return None
    n = len(x)
    return x[n // 2] if n % 2 else (x[n // 2 - 1] + x[n // 2]) / 2


def segments(round_us: dict) -> dict:
    """One round's layer times ``{kind: µs}`` -> segment costs ``{kind: µs}``: a layer's time minus the
    next inner layer's that was timed (the extension: its own time). They sum to the public layer's
    time. A kind missing from ``round_us`` has no segment (its cost is in the next outer segment)."""
    present = [k for k in KINDS if round_us.get(k) is not None]
    out = {}
    for i, k in enumerate(present):
        nxt = present[i + 1] if i + 1 < len(present) else None
        out[k] = round_us[k] - (round_us[nxt] if nxt else 0.0)
    return out


def _ci(d: list) -> dict | None:
    d = [x for x in d if x is not None and math.isfinite(x)]
    if len(d) < 2:
        return {"delta_us": d[0], "lo": None, "hi": None, "n": len(d)} if d else None
    est, lo, hi, _ = stats._trimmed_ci(d, exp=False)
    return {"delta_us": est, "lo": lo, "hi": hi, "n": len(d)}


def layer_view(rec: dict, base: str, labels: list) -> dict:
    """Per env: each layer's median host µs per call and its segment's; per candidate: each segment's
    paired delta (µs per call) with its interval (module doc, 2) and the total (public layer)."""
    envs = {}
    for lab in labels:
        r = rec.get(lab)
        if not r or not r.get("rounds"):
            continue
        desc = r.get("layers") or []
        rows = []
        for d in desc:
            k = d["kind"]
            us = _median([x.get(k) for x in r["rounds"]]) if d["exists"] else None
            seg = _median([segments(x).get(k) for x in r["rounds"]]) if d["exists"] else None
            rows.append({**d, "us": us, "segment_us": seg, "segment": SEGMENTS.get(k, k)})
        envs[lab] = {"layers": rows, "rounds": len(r["rounds"])}
    comps = []
    b = rec.get(base) or {}
    bro = {x["round"]: x for x in b.get("rounds") or []}
    for lab in labels:
        if lab == base or lab not in envs or base not in envs:
            continue
        cro = {x["round"]: x for x in rec[lab]["rounds"]}
        common = sorted(set(bro) & set(cro))
        total = _ci([cro[i]["public"] - bro[i]["public"] for i in common
                     if cro[i].get("public") is not None and bro[i].get("public") is not None])
        segs = []
        for k in KINDS:
            d = [segments(cro[i]).get(k, 0.0) - segments(bro[i]).get(k, 0.0) for i in common]
            in_b = any(x["kind"] == k and x["exists"] for x in envs[base]["layers"])
            in_c = any(x["kind"] == k and x["exists"] for x in envs[lab]["layers"])
            if not (in_b or in_c):
                continue
            segs.append({"kind": k, "segment": SEGMENTS[k], "in_base": in_b, "in_cand": in_c, **(_ci(d) or {})})
        comps.append({"candidate": lab, "total": total, "segments": segs, "sentence": _sentence(total, segs)})
    names: dict = {}
    for e in envs.values():
        for x in e["layers"]:
            if x["exists"] and x["name"] not in names.setdefault(x["kind"], []):
                names[x["kind"]].append(x["name"])
    return {"envs": envs, "comparisons": comps, "names": names}


def _fmt_ci(x: dict | None) -> str:
    if not x or x.get("delta_us") is None:
        return "–"
    s = f"{x['delta_us']:+.1f} µs"
    if x.get("lo") is not None:
        s += f" [{x['lo']:+.1f}, {x['hi']:+.1f}]"
    return s


def _sentence(total, segs) -> str:
    if not total:
        return ""
    parts = sorted(segs, key=lambda s: -abs(s.get("delta_us") or 0.0))
    body = ", ".join(f"{_fmt_ci(s)} {s['segment']}" + ("" if s["in_base"] and s["in_cand"] else
                                                       " (new layer)" if s["in_cand"] else " (layer gone)")
                     for s in parts)
    return f"of the {_fmt_ci(total)} per call (host, flash_attn_func): {body}"


def _frame_key(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (pkg/file.py)``: the line dropped and the path cut
    after site-packages/ (else its last two parts), so the same function matches across envs."""
    if frame.endswith(")") and " (" in frame:
        func, loc = frame[:-1].rsplit(" (", 1)
        path = loc.rsplit(":", 1)[0].replace("\\", "/")
        path = path.rsplit("site-packages/", 1)[1] if "site-packages/" in path else "/".join(path.split("/")[-2:])
        return f"{func} ({path})"
    return frame


def parse_folded(text: str) -> dict:
    """py-spy raw (folded) output -> ``{n, self: {frame: samples}, total: {frame: samples}}`` over the
    samples whose stack passes through :data:`LOOP_FRAME` (frames above it dropped; a frame counts once
    per sample in ``total``). Lines: ``frame;frame;...;frame COUNT``, outermost first."""
    n, self_, total = 0, {}, {}
    for line in text.splitlines():
        line = line.strip()
        if not line or " " not in line:
            continue
        stack, _, cnt = line.rpartition(" ")
        try:
            k = int(cnt)
        except ValueError:
            continue
        frames = stack.split(";")
        idx = next((i for i, f in enumerate(frames) if f.startswith(LOOP_FRAME + " ")), None)
        if idx is None:
            continue
        keys = [_frame_key(f) for f in frames[idx:]]
        n += k
        self_[keys[-1]] = self_.get(keys[-1], 0) + k
        for key in dict.fromkeys(keys):  # once per sample; in stack order (a set's order varies per process)
            total[key] = total.get(key, 0) + k
    return {"n": n, "self": self_, "total": total}


def frame_diff(base: dict, cand: dict, base_us: float, cand_us: float, top: int = 25) -> list:
    """Differential view of two :func:`parse_folded` results, each scaled by its loop's µs per call:
    per frame ``{frame, base_self_us, cand_self_us, delta_self_us, base_total_us, cand_total_us,
    delta_total_us, base_share, cand_share, se_us, status}``; status appears / vanishes / grows /
    shrinks / same (|delta| under 2 binomial standard errors of the two shares). A delta of 0 is
    always ``same``: with no self samples in either version (a frame seen only further out on the
    stack) the standard error is 0 too, and "under 0" would have called it shrinks. A nonzero delta
    with a standard error of 0 (shares of exactly 0 or 1 in both: the binomial error vanishes there)
    grows or shrinks by its sign. Sorted by delta_self_us, largest growth first; the ``top`` largest
    |delta| rows are kept. Ties (e.g. the many frames at delta 0) go by frame name, in both the cut
    and the order, so the same record renders the same table in every process (a set's iteration
    order, which the rows were built in, changes with the interpreter's hash seed)."""
    rows = []
    nb, nc = max(base["n"], 1), max(cand["n"], 1)
    for f in sorted(set(base["total"]) | set(cand["total"])):
        bs, cs = base["self"].get(f, 0), cand["self"].get(f, 0)
        bt, ct = base["total"].get(f, 0), cand["total"].get(f, 0)
        pb, pc = bs / nb, cs / nc
        se = math.sqrt(pb * (1 - pb) / nb * base_us ** 2 + pc * (1 - pc) / nc * cand_us ** 2)
        d = pc * cand_us - pb * base_us
        if bt == 0:
            status = "appears"
        elif ct == 0:
            status = "vanishes"
        elif d == 0 or abs(d) < 2 * se:
            status = "same"
        else:
            status = "grows" if d > 0 else "shrinks"
        rows.append({"frame": f, "base_self_us": pb * base_us, "cand_self_us": pc * cand_us, "delta_self_us": d,
                     "base_total_us": bt / nb * base_us, "cand_total_us": ct / nc * cand_us,
                     "delta_total_us": ct / nc * cand_us - bt / nb * base_us,
                     "base_share": pb, "cand_share": pc, "se_us": se, "status": status})
    rows.sort(key=lambda r: (-abs(r["delta_self_us"]), r["frame"]))
    rows = rows[:top]
    rows.sort(key=lambda r: (-r["delta_self_us"], r["frame"]))
    return rows


def counts_diff(base: dict, cand: dict, top: int = 25) -> dict:
    """cProfile counts per call of two envs -> ``{base_total, cand_total, rows: [{func, base, cand,
    delta}]}``, rows where the count differs, largest |delta| first."""
    b, c = base.get("per_call") or {}, cand.get("per_call") or {}
    rows = [{"func": f, "base": b.get(f, 0.0), "cand": c.get(f, 0.0), "delta": c.get(f, 0.0) - b.get(f, 0.0)}
            for f in set(b) | set(c)]
    rows = [r for r in rows if abs(r["delta"]) >= 0.5]
    rows.sort(key=lambda r: (-abs(r["delta"]), r["func"]))
    return {"base_total": base.get("total"), "cand_total": cand.get("total"), "rows": rows[:top],
            "n_differ": len(rows)}


#: The sampler effect's tolerance (module doc, 3): the figure targets an effect within ±2 %.
SAMPLER_TOL = 0.02


#: Share trimmed from each end of a phase's per-cycle log ratios before their means are compared
#: (Yuen's trimmed t; the main comparison trims a set's cycles alike: stats.CYCLE_TRIM).
SAMPLER_TRIM = stats.CYCLE_TRIM


def _yuen(a: list, b: list, level: float = stats.CI_LEVEL) -> tuple:
    """trimmed mean(a) - trimmed mean(b) of two independent groups of log ratios (20 % trimmed from
    each end, :data:`SAMPLER_TRIM`) and its Yuen-Welch t interval (Yuen 1974: winsorized variances,
    Welch-Satterthwaite df; ``scipy.stats.ttest_ind(trim=...)``), returned as ratios - 1:
    (estimate, low, high); low/high None when a group keeps fewer than 2 values after trimming.
    Why trimmed: a cycle's log ratio is heavy-tailed (a preemption or a slow loop of either worker:
    H200 per-cycle SD 0.02-0.25, single cycles off by 0.5 and more), and a plain mean's interval
    widens with the tail -- on the committed H200 explain runs Welch's interval of 2.6.3's effect
    was +-2.1-3.5 % where this one is +-0.5-0.9 % (benchmarks/results/h200-sampler-trimmed.txt)."""
    d = float(sps.trim_mean(a, SAMPLER_TRIM)) - float(sps.trim_mean(b, SAMPLER_TRIM))
    kept = [n - 2 * math.floor(SAMPLER_TRIM * n) for n in (len(a), len(b))]
    if min(kept) < 2:
        return math.expm1(d), None, None
    if max(a) == min(a) and max(b) == min(b):
        return math.expm1(d), math.expm1(d), math.expm1(d)
    ci = sps.ttest_ind(a, b, equal_var=False, trim=SAMPLER_TRIM).confidence_interval(level)
    return math.expm1(d), math.expm1(float(ci.low)), math.expm1(float(ci.high))


def sampler_effect(ls: dict) -> dict:
    """The lockstep record of one env (``profile.envs.*.lockstep``, module doc 3) -> the sampler's
    effect on its wall time: ``effect`` = exp(tmean on-phase log(X/T) - tmean off-phase log(X/T)) - 1
    (tmean: 20 % trimmed mean; T the twin, P the partner in records without one) with its Yuen 95 %
    interval (:func:`_yuen`; ``effect_plain_mean``: the plain means' difference, where a sampler
    that slowed a few loops a lot would show) ``effect_lo`` / ``effect_hi`` (off = the cycles before and after),
    ``verdict`` against :data:`SAMPLER_TOL` (``within`` / ``over`` / ``undecided``), ``ratio_drift``
    (off2 against off, the same way: whether X/P held still without the sampler; ``drifted``: its
    interval off 0), X's and P's plain µs per call (medians of their loops) without / with the
    sampler, cycle counts, ``contention`` (median mean/median of X's sampled loops)."""
    every = ls.get("cycles") or []
    # the reference: the twin (a second worker of the same version: their ratio does not move with
    # the CPU's speed) where the record has one, else the partner (records before the twins)
    ref = "t" if any((c.get("t_us") or 0) > 0 for c in every) else "p"
    cyc = [c for c in every if (c.get("x_us") or 0) > 0 and (c.get(f"{ref}_us") or 0) > 0]
    by = {ph: [c for c in cyc if c.get("phase") == ph] for ph in ("off", "on", "off2")}
    lr = {ph: [math.log(c["x_us"] / c[f"{ref}_us"]) for c in v] for ph, v in by.items()}
    off = lr["off"] + lr["off2"]
    # the frames are scaled by the sampled loops' µs per call: the "on" cycles (else any X loop the
    # sampler ran over, the partner lost)
    on_x = [c["x_us"] for c in by["on"]] or [c.get("x_us") for c in ls.get("cycles") or []
                                             if c.get("phase") in ("on", "on_edge")]
    # the versions' ratio at one moment (speed_matched): the unsampled twin over the partner in every
    # cycle with both; without a twin, the sampled worker over the partner (on-phase medians)
    tp = [math.log(c["t_us"] / c["p_us"]) for c in every if (c.get("t_us") or 0) > 0 and (c.get("p_us") or 0) > 0
          and c.get("phase") in ("off", "on", "off2")]
    on_xp = [c for c in every if c.get("phase") == "on" and (c.get("x_us") or 0) > 0 and (c.get("p_us") or 0) > 0]
    cross = (math.exp(sum(tp) / len(tp)) if tp else
             _median([c["x_us"] for c in on_xp]) / _median([c["p_us"] for c in on_xp]) if on_xp else None)
    out = {"method": "lockstep", "partner": ls.get("partner"), "pinned_cpu": ls.get("pinned_cpu"),
           "reference": "twin" if ref == "t" else "partner", "twin": ls.get("twin"),
           "cross_ratio": cross, "n_cross": len(tp) or len(on_xp),
           "loop_s": ls.get("loop_s"), "n_off": len(lr["off"]), "n_off2": len(lr["off2"]), "n_on": len(lr["on"]),
           "off_us": _median([c["x_us"] for c in by["off"] + by["off2"]]), "on_us": _median(on_x),
           "partner_off_us": _median([c["p_us"] for c in by["off"] + by["off2"]]),
           "partner_on_us": _median([c["p_us"] for c in by["on"]]),
           "effect": None, "effect_lo": None, "effect_hi": None, "effect_plain_mean": None, "verdict": None, "ratio_drift": None,
           "ratio_drift_lo": None, "ratio_drift_hi": None, "drifted": False,
           "error": ls.get("error") or ls.get("twin_error")}
    if lr["on"] and off:
        out["effect"], out["effect_lo"], out["effect_hi"] = _yuen(lr["on"], off)
        # the plain means' difference beside it: a sampler that slowed a few loops a lot would show here
        out["effect_plain_mean"] = math.expm1(sum(lr["on"]) / len(lr["on"]) - sum(off) / len(off))
        lo, hi = out["effect_lo"], out["effect_hi"]
        if lo is not None:
            out["verdict"] = ("within" if -SAMPLER_TOL <= lo and hi <= SAMPLER_TOL else
                              "over" if lo > SAMPLER_TOL or hi < -SAMPLER_TOL else "undecided")
    if lr["off"] and lr["off2"]:
        out["ratio_drift"], out["ratio_drift_lo"], out["ratio_drift_hi"] = _yuen(lr["off2"], lr["off"])
        lo, hi = out["ratio_drift_lo"], out["ratio_drift_hi"]
        out["drifted"] = lo is not None and (lo > 0 or hi < 0)  # its interval off 0 (DRIFT_NOTE)
    cont = [c["x_mean_us"] / c["x_us"] for c in by["on"] if c.get("x_mean_us")]
    out["contention"] = _median(cont)
    return out


#: The timed call's frame in the sampled loops (worker.Bench.call): its samples are the call's own time.
CALL_FRAME = "Bench.call ("


def _call_share(parsed: dict) -> float | None:
    """Share of the sampled loop's samples inside the timed call (:data:`CALL_FRAME` on the stack)."""
    n = parsed.get("n") or 0
    k = sum(v for f, v in (parsed.get("total") or {}).items() if f.startswith(CALL_FRAME))
    return k / n if n and k else None


def speed_matched(be: dict, ce: dict, base: str, main_base_us: float | None) -> tuple | None:
    """(baseline, candidate) µs per call of the sampled loops at the timing phase's CPU speed, or None.

    Why: each env is profiled in its own window, seconds apart, and the CPU's speed differs between
    the windows and from the timing phase's (H200, seed config, B2 S300 fwd: 2.6.3 looped at 56.2
    µs while profiled, its co-pinned partner 2.7.0.post2 at 124.7; 2.7.0.post2 at 133.9 with the 2.6.3
    partner at 62.5; the timing phase's wall medians 64.9 and 140.5 µs): the raw difference of the
    two windows' µs (77.7) mixes the versions' difference with the windows' speeds. Inside a window
    the profiled worker and its partner take turns on one core, so their ratio is free of the speed
    (lockstep module doc). So the baseline is put at the timing phase's wall median ``main_base_us``
    and the candidate at that times its window's ratio to its baseline partner
    (:func:`sampler_effect`'s ``cross_ratio``: its unsampled twin over the partner in every cycle;
    records without twins: the sampled worker over the partner, on-phase medians). Needs the
    lockstep records of both, the candidate's partner being the baseline; else None (the raw µs are
    used)."""
    if not main_base_us or be.get("method") != "lockstep" or ce.get("method") != "lockstep":
        return None
    if ce.get("partner") != base or not ce.get("cross_ratio"):
        return None
    return main_base_us, main_base_us * ce["cross_ratio"]


def analyze(doc: dict) -> dict | None:
    """Everything the report and the terminal show, from results.json's ``explain`` record (and, for
    the profiled case, the main comparison's host and wall deltas from ``doc['comparisons']``)."""
    raw = doc.get("explain")
    if not raw:
        return None
    labels = raw.get("envs") or []
    base = labels[0] if labels else None
    case_label = {c["id"]: f"{c.get('label') or c['id']} {c.get('op', '')}".strip() for c in doc.get("cases") or []}
    layers = [{"case": cid, "label": case_label.get(cid, cid), **layer_view(rec, base, labels)}
              for cid, rec in (raw.get("layers") or {}).items()]
    first = []
    order = raw.get("setup_order") or []
    op_of = {c["id"]: c.get("op") for c in doc.get("cases") or []}
    seen_ops: set = set()
    for i, cid in enumerate(order):
        # the first case of each op (fwd, bwd) in the process pays that op's one-time lazy set-up (the
        # first backward: autograd's; second new-user trial: 297 ms on the first bwd, unmarked, beside
        # a fwd marked "process first" at 0.9 ms)
        op_first = op_of.get(cid) not in seen_ops
        seen_ops.add(op_of.get(cid))
        if cid in (raw.get("first_call") or {}):
            first.append({"case": cid, "label": case_label.get(cid, cid), "process_first": i == 0,
                          "op_first": op_first, "op": op_of.get(cid), "ms": raw["first_call"][cid]})
    prof = raw.get("profile")
    pv = None
    if prof:
        pv = {"case": prof["case"], "label": prof.get("case_label") or prof["case"], "error": prof.get("error"),
              "sampler": prof.get("sampler"), "envs": {}, "diffs": []}
        parsed = {}
        for lab in labels:
            e = (prof.get("envs") or {}).get(lab)
            if not e:
                continue
            if e.get("lockstep") is not None:  # against a co-pinned partner worker (module doc, 3)
                ev = sampler_effect(e["lockstep"])
                ev["text"] = lockstep_effect_text(lab, ev)
                on = ev["on_us"]
            else:  # one env (``no_partner``), or a record written before the lockstep cycles
                off = (e.get("loop_off") or {}).get("us_per_call")
                on = (e.get("loop_on") or {}).get("us_per_call")
                mean_on = (e.get("loop_on") or {}).get("mean_us_per_call")
                # mean / median of the sampled loop: ~1 on a quiet core; well above 1 the process was
                # preempted much of the time and the frames' µs are less sure (2-core CI under load: 3x)
                off2 = (e.get("loop_off2") or {}).get("us_per_call")
                drift = (off2 / off - 1) if off and off2 else None
                ref = math.sqrt(off * off2) if off and off2 else off  # the loops without the sampler, before and after
                ev = {"method": "bracket", "no_partner": e.get("no_partner"),
                      "off_us": ref, "on_us": on, "effect": (on / ref - 1) if on and ref else None,
                      "off_before_us": off, "off_after_us": off2, "drift": drift,
                      # the effect is read against loops that agree within 2 % (the figure's tolerance)
                      "effect_measurable": drift is None or abs(drift) <= SAMPLER_TOL,
                      "contention": (mean_on / on) if mean_on and on else None}
            ev.update(samples=None, folded_lines=0)
            if e.get("folded"):
                parsed[lab] = parse_folded(e["folded"])
                ev["samples"] = parsed[lab]["n"]
                ev["folded_lines"] = len(e["folded"].splitlines())
                ev["top_self"] = sorted(({"frame": f, "us": s / max(parsed[lab]["n"], 1) * (on or 0),
                                          "share": s / max(parsed[lab]["n"], 1)}
                                         for f, s in parsed[lab]["self"].items()),
                                        key=lambda r: (-r["us"], r["frame"]))[:12]
            ev["calls_total"] = (e.get("counts") or {}).get("total")
            ev["sampler_errors"] = sampler_errors(e.get("pyspy_summary"))
            pv["envs"][lab] = ev
        for lab in labels[1:]:
            if lab not in pv["envs"] or base not in pv["envs"]:
                continue
            d: dict = {"candidate": lab}
            main_base_wall = None
            for comp in doc.get("comparisons") or []:
                if comp.get("case") == prof["case"] and comp.get("candidate") == lab and comp.get("baseline", base) == base:
                    d[f"main_{comp['metric']}"] = comp.get("delta_us")
                    if comp["metric"] == "wall_us":
                        main_base_wall = comp.get("base_median")
            if lab in parsed and base in parsed:
                bu, cu = pv["envs"][base]["on_us"], pv["envs"][lab]["on_us"]
                d["sampled_delta_us"] = cu - bu
                # each frame in µs per call of the sampled loops, as sampled (the planted CPU test's
                # 20 µs read 26.9 µs once scaled to the timing phase's level: its bursts and the
                # explain loops do not cost the same per call there, not only the CPU's speed)
                d["frames"] = frame_diff(parsed[base], parsed[lab], bu, cu)
                grown = [r for r in d["frames"] if r["delta_self_us"] > 0]
                d["top_grown"] = grown[0] if grown else None
                scale = speed_matched(pv["envs"][base], pv["envs"][lab], base, main_base_wall)
                if scale:  # the totals compared with the timing phase, at its speed (speed_matched's doc)
                    bu, cu = scale
                    d["speed_matched"] = True
                    d["matched_delta_us"] = cu - bu
                # the frames of the timed call itself (samples under Bench.call): the loop's own code
                # and the synchronize after each call are left out, as the host clock leaves them out
                sb, sc = _call_share(parsed[base]), _call_share(parsed[lab])
                if sb is not None and sc is not None:
                    d["call_delta_us"] = cu * sc - bu * sb
            be, ce = (prof["envs"].get(base) or {}).get("counts"), (prof["envs"].get(lab) or {}).get("counts")
            if be and ce:
                d["counts"] = counts_diff(be, ce)
            # the profile explains what the clocks saw: the sum of every frame's self delta (the
            # sampled loops time synchronized calls: the wall clock) over the timing phase's wall
            # delta of the same case, at the timing phase's CPU speed where the lockstep turns give
            # it; the host delta beside it
            total = d.get("matched_delta_us", d.get("sampled_delta_us"))
            if total is not None and d.get("main_wall_us"):
                d["explained_wall_fraction"] = total / d["main_wall_us"]
            if d.get("call_delta_us") is not None and d.get("main_host_us"):
                d["explained_host_fraction"] = d["call_delta_us"] / d["main_host_us"]
            d["explained_fraction"] = d.get("explained_host_fraction", d.get("explained_wall_fraction"))
            pv["diffs"].append(d)
    return {"base": base, "labels": labels, "layers": layers, "first_call": first, "profile": pv,
            "notes": raw.get("notes") or [], "seconds": raw.get("seconds"), "settings": raw.get("settings")}


def sampler_errors(summary: str | None) -> int | None:
    """The samples py-spy could not read, from the end of its output (``Samples: N Errors: E``), or None.
    They are not in the folded stacks, so frame shares are of the samples it did read: where the errors
    fall on one frame more than others (a new-user trial: 231 of 1,343 in one version, a frame read 24
    times where ~230 were expected), its share is low; the report gives the count beside the samples."""
    import re

    m = re.search(r"Errors:\s*(\d+)", summary or "")
    return int(m.group(1)) if m else None


def summary_lines(view: dict | None) -> list[str]:
    """A short terminal summary of :func:`analyze`'s view (µs per call, host clock for the layers).

    A version's missing layers ("has no custom_op (...)") are said once per version and distinct
    text, after the cases' sentences: the layers a version has are the same in most of its cases,
    and one paragraph per case and version repeated the same words. Cases are named only where the
    text holds for some of the layer cases, not all."""
    if not view:
        return []
    out = ["explain (host µs per call; own worker processes after the timing, not in any verdict):"]
    gone_in: dict = {}  # (version, text) -> the cases it holds in, in first-seen order
    for lv in view["layers"]:
        for c in lv["comparisons"]:
            if c["sentence"]:
                out.append(f"  {lv['label']}: {c['candidate']} vs {view['base']}: {c['sentence']}")
        for lab, e in lv["envs"].items():
            gone = [f"{x['kind']} ({x['note']})" for x in e["layers"] if not x["exists"]]
            if gone:
                gone_in.setdefault((lab, "; no ".join(gone)), []).append(lv["label"])
    for (lab, text), where in gone_in.items():
        every = len(where) == len(view["layers"])
        out.append(f"  {lab} has no {text}" + ("" if every else f" (in {', '.join(where)})"))
    for f in view["first_call"]:
        out.append(f"  first call {f['label']}: " + ", ".join(
            f"{lab} {ms:.1f} ms" for lab, ms in f["ms"].items() if ms is not None)
            + (" (first case of the process: includes its lazy imports)" if f["process_first"] else
               f" (first {f['op']} of the process: includes its one-time lazy set-up)" if f.get("op_first") and f.get("op")
               else ""))
    p = view["profile"]
    if p:
        if p.get("error"):
            out.append(f"  frame profile: {p['error']}")
        for d in p["diffs"]:
            t = d.get("top_grown")
            if t:
                out.append(f"  {p['label']}: {d['candidate']} vs {view['base']}: top grown frame {t['frame']} "
                           f"{t['delta_self_us']:+.1f} µs per call (self, sampled; {t['status']})")
                more = [r for r in d["frames"] if r["delta_self_us"] > 0][1:4]
                if more:
                    out.append("    next: " + "; ".join(f"{r['frame']} {r['delta_self_us']:+.1f} µs ({r['status']})"
                                                     for r in more))
            if d.get("sampled_delta_us") is not None:
                if d.get("speed_matched"):
                    s = (f"  frames add up to {d['matched_delta_us']:+.1f} µs per call (sampled loops of synchronized "
                         f"calls, at the timing phase's CPU speed; {d['sampled_delta_us']:+.1f} µs as sampled)")
                else:
                    s = f"  frames add up to {d['sampled_delta_us']:+.1f} µs per call (sampled loop, wall)"
                if d.get("main_wall_us") is not None:
                    s += f"; the timing phase's wall delta {d['main_wall_us']:+.1f} µs"
                    if d.get("explained_wall_fraction") is not None:
                        s += f" ({d['explained_wall_fraction'] * 100:.0f} % explained)"
                out.append(s)
                if d.get("call_delta_us") is not None:
                    s = (f"  the timed call's own frames (without the loop and its synchronize) add up to "
                         f"{d['call_delta_us']:+.1f} µs per call")
                    if d.get("main_host_us") is not None:
                        s += f"; the timing phase's host delta {d['main_host_us']:+.1f} µs"
                        if d.get("explained_host_fraction") is not None:
                            s += f" ({d['explained_host_fraction'] * 100:.0f} % explained)"
                    out.append(s)
            c = d.get("counts")
            if c:
                out.append(f"  calls per call (cProfile): {view['base']} {c['base_total']:.0f}, {d['candidate']} "
                           f"{c['cand_total']:.0f}")
        for lab, e in p["envs"].items():
            if e.get("method") == "lockstep":
                out.extend(_lockstep_lines(lab, e))
            elif e.get("effect") is not None:
                drift = e.get("drift")
                out.append(f"  sampler effect on wall time, {lab}: {e['effect'] * 100:+.1f} % "
                           f"({e['off_us']:.1f} -> {e['on_us']:.1f} µs per call, medians of ~1 ms samples)"
                           + (f"; without the sampler before / after {e['off_before_us']:.1f} / "
                              f"{e['off_after_us']:.1f} µs ({drift * 100:+.1f} % drift"
                              + ("" if e.get("effect_measurable") else ": the CPU's speed moved more than 2 %, "
                                 "the effect is not measurable here") + ")" if drift is not None else
                              "; one loop without the sampler, before it only: the CPU's drift is not excluded")
                           + (f"; preempted: mean/median {e['contention']:.1f}x" if (e.get("contention") or 0) > 1.2
                              else "")
                           + (" (no partner worker: one env)" if e.get("no_partner") else ""))
    for n in view["notes"]:
        out.append(f"  note: {n}")
    return out


def _pct(x) -> str:
    return f"{x * 100:+.1f}"


#: What a lockstep sampler effect's ``verdict`` reads as (tolerance :data:`SAMPLER_TOL`).
VERDICT_TEXT = {"within": "within ±{tol:g} %", "over": "over {tol:g} %",
                "undecided": "the interval reaches past ±{tol:g} %: not decided"}


def lockstep_effect_text(lab: str, e: dict) -> str:
    """One env's lockstep sampler effect (:func:`sampler_effect`) as one sentence (terminal and
    report): ``2.6.3: +0.4 % [-1.1, +1.9] (against a co-pinned unsampled 2.7.0.post2 worker, 40+40
    cycles without the sampler, 61 with it; within ±2 %)``."""
    if e.get("effect") is None:
        why = e.get("error") or "no cycles with and without the sampler"
        return f"{lab}: not measured ({why})"
    s = f"{lab}: {_pct(e['effect'])} %"
    if e.get("effect_lo") is not None:
        lo, hi = e["effect_lo"], e["effect_hi"]
        # a bound that rounds onto ±2.0 % shows three decimals, so "reaches past" can be seen
        fine = any(round(abs(b) * 100, 1) == round(SAMPLER_TOL * 100, 1) for b in (lo, hi))
        pct = (lambda x: f"{x * 100:+.3f}") if fine else _pct
        s += f" [{pct(lo)}, {pct(hi)}]"
    how = "a co-pinned" if e.get("pinned_cpu") is not None else "an unpinned (drift not cancelled)"
    who = f"twin (a second {lab} worker)" if e.get("reference") == "twin" else f"{e['partner']} worker"
    s += (f" (against {how} unsampled {who}, {e['n_off']}+{e['n_off2']} cycles without the "
          f"sampler, {e['n_on']} with it")
    if e.get("verdict"):
        s += "; " + VERDICT_TEXT[e["verdict"]].format(tol=SAMPLER_TOL * 100)
    return s + ")"


#: Said where the sampled worker's ratio to its reference moved between the unsampled cycles before
#: and after the sampler (an interval off 0): the effect is read against both (module doc, 3).
DRIFT_NOTE = (" (it drifted; the sampled cycles sit between the unsampled ones before and after, so a"
              " steady drift cancels in the effect, a step would not)")


def _lockstep_lines(lab: str, e: dict) -> list[str]:
    out = [f"  sampler effect on wall time, {lockstep_effect_text(lab, e)}"]
    if e.get("error") and e.get("effect") is not None:
        out.append(f"    note: {e['error']}")
    if e.get("off_us") and e.get("on_us"):
        s = (f"    {lab} without / with the sampler: {e['off_us']:.1f} / {e['on_us']:.1f} µs per call (medians of its "
             f"{(e.get('loop_s') or 0) * 1e3:g} ms loops)")
        if e.get("ratio_drift") is not None:
            ref = "twin" if e.get("reference") == "twin" else e["partner"]
            s += f"; {lab}/{ref} after vs before the sampler {_pct(e['ratio_drift'])} %"
            if e.get("ratio_drift_lo") is not None:
                s += f" [{_pct(e['ratio_drift_lo'])}, {_pct(e['ratio_drift_hi'])}]"
                if e.get("drifted"):
                    s += DRIFT_NOTE
        if (e.get("contention") or 0) > 1.2:
            s += f"; preempted: mean/median {e['contention']:.1f}x"
        out.append(s)
    return out
