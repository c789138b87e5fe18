"""Slim vs full source build of flash-attn for the default config, from a real run's build records.

Reads a results.json whose envs were source-built by matrix-run (default: the committed H200 run)
and prints, per version: the measured slim build (wall seconds; per-file compile seconds from
ninja's log) and an estimate of the full build flash-attn's own setup.py does (every kernel file
of the version, for sm_80 and sm_90), made from the measured per-file times of the same kinds of
kernel file (fwd, fwd_split, bwd at hdim32), scheduled over the same MAX_JOBS. Larger head dims
compile longer, so the full estimate is a lower bound and the ratio too.

Usage: python benchmarks/slim_vs_full.py [RESULTS.json]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from matrix_runner.build import schedule  # noqa: E402
from matrix_runner.results import find, read_text

KERNEL_FILES_PER_KIND = 28  # 2.6.3 / 2.7.0.post2 setup.py: 7 head dims x 2 dtypes x 2 (causal) per kind
FULL_ARCHS = 2  # sm_80 and sm_90, hard-coded in both versions' setup.py


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "reports/h200-2.6.3-vs-2.7.0.post2"
    res = json.loads(read_text(find(path)))
    print(f"{path} — {res['machine'].get('gpu')}, {res['machine'].get('cpu_count')} cores")
    print(f"{'version':<13}{'slim wall s':>12}{'slim CPU s':>11}{'full est. wall s':>17}{'full est. CPU s':>16}"
          f"{'ratio wall':>11}{'ratio CPU':>10}  per-file seconds (slim)")
    for e in res["envs"]:
        b = e.get("build") or {}
        sb = b.get("source_build") or {}
        t = sb.get("compile_seconds") or {}
        if not t:
            print(f"{e['label']:<13} no source-build record (method {b.get('method')})")
            continue
        per_kind = {}
        for name, s in t.items():
            for kind in ("fwd_split", "fwd", "bwd"):
                if name.startswith(f"flash_{kind}_hdim"):
                    per_kind.setdefault(kind, s)
                    break
        jobs = (b.get("jobs") or {}).get("max_jobs", 1)
        full_costs = [per_kind[k] for k in per_kind for _ in range(KERNEL_FILES_PER_KIND)] * FULL_ARCHS
        full_costs.append(t.get("flash_api.o", 0.0))
        full_wall = schedule(full_costs, jobs) + (sb["seconds"] - schedule(list(t.values()), jobs))
        slim_cpu, full_cpu = sum(t.values()), sum(full_costs)
        print(f"{e['label']:<13}{sb['seconds']:>12.0f}{slim_cpu:>11.0f}{full_wall:>17.0f}{full_cpu:>16.0f}"
              f"{full_wall / sb['seconds']:>11.1f}{full_cpu / slim_cpu:>10.1f}  "
              + ", ".join(f"{n.removesuffix('.o')} {s:.0f}" for n, s in sorted(t.items(), key=lambda x: -x[1])))
    print(f"full = {KERNEL_FILES_PER_KIND} files per kind x {FULL_ARCHS} archs at the measured hdim32 times, "
          "same MAX_JOBS: a lower bound (larger head dims compile longer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
