"""Which vCPUs slow which? A pairwise interference map of this machine's CPUs (issue #10 diagnostic;
run on the GPU machine, nothing else running).

On the H200 machine (a KVM guest) the CPU-speed probe (worker.speed_probe) of a pinned worker reads
two levels, ~3.6 µs and ~7.5 µs, and the kernel's topology shows no hyperthread siblings, yet a busy
process on *some* other vCPUs halves a pinned vCPU's speed (benchmarks/cpu_contention.py). If those
pairs are fixed, a run can keep its own busy work (the driver, the next set's workers importing
torch) off the timing core's partner. This measures:

1. ``idle`` scan: every allowed CPU in turn, ``--scan-ms`` of back-to-back probes each, for
   ``--scan-s`` seconds in all: the median probe µs per CPU and the share of readings at the slow
   level (> ``--slow-us``), with nothing of ours busy — is the slow level there without us?
2. ``map``: for every CPU X and every other CPU Y, the probe on X while one process spins on Y,
   divided by the probe on X alone just before (``--reps`` times each pair, in random order; the
   median ratio is printed). Spinner processes, one pinned to each CPU, wait until told to spin.
3. the ``idle`` scan again.

Prints the ratio matrix (rows X, columns Y), the pairs whose median ratio exceeds ``--pair-ratio``
(1.4 by default), whether the relation is symmetric, and writes everything as JSON (``--json``).
Usage: python benchmarks/cpu_map.py [--reps 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner.worker import speed_probe  # noqa: E402


def probes(x: int, seconds: float) -> list[float]:
    """Back-to-back probe readings (µs) on CPU ``x`` for ``seconds``."""
    os.sched_setaffinity(0, {x})
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        out.append(speed_probe())
    return out


def spinner(cpu: int, target, stop) -> None:
    """Pinned to ``cpu``: busy-spins while ``target.value == cpu``, otherwise sleeps 2 ms at a time."""
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        if target.value == cpu:
            t = time.perf_counter()
            while target.value == cpu and time.perf_counter() - t < 2.0:
                pass
        else:
            time.sleep(0.002)


def scan(cpus: list[int], total_s: float, each_ms: float, slow_us: float) -> dict:
    per: dict = {c: [] for c in cpus}
    end = time.perf_counter() + total_s
    while time.perf_counter() < end:
        for c in cpus:
            per[c].extend(probes(c, each_ms / 1e3))
    return {c: {"median_us": round(statistics.median(v), 3), "slow_share": round(sum(r > slow_us for r in v) / len(v), 3),
                "n": len(v)} for c, v in per.items() if v}


def show_scan(name: str, res: dict) -> None:
    print(f"{name}: CPU median µs (slow share)")
    print("  " + "  ".join(f"{c}:{r['median_us']:.2f}({r['slow_share']:.2f})" for c, r in res.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--probe-ms", type=float, default=80.0, help="probe time with the spinner on (ms)")
    ap.add_argument("--alone-ms", type=float, default=40.0, help="probe time alone before it (ms)")
    ap.add_argument("--scan-s", type=float, default=6.0)
    ap.add_argument("--scan-ms", type=float, default=50.0)
    ap.add_argument("--slow-us", type=float, default=5.0, help="a reading above this is the slow level (µs)")
    ap.add_argument("--pair-ratio", type=float, default=1.4)
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    topo = {}
    for c in cpus:
        try:
            topo[c] = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            topo[c] = "?"
    print("CPUs:", cpus)
    print("kernel topology (thread_siblings_list):", topo)
    out: dict = {"cpus": cpus, "topology": topo, "args": vars(a)}
    t0 = time.time()
    out["scan_before"] = scan(cpus, a.scan_s, a.scan_ms, a.slow_us)
    show_scan("idle scan before", out["scan_before"])

    ctx = mp.get_context("fork")
    target, stop = ctx.Value("i", -1, lock=False), ctx.Event()
    procs = [ctx.Process(target=spinner, args=(c, target, stop), daemon=True) for c in cpus]
    for p in procs:
        p.start()
    time.sleep(0.3)
    pairs = [(x, y) for x in cpus for y in cpus if x != y] * a.reps
    random.Random(a.seed).shuffle(pairs)
    ratios: dict = {}
    raw = []
    try:
        for x, y in pairs:
            target.value = -1
            alone = statistics.median(probes(x, a.alone_ms / 1e3))
            target.value = y
            time.sleep(0.005)
            busy = statistics.median(probes(x, a.probe_ms / 1e3))
            target.value = -1
            ratios.setdefault((x, y), []).append(busy / alone)
            raw.append([x, y, round(alone, 3), round(busy, 3)])
    finally:
        stop.set()
        target.value = -1
        for p in procs:
            p.join(timeout=5)
    med = {k: statistics.median(v) for k, v in ratios.items()}
    out["map_median_ratio"] = {f"{x},{y}": round(v, 3) for (x, y), v in med.items()}
    out["map_raw"] = raw
    print(f"\nmap: probe on X (row) with a spinner on Y (column) / alone, median of {a.reps}")
    print("   X\\Y " + " ".join(f"{y:>5}" for y in cpus))
    for x in cpus:
        print(f"  {x:>4} " + " ".join("    -" if x == y else f"{med[(x, y)]:5.2f}" for y in cpus))
    hot = sorted((x, y) for (x, y), v in med.items() if v > a.pair_ratio)
    print(f"\npairs X<-Y with ratio > {a.pair_ratio}: {hot}")
    partners = {x: [y for (xx, y) in hot if xx == x] for x in cpus}
    print("partners per CPU:", partners)
    sym = all((y, x) in hot for (x, y) in hot)
    print("symmetric:", sym)
    out["partners"] = partners
    out["symmetric"] = sym
    out["scan_after"] = scan(cpus, a.scan_s, a.scan_ms, a.slow_us)
    show_scan("idle scan after", out["scan_after"])
    out["seconds"] = round(time.time() - t0, 1)
    print(f"took {out['seconds']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
