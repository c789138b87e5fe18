"""The GPU machine's "heavy-code" slow mode, read from committed runs (issue #10; nothing re-measured).

Seen first on the H200 on 2026-12-05, 18:23 UTC (`reports/h200-2.6.3-vs-2.7.0.post2-12-05-11/`, `-12/`):
in some process sets the baseline's batch-2 backward calls took ~2x their time in other sets of
the same run (2.6.3 B2 S150 bwd ~150-180 µs vs ~305-330 µs), for seconds at a time, both workers
of the set at once, while the sampling's CPU-speed probe (worker.speed_probe, a small pure-Python
loop) read the same. In that mode 2.7.0.post2's batch-2 forward call doubled too but 2.6.3's grew
only ~1.3x, so the seed's batch-2 forward set ratio was ~2.0 in one mode and ~2.9 in the other.

Per run: per process set, the baseline env's median wall µs of the batch-2 backward cases (median
over the set's cycles, then over the cases), the set's median probe reading (µs), each env's batch-2
forward µs (likewise) and the batch-2 forward and backward set ratios (the median over the cases of
each case's ratio of the two envs' set medians). The sets are split into two groups by the largest gap in the sorted log
backward µs; the split is called a mode when the groups' medians differ by 1.5x or more and the
smaller group holds at least 2 sets (sets in which the mode came or went mid-set fall in either
group and blur its medians), and a heavy mode when, besides, the two groups' probe readings
lie within 1.3x of each other (else the split is the CPU's speed state, which the probe reads and
the speed adjustment follows). Then, per group: sets, backward µs, probe µs, and the median
batch-2 forward and backward set ratios (candidate / baseline; in an A/A run both ~1).

The report now finds such a split itself, from every case of the run rather than the batch-2
backward alone, and names the ratios that moved with it (report.machine_modes; over the committed
runs: benchmarks/machine_modes.py).

Usage: python benchmarks/heavy_mode.py [--sets] RUN_DIR_OR_RESULTS...
``--sets``: one line per set as well."""
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results  # noqa: E402

MODE_GAP = 1.5  # groups' median backward µs this far apart: a mode
PROBE_SAME = 1.3  # groups' median probe readings within this factor: the probe does not read it


def _set_medians(metric: dict) -> dict:
    """{set id: median µs over the set's cycles} of one env's wall metric (raw burst medians)."""
    by = metric.get("raw_by_set") or metric.get("by_set") or {}
    return {s: statistics.median(v.values()) for s, v in by.items() if v}


def _probe(metric: dict) -> dict:
    return {s: statistics.median(v.values()) for s, v in (metric.get("ref_by_set") or {}).items() if v}


def analyse(doc: dict) -> dict:
    """Per set: base bwd µs, probe µs, fwd and bwd set ratios (batch 2); the split into modes."""
    labs = [e["label"] for e in doc["envs"] if e.get("status") == "ok"][:2]
    if len(labs) < 2:
        return {"sets": {}, "modes": None}
    base, cand = labs
    cases: dict = {}
    for c in doc["cases"]:
        if c.get("batch") == 2 and c.get("status", "ok") == "ok" and "wall_us" in (c.get("metrics") or {}):
            cases.setdefault((c["seqlen_q"], c["op"]), {})[c["env"]] = c["metrics"]["wall_us"]
    per: dict = {}
    for (sq, op), envs in cases.items():
        if base not in envs or cand not in envs:
            continue
        b, k = _set_medians(envs[base]), _set_medians(envs[cand])
        pr = _probe(envs[base])
        for s in b.keys() & k.keys():
            row = per.setdefault(s, {"bwd_us": [], "fwd_r": [], "bwd_r": [], "probe": [], "fwd_base": [], "fwd_cand": []})
            if op == "bwd":
                row["bwd_us"].append(b[s])
            else:
                row["fwd_base"].append(b[s])
                row["fwd_cand"].append(k[s])
            row[op + "_r"].append(k[s] / b[s])
            if s in pr:
                row["probe"].append(pr[s])
    sets = {s: {"bwd_us": statistics.median(r["bwd_us"]), "fwd_r": statistics.median(r["fwd_r"]),
                "bwd_r": statistics.median(r["bwd_r"]),
                "probe": statistics.median(r["probe"]) if r["probe"] else float("nan"),
                "fwd_base": statistics.median(r["fwd_base"]) if r["fwd_base"] else float("nan"),
                "fwd_cand": statistics.median(r["fwd_cand"]) if r["fwd_cand"] else float("nan")}
            for s, r in per.items() if r["bwd_us"] and r["fwd_r"] and r["bwd_r"]}
    return {"sets": sets, "modes": split(sets)}


def split(sets: dict):
    """Two groups of sets by the largest gap in log backward µs; None unless they differ by MODE_GAP."""
    if len(sets) < 4:
        return None
    order = sorted(sets, key=lambda s: sets[s]["bwd_us"])
    logs = [math.log(sets[s]["bwd_us"]) for s in order]
    gaps = [(logs[i + 1] - logs[i], i) for i in range(1, len(logs) - 2)]  # each side >= 2 sets
    if not gaps:
        return None
    _, i = max(gaps)
    lo, hi = order[: i + 1], order[i + 1:]
    med = lambda g, k: statistics.median(sets[s][k] for s in g)  # noqa: E731
    if med(hi, "bwd_us") / med(lo, "bwd_us") < MODE_GAP:
        return None
    return {name: {"n": len(g), "bwd_us": med(g, "bwd_us"), "probe": med(g, "probe"),
                   "fwd_base": med(g, "fwd_base"), "fwd_cand": med(g, "fwd_cand"),
                   "fwd_r": med(g, "fwd_r"), "bwd_r": med(g, "bwd_r"), "sets": sorted(g, key=int)}
            for name, g in (("usual", lo), ("heavy", hi))}


def main(argv: list) -> int:
    show_sets = "--sets" in argv
    paths = [a for a in argv if a != "--sets"]
    if not paths:
        print(__doc__)
        return 2
    for p in paths:
        try:
            doc = results.load(p)
        except results.ResultsError as e:
            print(f"heavy_mode.py: {e}", file=sys.stderr)
            return 2
        a = analyse(doc)
        n = len(a["sets"])
        m = a["modes"]
        if m is None:
            allb = [v["bwd_us"] for v in a["sets"].values()]
            rng = f"{min(allb):.0f}-{max(allb):.0f}" if allb else "-"
            fr = statistics.median(v["fwd_r"] for v in a["sets"].values()) if allb else float("nan")
            print(f"{p}: {n} sets, no heavy mode (baseline B2 bwd {rng} µs per set; B2 fwd set ratio median {fr:.2f})")
        else:
            u, h = m["usual"], m["heavy"]
            kind = "heavy mode" if h["probe"] / u["probe"] < PROBE_SAME else "slow speed state (probe reads it)"
            print(f"{p}: {n} sets, {kind} in {h['n']}: baseline B2 bwd {u['bwd_us']:.0f} vs {h['bwd_us']:.0f} µs, "
                  f"probe {u['probe']:.2f} vs {h['probe']:.2f} µs, B2 fwd µs baseline {u['fwd_base']:.0f} vs {h['fwd_base']:.0f}, "
                  f"candidate {u['fwd_cand']:.0f} vs {h['fwd_cand']:.0f}, set ratio {u['fwd_r']:.2f} vs {h['fwd_r']:.2f}, "
                  f"bwd {u['bwd_r']:.2f} vs {h['bwd_r']:.2f} (" + ("usual vs heavy" if kind == "heavy mode" else "fast vs slow") + ")")
        if show_sets:
            heavy = set(m["heavy"]["sets"]) if m else set()
            for s in sorted(a["sets"], key=int):
                v = a["sets"][s]
                print(f"    set {s:>3} {'heavy' if s in heavy else 'usual'} bwd {v['bwd_us']:6.0f} µs probe "
                      f"{v['probe']:5.2f} µs fwd ratio {v['fwd_r']:.2f} bwd ratio {v['bwd_r']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
