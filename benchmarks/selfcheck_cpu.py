"""Self-checks of the measurement method on CPU (this machine), with stand-in flash_attn wheels.

1. A/A: the same stand-in version under two labels (a=2.6.3,b=2.6.3), REPEATS separate runs; counts
   the wall-time comparisons that are not "same" (target: <= 5 %).
2. Planted overhead: stand-in "2.7.0.post2" wheels that busy-wait PLANTED µs per forward call;
   each must be found "slower" with an estimated delta within +-20 % of the planted value.

Every run is a real `matrix-run --device cpu` process (real uv envs, worker subprocesses, interleaved
rounds). Prints one line per run and the summary. Usage: python benchmarks/selfcheck_cpu.py [REPEATS]
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import standin  # noqa: E402

CONFIG = """
ops: [fwd, bwd]
shapes:
  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}
  - {batch: 2, seqlen: 32, nheads: 4, head_dim: 32}
sampling: {min_rounds: 3, max_rounds: 16, time_budget_s: 150}
"""
PLANTED = (5.0, 20.0)


def run(tmp: Path, versions: str, wheels: Path, name: str) -> dict:
    out = tmp / name
    cp = subprocess.run([sys.executable, "-m", "matrix_runner", "--versions", versions, "--device", "cpu",
                         "--config", str(tmp / "c.yaml"), "--find-links", str(wheels), "--envs-dir", str(tmp / "envs"),
                         "--wheel-cache", str(tmp / "cache"), "--output", str(out)], capture_output=True, text=True)
    if cp.returncode not in (0,):
        sys.exit(f"{name}: exit {cp.returncode}\n{cp.stderr[-2000:]}")
    return json.loads((out / "results.json").read_text())


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "c.yaml").write_text(CONFIG)
        standin.build_wheel(standin.make_source(tmp / "src0", "2.6.3"), tmp / "w0")
        aa_total = aa_not_same = aa_unpaired_not_same = 0
        from matrix_runner import stats
        print("A/A (a=2.6.3, b=2.6.3): wall verdicts per case")
        for i in range(repeats):
            res = run(tmp, "a=2.6.3,b=2.6.3", tmp / "w0", f"aa{i}")
            w = [c for c in res["comparisons"] if c["metric"] == "wall_us"]
            aa_total += len(w)
            aa_not_same += sum(c["verdict"] != "same" for c in w)
            by = {(c["env"], c["id"]): c for c in res["cases"]}
            for c in w:  # the same samples, compared as independent groups (the method before pairing)
                u = stats.compare(by[("a", c["case"])]["metrics"]["wall_us"]["samples"],
                                  by[("b", c["case"])]["metrics"]["wall_us"]["samples"], paired=False)
                aa_unpaired_not_same += u["verdict"] != "same"
            print(f"  run {i}: " + ", ".join(f"{c['op']} {c['label']}: {c['verdict']} {c['ratio']:.3f} "
                                             f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]" for c in w)
                  + f"  ({len(res['rounds'])} processes, {res['timing']['stop_reason']})")
        print(f"A/A: {aa_not_same}/{aa_total} comparisons not 'same' = {aa_not_same / max(aa_total, 1):.1%} (target <= 5%); "
              f"same samples compared unpaired: {aa_unpaired_not_same}/{aa_total} not 'same'")
        ok = 0
        tot = 0
        print("Planted host overhead (fwd only; bwd has none):")
        for us in PLANTED:
            w = tmp / f"w{us:g}"
            standin.build_wheel(standin.make_source(tmp / f"src{us:g}", "2.7.0.post2", us), w)
            for f in (tmp / "w0").glob("*.whl"):
                (w / f.name).write_bytes(f.read_bytes())
            res = run(tmp, "2.6.3,2.7.0.post2", w, f"planted{us:g}")
            for c in res["comparisons"]:
                if c["metric"] != "wall_us" or c["op"] != "fwd":
                    continue
                tot += 1
                good = c["verdict"] == "slower" and abs(c["delta_us"] - us) <= 0.2 * us
                ok += good
                print(f"  planted {us:g} µs, {c['label']}: {c['verdict']} ratio {c['ratio']:.3f}, delta {c['delta_us']:.2f} µs "
                      f"[{c['delta_ci_low']:.2f}, {c['delta_ci_high']:.2f}] -> {'ok' if good else 'MISSED'} "
                      f"(error {100 * (c['delta_us'] - us) / us:+.0f}%)")
        print(f"planted: {ok}/{tot} found slower with delta within +-20%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
