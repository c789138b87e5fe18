"""Stage 5a — results.json: the versioned record of a run, and the comparisons computed from it.

Schema ``matrix-runner/results/1`` (top-level keys)::

    schema, run_id, created, finished, title, command, config, config_source, settings,
    machine:      {hostname, platform, cpu_count, python, gpu, driver, cuda, torch, ...}
    envs:         [{label, requested_version, flash_attn_version, flash_attn_file, flash_attn_ext_file,
                    torch, torch_cuda, python, status, error, error_tail, build: {method, seconds, reused, ...}}]
    cases:        [{env, id, label, op, batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype,
                    causal, dropout_p, softmax_scale, status, error, error_kind,
                    metrics: {wall_us|host_us|device_us|graph_us: {median, pooled_median, iqr, q1, q3,
                              n, n_rounds, round_medians, samples}},
                    tflops: {wall, device}, host_bound, kernels, correctness, notes}]
    comparisons:  [{baseline, candidate, case, label, op, metric, ratio, ci_low, ci_high, delta_us,
                    delta_ci_low, delta_ci_high, p_value, verdict, attribution, attribution_why,
                    host_bound: {baseline, candidate}, n_rounds}]
    rounds:       [{round, env, seconds, status, error, restarts, gpu: {sm_clock_mhz_min, ...}}]
    timing:       {env_phase_s, timing_phase_s, total_s, stop_reason}

All times are µs per call unless a key ends in ``_s`` (seconds). ``ratio`` is candidate/baseline:
above 1 the candidate is slower.
"""
from __future__ import annotations

import json
import os
import tempfile
import zlib
from pathlib import Path

from . import stats
from .config import Case

SCHEMA = "matrix-runner/results/1"
CORRECTNESS_TOL = {"fp16": 1e-2, "bf16": 3e-2}  # relative (Frobenius) error vs the fp32 reference


def case_record(cd, case: Case) -> dict:
    """One entry of ``cases`` from a runner.CaseData."""
    d = case.to_dict()
    d.update({"env": cd.env, "label": case.label, "status": cd.status, "error": cd.error,
              "error_kind": cd.error_kind, "notes": cd.notes, "seconds": round(cd.seconds, 2),
              "kernels": cd.kernels, "inner": cd.inner, "clock_seconds": cd.clock_seconds})
    metrics = {}
    for m, rounds in cd.rounds.items():
        s = stats.summarize(rounds)
        if s:
            metrics[m] = s
    d["metrics"] = metrics
    med = {m: v["median"] for m, v in metrics.items()}
    d["tflops"] = {"wall": stats.tflops(case.flops(), med.get("wall_us")),
                   "device": stats.tflops(case.flops(), med.get("device_us"))}
    d["host_bound"] = stats.host_bound(med.get("host_us"), med.get("device_us"))
    d["correctness"] = _worst_correctness(cd.correctness, case.dtype)
    if cd.status == "pending":
        d["status"] = "not run"
    return d


def _worst_correctness(checks: list[dict], dtype: str) -> dict | None:
    if not checks:
        return None
    worst: dict = {}
    skipped = None
    for chk in checks:
        for name, v in chk.items():
            if name == "skipped":
                skipped = v
                continue
            w = worst.setdefault(name, {"max_abs_err": 0.0, "rel_err": 0.0, "finite": True})
            w["max_abs_err"] = max(w["max_abs_err"], v["max_abs_err"])
            w["rel_err"] = max(w["rel_err"], v["rel_err"])
            w["finite"] = w["finite"] and v["finite"]
    if skipped and not worst:
        return {"skipped": skipped}
    tol = CORRECTNESS_TOL.get(dtype, 1e-2)
    ok = all(v["finite"] and v["rel_err"] <= tol for v in worst.values())
    return {"tensors": worst, "tolerance": tol, "ok": ok}


def comparisons(cases: list[dict], labels: list[str], min_effect: float, paired: bool | None = None) -> list[dict]:
    """Every candidate vs the baseline (first label), per case and metric, with attribution on wall.
    ``paired``: passed to stats.compare (None pairs by round where possible; False for envs of different runs)."""
    by = {(c["env"], c["id"]): c for c in cases}
    ids = list(dict.fromkeys(c["id"] for c in cases))
    out = []
    if not labels:
        return out
    base = labels[0]
    for cand in labels[1:]:
        for cid in ids:
            b, k = by.get((base, cid)), by.get((cand, cid))
            if not b or not k or b["status"] != "ok" or k["status"] != "ok":
                continue
            per = {}
            for m in ("wall_us", "host_us", "device_us", "graph_us"):
                if m in b["metrics"] and m in k["metrics"]:
                    per[m] = stats.compare(b["metrics"][m]["samples"], k["metrics"][m]["samples"], min_effect,
                                           seed=zlib.crc32(f"{cid}/{m}".encode()), paired=paired)
            attr, why = stats.attribute(per.get("wall_us"), per.get("host_us"), per.get("device_us"))
            for m, cmp in per.items():
                if cmp is None:
                    continue
                out.append({"baseline": base, "candidate": cand, "case": cid, "label": b["label"], "op": b["op"],
                            "metric": m, **cmp,
                            "attribution": attr if m == "wall_us" else None,
                            "attribution_why": why if m == "wall_us" else None,
                            "host_bound": {"baseline": b["host_bound"], "candidate": k["host_bound"]}})
    return out


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same dir, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name, suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # a report's data, readable like its index.html
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_finite(data), f, indent=1, default=_default, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _finite(o):
    """NaN and infinities become null: results.json stays valid JSON (RFC 8259 has no NaN)."""
    if isinstance(o, float):
        return o if o == o and o not in (float("inf"), float("-inf")) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def _default(o):
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


class ResultsError(ValueError):
    """A results file is missing, not JSON, or of another schema."""


def load(path: str | Path) -> dict:
    """Load and check a results.json; raises ResultsError with the file name and the problem."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ResultsError(f"{p}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise ResultsError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultsError(f"{p}: schema {data.get('schema') if isinstance(data, dict) else None!r} is not "
                           f"{SCHEMA!r}")
    return data


def merge(runs: list[dict], min_effect: float | None = None) -> dict:
    """Merge several results (e.g. one per tox env) into one: envs and cases concatenated (labels
    made unique), comparisons recomputed against the first env: paired by round only for an env of the
    baseline's own run, unpaired (independent groups) for an env from another run."""
    if len(runs) == 1 and min_effect is None:
        return runs[0]
    out = json.loads(json.dumps(runs[0], default=_default))
    seen = {e["label"] for e in out["envs"]}
    run_of = {lab: 0 for lab in seen}  # env label -> index of its run: only one run's rounds interleave
    for i, r in enumerate(runs[1:], 1):
        rename = {}
        for e in r["envs"]:
            lab = e["label"]
            while lab in seen:
                lab += "'"
            rename[e["label"]] = lab
            seen.add(lab)
            run_of[lab] = i
            out["envs"].append({**e, "label": lab})
        for c in r["cases"]:
            out["cases"].append({**c, "env": rename.get(c["env"], c["env"])})
        out.setdefault("rounds", []).extend(r.get("rounds", []))
    eff = min_effect if min_effect is not None else (out.get("settings") or {}).get("min_effect", 0.05)
    out.setdefault("settings", {})["min_effect"] = eff  # the report's text follows the verdicts
    labels = [e["label"] for e in out["envs"] if e["status"] == "ok"]
    out["comparisons"] = [c for cand in labels[1:]
                          for c in comparisons(out["cases"], [labels[0], cand], eff,
                                               paired=None if run_of[cand] == run_of[labels[0]] else False)]
    out["merged_from"] = [r.get("run_id") for r in runs]
    return out
