"""The speed adjustment with each worker's probe centred on its own set median, replayed on committed
lockstep runs (issue #10, offline).

Today (``sampling.speed_adjust``, stats.SpeedSlope) every sample of a burst is moved to one reference
CPU speed along the case's slope: log µs - beta * (log probe µs - centre). A cycle's log ratio then
carries beta * (the two bursts' log probe difference). If one worker process reads the probe
differently from the other for its whole life -- a per-process offset of the probe, not of the CPU
-- that difference enters every cycle of its set, and the set's value moves by beta times it.
Seen on the 2-core CPU machine (CPU self-check, 2026-12-04 evening, A/A run 1 set 13): worker a's probe
read 4.70 µs, b's 3.83 µs, their calls alike (plain ratios 0.96-0.99), and the adjusted ratio came out
1.18-1.28 in the four cases, which left the run's four intervals "ambiguous". On the H200 the sets'
between-worker probe difference (SD 2-8 % over a run's sets) is mostly CPU speed the calls felt as
well (the share printed per run, ~1 there), not such an offset.

Centred rule (``centred``): each worker's probe readings in a set are taken relative to that
worker's own median over the set (every wall burst of every case), i.e. each value of a
(worker, set) is multiplied by exp(beta * (m - centre)), m its median log probe: what is left of
the adjustment is the CPU's speed changes *within* the set. The two workers of a set take turns on
one core, so over a set their true mean speeds agree up to noise, while a per-process probe offset
no longer enters. Exact on the stored values (a per-(worker, set) factor on the adjusted bursts).

Each run's comparisons are recomputed with the code's own functions (results.comparisons, method /5)
as judged (``as run``) and centred. Printed per run: batch-2 / batch-512 forward half-widths (%,
widths.hw), for A/A runs the wall intervals inside +-3 % of 1 and the wall/host intervals excluding 1
(each one a miss); totals per kind of run at the end. Offline, on what the runs sampled (the runner
stopped cycling a comparison once within 1 %: a live run would give the others those cycles).

Pretest rule (``pretest``, tried 2026-12-04 late and not taken): the two-slope rule, but rho is used
only where its one-sided 95 % upper bound (:func:`probe_share_bound`, over per-set points) is below
1, else 1 -- the full rule unless the earlier sets show the calls did not follow.

Two-slope rule (``2-slope``): the between-worker part counts with rho * beta, rho estimated from the
earlier sets (:func:`two_slope`). Per run it also prints the share rho over all its sets
(:func:`share`, a diagnostic): ~1 where the sets' probe difference is CPU speed the calls felt as
well, ~0 where it is the probe's own per-process offset.

The replay's two-slope rule is the runner's (runner.apply_probe_share) but for three simplifications:
a set's dm and plain ratio need 2+ common cycles (the runner: 1), every earlier set counts (the
runner: pinned ones; these runs' sets were all pinned) and the host clock takes the wall clock's
factor (the runner: its own cycles').

``--as-full``: a run made with ``sampling.probe_share: estimated`` (the default since the late evening
of 2026-12-04) is first taken back to the ``full`` rule on the same cycles (:func:`undone`), so "as run"
is ``full`` and the two-slope rule starts from it, as for the older runs.

Clipped rule (``clipped``, 2026-12-05): the two-slope rule, but the share is not carried beyond the
probe differences it was estimated on (``--clip K``: dm held to +-K times the largest of the earlier
sets, any case; :func:`two_slope`; ``--first-reach R``: in the first sets, before a share is estimated,
the set-wide difference, the median of the cases' dm, held to +-R, the log of the two workers' full
probe difference, and every case's dm less the excess).

Usage: python benchmarks/probe_center_replay.py [--min-sets N] [--as-full] [--clip K] RUN [RUN ...]
"""
from __future__ import annotations

import copy
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_state_replay  # noqa: E402
from widths import cli, excluding_one, hw, inside  # noqa: E402

from scipy import stats as sps  # noqa: E402

from matrix_runner import report, results, stats  # noqa: E402

MODES = ("as run", "centred", "2-slope", "pretest", "clipped")
#: Earlier sets before the two-slope rule estimates its share (until then: the runner's rule);
#: ``--min-sets N`` sets another (the runner's is stats.PROBE_SHARE_MIN_SETS).
MIN_SETS = stats.PROBE_SHARE_MIN_SETS
#: ``--as-full``: take runs made with probe_share: estimated back to full first (:func:`undone`)
AS_FULL = False
#: ``clipped`` mode: a set's probe difference dm counts only up to this many times the largest |dm| of
#: the earlier sets, any case (``--clip K``)
CLIP = 1.0
#: ``clipped`` mode, before the share is estimated (the first sets, which count the whole difference):
#: the set-wide probe difference (the median of the cases' dm) held to +- this, every case's dm moved by
#: the excess (log, the two workers' full difference; ``--first-reach R``); None: not held
FIRST_REACH = None
CLOCKS = ("wall_us", "host_us")


def undone(d: dict) -> dict:
    """A copy of results ``d`` with every set's between-worker shift (``speed_by_set[set]["between"]``,
    runner.apply_probe_share under ``sampling.probe_share: estimated``) taken back out of its wall and
    host values: nearly the values the ``full`` rule gives on the same cycles -- the runner shifted each
    cycle by its own slope (``CaseData.cycle_beta``, not stored), this takes the set's mean shift back
    from every cycle, which differs by the slope's drift within a set (~1-2 % of the shift here). A
    run made with ``full`` has no shifts and comes back unchanged."""
    d = copy.deepcopy(d)
    for c in d["cases"]:
        for clock in CLOCKS:
            m = (c.get("metrics") or {}).get(clock) or {}
            for sid, per in (m.get("by_set") or {}).items():
                b = ((m.get("speed_by_set") or {}).get(sid) or {}).get("between")
                if b and isinstance(per, dict):
                    m["by_set"][sid] = {k: (v * math.exp(-b) if isinstance(v, (int, float)) else v) for k, v in per.items()}
    return d


def worker_medians(cases: list[dict]) -> dict:
    """(env, set id) -> the median log probe reading (µs) over that worker's wall bursts of every case."""
    logs: dict = {}
    for c in cases:
        ref = ((c.get("metrics") or {}).get("wall_us") or {}).get("ref_by_set") or {}
        for sid, per in ref.items():
            vals = per.values() if isinstance(per, dict) else per
            logs.setdefault((c["env"], sid), []).extend(math.log(v) for v in vals if isinstance(v, (int, float)) and v > 0)
    return {k: statistics.median(v) for k, v in logs.items() if v}


def centred(d: dict) -> dict:
    """A copy of results ``d`` whose adjusted burst values are centred per worker and set (module doc)."""
    d = copy.deepcopy(d)
    med = worker_medians(d["cases"])
    for c in d["cases"]:
        for clock in CLOCKS:
            m = (c.get("metrics") or {}).get(clock) or {}
            for sid, per in (m.get("by_set") or {}).items():
                sl = (m.get("speed_by_set") or {}).get(sid)
                mw = med.get((c["env"], sid))
                if not sl or mw is None or not isinstance(per, dict):
                    continue
                f = math.exp(float(sl["beta"]) * (mw - float(sl["center"])))
                m["by_set"][sid] = {k: (v * f if isinstance(v, (int, float)) else v) for k, v in per.items()}
    return d


def probe_share_bound(groups, level: float = 0.95) -> tuple[float, float]:
    """The share of :func:`probe_share` with a one-sided upper confidence bound, from points that are
    independent: one (x, y) per earlier process set and contrast (a contrast: an env against the
    others, one fewer than the envs, as their differences sum to 0), x and y each the mean over the
    set's cases of beta * dm and dy (:func:`probe_share`'s x and y). Least squares of y on x with each
    contrast's own mean removed (the version difference); residual SD on sum(n_g - 1) - 1 degrees of
    freedom; the bound is the slope plus Student's t quantile at ``level`` times its standard error
    (the textbook slope interval, e.g. Draper & Smith, Applied Regression Analysis, ch. 1). Returns
    (the slope clamped to [0, 1], the bound, unclamped); (1.0, inf) where there is no spread or no
    degree of freedom to judge by."""
    sums = []
    for pts in groups:
        pts = [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
        sums.append([len(pts), sum(x for x, _ in pts), sum(y for _, y in pts), sum(x * x for x, _ in pts),
                     sum(x * y for x, y in pts), sum(y * y for _, y in pts)])
    sxx, sxy, _, _ = stats.within_sums([g[:5] for g in sums])
    syy = sum(yy - sy * sy / n for n, _, sy, _, _, yy in sums if n >= 2)
    df = sum(n - 1 for n, *_ in sums if n >= 2) - 1
    if sxx <= 1e-12 or df < 1:
        return 1.0, math.inf
    b = sxy / sxx
    se = math.sqrt(max(syy - b * sxy, 0.0) / df / sxx)
    return min(1.0, max(0.0, b)), b + float(sps.t.ppf(level, df)) * se


def two_slope(d: dict, min_sets: int = MIN_SETS, pretest: bool = False, clip: float | None = None) -> dict:
    """A copy of results ``d`` under the two-slope rule: a set's between-worker probe difference (per
    case, the mean over its cycles of the two bursts' log probe difference, dm) counts with
    rho * beta instead of beta, rho the share of it that reached the plain call ratios in the
    earlier sets (least squares of the sets' plain mean log ratios on beta * dm, each case centred,
    pooled over cases, clamped to [0, 1]); before ``min_sets`` earlier sets, rho = 1 (the runner's rule).
    Per cycle: z = adjusted log ratio + (1 - rho) * beta * dm, i.e. each value of the candidate
    (worker, set) times exp((1 - rho) * beta * dm).

    ``clip`` (the ``clipped`` mode): once rho is estimated, the counted part is rho * beta * dm with dm
    held to +-clip times the largest |dm| of the earlier sets (any case) -- the share is not carried
    beyond the probe differences it was estimated on (a worker whose probe reads far off its partner's
    for a whole set, calls alike, is not turned into a set ratio)."""
    d = copy.deepcopy(d)
    labs = [e["label"] for e in d["envs"] if e.get("status") == "ok"]
    base, cand = labs[0], labs[1]
    by: dict = {}
    for c in d["cases"]:
        by.setdefault(c["id"], {})[c["env"]] = c
    order = sorted({int(s) for c in d["cases"] for s in ((c.get("metrics") or {}).get("wall_us") or {}).get("by_set", {})})
    rows: dict = {}  # case id -> [(set, beta*dm, plain mean log ratio)]
    seen_dm: list = []  # |dm| of every case of the earlier sets (``clip``)
    for sid in order:
        s = str(sid)
        now_dm: list = []
        # rho from the earlier sets only, by the runner's estimator
        n_prev = len({p[0] for pts in rows.values() for p in pts})
        if pretest:  # the share only where the earlier sets' calls followed less than all of it (its bound < 1)
            per: dict = {}
            for pts in rows.values():
                for sid0, x, y in pts:
                    per.setdefault(sid0, []).append((x, y))
            pts1 = [(sum(x for x, _ in v) / len(v), sum(y for _, y in v) / len(v)) for _, v in sorted(per.items())]
            est, upper = probe_share_bound([pts1])
            rho = 1.0 if n_prev < min_sets or upper >= 1.0 else est
        else:
            rho = 1.0 if n_prev < min_sets else stats.probe_share([[(x, y) for _, x, y in pts] for pts in rows.values()])
        items = []
        for cid, pair in by.items():
            if base not in pair or cand not in pair:
                continue
            ma, mb = pair[base]["metrics"].get("wall_us") or {}, pair[cand]["metrics"].get("wall_us") or {}
            ra, rb = (ma.get("ref_by_set") or {}).get(s) or {}, (mb.get("ref_by_set") or {}).get(s) or {}
            pa, pb = (ma.get("raw_by_set") or {}).get(s) or {}, (mb.get("raw_by_set") or {}).get(s) or {}
            sl = (mb.get("speed_by_set") or {}).get(s)
            ks = [k for k in pa if k in pb and k in ra and k in rb and ra[k] > 0 and rb[k] > 0 and pa[k] > 0 and pb[k] > 0]
            if not sl or len(ks) < 2:
                continue
            items.append((cid, pair, float(sl["beta"]), sum(math.log(rb[k] / ra[k]) for k in ks) / len(ks),
                          sum(math.log(pb[k] / pa[k]) for k in ks) / len(ks)))
        # the set-wide part of the probe difference (median over cases; ``--first-reach``)
        whole = statistics.median(dm for *_, dm, _ in items) if items else 0.0
        for cid, pair, beta, dm, raw in items:
            f = math.exp((1.0 - rho) * beta * dm)
            if clip is not None and n_prev >= min_sets and seen_dm:
                r = clip * max(seen_dm)
                f = math.exp(beta * dm - rho * beta * max(-r, min(r, dm)))
            elif clip is not None and n_prev < min_sets and FIRST_REACH is not None:
                f = math.exp(beta * (whole - max(-FIRST_REACH, min(FIRST_REACH, whole))))  # its excess only
            for clock in CLOCKS:
                m = pair[cand]["metrics"].get(clock) or {}
                per = (m.get("by_set") or {}).get(s)
                if isinstance(per, dict) and (m.get("speed_by_set") or {}).get(s):
                    m["by_set"][s] = {k: (v * f if isinstance(v, (int, float)) else v) for k, v in per.items()}
            rows.setdefault(cid, []).append((sid, beta * dm, raw))
            now_dm.append(abs(dm))
        seen_dm += now_dm
    return d


def share(d: dict) -> tuple[float | None, float | None]:
    """(rho, SD of dm) over all of ``d``'s sets (a diagnostic, not predictable): the least-squares
    share of the sets' between-worker probe difference (beta * dm, per case centred) found in their
    plain mean log ratios -- 1: it is CPU speed the calls felt too (the runner's rule fits); 0: a
    probe offset of the process only (centring fits) -- and the median over cases of dm's SD."""
    labs = [e["label"] for e in d["envs"] if e.get("status") == "ok"]
    by: dict = {}
    for c in d["cases"]:
        by.setdefault(c["id"], {})[c["env"]] = (c.get("metrics") or {}).get("wall_us") or {}
    xs, ys, sds = [], [], []
    for pair in by.values():
        if labs[0] not in pair or labs[1] not in pair:
            continue
        a, b = pair[labs[0]], pair[labs[1]]
        pts = []
        for s, sl in (b.get("speed_by_set") or {}).items():
            ra, rb = (a.get("ref_by_set") or {}).get(s) or {}, (b.get("ref_by_set") or {}).get(s) or {}
            pa, pb = (a.get("raw_by_set") or {}).get(s) or {}, (b.get("raw_by_set") or {}).get(s) or {}
            ks = [k for k in pa if k in pb and k in ra and k in rb and min(ra[k], rb[k], pa[k], pb[k]) > 0]
            if len(ks) >= 2:
                dm = sum(math.log(rb[k] / ra[k]) for k in ks) / len(ks)
                pts.append((float(sl["beta"]) * dm, sum(math.log(pb[k] / pa[k]) for k in ks) / len(ks), dm))
        if len(pts) >= 3:
            mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
            xs += [p[0] - mx for p in pts]
            ys += [p[1] - my for p in pts]
            sds.append(statistics.pstdev([p[2] for p in pts]))
    sxx = sum(x * x for x in xs)
    return (sum(x * y for x, y in zip(xs, ys)) / sxx if sxx > 0 else None,
            statistics.median(sds) if sds else None)


def judged(d: dict) -> list[dict]:
    """``d``'s comparisons by method /5, every cycle counted (cpu_state_replay.judged)."""
    return cpu_state_replay.judged(d, "all")


def main(runs: list[str]) -> None:
    tot = {m: {"aa": 0, "aa_all_in": 0, "aa_in": 0, "aa_n": 0, "aa_same": 0, "miss": 0, "b512": [], "b2": [],
               "aa_b2": []} for m in MODES}
    for run in runs:
        d = results.load(results.find(run))
        if AS_FULL:
            d = undone(d)
        elif (d.get("settings") or {}).get("probe_share") == "estimated":  # its 2-slope would share twice (review)
            sys.exit(f"{run}: made with sampling.probe_share: estimated (its sets' values already carry the share): "
                     "give --as-full to take it back to full first")
        st = d.get("settings") or {}
        if st.get("quick") or len(d.get("envs") or []) < 2 or not d.get("sets") or not st.get("speed_adjust"):
            continue
        vers = {(e.get("flash_attn_version") or e.get("requested_version") or e.get("label")) for e in d["envs"]}
        aa = len(vers) == 1
        probe = report.probe_median_us(d)
        parts = []
        for mode in MODES:
            cs = judged(d if mode == "as run" else centred(d) if mode == "centred"
                        else two_slope(d, MIN_SETS, pretest=mode == "pretest",
                                       clip=CLIP if mode == "clipped" else None))
            w = [c for c in cs if c["metric"] == "wall_us"]
            b512 = [hw(c) for c in w if c["label"].startswith("B512 ") and c["op"] == "fwd"]
            b2 = [hw(c) for c in w if c["label"].startswith("B2 ") and c["op"] == "fwd"]
            allw = sorted(hw(c) for c in w)
            s = f"{mode:7s} half-widths {allw[0]:.1f}-{allw[-1]:.1f} %"
            if b2 or b512:
                s += f"; B2 fwd ±{'/'.join(f'{x:.2f}' for x in b2)} %, B512 fwd ±{'/'.join(f'{x:.2f}' for x in b512)} %"
            t = tot[mode]
            if aa:
                n_in = sum(1 for c in w if inside(c))
                same = sum(1 for c in w if c["verdict"] == "same")
                miss = len(excluding_one({"comparisons": cs})[0])
                s += f"; same {same}/{len(w)}; inside ±3 %: {n_in}/{len(w)}; excluding 1: {miss}"
                t["aa"] += 1
                t["aa_all_in"] += n_in == len(w)
                t["aa_in"] += n_in
                t["aa_n"] += len(w)
                t["aa_same"] += same
                t["miss"] += miss
                t["aa_b2"] += [hw(c) for c in w if c["label"].startswith("B2 ")]
            else:
                t["b512"] += b512
                t["b2"] += b2
            parts.append(s)
        name = Path(run).name if Path(run).name not in results.NAMES else Path(run).parent.name
        rho, sd = share(d)
        rho_s = (f"; share of the sets' probe difference in their plain ratios {rho:.2f} (SD of that difference "
                 f"{100 * sd:.1f} %)" if rho is not None else "")
        print(f"{name} (speed probe {probe:.2f} µs{rho_s})\n    " + "\n    ".join(parts) if probe
              else f"{name}\n    " + "\n    ".join(parts))
        if rho is not None:
            tot["as run"].setdefault("rho", []).append(rho)
    for mode, t in tot.items():
        line = f"{mode:7s}:"
        if t["aa"]:
            line += (f" A/A runs {t['aa']}: 'same' {t['aa_same']} of {t['aa_n']}, all inside ±3 % in {t['aa_all_in']}, "
                     f"{t['aa_in']} of {t['aa_n']} inside, {t['miss']} wall/host intervals exclude 1")
            if t["aa_b2"]:
                line += f", A/A batch-2 median ±{statistics.median(t['aa_b2']):.2f} %"
        for k, lim in (("b512", 1.0), ("b2", 5.0)):
            if t[k]:
                line += (f"; seed {k.upper()} fwd median ±{statistics.median(t[k]):.2f} % (max {max(t[k]):.2f}), "
                         f"≤{lim:g} % in {sum(1 for x in t[k] if x <= lim)} of {len(t[k])}")
        if t.get("rho"):
            line += f"; that share, median over the runs {statistics.median(t['rho']):.2f} ({min(t['rho']):.2f}-{max(t['rho']):.2f})"
        print(line)


if __name__ == "__main__":
    while sys.argv[1:2] in (["--min-sets"], ["--as-full"], ["--clip"], ["--first-reach"]):  # any order
        if sys.argv[1] == "--as-full":
            AS_FULL = True
            del sys.argv[1:2]
        elif sys.argv[1] == "--clip":
            CLIP = float(sys.argv[2])
            del sys.argv[1:3]
        elif sys.argv[1] == "--first-reach":
            FIRST_REACH = float(sys.argv[2])
            del sys.argv[1:3]
        else:
            MIN_SETS = int(sys.argv[2])
            del sys.argv[1:3]
    cli(main, __doc__)
