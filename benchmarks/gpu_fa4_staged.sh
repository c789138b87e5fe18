#!/usr/bin/env bash
# GPU machine (device tool): FA4 (PyPI flash-attn-4 4.0.0b36) against flash-attn 2.8.3 (issue #11),
# with FA4's wheels carried in parts over back-to-back calls (the repository travels with each call,
# 64 MiB in all; FA4's CUDA 13 libs wheel alone is 92 MB). Everything stays in /tmp and envs/ while
# the machine is warm (30 s after a call); each stage checks what the earlier ones left.
#   (earlier call)  .carry/fa4a/: FA4's other wheels (19 MB) -> /tmp/fa4, uv -> /tmp/site
#   STAGE=build     .carry/fa4b/: cu13.part0, the 2.8.3 sdist, the slim 2.8.3 wheel of the seed config;
#                   slim-builds 2.8.3 for benchmarks/fa4.yaml (hdim64/128 bf16: 6 kernel files)
#   STAGE=time      .carry/fa4c/: cu13.part1, cu13.part2, cu13.sha256; joins the wheel, then
#                   1. FA4 vs 2.8.3 on the seed config (--quick first: FA4's first calls compile its
#                      kernels, JIT, into its on-disk cache; the run reports that first call on its own),
#                   2. FA4 vs 2.8.3 on benchmarks/fa4.yaml, if STAGE=build left a 2.8.3 env for it.
# Results: $OUT/fa4-*.tgz (results.json, index.html, console logs) and $OUT/summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT" /tmp/fa4 /tmp/sd /tmp/fr
[ -x /tmp/site/bin/uv ] || { echo "no uv in /tmp/site: the machine went cold since the first call" | tee -a "$OUT/summary.txt"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
FA4=fa4=flash-attn-4==4.0.0b36
if [ "${STAGE:-time}" = build ]; then
  cp .carry/fa4b/cu13.part0 /tmp/fa4/ && cp .carry/fa4b/flash_attn-2.8.3.tar.gz /tmp/sd/ \
    && cp .carry/fa4b/flash_attn-2.8.3-*.whl* /tmp/sd/ || exit 1
  timeout --signal=INT --kill-after=20 "${LIMIT:-560}" python3 benchmarks/cache_builds.py --find-links /tmp/sd \
    --cache /tmp/mr-cache --envs "$PWD/envs" --config benchmarks/fa4.yaml fa2=2.8.3 > "$OUT/build.log" 2>&1
  echo "build exit $? after $((SECONDS - T0)) s" | tee -a "$OUT/summary.txt"
  tail -25 "$OUT/build.log"
  exit 0
fi
W=/tmp/fa4/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
if [ ! -f "$W" ]; then  # joined by an earlier STAGE=time call while the machine stayed warm
  cp .carry/fa4c/cu13.part1 .carry/fa4c/cu13.part2 /tmp/fa4/ || exit 1
  cat /tmp/fa4/cu13.part0 /tmp/fa4/cu13.part1 /tmp/fa4/cu13.part2 > "$W" && rm /tmp/fa4/cu13.part*
  [ "$(sha256sum "$W" | cut -d' ' -f1)" = "$(cut -d' ' -f1 .carry/fa4c/cu13.sha256)" ] \
    || { echo "the joined cu13 wheel's sha256 differs" | tee -a "$OUT/summary.txt"; exit 1; }
fi
# STAND_IN=DIR: wheels copied in beside FA4's (2026-12-02: an empty nvidia-cutlass-dsl-libs-cu12, which
# nvidia-cutlass-dsl 4.8.1 requires even with [cu13] and which did not fit the carry; the cu13 libs do the work)
[ -n "${STAND_IN:-}" ] && cp "$STAND_IN"/*.whl /tmp/fa4/
ls /tmp/fa4 | tee -a "$OUT/summary.txt"
COMMON=(--find-links /tmp/sd --find-links /tmp/fa4 --offline --wheel-cache /tmp/mr-cache --envs-dir "$PWD/envs")
step() { local name=$1 lim=$2; shift 2; local t=$SECONDS
  timeout --signal=TERM --kill-after=10 "$lim" python3 -m matrix_runner run "$@" "${COMMON[@]}" --output /tmp/fr/$name \
    > /tmp/fr/$name.log 2>&1; local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t)) s wall" | tee -a "$OUT/summary.txt"
  grep -E "✓|✗|time:|stopped|failed|warning|first call|error" /tmp/fr/$name.log | head -12 | tee -a "$OUT/summary.txt"
  python3 benchmarks/lockstep_summary.py /tmp/fr/$name/results.json 2>&1 | tee -a "$OUT/summary.txt"; }
step seed-quick 200 --versions fa2=2.8.3,$FA4 --quick
step seed 150 --versions fa2=2.8.3,$FA4
python3 -m matrix_runner plan --versions fa2=2.8.3,$FA4 --config benchmarks/fa4.yaml "${COMMON[@]}" > /tmp/fr/plan-fa4yaml.txt 2>&1
tail -12 /tmp/fr/plan-fa4yaml.txt | tee -a "$OUT/summary.txt"
# only where STAGE=build left the 2.8.3 env this config needs (the plan builds nothing from source)
if ! grep -q "source" /tmp/fr/plan-fa4yaml.txt && [ $((SECONDS - T0)) -lt 330 ]; then
  step fa4yaml-quick 120 --versions fa2=2.8.3,$FA4 --config benchmarks/fa4.yaml --quick
  [ $((SECONDS - T0)) -lt 400 ] && step fa4yaml $((570 - (SECONDS - T0))) --versions fa2=2.8.3,$FA4 --config benchmarks/fa4.yaml
fi
for d in /tmp/fr/*/; do rm -rf "$d/.work"; done
tar czf "$OUT/fa4-runs.tgz" -C /tmp fr
echo "total $((SECONDS - T0)) s" | tee -a "$OUT/summary.txt"
