#!/usr/bin/env bash
# GPU machine: slim source builds of flash-attn versions whose kernels sit in namespace FLASH_NAMESPACE
# (2.7.4.post1, 2.8.3; issue #11), from the PyPI sdists carried in .carry/, then a --quick run against
# the carried 2.6.3 wheel. Brings back the results, the build log tails and the built wheels (+ keys).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mr-out}; T0=$SECONDS
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/uv-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout --signal=INT --kill-after=20 ${LIMIT:-400} python3 -m matrix_runner run --versions ${VERSIONS:-2.6.3,2.7.4.post1,2.8.3} \
  --find-links "$PWD/.carry" --offline --wheel-cache /tmp/mr-cache --envs-dir envs --quick --output /tmp/b > "$OUT/build.log" 2>&1
echo "exit $? after $((SECONDS - T0)) s"
grep -E "✓|✗|error|time:|slim|stub" "$OUT/build.log" | head -30
cp /tmp/b/results.json "$OUT/" 2>/dev/null
python3 - <<'PY'
import json
d = json.load(open("/tmp/b/results.json"))
for e in d["envs"]:
    b = e.get("build") or {}
    print(e["label"], e["status"], b.get("method"), b.get("seconds"), (e.get("error") or "")[:300])
    for k, v in sorted(((b.get("source_build") or {}).get("compile_seconds") or {}).items()):
        print("   ", k, v)
for c in d["comparisons"]:
    if c["metric"] == "wall_us":
        print(c["candidate"], c["label"], c["op"], round(c["ratio"], 3), c["verdict"])
PY
for f in $(find /tmp/mr-cache -name "flash_attn-2.[78]*.whl*" 2>/dev/null); do cp "$f" "$OUT/"; done
ls -la "$OUT"; find envs -name "*.log" -newer .carry -size +0 2>/dev/null | head -3 | while read l; do echo "== $l"; grep -m5 -E "error|Error" "$l"; done
