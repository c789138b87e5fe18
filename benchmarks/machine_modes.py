"""Machine modes in the committed runs: which runs' process sets split into a usual and a slow group
(report.machine_modes: stats.set_slowdown_index, stats.mode_split) and which wall ratios moved with
it (stats.ratio_by_mode). The check that matters: in an A/A run (the same wheel under two labels)
no ratio can truly move, so every A/A comparison named here would be a false explanation.

Usage: python benchmarks/machine_modes.py [DIR ...]   (default: the repository's reports/)
Each DIR holds runs: run directories or results files (the CPU self-check's kept A/A runs,
benchmarks/data/cpu-selfcheck-*/aaN.json.gz). Prints one line per run with a split, then the counts:
runs read, runs with a split, comparisons named as moved, split by A/A runs (a run named *-aa-* or a
file aaN.json*) and the others."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import report, results  # noqa: E402


def main(roots: list) -> None:
    counts = {k: {"runs": 0, "split": 0, "comparisons": 0, "moved": 0} for k in ("A/A", "other")}
    runs = sorted(p for root in roots for p in Path(root).iterdir() if p.is_dir() or ".json" in p.name)
    for run in runs:
        try:
            res = results.load(run)
        except Exception:  # noqa: BLE001 - a folder without a readable run
            continue
        if results.is_merge(res):
            continue
        kind = "A/A" if "-aa-" in run.name or run.name.endswith("-aa") or run.name.startswith("aa") else "other"
        c = counts[kind]
        c["runs"] += 1
        vm = report.view_model(res)
        m = vm["modes"]
        if not m:
            continue
        c["split"] += 1
        n_wall = sum(1 for x in res.get("comparisons") or [] if x.get("metric") == "wall_us" and x.get("set_log_ratios"))
        c["comparisons"] += n_wall
        c["moved"] += len(m["moved"])
        moved = ", ".join(f"{x['name']} {x['usual']:.2f}x/{x['slow']:.2f}x (p {x['p']:.0e})" for x in m["moved"])
        print(f"{run.parent.name}/{run.name}: {len(m['slow'])} of {m['n_sets']} sets ~{m['factor']:.2f}x slower; "
              f"moved: {moved or 'none'}")
    for kind, c in counts.items():
        print(f"{kind}: {c['runs']} runs, {c['split']} with a split; of their {c['comparisons']} wall comparisons "
              f"{c['moved']} named as moved")


if __name__ == "__main__":
    main(sys.argv[1:] or [Path(__file__).resolve().parents[1] / "reports"])
