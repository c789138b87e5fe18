"""One line per run: process sets, total seconds, wall verdicts, the batch-2 and batch-512 forward
half-widths (the larger side of each wall interval, % of its ratio) and how many wall intervals lie
inside +-3 % -- the figures issue #10 sets. Usage: python benchmarks/widths.py RUN_DIR_OR_RESULTS... """
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import results  # noqa: E402


def hw(c: dict) -> float:
    return max(c["ci_high"] - c["ratio"], c["ratio"] - c["ci_low"]) / c["ratio"] * 100


def line(path: str) -> str:
    d = results.load(results.find(path))
    w = [c for c in d["comparisons"] if c["metric"] == "wall_us"]
    b2 = "/".join(f"{hw(c):.2f}" for c in w if c["label"].startswith("B2 ") and c["op"] == "fwd")
    b512 = "/".join(f"{hw(c):.2f}" for c in w if c["label"].startswith("B512 ") and c["op"] == "fwd")
    verdicts: dict = {}
    for c in w:
        verdicts[c["verdict"]] = verdicts.get(c["verdict"], 0) + 1
    inside = sum(1 for c in w if c["ci_low"] >= 0.97 and c["ci_high"] <= 1.03)
    all_hw = sorted(hw(c) for c in w)
    return (f"{path}: sets {len(d['sets'])}, total {d['timing']['total_s']:.1f} s, {verdicts}; B2 fwd ±{b2} %, "
            f"B512 fwd ±{b512} %; inside ±3 %: {inside}/{len(w)}; half-widths {all_hw[0]:.1f}-{all_hw[-1]:.1f} %")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(line(p))
