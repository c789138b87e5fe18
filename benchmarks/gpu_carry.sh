# Sourced by the device scripts that time carried wheels (gpu_lockstep.sh, gpu_budget.sh, gpu_variants.sh,
# gpu_explain.sh): uv from
# .carry (or already installed into /tmp/site by an earlier call while the machine is warm: the
# tracked tree plus uv's and both slim wheels exceed one call's 64 MiB carry), matrix-run on
# PYTHONPATH, and COMMON, the options every run there takes (the carried and built wheels, no index).
# ONLY_UV=1: install uv and exit.
[ -x /tmp/site/bin/uv ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl || exit 1
[ "${ONLY_UV:-0}" = 1 ] && { echo "uv installed into /tmp/site"; exit 0; }
export PYTHONPATH=/tmp/site:$PWD
mkdir -p .carry/built  # --find-links needs it to exist
COMMON=(--find-links "$PWD/.carry" --find-links "$PWD/.carry/built" --offline --wheel-cache /tmp/mr-cache --envs-dir envs)
nproc; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
