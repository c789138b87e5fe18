"""Why the CUDA-graph clock of the batch-2 cases stays "ambiguous" in the committed H200 runs: per
(process set, env) graph median against the case's kernel time (profiler, median over sets), and
whether the outlying processes share a set (a set-level cause: the machine at that moment) or not
(a per-process one). Offline, on results.json files; prints one line per case group and the
outlying (set, env) pairs of each run.

What it showed (2026-12-03, benchmarks/results/graph-clock-modes-12-03.txt): in the 1.0 s runs of
that day, 89 of 1,260 batch-2 (set, env) graph medians sat above 1.5x the kernel time (e.g. fwd
B2 S50: kernel 5.2 µs, graph 5.1-6.5 µs in most processes, 10.9-16.5 µs in some), none of the 774
batch-512 ones above 1.05x; the slow process of a set is one env's, not both (per process, not
per set: 87 of 88 outlying (set, case) pairs). worker.Bench.graph times ``inner`` replayed calls
between two CUDA events recorded around ``g.replay()``, with ``inner`` from the wall time per
call (~20 for a 50 µs call): whatever delays the GPU's start of the replay after the first event
(the launch, a busy GPU) is divided by ``inner`` only. Not yet measured on the H200: whether a
GPU-side wait before the first event (so the replay is queued before the clock starts) removes the
slow mode.

Measured since (H200, 2026-12-03 evening, 20 runs with the GPU-side hold of worker.Bench.graph,
benchmarks/results/h200-runs-12-03-r4.txt): 0 of 2,486 batch-2 set medians above 1.5x; what
remained followed inner, the calls per replay (printed per bucket), which came from the host's
speed; it comes from the GPU time since (worker.graph_inner): in the 13 runs of that night
(benchmarks/results/h200-runs-12-03-m4.txt) every graph comparison was "same" and each batch-2
case's set medians lay within +-1 % of one another (inner 64 everywhere).

Usage: python benchmarks/graph_clock_modes.py RUN_DIR ...   (default: the 1.0 s runs of 2026-12-03)
"""
from __future__ import annotations

import glob
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = (sorted(glob.glob(str(ROOT / "reports" / "h200-aa-4[0-5]")))
           + sorted(glob.glob(str(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-03-s10-*"))))


def main(argv: list[str]) -> int:
    dirs = argv or DEFAULT
    tot = {"b2": [0, 0], "b512": [0, 0]}
    both = single = 0
    docs = []
    for d in dirs:
        r = results.load(d)
        docs.append(r)
        slow_by_case: dict = {}
        for c in r["cases"]:
            m = c.get("metrics") or {}
            g = (m.get("graph_us") or {}).get("by_set") or {}
            dv = (m.get("device_us") or {}).get("by_set") or {}
            if not g or not dv:
                continue
            kern = float(np.median([np.median(v) for v in dv.values()]))
            small = c.get("batch") == 2
            cut = 1.5 if small else 1.05
            grp = tot["b2" if small else "b512"]
            for s, v in g.items():
                med = float(np.median(v))
                grp[0] += 1
                if med > cut * kern:
                    grp[1] += 1
                    slow_by_case.setdefault(c["id"], {}).setdefault(s, []).append((c["env"], round(med, 1), round(kern, 1)))
        print(f"{Path(d).name}:")
        for cid, sets in slow_by_case.items():
            for s, xs in sorted(sets.items(), key=lambda kv: int(kv[0])):
                both += len(xs) > 1
                single += len(xs) == 1
                print(f"  {cid[:28]:28} set {s:>2}: " + ", ".join(f"{e} {m} µs (kernel {k})" for e, m, k in xs))
    print(f"\nbatch 2: {tot['b2'][1]} of {tot['b2'][0]} (set, env) graph medians above 1.5x the kernel time;"
          f" batch 512: {tot['b512'][1]} of {tot['b512'][0]} above 1.05x")
    print(f"outlying (set, case) with one env slow: {single}; with both: {both}")
    by_inner(docs)
    return 0


def _bucket(inner: int) -> str:
    return "1" if inner == 1 else "2-5" if inner <= 5 else "6-15" if inner <= 15 else "16+"


def by_inner(docs: list) -> None:
    """Runs (their results, results.load) that record each set's graph ``inner`` (calls per replay; results of 2026-12-03 evening
    on, CaseData.inner["graph_us"]): the batch-2 set medians over the kernel time per inner bucket.
    A replay's own GPU cost is divided by inner, so where inner follows the host (it came from the
    warm-up's wall time per call until worker.graph_inner), the graph clock does too."""
    rows: dict = {}
    for doc in docs:
        for c in doc["cases"]:
            m = c.get("metrics") or {}
            g = (m.get("graph_us") or {}).get("by_set") or {}
            dv = (m.get("device_us") or {}).get("by_set") or {}
            gi = (c.get("inner") or {}).get("graph_us")
            if c.get("batch") != 2 or not g or not dv or not isinstance(gi, dict):
                continue
            kern = float(np.median([np.median(v) for v in dv.values()]))
            for s, v in g.items():
                if s in gi and gi[s].get("inner"):
                    key = (f"{c['op']} S{c.get('seqlen_q')}", _bucket(int(gi[s]["inner"])))
                    rows.setdefault(key, []).append(float(np.median(v)) / kern)
    if not rows:
        return
    print("\nbatch-2 graph set medians / kernel time, by calls per replay (inner): n, median [min, max]")
    for case in sorted({k[0] for k in rows}):
        cells = [f"inner {b}: {len(v)}, {np.median(v):.3f} [{min(v):.3f}, {max(v):.3f}]"
                 for b in ("1", "2-5", "6-15", "16+") if (v := rows.get((case, b)))]
        print(f"  {case:9} " + "; ".join(cells))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
