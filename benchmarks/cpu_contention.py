"""What slows a pinned worker's CPU? (issue #10 diagnostic; run on the GPU machine)

On the H200 machine the CPU-speed probe (worker.speed_probe) of co-pinned lockstep workers reads
two levels, ~3.6 µs and ~7.5 µs, switching every ~0.1-1 s, and the slow level is most common in a
set's first second (when the next set's workers import torch on spare cores). This measures, for a
probe process pinned to CPU X (µs, median of ~0.3 s of back-to-back probes):

1. X alone (nothing else of ours running);
2. X with one busy-spinning process pinned to each other CPU Y in turn: a Y that doubles X's time
   shares X's physical core (a hyperthread sibling);
3. X with N spinners on the CPUs that are not X's siblings (N = 1, 3, 7, 11): an all-core turbo
   effect grows with N;
4. X with N processes importing torch (what a set's prefetch does) on non-sibling CPUs.

Also prints the kernel's topology (thread_siblings_list) for comparison.
Usage: python benchmarks/cpu_contention.py [X ...]   (default: 3 and 11)
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner.worker import speed_probe  # noqa: E402

SPIN = "import os,sys,time\nos.sched_setaffinity(0,{int(sys.argv[1])})\nt=time.time()+float(sys.argv[2])\nwhile time.time()<t: pass\n"
IMPORT = "import os,sys\nos.sched_setaffinity(0,{int(sys.argv[1])})\nimport torch\n"


def probe_on(x: int, seconds: float = 0.3) -> float:
    os.sched_setaffinity(0, {x})
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        out.append(speed_probe())
    return statistics.median(out)


def with_procs(code: str, cpus: list[int], x: int, seconds: float = 0.3, *args: str) -> float:
    ps = [subprocess.Popen([sys.executable, "-c", code, str(c), *args]) for c in cpus]
    time.sleep(0.15)
    v = probe_on(x, seconds)
    for p in ps:
        p.kill() if code == SPIN else None
    for p in ps:
        p.wait()
    return v


def siblings(x: int) -> str:
    try:
        return Path(f"/sys/devices/system/cpu/cpu{x}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return "?"


def main() -> int:
    xs = [int(a) for a in sys.argv[1:]] or [3, 11]
    allowed = sorted(os.sched_getaffinity(0))
    print("topology (thread_siblings_list):", {c: siblings(c) for c in allowed})
    for x in xs:
        alone = [probe_on(x) for _ in range(3)]
        print(f"CPU {x}: alone {', '.join(f'{v:.2f}' for v in alone)} µs")
        per = {}
        for y in allowed:
            if y != x:
                per[y] = with_procs(SPIN, [y], x, 0.3, "0.6")
        base = statistics.median(alone)
        print("  one spinner on Y: " + " ".join(f"{y}:{v / base:.2f}" for y, v in per.items()))
        sib = [y for y, v in per.items() if v / base > 1.4]
        print(f"  CPUs that slow {x} by > 1.4x: {sib} (kernel says siblings {siblings(x)})")
        rest = [y for y in allowed if y != x and y not in sib]
        for n in (1, 3, 7, 11):
            if n <= len(rest):
                v = with_procs(SPIN, rest[:n], x, 0.4, "0.8")
                print(f"  {n:2d} spinners on non-sibling CPUs: {v:.2f} µs ({v / base:.2f}x)")
        for n in (2, 4):
            if n <= len(rest):
                t0 = time.perf_counter()
                ps = [subprocess.Popen([sys.executable, "-c", IMPORT, str(c)]) for c in rest[:n]]
                time.sleep(0.2)
                v = probe_on(x, 0.5)
                for p in ps:
                    p.wait()
                print(f"  {n} torch imports on non-sibling CPUs: {v:.2f} µs ({v / base:.2f}x; imports took "
                      f"{time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
