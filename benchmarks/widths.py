"""One line per run: process sets, total seconds, wall verdicts, the batch-2 and batch-512 forward
half-widths (the larger side of each wall interval, % of its ratio) and how many wall intervals lie
inside +-3 % -- the figures issue #10 sets; with ``--misses``, the wall intervals outside +-3 % of 1
(A/A runs); with ``--cover``, the wall and host intervals that exclude 1 (in an A/A run, each one
misses the truth). ``--groups`` then prints the median half-width per group (batch-2/512, fwd/bwd) over
each named set of runs (``--groups NAME=RUN,RUN ...``). Usage:
python benchmarks/widths.py [--misses|--cover] RUN_DIR_OR_RESULTS...
python benchmarks/widths.py --groups A=RUN,RUN B=RUN,RUN
``--host`` (same arguments as ``--groups``): host verdicts and half-widths, wall cycles per set.
``--speed RUN...``: per run, the CPU speed it met -- the median speed-probe reading (report.probe_median_us,
µs), the share of wall turns at the H200's slow level (each env's reading of a cycle, ref_by_set, above
SLOW_US) -- and, for sampling.cpu_hop runs, the moves per set (median, max)."""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import report, results  # noqa: E402


def hw(c: dict) -> float:
    """The interval's half-width as the report and README give it (report.half_width_pct: the larger
    side, each measured by the factor it spans, % of the ratio); inf without a bounded interval
    (--quick). Until 2026-12-05 this measured the sides in ratio units (hi - ratio, ratio - lo): the
    same for the confidence sequence's intervals (symmetric in log), not for 6 of the 4,390 committed
    results/1 bootstrap intervals."""
    h = report.half_width_pct(c)
    return float("inf") if h is None else h


def inside(c: dict) -> bool:
    """Whether a wall interval lies inside +-3 % of 1 (False without an interval)."""
    return math.isfinite(hw(c)) and c["ci_low"] >= 0.97 and c["ci_high"] <= 1.03


def line(path: str, d: dict) -> str:
    """One run's line; ``d``: its results (results.load)."""
    w = [c for c in d["comparisons"] if c["metric"] == "wall_us"]
    b2 = "/".join(f"{hw(c):.2f}" for c in w if c["label"].startswith("B2 ") and c["op"] == "fwd")
    b512 = "/".join(f"{hw(c):.2f}" for c in w if c["label"].startswith("B512 ") and c["op"] == "fwd")
    verdicts: dict = {}
    for c in w:
        verdicts[c["verdict"]] = verdicts.get(c["verdict"], 0) + 1
    n_inside = sum(1 for c in w if inside(c))
    all_hw = sorted(hw(c) for c in w)
    if not math.isfinite(all_hw[0]):  # --quick: ratios without intervals
        r = sorted(c["ratio"] for c in w)
        return f"{path}: sets {len(d['sets'])}, total {d['timing']['total_s']:.1f} s, {verdicts}; ratios {r[0]:.2f}-{r[-1]:.2f}"
    return (f"{path}: sets {len(d['sets'])}, total {d['timing']['total_s']:.1f} s, {verdicts}; B2 fwd ±{b2} %, "
            f"B512 fwd ±{b512} %; inside ±3 %: {n_inside}/{len(w)}; half-widths {all_hw[0]:.1f}-{all_hw[-1]:.1f} %")


#: The H200's slow CPU level: a probe reading above this, µs (fast ~3.3-3.6 µs, slow ~6-9 µs).
SLOW_US = 5.0


def speed(path: str, d: dict) -> str:
    """One run's CPU-speed line (``--speed``)."""
    import statistics
    from matrix_runner import report
    cyc = [v for c in d["cases"] for per in ((c.get("metrics") or {}).get("wall_us") or {}).get("ref_by_set", {}).values()
           for v in (per.values() if isinstance(per, dict) else per) if isinstance(v, (int, float)) and v > 0]
    med = report.probe_median_us(d)
    out = (f"{path}: probe median {med:.2f} µs, turns at the slow level (> {SLOW_US:g} µs) "
           f"{100 * sum(v > SLOW_US for v in cyc) / len(cyc):.0f} %" if cyc and med else f"{path}: no probe readings")
    hops = [s["hops"] for s in d.get("sets") or [] if isinstance(s.get("hops"), int)]
    if hops:
        out += f", moves per set median {statistics.median(hops):g} (max {max(hops)})"
    return out


def misses(d: dict) -> list[str]:
    """The wall intervals of results ``d`` outside +-3 % of 1 (runs without intervals: none)."""
    return [f"{c['label']} {c['op']} {c['ratio']:.3f} [{c['ci_low']:.3f}, {c['ci_high']:.3f}]"
            for c in d["comparisons"] if c["metric"] == "wall_us" and math.isfinite(hw(c)) and not inside(c)]


def excluding_one(d: dict) -> tuple[list[str], int]:
    """The wall and host intervals of results ``d`` that exclude 1, and how many intervals there are."""
    cs = [c for c in d["comparisons"] if c["metric"] in ("wall_us", "host_us") and math.isfinite(hw(c))]
    return [f"{c['metric'][:4]} {c['label']} {c['op']} {c['ratio']:.3f} [{c['ci_low']:.3f}, {c['ci_high']:.3f}] "
            f"{c['verdict']}" for c in cs if not c["ci_low"] <= 1.0 <= c["ci_high"]], len(cs)


def groups(spec: list[str]) -> None:
    import statistics
    for arg in spec:
        name, runs = arg.split("=", 1)
        by: dict = {}
        for r in runs.split(","):
            d = results.load(results.find(r))
            for c in d["comparisons"]:
                if c["metric"] == "wall_us":
                    by.setdefault(f"{c['label'].split()[0]} {c['op']}", []).append(hw(c))
        print(f"{name:12s} " + "  ".join(f"{k} {statistics.median(v):.2f} % (max {max(v):.2f}, n {len(v)})"
                                      for k, v in sorted(by.items())))


def host_and_cycles(spec: list[str]) -> None:
    """Per named set of runs: the host comparisons' verdicts, their median half-width (% of the
    ratio) per batch, and the wall clock's cycles per set per batch (mean over cases and sets that
    timed it): what giving the wall items more of a set's cycles costs the host clock."""
    import statistics
    for arg in spec:
        name, runs = arg.split("=", 1)
        verdicts: dict = {}
        host: dict = {}
        cyc: dict = {}
        for r in runs.split(","):
            d = results.load(results.find(r))
            for c in d["comparisons"]:
                if c["metric"] == "host_us" and math.isfinite(hw(c)):
                    verdicts[c["verdict"]] = verdicts.get(c["verdict"], 0) + 1
                    host.setdefault(c["label"].split()[0], []).append(hw(c))
            base = d["envs"][0]["label"]
            for c in d["cases"]:
                if c["env"] == base and (c.get("metrics") or {}).get("wall_us"):
                    n = [len(v) for v in c["metrics"]["wall_us"]["by_set"].values()]
                    if n:
                        cyc.setdefault(c["label"].split()[0], []).append(statistics.mean(n))
        print(f"{name:12s} host {verdicts}; host half-width " +
              ", ".join(f"{k} {statistics.median(v):.1f} %" for k, v in sorted(host.items())) +
              "; wall cycles per set " + ", ".join(f"{k} {statistics.mean(v):.1f}" for k, v in sorted(cyc.items())))


def cli(main, doc: str) -> None:
    """A replay script's command line: ``doc`` for -h/--help (exit 0) or no arguments (exit 2), else
    ``main(RUN...)``."""
    if not sys.argv[1:] or sys.argv[1] in ("-h", "--help"):
        print(doc)
        sys.exit(0 if sys.argv[1:] else 2)
    main(sys.argv[1:])


if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if argv else 2)
    if argv[:1] == ["--groups"]:
        groups(argv[1:])
        sys.exit(0)
    if argv[:1] == ["--host"]:
        host_and_cycles(argv[1:])
        sys.exit(0)
    if argv[:1] == ["--speed"]:
        for p in argv[1:]:
            print(speed(p, results.load(results.find(p))))
        sys.exit(0)
    show = argv[:1] == ["--misses"]
    cover = argv[:1] == ["--cover"]
    for p in argv[1:] if show or cover else argv:
        doc = results.load(results.find(p))
        if cover:
            out, n = excluding_one(doc)
            print(f"{p}: {len(out)} of {n} wall/host intervals exclude 1" + "".join(f"\n    {m}" for m in out))
            continue
        print(line(p, doc))
        if show:
            for m in misses(doc):
                print(f"    outside ±3 %: {m}")
