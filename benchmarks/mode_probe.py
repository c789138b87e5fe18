"""Which cheap probe reads the GPU machine's "heavy-code" slow mode? (diagnostic, GPU machine)

Seen on the H200 on 2026-12-05 (device call 1 of session 33, `benchmarks/results/h200-runs-12-05-d.txt`):
in some process sets both workers' batch-2 calls ran ~2x slower for seconds at a time (2.6.3 B2 S150
backward 150-175 µs vs 305-330 µs; 2.7.0.post2 forward 95-115 µs vs 195-215 µs, 2.6.3 forward only
48-55 vs 65-75 µs) while worker.speed_probe (a small pure-Python loop) read the same in both modes.
So the seed's batch-2 forward set ratio was ~2.0 in one mode and ~2.9 in the other.

This script runs in one env's python, pinned to one CPU, and for ``--seconds`` loops over rounds of
(all times in µs, medians over the round's repeats):
  small     worker.speed_probe() (the sampling's CPU-speed probe: 48 iterations of dict/int work)
  data      one pass of sum() over a 1 MiB array.array (a data footprint the size of a core's L2)
  torchcpu  one call each of 24 different torch ops on 1-element CPU tensors (C++ dispatcher code)
  launch    host time to launch 8 one-element CUDA adds (no synchronize inside), per launch
  fwd_host  flash_attn_func batch 2, seqlen 150, 16 heads, head_dim 16, fp16: host time per call
  fwd_wall  the same call to the end of its kernel (synchronize)
  bwd_wall  forward + backward of the same shape, to the end of its kernels
and writes one JSON line per round (time since start, s; each reading, µs) to ``--out``.

Usage (GPU machine, an env made by matrix-run): envs/2.7.0.post2/bin/python benchmarks/mode_probe.py
--cpu 3 --seconds 90 --out /tmp/mode-3.jsonl
"""
from __future__ import annotations

import argparse
import array
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.sched_setaffinity(0, {a.cpu})
    import torch
    from flash_attn import flash_attn_func

    from matrix_runner.worker import speed_probe

    pc = time.perf_counter_ns
    dev = torch.device("cuda")
    q, k, v = (torch.randn(2, 150, 16, 16, device=dev, dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    g = torch.randn(2, 150, 16, 16, device=dev, dtype=torch.float16)
    one = torch.zeros(1, device=dev)
    big = array.array("q", range(1 << 17))  # 1 MiB
    ct = [torch.ones(1), torch.ones(1)]

    def torch_cpu() -> None:
        x, y = ct
        (x + y, x * y, x - y, x / y, torch.cat([x, y]), x.view(1, 1), x.sum(), x.mean(), torch.empty(1),
         torch.zeros(2), x.clone(), x.abs(), x.neg(), x.exp(), torch.stack([x, y]), x.unsqueeze(0),
         x.reshape(1), x.max(), torch.maximum(x, y), x.sqrt(), x.float(), x.contiguous(), x.t(), x.flip(0))

    def timed(fn, reps: int, per: int = 1) -> float:
        out = []
        for _ in range(reps):
            t0 = pc()
            fn()
            out.append((pc() - t0) / 1e3 / per)
        return statistics.median(out)

    def launches() -> None:
        for _ in range(8):
            one.add_(1)

    def fwd_host() -> None:
        flash_attn_func(q, k, v)

    def fwd_wall() -> None:
        flash_attn_func(q, k, v)
        torch.cuda.synchronize()

    def bwd_wall() -> None:
        flash_attn_func(q, k, v).backward(g)
        torch.cuda.synchronize()

    for _ in range(20):  # warm
        bwd_wall(), fwd_wall(), torch_cpu()
    t_start = time.monotonic()
    with open(a.out, "w") as f:
        while time.monotonic() - t_start < a.seconds:
            row = {"t": round(time.monotonic() - t_start, 3), "cpu": a.cpu}
            row["small"] = statistics.median(speed_probe() for _ in range(5))
            row["data"] = timed(lambda: sum(big), 3)
            row["torchcpu"] = timed(torch_cpu, 5)
            torch.cuda.synchronize()
            row["launch"] = timed(launches, 5, per=8)
            torch.cuda.synchronize()
            hs = []
            for _ in range(10):
                t0 = pc()
                fwd_host()
                hs.append((pc() - t0) / 1e3)
                torch.cuda.synchronize()
            row["fwd_host"] = statistics.median(hs)
            row["fwd_wall"] = timed(fwd_wall, 10)
            row["bwd_wall"] = timed(bwd_wall, 5)
            f.write(json.dumps({k: (round(x, 3) if isinstance(x, float) else x) for k, x in row.items()}) + "\n")
            time.sleep(0.005)
    return 0


if __name__ == "__main__":
    sys.exit(main())
