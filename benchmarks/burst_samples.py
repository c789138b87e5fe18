"""Inside the bursts: how many samples a burst of each case holds, and how often one sample stalls.

Data: the burst trace of three H200 A/A runs of the default (2026-12-05, `reports/h200-aa-trace-1/`
to `-3/`, made with ``MATRIX_RUN_BURST_TRACE``: benchmarks/gpu_lockstep.sh TRACE=1), packed in
``benchmarks/data/h200-burst-trace-12-05.tar.gz``: one JSON line per burst and worker process
(``t0``/``t1`` monotonic ns, ``case``, ``clock``, ``inner`` calls per sample, ``samples`` µs per
call, ``refs`` speed-probe readings µs), as worker._trace writes them.

Per case (wall clock): bursts, samples per burst (median, min), the case's median µs per call, the
share of samples more than 1.4x that median ("stalled"), and the share of bursts whose median is
more than 1.25x off it. A burst's value is the median of its samples (worker ``burst``): with one or
two samples, as a 3 ms batch-512 S300 backward call gets in a 5 ms burst (``burst_ms``), one stalled
sample is the burst's value, and with about two cycles of that case a set, the set's. Usage:
python benchmarks/burst_samples.py [TARBALL]"""
import io
import json
import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from matrix_runner import results  # noqa: E402

TARBALL = ROOT / "benchmarks" / "data" / "h200-burst-trace-12-05.tar.gz"
RUNS = {"trace-aa1": "h200-aa-trace-1", "trace-aa2": "h200-aa-trace-2", "trace-aa3": "h200-aa-trace-3"}
STALL = 1.4      # a sample this many times the case's median is "stalled"
OFF = 1.25       # a burst whose median is this far off the case's median (either way) is "off"


def main(argv: list[str]) -> int:
    tarball = Path(argv[0]) if argv else TARBALL
    per: dict = {}
    with tarfile.open(tarball) as tf:
        for m in tf.getmembers():
            if not m.isfile() or not m.name.endswith(".jsonl"):
                continue
            run = RUNS[m.name.split("/")[0]]
            label = {c["id"]: f"{c['label']} {c['op']}" for c in results.load(ROOT / "reports" / run)["cases"]}
            for line in io.TextIOWrapper(tf.extractfile(m), encoding="utf-8"):
                r = json.loads(line)
                if r["clock"] == "wall" and r["samples"]:
                    per.setdefault(label.get(r["case"], r["case"]), []).append(r["samples"])
    print(f"{'case':26s} {'bursts':>6s} {'samples/burst':>13s} {'min':>4s} {'µs/call':>8s} "
          f"{'stalled samples':>15s} {'bursts off':>10s}")
    for case, bursts in sorted(per.items()):
        allv = [x for b in bursts for x in b]
        med = statistics.median(allv)
        stalled = sum(x > STALL * med for x in allv) / len(allv)
        off = sum(not (med / OFF <= statistics.median(b) <= med * OFF) for b in bursts) / len(bursts)
        ns = [len(b) for b in bursts]
        print(f"{case:26s} {len(bursts):6d} {statistics.median(ns):13g} {min(ns):4d} {med:8.0f} "
              f"{stalled:14.2%} {off:10.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
