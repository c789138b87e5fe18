"""Does a process set's batch-2 forward ratio follow the CPU speed the set saw? For each seed run
given (two envs), per batch-2 forward case: the correlation over sets of the set's log ratio (20 %
trimmed mean of its per-cycle log ratios, stats.set_log_ratio: speed-adjusted, as the statistics use them, and plain) with
the log of the set's median speed-probe reading (worker.speed_probe, µs: higher = slower CPU).
A consistent sign over runs would say the between-set spread is CPU speed that a per-version slope
could take out; no consistent sign says it is not. Also, per batch-2 case (fwd and bwd), the
correlation of the set log ratio with the two workers' own probe ratio (the set's median over cycles
of log(probe B / probe A)): were a process's offset a general slowness of that interpreter, the
probe would show it. Reads committed results only.

Usage: python benchmarks/set_ratio_vs_speed.py RUN_DIR [RUN_DIR ...]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results, stats

for run in sys.argv[1:]:
    d = results.load(run)
    envs = [e["label"] for e in d["envs"]]
    by: dict = {}
    for c in d["cases"]:
        by.setdefault(c["id"], {})[c["env"]] = c
    for cid, pair in by.items():
        if not (cid.startswith(("fwd-b2-", "bwd-b2-")) and len(pair) >= 2):
            continue
        ma, mb = (pair[e]["metrics"]["wall_us"] for e in envs[:2])
        speed, adj, plain, own = [], [], [], []
        for s, cyc in ma["by_set"].items():
            if s not in mb["by_set"]:
                continue
            ids = sorted(set(cyc) & set(mb["by_set"][s]), key=int)
            if len(ids) < 4:
                continue
            # the set's value as the statistics take it (paired by cycle id, 20 % trimmed mean)
            adj.append(stats.set_log_ratio(cyc, mb["by_set"][s]))
            plain.append(stats.set_log_ratio(ma["raw_by_set"][s], mb["raw_by_set"][s]))
            speed.append(float(np.median([0.5 * math.log(ma["ref_by_set"][s][i] * mb["ref_by_set"][s][i]) for i in ids])))
            own.append(float(np.median([math.log(mb["ref_by_set"][s][i] / ma["ref_by_set"][s][i]) for i in ids])))
        print(f"{Path(run).name:<42} {cid[:20]:<20} sets {len(speed):2d}  corr(set log ratio, log probe): "
              f"speed-adjusted {np.corrcoef(speed, adj)[0, 1]:+.2f}, plain {np.corrcoef(speed, plain)[0, 1]:+.2f}; "
              f"set probe medians {math.exp(min(speed)):.2f}-{math.exp(max(speed)):.2f} µs; "
              f"corr(set log ratio, the workers' probe log ratio) {np.corrcoef(own, adj)[0, 1]:+.2f}")
