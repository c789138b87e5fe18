"""Can a pinned timing process stay at the CPU's fast level by moving to a core that is fast now?
(issue #10 diagnostic; run on the GPU machine, nothing else running)

On the H200 machine each vCPU switches by itself between two speeds (probe ~3.3 µs or ~6.5 µs:
benchmarks/cpu_map.py, benchmarks/results/h200-cpu-map-12-04.txt); at a given moment some vCPUs are
at one level and some at the other, and on one vCPU the level persists for a while (committed lockstep
runs: a cycle slow now is slow 0.5 s later with p 0.73, a fast one with p 0.36). This runs, at the same
time for ``--seconds``:

* scouts: one process on each candidate CPU, probing for ``--scout-ms`` every ``--scout-every-ms`` and
  writing its latest median probe µs to shared memory (a scout sleeps while the hopper is on its CPU);
* the hopper: back-to-back turns of ``--turn-ms`` of probes; after a turn whose median is above
  ``--slow-us`` it moves to the candidate CPU whose scout read fastest most recently (if that one read
  below ``--slow-us``);
* the stayer: the same turns on one fixed CPU outside the candidates, never moving.

Prints for both: turns, share of turns at the fast level, median probe µs, and for the hopper the number
of moves and the share of fast turns in the first turn after a move. ``--json`` writes the turn series.
Usage: python benchmarks/core_hop.py [--seconds 30] [--stay-cpu 15] [--cpus 1-14]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner.worker import speed_probe  # noqa: E402


def turn(ms: float) -> float:
    end, out = time.perf_counter() + ms / 1e3, []
    while time.perf_counter() < end:
        out.append(speed_probe())
    return statistics.median(out)


def scout(i: int, cpu: int, latest, where, stop, ms: float, every_ms: float) -> None:
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        t0 = time.perf_counter()
        if where.value != cpu:
            latest[i] = turn(ms)
        time.sleep(max(0.0, every_ms / 1e3 - (time.perf_counter() - t0)))


def stayer(cpu: int, seconds: float, turn_ms: float, q) -> None:
    os.sched_setaffinity(0, {cpu})
    end, out = time.perf_counter() + seconds, []
    while time.perf_counter() < end:
        out.append(round(turn(turn_ms), 3))
    q.put(out)


def summary(name: str, xs: list, slow: float) -> dict:
    fast = sum(x <= slow for x in xs) / len(xs) if xs else float("nan")
    print(f"{name}: {len(xs)} turns, fast share {fast:.2f}, median {statistics.median(xs):.2f} µs")
    return {"turns": len(xs), "fast_share": round(fast, 3), "median_us": statistics.median(xs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--turn-ms", type=float, default=12.0, help="one turn of probes (ms): ~ a lockstep cycle")
    ap.add_argument("--scout-ms", type=float, default=1.0)
    ap.add_argument("--scout-every-ms", type=float, default=25.0)
    ap.add_argument("--slow-us", type=float, default=5.0)
    ap.add_argument("--stay-cpu", type=int, default=15)
    ap.add_argument("--cpus", default="1-14", help="candidate CPUs of the hopper (a-b or comma list)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if "-" in a.cpus:
        lo, hi = (int(v) for v in a.cpus.split("-"))
        cands = list(range(lo, hi + 1))
    else:
        cands = [int(v) for v in a.cpus.split(",")]
    ctx = mp.get_context("fork")
    latest = ctx.Array("d", [0.0] * len(cands), lock=False)
    where, stop = ctx.Value("i", cands[0], lock=False), ctx.Event()
    scouts = [ctx.Process(target=scout, args=(i, c, latest, where, stop, a.scout_ms, a.scout_every_ms), daemon=True)
              for i, c in enumerate(cands)]
    for p in scouts:
        p.start()
    time.sleep(0.3)
    q = ctx.Queue()
    st = ctx.Process(target=stayer, args=(a.stay_cpu, a.seconds, a.turn_ms, q))
    st.start()
    os.sched_setaffinity(0, {cands[0]})
    hop, moves, after_move, moved = [], [], [], False
    end = time.perf_counter() + a.seconds
    while time.perf_counter() < end:
        v = turn(a.turn_ms)
        hop.append(round(v, 3))
        if moved:
            after_move.append(v)
            moved = False
        if v > a.slow_us:
            best = min(((latest[i], c) for i, c in enumerate(cands) if c != where.value and latest[i] > 0),
                       default=(float("inf"), None))
            if best[0] <= a.slow_us:
                where.value = best[1]
                os.sched_setaffinity(0, {best[1]})
                moves.append([len(hop), best[1], round(best[0], 3)])
                moved = True
    stay = q.get(timeout=30)
    st.join()
    stop.set()
    for p in scouts:
        p.join(timeout=5)
    out = {"args": vars(a), "candidates": cands}
    out["hopper"] = summary("hopper", hop, a.slow_us)
    out["stayer"] = summary(f"stayer (CPU {a.stay_cpu})", stay, a.slow_us)
    am = sum(x <= a.slow_us for x in after_move) / len(after_move) if after_move else float("nan")
    print(f"hopper: {len(moves)} moves ({len(moves) / a.seconds:.1f}/s); first turn after a move fast in {am:.2f}")
    out["moves"], out["after_move_fast"] = len(moves), am
    if a.json:
        out.update(hop_series=hop, stay_series=stay, move_log=moves)
        Path(a.json).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
