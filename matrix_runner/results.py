"""Stage 5a — results.json: the versioned record of a run, and the comparisons computed from it.

Schema ``matrix-runner/results/1`` (top-level keys)::

    schema, run_id, created, finished, title, command, config, config_source, settings,
    machine:      {hostname, platform, cpu_count, python, gpu, driver, cuda, torch, ...}
    envs:         [{label, requested_version, subject, flash_attn_version, flash_attn_file, flash_attn_ext_file,
                    torch, torch_cuda, python, status, error, error_tail, build: {method, seconds, reused, ...},
                    axis: {version, torch} in a version x torch matrix (--torch A,B), else null}]
    cases:        [{env, id, label, op, batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype,
                    causal, dropout_p, softmax_scale, status, error, error_kind,
                    metrics: {wall_us|host_us|device_us|graph_us: {median, pooled_median, iqr, q1, q3,
                              n, n_rounds, round_medians, samples}},
                    tflops: {wall, device, graph}, kv_read_bytes, gbps: {wall, device, graph} (kvcache; else null), host_bound, kernels, correctness, notes}]
    comparisons:  (baseline, candidate pairs: :func:`env_pairs`)
                  [{baseline, candidate, case, label, op, metric, ratio, ci_low, ci_high, delta_us,
                    delta_ci_low, delta_ci_high, p_value, verdict, attribution, attribution_why,
                    host_bound: {baseline, candidate}, n_rounds}]
    rounds:       [{round, env, seconds, status, error, restarts, gpu: {sm_clock_mhz_min, ...}}]
    timing:       {env_phase_s, timing_phase_s, total_s, stop_reason, probe_s (the driver's torch
                  probe), before_timing_s (probe and plan: counted in the time budget), close_s (after
                  the last set, the workers still alive stopped and reaped: not in the budget's
                  estimate of a set, so a run can end this much past its budget), budget_excluded_s
                  (building and installing envs, over all sessions of a run: not in the budget),
                  resumed_other_s (a --resume: the earlier sessions' time outside their timing
                  phases, counted in the budget; null for a run's first session)}
    gate:         (a run with --fail-on-regression PCT) {threshold_pct, outcome: failed | not judged |
                  passed, exit, regressions, not_judged, undecided, text}: pipeline.gate_outcome
    sharded runs (shard module): cases[].gpu {index, uuid, name, shard, sm_clock_mhz_min/max};
    sets[].shard; shards: [{index, count, gpu, cases, cpus, stop_reason, timing_phase_s, lost}];
    a job's own results: shard {index, count, host, gpu}

All times are µs per call unless a key ends in ``_s`` (seconds). ``ratio`` is candidate/baseline:
above 1 the candidate is slower.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import statistics
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Callable

from . import stats
from .config import CYCLED, METRICS, Case
from .errors import UsageError

SCHEMA = "matrix-runner/results/2"
#: Schemas :func:`load` reads: results/1 (one worker process per round, comparisons paired by round
#: position) is read as it was written; its comparisons are recomputed with the method it used.
READABLE = ("matrix-runner/results/1", SCHEMA)
#: How a results/2 run's comparisons are made (stats.set_compare, stats.select_family); named in the
#: data. "/1": each interval at 1 - alpha/m (Bonferroni); "/2": e-BY over the decided ones; "/3":
#: the pass clocks' (kernel time, CUDA graph) mixing tuned for a few sets (stats.PASS_N_TARGET); "/4":
#: the glitch guard (stats.GLITCH_LOG: a cycle twice or half the comparison's ratio so far is left out);
#: "/5": the guard in pinned sets only (an unpinned set's cycles spread too widely for it).
METHOD = "lockstep-sets/anytime-t-cs/5"
#: The methods whose comparisons are recomputed without the glitch guard, as they were judged.
GUARDLESS_METHODS = ("lockstep-sets/anytime-t-cs/1", "lockstep-sets/anytime-t-cs/2", "lockstep-sets/anytime-t-cs/3")
#: Methods whose glitch guard covered every set, pinned or not (since /5: pinned sets only,
#: stats.GLITCH_LOG).
GUARD_EVERY_SET_METHODS = ("lockstep-sets/anytime-t-cs/4",)
#: The methods whose comparisons are recomputed without e-BY, as they were judged.
BONFERRONI_METHODS = ("lockstep-sets/anytime-t-cs/1",)
#: The methods whose pass clocks were tuned for the run's planned sets (recomputed so).
PLANNED_PASS_METHODS = ("lockstep-sets/anytime-t-cs/1", "lockstep-sets/anytime-t-cs/2")
CORRECTNESS_TOL = {"fp16": 1e-2, "bf16": 3e-2}  # relative (Frobenius) error vs the fp32 reference


def first_call_record(by_set: dict | None) -> dict | None:
    """``first_call_ms`` of a case record: the ms of the case's first synchronized call in each fresh
    worker process (its set-up; runner.CaseData.first_call), ``{by_set: {set id: [ms per worker]},
    first_set_median, later_median, n}``: the first set's processes are the run's first calls
    (a JIT subject compiles there unless its on-disk cache already holds the kernels, and lazy
    imports run there), later sets' show the warm cost (e.g. loading compiled kernels from that
    cache; without the modules the first set's set-ups imported, which their workers imported as
    they started: runner, pre-import). None without any."""
    def med(v):
        return round(statistics.median(v), 3) if v else None

    if not by_set:
        return None
    per = {int(k): [float(x) for x in v] for k, v in sorted(by_set.items(), key=lambda kv: int(kv[0]))}
    sids = list(per)
    first = per[sids[0]]
    later = [x for k in sids[1:] for x in per[k]]
    return {"by_set": {str(k): v for k, v in per.items()},
            "first_set_median": med(first), "later_median": med(later), "n": len(first) + len(later)}


def case_record(cd, case: Case) -> dict:
    """One entry of ``cases`` from a runner.CaseData: per metric the summary over sets
    (stats.summarize, each set as one group of values) plus ``by_set`` (set id -> cycle id -> µs for
    wall/host, set id -> list of µs for device/graph), so comparisons pair by set and cycle id."""
    d = case.to_dict()
    d.update({"env": cd.env, "label": case.label, "status": cd.status, "error": cd.error,
              "error_kind": cd.error_kind, "notes": cd.notes, "seconds": round(cd.seconds, 2),
              "kernels": cd.kernels, "inner": cd.inner, "clock_seconds": cd.clock_seconds, "faults": cd.faults,
              "first_call_ms": first_call_record(getattr(cd, "first_call", None))})
    metrics = {}
    for m, by in cd.sets.items():
        # the summary (median, quartiles: the µs shown) is of the bursts' plain medians where the
        # comparison uses speed-adjusted ones (stats.SpeedSlope)
        shown = getattr(cd, "raw", {}).get(m) or by
        s = stats.summarize([list(v.values()) if isinstance(v, dict) else list(v) for v in shown.values()])
        if s:
            s["by_set"] = {str(sid): ({str(k): x for k, x in v.items()} if isinstance(v, dict) else list(v))
                           for sid, v in by.items()}
            # wall/host: the CPU-speed probe read over the same bursts (worker.speed_probe, µs), the
            # bursts' plain medians (µs; by_set holds them at the reference speed: stats.SpeedSlope)
            # and the slope and centre each set ended with
            for name, attr in (("ref_by_set", "refs"), ("raw_by_set", "raw")):
                got = getattr(cd, attr, {}).get(m)
                if got:
                    s[name] = {str(sid): {str(k): x for k, x in v.items()} for sid, v in got.items()}
            if getattr(cd, "speed", {}).get(m):
                s["speed_by_set"] = {str(sid): v for sid, v in cd.speed[m].items()}
            metrics[m] = s
    d["metrics"] = metrics
    med = {m: v["median"] for m, v in metrics.items()}
    d["tflops"] = {k: stats.tflops(case.flops(), med.get(f"{k}_us")) for k in ("wall", "device", "graph")}
    # kvcache decode is memory-bound: GB/s of KV read (Case.kv_read_bytes), None for other funcs
    kvb = case.kv_read_bytes()
    d["kv_read_bytes"] = kvb
    d["gbps"] = None if kvb is None else {k: stats.gbps(kvb, med.get(f"{k}_us")) for k in ("wall", "device", "graph")}
    d["host_bound"] = stats.host_bound(med.get("host_us"), med.get("device_us"))
    d["correctness"] = _worst_correctness(cd.correctness, case.dtype)
    if getattr(cd, "gpu", None):
        d["gpu"] = cd.gpu  # sharded run: the one GPU all versions of this case ran on
    if cd.status == "pending":
        d["status"] = "not run"
        d["error_kind"] = d.get("error_kind") or "not-run"
        d["error"] = d.get("error") or ("not timed: no process set timed this case (sampling stopped first: the "
                                        "time budget or max_sets ran out, or a fault ended the set; or the same "
                                        "case failed in the other envs, leaving nothing to compare)")
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
            for k in ("max_abs_err", "rel_err"):
                x = v.get(k)
                if not isinstance(x, (int, float)) or not math.isfinite(x):
                    # an error that is NaN/inf is no pass (max(0.0, nan) had kept 0.0: new-user trial)
                    w[k], w["finite"] = math.inf, False
                else:
                    w[k] = max(w[k], x)
            w["finite"] = w["finite"] and bool(v.get("finite"))
    if skipped and not worst:
        return {"skipped": skipped}
    tol = CORRECTNESS_TOL.get(dtype, 1e-2)
    ok = all(v["finite"] and v["rel_err"] <= tol for v in worst.values())
    return {"tensors": worst, "tolerance": tol, "ok": ok}


def _by_set(metric: dict) -> dict | None:
    """A results/2 metric's ``by_set`` with int keys (cycle dicts for wall/host), or None (results/1)."""
    by = metric.get("by_set")
    if not isinstance(by, dict):
        return None
    out = {}
    for sid, v in by.items():
        if isinstance(v, dict):
            out[int(sid)] = {int(k): (float(x) if x is not None else None) for k, x in v.items()}
        else:
            out[int(sid)] = [float(x) for x in v if x is not None]
    return out


def _probes(mb: dict, mk: dict) -> tuple | None:
    """The two metrics' speed-probe readings (``ref_by_set``: set id -> cycle id -> µs, int keys, as
    :func:`_by_set` reads ``by_set``) for stats.set_compare ``probes``; None when either lacks them
    (nothing to judge the cycles by)."""
    out = tuple(_by_set({"by_set": m.get("ref_by_set")}) for m in (mb, mk))
    return out if all(out) else None


def env_pairs(envs: list[dict]) -> list[tuple[str, str]]:
    """The (baseline, candidate) pairs a run's ok ``envs`` (results.json entries) are compared in
    (stats.comparison_pairs: each against the first, or within each torch and within each version
    where the envs carry a version x torch ``axis``)."""
    return stats.comparison_pairs([(e["label"], e.get("axis")) for e in envs if e.get("status") == "ok"])


def comparisons(cases: list[dict], labels: list[str], min_effect: float, *, paired: bool = True,
                settings: dict | None = None, pairs: list | None = None, sets: list | None = None) -> list[dict]:
    """Every candidate vs its baseline, per case and metric, with attribution on wall: ``pairs``
    (baseline, candidate) labels (:func:`env_pairs`), default every label against the first.

    results/2 data (``by_set``) measured in one run: :func:`stats.set_compare` — process sets paired by
    set id, cycles by cycle id, an anytime-valid interval; the comparisons of each metric are one
    family at ``settings``' ``alpha``: :func:`stats.select_family` (e-BY) over them, or, for a run
    of a method in :data:`BONFERRONI_METHODS`, Bonferroni alone as it was judged. ``paired=False`` (envs from separate
    runs: ``merge``, ``compare``) or results/1 data: :func:`stats.compare` on the per-set (per-round)
    values as independent groups, or paired by round for a results/1 run as it was written."""
    settings = settings or {}
    by = {(c["env"], c["id"]): c for c in cases}
    ids = list(dict.fromkeys(c["id"] for c in cases))
    out = []
    if not labels:
        return out
    todo = [(base, cand, cid) for base, cand in stats.pairs_among(labels, pairs) for cid in ids
            if (by.get((base, cid)) or {}).get("status") == "ok" and (by.get((cand, cid)) or {}).get("status") == "ok"]
    alpha = float(settings.get("alpha") or 0.05)
    quick = bool(settings.get("quick"))
    n_target = int(settings.get("planned_sets") or 8)
    family = {}
    for m in METRICS:
        family[m] = sum(1 for base, cand, cid in todo if m in by[(base, cid)]["metrics"] and m in by[(cand, cid)]["metrics"])
    selective = settings.get("method") not in BONFERRONI_METHODS
    pass_target = None if settings.get("method") in PLANNED_PASS_METHODS else stats.PASS_N_TARGET
    guard = settings.get("method") not in GUARDLESS_METHODS
    unguarded = (frozenset() if settings.get("method") in GUARD_EVERY_SET_METHODS else stats.unpinned_sets(sets))
    rows = []
    for base, cand, cid in todo:
        b, k = by[(base, cid)], by[(cand, cid)]
        per, _, _ = compare_case(b, k, min_effect, paired=paired, seed_key=cid, family=family, alpha=alpha,
                                 n_target=n_target, quick=quick, selective=selective, pass_target=pass_target,
                                 glitch_guard=guard, unguarded_sets=unguarded,
                                 cpu_state=settings.get("cpu_state") or "all")
        rows.append((base, cand, cid, per))
    if selective:
        for m in METRICS:
            stats.select_family([per.get(m) for *_, per in rows if (per.get(m) or {}).get("ci_method") == stats.SET_METHOD],
                                family_alpha=alpha, family_size=family[m], min_effect=min_effect)
    for base, cand, cid, per in rows:
        b, k = by[(base, cid)], by[(cand, cid)]
        attr, why = stats.attribute(per.get("wall_us"), per.get("host_us"), per.get("device_us"))
        for m, cmp in per.items():
            if cmp is None:
                continue
            out.append({"baseline": base, "candidate": cand, "case": cid, "label": b["label"], "op": b["op"],
                        "impl": b.get("impl", "flash_attn"), "metric": m, **cmp,
                        "attribution": attr if m == "wall_us" else None,
                        "attribution_why": why if m == "wall_us" else None,
                        "host_bound": {"baseline": b["host_bound"], "candidate": k["host_bound"]}})
    return out


#: Why a wall or host ratio between two runs (``compare``, a merged report's env from another run) is
#: provisional, never faster/slower/same: those clocks follow the CPU's speed, and two runs met the
#: machine at other speeds. Replayed on 51 pairs of consecutive committed H200 A/A runs of one build
#: (``benchmarks/between_runs.py``, ``benchmarks/results/between-runs-12-06.txt``), the between-run
#: interval (fixed-n, sets as independent groups) called the build faster or slower than itself in 24 %
#: of wall comparisons and 28 % of host ones, in half of the run pairs: the run-to-run spread of the
#: ratio (SD 14 % wall, median over cases) is wider than the interval (±9.8 %). Kernel and CUDA-graph
#: time are GPU clocks: 0 of 612 false each there (spread 0.4 %), so their verdicts stay.
BETWEEN_RUNS_WHY = ("between runs: the two runs did not take turns on one core, and wall and host time follow the "
                    "CPU speed each run met (between runs of one build on the H200 the ratio spread 14 %), so "
                    "no verdict; time both in one run for one (matrix-run --versions A,B)")


def compare_case(b: dict, k: dict, min_effect: float, *, paired: bool, seed_key: str,
                 metrics: tuple = METRICS, family: dict | None = None, alpha: float = 0.05, n_target: int = 8,
                 quick: bool = False, selective: bool = True,
                 pass_target: int | None = stats.PASS_N_TARGET,
                 glitch_guard: bool = True, unguarded_sets: frozenset = frozenset(),
                 cpu_state: str = "all") -> tuple[dict, str | None, str | None]:
    """One case's comparison, candidate record ``k`` against baseline record ``b`` (results.json case
    records of one case id): per metric of ``metrics`` that both hold, the comparison dict (ratio
    k/b, interval, verdict), and the attribution of the wall-time difference (host, device, mixed)
    with its reason. The one per-case loop of :func:`comparisons` (envs of a run) and
    report.compare_runs (the same env in two runs).

    ``paired`` and results/2 data (``by_set``): :func:`stats.set_compare` -- process sets paired by
    set id, an anytime-valid interval at level ``alpha`` over ``family[metric]`` comparisons,
    tuned for ``n_target`` sets (a pass clock for ``pass_target``; ``selective``: for e-BY,
    stats.set_compare; ``glitch_guard``: stats.GLITCH_LOG, not in ``unguarded_sets``; ``cpu_state``
    "usual": only the cycles at the comparison's usual CPU speed, stats.set_compare ``probes``), provisional when
    ``quick``; this is each comparison alone (Bonferroni): :func:`comparisons` narrows the decided
    ones of a run together (stats.select_family). Else :func:`stats.compare` on the
    per-set (per-round) values as independent groups (``paired=False``: separate runs), or paired by
    round for results/1 data (``paired=True``), bootstrap seeded by ``seed_key`` and the metric."""
    per: dict = {}
    for m in metrics:
        mb, mk_ = b["metrics"].get(m), k["metrics"].get(m)
        if not mb or not mk_:  # not timed in one of them (or a null entry: compare read those as missing)
            continue
        bs, ks = _by_set(mb), _by_set(mk_)
        if paired and bs is not None and ks is not None:
            rb, rk = (_by_set({"by_set": mk.get("raw_by_set")}) if mk.get("raw_by_set") else None
                      for mk in (mb, mk_))
            per[m] = stats.set_compare(bs, ks, min_effect=min_effect, family_size=(family or {}).get(m, 1),
                                       family_alpha=alpha, n_target=n_target, cycles=m in CYCLED,
                                       provisional=quick, plain=(rb, rk) if rb and rk else None,
                                       selective=selective, pass_target=pass_target, glitch_guard=glitch_guard,
                                       unguarded_sets=unguarded_sets, probes=_probes(mb, mk_) if cpu_state == "usual" else None)
        else:
            sb, sk = mb.get("samples"), mk_.get("samples")
            if not (sb and sk):
                continue
            per[m] = stats.compare(sb, sk, min_effect, seed=zlib.crc32(f"{seed_key}/{m}".encode()),
                                   paired=None if paired else False)
            c = per[m]
            if not paired:  # between runs (every clock says so: second new-user trial)
                c["between_runs"] = True
                if m in CYCLED and c["verdict"] != "provisional":
                    # no interval either (new-user trial: the file kept one the report said it had not); the
                    # fixed-n one (its ci_method's) is kept apart, named for what it leaves out
                    # (benchmarks/between_runs.py reads it)
                    c["fixed_n_ci_without_run_spread"] = [c["ci_low"], c["ci_high"]]
                    c.update(verdict="provisional", provisional=True, provisional_why=BETWEEN_RUNS_WHY,
                             ci_low=None, ci_high=None, delta_ci_low=None, delta_ci_high=None, p_value=None)
    attr, why = stats.attribute(per.get("wall_us"), per.get("host_us"), per.get("device_us"))
    return per, attr, why


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (:func:`write_atomic`), as compact JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # compact: a run's per-cycle data made indented files ~45 % larger (0.52 vs 0.36 MB for a 60 s seed
    # run), and committed reports travel to the GPU machine with the tree (`python -m json.tool
    # results.json` shows one indented)
    write_atomic(path, lambda f: json.dump(_finite(data), f, separators=(",", ":"), default=_default,
                                           allow_nan=False))


def write_atomic(path: Path, write: Callable) -> None:
    """Write a text file by ``write(f)`` into a temp file in ``path``'s directory, fsync it and rename
    it over ``path`` (mode 0644, readable like a report): a reader never sees a half-written file,
    and a hard link's other names keep their old content."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name, suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
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


class ResultsError(UsageError):
    """A results file is missing, not JSON, or of another schema."""


#: The names a run's record has in its directory: ``results.json`` as a run writes it, or
#: ``results.json.gz`` (gzip of the same bytes) for archived runs (reports/README.md: superseded
#: committed runs are kept compressed, ~6x smaller). Every reader takes either.
NAMES = ("results.json", "results.json.gz")


def find(path: str | Path) -> Path:
    """The results file of ``path``: a run directory (its results.json, else results.json.gz) or a
    file given as is; a ``.../results.json`` that is not there but archived beside it (``.gz``) gives
    the archive (a command line written before the run was archived still reads it). A directory
    holding neither gives its results.json path (load then names it)."""
    p = Path(path)
    if p.is_dir():
        for name in NAMES:
            if (p / name).is_file():
                return p / name
        return p / NAMES[0]
    if p.name == NAMES[0] and not p.exists() and (p.parent / NAMES[1]).is_file():
        return p.parent / NAMES[1]
    return p


def read_text(path: str | Path) -> str:
    """The JSON text of a results file (:func:`find`), gunzipped when its name ends in ``.gz``."""
    p = find(path)
    if p.suffix == ".gz":
        with gzip.open(p, "rt", encoding="utf-8") as f:
            return f.read()
    return p.read_text(encoding="utf-8")


def load(path: str | Path) -> dict:
    """Load and check a results file (results.json or results.json.gz, or a run directory holding
    one: :func:`find`); raises ResultsError with the file name and the problem."""
    p = find(path)
    try:
        text = read_text(p)
    except OSError as e:
        raise ResultsError(f"{p}: cannot read ({e.strerror or e})") from None
    except EOFError:
        raise ResultsError(f"{p}: the compressed file is cut short (damaged): run that run again, or restore "
                           "the file from a copy (from git if it is a committed run)") from None
    except zlib.error as e:  # damaged inside (an internal error before)
        raise ResultsError(f"{p}: the compressed file is damaged ({e}): run that run again, or restore the file "
                           "from a copy (from git if it is a committed run)") from None
    except UnicodeDecodeError as e:
        raise ResultsError(_not_text(p, e)) from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ResultsError(_not_json(p, text, e)) from None
    if not isinstance(data, dict):
        raise ResultsError(f"{p}: holds a JSON {type(data).__name__}, not a run's results (an object with "
                           f"\"schema\": \"{SCHEMA}\"): give the run's results.json or its directory")
    if data.get("schema") not in READABLE:
        raise ResultsError(f"{p}: schema {data.get('schema')!r} is not one of {', '.join(READABLE)}")
    _check_structure(p, data)
    for note in _check_metrics(p, data):
        print(f"note: {note}", file=sys.stderr)
    return data


def _not_json(p: Path, text: str, e: ValueError) -> str:
    """What a results file that is not JSON is, said so (the bare decoder message, "Expecting value: line
    1 column 1 (char 0)", was all an empty file or an index.html given by mistake got: new-user trial):
    empty, HTML, cut short (the text ends inside the JSON), or broken at a line (a hand edit)."""
    body = text.lstrip("\ufeff \t\r\n")
    if not body:
        return (f"{p}: is empty: the run was interrupted before it wrote results, or give the run's "
                "results.json")
    if body.startswith("<"):
        return (f"{p}: is HTML, not results.json (a run's index.html is its report, rendered from its "
                "results.json): give the run's results.json or its directory")
    if not isinstance(e, json.JSONDecodeError):
        return f"{p}: not valid JSON ({e}): restore it from its run"
    if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
        return (f"{p}: is truncated: its JSON stops at line {e.lineno} column {e.colno} before the record is "
                "complete (a partial copy?): restore it from its run, or run that run again")
    return (f"{p}: is not valid JSON at line {e.lineno} column {e.colno} ({e.msg}; a hand edit?): restore it "
            "from its run")


def _not_text(p: Path, e: UnicodeDecodeError) -> str:
    """What a results file that is not UTF-8 text is: a gzip file not named ``.gz``, or another binary."""
    if isinstance(e.object, bytes) and e.object[:2] == b"\x1f\x8b":
        return (f"{p}: is gzip-compressed, but its name does not end in .gz: name it {NAMES[1]} (every reader "
                "takes that), or give the run's directory")
    return (f"{p}: is not a text file (not UTF-8), so not a run's results.json: give the run's results.json "
            "or its directory")


#: Comparison fields every reader takes as numbers (or null: not measured, no interval yet).
_COMPARISON_NUMBERS = ("ratio", "ci_low", "ci_high", "base_median", "cand_median", "delta_us", "delta_ci_low",
                       "delta_ci_high", "alpha", "p_value")


def _check_structure(p: Path, data: dict) -> None:
    """The top-level records the readers rely on: ``envs`` a list of objects with a string ``label``
    and ``status``; ``cases`` a list of objects with a string ``id``, ``env`` (the label of one of
    ``envs``: none without envs) and ``status``; ``comparisons`` (where present) a list of objects with
    a string ``candidate``, ``case`` and ``metric`` whose :data:`_COMPARISON_NUMBERS` are numbers or null
    (ratios and intervals in range: :func:`_check_comparison`); ``sets`` (where present) a list;
    ``settings``, ``machine`` and ``config`` (where present) objects, the settings the readers take as
    numbers in range (:data:`_SETTING_NUMBERS`). Raises ResultsError naming the file and the field (a
    hand-edited file gave an internal error: StopIteration without envs, TypeError for a ratio "x" or a
    min_effect "5%"; a ratio -1.0 went into the report; new-user trials 2026-12-04 and -05)."""
    def kind(v, what: str) -> str:
        return "missing" if v is None else f"{type(v).__name__}, not {what}"

    for key, fields in (("envs", ("label", "status")), ("cases", ("id", "env", "status"))):
        v = data.get(key)
        if not isinstance(v, list):
            raise ResultsError(f"{p}: {key} is {kind(v, 'a list')}: every run records its {key}; restore the "
                               "file from its run")
        for i, r in enumerate(v):
            if not isinstance(r, dict):
                raise ResultsError(f"{p}: {key}[{i}] is {kind(r, 'an object')}: restore the file from its run")
            for f in fields:
                if not isinstance(r.get(f), str):
                    raise ResultsError(f"{p}: {key}[{i}].{f} is {kind(r.get(f), 'a string')}: restore the file "
                                       "from its run")
    labels = [e["label"] for e in data["envs"]]
    for i, c in enumerate(data["cases"]):
        if c["env"] not in labels:
            if not labels:  # a case of no env: the report found no env to show it under (StopIteration)
                raise ResultsError(f"{p}: envs is empty, but cases holds {len(data['cases'])} case record(s) "
                                   f"(cases[{i}].env is {c['env']!r}): every run records the envs its cases ran "
                                   "in; restore the file from its run")
            raise ResultsError(f"{p}: cases[{i}].env is {c['env']!r}, not the label of any of envs "
                               f"({', '.join(map(repr, labels))}): restore the file from its run")
    for key, typ, what in (("comparisons", list, "a list"), ("sets", list, "a list"), ("settings", dict, "an object"),
                           ("machine", dict, "an object")):
        v = data.get(key)
        if v is not None and not isinstance(v, typ):
            raise ResultsError(f"{p}: {key} is {kind(v, what)}: restore the file from its run")
    conf = data.get("config")
    if conf is not None and not isinstance(conf, dict):  # --resume had blamed the YAML file it came from
        shown = f" ({conf!r})" if isinstance(conf, str) and len(conf) <= 40 else ""
        raise ResultsError(f"{p}: config is {type(conf).__name__}{shown}, not an object: it holds the run's "
                           "config as read from its YAML file (a --resume takes the cases and sampling rules from it); "
                           "restore the file from its run")
    _check_settings(p, data.get("settings") or {})
    for i, c in enumerate(data.get("comparisons") or []):
        if not isinstance(c, dict):
            raise ResultsError(f"{p}: comparisons[{i}] is {kind(c, 'an object')}: restore the file from its run")
        for f in ("candidate", "case", "metric"):
            if not isinstance(c.get(f), str):
                raise ResultsError(f"{p}: comparisons[{i}].{f} is {kind(c.get(f), 'a string')}: restore the "
                                   "file from its run")
        for f in _COMPARISON_NUMBERS:
            v = c.get(f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ResultsError(f"{p}: comparisons[{i}].{f} is {v!r}, not a number: restore the file from its run")
        me = (data.get("settings") or {}).get("min_effect")
        _check_comparison(p, f"comparisons[{i}]", c, me if isinstance(me, (int, float)) and 0 < me < 1 else 0.05)


#: ``settings`` the readers take as numbers (null or missing: the default): key -> (test, what it must
#: be). min_effect: the verdicts' threshold (report, compare: formatted as a percentage, 1 + it);
#: alpha and planned_sets: :func:`comparisons` (report of several runs, --min-effect) reads them with
#: float() and int(). The bounds are the readers' (a --resume checks min_effect's upper bound itself,
#: pipeline.resume_args, with the config's rules).
_SETTING_NUMBERS = {
    "min_effect": (lambda v: math.isfinite(v) and v > 0, "a positive number",
                   "the smallest change a verdict calls faster or slower, as a fraction: 0.05 = 5%"),
    "alpha": (lambda v: 0 < v < 1, "a number between 0 and 1", "the intervals' error rate: 0.05 = 95 % intervals"),
    "planned_sets": (lambda v: isinstance(v, int) and v >= 1, "a positive whole number",
                     "the process sets the run planned"),
}


def _check_settings(p: Path, st: dict) -> None:
    """The :data:`_SETTING_NUMBERS` of a run's ``settings`` (an object) are numbers in range or null."""
    for key, (ok, rule, means) in _SETTING_NUMBERS.items():
        v = st.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(v):
            shown = f"a {'list' if isinstance(v, list) else 'object'}" if isinstance(v, (dict, list)) else repr(v)
            raise ResultsError(f"{p}: settings.{key} is {shown}, not {rule} ({means}): fix that value in the file "
                               "or restore the file from its run")


#: The verdicts a comparison can carry (stats.verdict; "provisional": --quick or one set).
VERDICTS = ("faster", "slower", "same", "ambiguous", "provisional")


def _check_comparison(p: Path, at: str, c: dict, min_effect: float | None = None) -> None:
    """A comparison's numbers in range (their types checked): ``ratio`` (candidate/baseline time) a
    finite number above 0; ``ci_low`` 0 or more (0: unbounded below), ``ci_high`` above 0 (null or
    infinite: unbounded above), not below ``ci_low``; ``base_median`` and ``cand_median`` (µs) 0 or more."""
    def bad(f: str, rule: str) -> ResultsError:
        return ResultsError(f"{p}: {at}.{f} is {c[f]!r}: {rule}; restore the file from its run")

    r, lo, hi = c.get("ratio"), c.get("ci_low"), c.get("ci_high")
    if r is not None and not (math.isfinite(r) and r > 0):
        raise bad("ratio", "a ratio (candidate / baseline time) is a number above 0")
    if lo is not None and not (math.isfinite(lo) and lo >= 0):
        raise bad("ci_low", "an interval's low end is a ratio, 0 or more (0: unbounded below)")
    if hi is not None and not hi > 0:
        raise bad("ci_high", "an interval's high end is a ratio above 0 (null: unbounded above)")
    if lo is not None and hi is not None and lo > hi:
        raise ResultsError(f"{p}: {at}.ci_low {lo!r} is above its ci_high {hi!r}: restore the file from its run")
    for f in ("base_median", "cand_median"):
        v = c.get(f)
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise bad(f, "a median time (µs) is a number, 0 or more")
    # a decided verdict rests on its interval's end(s): slower on ci_low, faster on ci_high, same on both
    # (new-user trial: a ci_low set to null showed "slower 3.71x (unbounded: too few sets)")
    verdict = c.get("verdict")
    need = {"slower": ("ci_low",), "faster": ("ci_high",), "same": ("ci_low", "ci_high")}.get(verdict, ())
    for f in need:
        if c.get(f) is None:
            raise ResultsError(f"{p}: {at}.{f} is null, but its verdict {verdict!r} rests on it: restore the "
                               "file from its run")
    if verdict is not None and verdict not in VERDICTS:
        raise ResultsError(f"{p}: {at}.verdict is {verdict!r}: a verdict is one of {', '.join(VERDICTS)}; restore "
                           "the file from its run")
    # (a paired comparison's ratio is its interval's centre, stats.set_compare; an unpaired one between
    # merged runs is a ratio of medians with a bootstrap interval: not checked)
    if (c.get("paired") is not False and r is not None and lo is not None and hi is not None
            and not lo * (1 - 1e-6) <= r <= hi * (1 + 1e-6)):
        raise ResultsError(f"{p}: {at}.ratio {r!r} lies outside its own interval [{lo!r}, {hi!r}]: restore the "
                           "file from its run")
    if verdict == "same" and lo is not None and hi is not None and min_effect is not None:
        up = 1 + min_effect
        if lo < (1 / up) * (1 - 1e-6) or hi > up * (1 + 1e-6):  # stats.verdict: same = the interval inside
            raise ResultsError(f"{p}: {at} says 'same' with interval [{lo!r}, {hi!r}]: same means the whole "
                               f"interval within [{1 / up:.4g}, {up:.4g}] (min_effect {min_effect:g}); restore the "
                               "file from its run")
    # and says what they say (stats.verdict): slower means a ratio and an interval above 1, faster below
    # (new-user trial: hand edits rendered "faster 3.71x [3.67, 3.75]" and "slower 0.50x [3.67, 3.75]")
    side = {"slower": (1, "ci_low", "above"), "faster": (-1, "ci_high", "below")}.get(verdict)
    if side is not None and r is not None:
        sign, f, where = side
        end = c.get(f)
        if sign * (r - 1) <= 0 or (end is not None and sign * (end - 1) <= 0):
            raise ResultsError(f"{p}: {at} says {verdict!r} with ratio {r!r} and {f} {end!r}: {verdict} "
                               f"means a ratio and {f} {where} 1; restore the file from its run")


def _path(parts: list) -> str:
    """``["cases", 0, "metrics", "wall_us", "by_set", "0", "7"]`` -> ``cases[0].metrics.wall_us.by_set["0"]["7"]``."""
    out, keyed = "", False  # keys below by_set (and its siblings) are set and cycle ids: written as JSON keys
    for x in parts:
        out += f"[{x}]" if isinstance(x, int) else (f'["{x}"]' if keyed else f".{x}")
        keyed = keyed or x in ("by_set", "raw_by_set", "ref_by_set", "speed_by_set")
    return out.lstrip(".")


def _check_metrics(p: Path, data: dict) -> list[str]:
    """Check every measured value under ``cases[].metrics`` (summaries, ``samples``, ``by_set``) is a
    number or null, in place: NaN and infinities become null (a missing sample, what :func:`write_json`
    stores for them; returned as notes). Raises ResultsError naming the file and the field of anything
    else (a string, a list where a number belongs, a set or cycle id that is not an integer), and of a
    negative one: every value there is a time in µs or a count, never below 0, but for ``speed_by_set``
    (a slope and a centre: signed)."""
    notes: list[str] = []
    cases = data.get("cases")
    if cases is None:
        return notes
    if not isinstance(cases, list):
        raise ResultsError(f"{p}: cases is {type(cases).__name__}, not a list: restore the file from its run")

    def bad(parts: list, what: str) -> ResultsError:
        return ResultsError(f"{p}: {_path(parts)} is {what}, not a number: restore it or set it to null "
                            "(a missing sample)")

    def num(v, parts: list, signed: bool = False):
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad(parts, repr(v) if isinstance(v, str) and len(v) <= 40 else f"a {type(v).__name__}")
        if not math.isfinite(v):
            notes.append(f"{p}: {_path(parts)} is {v!r}: sample skipped (treated as missing)")
            return None
        if v < 0 and not signed:  # a median of -1 went into the report's charts (new-user trial)
            raise ResultsError(f"{p}: {_path(parts)} is {v!r}: a time (µs) or a count is never negative: "
                               "restore it or set it to null (a missing sample)")
        return v

    def nums(v, parts: list, depth: int):
        """A list (depth 1) or list of lists (depth 2) of numbers or null, checked in place."""
        if not isinstance(v, list):
            raise bad(parts, repr(v) if isinstance(v, str) and len(v) <= 40 else f"a {type(v).__name__}")
        for i, x in enumerate(v):
            if depth > 1:
                nums(x, [*parts, i], depth - 1)
            else:
                v[i] = num(x, [*parts, i])

    for ci, c in enumerate(cases):
        if not isinstance(c, dict):
            raise ResultsError(f"{p}: cases[{ci}] is {type(c).__name__}, not an object: restore the file from its run")
        metrics = c.get("metrics")
        if metrics is None:
            continue
        if not isinstance(metrics, dict):
            raise ResultsError(f"{p}: cases[{ci}].metrics is {type(metrics).__name__}, not an object: restore "
                               "the file from its run")
        for m, md in metrics.items():
            at = ["cases", ci, "metrics", m]
            if not isinstance(md, dict):
                raise ResultsError(f"{p}: {_path(at)} is {type(md).__name__}, not an object: restore the file "
                                   "from its run")
            for k, v in md.items():
                if k == "samples":
                    nums(v, [*at, k], 2)
                elif k == "round_medians":
                    nums(v, [*at, k], 1)
                elif k == "speed_by_set":  # set id -> {"beta", "center"[, "between", "held", SpeedSlope.state()]}
                    if not isinstance(v, dict):
                        raise bad([*at, k], f"a {type(v).__name__}")
                    for sid, sv in v.items():
                        if not isinstance(sv, dict):
                            raise bad([*at, k, sid], f"a {type(sv).__name__}")
                        for kk in list(sv):
                            sv[kk] = num(sv[kk], [*at, k, sid, kk], signed=True)
                elif k in ("by_set", "raw_by_set", "ref_by_set"):
                    if not isinstance(v, dict):
                        raise bad([*at, k], f"a {type(v).__name__}")
                    for sid, sv in v.items():
                        sp = [*at, k, sid]
                        if not str(sid).lstrip("-").isdigit():
                            raise ResultsError(f"{p}: {_path(sp)}: the set id {sid!r} is not an integer: restore "
                                               "the file from its run")
                        if isinstance(sv, dict):
                            for cyc in list(sv):
                                if not str(cyc).lstrip("-").isdigit():
                                    raise ResultsError(f"{p}: {_path([*sp, cyc])}: the cycle id {cyc!r} is not an "
                                                       "integer: restore the file from its run")
                                sv[cyc] = num(sv[cyc], [*sp, cyc])
                        else:
                            nums(sv, sp, 1)
                else:
                    md[k] = num(v, [*at, k])
    return notes


def is_merge(doc: dict) -> bool:
    """Whether results ``doc`` is a merge of several runs (:func:`merge`: ``merged_from``), not a run."""
    runs = doc.get("merged_from")
    return isinstance(runs, list) and len(runs) > 1


def merge(runs: list[dict], min_effect: float | None = None) -> dict:
    """Merge several results (e.g. one per tox env) into one: envs and cases concatenated (labels
    made unique), comparisons recomputed: each run's own envs as that run compared them (paired by
    process set, or by round for results/1; its pairs, one e-BY family per clock, its settings), and
    every env of a later run against the first env, unpaired (independent groups; wall and host
    provisional: BETWEEN_RUNS_WHY)."""
    if len(runs) == 1 and min_effect is None:
        return runs[0]
    out = json.loads(json.dumps(runs[0], default=_default))
    out.pop("merge_warnings", None)  # a merged report's own (commands.cmd_report): said again of this merge
    out.pop("gate", None)  # the run's --fail-on-regression outcome: not that of these recomputed verdicts

    def origin(e: dict, r: dict, i: int) -> str:
        # the run an env or a process set was timed in: a merged record's keep theirs (``run_id`` on
        # each), so a re-render (--min-effect) or a further merge does not pair runs that never took
        # turns (new-user trial: set i of one run was paired with set i of the other)
        return str(e.get("run_id") or r.get("run_id") or f"#{i}")

    seen = {e["label"] for e in out["envs"]}
    run_of = {e["label"]: origin(e, runs[0], 0) for e in out["envs"]}  # env label -> its run: only one run's sets pair
    for e in out["envs"]:
        e["run_id"] = run_of[e["label"]]
    # each process set keeps the run it belongs to: set ids restart in every run (the report shows RUN:set)
    for key in ("sets", "rounds"):
        for rec in out.get(key) or []:
            if isinstance(rec, dict):
                rec["run_id"] = origin(rec, runs[0], 0)
    for i, r in enumerate(runs[1:], 1):
        rename = {}
        for e in r["envs"]:
            lab = e["label"]
            while lab in seen:
                lab += "'"
            rename[e["label"]] = lab
            seen.add(lab)
            run_of[lab] = origin(e, r, i)
            out["envs"].append({**e, "label": lab, "run_id": run_of[lab]})
        for c in r["cases"]:
            out["cases"].append({**c, "env": rename.get(c["env"], c["env"])})
        for key in ("sets", "rounds"):  # results/2 process sets, results/1 rounds
            if r.get(key):
                out.setdefault(key, []).extend({**rec, "run_id": origin(rec, r, i)} if isinstance(rec, dict) else rec
                                               for rec in r[key])
    own = (out.get("settings") or {}).get("min_effect", 0.05)
    eff = min_effect if min_effect is not None else own
    out.setdefault("settings", {})["min_effect"] = eff  # the report's text follows the verdicts
    if min_effect is not None:  # said by the report (report.rejudged_note; second new-user trial: it said nothing)
        out["rejudged"] = {"min_effect": eff, "run_min_effect": own}
    labels = [e["label"] for e in out["envs"] if e["status"] == "ok"]
    # each run's settings (its alpha, method, planned sets), at the report's min_effect; a merged
    # document given first keeps its one settings record for every run it holds
    settings_of = {run_of[e["label"]]: out["settings"] for e in out["envs"][:len(runs[0]["envs"])]}
    for i, r in enumerate(runs[1:], 1):
        for e in r["envs"]:
            settings_of.setdefault(origin(e, r, i), {**(r.get("settings") or {}), "min_effect": eff})

    def own_run(rid: str) -> list[dict]:
        """Run ``rid``'s own comparisons, as that run compared them: its envs in its pairs (a torch
        axis: within each torch and each version), all of a clock one e-BY family, its own sets and
        settings. A run of 3 versions re-rendered (--min-effect) or merged had been judged one
        candidate at a time, a family of 12 instead of 24, and called verdicts the run had not (four
        versions: 28 slower instead of 26); a later run's own pairs had been left out of a merge."""
        own = [lab for lab in labels if run_of[lab] == rid]
        return [dict(c, run_id=rid) for c in comparisons(
            out["cases"], own, eff, settings=settings_of[rid], pairs=env_pairs([e for e in out["envs"] if e["label"] in own]),
            sets=[x for x in out.get("sets") or [] if isinstance(x, dict) and x.get("run_id") == rid])]

    first = run_of[labels[0]] if labels else None
    out["comparisons"] = own_run(first) if labels else []
    for rid in dict.fromkeys(run_of[lab] for lab in labels[1:]):
        if rid == first:
            continue
        # each env of a later run against the baseline (unpaired: wall and host provisional), then
        # that run's own comparisons
        cands = [cand for cand in labels[1:] if run_of[cand] == rid]
        out["comparisons"] += comparisons(out["cases"], [labels[0], *cands], eff, settings=out["settings"],
                                          paired=False, pairs=[(labels[0], cand) for cand in cands],
                                          sets=out.get("sets"))
        out["comparisons"] += own_run(rid)
    out["merged_from"] = list(dict.fromkeys(run_of.values()))
    if len(out["merged_from"]) > 1:  # not the first run's own id: compare and publish took it for that run
        out["run_id"] = "merge of " + ", ".join(out["merged_from"])
    return out


def merge_shards(docs: list[dict], extra_cases: list[dict] | None = None,
                 case_order: list[str] | None = None) -> dict:
    """One run from the results of its shards (shard module: each shard timed its own share of the
    cases, every version of a case on one GPU, with the same envs and settings).

    Shards are separate units of the statistics: a case's process sets all come from its one shard
    (``by_set`` ids are per shard and only ever paired within a case), so the comparisons are exactly
    :func:`comparisons` over the union of the cases -- what an unsharded run with the same data
    gives, Bonferroni over the whole run's comparisons. ``extra_cases``: records of cases no shard
    measured (a lost job: status error). An env is ok if it is ok in some shard. Set records get
    their shard's index (``shard``); ``shards`` lists each shard's run id, GPU and stop reason.
    ``case_order``: case ids in config order (the merged cases follow it, then env order)."""
    if not docs:
        raise ResultsError("no shard results to merge")
    out = json.loads(json.dumps(docs[0], default=_default))
    envs = {e["label"]: e for e in out["envs"]}
    out["cases"], out["sets"], out["shards"] = [], [], []
    for i, d in enumerate(docs):
        sh = d.get("shard") or {"index": i, "count": len(docs)}
        for e in d.get("envs") or []:
            if e["label"] not in envs:
                envs[e["label"]] = e
                out["envs"].append(e)
            elif e.get("status") == "ok" and envs[e["label"]].get("status") != "ok":
                envs[e["label"]].update(e)
        seen = {(c["env"], c["id"]) for c in out["cases"]}
        dup = [c["id"] for c in d.get("cases") or [] if (c["env"], c["id"]) in seen]
        if dup:
            raise ResultsError(f"shard {sh.get('index')}: case(s) {sorted(set(dup))} are in another shard too: "
                               "the shards of one run time disjoint shares of the cases")
        out["cases"].extend(d.get("cases") or [])
        out["sets"].extend({**s, "shard": sh.get("index", i)} for s in d.get("sets") or [])
        out["shards"].append({"cpus": (d.get("settings") or {}).get("cpus"), **sh, "run_id": d.get("run_id"), "gpu": sh.get("gpu"),
                              "stop_reason": (d.get("timing") or {}).get("stop_reason"),
                              "timing_phase_s": (d.get("timing") or {}).get("timing_phase_s")})
    out["cases"].extend(extra_cases or [])
    out.pop("shard", None)
    labels = [e["label"] for e in out["envs"] if e.get("status") == "ok"]
    if case_order:
        pos, lpos = {cid: i for i, cid in enumerate(case_order)}, {e["label"]: i for i, e in enumerate(out["envs"])}
        out["cases"].sort(key=lambda c: (pos.get(c["id"], len(pos)), lpos.get(c["env"], 0)))
    out["comparisons"] = comparisons(out["cases"], labels, (out.get("settings") or {}).get("min_effect", 0.05),
                                     settings=out.get("settings"), pairs=env_pairs(out["envs"]), sets=out["sets"])
    return out
