"""Extract the per-cycle wall/host burst values of two-env lockstep runs into the data format that
benchmarks/sim_lockstep.py reads (``{"what", "runs": {run: {"workers_per_env", "cases": {case id:
{clock: {set id: [[a, b], ...]}}}}}}``: per set the cycles both envs have, paired by cycle id, µs per
call). Usage: python benchmarks/cycles_from_results.py OUT.json "WHAT" RUN=results.json ..."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner.results import read_text  # results.json or an archived .gz


def convert(path: str) -> dict:
    d = json.loads(read_text(path))
    envs = [e["label"] for e in d["envs"] if e.get("status") == "ok"]
    if len(envs) != 2:
        raise SystemExit(f"{path}: {len(envs)} ok envs; this extracts two-env runs only")
    by = {}
    for c in d["cases"]:
        by.setdefault(c["id"], {})[c["env"]] = c
    cases = {}
    for cid, per_env in by.items():
        a, b = per_env.get(envs[0]), per_env.get(envs[1])
        if not a or not b:
            continue
        out = {}
        for clock in ("wall_us", "host_us"):
            A, B = a["metrics"][clock]["by_set"], b["metrics"][clock]["by_set"]
            out[clock] = {sid: [[A[sid][cy], B[sid][cy]] for cy in sorted(A[sid], key=int) if cy in B.get(sid, {})]
                          for sid in A if sid in B}
        cases[cid] = out
    return {"workers_per_env": d["settings"].get("workers_per_env"), "cases": cases}


def main(argv: list[str]) -> int:
    out, what, *pairs = argv
    runs = {}
    for p in pairs:
        name, path = p.split("=", 1)
        runs[name] = convert(path)
    json.dump({"what": what, "runs": runs}, open(out, "w"))
    print(f"{out}: " + ", ".join(f"{r} {len(v['cases'])} cases" for r, v in runs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
