#!/usr/bin/env bash
# The GPU machine's run of matrix-run (device tool; no network, no uv there).
# Carried in .carry/: uv's manylinux wheel, the flash-attn sdists, and (after a first run) the wheels
# that run built, each with its .matrix-run.json key sidecar. Results come back under $OUT:
#   results.json, index.html, the built wheels + sidecars, logs.tgz (build logs, worker logs, console).
# Usage: bash benchmarks/gpu_run.sh [extra matrix-run args]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}
LIMIT=${LIMIT:-560}          # seconds this script may use in all (the device call allows 600)
VERSIONS=${VERSIONS:-2.6.3,2.7.0.post2}
T0=$SECONDS
mkdir -p "$OUT" /tmp/mr-logs
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi; nproc; free -g; python3 -c "import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"; nvcc --version | tail -2; } > /tmp/mr-logs/machine.txt 2>&1
head -20 /tmp/mr-logs/machine.txt
COMMON=(--versions "$VERSIONS" --find-links "$PWD/.carry" --offline --wheel-cache /tmp/mr-cache --envs-dir envs)
python3 -m matrix_runner plan "${COMMON[@]}" 2>&1 | tee /tmp/mr-logs/plan.txt
left=$((LIMIT - (SECONDS - T0) - 25))
timeout --signal=TERM --kill-after=15 "$left" \
  python3 -m matrix_runner run "${COMMON[@]}" --output /tmp/mr-run --case-timeout 120 "$@" 2>&1 | tee /tmp/mr-logs/console.txt
echo "matrix-run exit: ${PIPESTATUS[0]}" | tee -a /tmp/mr-logs/console.txt
cp /tmp/mr-run/results.json /tmp/mr-run/index.html "$OUT/" 2>/dev/null
left=$((LIMIT - (SECONDS - T0) - 20))
if [ "$left" -gt 60 ] && [ -x envs/2.6.3/bin/python ]; then   # process-to-process spread, pinned vs not
  timeout "$left" envs/2.6.3/bin/python -W ignore benchmarks/process_modes.py envs/2.6.3/bin/python 6 2 2>&1 | tee /tmp/mr-logs/process-modes.txt | grep -v '^{'
fi
for w in /tmp/mr-cache/wheels/*/*.whl; do [ -f "$w" ] && cp "$w" "$w.matrix-run.json" "$OUT/"; done
cp -r envs/.logs /tmp/mr-logs/envs-logs 2>/dev/null; cp -r /tmp/mr-run/.work /tmp/mr-logs/work 2>/dev/null
tar czf "$OUT/logs.tgz" -C /tmp mr-logs
ls -la "$OUT"; echo "script seconds: $((SECONDS - T0))"
