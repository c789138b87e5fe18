#!/usr/bin/env bash
# GPU machine (device tool): sampling variants of the lockstep measurement side by side in one call,
# on the default (seed) config with its 60 s budget. Needs .carry/ as benchmarks/gpu_lockstep.sh.
# Each argument is NAME:VERSIONS:OPTIONS, e.g.
#   bash benchmarks/gpu_variants.sh "aa-s15:a=2.6.3,b=2.6.3:--set-seconds 1.5" "seed-s15:2.6.3,2.7.0.post2:--set-seconds 1.5"
# Brings back $OUT/variants.tgz (results.json, index.html, console logs) and appends to $OUT/summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT" /tmp/va
. benchmarks/gpu_carry.sh  # uv, PYTHONPATH, COMMON
for spec in "$@"; do
  IFS=: read -r name versions opts <<< "$spec"; t=$SECONDS
  # shellcheck disable=SC2086
  timeout --signal=TERM --kill-after=10 150 python3 -m matrix_runner run --versions "$versions" "${COMMON[@]}" $opts \
    --output /tmp/va/$name > /tmp/va/$name.log 2>&1; rc=$?
  echo "== $name ($versions; $opts): exit $rc, $((SECONDS - t)) s wall" | tee -a "$OUT/summary.txt"
  python3 benchmarks/lockstep_summary.py /tmp/va/$name/results.json 2>&1 | grep -v "^  host" | tee -a "$OUT/summary.txt"
  rm -rf /tmp/va/*/.work
  tar czf "$OUT/variants.tgz" -C /tmp va  # after every variant: a call cut short keeps what ran
done
echo "total $((SECONDS - T0)) s"
