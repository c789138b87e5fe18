"""The set-up tail's cycles against the set's own (sampling.setup_tail, commit b10548e, reverted):
per-cycle paired log ratios (b / a) of the batch-2 wall bursts of A/A runs, split into the cycles a set
ran in its set-up tail (while the next set's workers set up: CUDA contexts, inputs, first calls) and
the set's cycles before it. A set's record gives its tail's cycle count (``tail.cycles``); the tail's
cycles are the set's last ones (runner: numbered on from the set's earlier ones).

Usage: python benchmarks/setup_tail_cycles.py RUN_DIR... (runs with setup_tail on; results.json or .gz)
"""
from __future__ import annotations

import math
import statistics as st
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results  # noqa: E402


def split(doc: dict) -> dict:
    """{"main": [log ratios], "tail": [...]} over the run's batch-2 wall cycles (env b over env a)."""
    main_n = {str(s["set"]): s["cycles"] - (s.get("tail") or {}).get("cycles", 0) for s in doc["sets"]}
    by = {(c["env"], c["id"]): c for c in doc["cases"]}
    out: dict = {"main": [], "tail": []}
    for (env, cid), c in by.items():
        if env != "a" or c.get("batch") != 2 or ("b", cid) not in by:
            continue
        a = c["metrics"]["wall_us"]["by_set"]
        b = by[("b", cid)]["metrics"]["wall_us"]["by_set"]
        for sid, cyc in a.items():
            kb = b.get(sid) or {}
            for cy, v in cyc.items():
                w = kb.get(cy)
                if v and w and v > 0 and w > 0:
                    out["tail" if int(cy) >= main_n[sid] else "main"].append(math.log(w / v))
    return out


def main() -> int:
    for arg in sys.argv[1:]:
        doc = results.load(results.find(Path(arg)))
        for part, x in split(doc).items():
            if len(x) < 2:
                continue
            med = st.median(x)
            rsd = 1.4826 * st.median(abs(v - med) for v in x)
            print(f"{Path(arg).name:34s} {part:4s} cycles {len(x):5d}  mean {st.mean(x):+.4f}  median {med:+.4f}  "
                  f"SD {st.stdev(x):.4f}  robust SD {rsd:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
