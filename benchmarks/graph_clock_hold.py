"""Does the CUDA-graph clock's slow mode come from the host's launch inside the events? (GPU machine)

The graph clock (worker.Bench.graph) times ``g.replay()`` between two CUDA events. Without a hold,
the start event runs on an idle stream at once, so the host's launch of the replay lies inside the
events; a worker process whose host is slow then reads a slow graph clock (H200, batch 2: 89 of
1,260 set medians 1.5-5.9x the kernel time, benchmarks/graph_clock_modes.py). With the hold the
stream spins on the GPU (``torch.cuda._sleep``) while the host submits, so only the GPU's work is
timed. This script measures both in the same processes, alternating, next to the kernel time from
the profiler (taken last: a profiler session slows later calls in its process).

Driver (no flash-attn needed here; each version's site dir holds its flash_attn):
    python benchmarks/graph_clock_hold.py --site 2.6.3=/tmp/fa263 --site 2.7.0.post2=/tmp/fa270 \\
        --procs 10 --cpus 3,8,14 --out graph-hold.json
spawns ``--procs`` fresh processes per version, one after another, each pinned to the next core of
``--cpus``, and prints per (version, case): per process the median µs per call of the graph clock
without hold, with hold, and the kernel time; how many processes read above 1.5x the kernel time
in each mode; the host launch time and the hold. All times µs per call.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

CASES = [("fwd", 2, 50), ("fwd", 2, 150), ("bwd", 2, 50), ("bwd", 2, 150), ("fwd", 512, 150)]


def _case(op, b, s):
    return {"id": f"{op}-b{b}-s{s}", "op": op, "batch": b, "seqlen_q": s, "seqlen_k": s, "nheads": 16, "nheads_k": 16,
            "head_dim": 16, "dtype": "fp16", "causal": False, "dropout_p": 0.0, "softmax_scale": 0.25, "layout": "embed"}


def child(rounds: int) -> dict:
    """One process: per case, ``rounds`` alternated graph clocks without and with the hold, then the
    kernel time of every case (profiler last)."""
    spec = importlib.util.spec_from_file_location("mr_worker", Path(__file__).resolve().parents[1] / "matrix_runner" / "worker.py")
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    import flash_attn

    out = {"flash_attn": flash_attn.__version__, "cpu": sorted(os.sched_getaffinity(0)), "cases": {}}
    benches = {}
    for op, b, s in CASES:
        c = _case(op, b, s)
        bench = worker.Bench(c, "cuda", 0)
        per = bench.warmup(0.05)
        # inner as the graph clock chose it when this ran (2026-12-03): from the warm-up's wall time
        # per call (it now comes from the GPU time: worker.graph_inner)
        inner = max(1, min(64, math.ceil(worker.TARGET_SAMPLE_US / max(per, 1e-3))))
        r = {"per_call_us": per, "hold0": [], "hold": [], "hold_us": [], "launch_us": [], "dropped": 0}
        for i in range(rounds):
            for mode in (("hold0", "hold") if i % 2 == 0 else ("hold", "hold0")):
                g = bench.graph(worker.BUDGETS["graph"], hold_us=0.0 if mode == "hold0" else None, inner=inner)
                r[mode].append(statistics.median(g["samples"]))
                if mode == "hold":
                    r["hold_us"].append(g["hold_us"])
                    r["launch_us"].append(g["launch_us"])
                    r["dropped"] += g["dropped"]
        out["cases"][c["id"]] = r
        benches[c["id"]] = bench
    for cid, bench in benches.items():
        out["cases"][cid]["kernel_us"] = statistics.median(bench.device(8)["samples"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--site", action="append", default=[], help="LABEL=DIR: a site dir holding that version's flash_attn")
    ap.add_argument("--procs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--cpus", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.rounds)))
        return 0
    cpus = [int(x) for x in a.cpus.split(",") if x.strip()]
    runs: dict = {}
    k = 0
    for p in range(a.procs):
        for site in a.site:
            label, path = site.split("=", 1)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, os.environ.get("PYTHONPATH", "")]))
            cmd = [sys.executable, __file__, "--child", "--rounds", str(a.rounds)]
            if cpus:
                cmd = ["taskset", "-c", str(cpus[k % len(cpus)]), *cmd]
            k += 1
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                print(f"{label} process {p}: exit {r.returncode}: {r.stderr[-800:]}", file=sys.stderr)
                continue
            runs.setdefault(label, []).append(json.loads(r.stdout.strip().splitlines()[-1]))
    if a.out:
        Path(a.out).write_text(json.dumps(runs))
    summarize(runs)
    return 0


def summarize(runs: dict) -> None:
    """Per (version, case): processes above 1.5x the kernel time without / with the hold, and the
    medians over processes (µs per call)."""
    print(f"{'version':<13}{'case':<13}{'procs':>6}{'kernel':>8}{'no hold':>9}{'hold':>8}{'>1.5x no hold':>15}"
          f"{'>1.5x hold':>12}{'max no hold':>13}{'max hold':>10}{'launch':>8}{'hold_us':>9}{'dropped':>9}")
    for label, procs in runs.items():
        for cid in procs[0]["cases"]:
            rows = [p["cases"][cid] for p in procs if cid in p["cases"]]
            ker = [r["kernel_us"] for r in rows]
            h0 = [statistics.median(r["hold0"]) for r in rows]
            h1 = [statistics.median(r["hold"]) for r in rows]
            slow0 = sum(x > 1.5 * k for x, k in zip(h0, ker))
            slow1 = sum(x > 1.5 * k for x, k in zip(h1, ker))
            print(f"{label:<13}{cid:<13}{len(rows):>6}{statistics.median(ker):>8.2f}{statistics.median(h0):>9.2f}"
                  f"{statistics.median(h1):>8.2f}{slow0:>15}{slow1:>12}{max(h0):>13.2f}{max(h1):>10.2f}"
                  f"{statistics.median([statistics.median(r['launch_us']) for r in rows]):>8.1f}"
                  f"{statistics.median([statistics.median(r['hold_us']) for r in rows]):>9.0f}"
                  f"{sum(r['dropped'] for r in rows):>9}")


if __name__ == "__main__":
    sys.exit(main())
