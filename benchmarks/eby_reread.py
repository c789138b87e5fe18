"""What e-BY (results/2 method "/2", stats.select_family) changes on the committed H200 runs.

Each run's comparisons are recomputed from its own process sets twice with the results module's
code (results.comparisons): as judged (method "/1": every interval at 1 - alpha/m, Bonferroni) and
with e-BY (the decided comparisons of a clock reported together at 1 - alpha |S|/m). Same sets,
same cycles, same mixing target (the run's planned sets); only the multiplicity rule differs (and
the mixing is tuned for alpha instead of alpha/m, as "/2" does). Printed per run: wall verdict
counts and the half-widths (ci_high / ratio - 1, %) of the figures issue #10 names -- batch-2 fwd,
batch-512 fwd -- and for A/A runs how many wall intervals lie inside +-3 %.

Usage: python benchmarks/eby_reread.py [RUN_DIR ...]   (default: every reports/h200-*2.6.3-vs-2.7.0.post2*
and reports/h200-aa-[0-9]* run with lockstep sets)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, ROOT.as_posix())
from matrix_runner import results


def half_width(c: dict) -> float:
    """ci_high / ratio - 1 in % (the wider side of an interval symmetric in log)."""
    return 100 * (c["ci_high"] / c["ratio"] - 1)


def figures(doc: dict, method: str) -> dict:
    settings = {**(doc.get("settings") or {}), "method": method}
    labels = [e["label"] for e in doc["envs"] if e["status"] == "ok"]
    cmps = results.comparisons(doc["cases"], labels, settings.get("min_effect", 0.05), settings=settings,
                               pairs=results.env_pairs(doc["envs"]))
    wall = [c for c in cmps if c["metric"] == "wall_us"]
    by = {}
    for c in wall:
        by[c["verdict"]] = by.get(c["verdict"], 0) + 1
    def cls(c: dict) -> str:  # "B2 S150 ..." -> "b2 fwd"
        return f"b{c['label'].split()[0][1:]} {c['op']}"
    hw: dict = {}
    for c in wall:
        hw.setdefault(cls(c), []).append(half_width(c))
    return {"verdicts": by, "hw": hw, "inside3": sum(1 for c in wall if c["ci_low"] >= 1 / 1.03 and c["ci_high"] <= 1.03),
            "n": len(wall), "levels": sorted({round(1 - c["alpha"], 4) for c in wall})}


def main(paths: list[str]) -> None:
    if not paths:
        paths = sorted({p.parent.as_posix() for pat in ("h200-*2.6.3-vs-2.7.0.post2*", "h200-aa-[0-9]*")
                        for p in (ROOT / "reports").glob(pat + "/results.json*")})
    for p in paths:
        doc = json.loads(results.read_text(Path(p) / "results.json"))
        if not doc.get("sets") or not str((doc.get("settings") or {}).get("method", "")).startswith("lockstep-sets"):
            continue
        if (doc.get("settings") or {}).get("quick"):
            continue
        print(f"== {Path(p).name}: {len(doc['sets'])} sets, planned {doc['settings'].get('planned_sets')}")
        for name, method in (("Bonferroni", "lockstep-sets/anytime-t-cs/1"), ("e-BY", "lockstep-sets/anytime-t-cs/2")):
            f = figures(doc, method)
            hw = "  ".join(f"{k} ±{min(v):.1f}-{max(v):.1f}%" for k, v in sorted(f["hw"].items()))
            print(f"  {name:<10} {', '.join(f'{k} {v}' for k, v in sorted(f['verdicts'].items())):<32} "
                  f"inside ±3 %: {f['inside3']:>2}/{f['n']}  levels {f['levels']}\n             {hw}")


if __name__ == "__main__":
    main(sys.argv[1:])
