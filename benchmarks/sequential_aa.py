"""How often does matrix-run's stop rule call an A/A pair faster or slower? (simulation, no timing)

The runner looks at the verdicts after every round (from ``min_rounds`` on) and stops once all are
decided, so each comparison gets many looks. This simulates that rule with ``stats.compare`` on
synthetic A/A rounds: per round, both envs' medians come from the same distribution (per-round
log-ratio spread ``SD``), and with probability ``P_OUT`` one side of a round is hit by a transient
slowdown of 1.2-2x (what the 2-core CI machine showed before sampling in turns). The stop is tested at
``stop level`` (95 %, or the runner's ``stats.STOP_LEVEL``) and the verdict read at 95 % when it
stops. Prints the share of simulated runs that ended "faster"/"slower" (false), "same", or
undecided at ``max_rounds``, for one comparison alone (the worst case: it stops at its first decided
look), then for 12 comparisons sampled together (stop when all are decided). Usage: python benchmarks/sequential_aa.py [RUNS]
"""
from __future__ import annotations

import sys

import numpy as np

sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parents[1].as_posix())
from matrix_runner import stats  # noqa: E402


def one_run(rng, sd: float, p_out: float, min_rounds: int, max_rounds: int, stop_level: float,
            e: float = 0.05) -> str:
    base, cand = [], []
    for r in range(max_rounds):
        a, b = 100.0, 100.0 * float(np.exp(rng.normal(0, sd)))
        if rng.random() < p_out:
            if rng.random() < 0.5:
                a *= rng.uniform(1.2, 2.0)
            else:
                b *= rng.uniform(1.2, 2.0)
        base.append([a])
        cand.append([b])
        if r + 1 >= min_rounds and stats.compare(base, cand, e, level=stop_level)["verdict"] != "ambiguous":
            break
    return stats.compare(base, cand, e)["verdict"]  # reported at 95 %


def run_matrix(rng, sd: float, n_cases: int, min_rounds: int, max_rounds: int, stop_level: float,
               e: float = 0.05) -> list[str]:
    """The runner's own rule: ``n_cases`` A/A comparisons sampled together, stopping when all are
    decided (or at ``max_rounds``); every comparison's verdict is read at that stop."""
    base = [[] for _ in range(n_cases)]
    cand = [[] for _ in range(n_cases)]
    for r in range(max_rounds):
        for i in range(n_cases):
            base[i].append([100.0])
            cand[i].append([100.0 * float(np.exp(rng.normal(0, sd)))])
        if r + 1 >= min_rounds and all(stats.compare(base[i], cand[i], e, level=stop_level)["verdict"] != "ambiguous"
                                       for i in range(n_cases)):
            break
    return [stats.compare(base[i], cand[i], e)["verdict"] for i in range(n_cases)]


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    rng = np.random.default_rng(1)
    print("one A/A comparison alone (it stops at its first decided look): share of runs ending")
    print(f"{'stop level':>10} {'per-round sd':>12} {'P(outlier)':>10} {'max_rounds':>10} {'false faster/slower':>20} "
          f"{'same':>6} {'undecided':>9}")
    for stop_level in (0.95, stats.STOP_LEVEL):
        for sd in (0.02, 0.04, 0.15):
            for p_out in (0.0, 0.1):
                for max_rounds in (8, 30):
                    out = [one_run(rng, sd, p_out, 3, max_rounds, stop_level) for _ in range(runs)]
                    false = sum(v in ("faster", "slower") for v in out) / runs
                    print(f"{stop_level:>10.3f} {sd:>12.2f} {p_out:>10.2f} {max_rounds:>10d} {false:>20.1%} "
                          f"{out.count('same') / runs:>6.1%} {out.count('ambiguous') / runs:>9.1%}")
    print("\n12 A/A comparisons sampled together under the runner's rule (stop when all are decided at the stop"
          " level); share of comparisons ending false faster/slower:")
    for stop_level in (0.95, stats.STOP_LEVEL):
        for sd in (0.04, 0.15):
            for max_rounds in (8, 30):
                out = [x for _ in range(max(runs // 10, 20)) for x in run_matrix(rng, sd, 12, 3, max_rounds, stop_level)]
                print(f"  stop level {stop_level:.3f}, per-round sd {sd:.2f}, max_rounds {max_rounds:>2}: false "
                      f"{sum(v in ('faster', 'slower') for v in out) / len(out):.1%}, same {out.count('same') / len(out):.1%}, "
                      f"undecided {out.count('ambiguous') / len(out):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
