"""The glitch guard (stats.GLITCH_LOG, results method /4) replayed on committed lockstep runs.

For every run given (results/2, two or more envs), the run's comparisons are recomputed twice with the
code's own functions (results.comparisons): without the guard, as methods /1-/3 judged them, and with
it. Per run: the cycles the guard leaves out (wall and host), the wall verdicts that change, and, for
A/A runs (every env the same version), the wall and host intervals that exclude 1 (each one misses
the truth) and the widest wall half-width (% of the ratio) -- with the guard / without. Reads
committed results only.

Usage: python benchmarks/glitch_guard_replay.py RUN_DIR [RUN_DIR ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from widths import excluding_one, hw  # noqa: E402

from matrix_runner import results  # noqa: E402


def judged(d: dict, guard: bool) -> list[dict]:
    method = results.METHOD if guard else "lockstep-sets/anytime-t-cs/3"
    settings = {**(d.get("settings") or {}), "method": method}
    return results.comparisons(d["cases"], [e["label"] for e in d["envs"] if e.get("status") == "ok"],
                               settings.get("min_effect") or 0.05, settings=settings,
                               pairs=results.env_pairs(d["envs"]))


def main(runs: list[str]) -> None:
    tot = {"runs": 0, "changed": 0, "dropped": 0, "miss_on": 0, "miss_off": 0}
    for run in runs:
        d = results.load(run)
        if str((d.get("settings") or {}).get("quick")) == "True" or len(d.get("envs") or []) < 2:
            continue
        on, off = judged(d, True), judged(d, False)
        key = lambda c: (c["baseline"], c["candidate"], c["case"], c["metric"])  # noqa: E731
        offd = {key(c): c for c in off}
        aa = len({(e.get("flash_attn_version") or e.get("requested_version") or e.get("label")) for e in d["envs"]}) == 1
        dropped = sum(c.get("dropped_cycles") or 0 for c in on if c["metric"] in ("wall_us", "host_us"))
        changed = [(c["case"][:24], offd[key(c)]["verdict"], c["verdict"]) for c in on
                   if c["metric"] == "wall_us" and key(c) in offd and offd[key(c)]["verdict"] != c["verdict"]]
        name = f"{Path(run).parent.name}/{Path(run).name}" if Path(run).name == "results.json" else Path(run).name
        line = f"{name:<46} dropped cycles {dropped:3d}; wall verdicts changed {len(changed)}"
        if changed:
            line += " " + ", ".join(f"{c}: {a} -> {b}" for c, a, b in changed)
        if aa:
            mon, moff = (len(excluding_one({"comparisons": cs})[0]) for cs in (on, off))
            won = max((hw(c) for c in on if c["metric"] == "wall_us"), default=float("nan"))
            woff = max((hw(c) for c in off if c["metric"] == "wall_us"), default=float("nan"))
            line += f"; A/A intervals excluding 1: {mon} / {moff}; widest wall ±{won:.1f} % / ±{woff:.1f} %"
            tot["miss_on"] += mon
            tot["miss_off"] += moff
        print(line)
        tot["runs"] += 1
        tot["changed"] += len(changed)
        tot["dropped"] += dropped
    print(f"{tot['runs']} runs: {tot['dropped']} cycles left out, {tot['changed']} wall verdicts changed; "
          f"A/A wall+host intervals excluding 1: {tot['miss_on']} with the guard, {tot['miss_off']} without")


if __name__ == "__main__":
    if not sys.argv[1:] or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if sys.argv[1:] else 2)
    main(sys.argv[1:])
