"""Build flash-attn versions one after the other with the compile cache and print, per build, the
plan's expected cache hits and estimate, the build's seconds, per-file compile seconds and sccache's
counters (issue #11: a second version whose kernel files match an already built one in <= 90 s).

    python benchmarks/cache_builds.py --find-links SDISTS --cache DIR --envs DIR [--archs 90] [--config FILE]
        [--plan-only] [LABEL=]V1 [LABEL=]V2 ...

Uses the default config (3 hdim32 fp16 kernel files) unless --config, --torch inherit, --offline, matrix-run's
envs.plan_env / envs.prepare_env (the code path of `matrix-run run`), one version at a time so the
second plan reads the first build's keys from the ledger.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_runner import compcache, config  # noqa: E402
from matrix_runner import envs as E  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("versions", nargs="+")
    ap.add_argument("--find-links", action="append", required=True)
    ap.add_argument("--config", default=None)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--envs", required=True)
    ap.add_argument("--archs", default=None)
    ap.add_argument("--plan-only", action="store_true")
    a = ap.parse_args()
    cfg = config.load_config(a.config)
    opts = E.Options(envs_dir=Path(a.envs).resolve(), cache_dir=Path(a.cache).resolve(),
                     find_links=[Path(d).resolve() for d in a.find_links], offline=True, build="slim",
                     archs=a.archs.split(",") if a.archs else None)
    dprobe = E.probe(sys.executable)
    sccache = compcache.find_sccache()
    print(f"sccache: {sccache}", flush=True)
    rc = 0
    for v in a.versions:
        (req,) = E.parse_versions(v)
        item = E.plan_env(req, cfg.cases, opts, dprobe)
        cc = item.compile_cache or {}
        print(f"== {v}: plan {item.method}, kernels {item.kernels}, estimate {item.estimate_s} s "
              f"(cold {cc.get('estimate_cold_s', item.estimate_s)} s, MAX_JOBS {(item.jobs or {}).get('max_jobs')}); "
              f"{cc.get('note') or item.error}", flush=True)
        if a.plan_only or item.method == "failed":
            rc |= item.method == "failed"
            continue
        t0 = time.monotonic()
        res = E.prepare_env(req, item, opts, dprobe, cfg.cases,
                            lambda label, msg: print(f"   [{time.monotonic() - t0:6.1f} s] {label}: {msg}", flush=True))
        sb = (res.build or {}).get("source_build") or {}
        print(f"== {v}: {res.status} in {time.monotonic() - t0:.1f} s (build {sb.get('seconds')} s) {res.error or ''}")
        for k, s in sorted((sb.get("compile_seconds") or {}).items()):
            print(f"   {k}: {s} s")
        print("   sccache counters of this build:", json.dumps((sb.get("compile_cache") or {}).get("stats")))
        if res.status != "ok":
            rc = 1
            print(res.error_tail or "")
    if sccache and not a.plan_only:
        st = compcache.stats(sccache, opts.cache_dir)
        print("sccache totals:", json.dumps(st))
    return rc


if __name__ == "__main__":
    sys.exit(main())
