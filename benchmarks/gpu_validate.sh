#!/usr/bin/env bash
# GPU machine, envs from carried wheels (.carry/ holds the wheels a first gpu_run.sh built, with their
# key sidecars): (1) the default two-version run, (2) a --quick run on the same envs, (3)
# validate_clocks.py in each env (matrix-run's clocks vs torch Timer and triton do_bench_cudagraph).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT" /tmp/mr-logs
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
COMMON=(--versions 2.6.3,2.7.0.post2 --find-links "$PWD/.carry" --offline --wheel-cache /tmp/mr-cache --envs-dir envs)
/usr/bin/time -f "default run wall %e s" python3 -m matrix_runner run "${COMMON[@]}" --output /tmp/mr-run ${RUN_ARGS:-} 2>&1 | tee /tmp/mr-logs/console-default.txt | tail -45
/usr/bin/time -f "quick run wall %e s" python3 -m matrix_runner run "${COMMON[@]}" --output /tmp/mr-quick --quick 2>&1 | tee /tmp/mr-logs/console-quick.txt | tail -25
for v in 2.6.3 2.7.0.post2; do
  timeout 150 envs/$v/bin/python benchmarks/validate_clocks.py --rounds 3 > "$OUT/validate-$v.json" 2> /tmp/mr-logs/validate-$v.txt
  cat /tmp/mr-logs/validate-$v.txt
done
cp /tmp/mr-run/results.json "$OUT/results.json"; cp /tmp/mr-run/index.html "$OUT/index.html"
cp /tmp/mr-quick/results.json "$OUT/quick-results.json"
cp -r envs/.logs /tmp/mr-logs/envs-logs 2>/dev/null; cp -r /tmp/mr-run/.work /tmp/mr-logs/work 2>/dev/null
tar czf "$OUT/logs.tgz" -C /tmp mr-logs
echo "script seconds: $((SECONDS - T0))"
