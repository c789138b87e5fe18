"""The sampler's effect on wall time (explain, module doc 3) re-read from committed runs: Welch's
interval of plain means (the estimator before 2026-12-02) beside Yuen's trimmed one (now), from the
same per-cycle records. Performance claims of #12 ("the sampler changes wall time by <= 2 %") rest
on these records; nothing is measured here.

Usage: python benchmarks/sampler_effect_reread.py RUN_DIR [RUN_DIR ...]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import explain, results


def welch(a, b):
    d = sum(a) / len(a) - sum(b) / len(b)
    ci = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    return math.expm1(d), math.expm1(ci.low), math.expm1(ci.high)


def pct(t):
    return f"{t[0] * 100:+5.1f} % [{t[1] * 100:+5.1f}, {t[2] * 100:+5.1f}] (±{(t[2] - t[1]) * 50:.1f})"


for run in sys.argv[1:]:
    doc = results.load(Path(run))
    for lab, e in (((doc.get("explain") or {}).get("profile") or {}).get("envs") or {}).items():
        ls = e.get("lockstep")
        if not ls:
            continue
        ev = explain.sampler_effect(ls)
        ref = "t" if ev["reference"] == "twin" else "p"
        cyc = [c for c in ls["cycles"] if (c.get("x_us") or 0) > 0 and (c.get(f"{ref}_us") or 0) > 0]
        r = {ph: [math.log(c["x_us"] / c[f"{ref}_us"]) for c in cyc if c.get("phase") == ph] for ph in ("off", "on", "off2")}
        off = r["off"] + r["off2"]
        print(f"{Path(run).name:<58} {lab:<12} vs {ev['reference']:<7} on {len(r['on']):3d} off {len(off):3d}  "
              f"plain means (Welch) {pct(welch(r['on'], off))}   trimmed (Yuen) {pct((ev['effect'], ev['effect_lo'], ev['effect_hi']))} {ev['verdict']}")
