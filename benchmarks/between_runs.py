"""How often a comparison *between two runs* calls one build "faster" or "slower" than itself.

``matrix-run compare A B`` and a merged report (``matrix-run report RUN RUN``, the tox envs' merge)
compare an env of one run with an env of another. Those two never took turns on one core: their
process sets ran minutes or hours apart, on whatever CPU speed the machine had then. This replays
that comparison, with the code's own function (``results.compare_case``, ``paired=False``: what
``compare`` and ``results.merge`` call), on pairs of committed runs of the *same* build: the
baseline env (2.6.3, label ``a``) of each A/A run against the same env of another run. Every
"faster"/"slower" verdict it gives is false.

Per clock it prints the verdicts over all pairs, the pairs with any false wall verdict, and the
run-to-run spread of the per-run log ratio (SD, %) beside the median half-width of the
between-run interval (%, the larger side): an interval narrower than the spread of the thing it
estimates cannot hold its level.

Usage: python benchmarks/between_runs.py [--all-pairs] RUN_DIR... (default: the H200 A/A runs of the
default config, ``reports/h200-aa-68`` to ``-119``, consecutive pairs: the runs minutes apart on one
machine, the most favourable case)."""
import collections
import copy
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results, stats  # noqa: E402

METRICS = ("wall_us", "host_us", "device_us", "graph_us")


def env_only(doc: dict, label: str) -> dict:
    """A run's results with one env left (its cases too)."""
    d = copy.deepcopy(doc)
    d["envs"] = [e for e in d["envs"] if e["label"] == label]
    d["cases"] = [c for c in d["cases"] if c["env"] == label]
    return d


def main(argv: list[str]) -> int:
    all_pairs = "--all-pairs" in argv
    paths = [a for a in argv if not a.startswith("--")]
    root = Path(__file__).resolve().parents[1]
    if not paths:
        paths = [str(root / f"reports/h200-aa-{i}") for i in range(68, 120)]
    docs = [env_only(results.load(results.find(p)), "a") for p in paths]
    names = [Path(p).name for p in paths]
    pairs = ([(i, j) for i in range(len(docs)) for j in range(i + 1, len(docs))] if all_pairs
             else list(zip(range(len(docs)), range(1, len(docs)))))
    verdicts = {m: collections.Counter() for m in METRICS}
    any_false = 0
    logr = collections.defaultdict(list)  # (metric, case) -> log ratios over the pairs
    half = collections.defaultdict(list)  # metric -> interval half-widths, %
    for i, j in pairs:
        a, b = docs[i], docs[j]
        cb = {c["id"]: c for c in b["cases"]}
        false_here = False
        for x in a["cases"]:
            y = cb.get(x["id"])
            if y is None or x["status"] != "ok" or y["status"] != "ok":
                continue
            per, _, _ = results.compare_case({"metrics": x.get("metrics") or {}}, {"metrics": y.get("metrics") or {}},
                                             0.05, paired=False, seed_key=f"a/{x['id']}", metrics=METRICS)
            for m, c in per.items():
                if not c:
                    continue
                # the verdict its interval gives (stats.verdict: what compare printed before between-run
                # wall and host ratios became provisional)
                lo, hi = c.get("fixed_n_ci_without_run_spread") or (c["ci_low"], c["ci_high"])
                v = stats.verdict(c["ratio"], lo, hi, 0.05)
                verdicts[m][v] += 1
                if m == "wall_us" and v in ("faster", "slower"):
                    false_here = True
                if c["ratio"] > 0 and math.isfinite(c["ratio"]):
                    logr[(m, x["id"])].append(math.log(c["ratio"]))
                if lo and hi and math.isfinite(hi):
                    half[m].append(100 * max(hi / c["ratio"] - 1, 1 - lo / c["ratio"]))
        any_false += false_here
    print(f"{len(docs)} runs ({names[0]} .. {names[-1]}), {len(pairs)} {'pairs' if all_pairs else 'consecutive pairs'}"
          " of the same build (env a of each run against env a of another)")
    print(f"pairs with any false wall faster/slower verdict: {any_false} of {len(pairs)} "
          f"({100 * any_false / max(1, len(pairs)):.0f} %)")
    for m in METRICS:
        n = sum(verdicts[m].values())
        if not n:
            continue
        wrong = verdicts[m]["faster"] + verdicts[m]["slower"]
        sds = [100 * statistics.stdev(v) for (mm, _), v in logr.items() if mm == m and len(v) > 2]
        print(f"  {m:10s} {n:5d} comparisons: false faster/slower {wrong} ({100 * wrong / n:.1f} %); "
              + ", ".join(f"{k} {v}" for k, v in sorted(verdicts[m].items()))
              + (f"; run-to-run SD of the log ratio, median over cases {statistics.median(sds):.2f} %"
                 if sds else "")
              + (f"; interval half-width, median {statistics.median(half[m]):.2f} %" if half[m] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
