"""Replay committed lockstep runs under other speed-slope rules, offline, each set adjusted with
what the runner would have known before it (predictable, as the confidence sequence needs).

For every run and case (wall clock): the bursts' plain medians and their probe readings
(``raw_by_set``/``ref_by_set``, µs) are moved to a centre along slopes fitted on the *earlier* sets
only (within each set, per version: stats.SpeedSlope's estimator, here at burst level); each set's
value is stats.set_log_ratio of the moved bursts; the interval is stats.t_cs over the sets at
alpha 0.05/12 (a Bonferroni stand-in for e-BY), tuned for 27 sets. Rules (``MODES``):

- ``pooled``: one slope for both versions, centre = median of the earlier sets' probe readings
  (it cancels in the ratio): the runner's rule.
- ``perversion``: each version's own slope (pooled where a version has < 1.0 of within-worker
  spread), same running-median centre.
- ``fast``: each version's own slope, centre = the lower decile of the earlier readings (the
  CPU's fast state): the rule of commit eaeca78, whose H200 A/A runs lost coverage.
- ``testZ`` (e.g. ``test3``): each version's own slope only where the two differ by more than Z
  standard errors (burst-level residuals), else pooled.

Printed per rule: A/A intervals excluding 1 (each one a miss: the truth is 1) and the median and
largest half-width (%, of the ratio) per group. Usage:
python benchmarks/slope_replay.py [MODE ...]   (default: all four, test3 for testZ)
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results, stats

ALPHA = 0.05 / 12
N_TARGET = 27
MODES = ("pooled", "perversion", "fast", "test3")
AA = ([f"reports/h200-aa-{i}" for i in range(36, 46)] + [f"reports/h200-variant-s15r2-aa-{i}" for i in (1, 2, 3)]
      + [f"reports/h200-variant-s15r1-aa-{i}" for i in range(1, 7)])
SEED = ([f"reports/h200-2.6.3-vs-2.7.0.post2-12-03-s10-{i}" for i in (1, 2, 3)]
        + [f"reports/h200-variant-s15r2-2.6.3-vs-2.7.0.post2-{i}" for i in (1, 2, 3)]
        + [f"reports/h200-2.6.3-vs-2.7.0.post2-12-03-r2-{i}" for i in (1, 2)])


def sums(m: dict, sets: list) -> tuple[float, float, float]:
    """Within-set (S_xx, S_xy, residual variance) of log burst µs on log probe µs over ``sets``."""
    sxx = sxy = syy = 0.0
    dof = 0
    for s in sets:
        cyc, ref = m["raw_by_set"].get(s, {}), m["ref_by_set"].get(s, {})
        ids = [i for i in cyc if i in ref]
        if len(ids) < 2:
            continue
        x = np.log([ref[i] for i in ids])
        y = np.log([cyc[i] for i in ids])
        x, y = x - x.mean(), y - y.mean()
        sxx += float(x @ x)
        sxy += float(x @ y)
        syy += float(y @ y)
        dof += len(ids) - 1
    b = sxy / sxx if sxx > 0 else 0.0
    return sxx, sxy, (syy - b * sxy) / max(1, dof - 1)


def clamp(b: float) -> float:
    lo, hi = stats.SLOPE_BOUNDS
    return min(hi, max(lo, b))


def slopes(mode: str, ma: dict, mb: dict, prev: list) -> tuple[float, float, float]:
    """(slope A, slope B, centre) for the next set under ``mode``, from the sets in ``prev``."""
    ax, ay, va = sums(ma, prev)
    bx, by, vb = sums(mb, prev)
    if ax + bx < 1e-6:
        return 0.0, 0.0, 0.0
    pooled = clamp((ay + by) / (ax + bx))
    xs = [math.log(v) for m in (ma, mb) for t in prev for v in m["ref_by_set"][t].values()]
    centre = float(np.quantile(xs, 0.1)) if mode == "fast" else float(np.median(xs))
    if mode == "pooled":
        return pooled, pooled, centre
    own_a = clamp(ay / ax) if ax >= 1.0 else pooled
    own_b = clamp(by / bx) if bx >= 1.0 else pooled
    if mode.startswith("test"):
        if ax < 1.0 or bx < 1.0 or abs(ay / ax - by / bx) <= float(mode[4:]) * math.sqrt(va / ax + vb / bx):
            return pooled, pooled, centre
    return own_a, own_b, centre


def replay(path: str, mode: str) -> dict:
    """case id -> (ratio, low, high) of the run at ``path`` replayed under ``mode``."""
    d = results.load(results.find(path))
    envs = [e["label"] for e in d["envs"]]
    by: dict = {}
    for c in d["cases"]:
        by.setdefault(c["id"], {})[c["env"]] = c
    out = {}
    for cid, pair in by.items():
        ma, mb = (pair[e]["metrics"]["wall_us"] for e in envs[:2])
        sets = sorted(set(ma["raw_by_set"]) & set(mb["raw_by_set"]), key=int)
        vals = []
        for k, s in enumerate(sets):
            ba, bb, c0 = slopes(mode, ma, mb, sets[:k])
            ids = [i for i in ma["raw_by_set"][s] if i in mb["raw_by_set"][s] and i in ma["ref_by_set"][s]
                   and i in mb["ref_by_set"][s]]
            if len(ids) < 3:
                continue

            def at(m, b, _s=s, _ids=ids, _c=c0):
                return {i: math.exp(math.log(m["raw_by_set"][_s][i]) - b * (math.log(m["ref_by_set"][_s][i]) - _c))
                        for i in _ids}
            vals.append(stats.set_log_ratio(at(ma, ba), at(mb, bb)))
        mean, lo, hi = stats.t_cs(vals, ALPHA, stats.lai_mixing(N_TARGET, ALPHA))
        out[cid] = (math.exp(mean), math.exp(lo), math.exp(hi))
    return out


def main(modes: list[str]) -> None:
    for mode in modes:
        excl = n = 0
        hws: dict = {}
        for kind, runs in (("A/A ", AA), ("seed", SEED)):
            for r in runs:
                for cid, (m, lo, hi) in replay(r, mode).items():
                    if kind == "A/A ":
                        n += 1
                        excl += not lo <= 1.0 <= hi
                    hws.setdefault((kind, "B2  " if "-b2-" in cid else "B512", cid[:3]), []).append((hi - m) / m * 100)
        print(f"{mode}: A/A intervals excluding 1: {excl} of {n}")
        for k in sorted(hws):
            v = [x for x in hws[k] if math.isfinite(x)]
            print(f"    {' '.join(k)}  median half-width {np.median(v):5.2f} %  largest {max(v):5.2f} %"
                  + (f"  ({len(hws[k]) - len(v)} unbounded)" if len(v) < len(hws[k]) else ""))


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODES))
