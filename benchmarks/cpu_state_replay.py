"""``sampling.cpu_state: usual`` replayed on committed lockstep runs: each run's comparisons recomputed
with the code's own functions (results.comparisons, method /5) counting every cycle (``all``, as
the runs were judged) and only the cycles whose two bursts both ran at the comparison's usual CPU
speed (``usual``: stats.usual_speed, stats.STATE_REACH). Offline, on what the runs sampled: the
runner stopped cycling a comparison once its interval was within 1 % (``sampling.precision``), so
a live ``usual`` run would give the undecided ones the cycles the narrowed ones no longer take.

Per run: the cycles left out, the batch-512 and batch-2 forward half-widths (% of the ratio,
widths.hw) and ratios, all / usual; for A/A runs (every env the same version) the wall intervals
inside +-3 % of 1 and the wall and host intervals that exclude 1 (each one misses the truth).
Totals per kind of run at the end, for all runs and split by the CPU state each met (the speed
probe's median below or above 5 µs, report.probe_median_us: the H200's fast level reads ~3.4 µs,
the slow one 6-9).

Usage: python benchmarks/cpu_state_replay.py RUN [RUN ...]
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from widths import cli, excluding_one, hw, inside  # noqa: E402

from matrix_runner import report, results  # noqa: E402

MODES = ("all", "usual")


def judged(d: dict, mode: str) -> list[dict]:
    """``d``'s comparisons by method /5 with ``cpu_state`` ``mode``."""
    settings = {**(d.get("settings") or {}), "method": "lockstep-sets/anytime-t-cs/5", "cpu_state": mode}
    return results.comparisons(d["cases"], [e["label"] for e in d["envs"] if e.get("status") == "ok"],
                               settings.get("min_effect") or 0.05, settings=settings,
                               pairs=results.env_pairs(d["envs"]), sets=d.get("sets"))


def _fmt(v: list) -> str:
    return "/".join(f"{x:.2f}" for x in v)


def main(runs: list[str]) -> None:
    groups = ("all runs", "fast-state runs", "slow-state runs")
    tot = {(g, m): {"aa": 0, "aa_all_in": 0, "aa_in": 0, "aa_n": 0, "miss": 0, "b512": [], "b512_runs": 0, "b512_all": 0,
                    "b2": []} for g in groups for m in MODES}
    for run in runs:
        d = results.load(run)
        if str((d.get("settings") or {}).get("quick")) == "True" or len(d.get("envs") or []) < 2 or not d.get("sets"):
            continue
        vers = {(e.get("flash_attn_version") or e.get("requested_version") or e.get("label")) for e in d["envs"]}
        aa = len(vers) == 1
        name = Path(run).name if Path(run).name not in ("results.json", "results.json.gz") else Path(run).parent.name
        probe = report.probe_median_us(d)
        state = "fast-state runs" if probe is not None and probe < 5.0 else "slow-state runs"
        parts = []
        for mode in MODES:
            cs = judged(d, mode)
            w = [c for c in cs if c["metric"] == "wall_us"]
            left = sum(c.get("state_dropped") or 0 for c in cs if c["metric"] in ("wall_us", "host_us"))
            b512 = [hw(c) for c in w if c["label"].startswith("B512 ") and c["op"] == "fwd"]
            b2 = [hw(c) for c in w if c["label"].startswith("B2 ") and c["op"] == "fwd"]
            r512 = [c["ratio"] for c in w if c["label"].startswith("B512 ") and c["op"] == "fwd"]
            s = f"{mode:5s} left out {left:4d}; B512 fwd ±{_fmt(b512)} % ({'/'.join(f'{x:.3f}' for x in r512)}), B2 fwd ±{_fmt(b2)} %"
            n_in = sum(1 for c in w if inside(c))
            miss = len(excluding_one({"comparisons": cs})[0])
            if aa:
                s += f"; inside ±3 %: {n_in}/{len(w)}; excluding 1: {miss}"
            for t in (tot[("all runs", mode)], tot[(state, mode)]):
                if aa:
                    t["aa"] += 1
                    t["aa_all_in"] += n_in == len(w)
                    t["aa_in"] += n_in
                    t["aa_n"] += len(w)
                    t["miss"] += miss
                else:
                    t["b512"] += b512
                    t["b512_runs"] += 1
                    t["b512_all"] += bool(b512) and all(x <= 1.0 for x in b512)
                    t["b2"] += b2
            parts.append(s)
        print(f"{name} (speed probe {probe:.2f} µs)\n    " + "\n    ".join(parts))
    for g, mode in tot:
        t = tot[(g, mode)]
        if not t["aa"] and not t["b512_runs"]:
            continue
        line = f"{g}, {mode:5s}: A/A runs {t['aa']}: all wall intervals inside ±3 % in {t['aa_all_in']}, {t['aa_in']} of {t['aa_n']} inside, {t['miss']} wall/host intervals exclude 1"
        for k, lim in (("b512", 1.0), ("b2", 5.0)):
            v = t[k]
            if v:
                line += (f"; seed {k.upper()} fwd median ±{statistics.median(v):.2f} %, ≤{lim:g} % in "
                         f"{sum(1 for x in v if x <= lim)} of {len(v)}")
        if t["b512_runs"]:
            line += f"; seed runs with all three B512 fwd ≤1 %: {t['b512_all']} of {t['b512_runs']}"
        print(line)


if __name__ == "__main__":
    cli(main, __doc__)
