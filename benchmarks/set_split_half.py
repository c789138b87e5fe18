"""How much of a process set's spread is sampling noise inside the set? For each wall comparison of
the lockstep runs given (results.json of two envs), per case: the variance of the set log ratios
across sets (what the confidence sequence sees) and the split-half estimate of the within-set part
(each set's cycles split into odd and even cycle ids; var(trimmed mean of one half - of the other) / 4
estimates the variance of the set's own trimmed mean from its cycles alone). A share near 100 % means
the sets differ no more than their own cycles' noise explains: more cycles per set would narrow the
interval as much as more sets; well below 100 %, a between-set part (process, core or CPU speed)
remains that only more sets average. Usage:
python benchmarks/set_split_half.py [--label NAME] RUN/results.json ..."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner.results import read_text  # results.json or an archived .gz
from matrix_runner.stats import set_log_ratio  # noqa: E402  (a set's value as the run computes it)


def main(argv: list[str]) -> None:
    label = "runs"
    if argv[:1] == ["--label"]:
        label, argv = argv[1], argv[2:]
    res: dict = {}
    for f in argv:
        d = json.loads(read_text(f))
        envs = [e["label"] for e in d["envs"] if e.get("status") == "ok"]
        by: dict = {}
        for c in d["cases"]:
            by.setdefault(c["id"], {})[c["env"]] = c
        for cid, pe in by.items():
            a, b = pe.get(envs[0]), pe.get(envs[1])
            if not a or not b:
                continue
            A, B = a["metrics"]["wall_us"]["by_set"], b["metrics"]["wall_us"]["by_set"]
            full, dif, ncy = [], [], []
            for sid in A:
                cys = sorted((cy for cy in A[sid] if cy in B.get(sid, {})), key=int)
                if len(cys) < 4:
                    continue
                half = [cys[0::2], cys[1::2]]
                a_h = [{cy: A[sid][cy] for cy in h} for h in half]
                b_h = [{cy: B[sid][cy] for cy in h} for h in half]
                full.append(set_log_ratio(A[sid], B[sid]))
                ncy.append(len(cys))
                dif.append(set_log_ratio(a_h[0], b_h[0]) - set_log_ratio(a_h[1], b_h[1]))
            if len(full) > 2:
                res.setdefault(f"{a['label']} {a['op']}", []).append(
                    (np.var(full, ddof=1), np.mean(np.square(dif)) / 4, np.mean(ncy)))
    print(f"== {label}: {len(argv)} run(s)")
    for k, v in res.items():
        tot, wi = np.mean([x[0] for x in v]), np.mean([x[1] for x in v])
        print(f"  {k:26s} cycles/set {np.mean([x[2] for x in v]):4.1f}  set SD {math.sqrt(tot):.4f}  "
              f"within-set SD {math.sqrt(wi):.4f}  within share {wi / tot:4.0%}")


if __name__ == "__main__":
    main(sys.argv[1:])
