#!/usr/bin/env bash
# GPU machine (device tool): what time budget meets issue #10's figures? Fresh default-config runs
# at a given --time-budget, one after another in one device call; max_sets: auto (40 per minute of
# budget) lets the budget stop each (the confidence sequences' mixing is tuned to the planned sets,
# so a fresh run at budget B is what a user asking for B gets; an extension of a 60 s run by
# --resume keeps the 60 s tuning).
#   RUNS="seed:60 aa:120 aa:120 aa:120": KIND:BUDGET_S, in order; seed = 2.6.3 vs 2.7.0.post2,
#   aa = 2.6.3 under two labels. Needs in .carry/: uv's wheel and the slim 2.6.3 / 2.7.0.post2
#   wheels with their key sidecars (../shared/wheels/). Move reports/ out of the tree for the call
#   (the carry limit; see gpu_lockstep.sh). STOP_BY=S: a run is not started if it would end after S s.
# Everything comes back as $OUT/budget.tgz (results.json, index.html, console logs) + summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
rm -rf /tmp/bg
mkdir -p "$OUT" /tmp/bg
. benchmarks/gpu_carry.sh  # uv, PYTHONPATH, COMMON
i=0
for item in ${RUNS:-seed:60 aa:120 aa:120 aa:120}; do
  i=$((i + 1)); kind=${item%%:*}; budget=${item##*:}; name=$i-$kind-$budget
  if [ $((SECONDS - T0 + budget + 15)) -gt "${STOP_BY:-580}" ]; then echo "== $name: skipped (STOP_BY)" | tee -a "$OUT/summary.txt"; continue; fi
  case $kind in
    seed) versions=2.6.3,2.7.0.post2 ;;
    aa) versions=a=2.6.3,b=2.6.3 ;;
    *) echo "unknown kind $kind" >&2; exit 2 ;;
  esac
  extra=(); [ "$budget" = 60 ] || extra=(--time-budget "$budget")  # max_sets: auto follows it
  t=$SECONDS
  timeout --signal=TERM --kill-after=10 $((budget + 60)) python3 -m matrix_runner run --versions "$versions" "${COMMON[@]}" \
    "${extra[@]}" --output /tmp/bg/$name > /tmp/bg/$name.log 2>&1; rc=$?
  echo "== $name: exit $rc, $((SECONDS - t)) s wall" | tee -a "$OUT/summary.txt"
  python3 benchmarks/widths.py /tmp/bg/$name 2>&1 | tee -a "$OUT/summary.txt"
  cp /tmp/bg/$name.log /tmp/bg/$name/console.log 2>/dev/null
  tar czf "$OUT/budget.tgz" -C /tmp --exclude='.work' bg
done
python3 benchmarks/widths.py --speed /tmp/bg/*/ 2>&1 | tee -a "$OUT/summary.txt"
tar czf "$OUT/budget.tgz" -C /tmp --exclude='.work' bg
echo "total $((SECONDS - T0)) s"
