"""One speed slope for both versions, or one per version? Offline, on committed lockstep runs.

For each run given (two envs) and each case's wall clock: the within-worker slope of log burst µs
on log probe µs (stats.SpeedSlope's estimator, here on the bursts' plain medians and their probe
readings, ``raw_by_set``/``ref_by_set``) per version, then the SD over sets of the set log ratio
(stats.set_log_ratio, 20 % trimmed mean of the per-cycle log ratios) with every burst moved to one
reference speed (the runs' lower decile of probe readings) along (a) the slope of both versions
pooled, as the runner did until 2026-12-03, and (b) each version's own slope; and the mean ratio
under each. Where a case is part host, part kernel (batch 512), the slower-host version follows the
CPU more, and with one slope a set on a slow core reads a higher ratio: (b) should spread less there
and change nothing in A/A runs. The slopes are fitted on all of the run's bursts here (the runner
fixes them from earlier bursts only), so this is a check of the idea, not of the runner.
The runner's version of it (commit eaeca78: per-version slopes, the centre at the CPU's fast state
read before timing) failed on the H200: its A/A intervals excluded 1 in 14 places over six runs,
with host "faster"/"slower" verdicts (benchmarks/results/h200-runs-12-03-s10.txt). Every set's
probe reading lies above a fast-state centre, so an error in one version's slope shifts every set
the same way, which the interval cannot see; it was reverted (c133488).

Usage: python benchmarks/per_version_slope.py RUN_DIR [RUN_DIR ...]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results, stats


def slope(m: dict) -> float:
    """Within-set (one worker process per version and set) least-squares slope of log µs on log probe."""
    sxx = sxy = 0.0
    for s, cyc in m["raw_by_set"].items():
        ids = [i for i in cyc if i in m["ref_by_set"].get(s, {})]
        if len(ids) < 2:
            continue
        x = np.log([m["ref_by_set"][s][i] for i in ids])
        y = np.log([cyc[i] for i in ids])
        x, y = x - x.mean(), y - y.mean()
        sxx += float(x @ x)
        sxy += float(x @ y)
    return sxy / sxx if sxx > 0 else 0.0


def main(runs: list[str]) -> None:
    print(f"{'run':<44} {'case':<22} {'slope A':>7} {'slope B':>7}  set SD pooled -> per version   mean ratio")
    for run in runs:
        d = results.load(run)
        envs = [e["label"] for e in d["envs"]]
        by: dict = {}
        for c in d["cases"]:
            by.setdefault(c["id"], {})[c["env"]] = c
        for cid, pair in sorted(by.items()):
            if len(pair) < 2:
                continue
            ma, mb = (pair[e]["metrics"]["wall_us"] for e in envs[:2])
            ba, bb = slope(ma), slope(mb)
            xs = [math.log(v) for m in (ma, mb) for s in m["ref_by_set"] for v in m["ref_by_set"][s].values()]
            ref = float(np.quantile(xs, 0.1))
            pooled_v, own_v = [], []
            for s in ma["raw_by_set"]:
                if s not in mb["raw_by_set"]:
                    continue
                ids = sorted(set(ma["raw_by_set"][s]) & set(mb["raw_by_set"][s]) & set(ma["ref_by_set"][s])
                             & set(mb["ref_by_set"][s]), key=int)
                if len(ids) < 3:
                    continue

                def at(m, b, _s=s, _ids=ids, _ref=ref):
                    return {i: math.exp(math.log(m["raw_by_set"][_s][i]) - b * (math.log(m["ref_by_set"][_s][i]) - _ref))
                            for i in _ids}
                pooled_v.append(stats.set_log_ratio(at(ma, (ba + bb) / 2), at(mb, (ba + bb) / 2)))
                own_v.append(stats.set_log_ratio(at(ma, ba), at(mb, bb)))
            p, o = np.array(pooled_v), np.array(own_v)
            print(f"{Path(run).name:<44} {cid[:22]:<22} {ba:7.2f} {bb:7.2f}  {p.std(ddof=1):.4f} -> {o.std(ddof=1):.4f}"
                  f"  ({o.std(ddof=1) / p.std(ddof=1):4.2f}x)   {math.exp(p.mean()):.3f} -> {math.exp(o.mean()):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
