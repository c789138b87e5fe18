"""Print a run's wall-time comparisons as measured figures: ratio, interval, half-width (% of the
ratio), verdict, process sets; and the run's timing. Usage: python benchmarks/lockstep_summary.py RESULTS.json"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner.results import read_text  # results.json or an archived .gz


def main(path: str) -> None:
    d = json.loads(read_text(path))
    t = d.get("timing") or {}
    sets = d.get("sets") or []
    print(f"{path}: timing {t.get('timing_phase_s')} s, total {t.get('total_s')} s (before timing "
          f"{t.get('before_timing_s')} s, of it the driver's probe {t.get('probe_s')} s; envs {t.get('env_phase_s')} s; "
          f"workers stopped after the last set {t.get('close_s')} s, kept back for it {t.get('close_reserve_s')} s, for the results {t.get('finish_reserve_s')} s), "
          f"{len(sets)} sets, "
          f"stopped: {t.get('stop_reason')}; cpus {(d.get('settings') or {}).get('cpus', {}).get('set_cpus')}")
    if sets:
        ph = {}
        for s in sets:
            for k, v in (s.get("phase_s") or {}).items():
                ph[k] = ph.get(k, 0) + v
        print("  set phases (s, all sets): " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items())
              + f"; cycles {sum(s.get('cycles', 0) for s in sets)}")
        print("  set seconds: " + " ".join(f"{s.get('seconds', 0):.1f}" for s in sets))
        pre = {}
        for s in sets:
            for key, w in (s.get("workers") or {}).items():
                if isinstance(w.get("preimport"), dict):
                    pre.setdefault(key, []).append(w["preimport"])
        for key, ps in pre.items():  # runner: the pre-import of earlier sets' set-up modules
            print(f"  pre-import {key}: {len(ps)} sets, modules loaded {min(p['imported'] for p in ps)}-"
                  f"{max(p['imported'] for p in ps)}, failed {max(p['failed'] for p in ps)}, "
                  f"{min(p['seconds'] for p in ps):.2f}-{max(p['seconds'] for p in ps):.2f} s")
    fc = {}
    for c in d.get("cases") or []:
        f = c.get("first_call_ms") or {}
        if f.get("first_set_median") is not None:
            fc.setdefault(c["env"], []).append((f["first_set_median"], f.get("later_median")))
    for env, v in fc.items():  # the first case of a process pays its lazy imports
        print(f"  first call, ms, {env}: first set max {max(a for a, _ in v):.1f}, later sets max "
              f"{max((b for _, b in v if b is not None), default=float('nan')):.1f}")
    verdicts = {}
    for c in d.get("comparisons") or []:
        if c["metric"] not in ("wall_us", "host_us"):
            continue
        lo, hi, r = c.get("ci_low"), c.get("ci_high"), c["ratio"]
        hw = (max(hi - r, r - lo) / r * 100) if lo and hi else float("inf")
        if c["metric"] == "wall_us":
            verdicts[c["verdict"]] = verdicts.get(c["verdict"], 0) + 1
        print(f"  {c['metric'][:4]} {c['candidate']:>12} {c['label']:<20} {c['op']:<4} {r:6.3f} "
              f"[{lo or 0:6.3f}, {hi if hi is not None else float('inf'):6.3f}] ±{hw:5.1f}%  {c['verdict']:<11} "
              f"sets {c.get('n_sets', c.get('n_rounds'))}  {c.get('attribution') or ''}")
    print("  wall verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
