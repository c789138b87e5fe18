"""Stage 3b/4b — the explain pass (``--explain``): which layers and Python frames make one version's
call cost more (issue #12). Off by default; it runs after the timing phase, in its own worker
processes, so nothing it measures or samples enters a verdict.

What it measures, per env (one fresh worker per env, all pinned to one set core where pinning works):

1. **First-call cost** (ms): the first synchronized call of each case in that fresh process (the
   ``setup`` reply's ``first_call_ms``). The first case set up also pays the process's one-off costs
   (lazy imports: flash-attn 2.7+ imports ``torch._dynamo`` on its custom op's first dispatch); the
   report marks it.
2. **Layer peeling** (forward flash_attn cases): :func:`worker.discover_layers` finds the layers
   the installed version has — ``public`` flash_attn_func, ``autograd`` FlashAttnFunc.apply,
   ``custom_op`` torch.ops.flash_attn._flash_attn_forward (2.7+ with torch >= 2.4), ``python`` the
   Python body of _flash_attn_forward, ``extension`` flash_attn_2_cuda.fwd — and says why a layer
   does not exist. Each layer is called with the arguments its version passed it, so a layer's time
   minus the next inner layer's is the cost of that *segment* (the wrapper code between them). Host
   clock (device synchronized before each call, outside the timing), µs per call. ``rounds`` rounds;
   in each, every env's worker times one ~``burst_ms`` host burst per layer (order of envs random,
   order of layers reversed every other round), so the envs' bursts of a round were taken ms apart
   on the same core: rounds are paired like lockstep cycles.
   **Interval** (a documented simpler interval than the main comparison's): per segment, the
   paired per-round differences candidate - baseline, their 20 % trimmed mean and its
   Tukey-McLaughlin 95 % t interval (``stats._trimmed_ci``, as results/1 used per round). It holds
   for these two worker processes only (one process per env: the process-to-process spread that the
   main comparison's sets capture is not in it) and is fixed-n, one comparison at a time.
3. **Differential frame profile**: the case with the smallest baseline per-call time (the most
   host-bound forward) runs a steady loop of synchronized calls (:func:`worker._explain_loop`) while
   py-spy (an out-of-process sampler; ``py-spy record --format raw --function --nonblocking``, needs
   ptrace) samples it from the driver; the same loop without the sampler gives the wall time side by
   side (the sampler's effect). Folded stacks are kept per env. A frame's µs per call = its share of
   the samples under ``_explain_loop`` x the sampled loop's µs per call (the median of its ~1 ms
   samples: a preemption lands in whatever frame runs, so it leaves the shares alone but inflates a
   mean); *self* counts samples where
   it is the innermost Python frame, *total* where it is anywhere on the stack. The differential view
   lists frames that appear, vanish, grow or shrink (self µs per call, candidate - baseline), with a
   binomial sampling error.
4. **Call counts**: cProfile over ``count_calls`` calls of the same case (deterministic counts per
   function and call; cProfile's time inflation is irrelevant to counts), diffed between versions.

py-spy missing or refused (no ptrace): the profile is skipped with the reason in the report and on
the terminal; the rest goes on. Raw data lives in results.json under ``explain`` (schema
:data:`SCHEMA`); :func:`analyze` derives everything shown from it, so ``matrix-run explain RUN_DIR``
re-renders without measuring.
"""
from __future__ import annotations

import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

from . import lockstep, proc, stats

SCHEMA = "matrix-runner/explain/1"
#: Defaults: layer rounds, ms per layer burst, seconds sampled per env, py-spy samples per second,
#: cProfile'd calls per env, set-up warm-up seconds per case.
DEFAULTS = {"rounds": 20, "burst_ms": 5.0, "profile_s": 3, "rate": 1000, "count_calls": 200, "warmup_s": 0.05}
#: Segment names: the cost between a layer and the next inner layer that exists.
SEGMENTS = {"public": "Python wrapper (flash_attn_func)",
            "autograd": "autograd Function (FlashAttnFunc.apply + forward)",
            "custom_op": "custom-op dispatch (torch.library.custom_op)",
            "python": "Python _flash_attn_forward body",
            "extension": "extension call (fwd)"}
KINDS = tuple(SEGMENTS)
LOOP_FRAME = "_explain_loop"


def find_pyspy() -> str | None:
    """The py-spy executable: ``$MATRIX_RUN_PYSPY`` where set (a path; one that does not exist counts
    as missing), else on PATH, else next to this interpreter (a venv's bin/ that is not on PATH)."""
    env = os.environ.get("MATRIX_RUN_PYSPY")
    if env is not None:
        return env if env and Path(env).exists() else None
    p = shutil.which("py-spy")
    if p:
        return p
    cand = Path(sys.executable).parent / "py-spy"
    return str(cand) if cand.exists() else None


def _flash_cases(cases):
    return [c for c in cases if getattr(c, "impl", "flash_attn") == "flash_attn"]


def run(envs, cases, *, device: str, work: Path, case_timeout: float = 300.0, cpus: dict | None = None,
        settings: dict | None = None, on_progress=None) -> dict:
    """Measure the explain data (module doc) for ``envs`` (objects with ``label`` and ``python``; the
    first is the baseline) and ``cases`` (config.Case); worker logs in ``work``. Returns the raw
    record stored as results.json's ``explain`` (schema :data:`SCHEMA`). Never raises for a worker
    fault or a missing sampler: they become ``notes`` / ``profile.error``."""
    st = {**DEFAULTS, **(settings or {})}
    say = on_progress or (lambda m: None)
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    raw: dict = {"schema": SCHEMA, "settings": st, "device": device, "envs": [e.label for e in envs],
                 "first_call": {}, "setup_order": [], "per_call_us": {}, "layers": {}, "profile": None,
                 "counts": {}, "notes": []}
    fcases = _flash_cases(cases)
    raw["setup_order"] = [c.id for c in fcases]
    workers: dict = {}
    try:
        for e in envs:
            say(f"explain: starting {e.label}")
            try:
                w = lockstep.Worker(e.label, e.python, work / f"explain-{e.label}.log")
                hello = w.wait_hello(case_timeout)
                if hello.get("type") != "hello":
                    raise lockstep.WorkerDied(str(hello.get("error")))
                rep = w.request({"cmd": "config", "device": device, "seed": 0}, case_timeout)
                if rep.get("type") == "fatal":
                    raise lockstep.WorkerDied(str(rep.get("error")))
                workers[e.label] = w
            except (lockstep.WorkerFault, proc.Stopped) as ex:
                raw["notes"].append(f"{e.label}: explain worker failed to start: {ex}")
        if cpus and cpus.get("pinned") and cpus.get("set_cpus"):
            for lab, w in workers.items():
                try:
                    w.request({"cmd": "pin", "cpu": cpus["set_cpus"][0]}, case_timeout)
                except lockstep.WorkerFault as ex:
                    raw["notes"].append(f"{lab}: pin failed: {ex}")
        ok: dict = {lab: set() for lab in workers}
        for c in fcases:  # first calls: the set-ups, in config order
            for lab, w in list(workers.items()):
                say(f"explain: set-up {c.label} {c.op} in {lab}")
                try:
                    rep = w.request({"cmd": "setup", "case": c.id, "spec": c.to_dict(), "warmup_s": st["warmup_s"]},
                                    case_timeout)
                except lockstep.WorkerFault as ex:
                    raw["notes"].append(f"{lab}: worker lost at set-up of {c.id}: {ex}")
                    workers.pop(lab)
                    continue
                if rep.get("status") == "ok":
                    ok[lab].add(c.id)
                    raw["first_call"].setdefault(c.id, {})[lab] = rep.get("first_call_ms")
                    raw["per_call_us"].setdefault(c.id, {})[lab] = rep.get("per_call_us")
                else:
                    raw["notes"].append(f"{lab}: {c.id} failed at set-up: {rep.get('error')}")
        rng = random.Random(0)
        for c in (c for c in fcases if c.op == "fwd"):  # layer peeling
            labs = [lab for lab in workers if c.id in ok[lab]]
            if not labs:
                continue
            rec = {lab: {"layers": None, "rounds": []} for lab in labs}
            for r in range(int(st["rounds"])):
                say(f"explain: layers of {c.label} fwd, round {r + 1}/{st['rounds']}")
                order = list(labs)
                rng.shuffle(order)
                for lab in order:
                    w = workers.get(lab)
                    if w is None:
                        continue
                    try:
                        rep = w.request({"cmd": "layers", "case": c.id, "ms": st["burst_ms"], "reverse": r % 2 == 1},
                                        case_timeout)
                    except lockstep.WorkerFault as ex:
                        raw["notes"].append(f"{lab}: worker lost timing the layers of {c.id}: {ex}")
                        workers.pop(lab)
                        continue
                    if rep.get("status") != "ok":
                        raw["notes"].append(f"{lab}: layers of {c.id}: {rep.get('error')}")
                        continue
                    rec[lab]["layers"] = rep["layers"]
                    rec[lab]["rounds"].append({"round": r, **rep["us"]})
            raw["layers"][c.id] = rec
        raw["profile"] = _profile(workers, ok, fcases, raw, st, work, case_timeout, say)
    finally:
        for w in workers.values():
            w.close()
    raw["seconds"] = round(time.monotonic() - t0, 2)
    return raw


def _profile(workers, ok, fcases, raw, st, work, case_timeout, say) -> dict | None:
    """The sampled steady loop and the call counts of one case (module doc, 3 and 4)."""
    base = raw["envs"][0]
    per = raw["per_call_us"]
    cands = [c for c in fcases if c.op == "fwd" and all(c.id in ok.get(lab, ()) for lab in workers)]
    if not cands or not workers:
        return None
    case = min(cands, key=lambda c: (per.get(c.id) or {}).get(base) or math.inf)
    out: dict = {"case": case.id, "case_label": f"{case.label} fwd", "error": None, "sampler": None, "envs": {}}
    pyspy = find_pyspy()
    if pyspy is None:
        out["error"] = ("py-spy not found (pip install 'matrix-run[explain]' or py-spy): the frame profile was "
                        "skipped")
    else:
        out["sampler"] = {"tool": "py-spy", "path": pyspy, "rate_hz": st["rate"], "seconds": st["profile_s"],
                          "args": "record --format raw --function --nonblocking"}
    secs = float(st["profile_s"])
    for lab, w in list(workers.items()):
        e: dict = {}
        out["envs"][lab] = e
        try:
            say(f"explain: steady loop of {case.label} fwd in {lab} (no sampler)")
            rep = w.request({"cmd": "loop", "case": case.id, "seconds": secs}, case_timeout + secs)
            e["loop_off"] = {k: rep.get(k) for k in ("us_per_call", "mean_us_per_call", "calls")}
            if pyspy is not None:
                say(f"explain: py-spy on {lab} ({secs:g} s at {st['rate']} Hz)")
                folded = work / f"explain-{lab}.folded"
                folded.unlink(missing_ok=True)
                w.send({"cmd": "loop", "case": case.id, "seconds": secs + 1.5})
                time.sleep(0.2)  # the loop is running
                res = proc.run_logged([pyspy, "record", "--pid", str(w.pid), "--rate", str(int(st["rate"])),
                                       "--duration", str(int(math.ceil(secs))), "--format", "raw", "--function",
                                       "--nonblocking", "-o", str(folded)],
                                      log=work / f"explain-{lab}.py-spy.log", timeout=secs + 60)
                rep = w.reply(case_timeout + secs)
                e["loop_on"] = {k: rep.get(k) for k in ("us_per_call", "mean_us_per_call", "calls")}
                # the loop without the sampler again: the CPU's speed drifts over seconds (H200: one
                # loop before and one with the sampler read -48 % and +17 %); the two loops without it
                # bracket the sampled one, and their drift says whether the effect is measurable
                say(f"explain: steady loop of {case.label} fwd in {lab} (no sampler, after)")
                rep = w.request({"cmd": "loop", "case": case.id, "seconds": secs}, case_timeout + secs)
                e["loop_off2"] = {k: rep.get(k) for k in ("us_per_call", "mean_us_per_call", "calls")}
                if res.returncode != 0 or not folded.exists():
                    tail = " ".join(res.tail.split())[-400:]
                    out["error"] = (f"py-spy failed on {lab} (exit {res.returncode}; ptrace refused? as non-root "
                                    f"see /proc/sys/kernel/yama/ptrace_scope): {tail}")
                else:
                    e["folded"] = folded.read_text()
                    e["pyspy_summary"] = " ".join(res.tail.split())[-300:]
            say(f"explain: call counts of {case.label} fwd in {lab}")
            rep = w.request({"cmd": "counts", "case": case.id, "calls": int(st["count_calls"])}, case_timeout)
            if rep.get("status") == "ok":
                e["counts"] = rep["counts"]
            else:
                raw["notes"].append(f"{lab}: call counts failed: {rep.get('error')}")
        except lockstep.WorkerFault as ex:
            raw["notes"].append(f"{lab}: worker lost in the profile pass: {ex}")
            workers.pop(lab, None)
    return out


# -- analysis (pure: raw record -> what the report shows) -----------------------------------------
def _median(x):
    x = sorted(v for v in x if v is not None and math.isfinite(v))
    if not x:
        return None
    n = len(x)
    return x[n // 2] if n % 2 else (x[n // 2 - 1] + x[n // 2]) / 2


def segments(round_us: dict) -> dict:
    """One round's layer times ``{kind: µs}`` -> segment costs ``{kind: µs}``: a layer's time minus the
    next inner layer's that was timed (the extension: its own time). They sum to the public layer's
    time. A kind missing from ``round_us`` has no segment (its cost is in the next outer segment)."""
    present = [k for k in KINDS if round_us.get(k) is not None]
    out = {}
    for i, k in enumerate(present):
        nxt = present[i + 1] if i + 1 < len(present) else None
        out[k] = round_us[k] - (round_us[nxt] if nxt else 0.0)
    return out


def _ci(d: list) -> dict | None:
    d = [x for x in d if x is not None and math.isfinite(x)]
    if len(d) < 2:
        return {"delta_us": d[0], "lo": None, "hi": None, "n": len(d)} if d else None
    est, lo, hi, _ = stats._trimmed_ci(d, exp=False)
    return {"delta_us": est, "lo": lo, "hi": hi, "n": len(d)}


def layer_view(rec: dict, base: str, labels: list) -> dict:
    """Per env: each layer's median host µs per call and its segment's; per candidate: each segment's
    paired delta (µs per call) with its interval (module doc, 2) and the total (public layer)."""
    envs = {}
    for lab in labels:
        r = rec.get(lab)
        if not r or not r.get("rounds"):
            continue
        desc = r.get("layers") or []
        rows = []
        for d in desc:
            k = d["kind"]
            us = _median([x.get(k) for x in r["rounds"]]) if d["exists"] else None
            seg = _median([segments(x).get(k) for x in r["rounds"]]) if d["exists"] else None
            rows.append({**d, "us": us, "segment_us": seg, "segment": SEGMENTS.get(k, k)})
        envs[lab] = {"layers": rows, "rounds": len(r["rounds"])}
    comps = []
    b = rec.get(base) or {}
    bro = {x["round"]: x for x in b.get("rounds") or []}
    for lab in labels:
        if lab == base or lab not in envs or base not in envs:
            continue
        cro = {x["round"]: x for x in rec[lab]["rounds"]}
        common = sorted(set(bro) & set(cro))
        total = _ci([cro[i]["public"] - bro[i]["public"] for i in common
                     if cro[i].get("public") is not None and bro[i].get("public") is not None])
        segs = []
        for k in KINDS:
            d = [segments(cro[i]).get(k, 0.0) - segments(bro[i]).get(k, 0.0) for i in common]
            in_b = any(x["kind"] == k and x["exists"] for x in envs[base]["layers"])
            in_c = any(x["kind"] == k and x["exists"] for x in envs[lab]["layers"])
            if not (in_b or in_c):
                continue
            segs.append({"kind": k, "segment": SEGMENTS[k], "in_base": in_b, "in_cand": in_c, **(_ci(d) or {})})
        comps.append({"candidate": lab, "total": total, "segments": segs, "sentence": _sentence(total, segs)})
    names: dict = {}
    for e in envs.values():
        for x in e["layers"]:
            if x["exists"] and x["name"] not in names.setdefault(x["kind"], []):
                names[x["kind"]].append(x["name"])
    return {"envs": envs, "comparisons": comps, "names": names}


def _fmt_ci(x: dict | None) -> str:
    if not x or x.get("delta_us") is None:
        return "–"
    s = f"{x['delta_us']:+.1f} µs"
    if x.get("lo") is not None:
        s += f" [{x['lo']:+.1f}, {x['hi']:+.1f}]"
    return s


def _sentence(total, segs) -> str:
    if not total:
        return ""
    parts = sorted(segs, key=lambda s: -abs(s.get("delta_us") or 0.0))
    body = ", ".join(f"{_fmt_ci(s)} {s['segment']}" + ("" if s["in_base"] and s["in_cand"] else
                                                       " (new layer)" if s["in_cand"] else " (layer gone)")
                     for s in parts)
    return f"of the {_fmt_ci(total)} per call (host, flash_attn_func): {body}"


def _frame_key(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (pkg/file.py)``: the line dropped and the path cut
    after site-packages/ (else its last two parts), so the same function matches across envs."""
    if frame.endswith(")") and " (" in frame:
        func, loc = frame[:-1].rsplit(" (", 1)
        path = loc.rsplit(":", 1)[0].replace("\\", "/")
        path = path.rsplit("site-packages/", 1)[1] if "site-packages/" in path else "/".join(path.split("/")[-2:])
        return f"{func} ({path})"
    return frame


def parse_folded(text: str) -> dict:
    """py-spy raw (folded) output -> ``{n, self: {frame: samples}, total: {frame: samples}}`` over the
    samples whose stack passes through :data:`LOOP_FRAME` (frames above it dropped; a frame counts once
    per sample in ``total``). Lines: ``frame;frame;...;frame COUNT``, outermost first."""
    n, self_, total = 0, {}, {}
    for line in text.splitlines():
        line = line.strip()
        if not line or " " not in line:
            continue
        stack, _, cnt = line.rpartition(" ")
        try:
            k = int(cnt)
        except ValueError:
            continue
        frames = stack.split(";")
        idx = next((i for i, f in enumerate(frames) if f.startswith(LOOP_FRAME + " ")), None)
        if idx is None:
            continue
        keys = [_frame_key(f) for f in frames[idx:]]
        n += k
        self_[keys[-1]] = self_.get(keys[-1], 0) + k
        for key in set(keys):
            total[key] = total.get(key, 0) + k
    return {"n": n, "self": self_, "total": total}


def frame_diff(base: dict, cand: dict, base_us: float, cand_us: float, top: int = 25) -> list:
    """Differential view of two :func:`parse_folded` results, each scaled by its loop's µs per call:
    per frame ``{frame, base_self_us, cand_self_us, delta_self_us, base_total_us, cand_total_us,
    delta_total_us, base_share, cand_share, se_us, status}``; status appears / vanishes / grows /
    shrinks / same (|delta| under 2 binomial standard errors of the two shares). Sorted by
    delta_self_us, largest growth first; the ``top`` largest |delta| rows are kept."""
    rows = []
    nb, nc = max(base["n"], 1), max(cand["n"], 1)
    for f in set(base["total"]) | set(cand["total"]):
        bs, cs = base["self"].get(f, 0), cand["self"].get(f, 0)
        bt, ct = base["total"].get(f, 0), cand["total"].get(f, 0)
        pb, pc = bs / nb, cs / nc
        se = math.sqrt(pb * (1 - pb) / nb * base_us ** 2 + pc * (1 - pc) / nc * cand_us ** 2)
        d = pc * cand_us - pb * base_us
        if bt == 0:
            status = "appears"
        elif ct == 0:
            status = "vanishes"
        elif abs(d) < 2 * se:
            status = "same"
        else:
            status = "grows" if d > 0 else "shrinks"
        rows.append({"frame": f, "base_self_us": pb * base_us, "cand_self_us": pc * cand_us, "delta_self_us": d,
                     "base_total_us": bt / nb * base_us, "cand_total_us": ct / nc * cand_us,
                     "delta_total_us": ct / nc * cand_us - bt / nb * base_us,
                     "base_share": pb, "cand_share": pc, "se_us": se, "status": status})
    rows.sort(key=lambda r: -abs(r["delta_self_us"]))
    rows = rows[:top]
    rows.sort(key=lambda r: -r["delta_self_us"])
    return rows


def counts_diff(base: dict, cand: dict, top: int = 25) -> dict:
    """cProfile counts per call of two envs -> ``{base_total, cand_total, rows: [{func, base, cand,
    delta}]}``, rows where the count differs, largest |delta| first."""
    b, c = base.get("per_call") or {}, cand.get("per_call") or {}
    rows = [{"func": f, "base": b.get(f, 0.0), "cand": c.get(f, 0.0), "delta": c.get(f, 0.0) - b.get(f, 0.0)}
            for f in set(b) | set(c)]
    rows = [r for r in rows if abs(r["delta"]) >= 0.5]
    rows.sort(key=lambda r: (-abs(r["delta"]), r["func"]))
    return {"base_total": base.get("total"), "cand_total": cand.get("total"), "rows": rows[:top],
            "n_differ": len(rows)}


def analyze(doc: dict) -> dict | None:
    """Everything the report and the terminal show, from results.json's ``explain`` record (and, for
    the profiled case, the main comparison's host and wall deltas from ``doc['comparisons']``)."""
    raw = doc.get("explain")
    if not raw:
        return None
    labels = raw.get("envs") or []
    base = labels[0] if labels else None
    case_label = {c["id"]: f"{c.get('label') or c['id']} {c.get('op', '')}".strip() for c in doc.get("cases") or []}
    layers = [{"case": cid, "label": case_label.get(cid, cid), **layer_view(rec, base, labels)}
              for cid, rec in (raw.get("layers") or {}).items()]
    first = []
    order = raw.get("setup_order") or []
    for i, cid in enumerate(order):
        if cid in (raw.get("first_call") or {}):
            first.append({"case": cid, "label": case_label.get(cid, cid), "process_first": i == 0,
                          "ms": raw["first_call"][cid]})
    prof = raw.get("profile")
    pv = None
    if prof:
        pv = {"case": prof["case"], "label": prof.get("case_label") or prof["case"], "error": prof.get("error"),
              "sampler": prof.get("sampler"), "envs": {}, "diffs": []}
        parsed = {}
        for lab in labels:
            e = (prof.get("envs") or {}).get(lab)
            if not e:
                continue
            off = (e.get("loop_off") or {}).get("us_per_call")
            on = (e.get("loop_on") or {}).get("us_per_call")
            mean_on = (e.get("loop_on") or {}).get("mean_us_per_call")
            # mean / median of the sampled loop: ~1 on a quiet core; well above 1 the process was
            # preempted much of the time and the frames' µs are less sure (2-core CI under load: 3x)
            off2 = (e.get("loop_off2") or {}).get("us_per_call")
            drift = (off2 / off - 1) if off and off2 else None
            ref = math.sqrt(off * off2) if off and off2 else off  # the loops without the sampler, before and after
            ev = {"off_us": ref, "on_us": on, "effect": (on / ref - 1) if on and ref else None,
                  "off_before_us": off, "off_after_us": off2, "drift": drift,
                  # the effect is read against loops that agree within 2 % (the figure's tolerance)
                  "effect_measurable": drift is None or abs(drift) <= 0.02,
                  "contention": (mean_on / on) if mean_on and on else None, "samples": None, "folded_lines": 0}
            if e.get("folded"):
                parsed[lab] = parse_folded(e["folded"])
                ev["samples"] = parsed[lab]["n"]
                ev["folded_lines"] = len(e["folded"].splitlines())
                ev["top_self"] = sorted(({"frame": f, "us": s / max(parsed[lab]["n"], 1) * (on or 0),
                                          "share": s / max(parsed[lab]["n"], 1)}
                                         for f, s in parsed[lab]["self"].items()), key=lambda r: -r["us"])[:12]
            ev["calls_total"] = (e.get("counts") or {}).get("total")
            pv["envs"][lab] = ev
        for lab in labels[1:]:
            if lab not in pv["envs"] or base not in pv["envs"]:
                continue
            d: dict = {"candidate": lab}
            if lab in parsed and base in parsed:
                bu, cu = pv["envs"][base]["on_us"], pv["envs"][lab]["on_us"]
                d["frames"] = frame_diff(parsed[base], parsed[lab], bu, cu)
                d["sampled_delta_us"] = cu - bu
                grown = [r for r in d["frames"] if r["delta_self_us"] > 0]
                d["top_grown"] = grown[0] if grown else None
            be, ce = (prof["envs"].get(base) or {}).get("counts"), (prof["envs"].get(lab) or {}).get("counts")
            if be and ce:
                d["counts"] = counts_diff(be, ce)
            for comp in doc.get("comparisons") or []:
                if comp.get("case") == prof["case"] and comp.get("candidate") == lab and comp.get("baseline", base) == base:
                    d[f"main_{comp['metric']}"] = comp.get("delta_us")
            # the profile explains what the clocks saw: sampled delta (the sum of every frame's self
            # delta) over the timing phase's host delta of the same case
            mh = d.get("main_host_us")
            if d.get("sampled_delta_us") is not None and mh:
                d["explained_fraction"] = d["sampled_delta_us"] / mh
            pv["diffs"].append(d)
    return {"base": base, "labels": labels, "layers": layers, "first_call": first, "profile": pv,
            "notes": raw.get("notes") or [], "seconds": raw.get("seconds"), "settings": raw.get("settings")}


def summary_lines(view: dict | None) -> list[str]:
    """A short terminal summary of :func:`analyze`'s view (µs per call, host clock for the layers)."""
    if not view:
        return []
    out = ["explain (host µs per call; own worker processes after the timing, not in any verdict):"]
    for lv in view["layers"]:
        for c in lv["comparisons"]:
            if c["sentence"]:
                out.append(f"  {lv['label']}: {c['candidate']} vs {view['base']}: {c['sentence']}")
        for lab, e in lv["envs"].items():
            gone = [f"{x['kind']} ({x['note']})" for x in e["layers"] if not x["exists"]]
            if gone:
                out.append(f"  {lv['label']}: {lab} has no {'; no '.join(gone)}")
    for f in view["first_call"]:
        out.append(f"  first call {f['label']}: " + ", ".join(
            f"{lab} {ms:.1f} ms" for lab, ms in f["ms"].items() if ms is not None)
            + (" (first case of the process: includes its lazy imports)" if f["process_first"] else ""))
    p = view["profile"]
    if p:
        if p.get("error"):
            out.append(f"  frame profile: {p['error']}")
        for d in p["diffs"]:
            t = d.get("top_grown")
            if t:
                out.append(f"  {p['label']}: {d['candidate']} vs {view['base']}: top grown frame {t['frame']} "
                           f"{t['delta_self_us']:+.1f} µs per call (self, sampled; {t['status']})")
                more = [r for r in d["frames"] if r["delta_self_us"] > 0][1:4]
                if more:
                    out.append("    next: " + "; ".join(f"{r['frame']} {r['delta_self_us']:+.1f} µs ({r['status']})"
                                                     for r in more))
            if d.get("sampled_delta_us") is not None:
                s = f"  frames add up to {d['sampled_delta_us']:+.1f} µs per call (sampled loop, wall)"
                if d.get("main_host_us") is not None:
                    s += f"; the timing phase's host delta {d['main_host_us']:+.1f} µs"
                    if d.get("explained_fraction") is not None:
                        s += f" ({d['explained_fraction'] * 100:.0f} % explained)"
                out.append(s)
            c = d.get("counts")
            if c:
                out.append(f"  calls per call (cProfile): {view['base']} {c['base_total']:.0f}, {d['candidate']} "
                           f"{c['cand_total']:.0f}")
        for lab, e in p["envs"].items():
            if e.get("effect") is not None:
                drift = e.get("drift")
                out.append(f"  sampler effect on wall time, {lab}: {e['effect'] * 100:+.1f} % "
                           f"({e['off_us']:.1f} -> {e['on_us']:.1f} µs per call, medians of ~1 ms samples)"
                           + (f"; without the sampler before / after {e['off_before_us']:.1f} / "
                              f"{e['off_after_us']:.1f} µs ({drift * 100:+.1f} % drift"
                              + ("" if e.get("effect_measurable") else ": the CPU's speed moved more than 2 %, "
                                 "the effect is not measurable here") + ")" if drift is not None else
                              "; one loop without the sampler, before it only: the CPU's drift is not excluded")
                           + (f"; preempted: mean/median {e['contention']:.1f}x" if (e.get("contention") or 0) > 1.2
                              else ""))
    for n in view["notes"]:
        out.append(f"  note: {n}")
    return out
