"""The worker's sampling loops, with a fake call (no torch needed): calibration and sample counts."""
import time
from types import SimpleNamespace

from matrix_runner import worker


def _fake(first_s: float, per_call_s: float):
    state = {"n": 0}

    def call():
        state["n"] += 1
        end = time.perf_counter() + (first_s if state["n"] == 1 else per_call_s)
        while time.perf_counter() < end:
            pass

    return SimpleNamespace(call=call, sync=lambda: None, _plan=lambda us: worker.Bench._plan(None, us)), state


def test_warmup_calibrates_on_steady_calls_not_the_slow_first_one():
    # a first call 100x slower than the rest (lazy init, a custom op's first dispatch) used to
    # calibrate inner=1 and leave 5 samples per case (seen on the H200 and on CPU)
    b, _ = _fake(first_s=0.03, per_call_s=0.0003)
    per_call = worker.Bench.warmup(b, 0.02)
    assert 250 < per_call < 600, per_call  # µs, the steady cost, not the first call's 30 ms
    inner = worker.Bench._plan(None, per_call)
    assert 2 <= inner <= 4  # samples of ~1 ms
    w = worker.Bench.wall(b, per_call, 0.06)
    assert w["inner"] == inner
    assert len(w["samples"]) >= 30
    assert all(250 < s < 900 for s in w["samples"][1:])


def test_sampling_loops_are_bounded_by_time_even_when_calibration_was_wrong():
    b, _ = _fake(first_s=0.0, per_call_s=0.002)
    t0 = time.perf_counter()
    w = worker.Bench.wall(b, 20.0, 0.05)  # told 20 µs per call, it takes 2000: inner 50 -> 100 ms a sample
    took = time.perf_counter() - t0
    assert len(w["samples"]) == worker.MIN_SAMPLES  # at least MIN_SAMPLES even past the budget
    assert took < 5 * 0.11 + 0.2
    h = worker.Bench.host(b, 1000.0, 0.03)
    assert 10 <= len(h["samples"]) <= 16  # inner 1, 2 ms a call, 30 ms budget
    assert all(1800 < s < 2600 for s in h["samples"])


def test_groups_bound_the_memory_of_cases_sampled_in_turns():
    def case(op, b, s, h=16, d=64):
        return {"op": op, "batch": b, "seqlen_q": s, "seqlen_k": s, "nheads": h, "nheads_k": h, "head_dim": d}

    small = [case("fwd", 2, 128), case("bwd", 2, 128), case("fwd", 4, 256)]
    big = case("bwd", 64, 8192)  # one set: 64*8192*16*64*3*2 B = 3 GiB, x4 for bwd
    assert worker._case_bytes(small[0]) == 100 * 2**20 * 2 and worker._case_bytes(small[1]) == 100 * 2**20 * 4
    assert worker._case_bytes(big) == 64 * 8192 * 16 * 64 * 3 * 2 * 4
    g = worker._groups(small + [big] + small, 4 * 2**30)
    assert [len(x) for x in g] == [3, 1, 3]  # a case over the budget is a group of its own
    assert worker._groups(small, 700 * 2**20) == [small[:2], small[2:]]
    assert worker._groups([], 1) == []
