"""Side-by-side check of matrix-run's clocks against the timers engineers use (GPU machine).

Runs inside one matrix-run env (its python), in ONE process, interleaving for each shape:

- matrix-run's ``wall_us`` (worker.Bench.wall_samples: call + synchronize, per call) vs
  ``torch.utils.benchmark.Timer("f(); torch.cuda.synchronize()").blocked_autorange()`` (the same
  synchronized call, timed by torch's Timer; plain ``f()`` under the Timer would measure
  pipelined throughput, not what one synchronized call costs);
- matrix-run's ``device_us`` (worker.Bench.device: summed kernel time from the profiler) vs
  ``triton.testing.do_bench_cudagraph(f)`` (CUDA-graph replay timed with events: a GPU floor);
- matrix-run's ``graph_us`` alongside;
- and whether a profiler session slows later launches in the same process (wall before/after).

Usage: ENV_PYTHON benchmarks/validate_clocks.py [--rounds 3] > out.json ; prints a table to stderr.
All times in µs per call; ratios are matrix-run / reference.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location("mr_worker", Path(__file__).resolve().parents[1] / "matrix_runner" / "worker.py")
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)

SHAPES = [  # (op, batch, seqlen) of the seed config: nheads 16, embed_dim 256 (head_dim 16), fp16
    ("fwd", 2, 50), ("fwd", 2, 150), ("fwd", 2, 300), ("fwd", 512, 150), ("bwd", 2, 150), ("bwd", 512, 150),
]


def case(op, b, s):
    return {"id": f"{op}-b{b}-s{s}", "op": op, "batch": b, "seqlen_q": s, "seqlen_k": s, "nheads": 16, "nheads_k": 16,
            "head_dim": 16, "dtype": "fp16", "causal": False, "dropout_p": 0.0, "softmax_scale": 0.25, "layout": "embed"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import flash_attn
    import triton.testing as tt
    from torch.utils.benchmark import Timer

    rows = []
    for op, b, s in SHAPES:
        bench = worker.Bench(case(op, b, s), "cuda", 0)
        per = bench.warmup(0.1)
        r = {"op": op, "batch": b, "seqlen": s, "mr_wall": [], "timer_wall": [], "mr_device": [], "do_bench_cudagraph": [],
             "mr_graph": []}
        for _ in range(a.rounds):
            r["mr_wall"].append(statistics.median(bench.wall_samples(max(1, round(1000 / per)), 0.25)))
            t = Timer("f(); torch.cuda.synchronize()", globals={"f": bench.call, "torch": torch}).blocked_autorange(min_run_time=0.25)
            r["timer_wall"].append(t.median * 1e6)
        for _ in range(a.rounds):  # graph captures last: a failed capture can disturb later calls
            for name, fn in (("mr_graph", lambda: statistics.median(bench.graph(0.05)["samples"])),
                             ("do_bench_cudagraph", lambda: tt.do_bench_cudagraph(bench.call, rep=100, return_mode="median") * 1e3)):
                try:
                    r[name].append(fn())
                except Exception as e:  # noqa: BLE001
                    r.setdefault("errors", []).append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    torch.cuda.synchronize()
        rows.append(r)
    # device clock last: CUPTI starts here, after all wall measurements above
    for r, (op, b, s) in zip(rows, SHAPES):
        bench = worker.Bench(case(op, b, s), "cuda", 0)
        bench.warmup(0.05)
        for _ in range(a.rounds):
            r["mr_device"].append(statistics.median(bench.device(24)["samples"]))
        # profiler pollution check: wall after a profiler session vs before (same process)
        r["mr_wall_after_profiler"] = statistics.median(bench.wall_samples(max(1, round(1000 / bench.warmup(0.05))), 0.25))
    out = {"flash_attn": flash_attn.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
           "rows": []}
    print(f"flash_attn {flash_attn.__version__}  (µs per call; ratio = matrix-run / reference)", file=sys.stderr)
    print(f"{'case':<14}{'mr wall':>9}{'Timer(sync)':>12}{'ratio':>7}{'mr device':>11}{'do_bench_cg':>12}{'ratio':>7}"
          f"{'mr graph':>10}{'wall after prof':>16}", file=sys.stderr)
    for r in rows:
        m = {k: (statistics.median(v) if v else float("nan")) for k, v in r.items() if isinstance(v, list) and k != "errors"}
        wr, dr = m["mr_wall"] / m["timer_wall"], m["mr_device"] / m["do_bench_cudagraph"]
        out["rows"].append({**r, "median": m, "wall_ratio": wr, "device_ratio": dr})
        print(f"{r['op']}-B{r['batch']}-S{r['seqlen']:<6}{m['mr_wall']:>9.1f}{m['timer_wall']:>12.1f}{wr:>7.3f}"
              f"{m['mr_device']:>11.2f}{m['do_bench_cudagraph']:>12.2f}{dr:>7.3f}{m['mr_graph']:>10.2f}"
              f"{r['mr_wall_after_profiler']:>16.1f}", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
