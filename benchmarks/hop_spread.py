"""Do a set's moves (sampling.cpu_hop) go with a wider spread of its cycles? (issue #10, offline)

For every wall comparison of the committed cpu_hop runs (``reports/h200-variant-cpu-hop-*``) and
every process set with at least 3 paired cycles of it: the SD of the cycles' log ratios (candidate /
baseline burst, the values the interval is built from), the set's number of moves (``hops``), and
the share of those cycles in which both bursts' speed probes read above 5 µs (the H200's slow level).
Prints the median SD by moves (0-5, 6-15, 16 or more), for batch 2 and batch 512, over all such
sets and over those with at most 20 % slow cycles ("mostly fast"). Correlational: a set moves after
cycles that read slow, so a set with many moves also met a CPU that changed speed often.
Usage: python benchmarks/hop_spread.py [RUN_DIR...]
"""
import collections
import glob
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def rows(paths: list[str]) -> list[tuple]:
    out = []
    for p in paths:
        d = results.load(results.find(p))
        sets = {s["set"]: s for s in d["sets"]}
        by = collections.defaultdict(dict)
        for c in d["cases"]:
            by[c["id"]][c["env"]] = c["metrics"]["wall_us"]
        for cid, m in by.items():
            if len(m) < 2:
                continue
            labs = [e["label"] for e in d["envs"] if e["label"] in m]
            b, k = m[labs[0]], m[labs[1]]
            for sid, cb in b["by_set"].items():
                ck = k["by_set"].get(sid, {})
                common = [c for c in cb if c in ck]
                if len(common) < 3:
                    continue
                lr = [math.log(ck[c] / cb[c]) for c in common]
                rb, rk = b["ref_by_set"][sid], k["ref_by_set"][sid]
                slow = sum(1 for c in common if rb.get(c, 0) > 5 and rk.get(c, 0) > 5) / len(common)
                out.append((sets[int(sid)].get("hops") or 0, slow, statistics.stdev(lr),
                            "batch 2" if "-b2-" in cid else "batch 512"))
    return out


def main() -> int:
    paths = sys.argv[1:] or sorted(glob.glob(str(ROOT / "reports" / "h200-variant-cpu-hop-*")))
    rs = rows(paths)
    print(f"{len(paths)} runs, {len(rs)} (set, comparison) pairs with >= 3 cycles")
    for grp in ("batch 2", "batch 512"):
        for lo, hi in ((0, 5), (6, 15), (16, 10 ** 6)):
            sel = [sd for h, sl, sd, g in rs if g == grp and lo <= h <= hi]
            fast = [sd for h, sl, sd, g in rs if g == grp and lo <= h <= hi and sl <= 0.2]
            med = (lambda x: f"{statistics.median(x):.3f}" if x else "-")
            span = f"{lo}-{hi}" if hi < 10 ** 6 else f"{lo}+"
            print(f"{grp:9s} sets with {span:5s} moves: SD of cycle log ratios, median {med(sel)} (n {len(sel)}); "
                  f"mostly fast (<= 20 % slow cycles) {med(fast)} (n {len(fast)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
