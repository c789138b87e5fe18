"""Process-to-process spread of one host-bound call, with and without CPU pinning (GPU machine).

Starts N fresh processes per condition, alternating conditions (unpinned, pinned to one core with
``os.sched_setaffinity``), each timing flash_attn_func at batch 2, seqlen 50, 16 heads, head_dim 16
(fp16, the seed workload) with matrix-run's own wall clock (worker.Bench.wall_samples), and prints each
process's median and the spread (max/min) per condition. µs per synchronized call.

Usage: python benchmarks/process_modes.py ENV_PYTHON [N] [CORE]
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import importlib.util, json, os, statistics, sys
pin = int(sys.argv[2])
if pin >= 0:
    os.sched_setaffinity(0, {pin})
spec = importlib.util.spec_from_file_location("w", sys.argv[1]); w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
case = {"id": "x", "op": "fwd", "batch": 2, "seqlen_q": 50, "seqlen_k": 50, "nheads": 16, "nheads_k": 16, "head_dim": 16,
        "dtype": "fp16", "causal": False, "dropout_p": 0.0, "softmax_scale": 0.25, "layout": "embed"}
b = w.Bench(case, "cuda", 0)
per = b.warmup(0.1)
print(json.dumps({"wall": statistics.median(b.wall_samples(max(1, round(1000 / per)), 0.3)), "host": statistics.median(b.host_samples(max(1, round(1000 / per)), 0.1)),
                  "cpu": os.sched_getaffinity(0).__len__()}))
"""


def main() -> int:
    py = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    core = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    worker = str(Path(__file__).resolve().parents[1] / "matrix_runner" / "worker.py")
    res = {"unpinned": [], f"pinned to core {core}": []}
    for i in range(n):
        for cond, pin in (("unpinned", -1), (f"pinned to core {core}", core)):
            cp = subprocess.run([py, "-c", CHILD, worker, str(pin)], capture_output=True, text=True, timeout=120)
            try:
                res[cond].append(json.loads(cp.stdout.strip().splitlines()[-1]))
            except Exception:  # noqa: BLE001
                print(f"{cond} process {i} failed: {cp.stderr[-500:]}", file=sys.stderr)
    for cond, rows in res.items():
        walls = [r["wall"] for r in rows]
        if walls:
            print(f"{cond:<20} wall per process: {', '.join(f'{x:.1f}' for x in walls)}  median {statistics.median(walls):.1f}"
                  f"  max/min {max(walls) / min(walls):.2f}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
