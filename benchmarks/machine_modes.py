"""Machine modes in the committed runs: which runs' process sets split into a usual and a slow group
(report.machine_modes: stats.set_slowdown_index, stats.mode_split) and which wall ratios moved with
it (stats.ratio_by_mode). The check that matters: in an A/A run (the same wheel under two labels)
no ratio can truly move, so every A/A comparison named here would be a false explanation.

Usage: python benchmarks/machine_modes.py [REPORTS_DIR]   (default: the repository's reports/)
Prints one line per run with a split, then the counts: runs read, runs with a split, comparisons
named as moved, split by A/A runs (a run directory named *-aa-*) and the others."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import report, results  # noqa: E402


def main(root: Path) -> None:
    counts = {k: {"runs": 0, "split": 0, "comparisons": 0, "moved": 0} for k in ("A/A", "other")}
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            res = results.load(run)
        except Exception:  # noqa: BLE001 - a folder without a readable run
            continue
        if results.is_merge(res):
            continue
        kind = "A/A" if "-aa-" in run.name or run.name.endswith("-aa") else "other"
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
        print(f"{run.name}: {len(m['slow'])} of {m['n_sets']} sets ~{m['factor']:.2f}x slower; "
              f"moved: {moved or 'none'}")
    for kind, c in counts.items():
        print(f"{kind}: {c['runs']} runs, {c['split']} with a split; of their {c['comparisons']} wall comparisons "
              f"{c['moved']} named as moved")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "reports")
