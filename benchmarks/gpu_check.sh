#!/usr/bin/env bash
# GPU machine: envs from carried wheels, then validate_clocks.py in each env, then one --quick run.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
COMMON=(--versions 2.6.3,2.7.0.post2 --find-links "$PWD/.carry" --offline --wheel-cache /tmp/mr-cache --envs-dir envs)
python3 -m matrix_runner run "${COMMON[@]}" --output /tmp/mr-quick --quick > /tmp/quick.txt 2>&1; tail -22 /tmp/quick.txt
for v in 2.6.3 2.7.0.post2; do
  timeout 150 envs/$v/bin/python -W ignore benchmarks/validate_clocks.py --rounds 3 > "$OUT/validate-$v.json" 2> "$OUT/validate-$v.txt"
  grep -v "^ \|Warning\|warn" "$OUT/validate-$v.txt" | tail -12
done
cp /tmp/mr-quick/results.json "$OUT/quick-results.json"
echo "script seconds: $((SECONDS - T0))"
