"""The lockstep measurement's own pieces: the worker's imports, CPU planning, thread pinning, the
worker's burst loops, and the pre-import of a set's lazy imports (with real workers over stand-ins)."""
import ast
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from types import SimpleNamespace

import pytest
import standin

from matrix_runner import lockstep, machine, worker

WORKER_SRC = lockstep.WORKER


def test_worker_imports_only_stdlib_torch_and_the_subject():
    # the worker runs inside each env by path: it may import nothing of matrix_runner or its deps
    tree = ast.parse(WORKER_SRC.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import in worker.py line {node.lineno}"
            roots.add(node.module.split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"torch", "flash_attn", "flash_attn_2_cuda", "__future__"}
    assert roots - allowed == set(), roots - allowed
    assert {"torch", "flash_attn"} <= roots  # and it does use them


def test_plan_cpus_keeps_the_driver_off_the_set_cores(monkeypatch):
    monkeypatch.setattr(machine, "allowed_cpus", lambda: list(range(8)))
    monkeypatch.setattr(machine, "siblings", lambda c: {c, c ^ 1})  # SMT pairs (0,1), (2,3), ...
    monkeypatch.setattr(lockstep, "set_affinity", lambda pid, cpus: True)
    noise = {2: 0.5, 3: 0.1, 4: 0.2, 5: 0.9, 6: 0.05, 7: 0.3}
    monkeypatch.setattr(lockstep, "_noise", lambda c, seconds=0.03: noise[c])
    p = lockstep.plan_cpus("auto", n_sets=2)
    assert p["pinned"] and p["driver_cpu"] == 0
    assert p["set_cpus"] == [6, 3]  # the quietest, never the driver's SMT sibling 1
    assert p["spare_cpus"] == [0, 1, 4, 5]  # the next set starts off the sets' physical cores
    assert lockstep.plan_cpus("unpinned")["pinned"] is False
    q = lockstep.plan_cpus("0,2")
    assert q["set_cpus"] == [0, 2] and q["driver_cpu"] == 1 and "shared" not in q
    # every allowed CPU listed: the driver shares one with the sets, and the plan says so (new-user trial)
    monkeypatch.setattr(machine, "allowed_cpus", lambda: [0, 1])
    q = lockstep.plan_cpus("0,1")
    assert q["driver_cpu"] == 0 and q["shared"].startswith("the driver shares CPU 0 with the process sets")
    monkeypatch.setattr(machine, "allowed_cpus", lambda: list(range(8)))
    with pytest.raises(ValueError, match="CPU\\(s\\) \\[42\\] not allowed"):
        lockstep.plan_cpus("42")
    with pytest.raises(ValueError, match="give auto, unpinned or a comma list"):
        lockstep.parse_cpus("some")
    with pytest.raises(ValueError, match=r"CPU\(s\) \[2\] listed more than once"):  # new-user trial: "pinned to CPU(s) 2, 2"
        lockstep.plan_cpus("2,2")


def test_one_cpu_runs_unpinned_and_says_why(monkeypatch):
    monkeypatch.setattr(machine, "allowed_cpus", lambda: [0])
    p = lockstep.plan_cpus("auto")
    assert not p["pinned"] and "only 1 CPU" in p["why"]
    monkeypatch.setattr(machine, "allowed_cpus", lambda: [0, 1, 2])
    monkeypatch.setattr(lockstep, "_noise", lambda c, seconds=0.03: float("inf"))  # affinity refused
    monkeypatch.setattr(lockstep, "set_affinity", lambda pid, cpus: False)
    p = lockstep.plan_cpus("auto")
    assert not p["pinned"] and "may not change CPU affinity" in p["why"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux CPU affinity and two CPUs")
def test_pin_threads_pins_every_thread_of_the_process():
    import threading

    before = os.sched_getaffinity(0)
    ev = threading.Event()
    t = threading.Thread(target=ev.wait, daemon=True)  # a thread started before pinning, like autograd's
    t.start()
    try:
        cpu = sorted(before)[-1]
        n = worker._pin_threads({cpu})
        assert n >= 2
        for tid in os.listdir("/proc/self/task"):
            assert os.sched_getaffinity(int(tid)) == {cpu}
    finally:
        ev.set()
        t.join()
        worker._pin_threads(before)


def _fake_bench(per_call_s: float):
    def call():
        end = time.perf_counter() + per_call_s
        while time.perf_counter() < end:
            pass
    return SimpleNamespace(call=call, sync=lambda: None)


def test_burst_loops_are_bounded_by_their_budget_and_measure_the_call():
    b = _fake_bench(0.0003)  # 300 µs per call
    per_call = worker.Bench.warmup(b, 0.02)
    assert 250 < per_call < 600
    t0 = time.perf_counter()
    s = worker.Bench.wall_samples(b, 2, 0.01)  # samples of 2 calls for ~10 ms
    took = time.perf_counter() - t0
    assert 3 <= len(s) <= 20 and took < 0.25  # bounded by the budget (slack: a busy CI host)
    # every sample holds its calls' 300 µs; the median (not every sample: a busy host preempts
    # single samples) is not far above it
    assert min(s) > 250 and statistics.median(s) < 900
    h = worker.Bench.host_samples(b, 1, 0.005)
    assert len(h) >= 5 and min(h) > 250 and statistics.median(h) < 900
    # at least one sample even when one sample takes longer than the budget
    assert len(worker.Bench.wall_samples(_fake_bench(0.004), 5, 0.001)) == 1


def test_warmup_calibrates_on_steady_calls_not_the_slow_first_one():
    # a first call 100x slower than the rest (lazy init, a custom op's first dispatch) must not set
    # the calls per sample of the bursts (it once left a case with 5 one-call samples)
    state = {"n": 0}

    def call():
        state["n"] += 1
        end = time.perf_counter() + (0.03 if state["n"] == 1 else 0.0003)
        while time.perf_counter() < end:
            pass

    per_call = worker.Bench.warmup(SimpleNamespace(call=call, sync=lambda: None), 0.02)
    assert 250 < per_call < 600, per_call


def _cycle_data(seed_var: dict, sets: int = 3, cycles: int = 12):
    """CaseData for envs a (baseline), b (candidate): per case id, paired cycles whose log ratio
    has the given SD (deterministic: alternating +-sd around a 1.1x ratio)."""
    from matrix_runner.config import load_config
    from matrix_runner.runner import CaseData

    cases = load_config(None).cases[:len(seed_var)]
    data = {}
    for c, sd in zip(cases, seed_var.values()):
        a, b = CaseData("a", c), CaseData("b", c)
        a.status = b.status = "ok"
        for s in range(sets):
            a.sets["wall_us"][s] = {i: 100.0 for i in range(cycles)}
            b.sets["wall_us"][s] = {i: 110.0 * math.exp(sd if i % 2 else -sd) for i in range(cycles)}
        data[("a", c.id)], data[("b", c.id)] = a, b
    return cases, data


def test_cycle_weights_give_noisier_cases_more_cycles_in_proportion_to_variance():
    from matrix_runner.runner import cycle_weights

    # per-cycle SDs 0.01, 0.015, 0.02, 0.04 -> variances 1 : 2.25 : 4 : 16 x the lower quartile (0.01^2)
    cases, data = _cycle_data({"w": 0.01, "x": 0.015, "y": 0.02, "z": 0.04})
    w = cycle_weights(data, ["a", "b"], cases, max_repeats=4)
    assert [w[c.id] for c in cases] == [1, 2, 4, 4]
    w = cycle_weights(data, ["a", "b"], cases, max_repeats=8)
    assert [w[c.id] for c in cases] == [1, 2, 4, 8]
    # equally noisy cases: equal shares
    cases, data = _cycle_data({"x": 0.05, "y": 0.05, "z": 0.05})
    assert set(cycle_weights(data, ["a", "b"], cases, 4).values()) == {1}


def test_cycle_weights_are_one_each_before_any_data_and_with_one_env():
    from matrix_runner.runner import cycle_weights

    cases, data = _cycle_data({"x": 0.08, "y": 0.01}, sets=0)
    assert set(cycle_weights(data, ["a", "b"], cases, 4).values()) == {1}
    cases, data = _cycle_data({"x": 0.08, "y": 0.01})
    assert set(cycle_weights(data, ["a"], cases, 4).values()) == {1}


def test_kernel_time_and_graph_passes_stop_after_clock_sets_sets():
    from matrix_runner.config import Sampling
    from matrix_runner.runner import _needed

    cases, data = _cycle_data({"x": 0.05, "y": 0.05})
    samp = Sampling()
    for (lab, cid), cd in data.items():
        for s in range(samp.clock_sets - 1):
            # an undecided device comparison: wildly different kernel times per set
            cd.sets["device_us"][s] = [100.0 * (3.0 if (s % 2 and lab == "b") else 1.0)]
    assert _needed(data, ["a", "b"], cases, samp, "device_us") == {c.id for c in cases}
    for (lab, cid), cd in data.items():
        cd.sets["device_us"][samp.clock_sets - 1] = [100.0]
    assert _needed(data, ["a", "b"], cases, samp, "device_us") == set()
    assert _needed(data, ["a", "b"], cases, samp, "graph_us") == {c.id for c in cases}  # none yet


def test_queued_commands_never_block_the_driver_on_a_full_pipe(tmp_path):
    """600 set-ups of a large config are ~180 KB; a pipe holds 64 KiB and a worker that is still
    importing reads nothing: queue_commands returns at once, send waits for the queue, and every
    command arrives once, in order."""
    import subprocess
    w = object.__new__(lockstep.Worker)
    w.label, w.log, w._writer, w._buf = "x", tmp_path / "log", None, b""
    w.p = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(1.0); sys.stdout.write(sys.stdin.read())"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    cmds = [{"cmd": "setup", "case": f"c{i}", "spec": {"pad": "x" * 300}} for i in range(600)]
    t0 = time.perf_counter()
    w.queue_commands(cmds)
    assert time.perf_counter() - t0 < 0.5
    w.send({"cmd": "last"})  # waits for the queue, then goes after it
    w.p.stdin.close()
    out = w.p.stdout.read().decode().splitlines()
    w.p.wait(10)
    assert [json.loads(x)["case"] for x in out[:-1]] == [f"c{i}" for i in range(600)]
    assert json.loads(out[-1]) == {"cmd": "last"}


def _fake_worker(tmp_path, script: str) -> lockstep.Worker:
    import subprocess
    w = object.__new__(lockstep.Worker)
    w.label, w.log, w._writer, w._buf, w._ready, w.hello = "x", tmp_path / "log", None, b"", [], None
    w.p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    w.pid = w.p.pid
    return w


def test_read_ahead_keeps_replies_in_order_for_the_next_reads(tmp_path):
    """A prefetched set's replies are read ahead (so the running set knows its set-ups are over)
    and then handed out, in order, by wait_hello/reply, before anything read later."""
    w = _fake_worker(tmp_path, "import json, time\nfor i in range(4):\n    time.sleep(0.05)\n"
                               "    print(json.dumps({'i': i}), flush=True)\ntime.sleep(30)")
    try:
        assert w.read_ahead(3, 10.0) == 3
        assert w.read_ahead(3, 10.0) == 3  # already there: no further read
        assert w.wait_hello(5.0) == {"i": 0}
        assert [w.reply(5.0)["i"] for _ in range(3)] == [1, 2, 3]
        t0 = time.perf_counter()
        assert w.read_ahead(1, 0.3) == 0  # still busy: the wait ends at its timeout, nothing is killed
        assert 0.25 < time.perf_counter() - t0 < 5 and w.p.poll() is None
    finally:
        w.p.kill()
        w.p.wait(10)


def test_read_ahead_of_a_dead_worker_leaves_the_fault_to_the_reply(tmp_path):
    w = _fake_worker(tmp_path, "import json\nprint(json.dumps({'i': 0}), flush=True)")
    assert w.read_ahead(3, 10.0) == 1
    assert w.reply(5.0) == {"i": 0}
    with pytest.raises(lockstep.WorkerDied):
        w.reply(5.0)


def test_await_setups_waits_for_hello_config_and_every_queued_set_up():
    """The running set's profiler pass waits for the next set's hello, config and set-up replies."""
    from matrix_runner.runner import _Set

    class W:
        def __init__(self, hello):
            self.hello, self.asked = hello, None

        def read_ahead(self, n, timeout):
            self.asked = n
            return n

    st = object.__new__(_Set)
    st.workers = {"a": W(None), "b": W({"type": "hello"}), "c": W(None)}
    st.preloaded = {"a": ["c1", "c2", "c3"], "b": ["c1", "c2", "c3"]}  # c: nothing was queued
    st.await_setups(10.0)
    assert (st.workers["a"].asked, st.workers["b"].asked, st.workers["c"].asked) == (5, 4, None)


def test_burst_brackets_every_sample_with_probe_readings_outside_the_timed_calls(monkeypatch):
    """A planted probe that busy-waits 2 ms: inside a sample of 2 calls of 300 µs it would add
    >= 1000 µs per call; outside, the samples' median stays near 300 µs. (A median, not every
    sample: a busy CI host preempts single samples; that is what failed CI once with a 900 µs cap
    on every sample.)"""
    readings = iter(range(1, 10_000))

    def planted_probe(n=0):
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        return float(next(readings))

    monkeypatch.setattr(worker, "speed_probe", planted_probe)
    b = _fake_bench(0.0003)
    for method, inner in (worker.Bench.wall_samples, 2), (worker.Bench.host_samples, 1):
        refs: list = []
        s = method(b, inner, 0.02, refs)
        assert len(refs) == len(s) + 1  # one before each sample, one after the last
        assert refs == sorted(refs) and refs[0] >= 1  # the planted readings, in the order taken
        assert min(s) > 250  # every sample holds its calls' 300 µs
        assert statistics.median(s) < 800, s  # and not the probe's 2000 µs


def test_speed_adjusted_moves_each_sample_to_the_reference_speed_along_the_slope():
    import math
    # the probe reads 4 or 8 µs; a sample bracketed by 4 and 8 sits at probe sqrt(32), and the call
    # scales with the speed (50 µs at probe 4 µs, 70.71 µs at sqrt(32))
    refs = [4.0, 8.0, 4.0, 8.0, 4.0, 4.0]  # sample i is bracketed by refs[i] and refs[i+1]
    samples = [70.71, 70.71, 70.71, 70.71, 50.0]
    out = worker.speed_adjusted(samples, refs, 1.0, math.log(4.0))
    # at slope 1 every sample is moved to probe 4 µs: 50 µs each (70.71 at probe sqrt(32) -> 50)
    assert abs(out["adj_us"] - 50.0) < 0.05
    # slope 0: the plain median
    assert abs(worker.speed_adjusted(samples, refs, 0.0, 0.0)["adj_us"] - 70.71) < 1e-9
    n, sx, sy, sxx, sxy = out["fit"]
    assert n == 5 and abs(sx / n - (4 * math.log(32) / 2 + math.log(4)) / 5) < 1e-9


def test_speed_slope_is_the_within_worker_slope_pooled_and_ignores_offsets_between_workers():
    import math
    import random

    from matrix_runner import stats
    rng = random.Random(1)
    sl = stats.SpeedSlope()
    assert sl.beta_center() == (0.0, 0.0)  # nothing yet: no adjustment
    # worker w: log µs = offset_w + 0.7 * log probe + noise; offsets differ a lot between workers
    for w, off in enumerate((3.0, 3.5, 2.4, 4.1)):
        for _ in range(30):
            xs = [math.log(rng.choice((3.6, 7.5))) for _ in range(10)]
            ys = [off + 0.7 * x + rng.gauss(0, 0.02) for x in xs]
            sl.add((0, w), [len(xs), sum(xs), sum(ys), sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys))])
    beta, center = sl.beta_center()
    assert abs(beta - 0.7) < 0.02
    assert math.log(3.6) < center < math.log(7.5)
    # bounded: a slope the data cannot have is clamped; malformed fits are ignored
    sl2 = stats.SpeedSlope()
    for k in range(20):
        x = math.log(4.0 + k % 2 * 4.0)
        sl2.add("w", [1, x, 5 * x, x * x, 5 * x * x])
    sl2.add("w", [1, float("nan"), 0, 0, 0])
    sl2.add("w", None)
    assert sl2.beta_center()[0] == stats.SLOPE_BOUNDS[1]


def test_a_resume_carries_the_speed_slope_on_from_the_earlier_sets():
    """New-user trial 2026-12-05: a finished A/A run extended by 2 sets started its slopes afresh; from
    the new workers' first bursts the slope came out 1.30-1.46 (the run's had been 0.2), and with the
    workers' probes reading 4.46 vs 3.97 µs the set ratios came out 1.08-1.18. Each set's speed record
    now keeps the slope's sums (stats.SpeedSlope.state) and a resume starts from them."""
    import random

    from matrix_runner import runner, stats
    from matrix_runner.config import Case
    rng = random.Random(3)
    sl = stats.SpeedSlope()
    for w in range(6):  # earlier workers: log µs = offset + 0.2 * log probe
        for _ in range(40):
            xs = [math.log(rng.choice((3.7, 4.0, 4.4))) for _ in range(8)]
            ys = [3.6 + 0.1 * w + 0.2 * x + rng.gauss(0, 0.01) for x in xs]
            sl.add((0, w), [len(xs), sum(xs), sum(ys), sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys))],
                   statistics.median(xs))
    beta, center = sl.beta_center()
    assert abs(beta - 0.2) < 0.03
    st = sl.state()
    assert st["fit_bursts"] == 240 and st["fit_n"] == 6 * 40 * 8
    back = stats.SpeedSlope.restored(json.loads(json.dumps(st)))  # as results.json keeps it
    assert back.beta_center() == pytest.approx((beta, center), rel=1e-6)
    # a new worker's first bursts, noisy and steep, hardly move it
    for _ in range(2):
        xs = [math.log(3.9), math.log(4.5)]
        ys = [3.0 + 1.5 * x for x in xs]
        back.add((9, 0), [2, sum(xs), sum(ys), sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys))], xs[0])
    assert abs(back.beta_center()[0] - beta) < 0.02
    fresh = stats.SpeedSlope()
    for _ in range(5):
        fresh.add((9, 0), [2, sum(xs), sum(ys), sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys))], xs[0])
    assert fresh.beta_center()[0] == pytest.approx(1.5)  # what the resume got before
    # the runner finds it in the latest set's record of each case and clock; older records: afresh
    c = Case(op="fwd", batch=1, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16)
    cd = runner.CaseData("a", c)
    cd.speed["wall_us"] = {0: {"beta": 0.9, "center": 1.0}, 3: {"beta": round(beta, 4), "center": 1.3, **st}}
    cd.speed["host_us"] = {3: {"beta": 0.5, "center": 1.3}}
    got = runner.restored_slopes({("a", c.id): cd})
    assert set(got) == {(c.id, "wall_us")}
    assert got[(c.id, "wall_us")].beta_center() == pytest.approx((beta, center), rel=1e-6)
    assert stats.SpeedSlope.restored({"beta": 0.3}).beta_center() == (0.0, 0.0)
    assert stats.SpeedSlope.restored({**st, "fit_sxx": float("nan")}).beta_center()[0] == 0.0


class _BurstWorker:
    """A stand-in for a live lockstep.Worker: every burst takes ``ms`` and reports 100 µs."""

    def __init__(self, ms: float = 2.0):
        self.ms, self.bursts = ms, 0

    def request(self, cmd: dict, timeout: float) -> dict:
        assert cmd["cmd"] == "burst"
        time.sleep(self.ms / 1000)
        self.bursts += 1
        return {"status": "ok", "us": 100.0, "adj_us": 100.0, "ref_us": 5.0}


@pytest.mark.parametrize("more_for, want_lo, want_hi", [
    (None, 0.1, 0.25),   # no next set starting: the set's own seconds
    (0.3, 0.3, 0.45),    # the next set's workers say hello after 0.3 s: cycles run until then
    (9.0, 0.5, 0.65),    # they never do: at most EXTEND_FACTOR (5) x the set's seconds
])
def test_a_set_cycles_on_while_the_next_sets_workers_are_still_starting(more_for, want_lo, want_hi):
    import random
    import threading

    from matrix_runner import runner
    from matrix_runner.config import Sampling

    cases, data = _cycle_data({"x": 0.01}, sets=0)
    samp = Sampling(set_seconds=0.1, speed_adjust=False)
    live = {"a": _BurstWorker(), "b": _BurstWorker()}
    st = SimpleNamespace(sid=0, label_of={"a": "a", "b": "b"})
    t0 = time.monotonic()
    more = None if more_for is None else (lambda: time.monotonic() - t0 < more_for)
    n = runner._cycles(st, live, cases, data, samp, quick=False, case_timeout=5, stop=threading.Event(),
                       rng=random.Random(0), on_progress=lambda m: None, fault=None, labels=["a", "b"],
                       slopes={}, more=more)
    took = time.monotonic() - t0
    assert want_lo <= took <= want_hi, took
    # every cycle was kept: one paired value per cycle and env
    assert n == len(data[("a", cases[0].id)].sets["wall_us"][0]) + len(data[("a", cases[0].id)].sets["host_us"].get(0, {}))
    assert n >= 0.5 * took / 0.004  # a cycle: two 2-ms bursts


def test_has_reply_reads_without_waiting(tmp_path):
    import subprocess

    w = object.__new__(lockstep.Worker)
    w._buf, w._ready = b"", []
    w.p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.4); print('{\"type\": \"hello\"}', flush=True); time.sleep(0.3)"],
                           stdout=subprocess.PIPE)
    t = time.monotonic()
    assert w.has_reply() is False and time.monotonic() - t < 0.05  # nothing yet, and no wait
    while not w.has_reply():
        assert time.monotonic() - t < 5
        time.sleep(0.01)
    assert w.wait_hello(1) == {"type": "hello"}  # the record read ahead is the next reply
    assert w.has_reply() is False
    w.p.wait()
    assert w.has_reply() is True  # exited: nothing left to wait for


def test_a_sets_workers_start_in_an_order_rotated_by_set(monkeypatch, tmp_path):
    from matrix_runner import runner

    started = []

    class FakeWorker:
        def __init__(self, key, python, log, cpus, env_extra=None, preimport=None):
            started.append(key)

    monkeypatch.setattr(runner.lockstep, "Worker", FakeWorker)
    envs = [SimpleNamespace(label=lab, python="py") for lab in ("a", "b", "c")]
    order = []
    for sid in range(4):
        started.clear()
        st = runner._Set(sid, envs, tmp_path, None, 1, None, [])
        order.append(list(started))
        assert list(st.workers) == started and st.label_of == {k: k for k in "abc"}
    assert order == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    started.clear()
    runner._Set(1, envs[:2], tmp_path, None, 2, None, [])
    assert started == ["b#0", "b#1", "a#0", "a#1"]


def test_preimport_imports_the_listed_modules_and_reports_what_failed(tmp_path):
    assert worker.preimport(None) is None
    f = tmp_path / "mods.json"
    # a module not loaded yet in this interpreter, one that is, and one that does not exist
    fresh = next(m for m in ("colorsys", "tabnanny", "wave", "mailbox") if m not in sys.modules
                 and importlib.util.find_spec(m) is not None)
    f.write_text(json.dumps([fresh, "json", "no_such_module_mr"]))
    rec = worker.preimport(str(f))
    assert fresh in sys.modules
    assert (rec["n"], rec["failed"]) == (3, 1) and rec["imported"] >= 1
    assert rec["first_failures"][0].startswith("no_such_module_mr: ModuleNotFoundError")
    rec = worker.preimport(str(tmp_path / "missing.json"))
    assert rec["n"] == 0 and "missing.json" in rec["first_failures"][0]


@pytest.mark.parametrize("preimport", [True, False])
def test_later_sets_import_what_earlier_set_ups_loaded_and_their_first_call_is_warm(tmp_path, preimport):
    """A custom-op stand-in (flash-attn 2.7+'s wrapping) loads torch._dynamo and ~800 more modules on
    its first call (1.8 s on the 2-core CPU machine); with the pre-import, later sets' workers load
    them while they start, and their set-up's first call is a plain call."""
    import threading

    from matrix_runner import runner
    from matrix_runner.config import Case, Sampling

    envs = [standin.venv_env(tmp_path, "2.6.3", standin.make_source(tmp_path / "src", "2.6.3")),
            standin.venv_env(tmp_path, "2.7.0.post2",
                             standin.make_source(tmp_path / "src", "2.7.0.post2", custom_op=True))]
    case = Case(op="fwd", batch=1, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16)
    data, sets = {}, []
    runner.run_all(envs, [case], Sampling(set_seconds=0.3, time_budget_s=300, max_sets=3, burst_ms=2.0,
                                          preimport=preimport),
                   device="cpu", quick=False, work=tmp_path / "work", case_timeout=120.0,
                   stop=threading.Event(), data=data, sets=sets)
    assert [s["status"] for s in sets] == ["ok"] * 3
    first = data[("2.7.0.post2", case.id)].first_call
    plain = data[("2.6.3", case.id)].first_call
    assert first[0][0] > 200 and plain[0][0] < 100  # ms: the custom op's lazy imports, in set 0 only
    learned = tmp_path / "work" / "preimport-2.7.0.post2.json"
    if preimport:
        assert "torch._dynamo" in json.loads(learned.read_text())
        assert "preimport" not in sets[0]["workers"]["2.7.0.post2"]
        for s in sets[1:]:
            pre = s["workers"]["2.7.0.post2"]["preimport"]
            assert pre["imported"] > 100 and pre["failed"] <= pre["n"] // 20, pre
        assert max(first[1][0], first[2][0]) < first[0][0] / 10
        # a --resume (the same work dir) starts from the list the earlier part learned
        runner.run_all(envs, [case], Sampling(set_seconds=0.3, time_budget_s=300, max_sets=4, burst_ms=2.0),
                       device="cpu", quick=False, work=tmp_path / "work", case_timeout=120.0,
                       stop=threading.Event(), data=data, sets=sets)
        assert len(sets) == 4 and sets[3]["workers"]["2.7.0.post2"]["preimport"]["imported"] > 100
        assert first[3][0] < first[0][0] / 10
    else:
        assert not learned.exists() and all("preimport" not in w for s in sets for w in s["workers"].values())
        assert min(first[1][0], first[2][0]) > 200


def test_cpu_steal_is_read_per_cpu_from_proc_stat(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    line = "cpu{}  {u} 0 {s} {i} 0 0 0 {st} 0 0\n"
    stat.write_text(line.format("", u=300, s=30, i=600, st=70) + line.format("0", u=200, s=20, i=250, st=30)
                    + line.format("1", u=100, s=10, i=350, st=40) + "intr 1 2 3\n")
    monkeypatch.setattr(machine, "PROC_STAT", str(stat))
    assert machine.cpu_jiffies(None) == (70, 1000)
    assert machine.cpu_jiffies([1]) == (40, 500)
    assert machine.cpu_jiffies([0, 1]) == (70, 1000)
    assert machine.cpu_jiffies([7]) is None  # no such CPU
    assert machine.steal_share((40, 500), (90, 600)) == 0.5
    assert machine.steal_share(None, (90, 600)) is None and machine.steal_share((1, 5), (1, 5)) is None
    stat.write_text("cpu  1 2 3 4\n")  # a kernel without the steal column
    assert machine.cpu_jiffies(None) is None


@pytest.mark.parametrize("depth", [1, 2])
def test_workers_start_prefetch_depth_sets_ahead_and_the_unused_ones_are_stopped(tmp_path, monkeypatch, depth):
    """With ``prefetch_depth`` 2, set 0's spawn stage starts the workers of sets 1 and 2, and each
    later set those of the set two ahead; only the next set's are set up; the workers of sets
    started but never run are stopped when the run ends."""
    import threading

    from matrix_runner import runner
    from matrix_runner.config import Case, Sampling

    envs = [standin.venv_env(tmp_path, v, standin.make_source(tmp_path / "src", v)) for v in ("2.6.3", "2.7.0.post2")]
    case = Case(op="fwd", batch=1, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16)
    data, sets, made = {}, [], []
    real = runner._Set

    class Recorded(real):
        def __init__(self, sid, *a, **k):
            super().__init__(sid, *a, **k)
            made.append((sid, len(sets), self))

    monkeypatch.setattr(runner, "_Set", Recorded)
    cpus = {"pinned": False, "set_cpus": [], "driver_cpu": None, "spare_cpus": sorted(os.sched_getaffinity(0))}
    runner.run_all(envs, [case], Sampling(set_seconds=0.3, time_budget_s=300, max_sets=3, burst_ms=2.0,
                                          prefetch_depth=depth),
                   device="cpu", quick=False, work=tmp_path / "work", case_timeout=120.0,
                   stop=threading.Event(), data=data, sets=sets, cpus=cpus)
    assert [s["status"] for s in sets] == ["ok"] * 3
    # (sid, sets finished when its workers were started)
    want = [(0, 0), (1, 0), (2, 1), (3, 2)] if depth == 1 else [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2)]
    assert [(sid, n) for sid, n, _ in made] == want
    ran = {s["set"]: {w["pid"] for w in s["workers"].values()} for s in sets}
    for sid, _, st in made:
        pids = {w.pid for w in st.workers.values()}
        assert (pids == ran[sid]) if sid in ran else not any(
            pids & p for p in ran.values()), (sid, pids, ran)
        for w in st.workers.values():  # every worker is stopped by the end of the run
            w.p.wait(timeout=30)
            assert w.p.poll() is not None
    wall = data[("2.7.0.post2", case.id)].sets["wall_us"]
    assert sorted(wall) == [0, 1, 2] and all(len(v) >= 1 for v in wall.values())


class _FakeGpu:
    """A stand-in for torch's CUDA stream semantics, enough for worker.Bench.graph: one GPU clock
    (µs) that work advances; an event records the GPU time when the stream reaches it. A graph
    replay costs ``overhead_us`` + ``per_call_us`` per captured call on the GPU and, when the
    stream is idle at the replay (no ``_sleep`` queued ahead of it), the GPU also waits for the
    host's launch, ``launch_us``, which then lies between the events: the pre-hold clock's error."""

    def __init__(self, per_call_us: float, overhead_us: float = 2.0, launch_us: float = 40.0):
        self.per_call_us, self.overhead_us, self.launch_us = per_call_us, overhead_us, launch_us
        self.t = 0.0  # GPU µs at the end of the queued work
        self.pending_sleep = 0.0  # GPU µs of a _sleep not yet covered by host work
        self.capturing: list | None = None
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = gpu.t

            def synchronize(self):
                pass

            def elapsed_time(self, other):  # ms, like torch
                return (other.at - self.at) / 1e3

        class CUDAGraph:
            def __init__(self):
                self.calls = 0

            def replay(self):
                if gpu.pending_sleep > 0:  # the host launched while the GPU spun: hidden
                    gpu.pending_sleep = 0.0
                else:  # an idle stream waits for the launch, after the start event
                    gpu.t += gpu.launch_us
                gpu.t += gpu.overhead_us + gpu.per_call_us * self.calls

        class _Graph:
            def __init__(self, g, stream=None):
                self.g = g

            def __enter__(self):
                gpu.capturing = []

            def __exit__(self, *a):
                self.g.calls = len(gpu.capturing)
                gpu.capturing = None

        class _Ctx:
            def __init__(self, *a, **k):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *a):
                pass

        class Stream:
            def wait_stream(self, other):
                pass

        def _sleep(cycles):
            gpu.t += cycles / 1000.0  # 1,000 cycles per µs
            gpu.pending_sleep = cycles / 1000.0

        self.cuda = SimpleNamespace(Stream=Stream, current_stream=lambda: Stream(), stream=_Ctx, graph=_Graph,
                                    CUDAGraph=CUDAGraph, Event=Event, _sleep=_sleep, synchronize=lambda: None)

    def call(self):
        if self.capturing is not None:
            self.capturing.append(1)
        else:
            self.t += self.per_call_us


@pytest.mark.parametrize("per_call_us,want_inner", [(5.0, 64), (150.0, 8), (485.0, 4), (2500.0, 1)])
def test_graph_clock_holds_the_gpu_while_the_host_launches_and_picks_inner_from_gpu_time(monkeypatch, per_call_us,
                                                                                         want_inner):
    monkeypatch.setattr(worker, "_SLEEP_CYCLES_PER_US", [])
    gpu = _FakeGpu(per_call_us)
    b = SimpleNamespace(torch=gpu, case={"op": "fwd"}, call=gpu.call, sync=lambda: None)
    r = worker.Bench.graph(b, 0.01)
    # calls per replay: a power of two from the one-call replay's GPU time (not the host's speed)
    assert r["inner"] == want_inner == worker.graph_inner(per_call_us + gpu.overhead_us)
    # the launch (40 µs) is outside the events: each sample is the GPU's per-call time plus the
    # replay's own overhead shared by inner calls
    want = per_call_us + gpu.overhead_us / want_inner
    assert all(s == pytest.approx(want, rel=1e-6) for s in r["samples"])
    assert len(r["samples"]) >= worker.MIN_SAMPLES and r["dropped"] == 0 and r["hold_us"] >= worker.GRAPH_HOLD_US
    # without the hold the launch lands inside the events, divided by inner
    r0 = worker.Bench.graph(b, 0.01, hold_us=0.0, inner=want_inner)
    assert statistics.median(r0["samples"]) == pytest.approx(want + gpu.launch_us / want_inner, rel=1e-6)


def test_graph_clock_drops_samples_whose_host_submission_outlasted_the_hold(monkeypatch):
    monkeypatch.setattr(worker, "_SLEEP_CYCLES_PER_US", [1000.0])
    gpu = _FakeGpu(5.0)
    b = SimpleNamespace(torch=gpu, case={"op": "fwd"}, call=gpu.call, sync=lambda: None)
    ticks = iter(range(0, 10**12, 50_000))  # every perf_counter_ns reading 50 µs after the last
    monkeypatch.setattr(worker.time, "perf_counter_ns", lambda: next(ticks))
    # the host takes 50 µs to submit (two readings apart): a 40 µs hold cannot cover it
    with pytest.raises(RuntimeError, match="outlasted its 40 µs hold"):
        worker.Bench.graph(b, 0.01, hold_us=40.0)
    r = worker.Bench.graph(b, 0.01, hold_us=500.0)
    assert r["dropped"] == 0 and r["samples"]


def test_graph_inner_is_a_power_of_two_capped_and_one_for_long_calls():
    assert worker.graph_inner(7.0) == 64  # 1000/7 = 143 -> 256 -> capped
    assert worker.graph_inner(100.0) == 16  # 10 -> 16
    assert worker.graph_inner(480.0) == worker.graph_inner(490.0) == 4
    assert worker.graph_inner(1000.0) == worker.graph_inner(5000.0) == 1
    assert worker.graph_inner(0.0) == worker.GRAPH_INNER_MAX


def test_a_decided_host_comparison_leaves_the_cycles_at_host_precision_a_wall_one_at_precision():
    from matrix_runner.config import Sampling
    from matrix_runner.runner import _settled
    samp = Sampling()
    cmp = {("a", "b", "x"): {"verdict": "slower", "ratio": 1.50, "ci_high": 1.56},  # +4 %
           ("a", "b", "y"): {"verdict": "slower", "ratio": 1.50, "ci_high": 1.65},  # +10 %
           ("a", "b", "z"): {"verdict": "ambiguous", "ratio": 1.02, "ci_high": 1.021},
           ("a", "b", "w"): {"verdict": "same", "ratio": 1.00, "ci_high": 1.005}}
    assert samp.host_precision == 0.05 and samp.precision == 0.01
    assert _settled(cmp, samp, "host_us") == {("a", "b", "x"), ("a", "b", "w")}
    assert _settled(cmp, samp, "wall_us") == _settled(cmp, samp) == {("a", "b", "w")}
    samp.host_precision = 1.0  # dropped as soon as decided
    assert _settled(cmp, samp, "host_us") == {("a", "b", "x"), ("a", "b", "y"), ("a", "b", "w")}


def test_closer_times_each_sets_reap_and_reserves_the_longest_recent_one():
    """runner._Closer: workers are signalled at once and reaped in the background; each stop's
    seconds (signal to last worker reaped) are kept, and the budget's check keeps back the longest
    of the latest five (0 before any)."""
    from matrix_runner import runner

    class Slow:
        def __init__(self, s):
            self.s, self.signalled, self.closed = s, 0.0, False

        def terminate(self):
            self.signalled = time.monotonic()

        def close(self):
            time.sleep(self.s)
            self.closed = True

    c = runner._Closer()
    assert c.reserve() == 0.0
    ws = [Slow(0.05), Slow(0.15)]
    t0 = time.monotonic()
    c.stop(ws)
    assert time.monotonic() - t0 < 0.05 and all(w.signalled for w in ws)  # signalled, not waited for
    c.join()
    assert all(w.closed for w in ws) and not c.threads
    assert 0.19 <= c.reserve() < 1.0  # the two reaped one after the other: ~0.2 s
    for s in (0.01,) * 5:  # the reserve follows the latest sets
        c.stop([Slow(s)])
        c.join()
    assert c.reserve() < 0.15


def test_cuda_at_start_reports_its_seconds_or_the_error_and_is_only_asked_for_cuda_runs(monkeypatch, tmp_path):
    """worker.cuda_at_start never raises (on this CPU-only machine it returns the error, which the
    set-up then meets as a real failure); the runner asks for it only for a CUDA run with
    ``sampling.cuda_at_start``."""
    import torch

    rec = worker.cuda_at_start()
    assert rec["seconds"] >= 0
    assert ("error" in rec) == (not torch.cuda.is_available())
    from matrix_runner import runner
    from matrix_runner.config import Sampling, load_config

    assert Sampling().cuda_at_start is False
    assert load_config(None).sampling.cuda_at_start is False
    seen = []

    class Stop(Exception):
        pass

    def fake_set(sid, envs, work, others, per_env, env_extra, *a, **k):
        seen.append(env_extra)
        raise Stop

    monkeypatch.setattr(runner, "_Set", fake_set)
    env = SimpleNamespace(label="a", python=sys.executable, status="ok", axis=None)
    from matrix_runner.config import Case

    case = Case(op="fwd", batch=1, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16)
    import threading

    for i, (device, on) in enumerate((("cuda", True), ("cuda", False), ("cpu", True))):
        # the first set's construction raises: the run ends there (a driver error, on record)
        reason = runner.run_all([env], [case], Sampling(cuda_at_start=on, max_sets=1), device=device, quick=False,
                                work=tmp_path / str(i), case_timeout=5.0, stop=threading.Event(), data={}, sets=[])
        assert "Stop" in reason
    assert [bool((e or {}).get(worker.CUDA_AT_START_ENV)) for e in seen] == [True, False, False]


def test_the_runners_comparisons_count_only_usual_speed_cycles_with_cpu_state_usual():
    """runner.comparisons_now (what decides when to stop) judges a run as results.comparisons will:
    with ``sampling.cpu_state: usual`` the probe readings each worker sent (CaseData.refs) leave out
    the cycles at the other CPU speed, and the result counts them; ``all`` counts every cycle."""
    import numpy as np

    from matrix_runner.config import Case, Sampling
    from matrix_runner.runner import CaseData, comparisons_now

    case = Case(op="fwd", batch=512, seqlen_q=50, seqlen_k=50, nheads=16, nheads_k=16, head_dim=16)
    rng = np.random.default_rng(4)
    data = {(e, case.id): CaseData(env=e, case=case, status="ok") for e in ("a", "b")}
    slow_cycles = 0
    for s in range(12):
        for cy in range(8):
            slow = cy % 4 == 0 and s % 2 == 0
            slow_cycles += slow
            b = 180.0 * float(np.exp(rng.normal(0, 0.02)))
            for e, v in (("a", b), ("b", b * (1.20 if slow else 1.11) * float(np.exp(rng.normal(0, 0.005))))):
                data[(e, case.id)].sets["wall_us"].setdefault(s, {})[cy] = v
                data[(e, case.id)].refs["wall_us"].setdefault(s, {})[cy] = 7.5 if slow else 3.4
    every = comparisons_now(data, ["a", "b"], [case], Sampling(), "wall_us")[("a", "b", case.id)]
    usual = comparisons_now(data, ["a", "b"], [case], Sampling(cpu_state="usual"), "wall_us")[("a", "b", case.id)]
    assert "state_dropped" not in every and every["ratio"] > 1.115
    assert usual["state_dropped"] == slow_cycles == 12 and abs(usual["ratio"] / 1.11 - 1) < 0.003


def test_scout_reads_every_cpu_but_the_sets_one_and_stops_at_end_of_input():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    import io

    r, w = os.pipe()
    os.write(w, f"at {cpus[0]}\n".encode())
    out = io.StringIO()
    before = os.sched_getaffinity(0)  # the scout pins the calling thread as it goes
    try:
        with os.fdopen(r, "rb", buffering=0) as rf:
            assert worker.scout(cpus, probe_ms=0.5, every_ms=1.0, stdin=rf, stdout=out, sweeps=3) == 0
            recs = [json.loads(line) for line in out.getvalue().splitlines()]
            assert len(recs) == 3 and all(r["schema"] == worker.SCOUT_SCHEMA for r in recs)
            assert all(set(r["us"]) == {str(cpus[1])} and 0 < r["us"][str(cpus[1])] < 1e4 for r in recs)  # the set's CPU left alone
            assert recs[0]["t"] <= recs[-1]["t"] <= time.monotonic()  # the driver's monotonic clock
            os.write(w, b"at -1\n")
            out2 = io.StringIO()
            worker.scout(cpus, probe_ms=0.5, every_ms=1.0, stdin=rf, stdout=out2, sweeps=1)
            assert set(json.loads(out2.getvalue())["us"]) == {str(c) for c in cpus}
            os.close(w)  # end of input: the scout stops before its next sweep
            out3 = io.StringIO()
            assert worker.scout(cpus, probe_ms=0.5, every_ms=1.0, stdin=rf, stdout=out3, sweeps=5) == 0
            assert out3.getvalue() == ""
    finally:
        os.sched_setaffinity(0, before)


def _quiet_hopper(monkeypatch, tmp_path, cpus, lines=()):
    """A Hopper whose scout is a stand-in printing ``lines`` (scout records) and then waiting."""
    from matrix_runner import proc

    real = proc.spawn
    script = "import sys\n" + "".join(f"print({json.dumps(json.dumps(x))}, flush=True)\n" for x in lines) + "sys.stdin.read()\n"
    monkeypatch.setattr(proc, "spawn", lambda argv, **k: real([sys.executable, "-c", script], **k))
    return lockstep.Hopper(cpus, tmp_path / "scout.log")


def test_hopper_reads_the_scouts_lines_and_its_low_level(monkeypatch, tmp_path):
    now = time.monotonic()
    recs = [{"schema": worker.SCOUT_SCHEMA, "t": now, "us": {"3": 3.0 + 0.01 * i, "5": 6.5}} for i in range(20)]
    h = _quiet_hopper(monkeypatch, tmp_path, [3, 5], recs + ["not json", {"t": "x"}])
    try:
        for _ in range(100):
            if h._scout.low is not None and h.latest.get(3, (0, 0))[1] == pytest.approx(3.19):
                break
            time.sleep(0.02)
        assert h.latest[5][1] == 6.5 and h.latest[3][1] == pytest.approx(3.19)
        assert 3.0 <= h._scout.low <= 3.1  # the 5th percentile of 40 readings: the fast level
        assert h.fastest() == 3 and h.fastest(exclude=3) is None  # 6.5 is not within 1.3x of 3.0
        h.max_age_s = 0.0
        time.sleep(0.01)
        assert h.fastest() is None  # stale readings do not count
    finally:
        h.close()


def test_hopper_moves_only_when_every_envs_cycle_read_slow_and_a_fresh_fast_cpu_exists(monkeypatch, tmp_path):
    h = _quiet_hopper(monkeypatch, tmp_path, [2, 4, 6])
    try:
        with h._lock:
            h._scout.low = 3.0
            h.latest = {4: (time.monotonic() + 60, 3.2), 6: (time.monotonic() + 60, 7.0)}
        assert h.place(2) == 4 and h.at == 4  # the fastest fresh CPU, not the rotation's
        h.at = 2
        for _ in range(40):  # both envs' low levels: ~3.3 µs (their own scale)
            assert h.after_cycle({"a": [3.3], "b": [3.35]}) is None
        assert h.after_cycle({"a": [7.1], "b": [3.4]}) is None  # one env still fast: not the CPU's slow level
        assert h.after_cycle({"a": [7.1], "b": [float("nan")]}) is None  # a reading missing: no judgement
        assert h.after_cycle({"a": [7.1], "b": [6.9]}) == 4 and h.at == 4  # both slow, CPU 4 reads fast
        assert h.after_cycle({"a": [7.2], "b": [7.0]}) is None  # slow again, but the only fast CPU is this one
        with h._lock:
            h.latest[4] = (time.monotonic() + 60, 5.0)  # 5.0 > 1.3 x 3.0: no CPU at the fast level
        h.at = 2
        assert h.after_cycle({"a": [7.1], "b": [6.9]}) is None
        h.leave()
        assert h.at == -1
    finally:
        h.close()


def test_pool_size_is_half_the_cpus_beside_the_drivers_with_cpu_hop():
    assert lockstep.pool_size(16, False) == 4 and lockstep.pool_size(16, True) == 7
    assert lockstep.pool_size(2, True) == 4 and lockstep.pool_size(64, True) == 31


def test_a_set_with_cpu_hop_starts_where_the_hopper_says_and_its_workers_move_between_cycles(tmp_path, monkeypatch):
    import threading

    from matrix_runner import runner
    from matrix_runner.config import Case, Sampling

    cpus_ok = sorted(os.sched_getaffinity(0))
    if len(cpus_ok) < 2:
        pytest.skip("needs two CPUs")
    a, b = cpus_ok[:2]
    moves = []

    class Forced(lockstep.Hopper):
        """The real scout; every 4th cycle a move to the other CPU, and the set starts on ``b``."""
        n = 0

        def place(self, default):
            self._tell(b)
            return b

        def after_cycle(self, refs):
            assert set(refs) == {"2.6.3", "2.7.0.post2"}  # one probe list per env
            Forced.n += 1
            if Forced.n % 4:
                return None
            to = a if self.at == b else b
            self._tell(to)
            moves.append(to)
            return to

    monkeypatch.setattr(lockstep, "Hopper", Forced)
    seen = []
    real_move = lockstep.move_process

    def move(pid, cpus):
        n = real_move(pid, cpus)
        seen.append((pid, set(cpus), os.sched_getaffinity(pid)))
        return n

    monkeypatch.setattr(lockstep, "move_process", move)
    envs = [standin.venv_env(tmp_path, v, standin.make_source(tmp_path / "src", v)) for v in ("2.6.3", "2.7.0.post2")]
    case = Case(op="fwd", batch=1, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16)
    data, sets = {}, []
    plan = {"pinned": True, "driver_cpu": a, "set_cpus": [a, b], "spare_cpus": []}
    runner.run_all(envs, [case], Sampling(set_seconds=0.4, time_budget_s=300, max_sets=2, burst_ms=2.0, cpu_hop=True),
                   device="cpu", quick=False, work=tmp_path / "work", case_timeout=120.0,
                   stop=threading.Event(), data=data, sets=sets, cpus=plan)
    assert [s["status"] for s in sets] == ["ok", "ok"]
    assert all(s["cpu"] == b for s in sets)  # Hopper.place, not the rotation (set 0 would be on a)
    assert sum(s["hops"] for s in sets) == len(moves) > 0
    assert all(set(s["hop_cpus"]) == {a, b} for s in sets if s["hops"])
    for s in sets:  # the scout's state at each set's end: alive, read lately, its fast level known
        sc = s["scout"]
        assert sc["alive"] and sc["sweeps"] > 5 and 0 <= sc["age_s"] < 1.0 and sc["low_us"] > 0, sc
        assert s["steal"] is None or 0 <= s["steal"] <= 1  # over the CPUs it ran on
    moved = [(cp, aff) for pid, cp, aff in seen if cp in ({a}, {b})]
    assert moved and all(aff == cp for cp, aff in moved)  # the workers' threads really moved
    assert (tmp_path / "work" / "scout.log").exists()
    wall = data[("2.7.0.post2", case.id)].sets["wall_us"]
    assert sorted(wall) == [0, 1] and all(len(v) >= 4 for v in wall.values())


@pytest.mark.parametrize("arg,want", [("x", "give a comma list of CPU ids"), ("1-3", "give a comma list of CPU ids"),
                                      ("", "no CPU given"), (",", "no CPU given"), ("99999", "no online CPU [99999] on this machine")])
def test_scout_command_line_names_what_is_wrong_with_its_cpus(arg, want):
    import subprocess

    p = subprocess.run([sys.executable, str(WORKER_SRC), "scout", "--cpus", arg], capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and want in p.stderr and "Traceback" not in p.stderr


def test_a_hopping_sets_steal_is_over_the_stretches_it_spent_on_each_cpu(tmp_path, monkeypatch):
    """sampling.cpu_hop (review): summed over every CPU a set visited for the whole set, steal read
    a fraction of what the set met; counted per stretch it is what the set met."""
    from matrix_runner import runner

    stat = tmp_path / "stat"
    ticks = {1: [0, 0], 2: [0, 0]}  # cpu -> [steal, total]

    def write():
        line = "cpu{}  {u} 0 0 {i} 0 0 0 {st} 0 0\n"
        stat.write_text("".join(line.format(c, u=t[1] - t[0], i=0, st=t[0]) for c, t in ticks.items()))

    def run(cpu, seconds, share):  # the set on ``cpu`` for ``seconds`` at ``share`` steal; the other CPU idle
        for c in ticks:
            ticks[c][1] += 100 * seconds
        ticks[cpu][0] += round(100 * seconds * share)
        write()

    write()
    monkeypatch.setattr(machine, "PROC_STAT", str(stat))
    st = SimpleNamespace(steal_sum=[0, 0], steal_at=None)
    runner._stretch_to(st, 1)
    run(1, 90, 0.3)
    runner._stretch_to(st, 2)
    run(2, 10, 0.3)
    assert runner._stretch_share(st) == 0.3  # the whole-pool sum would read 0.15
    assert st.steal_at is None
    st2 = SimpleNamespace(steal_sum=[0, 0], steal_at=None)
    runner._stretch_to(st2, 7)  # no such CPU: unknown, not 0
    assert runner._stretch_share(st2) is None


@pytest.mark.parametrize("request_", ["", ",", " , "])
def test_an_empty_cpus_list_is_called_empty(request_):
    """--cpus '' had answered "CPU(s) [] not allowed to this process" (new-user trial)."""
    with pytest.raises(ValueError, match="the list is empty; give auto, unpinned or a comma list"):
        lockstep.parse_cpus(request_)


def test_cpu_hop_that_cannot_move_says_why_in_the_results_and_the_report(tmp_path):
    """sampling.cpu_hop on a plan with one set CPU (this 2-CPU machine) or unpinned had done nothing
    without a word (new-user trial): lockstep.hop_idle names why, run_all records it in the timing,
    and the report's CPU-speed sentence says it."""
    import threading

    from matrix_runner import report, runner
    from matrix_runner.config import Case, Sampling

    assert lockstep.hop_idle({"pinned": True, "set_cpus": [1, 2]}) is None
    assert "have 1 CPU to run on" in lockstep.hop_idle({"pinned": True, "set_cpus": [1]})
    assert lockstep.hop_idle({"pinned": False, "why": "one CPU"}) == "the process sets run unpinned (one CPU)"
    cpu = sorted(os.sched_getaffinity(0))[0]
    envs = [standin.venv_env(tmp_path, v, standin.make_source(tmp_path / "src", v)) for v in ("2.6.3", "2.7.0.post2")]
    case = Case(op="fwd", batch=1, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16)
    data, sets, timing = {}, [], {}
    runner.run_all(envs, [case], Sampling(set_seconds=0.3, time_budget_s=300, max_sets=1, burst_ms=2.0, cpu_hop=True),
                   device="cpu", quick=False, work=tmp_path / "work", case_timeout=120.0, stop=threading.Event(),
                   data=data, sets=sets, cpus={"pinned": True, "driver_cpu": cpu, "set_cpus": [cpu], "spare_cpus": []},
                   timing=timing)
    assert [s["status"] for s in sets] == ["ok"] and "hops" not in sets[0]
    assert timing["cpu_hop_idle"].startswith("the process sets have 1 CPU to run on")
    assert not (tmp_path / "work" / "scout.log").exists()
    doc = {"cases": [{"metrics": {"wall_us": {"ref_by_set": {"0": {"1": 3.5}}}}}], "sets": sets, "timing": timing}
    assert "; sampling.cpu_hop was on but did nothing: the process sets have 1 CPU to run on" in report.probe_note(doc)
    # a --resume where it could do nothing, after a part whose sets moved: both are said (the moves had been hidden)
    moved = {**doc, "sets": [{"set": 0, "hops": 3}, {"set": 1, "hops": 0}, *[{**s, "set": 2} for s in sets]]}
    note = report.probe_note(moved)
    assert "1 of 2 process sets moved between CPUs to follow the fast speed (sampling.cpu_hop: 3 moves" in note
    assert "; in one part of the run (a --resume) it could do nothing: the process sets have 1 CPU to run on" in note


def _share_data(n_sets: int, odd: float, batch: int = 1):
    """Two envs' CaseData of one case over ``n_sets`` sets whose calls match (plain 100 µs both)
    while env b's probe reads a set-wide offset dm (-3..+3 %; ``odd`` in the last set) off a's:
    a probe offset of the process, not CPU speed. The values are adjusted as the runner does with
    slope 0.8 around a 4 µs centre: log v = log raw - 0.8 (log probe - log 4)."""
    from matrix_runner.config import Case
    from matrix_runner.runner import CaseData
    c = Case(op="fwd", batch=batch, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16)
    a, b = CaseData("a", c), CaseData("b", c)
    for s in range(n_sets):
        off = odd if s == n_sets - 1 else 0.03 * ((s % 5) - 2) / 2
        for cd, probe in ((a, 4.0), (b, 4.0 * math.exp(off))):
            for m in ("wall_us", "host_us"):
                cd.raw[m][s] = {k: 100.0 for k in range(6)}
                cd.refs[m][s] = {k: probe * (1.0 + 0.01 * k) for k in range(6)}
                cd.sets[m][s] = {k: 100.0 * math.exp(-0.8 * math.log(cd.refs[m][s][k] / 4.0)) for k in range(6)}
                cd.speed[m][s] = {"beta": 0.8, "center": math.log(4.0)}
    return c, {("a", c.id): a, ("b", c.id): b}


def test_probe_share_estimated_takes_a_per_process_probe_offset_out_of_the_set_ratio():
    """sampling.probe_share: estimated (runner.apply_probe_share): the earlier sets show the calls did
    not follow the workers' probe difference (share 0), so a set whose b probe reads 22 % high keeps
    its plain ratio 1 instead of the 0.85 the full adjustment gives it; within the set the adjustment
    still applies (each cycle's value keeps its own probe's slope). ``full`` leaves every value as is."""
    from matrix_runner import runner
    from matrix_runner.config import Sampling

    c, data = _share_data(10, odd=0.2)
    ratio = lambda: statistics.median(data[("b", c.id)].sets["wall_us"][9][k] / data[("a", c.id)].sets["wall_us"][9][k]
                                      for k in range(6))
    assert ratio() == pytest.approx(math.exp(-0.8 * 0.2), rel=1e-9)  # the full adjustment: 0.852
    assert runner.apply_probe_share(data, ["a", "b"], [c], 9, Sampling(probe_share="full")) is None
    assert ratio() == pytest.approx(0.852, abs=1e-3)
    cache: dict = {}
    share = runner.apply_probe_share(data, ["a", "b"], [c], 9, Sampling(probe_share="estimated"), cache=cache)
    assert share == pytest.approx(0.0, abs=1e-9) and sorted(cache) == list(range(9))  # earlier sets' points kept
    assert ratio() == pytest.approx(1.0, rel=1e-9)  # the calls matched
    host = data[("b", c.id)].sets["host_us"][9]
    assert host[0] / data[("a", c.id)].sets["host_us"][9][0] == pytest.approx(1.0)  # the host clock alike
    assert data[("b", c.id)].speed["wall_us"][9]["between"] == pytest.approx(0.8 * 0.1, abs=1e-5)  # half of dm each
    # within the set: cycle k's probe is 1 % per k higher in both workers, so its value stays adjusted
    vals = data[("a", c.id)].sets["wall_us"][9]
    assert vals[5] / vals[0] == pytest.approx((1.05) ** -0.8, rel=1e-9)


def test_probe_share_waits_for_three_earlier_pinned_sets_and_keeps_calls_that_followed_the_probe():
    from matrix_runner import runner, stats
    from matrix_runner.config import Sampling

    assert stats.PROBE_SHARE_MIN_SETS == 3
    c, data = _share_data(3, odd=0.15)  # 2 earlier sets: too few to judge by, the whole difference counts
    before = dict(data[("b", c.id)].sets["wall_us"][2])
    assert runner.apply_probe_share(data, ["a", "b"], [c], 2, Sampling(probe_share="estimated")) is None
    assert data[("b", c.id)].sets["wall_us"][2] == before and "between" not in data[("b", c.id)].speed["wall_us"][2]
    # ... up to stats.PROBE_FIRST_REACH from the envs' mean (0.1 each, 0.2 apart: CPU self-check 2026-12-05,
    # a first set whose b probe read 1.70x a's while the calls matched)
    assert stats.PROBE_FIRST_REACH == 0.1
    odd = math.log(6.39 / 3.77)
    c, data = _share_data(1, odd=odd)
    a, b = data[("a", c.id)], data[("b", c.id)]
    assert runner.apply_probe_share(data, ["a", "b"], [c], 0, Sampling(probe_share="estimated")) is None
    assert statistics.median(b.sets["wall_us"][0][k] / a.sets["wall_us"][0][k] for k in range(6)) == \
        pytest.approx(math.exp(-0.8 * 0.2), rel=1e-6)  # 0.852, not the full adjustment's 0.655
    assert b.speed["wall_us"][0]["held"] == pytest.approx(0.1) and a.speed["wall_us"][0]["held"] == pytest.approx(-0.1)
    # only a set-wide difference is held: one case of three differing that much (its few cycles met
    # different CPU speeds, which its calls felt) keeps its whole adjustment
    parts = [_share_data(1, odd=odd if i == 0 else 0.01, batch=1 + i) for i in range(3)]
    data = {k: v for _, d in parts for k, v in d.items()}
    before = {k: dict(v.sets["wall_us"][0]) for k, v in data.items()}
    assert runner.apply_probe_share(data, ["a", "b"], [c for c, _ in parts], 0, Sampling(probe_share="estimated")) is None
    assert {k: v.sets["wall_us"][0] for k, v in data.items()} == before
    assert not any("held" in v.speed["wall_us"][0] for v in data.values())
    c, data = _share_data(4, odd=0.2)  # 3 earlier sets: the share is estimated (0 here: the calls never followed)
    assert runner.apply_probe_share(data, ["a", "b"], [c], 3, Sampling(probe_share="estimated")) == pytest.approx(0.0)
    # 3 earlier sets, but one ran unpinned (its workers did not share a core): 2 pinned ones are too few,
    # and an unpinned set itself keeps the whole adjustment (its probe difference is CPU speed)
    c, data = _share_data(4, odd=0.2)
    est = Sampling(probe_share="estimated")
    assert runner.apply_probe_share(data, ["a", "b"], [c], 3, est, unpinned=frozenset({1})) is None
    c, data = _share_data(10, odd=0.2)
    assert runner.apply_probe_share(data, ["a", "b"], [c], 9, est, unpinned=frozenset({9})) is None
    assert data[("b", c.id)].sets["wall_us"][9] == _share_data(10, odd=0.2)[1][("b", c.id)].sets["wall_us"][9]
    c, data = _share_data(10, odd=0.2)
    for s in range(10):  # now b's calls follow its probe exactly (CPU speed, as on the H200): share 1
        for m in ("wall_us", "host_us"):
            cd = data[("b", c.id)]
            cd.raw[m][s] = {k: 100.0 * (cd.refs[m][s][k] / data[("a", c.id)].refs[m][s][k]) ** 0.8 for k in range(6)}
    assert runner.apply_probe_share(data, ["a", "b"], [c], 9, Sampling(probe_share="estimated")) == pytest.approx(1.0)


def test_probe_share_is_not_carried_beyond_the_probe_differences_it_was_estimated_on():
    """CPU self-check of 2026-12-05, A/A run 9 set 4: the first sets' probes differed by ~1 %, which gave
    no spread to judge a share by (1), then one worker's probe read 1.72x its partner's for a whole set
    while their calls matched, and the full adjustment made that an A/A set ratio of 0.61. The
    difference counts only up to stats.PROBE_SHARE_REACH times the earlier sets' largest."""
    from matrix_runner import runner, stats
    from matrix_runner.config import Sampling

    assert stats.PROBE_SHARE_REACH == 3.0
    odd = math.log(6.41 / 3.73)
    c, data = _share_data(10, odd=odd)
    a, b = data[("a", c.id)], data[("b", c.id)]
    for s in range(9):  # earlier sets: b's calls follow its probe exactly (share 1), offsets up to 3 %
        for m in ("wall_us", "host_us"):
            b.raw[m][s] = {k: 100.0 * (b.refs[m][s][k] / a.refs[m][s][k]) ** 0.8 for k in range(6)}
    ratio = lambda: statistics.median(b.sets["wall_us"][9][k] / a.sets["wall_us"][9][k] for k in range(6))
    assert ratio() == pytest.approx(math.exp(-0.8 * odd), rel=1e-9)  # the full adjustment: 0.648
    assert runner.apply_probe_share(data, ["a", "b"], [c], 9, Sampling(probe_share="estimated")) == pytest.approx(1.0)
    # each env's dm is half the difference (+-odd/2); the earlier sets' largest half-difference 0.015
    assert ratio() == pytest.approx(math.exp(-0.8 * 2 * 3.0 * 0.015), rel=1e-6)  # 0.930: 3x the largest counted
    assert b.speed["wall_us"][9]["held"] == pytest.approx(3.0 * 0.015, abs=1e-5)
    assert a.speed["wall_us"][9]["held"] == pytest.approx(-3.0 * 0.015, abs=1e-5)
    # within the reach nothing is held and a share of 1 leaves the values as they were
    c, data = _share_data(10, odd=0.04)
    for s in range(10):
        for m in ("wall_us", "host_us"):
            cd = data[("b", c.id)]
            cd.raw[m][s] = {k: 100.0 * (cd.refs[m][s][k] / data[("a", c.id)].refs[m][s][k]) ** 0.8 for k in range(6)}
    before = dict(data[("b", c.id)].sets["wall_us"][9])
    assert runner.apply_probe_share(data, ["a", "b"], [c], 9, Sampling(probe_share="estimated")) == pytest.approx(1.0)
    after = data[("b", c.id)].sets["wall_us"][9]
    assert after == pytest.approx(before, rel=1e-9) and "held" not in data[("b", c.id)].speed["wall_us"][9]


def test_probe_share_shifts_each_cycle_by_the_slope_it_was_adjusted_with():
    """A --resume starts its slopes afresh, so its first cycles ran unadjusted (slope 0): those get no
    shift (review: the set's last slope had been applied to every cycle)."""
    from matrix_runner import runner
    from matrix_runner.config import Sampling

    c, data = _share_data(10, odd=0.2)
    b = data[("b", c.id)]
    b.sets["wall_us"][9][0] = b.raw["wall_us"][9][0]  # cycle 0 of the last set ran with slope 0
    data[("a", c.id)].sets["wall_us"][9][0] = data[("a", c.id)].raw["wall_us"][9][0]
    for cd in data.values():
        cd.cycle_beta["wall_us"][9] = {k: (0.0 if k == 0 else 0.8) for k in range(6)}
    runner.apply_probe_share(data, ["a", "b"], [c], 9, Sampling(probe_share="estimated"))
    a = data[("a", c.id)]
    assert b.sets["wall_us"][9][0] / a.sets["wall_us"][9][0] == pytest.approx(1.0)  # plain, and left plain
    assert b.sets["wall_us"][9][3] / a.sets["wall_us"][9][3] == pytest.approx(1.0)  # adjusted, then shifted back


def test_a_burst_holds_at_least_min_samples_and_the_driver_asks_for_them_only_when_set():
    """Sampling.min_burst_samples: a burst of long calls runs on until it holds that many samples
    (H200 burst trace: a 5 ms burst held 1-2 samples of a 3 ms call, so one stall was its value)."""
    import random
    import threading

    from matrix_runner import runner
    from matrix_runner.config import Sampling

    slow = _fake_bench(0.004)  # 4 ms per call, a 1 ms burst
    assert len(worker.Bench.wall_samples(slow, 1, 0.001)) == 1  # as before: one sample
    t0 = time.perf_counter()
    s = worker.Bench.wall_samples(slow, 1, 0.001, min_samples=5)
    assert len(s) == 5 and min(s) > 3500 and time.perf_counter() - t0 >= 0.02
    assert len(worker.Bench.host_samples(slow, 1, 0.001, None, 3)) == 3
    refs: list = []
    assert len(worker.Bench.wall_samples(slow, 1, 0.001, refs, 4)) == 4 and len(refs) == 5
    # a short call's burst is bounded by its time as before, not by the minimum
    fast = worker.Bench.wall_samples(_fake_bench(0.0003), 2, 0.01, None, 3)
    assert len(fast) >= 3

    seen = []

    class Rec(_BurstWorker):
        def request(self, cmd, timeout):
            seen.append(cmd)
            return super().request(cmd, timeout)

    for k, want in ((1, None), (5, 5)):
        seen.clear()
        cases, data = _cycle_data({"x": 0.01}, sets=0)
        runner._cycles(SimpleNamespace(sid=0, label_of={"a": "a", "b": "b"}), {"a": Rec(0.5), "b": Rec(0.5)}, cases,
                       data, Sampling(set_seconds=0.02, speed_adjust=False, min_burst_samples=k), quick=False,
                       case_timeout=5, stop=threading.Event(), rng=random.Random(0), on_progress=lambda m: None,
                       fault=None, labels=["a", "b"], slopes={})
        assert seen and all(c.get("min_samples") == want for c in seen)  # 1: the command as before
