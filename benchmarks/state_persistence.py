"""How long does a pinned vCPU stay at one speed? (issue #10 diagnostic, offline, on committed runs)

For every process set of the committed H200 runs created on a given day (default 2026-12-04; not
those with ``sampling.cpu_hop``, whose sets moved between CPUs), the
set's cycles in time order (cycle ids count up within a set) with each cycle called slow where both
bursts' speed-probe readings (``ref_by_set``, µs) exceed ``--slow-us`` (5 µs: the H200 vCPU reads
~3.3 or 6-9 µs). For lags of 0.05-2 s (cycles of the set's own mean duration: its cycles' seconds
over their number) it prints P(slow later | slow now) and P(slow later | fast now) on the same CPU.
Usage: python benchmarks/state_persistence.py [--day 2026-12-04] [--slow-us 5]
"""
import argparse
import collections
import glob
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--day", default="2026-12-04")
    ap.add_argument("--slow-us", type=float, default=5.0)
    ap.add_argument("--reports", default=str(Path(__file__).resolve().parents[1] / "reports"))
    a = ap.parse_args()
    seqs, runs = [], 0
    for d in sorted(glob.glob(f"{a.reports}/h200-*/")):
        try:
            doc = results.load(results.find(d))
        except Exception:  # noqa: BLE001 - runs of other schemas
            continue
        if not str(doc.get("created", "")).startswith(a.day) or (doc.get("settings") or {}).get("cpu_hop"):
            continue  # another day, or sets that moved between CPUs (sampling.cpu_hop)
        runs += 1
        sets = {s["set"]: s for s in doc.get("sets", [])}
        per = collections.defaultdict(dict)
        for c in doc["cases"]:
            for sid, cyc in ((c.get("metrics") or {}).get("wall_us", {}).get("ref_by_set") or {}).items():
                for cid, v in cyc.items():
                    per[int(sid)].setdefault(int(cid), []).append(v)
        for sid, cyc in per.items():
            s = sets.get(sid, {})
            n, sec = s.get("cycles"), (s.get("phase_s") or {}).get("cycles")
            if not n or not sec:
                continue
            seqs.append((1000 * sec / n, {cid: all(x > a.slow_us for x in v) for cid, v in cyc.items() if len(v) >= 2}))
    print(f"{runs} runs of {a.day}, {len(seqs)} process sets, ms per cycle median "
          f"{statistics.median(m for m, _ in seqs):.1f}")
    for lag_s in (0.05, 0.1, 0.2, 0.5, 1.0, 2.0):
        ss = sf = ns = nf = 0
        for ms, seq in seqs:
            k = max(1, round(lag_s * 1000 / ms))
            for cid, slow in seq.items():
                later = seq.get(cid + k)
                if later is None:
                    continue
                if slow:
                    ns, ss = ns + 1, ss + later
                else:
                    nf, sf = nf + 1, sf + later
        print(f"lag {lag_s:4.2f} s: P(slow later | slow now) {ss / ns:.2f} (n {ns}), "
              f"P(slow later | fast now) {sf / nf:.2f} (n {nf})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
