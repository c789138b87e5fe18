"""How much of a run's interval widths comes from a few bad process sets (H200, issue #10's unmet figures).

Two readings of each committed run, from its own data (results.json), nothing re-measured:

1. **Bad sets** (``--sets``): per process set, the share of its paired wall cycles (every case)
   whose log ratio lies more than log 1.4 from that case's median cycle log ratio over the run.
   A set with more than 15 % of them is listed: on 2026-12-05 such sets showed one worker of
   the pair ~1.8x slower in cycle after cycle, alternately one and the other, while their
   speed-probe readings agreed (``reports/h200-aa-101/`` set 25). Also: the wall cycles each
   case got per set (batch-512 backward often 1-2, so one stalled burst is the set's value).
2. **Winsorized replay** (default): each wall comparison's interval recomputed from its set log
   ratios (``set_log_ratios``) by the same confidence sequence (stats.t_cs at the comparison's
   own level ``alpha`` and mixing ``cs_mixing``: it reproduces the reported interval), as
   reported and with each set's value clamped, from the 5th set on, to the median of the earlier
   sets +- K x 1.4826 x their MAD (predictable: earlier sets only). This is an upper bound on
   what a set-level guard could give -- its coverage is NOT simulated here (benchmarks/sim_lockstep.py
   would have to model it before any default uses it) -- so it says whether such a guard is worth
   building, not that it is valid.

Usage: python benchmarks/set_outliers.py [--sets] [--k K] RUN_DIR_OR_RESULTS...
Prints one line per run and, for the replay, medians per group (A/A or seed x batch x op)."""
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results, stats  # noqa: E402

OFF = math.log(1.4)   # a cycle this far from its case's median cycle is "off"
BAD_SHARE = 0.15      # a set with more than this share of off cycles is listed
START = 4             # the guard starts at the 5th set (4 earlier ones give its centre and scale)


def _wall_pairs(doc: dict):
    """(case key, {set id: {cycle id: (base µs, cand µs)}}) per case of the first two envs."""
    labs = [e["label"] for e in doc["envs"] if e.get("status") == "ok"][:2]
    by: dict = {}
    for c in doc["cases"]:
        by.setdefault((c["label"], c["op"]), {})[c["env"]] = c
    for key, cs in by.items():
        if len(labs) < 2 or labs[0] not in cs or labs[1] not in cs:
            continue
        a = (cs[labs[0]].get("metrics") or {}).get("wall_us") or {}
        b = (cs[labs[1]].get("metrics") or {}).get("wall_us") or {}
        sets = {}
        for sid, cyc in (a.get("by_set") or {}).items():
            other = (b.get("by_set") or {}).get(sid) or {}
            pairs = {cy: (x, other[cy]) for cy, x in cyc.items() if cy in other and x and other[cy]}
            if pairs:
                sets[sid] = pairs
        yield key, sets


def bad_sets(doc: dict) -> tuple[dict, dict]:
    """({set id: (off cycles, cycles)}, {case key: median wall cycles per set})."""
    per: dict = {}
    cycles: dict = {}
    for key, sets in _wall_pairs(doc):
        lr = [(sid, math.log(y / x)) for sid, p in sets.items() for x, y in p.values()]
        if not lr:
            continue
        med = statistics.median(v for _, v in lr)
        for sid, v in lr:
            n, k = per.get(sid, (0, 0))
            per[sid] = (n + 1, k + (abs(v - med) > OFF))
        cycles[key] = statistics.median(len(p) for p in sets.values())
    return per, cycles


def winsorized(x: list, k: float) -> list:
    """``x`` (set log ratios in run order) with each value from the (START+1)th on clamped to the
    earlier values' median +- k x 1.4826 x MAD (at least 0.5 %)."""
    out = []
    for i, v in enumerate(x):
        if i >= START:
            e = x[:i]
            m = statistics.median(e)
            r = max(k * 1.4826 * statistics.median(abs(u - m) for u in e), 0.005)
            v = min(max(v, m - r), m + r)
        out.append(v)
    return out


def half_width(x: list, alpha: float, c: float) -> tuple[float, float, float]:
    """(half-width % of the ratio, the larger side; low; high) of stats.t_cs on log ratios ``x``."""
    m, lo, hi = stats.t_cs(x, alpha, c)
    r = math.exp(m)
    return max(math.exp(hi) - r, r - math.exp(lo)) / r * 100, math.exp(lo), math.exp(hi)


def main(argv: list[str]) -> int:
    show_sets = "--sets" in argv
    k = 3.5
    if "--k" in argv:
        k = float(argv[argv.index("--k") + 1])
        argv = argv[:argv.index("--k")] + argv[argv.index("--k") + 2:]
    runs = [a for a in argv if not a.startswith("--")]
    if not runs:
        print(__doc__)
        return 2
    groups: dict = {}
    inside = {"as reported": 0, "winsorized": 0, "runs": 0}
    n_sets = n_bad = 0
    for run in runs:
        doc = results.load(Path(run))
        name = Path(run).name if Path(run).is_dir() else Path(run).parent.name
        aa = doc["envs"][0].get("requested_version") == doc["envs"][1].get("requested_version")
        if show_sets:
            per, cyc = bad_sets(doc)
            bad = sorted(((kk / n, sid, kk, n) for sid, (n, kk) in per.items() if kk / n > BAD_SHARE), reverse=True)
            n_sets += len(per)
            n_bad += len(bad)
            b512 = "/".join(f"{cyc[key]:g}" for key in sorted(cyc) if key[0].startswith("B512") and key[1] == "bwd")
            print(f"{name}: {len(per)} sets, {len(bad)} with > {BAD_SHARE:.0%} of cycles off by 1.4x"
                  + (": " + ", ".join(f"set {sid} {kk}/{n}" for _, sid, kk, n in bad) if bad else "")
                  + f"; batch-512 bwd wall cycles per set (median, S50/S150/S300) {b512}")
            continue
        ins_r = ins_w = 0
        worst = (0.0, "")
        for c in doc["comparisons"]:
            if c.get("metric") != "wall_us" or not c.get("set_log_ratios") or c.get("alpha") is None:
                continue
            x = c["set_log_ratios"]
            h0, lo0, hi0 = half_width(x, c["alpha"], c["cs_mixing"])
            h1, lo1, hi1 = half_width(winsorized(x, k), c["alpha"], c["cs_mixing"])
            g = ("A/A" if aa else "seed") + " " + c["label"].split()[0] + " " + c["op"]
            groups.setdefault(g, []).append((h0, h1))
            ins_r += lo0 >= 0.97 and hi0 <= 1.03
            ins_w += lo1 >= 0.97 and hi1 <= 1.03
            if h0 - h1 > worst[0]:
                worst = (h0 - h1, f"{c['label']} {c['op']} ±{h0:.2f} -> ±{h1:.2f} %")
        if aa:
            inside["runs"] += 1
            inside["as reported"] += ins_r == 12
            inside["winsorized"] += ins_w == 12
        print(f"{name}: " + (f"inside ±3 %: {ins_r}/12 -> {ins_w}/12; " if aa else "")
              + (f"most narrowed: {worst[1]}" if worst[1] else "nothing narrowed"))
    if show_sets:
        print(f"in all: {n_bad} of {n_sets} sets with > {BAD_SHARE:.0%} of their wall cycles off by 1.4x")
        return 0
    print(f"\nmedian half-width as reported -> winsorized at K = {k:g} (max), per group:")
    for g, v in sorted(groups.items()):
        print(f"  {g:16s} ±{statistics.median(a for a, _ in v):.2f} -> ±{statistics.median(b for _, b in v):.2f} % "
              f"(max {max(a for a, _ in v):.1f} -> {max(b for _, b in v):.1f}, n {len(v)})")
    if inside["runs"]:
        print(f"A/A runs with all 12 wall intervals inside ±3 %: {inside['as reported']} -> {inside['winsorized']} "
              f"of {inside['runs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
