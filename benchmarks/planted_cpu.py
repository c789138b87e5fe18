"""Does matrix-run read a planted host cost at its in-context size? (CPU, stand-in wheels; issue #10)

Stand-in flash_attn 2.6.3 (no overhead) vs "2.7.0.post2" busy-waiting 300 µs per forward call
(tests/standin.py), the tiny two-shape fwd config, one `matrix-run --device cpu` run per burst length
given (ms); before and after each run, what the busy-wait costs inside the call in one process
(standin.in_context_us, 200 alternating blocks). Prints per case the run's wall/host delta, the
plain medians and the in-context cost, side by side. On 2026-12-02 CI runs of the pipeline test read
the planted cost 22-31 % above the in-context cost (then 330-390 µs); this checks it on a quiet
machine. Usage: python benchmarks/planted_cpu.py [BURST_MS ...] (default 5 40); work dir /tmp/pc.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import standin

root = Path("/tmp/pc")
root.mkdir(exist_ok=True)
for old in root.glob("out-*"):  # --output refuses a directory that already holds a run
    shutil.rmtree(old)
src0 = standin.make_source(root / "src", "2.6.3", 0.0)
src1 = standin.make_source(root / "src", "2.7.0.post2", 300.0)
for s in (src0, src1):
    standin.build_wheel(s, root / "wheels")
cfg = root / "c.yaml"
cfg.write_text("ops: [fwd]\nshapes:\n  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}\n  - {batch: 2, seqlen_q: 16, seqlen_k: 32, nheads: 4, nheads_k: 2, head_dim: 32, causal: true}\nsampling: {time_budget_s: 60, set_seconds: 1.0, max_sets: 6}\n")
for burst in sys.argv[1:] or ["5", "40"]:
    t = standin.in_context_us(src1, 300.0, 1, 16, 2, 16, blocks=200)
    out = root / f"out-{burst}"
    subprocess.run([sys.executable, "-m", "matrix_runner", "--versions", "2.6.3,2.7.0.post2", "--config", str(cfg), "--device", "cpu",
                    "--find-links", str(root / "wheels"), "--envs-dir", str(root / "envs"), "--wheel-cache", str(root / "cache"),
                    "--burst-ms", burst, "--output", str(out)], cwd=REPO, capture_output=True, check=False)
    t2 = standin.in_context_us(src1, 300.0, 1, 16, 2, 16, blocks=200)
    d = json.loads((out / "results.json").read_text())
    for c in d["comparisons"]:
        if c["metric"] in ("wall_us", "host_us"):
            print(f"burst {burst} ms {c['label']} {c['metric']}: delta {c['delta_us']:.1f} base {c['base_median']:.1f} cand {c['cand_median']:.1f} (in-context before/after {t:.0f}/{t2:.0f}) sets {c['n_sets']}", flush=True)
    for c in d["cases"]:
        print("   ", c["env"], c["label"], {k: (v or {}).get("median") for k, v in (c.get("metrics") or {}).items() if k in ("wall_us", "host_us")}, "burst calls:", (c.get("burst") or c.get("calls_per_burst")), flush=True)
