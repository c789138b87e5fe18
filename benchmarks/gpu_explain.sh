#!/usr/bin/env bash
# GPU machine (device tool; no network, no uv there): the explain pass (issue #12) on real flash-attn,
# in one device call: `matrix-run run --versions 2.6.3,2.7.0.post2 --explain` on the default (seed)
# config and budget, then `matrix-run explain` re-rendering it from the saved data.
#
# Needs in .carry/ (as benchmarks/gpu_lockstep.sh): uv's wheel, the slim 2.6.3 / 2.7.0.post2 wheels
# (hdim32 fp16, sm_90) with their key sidecars (../shared/wheels/), and py-spy's wheel. On a
# connected machine, before the call:
#   python3 -m pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
#       --python-version 3.12 'py-spy>=0.3.14' -d .carry/
# (py-spy's wheel is one static x86_64 binary for any Python 3; it needs ptrace: the device machine
# runs as root, where it attached and sampled 2,999 of 3,000 times in 3 s with 0 errors.)
#
# Brings back under $OUT: explain.tgz (results.json with the explain record and the folded stacks,
# index.html with the "Explain the overhead" section, the console log, py-spy's logs and the folded
# files from .work/) and summary.txt (exit code, times, the terminal explain summary, the verdicts).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT" /tmp/ex
. benchmarks/gpu_carry.sh  # uv, PYTHONPATH, COMMON
python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .carry/py_spy-*.whl \
  || echo "py-spy wheel missing in .carry/: the frame profile will be skipped (the run says so)" | tee -a "$OUT/summary.txt"
export MATRIX_RUN_PYSPY=/tmp/pyspy/bin/py-spy
rm -rf /tmp/ex/seed   # a second call on a warm machine: --output refuses an existing run
[ -x "$MATRIX_RUN_PYSPY" ] && "$MATRIX_RUN_PYSPY" --version | tee -a "$OUT/summary.txt"
t=$SECONDS
timeout --signal=TERM --kill-after=10 ${LIMIT:-480} python3 -m matrix_runner run --versions 2.6.3,2.7.0.post2 "${COMMON[@]}" \
  --explain ${EXTRA:-} --output /tmp/ex/seed > /tmp/ex/seed.log 2>&1; rc=$?
echo "== seed --explain: exit $rc, $((SECONDS - t)) s wall" | tee -a "$OUT/summary.txt"
grep -E "✓|✗|time:|stopped|failed|warning|pinned|explain" /tmp/ex/seed.log | head -12 | tee -a "$OUT/summary.txt"
python3 -m matrix_runner explain /tmp/ex/seed 2>&1 | tee -a "$OUT/summary.txt"
python3 benchmarks/lockstep_summary.py /tmp/ex/seed/results.json 2>&1 | tee -a "$OUT/summary.txt"
mkdir -p /tmp/ex/seed/explain-work
cp /tmp/ex/seed/.work/explain-* /tmp/ex/seed/explain-work/ 2>/dev/null
rm -rf /tmp/ex/*/.work
tar czf "$OUT/explain.tgz" -C /tmp ex
echo "total $((SECONDS - T0)) s" | tee -a "$OUT/summary.txt"
