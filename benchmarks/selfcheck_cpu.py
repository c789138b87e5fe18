"""Self-checks of the measurement method on CPU (this machine), with stand-in flash_attn wheels.

1. A/A: the same stand-in version under two labels (a=2.6.3,b=2.6.3), REPEATS separate runs; counts
   the wall-time comparisons that are not "same" (target: <= 5 %) and any false faster/slower.
2. --quick A/A, QUICK runs: no faster/slower verdict may come out of one process set.
3. Planted overhead: stand-in "2.7.0.post2" wheels that busy-wait PLANTED µs per forward call;
   each must be found "slower" with an estimated delta within +-20 % of what the planted code costs
   *in context*: the stand-in's call timed in one process with the planted cost switched off and on
   in alternating blocks (standin.in_context_us), just before the run and just after it on the
   cores its sets used; the delta must lie within 20 % below the smaller and 20 % above the larger.
   On this machine a nominal 5 µs busy-wait costs 5.6-7.5 µs inside the call and 20 µs 20.9-28.1 µs,
   by the hour: a deadline busy-wait ends late whenever an interrupt, a steal or another task spans
   its deadline, so its mean cost follows the load of the moment (a run reads means of calls). The
   error against the nominal value is printed too. 5 µs is ~6 % of the smallest stand-in call here, so these runs use
   --min-effect 0.02.

Every run is a real `matrix-run --device cpu` process (real uv envs, lockstep process sets of real
worker subprocesses). Prints one line per run and the summary.
Usage: python benchmarks/selfcheck_cpu.py [--keep DIR] [--sampling 'KEY: VALUE, ...'] [REPEATS [QUICK [BUDGET_S]]]
(--keep DIR: each A/A run's results.json kept in DIR as aaN.json.gz; --sampling: added to the runs' sampling settings, e.g. 'cpu_state: usual'; BUDGET_S: the runs' time budget,
default 60 s: on this 2-core machine a set's length is the import of the next set's workers, ~3-4 s
since they start during the current set's cycles, so 60 s hold 15-19 sets (benchmarks/results/
cpu-selfcheck-s26.txt; 7-8 sets before that prefetch), and the A/A intervals are as wide as that many
processes per version let them be)
"""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import standin  # noqa: E402
import yaml  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner.config import parse_config  # noqa: E402

CONFIG = """
ops: [fwd, bwd]
shapes:
  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}
  - {batch: 2, seqlen: 32, nheads: 4, head_dim: 32}
sampling: {time_budget_s: BUDGET, set_seconds: 2}
"""
PLANTED = (5.0, 20.0)
def in_context_us(src: Path, us: float, case: dict, cpus: set | None = None) -> float:
    """The planted code's cost inside the stand-in's call (standin.in_context_us), µs per call;
    ``cpus``: measured pinned there (the run's set cores)."""
    return standin.in_context_us(src, us, case["batch"], case["seqlen_q"], case["nheads"], case["head_dim"],
                                 cpus=cpus)


def steal(res: dict) -> str:
    """The run's CPU steal on its set cores (runner: per set, over its cycles), median and max."""
    v = sorted(r["steal"] for r in res.get("sets") or [] if isinstance(r.get("steal"), (int, float)))
    return f"CPU steal median {v[len(v) // 2]:.0%}, max {v[-1]:.0%}" if v else "CPU steal unknown"


def run(tmp: Path, versions: str, wheels: Path, name: str, *extra: str) -> dict:
    out = tmp / name
    cp = subprocess.run([sys.executable, "-m", "matrix_runner", "--versions", versions, "--device", "cpu",
                         "--config", str(tmp / "c.yaml"), "--find-links", str(wheels), "--envs-dir", str(tmp / "envs"),
                         "--wheel-cache", str(tmp / "cache"), "--output", str(out), *extra], capture_output=True, text=True)
    if cp.returncode not in (0,):
        sys.exit(f"{name}: exit {cp.returncode}\n{cp.stderr[-2000:]}")
    return json.loads((out / "results.json").read_text())


def main() -> int:
    global CONFIG
    keep = None
    while sys.argv[1:2] in (["--sampling"], ["--keep"]):  # either order (review: --keep first had crashed)
        if sys.argv[1] == "--sampling":  # e.g. 'cpu_state: usual': a sampling option checked the same way
            CONFIG = CONFIG.replace("set_seconds: 2}", f"set_seconds: 2, {sys.argv[2]}}}")
            print(f"# sampling: {yaml.safe_load(CONFIG)['sampling']}")
        else:  # DIR: every A/A run's results.json kept there as aaN.json.gz (benchmarks/data/)
            keep = Path(sys.argv[2])
            keep.mkdir(parents=True, exist_ok=True)
        del sys.argv[1:3]
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    quick = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    budget = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "c.yaml").write_text(CONFIG.replace("BUDGET", f"{budget:g}"))
        standin.build_wheel(standin.make_source(tmp / "src0", "2.6.3"), tmp / "w0")
        aa_total = aa_not_same = aa_false = 0
        print("A/A (a=2.6.3, b=2.6.3): wall verdicts per case")
        for i in range(repeats):
            res = run(tmp, "a=2.6.3,b=2.6.3", tmp / "w0", f"aa{i}")
            if keep is not None:
                (keep / f"aa{i}.json.gz").write_bytes(gzip.compress((tmp / f"aa{i}" / "results.json").read_bytes(), mtime=0))
            w = [c for c in res["comparisons"] if c["metric"] == "wall_us"]
            aa_total += len(w)
            aa_not_same += sum(c["verdict"] != "same" for c in w)
            aa_false += sum(c["verdict"] in ("faster", "slower") for c in w)
            print(f"  run {i}: " + ", ".join(f"{c['op']} {c['label']}: {c['verdict']} {c['ratio']:.3f} "
                                             f"[{c['ci_low']:.3f}, {c['ci_high'] or float('inf'):.3f}]" for c in w)
                  + f"  ({len(res['sets'])} sets (planned {res['settings'].get('planned_sets')}), "
                  f"{res['timing']['timing_phase_s']:.0f} s, {res['timing']['stop_reason']}; {steal(res)})")
        print(f"A/A: {aa_not_same}/{aa_total} comparisons not 'same' = {aa_not_same / max(aa_total, 1):.1%} "
              f"(target <= 5%); false faster/slower: {aa_false}")
        q_total = q_false = 0
        for i in range(quick):
            res = run(tmp, "a=2.6.3,b=2.6.3", tmp / "w0", f"q{i}", "--quick")
            w = [c for c in res["comparisons"] if c["metric"] == "wall_us"]
            q_total += len(w)
            q_false += sum(c["verdict"] in ("faster", "slower") for c in w)
            print(f"  quick {i}: " + ", ".join(f"{c['verdict']} {c['ratio']:.3f}" for c in w)
                  + f" ({res['timing']['total_s']:.0f} s total)")
        print(f"--quick A/A: {q_false}/{q_total} faster/slower verdicts (target 0)")
        ok = 0
        tot = 0
        print("Planted host overhead (fwd only; bwd has none):")
        for us in PLANTED:
            w = tmp / f"w{us:g}"
            src = standin.make_source(tmp / f"src{us:g}", "2.7.0.post2", us)
            standin.build_wheel(src, w)
            for f in (tmp / "w0").glob("*.whl"):
                (w / f.name).write_bytes(f.read_bytes())
            # the planted cost in context just before and just after the run, on the cores its sets
            # used (a deadline busy-wait's cost follows the load of the moment: standin.in_context_us)
            cfg = parse_config(yaml.safe_load(CONFIG.replace("BUDGET", f"{budget:g}")), "selfcheck")
            fwd = [c.to_dict() for c in cfg.cases if c.op == "fwd"]
            before = {c["id"]: in_context_us(src, us, c) for c in fwd}
            res = run(tmp, "2.6.3,2.7.0.post2", w, f"planted{us:g}", "--min-effect", "0.02")
            cpus = {int(x) for x in (res["settings"].get("cpus") or {}).get("set_cpus") or []} or None
            print(f"  planted {us:g} µs run: {len(res['sets'])} sets on cores {sorted(cpus or [])}, {steal(res)}")
            for c in res["comparisons"]:
                if c["metric"] != "wall_us" or c["op"] != "fwd":
                    continue
                tot += 1
                case = next(x for x in fwd if x["id"] == c["case"])
                lo, hi = sorted((before[c["case"]], in_context_us(src, us, case, cpus)))
                good = c["verdict"] == "slower" and 0.8 * lo <= c["delta_us"] <= 1.2 * hi
                ok += good
                print(f"  planted {us:g} µs (in context {lo:.2f}-{hi:.2f} µs), {c['label']}: {c['verdict']} ratio "
                      f"{c['ratio']:.3f} [{c['ci_low']:.3f}, {c['ci_high'] or float('inf'):.3f}], delta "
                      f"{c['delta_us']:.2f} µs (baseline {c['base_median']:.1f} µs) -> {'ok' if good else 'MISSED'} "
                      f"({100 * (c['delta_us'] - hi) / hi:+.0f}% of the larger in-context cost, "
                      f"{100 * (c['delta_us'] - us) / us:+.0f}% of the nominal)")
        print(f"planted: {ok}/{tot} found slower with delta within -20 %/+20 % of the in-context cost's range "
              "(before the run unpinned, after it on the run's set cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
