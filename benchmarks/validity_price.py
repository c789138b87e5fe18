"""What the batch-512 forward interval costs, and what it would take to reach issue #10's +-1 %.

For each committed run and each wall comparison picked (default: batch-512 forward), from the
comparison's own set log ratios (results.json ``set_log_ratios``: one per process set, the
trimmed mean of the set's paired per-cycle log ratios, as the run used them):

- ``SD``: the standard deviation of the set log ratios, % (the spread the interval is built on);
- ``CS``: the run's reported interval, the larger side, % of the ratio (the anytime-valid t
  confidence sequence, stats.t_cs, at the level e-BY reported it: ``alpha`` in the results);
- ``CS check``: the same recomputed here from the set log ratios (should equal ``CS``);
- ``t95``: a fixed-n Student t interval at 95 % on the same sets (no anytime validity, no
  family-wise control: what a hand-written script that looks once at the end would print);
- ``sets for 1 %``: the sets the same confidence sequence (same level, same mixing) needs to
  reach +-1 % at this SD, and the seconds that takes at the run's seconds per set.

So the gap between a run's interval and +-1 % splits into the price of validity (CS / t95) and
the spread of the sets (with ``--all``, a line per run instead of per comparison). Usage: python benchmarks/validity_price.py [--all] RUN_DIR_OR_RESULTS...
(``--all``: every wall comparison, not only batch-512 forward, and how many runs have every wall
interval inside +-3 % of 1, reported and as t95 -- the A/A figure). Prints one line per comparison
and medians per group."""
import math
import statistics
import sys
from pathlib import Path

from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import report, results, stats  # noqa: E402


def pct(h_log: float) -> float:
    """A log half-width as the interval's larger side, % of the ratio (exp(h) - 1)."""
    return (math.exp(h_log) - 1) * 100 if math.isfinite(h_log) else math.inf


def sets_needed(sd: float, alpha: float, c: float, target: float = 0.01, n_max: int = 2000) -> int | None:
    """The fewest sets at which the t-CS (level 1 - alpha, mixing c) with sample SD ``sd`` (log) is
    within +-``target`` (as a share of the ratio, the larger side); None past n_max."""
    goal = math.log1p(target)
    for n in range(2, n_max + 1):
        if stats._t_cs_halfwidth(n, sd * sd * (n - 1), alpha, c) <= goal:
            return n
    return None


def rows(d: dict, every: bool):
    per_set_s = d["timing"]["total_s"] / max(1, len(d.get("sets") or []))
    for c in d["comparisons"]:
        if c.get("metric") != "wall_us" or not c.get("set_log_ratios") or c.get("ci_low") is None:
            continue
        if not every and not (c["label"].startswith("B512 ") and c["op"] == "fwd"):
            continue
        x = [v for v in c["set_log_ratios"] if v is not None and math.isfinite(v)]
        n = len(x)
        if n < 3:
            continue
        sd = statistics.stdev(x)
        rep = max(c["ci_high"] - c["ratio"], c["ratio"] - c["ci_low"]) / c["ratio"] * 100
        m, lo, hi = stats.t_cs(x, c["alpha"], c["cs_mixing"])
        check = max(math.exp(hi) - math.exp(m), math.exp(m) - math.exp(lo)) / math.exp(m) * 100
        h95 = sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        t95 = pct(h95)
        need = sets_needed(sd, c["alpha"], c["cs_mixing"])
        yield {"label": f"{c['label']} {c['op']}", "n": n, "sd": sd * 100, "cs": rep, "check": check, "t95": t95,
               "need": need, "need_s": need * per_set_s if need else math.inf, "per_set_s": per_set_s,
               "in_cs": c["ci_low"] >= 0.97 and c["ci_high"] <= 1.03,
               "in_t95": math.exp(m - h95) >= 0.97 and math.exp(m + h95) <= 1.03}


def main(argv: list[str]) -> int:
    every = "--all" in argv
    paths = [a for a in argv if a != "--all"]
    if not paths:
        print("usage: python benchmarks/validity_price.py [--all] RUN_DIR_OR_RESULTS...", file=sys.stderr)
        return 2
    allr, runs = [], []
    if not every:
        print(f"{'run':<44} {'comparison':<24} {'sets':>4} {'SD %':>6} {'CS %':>6} {'check':>6} {'t95 %':>6} "
              f"{'CS/t95':>6} {'sets for 1 %':>12} {'s':>6}")
    for p in paths:
        d = results.load(Path(p))
        name = Path(p).name if Path(p).is_dir() else Path(p).parent.name
        mine = list(rows(d, every))
        runs.append((name, mine))
        if every and mine:  # a line per run: the intervals inside +-3 % of 1, and the widest
            w = max(mine, key=lambda r: r["cs"])
            print(f"{name:<20} probe {report.probe_median_us(d) or math.nan:5.2f} µs; inside ±3 % of 1: CS {sum(r['in_cs'] for r in mine)}, t95 "
                  f"{sum(r['in_t95'] for r in mine)} of {len(mine)}; widest {w['label']} CS ±{w['cs']:.2f} % "
                  f"t95 ±{w['t95']:.2f} % ({w['n']} sets)")
        for r in mine:
            allr.append(r)
            if every:
                continue
            print(f"{name:<44} {r['label']:<24} {r['n']:>4} {r['sd']:>6.2f} {r['cs']:>6.2f} {r['check']:>6.2f} "
                  f"{r['t95']:>6.2f} {r['cs'] / r['t95']:>6.2f} {r['need'] or '>2000':>12} {r['need_s']:>6.0f}")
    groups = {}
    for r in allr:
        groups.setdefault(r["label"], []).append(r)
    print("\nmedians per comparison over the runs:")
    for lab, rs in groups.items():
        def md(k):
            return statistics.median(r[k] for r in rs)
        hit_cs = sum(r["cs"] <= 1.0 for r in rs)
        hit_t = sum(r["t95"] <= 1.0 for r in rs)
        print(f"  {lab:<24} runs {len(rs):>3}  sets {md('n'):>4.0f}  SD {md('sd'):.2f} %  CS ±{md('cs'):.2f} % "
              f"(<= 1 % in {hit_cs})  t95 ±{md('t95'):.2f} % (<= 1 % in {hit_t})  CS/t95 {md('cs') / md('t95'):.2f}  "
              f"sets for ±1 % {md('need'):.0f} ({md('need_s'):.0f} s at {md('per_set_s'):.2f} s a set)")
    if every:  # issue #10's A/A figure: every wall interval inside +-3 % of 1
        full = [(nm, rs) for nm, rs in runs if rs]
        print(f"\nruns with every wall interval inside ±3 % of 1: as reported (CS) "
              f"{sum(all(r['in_cs'] for r in rs) for _, rs in full)} of {len(full)}, fixed-n t95 "
              f"{sum(all(r['in_t95'] for r in rs) for _, rs in full)} of {len(full)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
