"""The adaptive glitch guard (stats.GLITCH_ADAPTIVE, measured and not adopted: its reach follows each
comparison's per-cycle spread, stats.glitch_reach, and it starts from the second set) replayed
against the guard of results method /5 (log 2 for every comparison) on committed lockstep runs.

Each run's comparisons are recomputed with the code's own functions (results.comparisons, method
/5) with the flag off and on. Per run: cycles left out (wall and host), wall verdicts that change, wall intervals
inside +-3 % of 1 and, for A/A runs (every env the same version), the wall and host intervals
that exclude 1 (each one misses the truth); for 2.6.3-vs-2.7.0.post2 runs the batch-2 and
batch-512 forward half-widths. ``--k K``: stats.GLITCH_K (default: the code's). Reads
committed results only (results.json or .json.gz).

Usage: python benchmarks/guard_reach_replay.py [--k K] RUN [RUN ...]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from widths import excluding_one, hw, inside  # noqa: E402

from matrix_runner import results, stats  # noqa: E402

OLD, NEW = False, True  # stats.GLITCH_ADAPTIVE
#: The log-ratio deviation from the centre of every cycle a guard left out, recorded by _recording
LEFT_OUT: list = []
_unglitched = stats._unglitched


def _recording(base: dict, cand: dict, center: float, reach: float = stats.GLITCH_LOG):
    """stats._unglitched, recording the log-ratio deviation of each cycle it leaves out (> 0: the
    candidate's burst was the slow one): the paired cycles (stats._paired) it did not keep."""
    kb, kc, dropped = _unglitched(base, cand, center, reach)
    LEFT_OUT.extend(math.log(k) - math.log(b) - center
                    for b, k in stats._paired({cy: b for cy, b in base.items() if cy not in kb}, cand))
    return kb, kc, dropped


stats._unglitched = _recording


def judged(d: dict, adaptive: bool) -> list[dict]:
    """Run ``d``'s comparisons by method /5 with the adaptive guard off or on."""
    stats.GLITCH_ADAPTIVE = adaptive
    settings = {**(d.get("settings") or {}), "method": "lockstep-sets/anytime-t-cs/5"}
    return results.comparisons(d["cases"], [e["label"] for e in d["envs"] if e.get("status") == "ok"],
                               settings.get("min_effect") or 0.05, settings=settings,
                               pairs=results.env_pairs(d["envs"]), sets=d.get("sets"))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--k"]:
        stats.GLITCH_K = float(argv[1])
        argv = argv[2:]
    print(f"# adaptive guard, GLITCH_K {stats.GLITCH_K:g} (reach within log {math.exp(stats.GLITCH_MIN_LOG):.2f} .. "
          f"log 2), vs method /5's (log 2); per run: adaptive / method /5")
    tot = {"runs": 0, "changed": 0, "drop_old": 0, "drop_new": 0, "miss_old": 0, "miss_new": 0,
           "in_old": 0, "in_new": 0, "aa_runs": 0, "aa_all_old": 0, "aa_all_new": 0,
           "seed_slow_cand": 0, "seed_left": 0}
    for run in argv:
        d = results.load(run)
        if str((d.get("settings") or {}).get("quick")) == "True" or len(d.get("envs") or []) < 2 or not d.get("sets"):
            continue
        old = judged(d, OLD)
        LEFT_OUT.clear()
        new = judged(d, NEW)
        slow_cand = sum(1 for v in LEFT_OUT if v > 0)
        key = lambda c: (c["baseline"], c["candidate"], c["case"], c["metric"])  # noqa: E731
        oldd = {key(c): c for c in old}
        vers = {(e.get("flash_attn_version") or e.get("requested_version") or e.get("label")) for e in d["envs"]}
        aa = len(vers) == 1
        drop = [sum(c.get("dropped_cycles") or 0 for c in cs if c["metric"] in ("wall_us", "host_us")) for cs in (new, old)]
        changed = [(c["label"] + " " + c["op"], oldd[key(c)]["verdict"], c["verdict"]) for c in new
                   if c["metric"] == "wall_us" and key(c) in oldd and oldd[key(c)]["verdict"] != c["verdict"]]
        w = [[c for c in cs if c["metric"] == "wall_us"] for cs in (new, old)]
        ins = [sum(1 for c in x if inside(c)) for x in w]
        name = Path(run).name if Path(run).name not in ("results.json", "results.json.gz") else Path(run).parent.name
        line = f"{name:<44} dropped {drop[0]:3d} / {drop[1]:3d}; verdicts changed {len(changed)}"
        if changed:
            line += " (" + ", ".join(f"{c}: {a} -> {b}" for c, a, b in changed) + ")"
        if aa:
            mis = [len(excluding_one({"comparisons": cs})[0]) for cs in (new, old)]
            line += f"; A/A excl. 1: {mis[0]} / {mis[1]}; inside ±3 %: {ins[0]} / {ins[1]}"
            tot["miss_new"] += mis[0]
            tot["miss_old"] += mis[1]
            tot["in_new"] += ins[0]
            tot["in_old"] += ins[1]
            tot["aa_runs"] += 1
            tot["aa_all_new"] += ins[0] == len(w[0])
            tot["aa_all_old"] += ins[1] == len(w[1])
        elif vers == {"2.6.3", "2.7.0.post2"}:
            line += f"; left out (adaptive) with the candidate's burst the slow one: {slow_cand} of {len(LEFT_OUT)}"
            tot["seed_slow_cand"] += slow_cand
            tot["seed_left"] += len(LEFT_OUT)
            f = [[hw(c) for c in x if c["op"] == "fwd"] for x in w]
            line += "; fwd ±" + "/".join(f"{v:.2f}" for v in f[0]) + " % / ±" + "/".join(f"{v:.2f}" for v in f[1]) + " %"
        print(line)
        tot["runs"] += 1
        tot["changed"] += len(changed)
        tot["drop_new"] += drop[0]
        tot["drop_old"] += drop[1]
    print(f"{tot['runs']} runs: cycles left out {tot['drop_new']} (adaptive) vs {tot['drop_old']} (/5); wall verdicts "
          f"changed {tot['changed']}; {tot['aa_runs']} A/A runs: wall+host intervals excluding 1 {tot['miss_new']} vs "
          f"{tot['miss_old']}, wall intervals inside ±3 % {tot['in_new']} vs {tot['in_old']}, runs with all inside "
          f"{tot['aa_all_new']} vs {tot['aa_all_old']}; 2.6.3-vs-2.7.0.post2 runs: of the {tot['seed_left']} cycles the "
          f"adaptive guard left out, {tot['seed_slow_cand']} had 2.7.0.post2's burst as the slow one")


if __name__ == "__main__":
    if not sys.argv[1:] or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if sys.argv[1:] else 2)
    main(sys.argv[1:])
