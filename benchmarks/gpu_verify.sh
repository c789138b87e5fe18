#!/usr/bin/env bash
# GPU machine (device tool; no network, no uv there), second session: checks of this session's
# changes against real flash-attn, in one device call. Needs in .carry/: uv's wheel and the slim
# wheels an earlier gpu_run.sh built (hdim 32 fp16 kernels, sm_90), with their key sidecars.
#   1. --quick run of the default config: envs created from the carried wheels (fresh machine), timed
#   2. the default run, envs reused: the time budget check (about two minutes), then --quick again
#      on the now warm machine (target under 30 s)
#   3. a config needing kernels that were not built (head_dim 64, bf16) on the same slim wheels,
#      installed as local wheels: those cases must fail with the stub's error, the others be timed
#      (SKIP_UNBUILT=1 leaves it out)
#   4. AA=1: an A/A run (2.6.3 under two labels, default config): every verdict should be "same"
#   5. VALIDATE=1: benchmarks/validate_clocks.py in each env (wall vs Timer, device vs do_bench_cudagraph)
# Results under $OUT: quick.json, default.json (+ index.html), unbuilt.json, console logs.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
COMMON=(--find-links "$PWD/.carry" --offline --wheel-cache /tmp/mr-cache --envs-dir envs)
step() { local name=$1; shift; local t=$SECONDS
  timeout --signal=TERM --kill-after=10 "$1" "${@:2}" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t)) s wall"; grep -E "✓|✗|time:|stopped|failed|results:" "$OUT/$name.txt" | head -12; }
step quick 120 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}" --quick --output /tmp/q
cp /tmp/q/results.json "$OUT/quick.json" 2>/dev/null
step default 240 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}" --output /tmp/d
cp /tmp/d/results.json "$OUT/default.json" 2>/dev/null; cp /tmp/d/index.html "$OUT/default.html" 2>/dev/null
step quick-warm 120 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}" --quick --output /tmp/q2
cp /tmp/q2/results.json "$OUT/quick-warm.json" 2>/dev/null
if [ "${SKIP_UNBUILT:-0}" != 1 ]; then
cat > /tmp/unbuilt.yaml <<'YAML'
ops: [fwd, bwd]
shapes:
  - {batch: 2, seqlen: 128, nheads: 16, head_dim: 32}
  - {batch: 2, seqlen: 128, nheads: 16, head_dim: 64}
  - {batch: 2, seqlen: 128, nheads: 16, head_dim: 32, dtype: bf16}
YAML
W26=$(ls .carry/flash_attn-2.6.3-*.whl); W27=$(ls .carry/flash_attn-2.7.0.post2-*.whl)
step unbuilt 150 python3 -m matrix_runner run --versions "s26=$W26,s27=$W27" --config /tmp/unbuilt.yaml --quick \
  --envs-dir envs --offline --wheel-cache /tmp/mr-cache --output /tmp/u
cp /tmp/u/results.json "$OUT/unbuilt.json" 2>/dev/null
fi
if [ "${AA:-0}" = 1 ]; then  # A/A on the GPU: 2.6.3 under two labels, default config and budget
  step aa 200 python3 -m matrix_runner run --versions a=2.6.3,b=2.6.3 "${COMMON[@]}" --output /tmp/aa
  cp /tmp/aa/results.json "$OUT/aa.json" 2>/dev/null
fi
if [ "${VALIDATE:-0}" = 1 ]; then
  for v in 2.6.3 2.7.0.post2; do
    timeout 150 envs/$v/bin/python -W ignore benchmarks/validate_clocks.py --rounds 3 > "$OUT/validate-$v.json" 2> "$OUT/validate-$v.txt"
    grep -v "^ \|Warning\|warn" "$OUT/validate-$v.txt" | tail -12
  done
fi
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for name in ("quick", "default", "quick-warm", "aa"):
    try:
        d = json.load(open(f"{out}/{name}.json"))
    except OSError:
        continue
    print(f"{name}: timing {d['timing']}; sets {len(d.get('sets') or [])}; envs " +
          ", ".join(f"{e['label']} {e['status']} {e['build'].get('method')} {e['build'].get('seconds')} s import_checked={e.get('import_checked')}" for e in d["envs"]))
    for c in d["comparisons"]:
        if c["metric"] == "wall_us":
            print(f"  {c['op']} {c['label']}: {c['verdict']} {c['ratio']:.2f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}] {c.get('attribution')}")
    ns = sorted({tuple(len(r) for r in c["metrics"]["wall_us"]["samples"]) for c in d["cases"] if c["status"] == "ok"})
    print("  samples per round (wall):", ns[:3], "...", ns[-3:])
try:
    d = json.load(open(f"{out}/unbuilt.json"))
    for c in d["cases"]:
        print(f"unbuilt: {c['env']} {c['id']}: {c['status']} {c.get('error_kind')} {(c.get('error') or '')[:200]}")
except OSError:
    pass
PY
echo "script seconds: $((SECONDS - T0))"
