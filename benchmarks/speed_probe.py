"""Does the CPU-speed probe explain the per-cycle noise of the wall clock? (issue #10 diagnostic)

Every lockstep burst also times :func:`matrix_runner.worker.speed_probe` (a fixed pure-Python
workload, µs) between its samples; results.json keeps it per cycle (``metrics.wall_us.ref_by_set``).
If the burst-to-burst noise of a host-bound call is the CPU's speed of the moment, the per-cycle log
ratio of the calls (d) follows the per-cycle log ratio of the probes (r), and d - beta * r is
narrower. This prints, per comparison of each run (wall clock, candidate vs baseline):

- per-cycle SD (each set's mean removed) of the plain burst medians and of the speed-adjusted ones,
  the correlation of d and r, the slope used;
- mean r over all cycles (should be ~0: the probe is the same code in every worker; a nonzero mean
  would move the adjusted ratio away from the plain one);
- the ratio and its anytime interval's half-width (stats.set_log_ratio + stats.t_cs at the run's
  level, as the run computes them) from the plain and from the adjusted burst values.

Runs made with ``sampling.speed_adjust`` (the default since 2026-12-01) carry both (``raw_by_set`` and
``by_set``); for older runs with probe readings the adjustment is approximated per burst with one
slope over all sets.

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
from matrix_runner.results import read_text  # results.json or an archived .gz


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
    """The within-set slope of d on r, pooled over the sets (stats.within_sums, unclamped)."""
    sxx, sxy, _, _ = stats.within_sums([[len(rows), sum(r for _, r in rows), sum(d for d, _ in rows),
                                         sum(r * r for _, r in rows), sum(d * r for d, r in rows)]
                                        for rows in sets.values()])
    return sxy / sxx if sxx > 0 else 0.0


def set_cs(b: dict, k: dict, alpha: float, c_mix: float):
    """(ratio, half-width as a share of the ratio, set SD) of the run's estimator on cycle dicts."""
    vals = [v for sid in b if sid in k for v in [stats.set_log_ratio(b[sid], k[sid])] if v is not None]
    m, lo, hi = stats.t_cs(vals, alpha, c_mix)
    h = (math.exp(hi) - math.exp(lo)) / 2 / math.exp(m) if math.isfinite(hi) else math.inf
    return math.exp(m), h, float(np.std(vals, ddof=1)) if len(vals) > 1 else math.nan


def cyc_sd(b: dict, k: dict) -> float:
    """Per-cycle SD of the paired log ratios, each set's mean removed."""
    res = []
    for sid in b:
        if sid in k:
            d = [math.log(y) - math.log(x) for x, y in stats._paired(b[sid], k[sid])]
            if len(d) > 1:
                res += [v - float(np.mean(d)) for v in d]
    return float(np.std(res)) if res else math.nan


def analyse(path: Path) -> None:
    p = path / "results.json" if path.is_dir() else path
    doc = json.loads(read_text(p))
    labels = [e["label"] for e in doc["envs"] if e.get("status") == "ok"] or [e["label"] for e in doc["envs"]]
    base = labels[0]
    by = {(c["env"], c["id"]): c for c in doc["cases"]}
    ncmp = sum(1 for c in doc["comparisons"] if c["metric"] == "wall_us")
    alpha = stats.FAMILY_ALPHA / max(1, ncmp)
    n_target = doc.get("settings", {}).get("planned_sets") or 8
    c_mix = stats.lai_mixing(int(n_target), alpha)
    adjusted = any("raw_by_set" in (c["metrics"].get("wall_us") or {}) for c in doc["cases"])
    print(f"== {p.parent.name}: {len(doc.get('sets', []))} sets, {ncmp} wall comparisons, "
          f"{'speed-adjusted by the run (raw = the bursts plain medians)' if adjusted else 'plain medians; adj = beta over all sets'}")
    print(f"  {'case':26s} {'cyc':>4s} {'sd raw':>6s} {'sd adj':>6s} {'corr':>5s} {'beta':>5s} {'mean r':>7s}  "
          f"{'ratio raw':>9s} {'±raw':>6s} {'ratio adj':>9s} {'±adj':>6s}")
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
            ib = {int(s): {int(k): x for k, x in v.items()} for s, v in mb["by_set"].items()}
            ik = {int(s): {int(k): x for k, x in v.items()} for s, v in mk["by_set"].items()}
            rb = {int(s): {int(k): x for k, x in v.items()} for s, v in mb["ref_by_set"].items()}
            rk = {int(s): {int(k): x for k, x in v.items()} for s, v in mk["ref_by_set"].items()}
            if adjusted:
                raw_b = {int(s): {int(k): x for k, x in v.items()} for s, v in mb["raw_by_set"].items()}
                raw_k = {int(s): {int(k): x for k, x in v.items()} for s, v in mk["raw_by_set"].items()}
                adj_b, adj_k = ib, ik
                sp = mb.get("speed_by_set") or {}
                beta = float(np.mean([v["beta"] for v in sp.values()])) if sp else math.nan
            else:  # burst-level correction with one slope over all sets (an upper bound of its gain)
                raw_b, raw_k = ib, ik
                sets = cycles(raw_b, raw_k, rb, rk)
                beta = pooled_beta(sets)
                adj_b = {s: {cy: x * rb[s][cy] ** -beta for cy, x in v.items() if cy in rb.get(s, {})} for s, v in raw_b.items()}
                adj_k = {s: {cy: x * rk[s][cy] ** -beta for cy, x in v.items() if cy in rk.get(s, {})} for s, v in raw_k.items()}
            sets = cycles(raw_b, raw_k, rb, rk)
            allrows = [r for rows in sets.values() for r in rows]
            d = np.array([r[0] for r in allrows])
            r = np.array([r[1] for r in allrows])
            corr = float(np.corrcoef(d, r)[0, 1]) if d.size > 2 else math.nan
            r0, h0, _ = set_cs(raw_b, raw_k, alpha, c_mix)
            r1, h1, _ = set_cs(adj_b, adj_k, alpha, c_mix)
            WIDTHS.setdefault(c["label"].split()[0], []).append((h0, h1))
            print(f"  {c['label'] + ' ' + c['op']:26s} {d.size:4d} {cyc_sd(raw_b, raw_k):6.3f} {cyc_sd(adj_b, adj_k):6.3f} "
                  f"{corr:5.2f} {beta:5.2f} {r.mean():+7.3f}  {r0:9.3f} {h0:6.1%} {r1:9.3f} {h1:6.1%}")


#: batch label (e.g. "B2") -> [(raw half-width, adjusted half-width)] over every run analysed
WIDTHS: dict = {}

if __name__ == "__main__":
    for a in sys.argv[1:]:
        analyse(Path(a))
    if len(sys.argv) > 2:
        print("== median half-width of the wall intervals over these runs (plain burst medians -> speed-adjusted):")
        for b, v in sorted(WIDTHS.items()):
            h0 = float(np.median([x for x, _ in v]))
            h1 = float(np.median([y for _, y in v]))
            narrower = sum(y < x for x, y in v)
            print(f"  {b:6s} {len(v):3d} comparisons: {h0:.1%} -> {h1:.1%}; narrower in {narrower} of {len(v)}")
