"""Env-phase benchmark (CPU, this machine): how long matrix-run takes to get two envs runnable.

Three runs of the same two-version matrix (stand-in flash_attn sdists, tests/standin.py), each a
real `matrix-run --quick --device cpu` process, measured side by side in one invocation:

1. cold: empty envs dir and wheel cache -> two source builds, two envs;
2. cached: new envs dir, warm wheel cache -> envs created and installed from cached wheels;
3. rerun: same envs dir as 2 -> envs reused, zero builds.

Prints per-env seconds (from results.json: envs[].build.seconds) and the env phase in all
(timing.env_phase_s), against the targets (<= 2 s per env from a cached wheel; rerun env phase < 5 s
for two envs). Usage: python benchmarks/bench_envs.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import standin  # noqa: E402

CONFIG = "ops: [fwd]\nshapes:\n  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}\n"


def run(tmp: Path, name: str, envs: str, args: list[str]) -> dict:
    out = tmp / name
    cp = subprocess.run([sys.executable, "-m", "matrix_runner", "--versions", "2.6.3,2.7.0.post2", "--device", "cpu",
                         "--quick", "--config", str(tmp / "c.yaml"), "--envs-dir", str(tmp / envs),
                         "--wheel-cache", str(tmp / "cache"), "--output", str(out), *args],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit(f"{name}: matrix-run exited {cp.returncode}\n{cp.stderr[-2000:]}")
    return json.loads((out / "results.json").read_text())


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "c.yaml").write_text(CONFIG)
        for v in ("2.6.3", "2.7.0.post2"):
            standin.build_sdist(standin.make_source(tmp / "src", v), tmp / "sdists")
        fl = ["--find-links", str(tmp / "sdists")]
        rows = [("cold (2 source builds)", run(tmp, "cold", "envs-a", fl)),
                ("cached wheel, new envs", run(tmp, "cached", "envs-b", fl)),
                ("rerun, same envs", run(tmp, "rerun", "envs-b", fl))]
    print(f"{'run':<26}{'env':<14}{'method':<16}{'seconds':>8}{'reused':>8}")
    for name, res in rows:
        for e in res["envs"]:
            b = e["build"]
            print(f"{name:<26}{e['label']:<14}{b['method']:<16}{b['seconds']:>8.2f}{str(b['reused']):>8}")
        print(f"{'':<26}{'env phase':<30}{res['timing']['env_phase_s']:>8.2f}")
    cached = max(e["build"]["seconds"] for e in rows[1][1]["envs"])
    rerun = rows[2][1]["timing"]["env_phase_s"]
    builds = sum(e["build"]["method"].startswith("source") for e in rows[2][1]["envs"])
    print(f"\nper env from a cached wheel: {cached:.2f} s (target <= 2 s: {cached / 2:.2f}x of target)")
    print(f"rerun env phase, two envs:   {rerun:.2f} s (target < 5 s: {rerun / 5:.2f}x of target), builds: {builds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
