"""Where does a batch-2 process set's spread come from? For each A/A run given (results.json), the
mean pairwise correlation, across sets, of the set log ratios of the batch-2 wall comparisons
(a per-process speed offset would move every case of a set together: high correlation), the SD of
the per-set mean over those cases, and the per-set-core means. Usage:
python benchmarks/set_spread.py reports/h200-aa-*/results.json reports/h200-variant-*aa*/results.json"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner.results import read_text  # results.json or an archived .gz


def main(paths: list[str]) -> None:
    for f in paths:
        r = json.loads(read_text(f))
        cpu = {s["set"]: s.get("cpu") for s in r.get("sets") or []}
        w = [c for c in r["comparisons"] if c["metric"] == "wall_us" and c["label"].startswith("B2 ")
             and c.get("set_log_ratios")]
        by_set: dict = defaultdict(dict)
        for c in w:
            for s, v in zip(c["sets"], c["set_log_ratios"]):
                by_set[s][c["case"]] = v
        cases = sorted({k for d in by_set.values() for k in d})
        x = np.array([[by_set[s].get(k, np.nan) for k in cases] for s in sorted(by_set)])
        x = x[~np.isnan(x).any(1)]
        if len(cases) < 2 or len(x) < 3:
            print(f"{f}: too few batch-2 comparisons or sets")
            continue
        corr = np.corrcoef(x.T)[np.triu_indices(len(cases), 1)]
        per_cpu: dict = defaultdict(list)
        for s, v in zip(sorted(by_set), x.mean(1)):
            per_cpu[cpu.get(s)].append(v)
        print(f"{f}: {len(x)} sets x {len(cases)} batch-2 cases; mean pairwise corr of set log ratios "
              f"{corr.mean():+.2f}; SD of the per-set mean {x.mean(1).std(ddof=1):.3f} (of one case: "
              f"{np.median(x.std(0, ddof=1)):.3f}); per set core: "
              + ", ".join(f"{k}: {np.mean(v):+.3f}" for k, v in per_cpu.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
