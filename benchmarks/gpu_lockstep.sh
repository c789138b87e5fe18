#!/usr/bin/env bash
# GPU machine (device tool; no network, no uv there): the lockstep measurement (issue #10) on real
# flash-attn, in one device call. Needs in .carry/: uv's wheel and the slim 2.6.3 / 2.7.0.post2 wheels
# (hdim32 fp16, sm_90) with their key sidecars (../shared/wheels/).
#   1. the seed comparison, default config and budget: 2.6.3 vs 2.7.0.post2 (envs created here;
#      SEED=N: N of them, SEED=0: none)
#   1b. ABAB=N: N alternated pairs of seed comparisons, default vs B_OPTS (e.g. a variant --config)
#   2. three A/A runs: 2.6.3 under two labels, default config and budget (AA=N: N; AA_OPTS: options
#      added to them, e.g. a sampling variant)
#   2b. AABAB=N: N alternated pairs of A/A runs, default vs B_OPTS
#   3. a --quick A/A (no faster/slower verdict may come out of one process set)
#   4. EXTRA="--burst-ms 5" etc.: one more A/A with those options, if time is left (started before
#      EXTRA_BY s, default 400; EXTRA_SEED=1: and first one more seed comparison with them)
# Everything comes back as $OUT/lockstep.tgz (results.json, index.html, console logs) + summary.txt.
# Carry limit: one call carries the tracked tree and .carry/ (64 MiB). reports/ (~51 MB) plus the
# two slim wheels (15.6 MB) exceed it, so move reports/ out of the tree for the call and back after
# (mv reports /work/reports-hold; ...; mv /work/reports-hold reports; git status must show no ' D').
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
# a warm machine keeps the last call's runs there (they came back in its $OUT): each step's --output
# would hold a run and be refused (session 31's call 6 ran nothing)
rm -rf /tmp/lk
mkdir -p "$OUT" /tmp/lk
. benchmarks/gpu_carry.sh  # uv (ONLY_UV=1: only that), PYTHONPATH, COMMON
# STOP_BY=S: a run is not started after S s of this call (a run takes ~66 s; the device's limit is 600 s)
step() { local name=$1; shift; local t=$SECONDS
  if [ $((SECONDS - T0 + 70)) -gt "${STOP_BY:-600}" ]; then echo "== $name: skipped (STOP_BY)" | tee -a "$OUT/summary.txt"; return; fi
  # TRACE=1: every burst's raw samples and CPU-speed probe readings (worker.speed_probe) per worker
  if [ "${TRACE:-0}" = 1 ]; then mkdir -p /tmp/lk/trace-$name; export MATRIX_RUN_BURST_TRACE=/tmp/lk/trace-$name; fi
  timeout --signal=TERM --kill-after=10 "$1" "${@:2}" --output /tmp/lk/$name > /tmp/lk/$name.log 2>&1; local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t)) s wall" | tee -a "$OUT/summary.txt"
  grep -E "✓|✗|time:|stopped|failed|warning|pinned" /tmp/lk/$name.log | head -8 | tee -a "$OUT/summary.txt"
  python3 benchmarks/lockstep_summary.py /tmp/lk/$name/results.json 2>&1 | tee -a "$OUT/summary.txt"
  # what is done so far comes back even if a later run overruns the call's limit
  cp /tmp/lk/$name.log /tmp/lk/$name/console.log 2>/dev/null
  tar czf "$OUT/lockstep.tgz" -C /tmp --exclude='.work' lk; }
# SEED=N: N seed comparisons one after another (the first on a fresh machine pays its cold caches)
for i in $(seq 1 "${SEED:-1}"); do
  step seed$([ "$i" = 1 ] || echo "$i") 150 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}"
done
# ABAB=N: N pairs of seed comparisons, the default (seed-a*) and with B_OPTS (seed-b*), alternated
# so that the two see the same machine over the call (a side-by-side variant measurement)
for i in $(seq 1 "${ABAB:-0}"); do
  step seed-a$i 150 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}"
  step seed-b$i 150 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}" ${B_OPTS:-}
done
# MIX=N: N rounds of seed default (seed-a*), seed with B_OPTS (seed-b*), A/A default (aa-a*), A/A with
# B_OPTS (aa-b*): a variant measured side by side on both kinds of run, in case the call ends early
for i in $(seq 1 "${MIX:-0}"); do
  step seed-a$i 150 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}"
  step seed-b$i 150 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}" ${B_OPTS:-}
  step aa-a$i 150 python3 -m matrix_runner run --versions a=2.6.3,b=2.6.3 "${COMMON[@]}"
  step aa-b$i 150 python3 -m matrix_runner run --versions a=2.6.3,b=2.6.3 "${COMMON[@]}" ${B_OPTS:-}
done
# AA_VERSION: the version of the A/A runs (2.6.3 by default; 2.7.0.post2 asks whether its own
# processes differ from one another more than 2.6.3's do)
AAV=${AA_VERSION:-2.6.3}; AAS=$([ "$AAV" = 2.6.3 ] || echo "-$AAV")
for i in $(seq 1 "${AA:-3}"); do
  step aa$AAS$i 150 python3 -m matrix_runner run --versions a=$AAV,b=$AAV "${COMMON[@]}" ${AA_OPTS:-}
done
# AABAB=N: N pairs of A/A runs, the default (aa-a*) and with B_OPTS (aa-b*), alternated
for i in $(seq 1 "${AABAB:-0}"); do
  step aa-a$i 150 python3 -m matrix_runner run --versions a=2.6.3,b=2.6.3 "${COMMON[@]}"
  step aa-b$i 150 python3 -m matrix_runner run --versions a=2.6.3,b=2.6.3 "${COMMON[@]}" ${B_OPTS:-}
done
[ "${QUICK:-1}" = 1 ] && step aa-quick 90 python3 -m matrix_runner run --versions a=2.6.3,b=2.6.3 "${COMMON[@]}" --quick
# 5. four versions at the default budget, if their slim wheels (built here earlier) are carried in
#    .carry/built and the plan needs no source build
if [ "${FOUR:-1}" = 1 ] && ls .carry/built/flash_attn-2.8.3-*.whl >/dev/null 2>&1; then
  python3 -m matrix_runner plan --versions 2.6.3,2.7.0.post2,2.7.4.post1,2.8.3 "${COMMON[@]}" > /tmp/lk/plan4.txt 2>&1
  grep -E "find-links|source" /tmp/lk/plan4.txt | tee -a "$OUT/summary.txt"
  if ! grep -q "source" /tmp/lk/plan4.txt; then
    step four 170 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2,2.7.4.post1,2.8.3 "${COMMON[@]}"
  fi
fi
if [ -n "${EXTRA:-}" ] && [ -n "${EXTRA_SEED:-}" ]; then
  step seed-extra 150 python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}" $EXTRA
fi
if [ -n "${EXTRA:-}" ] && [ $((SECONDS - T0)) -lt "${EXTRA_BY:-400}" ]; then
  step aa-extra 240 python3 -m matrix_runner run --versions a=2.6.3,b=2.6.3 "${COMMON[@]}" $EXTRA
fi
rm -rf /tmp/lk/*/.work
tar czf "$OUT/lockstep.tgz" -C /tmp lk
echo "total $((SECONDS - T0)) s"
