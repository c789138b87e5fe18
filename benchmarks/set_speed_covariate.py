"""Would a per-set CPU-speed covariate narrow the wall intervals? Offline, on committed lockstep runs.

For each run given (two envs) and each case's wall clock: the set log ratios y (stats.set_log_ratio,
as the statistics take them) and the set's CPU speed x (mean over its paired cycles of the log of
the two bursts' speed-probe readings, ``ref_by_set``, µs). Then each set's value moved to the centre
of the earlier sets' speeds along the slope of y on x fitted on the earlier sets only (predictable,
as a confidence sequence needs; the first 6 sets unchanged): z_s = y_s - b_{s-1} (x_s - mean x_{<s}).
Printed: per run and case the SD over sets of y and of z (%, in log ratio) and their means; then per
case over the runs of each kind (A/A: both envs the same version; seed: the rest) the median,
min and max of SD(z)/SD(y). A ratio well below 1 says the set's speed explains part of the spread;
above 1 that the fitted slope only adds noise. The interval's width goes with that SD.

Usage: python benchmarks/set_speed_covariate.py RUN_DIR [RUN_DIR ...]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results, stats  # noqa: E402

WARM = 6


def set_rows(ma: dict, mb: dict) -> list[tuple[int, float, float]]:
    """(set id, set log ratio, set log speed) for the sets both envs have, in set order."""
    rows = []
    for s, cyc in ma["by_set"].items():
        if s not in mb["by_set"]:
            continue
        ids = sorted(set(cyc) & set(mb["by_set"][s]), key=int)
        y = stats.set_log_ratio(cyc, mb["by_set"][s])
        if y is None:
            continue
        try:
            x = float(np.mean([0.5 * math.log(ma["ref_by_set"][s][i] * mb["ref_by_set"][s][i]) for i in ids]))
        except (KeyError, TypeError, ValueError):
            continue
        rows.append((int(s), y, x))
    return sorted(rows)


def adjusted(rows: list) -> np.ndarray:
    """Each set's value moved along the slope fitted on the sets before it (the first WARM as they are)."""
    z = []
    for k, (_, y, x) in enumerate(rows):
        if k < WARM:
            z.append(y)
            continue
        xs = np.array([r[2] for r in rows[:k]])
        ys = np.array([r[1] for r in rows[:k]])
        xc = xs.mean()
        b = float(np.sum((xs - xc) * (ys - ys.mean())) / max(float(np.sum((xs - xc) ** 2)), 1e-12))
        z.append(y - b * (x - xc))
    return np.array(z)


def main(runs: list[str]) -> None:
    ratios: dict = {}
    for run in runs:
        d = results.load(run)
        envs = [e["label"] for e in d["envs"]]
        aa = len({e.get("flash_attn_version") or e.get("requested_version") for e in d["envs"]}) == 1
        by: dict = {}
        for c in d["cases"]:
            by.setdefault(c["id"], {})[c["env"]] = c
        out = []
        for cid, pair in by.items():
            if len(pair) < 2:
                continue
            ma, mb = (pair[e]["metrics"]["wall_us"] for e in envs[:2])
            rows = set_rows(ma, mb)
            if len(rows) < 10:
                continue
            y = np.array([r[1] for r in rows])
            z = adjusted(rows)
            out.append(f"{cid[:16]:<16} sets {len(rows):2d}  SD {y.std(ddof=1) * 100:.2f} -> {z.std(ddof=1) * 100:.2f} %"
                       f"  mean {y.mean() * 100:+.2f} -> {z.mean() * 100:+.2f} %")
            ratios.setdefault(("A/A" if aa else "seed", cid[:16]), []).append(z.std(ddof=1) / y.std(ddof=1))
        print(Path(run).name)
        for line in out:
            print("   " + line)
    print("\nSD(z) / SD(y) per case over the runs: median [min, max], runs")
    for (kind, cid), v in sorted(ratios.items()):
        print(f"  {kind:<4} {cid:<16} {np.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]  {len(v)}")


if __name__ == "__main__":
    if not sys.argv[1:] or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if sys.argv[1:] else 2)
    main(sys.argv[1:])
