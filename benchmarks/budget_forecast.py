"""What time budget would meet issue #10's figures on the H200? A forecast from committed 60 s runs.

For each run given (results.json of a default-config run: the seed comparison or an A/A), a run
``k`` times as long is imitated by drawing ``k x n`` of its own ``n`` process sets with
replacement (the bootstrap: the run's sets play the machine as that run met it), and its wall
comparisons are judged by the statistics' own functions as the runner judges a finished run:
``stats.set_compare`` per case (anytime-valid t confidence sequence, mixing tuned to the drawn
number of sets, Bonferroni over the 12 comparisons, the glitch guard as in a pinned run) then
``stats.select_family`` (e-BY). Printed per budget over all runs and draws: for A/A runs the share
of runs with all 12 wall intervals inside +-3 % of 1, and the chance of that three runs in a row
(its cube); for seed runs the share with every batch-2 forward interval within +-5 % of its
ratio (the half-width as report.half_width_pct gives it) and with every batch-512 forward one
within +-1 %; and the median half-widths. At k = 1 the draws imitate the runs themselves, which
checks the forecast against what those runs reported (also printed: the observed shares). In A/A
runs each case's sets are first re-centred to a ratio of exactly 1 (each drawn run's offset is then
drawn afresh, as in a new run; sim_lockstep.py does the same), so the k = 1 line is a little more
favourable than the runs themselves were when their offsets sat off 1.

A forecast, not a measurement: more process sets of one run are drawn from that run's sets, so a
machine whose state drifts over minutes (the H200's CPU does) is modelled as holding still, and
the sets' spread is that of the 60 s run. Usage:
python benchmarks/budget_forecast.py [--draws 40] [--k 1,2,3,4] [--seed N] RUN_DIR [RUN_DIR ...]
(the draws of each run come from its own stream, seeded by --seed, its folder name and k: the
figures do not depend on the order the runs are given in)
"""
from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import report, results, stats  # noqa: E402

MIN_EFFECT, ALPHA = 0.05, 0.05


def wall_cases(doc: dict, centre: bool) -> tuple[list[str], list[tuple]]:
    """(set ids both envs of every ok case share, [(case id, op, batch, base metric, cand metric)]);
    ``centre`` (A/A runs): each case's candidate values divided by the exp of the mean over sets of
    the set log ratio (stats.set_log_ratio), so that the drawn runs' truth is exactly 1 and each
    drawn run's offset is drawn afresh (undone, every draw would keep its run's own offset)."""
    envs = [e["label"] if isinstance(e, dict) else e for e in doc["envs"]]
    base, cand = envs[0], envs[1]
    by = {(c["env"], c["id"]): c for c in doc["cases"]}
    out, sids = [], None
    for (env, cid), c in by.items():
        if env != base or c.get("status") != "ok" or (cand, cid) not in by or by[(cand, cid)].get("status") != "ok":
            continue
        mb, mc = c["metrics"]["wall_us"], by[(cand, cid)]["metrics"]["wall_us"]
        if centre:
            ys = [stats.set_log_ratio(mb["by_set"][s], mc["by_set"][s]) for s in mb["by_set"] if s in mc["by_set"]]
            f = math.exp(-float(np.mean([y for y in ys if y is not None])))
            mc = {key: {s: {i: v * f for i, v in cyc.items()} for s, cyc in mc[key].items()}
                  for key in ("by_set", "raw_by_set") if key in mc}
        out.append((cid, c["op"], c["batch"], mb, mc))
        s = set(mb["by_set"]) & set(mc["by_set"])
        sids = s if sids is None else sids | s
    return sorted(sids or [], key=int), out


def judge(sids: list[str], cases: list[tuple], n_target: int) -> list[dict]:
    """The run's 12 wall comparisons over the drawn sets ``sids`` (repeats get fresh ids)."""
    cmps = []
    for cid, op, batch, mb, mc in cases:
        b, k, rb, rk = {}, {}, {}, {}
        for j, s in enumerate(sids):
            if s in mb["by_set"] and s in mc["by_set"]:
                b[j], k[j] = mb["by_set"][s], mc["by_set"][s]
                rb[j], rk[j] = mb.get("raw_by_set", {}).get(s, b[j]), mc.get("raw_by_set", {}).get(s, k[j])
        r = stats.set_compare(b, k, min_effect=MIN_EFFECT, family_size=len(cases), family_alpha=ALPHA,
                              n_target=n_target, cycles=True, plain=(rb, rk))
        if r is not None:
            r.update(op=op, batch=batch)
        cmps.append(r)
    stats.select_family(cmps, family_alpha=ALPHA, family_size=len(cases), min_effect=MIN_EFFECT)
    return [c for c in cmps if c is not None]


def figures(cmps: list[dict], aa: bool) -> dict:
    hw = {(c["op"], c["batch"], i): report.half_width_pct(c) for i, c in enumerate(cmps)}
    if aa:
        return {"inside": all(c["ci_low"] >= 0.97 and c["ci_high"] <= 1.03 for c in cmps) and len(cmps) == 12,
                "b2": [h for (op, b, _), h in hw.items() if b == 2], "b512f": [h for (op, b, _), h in hw.items() if b == 512 and op == "fwd"]}
    b2f = [h for (op, b, _), h in hw.items() if b == 2 and op == "fwd"]
    b512f = [h for (op, b, _), h in hw.items() if b == 512 and op == "fwd"]
    return {"b2f_ok": bool(b2f) and all(h is not None and h <= 5 for h in b2f),
            "b512f_ok": bool(b512f) and all(h is not None and h <= 1 for h in b512f), "b2": b2f, "b512f": b512f}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--draws", type=int, default=40, help="bootstrap runs per run and budget (default 40)")
    ap.add_argument("--k", default="1,2,3,4", help="budgets as multiples of the runs' own (default 1,2,3,4)")
    ap.add_argument("--seed", type=int, default=20261205)
    a = ap.parse_args()
    ks = [float(x) for x in a.k.split(",")]
    docs = []
    for p in a.runs:
        doc = results.load(Path(p))
        envs = [e.get("requested_version") if isinstance(e, dict) else None for e in doc["envs"]]
        aa = len(set(envs)) == 1
        sids, cases = wall_cases(doc, aa)
        if len(sids) < 4 or len(cases) != 12:
            print(f"{p}: skipped ({len(sids)} sets, {len(cases)} wall comparisons)")
            continue
        obs = [c for c in doc["comparisons"] if c["metric"] == "wall_us" and c.get("ratio")]
        for c in obs:
            c["batch"] = next(x["batch"] for x in doc["cases"] if x["id"] == c["case"])
        docs.append((p, aa, sids, cases, figures(obs, aa), doc))
    for kind in (True, False):
        group = [d for d in docs if d[1] == kind]
        if not group:
            continue
        name = "A/A" if kind else "seed"
        o = [d[4] for d in group]
        secs = [d[5]["timing"]["total_s"] for d in group]
        print(f"\n{name}: {len(group)} runs of {np.median(secs):.0f} s (median), {np.median([len(d[2]) for d in group]):.0f} sets (median)")
        if kind:
            print(f"  observed: all 12 inside ±3 % in {sum(x['inside'] for x in o)} of {len(o)}")
        else:
            print(f"  observed: batch-2 fwd all ≤ ±5 % in {sum(x['b2f_ok'] for x in o)} of {len(o)}, "
                  f"batch-512 fwd all ≤ ±1 % in {sum(x['b512f_ok'] for x in o)} of {len(o)}")
        for k in ks:
            ok1 = ok2 = tot = 0
            b2, b512 = [], []
            for p, aa, sids, cases, _, _ in group:
                # one stream per run and budget, from the run's folder name: the same draws whatever
                # order or company the runs are given in
                rng = random.Random(f"{a.seed}:{Path(p).name}:{k:g}")
                n = max(2, round(k * len(sids)))
                for _ in range(a.draws):
                    draw = [rng.choice(sids) for _ in range(n)]
                    f = figures(judge(draw, cases, n), aa)
                    tot += 1
                    b2 += [h for h in f["b2"] if h is not None and math.isfinite(h)]
                    b512 += [h for h in f["b512f"] if h is not None and math.isfinite(h)]
                    if aa:
                        ok1 += f["inside"]
                    else:
                        ok1 += f["b2f_ok"]
                        ok2 += f["b512f_ok"]
            if aa:
                s = ok1 / tot
                print(f"  x{k:g} (~{k * np.median(secs):.0f} s): all 12 inside ±3 % {s:.0%} of {tot} draws, "
                      f"three in a row {s ** 3:.0%}; median half-width batch 2 ±{np.median(b2):.2f} %, batch-512 fwd ±{np.median(b512):.2f} %")
            else:
                print(f"  x{k:g} (~{k * np.median(secs):.0f} s): batch-2 fwd all ≤ ±5 % {ok1 / tot:.0%}, batch-512 fwd all ≤ ±1 % "
                      f"{ok2 / tot:.0%} of {tot} draws; median half-width batch-2 fwd ±{np.median(b2):.2f} %, batch-512 fwd ±{np.median(b512):.2f} %")


if __name__ == "__main__":
    main()
