"""Does the CPU-speed probe explain the per-cycle noise of the wall clock? (issue #10 diagnostic)

Every lockstep burst also times :func:`matrix_runner.worker.speed_probe` (a fixed pure-Python
workload, µs) between its samples; results.json keeps it per cycle (``metrics.wall_us.ref_by_set``).
If the burst-to-burst noise of a host-bound call is the CPU's speed of the moment, the per-cycle log
ratio of the calls (d) follows the per-cycle log ratio of the probes (r), and d - beta * r is
narrower. This prints, per comparison of each run (wall clock, candidate vs baseline):

- per-cycle SD of d, the correlation of d and r, the pooled within-set slope beta of d on r;
- the per-cycle SD of d - beta * r (beta from all sets: the best case), and the share of variance left;
- mean r over all cycles (must be ~0: the probe is the same code in every worker; a nonzero mean
  would move the corrected ratio away from the truth);
- the set-level anytime interval (stats.t_cs, as the run computes it) half-width, raw and corrected
  with beta from *earlier sets only* (what a run could do; the first set uncorrected).

Usage: python benchmarks/speed_probe.py RUN_DIR_OR_RESULTS_JSON...
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import stats  # noqa: E402


def cycles(b: dict, k: dict, rb: dict, rk: dict):
    """Per set: list of (d, r) for the cycles both sides have, with both probes."""
    out = {}
    for sid, bv in b.items():
        kv, rbv, rkv = k.get(sid) or {}, rb.get(sid) or {}, rk.get(sid) or {}
        rows = []
        for cy, x in bv.items():
            y, p, q = kv.get(cy), rbv.get(cy), rkv.get(cy)
            if None in (y, p, q) or min(x, y, p, q) <= 0:
                continue
            rows.append((math.log(y) - math.log(x), math.log(q) - math.log(p)))
        if rows:
            out[sid] = rows
    return out


def pooled_beta(sets: dict) -> float:
    sxy = sxx = 0.0
    for rows in sets.values():
        if len(rows) < 2:
            continue
        d = np.array([r[0] for r in rows])
        r = np.array([r[1] for r in rows])
        sxy += float(((d - d.mean()) * (r - r.mean())).sum())
        sxx += float(((r - r.mean()) ** 2).sum())
    return sxy / sxx if sxx > 0 else 0.0


def trimmed(x):
    x = sorted(x)
    g = int(math.floor(stats.CYCLE_TRIM * len(x)))
    return float(np.mean(x[g:len(x) - g]))


def analyse(path: Path) -> None:
    p = path / "results.json" if path.is_dir() else path
    doc = json.loads(p.read_text())
    labels = [e["label"] for e in doc["envs"] if e.get("status") == "ok"] or [e["label"] for e in doc["envs"]]
    base = labels[0]
    by = {(c["env"], c["id"]): c for c in doc["cases"]}
    ncmp = sum(1 for c in doc["comparisons"] if c["metric"] == "wall_us")
    alpha = stats.FAMILY_ALPHA / max(1, ncmp)
    n_target = doc.get("settings", {}).get("planned_sets") or 8
    c_mix = stats.lai_mixing(int(n_target), alpha)
    print(f"== {p.parent.name}: {len(doc.get('sets', []))} sets, {ncmp} wall comparisons")
    print(f"  {'case':34s} {'cyc':>4s} {'sd d':>6s} {'corr':>5s} {'beta':>5s} {'sd adj':>6s} {'var left':>8s} "
          f"{'mean r':>7s}  {'±raw':>6s} {'±adj':>6s}  {'ratio raw':>9s} {'ratio adj':>9s}")
    for cand in labels[1:]:
        for c in doc["comparisons"]:
            if c["metric"] != "wall_us" or c.get("candidate", cand) != cand:
                continue
            cb, ck = by.get((base, c["case"])), by.get((cand, c["case"]))
            if not cb or not ck:
                continue
            mb, mk = cb["metrics"].get("wall_us") or {}, ck["metrics"].get("wall_us") or {}
            if "ref_by_set" not in mb or "ref_by_set" not in mk:
                print(f"  {c['label']} {c['op']}: no probe readings in this run")
                continue
            sets = cycles(mb["by_set"], mk["by_set"], mb["ref_by_set"], mk["ref_by_set"])
            allrows = [r for rows in sets.values() for r in rows]
            d = np.array([r[0] for r in allrows])
            r = np.array([r[1] for r in allrows])
            beta = pooled_beta(sets)
            # within-set residual SDs (set means removed: what the set value's noise is made of)
            wd = np.concatenate([np.array([x[0] for x in rows]) - np.mean([x[0] for x in rows])
                                 for rows in sets.values() if len(rows) > 1])
            wa = np.concatenate([np.array([x[0] - beta * x[1] for x in rows]) - np.mean([x[0] - beta * x[1] for x in rows])
                                 for rows in sets.values() if len(rows) > 1])
            corr = float(np.corrcoef(d, r)[0, 1]) if d.size > 2 else math.nan
            # set values: raw, and adjusted with beta from earlier sets only
            raw, adj = [], []
            order = sorted(sets, key=int)
            for i, sid in enumerate(order):
                rows = sets[sid]
                raw.append(trimmed([x[0] for x in rows]))
                b_prev = pooled_beta({s: sets[s] for s in order[:i]}) if i else 0.0
                adj.append(trimmed([x[0] - b_prev * x[1] for x in rows]))
            m0, lo0, hi0 = stats.t_cs(raw, alpha, c_mix)
            m1, lo1, hi1 = stats.t_cs(adj, alpha, c_mix)
            h0 = (math.exp(hi0) - math.exp(lo0)) / 2 / math.exp(m0) if math.isfinite(hi0) else math.inf
            h1 = (math.exp(hi1) - math.exp(lo1)) / 2 / math.exp(m1) if math.isfinite(hi1) else math.inf
            print(f"  {c['label'] + ' ' + c['op']:34s} {d.size:4d} {wd.std(ddof=1):6.3f} {corr:5.2f} {beta:5.2f} "
                  f"{wa.std(ddof=1):6.3f} {wa.var() / wd.var():8.0%} {r.mean():+7.3f}  {h0:6.1%} {h1:6.1%}  "
                  f"{math.exp(m0):9.3f} {math.exp(m1):9.3f}")


if __name__ == "__main__":
    for a in sys.argv[1:]:
        analyse(Path(a))
