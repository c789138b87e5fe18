#!/usr/bin/env bash
# GPU machine with 2+ GPUs (device tool, kind nvidia-h200-x2; no network, no uv there): issue #16's
# scale-out figure, in one device call. Needs in .carry/ what gpu_lockstep.sh needs: uv's wheel and the
# slim 2.6.3 / 2.7.0.post2 wheels (hdim32 fp16, sm_90) with their key sidecars (../shared/wheels/).
# The seed comparison (2.6.3 vs 2.7.0.post2, default config), twice per mode:
#   one  -- today's run on one GPU (no --gpus; CUDA_VISIBLE_DEVICES=0)
#   all  -- --gpus all: the cases sharded over every GPU, timed at once
# a) the same work: --max-sets ${SETS:-6} (every case gets up to that many process sets in both modes;
#    a run or shard whose verdicts are all decided stops earlier: the set counts are printed): the
#    timing phase's wall time of each and the speed-up (the goal: near the number of GPUs);
# b) time to decide: --time-budget ${BUDGET:-150}: both stop when every wall verdict is decided.
# Then whether the wall verdicts agree per case (and the ratios side by side). On a one-GPU machine
# `--gpus all` must be today's run: the script says which path it took (settings.gpus in results.json).
# Everything comes back as $OUT/shard.tgz (results.json, index.html, console logs) + summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT" /tmp/sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
COMMON=(--versions 2.6.3,2.7.0.post2 --find-links "$PWD/.carry" --find-links "$PWD/.carry/built" --offline
        --wheel-cache /tmp/mr-cache --envs-dir envs)
nproc; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,clocks.sm,clocks.max.sm --format=csv,noheader
for b in $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader); do
  d=$(echo "$b" | tr 'A-F' 'a-f' | sed 's/^0000//'); echo "$b numa_node $(cat /sys/bus/pci/devices/$d/numa_node 2>/dev/null)"; done
step() { local name=$1 limit=$2; shift 2; local t=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" --output /tmp/sh/$name > /tmp/sh/$name.log 2>&1; local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t)) s wall" | tee -a "$OUT/summary.txt"
  grep -E "✓|✗|time:|stopped|failed|warning|pinned|shard" /tmp/sh/$name.log | head -10 | tee -a "$OUT/summary.txt"; }
# envs first (both modes reuse them: the env phase is not part of the comparison)
step warm 300 python3 -m matrix_runner run "${COMMON[@]}" --quick
# --gpus all with one visible GPU must be today's run (no shards; settings.gpus null)
step one-gpu-all 120 env CUDA_VISIBLE_DEVICES=0 python3 -m matrix_runner run "${COMMON[@]}" --gpus all --quick
python3 -c "import json; d = json.load(open('/tmp/sh/one-gpu-all/results.json')); print('one visible GPU, --gpus all:', \
  'unsharded (as before)' if not d['settings'].get('gpus') and 'shards' not in d else 'SHARDED (wrong)')" | tee -a "$OUT/summary.txt"
step sets-one 300 env CUDA_VISIBLE_DEVICES=0 python3 -m matrix_runner run "${COMMON[@]}" --max-sets "${SETS:-6}" --time-budget 600
step sets-all 300 python3 -m matrix_runner run "${COMMON[@]}" --gpus all --max-sets "${SETS:-6}" --time-budget 600
step budget-one 300 env CUDA_VISIBLE_DEVICES=0 python3 -m matrix_runner run "${COMMON[@]}" --time-budget "${BUDGET:-150}"
step budget-all 300 python3 -m matrix_runner run "${COMMON[@]}" --gpus all --time-budget "${BUDGET:-150}"
python3 - <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json, os
def load(n):
    p = f"/tmp/sh/{n}/results.json"
    return json.load(open(p)) if os.path.exists(p) else None
for pair in (("sets-one", "sets-all"), ("budget-one", "budget-all")):
    a, b = (load(n) for n in pair)
    if not a or not b:
        print(f"{pair}: missing results ({[n for n, d in zip(pair, (a, b)) if not d]})"); continue
    ta, tb = a["timing"]["timing_phase_s"], b["timing"]["timing_phase_s"]
    gpus = b["settings"].get("gpus")
    print(f"\n{pair[0]} vs {pair[1]}: timing phase {ta:.1f} s on one GPU, {tb:.1f} s with --gpus all "
          f"(GPUs {gpus or 'one: the unsharded path'}) -> speed-up {ta / tb:.2f}x; "
          f"stopped: {a['timing']['stop_reason']!r} / {b['timing']['stop_reason']!r}; "
          f"process sets {len(a['sets'])} / {len(b['sets'])} (sets per case: {len(a['sets'])} / "
          f"{', '.join(str(sum(1 for r in b['sets'] if r.get('shard') == s['index'])) for s in b.get('shards') or []) or len(b['sets'])})")
    for s in b.get("shards") or []:
        print(f"  shard {s['index']}: GPU {s['gpu']['index']} {s['gpu']['uuid']} numa {s['gpu']['numa_node']}, "
              f"{len(s['cases'])} cases, {s['timing_phase_s']} s, CPUs {s['cpus'].get('set_cpus')} "
              f"(driver {s['cpus'].get('driver_cpu')}), stopped: {s['stop_reason']}")
    wa = {c["case"]: c for c in a["comparisons"] if c["metric"] == "wall_us"}
    wb = {c["case"]: c for c in b["comparisons"] if c["metric"] == "wall_us"}
    same = 0
    for cid in wa:
        x, y = wa[cid], wb.get(cid) or {}
        ok = x["verdict"] == y.get("verdict")
        same += ok
        gpu = next((c.get("gpu") or {}).get("index") for c in b["cases"] if c["id"] == cid)
        print(f"  {'=' if ok else '!'} {cid:42s} one GPU {x['verdict']:9s} {x['ratio']:.3f}x "
              f"[{x['ci_low'] or 0:.3f}, {x['ci_high'] or float('inf'):.3f}]   all (GPU {gpu}) "
              f"{y.get('verdict', '-'):9s} {y.get('ratio') or 0:.3f}x [{y.get('ci_low') or 0:.3f}, {y.get('ci_high') or float('inf'):.3f}]")
    print(f"  wall verdicts agree in {same}/{len(wa)} cases")
PY
rm -rf /tmp/sh/*/.work
tar czf "$OUT/shard.tgz" -C /tmp sh
echo "total $((SECONDS - T0)) s"
