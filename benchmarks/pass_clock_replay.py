"""Replay the kernel-time (profiler) and CUDA-graph clocks of committed H200 runs, offline: how many
process sets each clock needs before every comparison of it is decided, with the confidence
sequence's mixing tuned for the run's planned sets (what method /2 does) or for a few sets.

Why: those two clocks are timed by a pass after each set's cycles "while undecided"
(runner._needed); in the 60 s seed runs of 2026-12-03 (1.0 s sets) the passes made sets 1-6 last
~2.7 s instead of ~1.4 s, ~9 s of the 58 s timing phase, and every kernel comparison took 7 sets.
Kernel time hardly varies between processes (a set's value moves by ~0.1 %), so the t-mixture
confidence sequence (stats.t_cs) is too wide only because its mixing ``c`` (stats.lai_mixing) was
tuned for ~24 sets: it is unbounded below 6 sets whatever the spread. The mixing is fixed before
any data is seen (per clock), so tuning it for another n keeps the sequence valid at every n.

Per run, clock and rule: the first n (sets in order) at which every comparison of the clock is
decided under the run's rules (stats.set_compare at Bonferroni level, then stats.select_family:
e-BY, as runner.comparisons_now), the verdicts then, and intervals excluding 1 at that n. The
kernels of 2.6.3 and 2.7.0.post2 are the same sources, so every comparison here is an A/A: a
"faster"/"slower" is false. Also: the seconds those sets' passes cost (phase_s device_init +
device + finish, sets after the stop), i.e. what an earlier stop gives back to the cycles.

Usage: python benchmarks/pass_clock_replay.py [N_TARGET ...]   (default: 3 4 5 6)
"""
from __future__ import annotations

import glob
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results, stats

ROOT = Path(__file__).resolve().parents[1]
CLOCKS = ("device_us", "graph_us")


def runs() -> list[Path]:
    """Committed H200 runs of method /2 with a kernel-time clock (lockstep sets), by name."""
    out = []
    for d in sorted(glob.glob(str(ROOT / "reports" / "h200-*"))):
        try:
            r = results.load(d)
        except Exception:  # noqa: BLE001 - not a run directory
            continue
        st = r.get("settings") or {}
        if st.get("method") != "lockstep-sets/anytime-t-cs/2" or st.get("quick"):
            continue
        if any((c.get("metrics") or {}).get("device_us", {}).get("by_set") for c in r["cases"]):
            out.append(Path(d))
    return out


def clock_sets(r: dict, clock: str) -> tuple[list, dict]:
    """(set ids in order, {(label, case id): {set id: [µs samples]}}) of ``clock`` in run ``r``."""
    data, ids = {}, set()
    for c in r["cases"]:
        if c.get("status") != "ok":
            continue
        bs = ((c.get("metrics") or {}).get(clock) or {}).get("by_set") or {}
        data[(c["env"], c["id"])] = bs
        ids |= set(bs)
    return sorted(ids, key=int), data


def replay(r: dict, clock: str, n_target: int | None) -> dict | None:
    """Decide ``clock`` on the first n sets, n = 1, 2, ...; the first n where none is undecided."""
    order, data = clock_sets(r, clock)
    if not order:
        return None
    labels = [e["label"] for e in r["envs"] if e.get("status") == "ok"]
    st = r["settings"]
    nt = int(st.get("planned_sets") or 8)
    cids = list(dict.fromkeys(cid for _, cid in data))
    todo = [(b, k, cid) for b, k in stats.pairs_among(labels) for cid in cids if (b, cid) in data and (k, cid) in data]
    first: dict = {}  # comparison index -> the first n at which it was decided
    wrong = 0  # of those first decisions, faster/slower (false: the kernels are the same sources)
    for n in range(1, len(order) + 1):
        keep = set(order[:n])
        cmps = []
        for b, k, cid in todo:
            bs = {s: v for s, v in data[(b, cid)].items() if s in keep}
            ks = {s: v for s, v in data[(k, cid)].items() if s in keep}
            cmps.append(stats.set_compare(bs, ks, min_effect=float(st.get("min_effect") or 0.05),
                                          family_size=len(todo), family_alpha=float(st.get("alpha") or 0.05),
                                          n_target=nt, cycles=False, pass_target=n_target))
        stats.select_family(cmps, family_alpha=float(st.get("alpha") or 0.05), family_size=len(todo),
                            min_effect=float(st.get("min_effect") or 0.05))
        for j, c in enumerate(cmps):
            if c and c["verdict"] not in ("ambiguous", "provisional") and j not in first:
                first[j] = n
                wrong += c["verdict"] in ("faster", "slower")
        if all(c and c["verdict"] not in ("ambiguous", "provisional") for c in cmps):
            verdicts = [c["verdict"] for c in cmps]
            return {"n": n, "of": len(order), "sets": order[:n], "false": sum(v in ("faster", "slower") for v in verdicts),
                    "same": verdicts.count("same"), "m": len(cmps), "first": first, "wrong": wrong,
                    "excl1": sum(not c["ci_low"] <= 1.0 <= c["ci_high"] for c in cmps),
                    "hw": max((c["ci_high"] / c["ratio"] - 1) * 100 for c in cmps)}
    return {"n": None, "of": len(order), "sets": order, "false": 0, "same": 0, "m": len(todo), "excl1": 0, "hw": None,
            "first": first, "wrong": wrong}


def pass_seconds(r: dict, after: list) -> float:
    """Seconds of profiler pass (device_init + device) in the sets ``after`` (ids): what an earlier
    stop of the kernel-time clock would have given back (the graph clock's share of 'finish' is
    not separated in phase_s and is left out)."""
    by = {str(s["set"]): s for s in r.get("sets") or []}
    return sum((by.get(s, {}).get("phase_s") or {}).get(k, 0.0) for s in after for k in ("device_init", "device"))


def main(argv: list[str]) -> int:
    targets = [int(a) for a in argv] or [3, 4, 5, 6]
    rules = [None, *targets]
    name = lambda t: "planned" if t is None else f"nt={t}"  # noqa: E731
    tot = {(clk, name(t)): {"runs": 0, "n": [], "false": 0, "excl1": 0, "undecided": 0, "saved": 0.0, "hw": [],
                            "cmp_n": [], "cmp_undecided": 0, "cmp_sets": 0, "cmp_false": 0}
           for clk in CLOCKS for t in rules}
    for d in runs():
        r = results.load(d)
        line = [d.name[:44].ljust(44)]
        for clk in CLOCKS:
            base = replay(r, clk, None)
            if base is None:
                continue
            for t in rules:
                x = replay(r, clk, t)
                a = tot[(clk, name(t))]
                a["runs"] += 1
                a["cmp_n"] += list(x["first"].values())
                a["cmp_undecided"] += x["m"] - len(x["first"])
                a["cmp_false"] += x["wrong"]
                # the sets each comparison's pass was taken in: up to its decision, else every set of the data
                a["cmp_sets"] += sum(x["first"].values()) + (x["m"] - len(x["first"])) * x["of"]
                if x["n"] is None:
                    a["undecided"] += 1
                    line.append(f"{clk[:3]} {name(t)}: -/{x['of']}")
                    continue
                a["n"].append(x["n"])
                a["false"] += x["false"]
                a["excl1"] += x["excl1"]
                a["hw"].append(x["hw"])
                if clk == "device_us" and base["n"] is not None and t is not None:
                    order, _ = clock_sets(r, clk)
                    a["saved"] += pass_seconds(r, order[x["n"]:base["n"]])
                line.append(f"{clk[:3]} {name(t)}: {x['n']}/{x['of']}" + (f" FALSE {x['false']}" if x["false"] else ""))
        print("  ".join(line))
    print("\nper clock and mixing: runs, sets to decide every comparison (mean, max), false faster/slower,"
          " intervals excluding 1 at that n, largest half-width % (median over runs), profiler seconds given back;"
          " per comparison: how many were decided within the data and after how many sets on average, first"
          " decisions faster/slower (false), the passes"
          " (comparison x set) taken until then")
    for (clk, rule), a in tot.items():
        if not a["runs"]:
            continue
        ns = a["n"]
        hw = sorted(a["hw"])
        print(f"{clk:9} {rule:8} runs {a['runs']:3}  sets mean {sum(ns) / max(1, len(ns)):.2f} max {max(ns, default=0)}"
              f"  undecided {a['undecided']}  false {a['false']}  excl1 {a['excl1']}"
              f"  hw {hw[len(hw) // 2] if hw else float('nan'):.2f} %  saved {a['saved']:.1f} s"
              f"  | per comparison: decided {len(a['cmp_n'])} (mean n {sum(a['cmp_n']) / max(1, len(a['cmp_n'])):.2f}),"
              f" false faster/slower {a['cmp_false']}, undecided {a['cmp_undecided']}, passes {a['cmp_sets']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
