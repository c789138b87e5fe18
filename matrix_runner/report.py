"""Stage 5b — the report: self-contained HTML (jinja2, autoescaped, charts as inline SVG), the
terminal table (rich) and a Markdown summary; plus the cross-run comparison behind
``matrix-run compare``. Everything here renders from results dicts (results.json), never from live
state.

The HTML report answers, on its first screen: which version is faster, where (per case), by how much
(ratio with its 95 % CI), how sure (the verdict), and why (host overhead or kernel time). It fetches
nothing: CSS is inline, charts are inline SVG (see charts.py), there is no script, and every string
that comes from a results file is escaped by jinja2's autoescaping.
"""
from __future__ import annotations

import html
import json
import math
import re
import shlex
import statistics
import zlib
from pathlib import Path

import numpy as np
from jinja2 import Environment, PackageLoader, select_autoescape

from . import charts, results, stats
from .config import SAMPLING_FLAGS, SHOWN

METRIC_NAMES = {"wall_us": "wall", "host_us": "host", "device_us": "device", "graph_us": "graph"}
ATTR_PHRASE = {"host": "host overhead", "device": "kernel (device) time", "mixed": "host and kernel time"}


def fmt_bytes(n) -> str:
    """Bytes in decimal units: 537 MB, 13.8 kB, 1.07 GB."""
    if n is None:
        return "–"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_tflops(v: float | None) -> str:
    """TFLOP/s (or GB/s) with 3 significant digits: 412, 38.1, 0.000812 (a CPU stand-in's tiny
    calls: two decimals printed 0.00)."""
    return "–" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.3g}")


def fmt_us(v) -> str:
    """µs with sensible precision: 5.31, 41.5, 1056."""
    if v is None:
        return "–"
    v = float(v)
    if not math.isfinite(v):
        return "–" if math.isnan(v) else ("∞" if v > 0 else "-∞")  # an unbounded interval's end
    a = abs(v)  # the precision of the value as rounded (999.6 is "1,000", not "1000"; 9.996 "10.0")
    if a >= 999.5:
        return f"{v:,.0f}"
    if a >= 99.95:
        return f"{v:.0f}"
    if a >= 9.995:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_ci(c: dict | None, digits: int = 2) -> str:
    """``[low, high]`` of a comparison's ratio interval; an anytime interval that is still unbounded
    (too few process sets for its level) says so, and a provisional ratio of one process set per
    side (``--quick``; ``compare`` of one-set runs) shows none."""
    if not c:
        return "–"
    if c.get("within_process_only") and c.get("verdict") == "provisional":
        # one process (set) per side: an interval from its own samples would ignore the spread
        # between processes, which is what decides (stats module doc)
        return "(no interval: one process set)"
    if c.get("between_runs") and c.get("verdict") == "provisional":
        # an interval from the two runs' sets leaves out how far apart two runs lie (results.BETWEEN_RUNS_WHY)
        return "(between runs: no interval)"
    lo, hi = c.get("ci_low"), c.get("ci_high")
    if hi is None or lo is None or hi == float("inf") or not lo:
        return "(unbounded: too few sets)"
    digits = ci_digits(c, digits)
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def ci_digits(c: dict, digits: int = 2) -> int:
    """Decimals for comparison ``c``'s interval: ``digits``, or more (up to 4) where rounding would put
    a bound on the other side of, or onto, a line its verdict is drawn at (stats.verdict): 1 ±
    ``min_effect`` (the "same" band: 1 + e and 1 / (1 + e)) and, but for a "same", 1 itself. A new-user
    trial found "ambiguous 1.05x [1.04, 1.05]" for [1.0407, 1.053], which reads as inside ±5 %: 121
    of the committed runs' 3,596 ambiguous intervals read like that at two decimals. ``min_effect``:
    the comparison's own (results since 2026-12-06), else 0.05."""
    e = c.get("min_effect") or 0.05
    marks = [1.0 + e, 1.0 / (1.0 + e)] + ([] if c.get("verdict") == "same" else [1.0])

    def misread(b: float, m: float, d: int) -> bool:
        # across the line, or shown as the line is shown: 1/1.05 = 0.95238 reads "0.95" at two decimals,
        # so 0.95224 (outside the band) shown "0.95" read as on it (second new-user trial: an ambiguous
        # [0.95, 1.04] under a same [0.953, 1.042])
        r = round(b, d)
        return abs(b - m) > 1e-12 and (abs(r - round(m, d)) < 1e-12 or (r - m) * (b - m) < 0)

    lo, hi = c.get("ci_low"), c.get("ci_high")
    while digits < 4 and any(misread(b, m, digits) for b in (lo, hi) for m in marks):
        digits += 1
    return digits


def fmt_delta(c: dict | None, interval: bool = True) -> str:
    """A comparison's difference in µs per call, candidate minus baseline (``delta_us``; + means the
    candidate costs more): ``+43.3 [+33.7, +52.8]``, the interval at the ratio's level where the
    comparison has one (``interval`` False, an unbounded or one-set interval, or none stored: the
    point alone). ``–`` where the comparison has no difference (a merged, unpaired comparison may
    not)."""
    d = (c or {}).get("delta_us")
    if d is None or not math.isfinite(float(d)):
        return "–"
    def sign(v: float) -> str:  # fmt_us's precision; no sign on what rounds to zero ("-0.00")
        m = fmt_us(abs(v))
        return m if not m.strip("0.,") else ("+" if v >= 0 else "-") + m
    lo, hi = c.get("delta_ci_low"), c.get("delta_ci_high")
    if (not interval or c.get("unbounded") or c.get("verdict") == "provisional" or lo is None or hi is None
            or not (math.isfinite(float(lo)) and math.isfinite(float(hi)))):
        return sign(d)
    return f"{sign(d)} [{sign(lo)}, {sign(hi)}]"


def fmt_ratio(c: dict | None) -> str:
    if not c:
        return "–"
    return f"{c['ratio']:.2f}x {fmt_ci(c)}"


def fmt_x(r: float) -> str:
    """A ratio as a size of effect: 2.04 -> '2.04x', 0.5 -> '2.00x' (callers say faster/slower)."""
    return f"{(r if r >= 1 else 1 / r):.2f}x"


def headline(c: dict, min_effect: float = 0.05) -> str:
    """'3.06x slower' style phrase for one wall comparison."""
    r = c["ratio"]
    if c["verdict"] == "slower":
        return f"{r:.2f}x slower"
    if c["verdict"] == "faster":
        return f"{1 / r:.2f}x faster"
    if c["verdict"] == "same":
        return f"same (within ±{min_effect:.0%})"
    if c["verdict"] == "provisional":
        return f"provisional {r:.2f}x"
    return "ambiguous"


# --------------------------------------------------------------------------------------------
def _label_tokens(label: str) -> list[str]:
    """A case label's words, a parenthesized group counting as one (``L64-4096 (sum 9128)``), and a
    kvcache word with its number (``cache 8191``, ``paged 256``: config._func_label_suffix), which had
    been split between the title and the rows ("... causal cache" above "S1/8191 8191": new-user trial)."""
    return re.findall(r"\([^)]*\)|(?:cache|paged) \S+|\S+", label)


def short_labels(cases: list[dict]) -> tuple[dict, str]:
    """Case id -> label without the tokens every case shares, and the shared part as a phrase.

    ``B2 S300 H16 D16`` with H16 D16 in every case -> ``B2 S300``, common ``H16 D16 · fp16``."""
    first: dict = {}
    for c in cases:
        first.setdefault(c["id"], c)
    if not first:
        return {}, ""
    dtypes = {c.get("dtype") for c in first.values()}
    full = {cid: str(c.get("label") or cid) + (f" {c.get('dtype')}" if len(dtypes) > 1 else "")
            for cid, c in first.items()}
    # a parenthesized group ("(sum 9128)") is one token: never split between the title and the rows
    toks = [_label_tokens(lab) for lab in full.values()]
    common = set(toks[0]).intersection(*map(set, toks[1:])) if len(toks) > 1 else set()
    short = {cid: " ".join(t for t in _label_tokens(lab) if t not in common) or lab for cid, lab in full.items()}
    ops = {cid: first[cid].get("op") for cid in first}
    if len({(short[c], ops[c]) for c in short}) < len(short):  # shortening made two cases look alike
        short = dict(full)
        common = set()
    shared = " ".join(t for t in toks[0] if t in common)
    dtype = str(next(iter(dtypes))) if len(dtypes) == 1 and None not in dtypes else ""
    return short, " · ".join(x for x in (shared, dtype) if x)


#: Said wherever a run's verdicts are summarized when its SDPA control got a faster/slower verdict.
SDPA_WARNING = "the SDPA control differs between envs that run the same torch: treat this run's verdicts with care"


def summarize(wall: list[dict], n_cases: int, name: dict, cand: str, base: str,
              device: list[dict] | None = None, host: list[dict] | None = None,
              min_effect: float = 0.05, prefix: str = "", quick: bool = False, interrupted: bool = False,
              n_control: int = 0, run_dir: str | None = None) -> dict:
    """The one-line verdict for a candidate: ``{cls, text, detail}``. ``quick``: the run was a
    ``--quick`` one (else one process per version means it stopped early); ``interrupted``: it was;
    ``run_dir``: where its results.json is, named in the ``--resume`` advice (else a placeholder DIR:
    the HTML report may be read anywhere).

    ``wall``: the candidate's wall comparisons (with attribution), ``name``: case id -> short name
    (label + op). ``cls`` is slower / faster / mixed / same / none for the colour.

    The SDPA control (comparisons with ``impl`` sdpa; ``n_cases`` counts its cases too) times torch,
    the same in every env: it is never counted as a finding, and a faster/slower verdict on it adds
    :data:`SDPA_WARNING` (the measurement itself is unreliable)."""
    control = [c for c in wall if c.get("impl") == "sdpa"]
    if control or n_control:
        wall = [c for c in wall if c.get("impl") != "sdpa"]
        device = [c for c in device or [] if c.get("impl") != "sdpa"]
        host = [c for c in host or [] if c.get("impl") != "sdpa"]
        n_cases -= max(n_control, len(control))
    counts = {v: [c for c in wall if c["verdict"] == v]
              for v in ("slower", "faster", "same", "ambiguous", "provisional")}
    parts = []

    def side(word: str) -> str:
        lst = counts[word]
        attrs = [c.get("attribution") for c in lst]
        s = f"{word} in {len(lst)}/{n_cases} case{'s' if n_cases != 1 else ''}"
        known = [a for a in attrs if a]
        if known and len(set(known)) == 1 and len(known) == len(lst):
            s += ", all " + ATTR_PHRASE.get(known[0], known[0]) if len(lst) > 1 else ", " + ATTR_PHRASE.get(known[0], known[0])
        elif known:
            tally = {a: known.count(a) for a in ("host", "device", "mixed") if known.count(a)}
            s += " (" + ", ".join(f"{n} {a}" for a, n in tally.items()) + ")"
        elif lst and any("CPU" in (c.get("attribution_why") or "") for c in lst):
            s += " (CPU run: no device clock, wall is all host time)"
        ext = max(lst, key=lambda c: c["ratio"]) if word == "slower" else min(lst, key=lambda c: c["ratio"])
        # faster: the size of the effect and the ratio the tables show (new-user trial: "largest 1.08x"
        # beside a table's 0.92x had to be read as 1/0.92)
        s += (f"; largest {fmt_x(ext['ratio'])}" + (f" faster (ratio {ext['ratio']:.2f}x)" if word == "faster" else "")
              + f" at {name.get(ext['case'], ext['case'])}")
        return s

    for word in ("slower", "faster"):
        if counts[word]:
            parts.append(side(word))
    rest = []
    if counts["same"]:
        rest.append(f"same in {len(counts['same'])}")
    if counts["ambiguous"]:
        unb = [c for c in counts["ambiguous"] if c.get("unbounded")]
        need = [stats.sets_for_finite(c["alpha"], c["cs_mixing"]) for c in unb
                if isinstance(c.get("alpha"), float) and isinstance(c.get("cs_mixing"), float)]
        need = [n for n in need if n is not None]
        rest.append(f"ambiguous in {len(counts['ambiguous'])}" + (
            f" ({len(unb)} with too few process sets for a finite interval at this level"
            + (f", {min(need)}{'' if min(need) == max(need) else f'-{max(need)}'} are needed" if need else "")
            + ": " + ("--resume adds sets)" if interrupted else "raise --time-budget)") if unb else ""))
    if counts["provisional"]:
        lo = min(counts["provisional"], key=lambda c: c["ratio"])
        hi = max(counts["provisional"], key=lambda c: c["ratio"])
        parts.append(f"provisional ratios {lo['ratio']:.2f}x-{hi['ratio']:.2f}x in {len(counts['provisional'])} "
                     "cases, no verdict (" + ("a --quick run decides nothing" if quick else
                                              "wall time between two runs decides nothing: each met the CPU at its "
                                              "own speeds; time both in one run for a verdict"
                                              if any(c.get("between_runs") for c in counts["provisional"])
                                              and not any(c.get("within_process_only") for c in counts["provisional"])
                                              else "a side timed in one process set decides nothing") + ")")
    missing = n_cases - len(wall)
    if missing:
        rest.append(f"not compared in {missing} (failed or not run)")
    if not parts:
        if wall and len(counts["same"]) == len(wall):
            parts.append(f"no difference beyond ±{min_effect:.0%} in any of {n_cases} cases")
        elif wall:
            parts.append(f"no case decided faster or slower (±{min_effect:.0%})")
        else:
            parts.append("nothing could be compared")
    text = f"{prefix}{cand} vs {base}: " + "; ".join(parts) + "."
    if rest:
        text += " " + ", ".join(rest).capitalize() + "."
    cls = ("mixed" if counts["slower"] and counts["faster"] else "slower" if counts["slower"]
           else "faster" if counts["faster"] else "same" if wall and len(counts["same"]) == len(wall) else "none")
    if interrupted:
        text += (f" The run was interrupted: finish it with matrix-run --resume {shlex.quote(run_dir)}." if run_dir else
                 " The run was interrupted: finish it with matrix-run --resume DIR (DIR: the directory of this run's results.json).")
    if any(c.get("within_process_only") for c in wall) and not counts["provisional"]:
        if quick:
            text += (" Quick run: one worker process per version, so the intervals ignore process-to-process "
                     "spread (modes up to 2x apart); rerun without --quick before acting on a verdict.")
        else:
            text += (" Only one worker process per version was timed, so the intervals ignore "
                     "process-to-process spread (modes up to 2x apart); do not act on a verdict yet.")
    differs = [c for c in control if c["verdict"] in ("slower", "faster")]
    if differs:
        text += (f" Warning: {SDPA_WARNING} (" + ", ".join(
            f"{name.get(c['case'], c['case'])} {c['verdict']} {fmt_x(c['ratio'])}" for c in differs) + ").")
    detail = []
    if control:
        cv = {v: sum(1 for c in control if c["verdict"] == v) for v in ("slower", "faster", "same", "ambiguous", "provisional")}
        detail.append("SDPA control (torch's own attention, the same in every env; not counted above): " +
                      ", ".join(f"{v} in {n}" for v, n in cv.items() if n) + f" of {len(control)}")
    for lst, what in ((device, "Kernel (device) time"), (host, "Host time")):
        if not lst:
            continue
        vc = {v: sum(1 for c in lst if c["verdict"] == v)
              for v in ("slower", "faster", "same", "ambiguous", "provisional")}
        detail.append(what + ": " + ", ".join(f"{v} in {n}" for v, n in vc.items() if n) + f" of {len(lst)}")
    return {"cls": cls, "text": text, "detail": ". ".join(detail) + ("." if detail else ""),
            "counts": {k: len(v) for k, v in counts.items()}, "control_differs": len(differs),
            "control_warning": SDPA_WARNING if differs else None}


def ci_bands(cases: list[dict], metric: str = "wall_us", n_boot: int = 1000) -> dict:
    """(env, case id) -> (lo, hi): 95 % CI of the median of per-process medians, from a two-level
    bootstrap (stats.boot_stat: processes, then samples), seeded per case so it is reproducible."""
    out = {}
    for c in cases:
        m = (c.get("metrics") or {}).get(metric)
        if c.get("status") != "ok" or not m or not m.get("samples"):
            continue
        rng = np.random.default_rng(zlib.crc32(f"band/{c['env']}/{c['id']}".encode()))
        draws = stats.boot_stat(m["samples"], n_boot, rng)
        lo, hi = np.quantile(draws, [0.025, 0.975])
        out[(c["env"], c["id"])] = (float(lo), float(hi))
    return out


def alpha_pct(alpha: float) -> str:
    """An error rate as a percentage, as many digits as it has: 0.05 -> "5%", 0.025 -> "2.5%"."""
    return f"{100 * alpha:.4g}%"


def level_pct(alpha: float) -> str:
    """An interval's level 1 - ``alpha`` as a percentage, to 0.01 %: 0.05 -> "95%", 0.0375 -> "96.25%",
    0.05/12 -> "99.58%"."""
    return f"{100 * (1 - alpha):.2f}".rstrip("0").rstrip(".") + "%"


def level_groups(wall: list[dict]) -> str:
    """Which level each kind of wall-time verdict was shown at (stats.select_family: the k decided alike
    at 1 - alpha k/m, the rest at 1 - alpha/m), e.g. "the 9 called faster or slower at 96.25%, the
    one called the same at 99.58%, the other 2 at 99.58%"; provisional ones are left out. A merged
    report's runs (``run_id``, results.merge) each had their own family, so each is named with its
    pairs (second new-user trial: their counts were pooled at the first run's level)."""
    runs = list(dict.fromkeys(c.get("run_id") for c in wall if c.get("verdict") != "provisional"))
    if len(runs) > 1:
        def pairs_of(rid):
            return ", ".join(dict.fromkeys(f"{c.get('candidate')} vs {c.get('baseline')}" for c in wall
                                           if c.get("run_id") == rid))
        return "; ".join(f"{pairs_of(rid)}: {_level_groups([c for c in wall if c.get('run_id') == rid])}"
                         for rid in runs)
    return _level_groups(wall)


def _level_groups(wall: list[dict]) -> str:
    groups: list = []  # [who, level]; a group at the level of the one before joins it
    for kind, word in (("faster/slower", "faster or slower"), ("same", "the same")):
        sel = [x for x in wall if x.get("selection") == kind]
        if sel:
            groups.append([f"{'the one' if len(sel) == 1 else f'the {len(sel)}'} called {word}",
                           level_pct(sel[0]["alpha"])])
    rest = [x for x in wall if not x.get("selection") and x.get("verdict") != "provisional"]
    if rest:
        n = "the other one" if len(rest) == 1 else f"the other {len(rest)}"
        groups.append([n if groups else "each", level_pct(rest[0]["alpha"])])
    merged: list = []
    for who, lev in groups:  # k = 1 is Bonferroni's level: "the one called the same and the other 2 at 98.75%"
        if merged and merged[-1][1] == lev:
            merged[-1][0] += f" and {who}"
        else:
            merged.append([who, lev])
    return ", ".join(f"{who} at {lev}" for who, lev in merged)


def between_run(c: dict) -> bool:
    """Whether comparison ``c`` is between two runs (a merged report's env from another run than its
    baseline's): unpaired, with no e-BY level of its own (``alpha``)."""
    return c.get("alpha") is None and c.get("paired") is False


def ci_head(comparisons: list[dict], quick: bool = False, pair: tuple | None = None) -> str:
    """The label of a wall-ratio column: "[95% CI]" where every wall interval has that level (results/1:
    95 %; Bonferroni: 1 - alpha/m), "[CI, levels below]" where e-BY gave the verdicts different levels
    (:func:`level_note` says which), "(provisional)" for a --quick run and for a column whose every wall
    ratio is provisional (a merged report's env from another run: results.BETWEEN_RUNS_WHY; new-user
    trial: such a column was headed "[97.5% CI]"). ``pair``: (baseline, candidate), that column's own
    comparisons; the levels are the run's (e-BY over all of them)."""
    if quick:
        return "(provisional)"
    wall = [c for c in comparisons if c.get("metric") == "wall_us"]
    mine = [c for c in wall if pair is None or (c.get("baseline"), c.get("candidate")) == tuple(pair)]
    if mine and all(c.get("verdict") == "provisional" for c in mine):
        return "(provisional)"
    levels = {round(1 - c["alpha"], 6) for c in wall if c.get("alpha") is not None and c.get("verdict") != "provisional"}
    if len(levels) == 1:
        return f"[{level_pct(1 - levels.pop())} CI]"
    return "[CI, levels below]" if levels else "[95% CI]"


def level_note(comparisons: list[dict]) -> str:
    """One line on the wall intervals' levels where e-BY gave them different ones ("" otherwise).
    Only the comparisons with a level of their own (``alpha``: a run's paired lockstep comparisons);
    a merged report's unpaired ones between runs have none (stats.compare; it raised KeyError)."""
    wall = [c for c in comparisons if c.get("metric") == "wall_us" and c.get("alpha") is not None]
    decided = [c for c in wall if c.get("verdict") != "provisional"]
    levels = {round(c["alpha"], 9) for c in decided}
    fam = (decided[0].get("family_alpha") or stats.FAMILY_ALPHA) if decided else stats.FAMILY_ALPHA
    runs = {c.get("run_id") for c in decided}  # a merged report: each run's own (results.merge)
    if len(levels) == 1 and decided[0]["alpha"] < fam - 1e-9:
        # one level above the family's: the column head said "[97.5% CI]" with no word of why (new-user trial)
        held = (f"e-BY holds each run's wall-time verdicts together at {level_pct(fam)} (runs of "
                + ", ".join(sorted({str(c.get('family_size') or '?') for c in decided}, key=lambda x: (len(x), x)))
                + " comparisons)" if len(runs) > 1 else
                f"e-BY holds the run's {len(decided)} wall-time verdicts together at {level_pct(fam)}")
        # (a merge of runs whose levels coincide had read "the run's 8 verdicts", each run's family being
        # its own 4: new-user trial)
        return f"every wall interval at {level_pct(decided[0]['alpha'])}: {held}, so each alone is at a higher level"
    if len(levels) < 2:
        return ""
    return (f"interval levels (e-BY over the wall-time comparisons of {'each run' if len(runs) > 1 else 'the run'}): "
            + level_groups(wall))


def cpu_state_note(comparisons: list[dict]) -> str:
    """What ``sampling.cpu_state: usual`` did to a run's comparisons (their ``state_dropped`` and
    ``usual_probe_us``, stats.set_compare ``probes``), in a sentence; "" for a run that counted every
    turn. The speed is each comparison's own (its first set's most common probe reading), so the
    sentence gives their range."""
    cyc = [x for x in comparisons if x.get("metric") in ("wall_us", "host_us") and "state_dropped" in x]
    if not cyc:
        return ""
    n = sum(x.get("state_dropped") or 0 for x in cyc)
    us = sorted(x["usual_probe_us"] for x in cyc if isinstance(x.get("usual_probe_us"), (int, float)))
    if us:
        where = ("the CPU speed most of the comparison's first set ran at (the speed probe reading "
                 + f"{us[0]:.2f} µs" + (f" to {us[-1]:.2f} µs" if us[-1] > us[0] * 1.005 else "") + ")")
    else:  # runs of 2026-12-04 15:16-15:44 UTC: the level taken from every earlier set, not recorded
        where = "the CPU speed most of the comparison's earlier sets ran at (set by set, so it can change within a run)"
    return (f"only the turns in which both versions ran at {where} count (sampling.cpu_state: usual, within "
            f"{math.exp(stats.STATE_REACH):.1f}x "
            f"of it), so {'each ratio' if us else 'each set ratio'} is the one at that speed: "
            f"{n} of the run's wall and host turns ran at another speed and were left out; the µs shown are over "
            f"every turn")


#: How a merged report's rows between runs were computed (results.merge: stats.compare on the sets as
#: independent groups): said wherever the report defines its ratios.
MERGED_DEF = ("between runs (an env from another run than the baseline's): the ratio of the two runs' medians of "
              "per-set medians, not paired (the runs did not take turns on one core), and provisional on the wall "
              "and host clocks: they follow the CPU speed each run met, which differs between runs more than "
              "an interval from the runs' own sets allows for (between runs of one build on the H200 the wall "
              "ratio spread 14 %, and such intervals called the build faster or slower than itself in 24 % of "
              "comparisons), so those get no interval and no verdict")
#: :data:`MERGED_DEF`'s end where the runs have a kernel clock (CUDA); CPU runs have none to decide.
MERGED_KERNEL = ("; kernel and CUDA-graph time get a fixed-n 95 % interval (a two-level bootstrap over sets, "
                 "widened to a Welch t interval where that is wider) and a verdict")


def merged_def(comparisons: list[dict]) -> str:
    """:data:`MERGED_DEF`, with :data:`MERGED_KERNEL` where some comparison between runs is of a GPU
    clock (second new-user trial: a CPU-only merge's note promised kernel verdicts)."""
    gpu = any(c.get("paired") is False and c.get("metric") in ("device_us", "graph_us") for c in comparisons)
    return MERGED_DEF + (MERGED_KERNEL if gpu else "")


def ratio_definition(comparisons: list[dict], method: str | None = None, speed_adjust: bool | None = None,
                     merged: bool = False, sets: list | None = None) -> str:
    """How the run's ratios were computed (:func:`_ratio_definition`); ``merged`` (results.merge): the
    rows between runs are defined apart (:data:`MERGED_DEF`; new-user trial: a merged report's legend
    called every ratio "paired cycle by cycle"); ``sets``: the run's set records, whose ``pinned`` says
    whether its workers shared one core (second new-user trial: "all pinned to one CPU core" in a run
    whose every set ran unpinned)."""
    unp = [c for c in comparisons if c.get("paired") is False] if merged else []
    if not unp:
        return _ratio_definition(comparisons, method, speed_adjust, sets)
    own = [c for c in comparisons if c.get("paired") is not False]
    if not any(c.get("metric") == "wall_us" for c in own):
        return merged_def(comparisons)  # lower case: it follows "candidate / baseline wall time, " (legend, Markdown)
    return "within a run: " + _ratio_definition(own, method, speed_adjust, sets) + "; " + merged_def(comparisons)


def _ratio_definition(comparisons: list[dict], method: str | None = None, speed_adjust: bool | None = None,
                      sets: list | None = None) -> str:
    """How the run's ratios were computed: lockstep process sets with an anytime-valid interval (current
    method; ``method`` = the results' ``settings.method``, which names it even when nothing was compared
    yet, e.g. a run interrupted in its first set); for results/1 runs, paired by round with a trimmed
    mean, paired with a median (results written before trimming) or, for results written before pairing
    existed or with unequal rounds, as the ratio of medians of per-process medians. ``sets``: the run's
    set records (:func:`ratio_definition`), whose ``pinned`` says how the workers were placed."""
    wall = [c for c in comparisons if c.get("metric") == "wall_us"]
    lockstep = str(method or "").startswith("lockstep-sets")
    if (wall and all(c.get("ci_method") == "lockstep sets, anytime t-CS" for c in wall)) or (lockstep and not wall):
        c = wall[0] if wall else {}
        speed = ("; each burst's value is taken at one reference CPU speed (a fixed piece of Python timed between "
                 "its samples reads the CPU's speed of the moment; the case's slope of call time on it, measured "
                 "within each worker in the earlier bursts, moves every sample there; the µs shown are the plain "
                 "burst medians)" if speed_adjust else "")
        glitch = ""
        one_set = bool(wall) and all(x.get("verdict") == "provisional" for x in wall)  # --quick, or one set so far
        if method not in results.GUARDLESS_METHODS and lockstep and not one_set:  # (no fourth set: no stall guard)
            n = sum(x.get("dropped_cycles") or 0 for x in comparisons if x.get("metric") in ("wall_us", "host_us"))
            pinned = "" if method in results.GUARD_EVERY_SET_METHODS else " of a pinned set"  # /5: pinned sets only
            glitch = (f" (from the fourth set on, a turn{pinned} whose ratio is twice or half the comparison's ratio in "
                      f"the earlier sets is left out as a stall, not a version's cost: {n} of the "
                      + ("runs'" if len({x.get("run_id") for x in wall}) > 1 else "run's") + " wall and host turns)")
        state = cpu_state_note(comparisons)
        if state:
            glitch += "; " + state
        recs = [s for s in sets or [] if isinstance(s, dict) and "pinned" in s]
        unpinned = sum(1 for s in recs if not s["pinned"])
        pin = ("all pinned to one CPU core" if not unpinned else
               "unpinned: the OS placed them" if unpinned == len(recs) else
               f"pinned to one CPU core, but for {unpinned} of the {len(recs)} sets, which ran unpinned")
        same_core = "" if unpinned else "on the same core "
        how = (f"each process set (fresh workers of every version, {pin}) timed every case in "
               f"turns of a few ms, so the versions' calls being compared ran {same_core}within ms of each "
               f"other{speed}; per set, the trimmed mean of those paired ratios{glitch}; the interval is an "
               f"anytime-valid confidence sequence over the sets (Lai's t-mixture)")
        m, fa = c.get("family_size") or len(wall), c.get("family_alpha", 0.05)
        if one_set:
            return how + "; with one process set there is no interval yet: the ratios are provisional, no verdict"
        if method in results.BONFERRONI_METHODS or (wall and "selection" not in c):
            return (how + f" at {level_pct(c.get('alpha', 0.05))} per comparison, so all {m or 'the'} wall-time verdicts "
                    f"of the run hold together with {level_pct(fa)} confidence however early sampling stopped "
                    f"(the same interval decided when to stop)")
        guarantee = (f"which keeps the expected share of shown intervals missing their true ratio at <= {alpha_pct(fa)}, "
                     f"and, were no version different at all, the chance of any false faster/slower verdict at "
                     f"<= {alpha_pct(fa)}, however early sampling stopped (the same intervals decided when to stop); "
                     f"host, device and graph comparisons are held together the same way, each clock on its own")
        if not wall:  # e.g. a run interrupted in its first set
            return (how + f"; the m wall-time comparisons are held together by e-BY (Xu, Wang & Ramdas): k comparisons "
                    f"decided alike are shown at 1 - {alpha_pct(fa)}·k/m, the rest at 1 - {alpha_pct(fa)}/m, " + guarantee)
        return (how + f"; the {m} wall-time comparisons are held together by e-BY (Xu, Wang & Ramdas): "
                f"k comparisons decided alike are shown at 1 - {alpha_pct(fa)}·k/{m} -- here {level_groups(wall)} -- "
                + guarantee)
    if wall and all(c.get("ci_method") == "paired trimmed t" for c in wall):
        return ("trimmed mean over rounds of the per-round ratio (each round's two processes ran back to back; "
                "20% trimmed, none with fewer than 7 rounds); 95% CI: Tukey-McLaughlin trimmed t interval over rounds")
    if wall and all(c.get("paired") for c in wall):  # results written by matrix-run before trimming
        return ("median over rounds of the per-round ratio (each round's two processes ran back to back); "
                "95% CI from a two-level bootstrap (processes, then samples), t-widened")
    return "ratio of the medians of per-process medians; 95% CI from a two-level bootstrap (processes, then samples)"


#: A set's CPU steal (runner: the hypervisor's share of the set core's time over its cycles) from
#: which the report says the intervals were widened by the machine.
STEAL_WARN = 0.05


def steal_note(sets: list[dict]) -> str:
    """One sentence when CPU steal reached :data:`STEAL_WARN` in some process set ("" otherwise):
    a cloud VM's hypervisor ran something else on the set's core while its bursts were timed,
    which cuts into bursts at random and widens the intervals (a 2-core CPU VM: 20-50 % steal in
    the minutes its A/A intervals went from +-1-3 % to +-10-20 %, benchmarks/results/cpu-selfcheck-*.txt)."""
    st = [r.get("steal") for r in sets if isinstance(r.get("steal"), (int, float))]
    high = [v for v in st if v >= STEAL_WARN]
    if not high:
        return ""
    return (f"CPU steal: the hypervisor took up to {max(high):.0%} of the time on a set core (≥ {STEAL_WARN:.0%} "
            f"in {len(high)} of {len(st)} sets, /proc/stat): it interrupts bursts at random, so the intervals "
            "are wider than this machine gives when it is quiet; a dedicated machine or a quieter hour narrows them")


#: Share by which two runs' median speed-probe readings may differ before ``compare`` warns
#: (commands.machine_differences) -- the reports name it too (:func:`probe_note`).
PROBE_SPEED_WARN = 0.15


def probe_median_us(doc: dict, env: str | None = None) -> float | None:
    """The median of every CPU-speed probe reading of a run's wall bursts (µs; worker.speed_probe:
    the same pure-Python work in every worker of every version, timed between a burst's samples),
    or None for a run without them; ``env``: that env's bursts only. On the H200 machine it reads
    ~3.5 µs in the CPU's fast state and ~6.5-7.5 µs in its slow one
    (reports/h200-2.6.3-vs-2.7.0.post2-12-03-m3-5: 3.5, -m3-4: 6.5)."""
    vals = []
    for c in doc.get("cases") or []:
        if env is not None and c.get("env") != env:
            continue
        for per_set in (((c.get("metrics") or {}).get("wall_us") or {}).get("ref_by_set") or {}).values():
            for v in (per_set.values() if isinstance(per_set, dict) else per_set or []):
                if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
                    vals.append(float(v))
    return statistics.median(vals) if vals else None


def probe_note(res: dict) -> str:
    """One sentence on the CPU speed the run met ("" for a run without speed-probe readings): host
    overhead, and the ratio of versions that differ in it, follow the CPU's speed (H200, 2026-12-03:
    2.6.3's batch-2 forward call 50 µs at a probe median of 6.5 µs, 32 µs at 3.5 µs; B512 S50 fwd
    ratio 1.17x vs 1.11x), so runs are comparable at like readings."""
    m = probe_median_us(res)
    if m is None:
        return ""
    sets = [s for s in res.get("sets") or [] if isinstance(s.get("hops"), int)]
    hop = ""
    idle = (res.get("timing") or {}).get("cpu_hop_idle")
    idle = idle if isinstance(idle, str) and idle else None
    if idle and not any(s["hops"] for s in sets):  # runner.run_all: sampling.cpu_hop was on and could do nothing
        hop = f"; sampling.cpu_hop was on but did nothing: {idle}"
    elif sets:  # sampling.cpu_hop (lockstep.Hopper): what the sets did, not the setting
        moves, moved = sum(s["hops"] for s in sets), sum(1 for s in sets if s["hops"])
        hop = (f"; {moved} of {len(sets)} process sets moved between CPUs to follow the fast speed "
               f"(sampling.cpu_hop: {moves} moves between cycles)" if moves else
               f"; sampling.cpu_hop was on, but none of its {len(sets)} process sets moved")
        dead = sum(1 for s in sets if (s.get("scout") or {}).get("alive") is False
                   and s.get("status") != "interrupted")  # an interrupt stops the scout first
        if dead:  # lockstep.Hopper.health: no readings, so no move (its log: scout.log in the work dir)
            hop += f" (its CPU scout had stopped by the end of {dead} of them)"
        if idle:  # a --resume where it could not act, after a part whose sets moved (it had hidden those moves)
            hop += f"; in one part of the run (a --resume) it could do nothing: {idle}"
    shares = [s["probe_share"] for s in res.get("sets") or [] if isinstance(s.get("probe_share"), (int, float))]
    st = res.get("settings") or {}
    first = stats.recorded_min_sets(st)
    if shares:  # sampling.probe_share: estimated (runner.apply_probe_share: pinned sets after the first few)
        rng = f"{min(shares):.2f}" + (f"-{max(shares):.2f}" if max(shares) > min(shares) else "")
        capped = (f", up to a set-wide {st['probe_first_reach']:g} in log from the workers' mean"
                  if isinstance(st.get("probe_first_reach"), (int, float)) else "")
        hop += (f"; in {len(shares)} process set{'s' if len(shares) != 1 else ''} the speed adjustment counted {rng} of "
                "each set's between-worker probe difference, the share the earlier pinned sets' calls followed "
                f"(sampling.probe_share: estimated; the first {first} pinned sets counted all of it{capped})")
    elif (st.get("probe_share") == "estimated" and not st.get("quick") and not results.is_merge(res)
          and sum(1 for e in res.get("envs") or [] if e.get("status") == "ok") >= 2
          and any(s.get("pinned") for s in res.get("sets") or [])):
        # only where a share could have come (2+ envs, pinned sets, not --quick: review), so the reason is this one
        hop += (f"; sampling.probe_share: estimated, but no set came after {first} earlier "
                "pinned sets, so every set counted its whole between-worker probe difference")
    held = sum(1 for s in res.get("sets") or [] if s.get("probe_held"))
    if held:  # runner.apply_probe_share: beyond stats.PROBE_SHARE_REACH times the earlier sets' largest,
        # or, before a share, beyond stats.PROBE_FIRST_REACH
        reach = st.get("probe_share_reach") or stats.PROBE_SHARE_REACH
        first_reach = st.get("probe_first_reach") or stats.PROBE_FIRST_REACH
        hop += (f"; in {held} process set{'s' if held != 1 else ''} the workers' probes differed by more than the "
                f"adjustment counts (before a share is estimated: {first_reach:g} in log from their mean; after: "
                f"{reach:g}x the earlier sets' largest difference), and only that much counted (a share is not "
                "carried beyond the differences it was estimated on)")
    read = f"a median of {m:.2f} µs in this run"
    if results.is_merge(res):  # results.merge: one median over several runs' states means nothing
        per = [(e.get("label"), probe_median_us(res, e.get("label"))) for e in res.get("envs") or []]
        per = [f"{v:.2f} µs ({lab})" for lab, v in per if v is not None]
        read = f"medians of {', '.join(per)} in the {len(res['merged_from'])} merged runs"
    return (f"CPU speed: the speed probe (the same Python work in every worker, timed between the samples of a "
            f"burst) read {read}{hop}; host overhead follows the CPU speed, so compare "
            "the µs and host-heavy ratios of runs at like readings (matrix-run compare warns when two runs differ by "
            f"more than {PROBE_SPEED_WARN * 100:.0f} %)")


def config_overrides(res: dict) -> list[str]:
    """What the run's command line set over its config's ``sampling`` (``--time-budget 30``...), as
    "--FLAG VALUE" strings, "(the config: V)" where the config gave that key: the config block shows
    the config as read, and without this a reader takes its numbers for the run's (new-user trial).
    Only the flags on the run's recorded command (config.SAMPLING_FLAGS; a comparison with today's
    defaults had credited the command line with an older default), with the value the run recorded
    in ``settings`` (a ``--quick`` run's ``set_seconds`` is its quick set's)."""
    settings = res.get("settings") or {}
    conf = res.get("config")
    samp = conf.get("sampling") if isinstance(conf, dict) else None
    samp = samp if isinstance(samp, dict) else {}
    argv = [str(a) for a in res.get("command") or []]
    out = []
    for flag, key in SAMPLING_FLAGS.items():
        if not any(a == flag or a.startswith(flag + "=") for a in argv):
            continue
        v = settings.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        given = samp.get(key)
        out.append(f"{flag} {v:g}" + (f" (the config: {given:g})" if isinstance(given, (int, float))
                                         and not isinstance(given, bool) else ""))
    return out


def rejudged_note(res: dict) -> str:
    """One sentence when `report --min-effect X` recomputed the verdicts (results.merge records
    ``rejudged``): the verdicts and "same" zone here are at X, not at the run's own min_effect,
    which its config and command still show. "" otherwise."""
    r = res.get("rejudged")
    if not isinstance(r, dict) or not isinstance(r.get("min_effect"), (int, float)):
        return ""
    own = r.get("run_min_effect")
    return (f"Verdicts recomputed by `matrix-run report --min-effect {r['min_effect']:g}`: \"same\" means within "
            f"±{r['min_effect']:.0%} here" + (f", where the run itself used ±{own:.0%} (its config and command show "
                                                 "that)" if isinstance(own, (int, float)) else "") + ".")


def half_width_pct(c: dict) -> float | None:
    """A comparison's interval half-width, as the README's ± column gives it: the larger side of
    [ci_low, ci_high] around the ratio, in % of the ratio, each side measured by the factor it spans
    (hi / ratio - 1, ratio / lo - 1); None when unbounded or missing. benchmarks/widths.py's ``hw``
    is this figure too (it measured the sides in ratio units before 2026-12-05: the same for the
    confidence sequence's intervals, symmetric in log, and different for 6 of the 4,390 committed
    wall comparisons, bootstrap intervals of results/1 runs)."""
    r, lo, hi = c.get("ratio"), c.get("ci_low"), c.get("ci_high")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (r, lo, hi)):
        return None
    return 100 * max(r / lo - 1, hi / r - 1)


def short_name(names: dict, case_id, rec: dict) -> str:
    """A case's short name in the report's notes: ``names`` (view_model's ``case_names``) by case id,
    else the record's (a case or comparison) label and op."""
    return names.get(case_id) or f"{rec.get('label', '')} {rec.get('op', '')}".strip()


def wide_note(comparisons: list[dict], names: dict, min_effect: float, n_sets: int | None = None,
              stopped: str | None = None, run_dir: str | None = None) -> str:
    """One line for the terminal naming the run's wide wall intervals and what they are made of: an
    "ambiguous" one wider than ±``min_effect`` (too wide to say "same") or any one wider than twice
    it, at most three, widest first, each with its sets' ratio range (and, where it had fewer than
    the run's ``n_sets``, how many: a case decided early or, with ``sampling.cpu_state: usual``,
    one whose turns at another speed were left out). Where the sets' range is narrower than the
    interval, the width comes from too few sets (a longer --time-budget narrows it: FA4's batch-2
    forward at ±53 % with 5 sets of 1.35-1.48x, second new-user trial); else from the sets' own
    spread, which the HTML report's set chart shows as noise about one level or a jump between
    levels (the H200's batch-2 forward on 2026-12-05: ±12 %, sets 1.89-3.05x, in a mode of the
    machine; benchmarks/heavy_mode.py). ``names``: {case id: short name} (view_model's
    ``case_names``); ``stopped``: the run's stop reason -- one that stopped on its max_sets gets more
    sets from a larger max_sets, not a longer budget (second new-user trial), ``run_dir`` naming the
    resume that adds them. "" when no interval is that wide."""
    pairs = len({(x.get("baseline"), x.get("candidate")) for x in comparisons if x.get("metric") == "wall_us"})
    wide = []
    for c in comparisons:
        hw = half_width_pct(c)
        logs = c.get("set_log_ratios") or []
        if c.get("metric") != "wall_us" or c.get("paired") is False or hw is None or len(logs) < 3:
            continue
        if not (hw > 200 * min_effect or (c.get("verdict") == "ambiguous" and hw > 100 * min_effect)):
            continue
        who = short_name(names, c.get("case"), c)
        pair = f" ({c.get('candidate')})" if pairs > 1 else ""
        of = f" of {n_sets}" if n_sets and len(logs) < n_sets else ""
        few = (max(logs) - min(logs)) < math.log(c["ci_high"] / c["ci_low"])
        wide.append((hw, few, f"{who}{pair} ±{hw:.1f}% (its {len(logs)}{of} sets {math.exp(min(logs)):.2f}-"
                              f"{math.exp(max(logs)):.2f}x{', few sets' if few else ''})"))
    if not wide:
        return ""
    wide.sort(key=lambda t: -t[0])
    shown = wide[:3]
    more = f" and {len(wide) - 3} more" if len(wide) > 3 else ""
    head = "widest intervals: " + ", ".join(t for _, _, t in shown) + more + ": "
    fews = [f for _, f, _ in shown]
    spread = ("the HTML report's set chart shows whether a case's sets scatter about one level (noise: more sets "
              "narrow it) or jump between levels (the machine changed state during the run: the ratio itself moved)")
    few_txt = "the sets agree but are few, so a longer --time-budget narrows the interval"
    if isinstance(stopped, str) and stopped.startswith("max_sets"):
        few_txt = ("the sets agree but are few: the run stopped on its max_sets, so more sets narrow the interval: "
                   + (f"matrix-run --resume {shlex.quote(run_dir)} --max-sets N" if run_dir else "a larger --max-sets"))
    if all(fews):
        return head + few_txt
    if any(fews):
        return head + "where marked few sets, " + few_txt + "; for the others " + spread
    return head + spread


#: Groups of sets whose speed-probe medians differ by this factor or more: the CPU's speed state
#: (which the probe reads and the speed adjustment should have taken out), not a mode it does not read
#: (new-user trial: `-12-04-3/`'s 3 "usual" sets had read the probe 2x faster; `h200-aa-57/` reads 3.62
#: vs 6.61 µs with every set at one reference speed; benchmarks/heavy_mode.py uses the same 1.3x)
PROBE_SAME = 1.3


def machine_modes(res: dict, names: dict, min_effect: float) -> dict | None:
    """The run's process sets split by a common slowdown left after the CPU-speed adjustment
    (stats.set_slowdown_index over every (env, case) wall series, stats.mode_split), and the wall
    comparisons whose ratio moved with it (stats.ratio_by_mode: the two groups' set ratios differ by
    more than ``min_effect`` at p < 0.01). Seen on the H200 on 2026-12-05: batch-2 forward 2.00x in
    10 sets, 2.72x in the 16 whose median call ran ~1.19x slower, the speed probe reading 7.57 vs 7.77
    µs (reports/h200-2.6.3-vs-2.7.0.post2-12-05-12/). Conservative: the index is a median over the
    cases, so a mode that slows only half of them (the A/A runs `aa-117/` to `-119/` of that hour,
    benchmarks/heavy_mode.py) can stay under the threshold.
    Each set's values are taken to one reference CPU speed for the whole run (the median of the sets'
    adjustment centres, with each set's slope): the adjustment's own centre drifts over a run.
    Returns {"slow": [set ids], "usual": [...], "factor" (the median call's slowdown), "n_sets",
    "probe_us": (usual, slow) medians of the speed probe (µs; None without readings), "probe_read":
    whether they differ by :data:`PROBE_SAME` or more, "moved": [{"name", "pair", "usual", "slow",
    "n_usual", "n_slow", "p", "ci_low", "ci_high"}], "per_case": [{"name", "env", "usual_us",
    "slow_us", "factor"}] (each case and env: the median over each group's sets of the set's median
    burst, µs per call at one reference CPU speed for the run, and their ratio: what slowed; None
    where the case was not timed in that group)}, or None: no such split, a
    merged report (set ids repeat across runs) or a run without lockstep sets. ``names``:
    view_model's ``case_names``."""
    if results.is_merge(res):
        return None

    def set_medians(by) -> dict:
        med = {}
        for k, v in (by.items() if isinstance(by, dict) else ()):
            vals = [x for x in (v.values() if isinstance(v, dict) else v or [])
                    if isinstance(x, (int, float)) and math.isfinite(x) and x > 0]
            if vals:
                med[str(k)] = statistics.median(vals)
        return med

    walls = [((c.get("metrics") or {}).get("wall_us") or {}) if c.get("status") == "ok" else {}
             for c in res.get("cases") or []]
    # one reference CPU speed for the whole run: each set's values were taken at the adjustment's
    # centre of the moment, which drifts over a run (new-user trial: 4.1 -> 6.6 µs over h200-aa-89's
    # sets made its later sets read ~1.4x slower at a slope of 0.72, a split of the adjustment's own)
    centres = [v.get("center") for w in walls for v in (w.get("speed_by_set") or {}).values()
               if isinstance(v, dict) and isinstance(v.get("center"), (int, float)) and v.get("center")]
    ref = statistics.median(centres) if centres else None
    series, named, probes = [], [], {}
    for c, wall in zip(res.get("cases") or [], walls):
        med = set_medians(wall.get("by_set"))
        speed = wall.get("speed_by_set") or {}
        for k in list(med):
            sp = speed.get(k) if isinstance(speed, dict) else None
            b, ctr = (sp.get("beta"), sp.get("center")) if isinstance(sp, dict) else (None, None)
            if ref is not None and isinstance(b, (int, float)) and isinstance(ctr, (int, float)) and ctr:
                med[k] *= math.exp(-b * (ctr - ref))  # log y at ref = log y at ctr - beta (ctr - ref)
        series.append(med)
        named.append((c, med))
        for k, v in set_medians(wall.get("ref_by_set")).items():
            probes.setdefault(k, []).append(v)
    split = stats.mode_split(stats.set_slowdown_index(series))
    if not split:
        return None
    per_case = []  # what slowed: each (case, env)'s µs in each group of sets
    for c, med in named:
        u = [med[k] for k in split["usual"] if k in med]
        w = [med[k] for k in split["slow"] if k in med]
        if u or w:  # a case decided early was not timed in later sets: its row says so (new-user trial)
            mu, mw = (statistics.median(u) if u else None), (statistics.median(w) if w else None)
            per_case.append({"name": short_name(names, c.get("id"), c),
                             "env": c.get("env"), "usual_us": mu, "slow_us": mw,
                             "factor": mw / mu if mu and mw else None})
    pr = [[statistics.median(probes[k]) for k in split[g] if k in probes] for g in ("usual", "slow")]
    probe_us = (statistics.median(pr[0]), statistics.median(pr[1])) if all(pr) else None
    moved = []
    for c in res.get("comparisons") or []:
        logs, sets = c.get("set_log_ratios") or [], c.get("sets") or []
        if c.get("metric") != "wall_us" or c.get("paired") is False or len(logs) != len(sets) or not logs:
            continue
        r = stats.ratio_by_mode(sets, logs, split, min_effect)
        if r and r["differs"]:
            who = short_name(names, c.get("case"), c)
            moved.append(dict(r, name=who, pair=(c.get("baseline"), c.get("candidate")), case=c.get("case"),
                              ci_low=c.get("ci_low"), ci_high=c.get("ci_high")))
    return {"slow": split["slow"], "usual": split["usual"], "factor": split["factor"],
            "n_sets": len(split["slow"]) + len(split["usual"]), "probe_us": probe_us,
            "probe_read": bool(probe_us and max(probe_us) >= PROBE_SAME * min(probe_us)),
            "moved": moved, "per_case": per_case}


def mode_note(modes: dict | None, terse: bool = False) -> str:
    """:func:`machine_modes` in a sentence: the two groups of sets, how much slower the median call
    ran in the slower one (and the range over cases and versions), whether the speed probe read it,
    and each comparison whose ratio moved with it (at most four named with ``terse``, the
    terminal's), with where the run's interval lies against the two levels (new-user trial: it had
    said the interval "covers both", true of none of the 18 named in the committed runs: the run's
    ratio is a mean over its sets, so it lies between the levels). "" for None, and with ``terse``
    also when no ratio moved (the terminal stays quiet; the HTML and Markdown say it)."""
    if not modes or (terse and not modes["moved"]):
        return ""
    per = [x for x in modes.get("per_case") or [] if x.get("factor") is not None]
    fs = sorted(x["factor"] for x in per)
    gone = len(modes.get("per_case") or []) - len(per)
    spread = (f" (by case and version {fs[0]:.2f}-{fs[-1]:.2f}x" + (f", over the {len(per)} timed in both groups"
              if gone else "") + ")") if len(fs) > 1 else ""
    head = (f"machine mode: the run's {modes['n_sets']} process sets fell into two groups; in "
            f"{len(modes['slow'])} of them the median call ran ~{modes['factor']:.2f}x slower than in the other "
            f"{len(modes['usual'])}{spread}, at one reference CPU speed (after the speed adjustment)")
    pu = modes.get("probe_us")
    if pu:
        read = f"; the speed probe read {pu[0]:.2f} µs in the other sets and {pu[1]:.2f} µs in the slower ones"
        if not modes.get("probe_read"):
            head += read + f" (within {PROBE_SAME:g}x): a state of the machine it does not read"
        elif pu[1] > pu[0]:
            head += read + (": the CPU's slow speed state, which the adjustment did not fully take out "
                            "(sampling.cpu_state: usual counts only the turns at one CPU speed)")
        else:
            head += read + ": the probe read the slower sets faster, so not a CPU speed it reads"
    moved = modes["moved"]
    if not moved:
        return head + ("; no ratio differed between the two groups (Welch's t test on the sets' ratios at p under "
                       "0.01, by more than the minimum effect): both versions met it alike")
    pairs = len({m["pair"] for m in moved}) > 1
    shown = moved[:4] if terse else moved
    items = [f"{m['name']}{' (' + str(m['pair'][1]) + ')' if pairs else ''} {m['usual']:.2f}x / {m['slow']:.2f}x"
             for m in shown]
    more = f" and {len(moved) - len(shown)} more" if len(moved) > len(shown) else ""
    between = all(isinstance(m.get("ci_low"), (int, float)) and isinstance(m.get("ci_high"), (int, float))
                  and min(m["usual"], m["slow"]) <= m["ci_low"] and m["ci_high"] <= max(m["usual"], m["slow"])
                  for m in moved)
    tail = ("each of these intervals lies between its two levels: it holds the mix of sets this run met, "
            "and a run meeting the slower group in more or fewer sets lands elsewhere" if between else
            "such a ratio is a mean over the mix of sets this run met, and a run meeting the slower group in more "
            "or fewer sets lands elsewhere")
    return (head + "; ratios that moved with it (median over the other sets / over the slower ones): "
            + ", ".join(items) + more + ". " + tail[0].upper() + tail[1:])


def safe_modes(res: dict, names: dict, min_effect: float) -> dict | None:
    """:func:`machine_modes`, or None if it fails on an odd results file (an explanation must never cost
    the report)."""
    try:
        return machine_modes(res, names, min_effect)
    except Exception:  # noqa: BLE001
        return None


def shown_gap(rows: list[dict]) -> float | None:
    """How far, at most, a wall comparison's ratio lies from the ratio of the two wall medians the table
    shows beside it: max over comparisons of |ratio / (candidate median / baseline median) - 1|, in %.
    The ratio is paired cycle by cycle (and taken at one CPU speed), the µs are plain burst medians, so
    the two differ (on the H200 by up to ~10 % where a version's set medians fall into two groups;
    the terminal legend said that figure on every machine until a new-user trial found it on a CPU run).
    ``rows``: view_model's rows. None when no comparison has a ratio and both medians."""
    gaps = []
    for r in rows:
        for c in r["comps"]:
            w = c.get("wall")
            ratio = w.get("ratio") if w else None
            meds = [((r["by_env"].get(lab) or {}).get("m") or {}).get("wall_us") for lab in (c["baseline"], c["candidate"])]
            if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0) or not all(meds):
                continue
            b, k = meds[0].get("median"), meds[1].get("median")
            if isinstance(b, (int, float)) and isinstance(k, (int, float)) and b > 0 and k > 0 and math.isfinite(b / k):
                gaps.append(abs(ratio / (k / b) - 1) * 100)
    return max(gaps) if gaps else None


#: Said of a merged report's comparisons between runs (new-user trial: two runs of the same wheels
#: three minutes apart were merged into "2.6.3' vs 2.6.3: faster in 2/4 cases", the legend alone
#: saying they were unpaired).
BETWEEN_NOTE = ("Between runs: these two were not timed in turns, so a change of the machine between the runs "
                "(CPU speed, load, clocks) counts as a difference as much as the code's.")
#: Added to :data:`BETWEEN_NOTE` where the runs have a kernel clock (not a CPU run: second new-user trial).
BETWEEN_KERNEL = " Kernel time, a GPU clock, keeps its verdicts."


#: The headline's word on a comparison between runs of one build (:func:`same_build`).
SAME_BUILD_TAG = "the same build: a difference is the machine's"


def same_build(a: dict | None, b: dict | None) -> str | None:
    """A sentence when env records ``a`` and ``b`` (results.json ``envs``) hold the same flash-attn
    wheel (build.wheel_sha256) on the same torch: then any difference between them is not the code's.
    None when either is unknown or they differ."""
    wa, wb = (((e or {}).get("build") or {}).get("wheel_sha256") for e in (a, b))
    if not wa or wa != wb or (a or {}).get("torch") != (b or {}).get("torch"):
        return None
    return (f"Both are the same wheel (sha256 {str(wa)[:12]}…) on the same torch"
            + (f" {a.get('torch')}" if a.get("torch") else "") + ": every difference here is the machine's "
            "between the runs, not the code's.")


def gate_line(res: dict) -> str | None:
    """The run's ``--fail-on-regression`` outcome as stored in results.json ``gate``
    (pipeline.gate_outcome), for the report's head; None for a run without the gate (or a merged or
    re-rendered report, whose verdicts are not the run's: results.merge drops it)."""
    g = res.get("gate")
    return str(g["text"]) if isinstance(g, dict) and g.get("text") else None


def view_model(res: dict, with_charts: bool = False, run_dir: str | None = None) -> dict:
    """Reshape results for templates: per case rows with each env's clocks and each comparison.
    ``run_dir``: the folder of the run's results.json, named in an interrupted run's summary
    (:func:`summarize`)."""
    envs = res.get("envs", [])
    labels = [e["label"] for e in envs]
    ok_labels = [e["label"] for e in envs if e["status"] == "ok"]
    base = ok_labels[0] if ok_labels else None
    cases = res.get("cases", [])
    settings = res.get("settings") or {}
    min_effect = settings.get("min_effect") or 0.05
    by = {(c["env"], c["id"]): c for c in cases}
    ids = list(dict.fromkeys(c["id"] for c in cases))
    dtypes = {c.get("dtype") for c in cases}
    short, common = short_labels(cases)
    # the run's comparisons as (baseline, candidate) pairs (stats.comparison_pairs: each env against
    # the first, or within each torch and each version of a version x torch matrix)
    pairs = results.env_pairs(envs)
    if results.is_merge(res):  # a merged report: its comparisons' own pairs (each run's own, and
        # each env of a later run against the baseline: results.merge)
        pairs = list(dict.fromkeys((c.get("baseline", base), c["candidate"]) for c in res.get("comparisons") or []
                                   if c.get("metric") == "wall_us")) or pairs
    one_base = all(b == base for b, _ in pairs)
    names = [k if one_base else f"{k} vs {b}" for b, k in pairs]
    cmps = {}
    for c in res.get("comparisons", []):
        cmps[(c.get("baseline", base), c["candidate"], c["case"], c["metric"])] = c
    rows = []
    for cid in ids:
        any_case = next(by[(lab, cid)] for lab in labels if (lab, cid) in by)
        per_env = []
        for lab in labels:
            c = by.get((lab, cid))
            if c is None:
                continue
            m = c.get("metrics") or {}
            per_env.append({"label": lab, "case": c, "m": {k: m.get(k) for k in METRIC_NAMES}})
        comps = []
        for (b, lab), nm in zip(pairs, names):
            comps.append({"candidate": lab, "baseline": b, "name": nm,
                          **{k: cmps.get((b, lab, cid, f"{k}_us")) for k in ("wall", "host", "device", "graph")}})
        host_bound = [e["label"] for e in per_env if e["case"].get("host_bound")]
        rows.append({"id": cid, "label": any_case.get("label", cid), "short": short.get(cid, cid),
                     # the whole label, with the dtype where the run has several (the Markdown table's: two
                     # rows of one shape in fp16 and bf16 had read alike, second new-user trial)
                     "full_label": str(any_case.get("label", cid)) + (f" {any_case.get('dtype')}" if len(dtypes) > 1 else ""),
                     "op": any_case.get("op"), "case": any_case, "envs": per_env, "comps": comps,
                     "by_env": {e["label"]: e for e in per_env}, "host_bound": host_bound})
    name = {r["id"]: f"{r['short']} {r['op']}" for r in rows}
    summaries = []
    for j, (b_lab, cand) in enumerate(pairs):
        # a comparison's impl is its case's (comparisons written before impl was stored lack it)
        pick = lambda k: [dict(c[k], impl=r["case"].get("impl", "flash_attn"))  # noqa: E731
                          for r in rows for c in r["comps"][j:j + 1] if c[k]]
        walls, devices = pick("wall"), pick("device")
        s = summarize(walls, len(rows), name, cand, b_lab, devices, pick("host"), min_effect,
                      quick=bool((res.get("settings") or {}).get("quick")),
                      interrupted=(res.get("timing") or {}).get("stop_reason") == "interrupted",
                      n_control=sum(1 for r in rows if r["case"].get("impl") == "sdpa"), run_dir=run_dir)
        if walls and all(map(between_run, walls)):  # a merged report's env from another run
            env_of = {e["label"]: e for e in envs}
            same = same_build(env_of.get(b_lab), env_of.get(cand))
            # the headline too (new-user trial: one wheel merged from two runs read "faster 4/4" there)
            s["text"] = s["text"].replace(f"{cand} vs {b_lab}:", f"{cand} vs {b_lab}, between runs (unpaired"
                                          + (f"; {SAME_BUILD_TAG}" if same else "") + "):", 1)
            s["detail"] = " ".join(x for x in (BETWEEN_NOTE + (BETWEEN_KERNEL if devices else ""), same,
                                               s["detail"]) if x)
        hb = {lab: sum(1 for r in rows if lab in r["host_bound"]) for lab in (b_lab, cand)}
        if any(r["case"].get("host_bound") is not None for r in rows):
            s["detail"] += (" Host-bound (host dispatch ≥ kernel time): " +
                            ", ".join(f"{lab} {n}/{len(rows)}" for lab, n in hb.items()) + ".")
        wrong = sorted({name[c["id"]] for c in cases if c["env"] == cand and (c.get("correctness") or {}).get("ok") is False})
        s["wrong"] = wrong
        s["candidate"], s["baseline"] = cand, b_lab
        summaries.append(s)
    wrong = [(c["env"], c["label"], c["op"]) for c in cases
             if (c.get("correctness") or {}).get("ok") is False]
    failed_cases = [c for c in cases if c["status"] not in ("ok",)]
    failed_envs = [e for e in envs if e["status"] != "ok"]
    # columns of the verdict table: envs with at least one case (a failed env is named above the table)
    table_labels = [lab for lab in labels if any(lab in r["by_env"] for r in rows)]
    comparisons = res.get("comparisons") or []
    ci_heads = [ci_head(comparisons, bool(settings.get("quick")), p) for p in pairs]
    # some / every wall ratio between runs: provisional, no interval (results.BETWEEN_RUNS_WHY)
    between_any = any(c.get("between_runs") and c.get("metric") == "wall_us" for c in comparisons)
    vm = {"res": res, "labels": labels, "table_labels": table_labels, "ok_labels": ok_labels, "base": base, "rows": rows,
          "ci_head": ci_head(comparisons, bool(settings.get("quick"))), "ci_heads": ci_heads,
          "delta_legend": delta_def(comparisons, "; with its interval at the ratio's level"),
          "between_all": between_any and all(h == "(provisional)" for h in ci_heads), "between_any": between_any,
          "level_note": level_note(res.get("comparisons") or []),
          "steal_note": steal_note(res.get("sets") or []), "steal_warn": STEAL_WARN, "probe_note": probe_note(res),
          "ratio_def": ratio_definition(res.get("comparisons", []), (res.get("settings") or {}).get("method"),
                                         (res.get("settings") or {}).get("speed_adjust"), merged=results.is_merge(res), sets=res.get("sets")),
          "candidates": names, "pairs": pairs, "one_base": one_base, "wrong": wrong, "failed_cases": failed_cases, "failed_envs": failed_envs,
          "summaries": summaries, "common": common, "min_effect": min_effect, "case_names": name,
          "env_color": {lab: charts.env_color(i) for i, lab in enumerate(labels)},
          "has_device": any("device_us" in (c.get("metrics") or {}) for c in cases)}
    vm["gate"] = gate_line(res)
    vm["gate_outcome"] = (res.get("gate") or {}).get("outcome") if vm["gate"] else None
    vm["config_overrides"] = config_overrides(res)
    vm["resumed_note"] = resumed_note(res)
    vm["rejudged_note"] = rejudged_note(res)
    vm["modes"] = safe_modes(res, name, min_effect)
    vm["mode_note"] = mode_note(vm["modes"])
    # the verdict table marks a ratio that moved with the mode, where users read it (new-user trial)
    vm["mode_moved"] = {f"{m['case']}|{m['pair'][0]}|{m['pair'][1]}":
                        f"moved with the machine mode: {m['usual']:.2f}x in the other sets, {m['slow']:.2f}x in the "
                        f"slower ones (see Machine mode below the charts)" for m in (vm["modes"] or {}).get("moved", [])}
    vm["merged"] = results.is_merge(res)
    vm["heatmap"] = heatmap(vm)
    if with_charts:
        vm["charts"] = build_charts(vm)
    return vm


#: A report with more cases than this (rows: case x op) gets the heat map of ratios grouped by axis.
HEATMAP_MIN_ROWS = 12
#: Axes of a case other than its shape, in the order the heat map groups by them.
GROUP_AXES = ("dtype", "causal", "impl")


def shape_label(c: dict) -> str:
    """``B2 S50 H16 D16`` of a case dict (seqlen_k, nheads_k when they differ), without causal,
    dtype or impl: the heat map's row within a group."""
    s = f"B{c.get('batch')} S{c.get('seqlen_q')}"
    if c.get("seqlen_k") != c.get("seqlen_q"):
        s += f"/{c.get('seqlen_k')}"
    s += f" H{c.get('nheads')}"
    if c.get("nheads_k") != c.get("nheads"):
        s += f"/{c.get('nheads_k')}"
    return s + f" D{c.get('head_dim')}"


def _group_name(c: dict, axes: list[str]) -> str:
    parts = []
    for k in axes:
        v = c.get(k)
        parts.append(("causal" if v else "non-causal") if k == "causal" else str(v))
    return " · ".join(parts)


def heatmap(vm: dict) -> dict | None:
    """The version x case heat map of wall ratios, for runs of many cases (> HEATMAP_MIN_ROWS rows).

    Grouped by the non-shape axes that vary (dtype, causal, impl): one block per combination, in
    case order; rows are shapes (tokens every shape shares left out), columns candidate x op.
    Returns ``{"axes", "columns": [(candidate, op)], "common", "groups": [{"name", "rows": [{"shape",
    "cells": [cell | None]}]}]}``, a cell being ``{"ratio", "verdict", "ci", "bg", "id"}``; None
    when there is nothing to compare or few cases."""
    rows, cands = vm["rows"], vm["candidates"]
    if not cands or len(rows) <= HEATMAP_MIN_ROWS:
        return None
    axes = [k for k in GROUP_AXES if len({r["case"].get(k) for r in rows}) > 1]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    columns = [(c, op) for c in cands for op in ops]
    col = {(j, op): i for i, (j, op) in enumerate((j, op) for j in range(len(cands)) for op in ops)}
    shapes = {r["id"]: shape_label(r["case"]) for r in rows}
    toks = [set(v.split()) for v in shapes.values()]
    common = set.intersection(*toks) if len(set(shapes.values())) > 1 else set()
    short = {k: " ".join(t for t in v.split() if t not in common) or v for k, v in shapes.items()}
    groups: dict[str, dict[str, list]] = {}
    for r in rows:
        g = groups.setdefault(_group_name(r["case"], axes), {})
        cells = g.setdefault(short[r["id"]], [None] * len(columns))
        for j, comp in enumerate(r["comps"]):
            w = comp["wall"]
            if w and w.get("ratio"):
                cells[col[(j, r["op"])]] = {
                    "ratio": w["ratio"], "verdict": w["verdict"], "ci": fmt_ci(w), "bg": ratio_color(w["ratio"]),
                    "id": r["id"]}
    first = next(iter(shapes.values()))
    return {"axes": axes, "columns": columns,
            "common": " ".join(t for t in first.split() if t in common),
            "groups": [{"name": name, "rows": [{"shape": sh, "cells": cells} for sh, cells in g.items()]}
                       for name, g in groups.items()]}


def ratio_color(r: float) -> str:
    """Background of a heat-map cell: red above 1 (candidate slower), green below, white at 1; full
    colour at 2x either way (log scale)."""
    a = min(1.0, abs(float(np.log2(r)))) if r > 0 else 1.0
    rgb = (214, 39, 40) if r > 1 else (44, 160, 44)
    return f"rgba({rgb[0]}, {rgb[1]}, {rgb[2]}, {0.08 + 0.72 * a:.2f})"


def build_charts(vm: dict) -> dict:
    """The report's charts as {name: {"svg"|"error": ...}} (empty entries are left out)."""
    rows, labels = vm["rows"], vm["labels"]
    ok_rows_labels = [lab for lab in labels if any(e["label"] == lab and e["case"]["status"] == "ok"
                                                   for r in rows for e in r["envs"])]
    out = {}
    if vm["candidates"]:
        out["ratio"] = charts.safe(charts.ratio_chart, rows, vm["candidates"], vm["base"], vm["min_effect"],
                                   what=None if vm["one_base"] else "candidate / its baseline (legend: candidate vs baseline)")
    if vm["candidates"]:
        out["sets"] = charts.safe(charts.set_ratio_chart, vm["res"].get("comparisons") or [], titles=vm["case_names"],
                                  slow_sets=(vm.get("modes") or {}).get("slow"))
    out["breakdown"] = charts.safe(charts.breakdown_chart, rows, ok_rows_labels or labels)
    try:
        bands = ci_bands(vm["res"].get("cases", []))
    except Exception:  # noqa: BLE001 - without bands the curves are still worth drawing
        bands = {}
    out["seqlen"] = charts.safe(charts.sweep_chart, rows, ok_rows_labels, "seqlen", bands, prefix="seq")
    out["batch"] = charts.safe(charts.sweep_chart, rows, ok_rows_labels, "batch", bands, prefix="bat")
    out["correctness"] = charts.safe(charts.correctness_chart, rows, ok_rows_labels)
    return {k: v for k, v in out.items() if v}


def _env() -> Environment:
    env = Environment(loader=PackageLoader("matrix_runner", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["us"] = fmt_us
    env.filters["ratio"] = fmt_ratio
    env.filters["ci"] = fmt_ci
    env.filters["kernel"] = compare_kernel
    env.globals["between_kernel"] = between_kernel
    env.filters["delta"] = fmt_delta
    # a comparison's interval level: lockstep ones carry alpha (stats.set_compare / select_family);
    # results/1 and compare's intervals are 95 %; a provisional ratio has none
    env.filters["level"] = lambda x: ("–" if x.get("verdict") == "provisional"
                                      else level_pct(x["alpha"]) if x.get("alpha") is not None else "95%")
    env.filters["p"] = lambda v: "–" if v is None else f"{v:.3g}"
    env.filters["xr"] = fmt_x
    env.filters["headline"] = headline
    env.filters["pct"] = lambda v: "–" if v is None else f"{v:.0%}"
    env.filters["tf"] = fmt_tflops
    env.filters["gb"] = lambda v: "–" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.3g}")
    env.filters["bytes"] = fmt_bytes
    env.filters["sci"] = lambda v: "–" if v is None else f"{v:.1e}"
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=1, default=str)
    env.filters["shell"] = _shell_join
    env.filters["reproduce"] = reproduce_argv
    return env


def reproduce_argv(argv) -> list:
    """The run's command line without the files it wrote: its output directory (``-o DIR``,
    ``--output DIR``, ``--output=DIR``) and ``--markdown FILE``. The report's "Reproduce" command,
    copied as it stood, had been refused because that directory holds this run, or would have
    overwritten the run's summary (new-user trials). A new run writes ``reports/<run id>/``."""
    out, skip = [], False
    for a in argv or []:
        a = str(a)
        if skip:
            skip = False
            continue
        if a in ("-o", "--output", "--markdown"):
            skip = True
            continue
        if a.startswith(("--output=", "--markdown=")) or (a.startswith("-o") and len(a) > 2 and not a.startswith("--")):
            continue
        out.append(a)
    return out



def _shell_join(argv) -> str:
    import shlex

    return " ".join(shlex.quote(str(a)) for a in (argv or []))


def _svg(chart: dict | None):
    """Mark a chart's SVG (built by charts.py: matplotlib-escaped text, URLs stripped) as safe HTML."""
    from markupsafe import Markup

    return Markup(chart["svg"]) if chart and chart.get("svg") else None


def render_html(res: dict, json_name: str | None = "results.json", with_charts: bool = True) -> str:
    """The self-contained HTML report for ``res`` (no external fetches; CSS inline, charts inline SVG)."""
    vm = view_model(res, with_charts=with_charts)
    vm["json_name"] = json_name
    vm["svg"] = {k: _svg(v) for k, v in (vm.get("charts") or {}).items()}
    from . import explain  # the explain stage's view (matrix-run --explain); None without its data

    vm["explain"] = explain.analyze(res)
    vm["drift_note"] = explain.DRIFT_NOTE
    return _env().get_template("report.html.j2").render(**vm)


def html_archived(out_dir: Path) -> bool:
    """Whether ``out_dir``'s report is kept gzipped (index.html.gz and no index.html: an archived run,
    reports/README.md), so a report re-rendered there is written as :func:`write_html` ``gz``."""
    return (out_dir / "index.html.gz").is_file() and not (out_dir / "index.html").exists()


def write_html(res: dict, out_dir: Path, json_name: str | None = "results.json", gz: bool = False) -> Path:
    """Write ``out_dir``/index.html (renamed into place whole), or with ``gz`` index.html.gz (gzip level
    9 without a timestamp, as the committed runs under reports/ are archived: ``explain`` of such a
    run wrote an index.html beside the older index.html.gz, new-user trial). Returns its path."""
    import gzip

    out_dir.mkdir(parents=True, exist_ok=True)
    text = render_html(res, json_name)
    p = out_dir / ("index.html.gz" if gz else "index.html")
    tmp = out_dir / f".{p.name}.tmp"
    if gz:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as f:
            f.write(text.encode("utf-8"))
    else:
        tmp.write_text(text, encoding="utf-8")
    tmp.replace(p)
    return p


def write_markdown(path, text: str) -> Path:
    """Write a ``--markdown`` file as a new file renamed over ``path`` (a symbolic link's target, where
    ``path`` is one): a hard link's other names keep their old content, so a Markdown written
    through a hard link to any file -- a run's own, which pipeline.check_writable_file cannot find
    unless the command reads it -- replaces only this name (new-user trial). Returns the path written."""
    target = Path(path).expanduser().resolve()
    results.write_atomic(target, lambda f: f.write(text))
    return target


def resumed_note(res: dict) -> str:
    """What a resumed (``--resume``) run's reports say of it: the sessions its sets pool and any
    extension of its budget ("" for a run of one session, or a merged report, whose runs' own
    reports say it)."""
    if not res.get("resumed") or results.is_merge(res):
        return ""
    names = {"time_budget_s": ("time budget", " s"), "max_sets": ("max_sets", "")}
    out = (f"Resumed (--resume) at {', '.join(map(str, res['resumed']))}: the sets of {len(res['resumed']) + 1} "
           "sessions are pooled. Each set is fresh workers of every version taking turns, so a later session's "
           "sets pair like any others; the CPU may have been in another state then.")
    for x in res.get("extended") or []:
        what = ", ".join(f"{names.get(k, (k, ''))[0]} {'–' if (v or [None])[0] is None else format(v[0], 'g')} → "
                         f"{format(v[1], 'g')}{names.get(k, (k, ''))[1]}" for k, v in x.items() if k != "at")
        out += (f" At {x.get('at')} it was extended ({what}): its intervals are anytime-valid, so sets added after "
                "its first verdicts keep their level.")
    return out


def kv_gbps(case: dict) -> float | None:
    """A kvcache case's GB/s of KV read at the device clock (stats.gbps; None for other cases): the
    decode figure that belongs beside its µs in the terminal and Markdown tables."""
    return ((case or {}).get("gbps") or {}).get("device")


def markdown(res: dict) -> str:
    """A GitHub-comment-sized summary: the headline per candidate and the verdict table in Markdown."""
    vm = view_model(res)
    esc = lambda x: html.escape(str(x), quote=False).replace("|", "\\|")  # noqa: E731  (Markdown shows &#x27; as is)
    lines = [f"### {esc(res.get('title', 'matrix-run'))}", ""]
    m = res.get("machine") or {}
    gpus = list(dict.fromkeys(e.get("gpu") for e in res.get("envs") or [] if e.get("gpu"))) if results.is_merge(res) else []
    # a merge of runs on several GPUs names each (second new-user trial: only the first run's was named)
    gpu = (" + ".join(gpus) + " (merged runs)") if len(gpus) > 1 else (m.get("gpu") or "CPU")
    lines.append(esc(f"{gpu} · driver {m.get('driver') or '–'} · CUDA {m.get('cuda') or '–'} · "
                     f"torch {m.get('torch') or '–'}") + f" · baseline **{esc(vm['base'])}**")
    lines.append("")
    for s in vm["summaries"]:
        lines.append(f"- **{esc(s['text'])}** {esc(s['detail'])}")
    if gate_line(res):
        lines.append(f"- **{esc(gate_line(res))}**")
    if vm["summaries"] or gate_line(res):
        lines.append("")
    hdr = "| case | op | " + " | ".join(f"{esc(lab)} wall µs" for lab in vm["labels"]) + " | " + \
          " | ".join((f"{esc(c)} vs {esc(vm['base'])}" if vm["one_base"] else esc(c)) + " " + esc(h)
                     + " | Δ wall µs per call" for c, h in zip(vm["candidates"], vm["ci_heads"])) + " |"
    lines += [hdr, "|" + "---|" * (2 + len(vm["labels"]) + 2 * len(vm["candidates"]))]
    for r in vm["rows"]:
        cells = [r["full_label"], r["op"]]
        by = {e["label"]: e for e in r["envs"]}
        for lab in vm["labels"]:
            e = by.get(lab)
            w = e["m"]["wall_us"] if e else None
            g = kv_gbps(e["case"]) if e else None
            cells.append((fmt_us(w["median"]) + (f" ({g:,.0f} GB/s)" if g else "")) if w
                         else (e["case"]["status"] if e else "–"))
        for c in r["comps"]:
            w = c["wall"]
            k = between_kernel(c)
            cells.append(f"{w['verdict']} {fmt_ratio(w)}" + (f" ({w['attribution']})" if w.get("attribution") else "")
                         + (f"; {k}" if k else "") if w else "–")
            cells.append(fmt_delta(w))
        lines.append("| " + " | ".join(esc(x) for x in cells) + " |")
    lines.append("")
    # a --quick run's ratios are provisional, without an interval (new-user trial: the legend spoke of one)
    has_ci = any(c["wall"] and c["wall"].get("verdict") != "provisional" for r in vm["rows"] for c in r["comps"])
    notes_at = len(lines)  # the notes below the table, each a paragraph of its own (new-user trial: one block)
    # the attribution legend only where a row carries one (new-user trial: a --quick run's had none)
    attributed = any(c["wall"] and c["wall"].get("attribution") for r in vm["rows"] for c in r["comps"])
    at_level = "; the interval at the ratio's level" if has_ci else ""
    lines.append(f"ratio = candidate / baseline wall time: {vm['ratio_def']}; "
                 + ("(host) / (device): the difference is host overhead / kernel time. " if attributed else "")
                 + f"Δ: {delta_def(res.get('comparisons') or [], at_level)}.")
    if vm["level_note"] and vm["level_note"].split("): ", 1)[-1] not in vm["ratio_def"]:  # not said twice
        lines.append(esc(vm["level_note"]) + ".")
    if vm["steal_note"]:
        lines.append(f"**Warning:** {esc(vm['steal_note'])}.")
    for w in res.get("merge_warnings") or []:
        lines.append(f"**Warning:** {esc(w)}; this report pools them.")
    resumed = resumed_note(res)
    if resumed:
        lines.append(esc(resumed))
    if vm["rejudged_note"]:
        lines.append(esc(vm["rejudged_note"]))
    if vm["probe_note"]:
        lines.append(esc(vm["probe_note"]) + ".")
    if vm["mode_note"]:  # as in the HTML, with or without a ratio that moved (new-user trial)
        lines.append(esc(vm["mode_note"][0].upper() + vm["mode_note"][1:]) + ".")
    if any(kv_gbps(e["case"]) for r in vm["rows"] for e in r["envs"]):
        lines.append("GB/s: KV cache read per second at the kernel (device) time (kvcache cases: the bytes of "
                     "k_cache/v_cache a call must read given cache_seqlens).")
    for w in vm["wrong"]:
        lines.append(f"**Wrong results:** {esc(w[0])} {esc(w[1])} {esc(w[2])}: output or gradients differ from "
                     "the fp32 reference beyond tolerance.")
    return "\n".join(lines[:notes_at]) + "\n" + "\n\n".join(lines[notes_at:]) + "\n"


#: What the Δ column is, in the terminal and Markdown legends (new-user trial: it was read as the
#: difference of the µs columns beside it, which are plain medians).
DELTA_DEF = ("candidate minus baseline wall time, µs per call, paired like the ratio, so not the difference of "
             "the µs columns (plain medians)")
#: The same for a merged report's columns between runs (new-user trial: DELTA_DEF was said of them too).
DELTA_BETWEEN = "between runs: the difference of the two runs' medians, unpaired, without an interval"


def delta_def(comparisons: list[dict], interval: str = "") -> str:
    """What the Δ column holds: :data:`DELTA_DEF` (with ``interval``, what is said of its interval),
    :data:`DELTA_BETWEEN` where every wall comparison is between runs, both where some are."""
    wall = [c for c in comparisons if c.get("metric") == "wall_us"]
    between = [c for c in wall if c.get("between_runs")]
    if wall and len(between) == len(wall):
        return "candidate minus baseline wall time, µs per call, " + DELTA_BETWEEN
    return ("within a run: " if between else "") + DELTA_DEF + interval + (f"; {DELTA_BETWEEN}" if between else "")


VERDICT_STYLE = {"slower": "red", "faster": "green", "same": "white", "ambiguous": "yellow", "provisional": "cyan"}


def terminal_table(res: dict, console=None, run_dir: str | None = None) -> None:
    """Print the verdict table with rich, then one headline per candidate.

    Cases are named by their short label (the tokens every case shares go in the title). The full
    table (each env's wall / host / device µs, each candidate's ratio) is printed when rich
    measures that it fits the console's width (a pipe or log: $COLUMNS, else 80); else one table per
    candidate with the two envs' wall µs and the verdict, which fits 80 columns. No cell is cut:
    a cell too long for any layout (an error message, a long case label) wraps, at spaces. ``run_dir``: the folder
    of the run's results.json, named in an interrupted run's ``--resume`` advice."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.measure import Measurement
    from rich.table import Table

    from .ui import warn

    console = console or Console()
    vm = view_model(res, run_dir=run_dir)
    title = escape(str(res.get("title") or ""))
    if vm["common"]:
        title += f" [dim]· every case: {escape(vm['common'])}[/]"

    def env_cell(r: dict, lab: str, clocks: tuple[str, ...]) -> str:
        e = r["by_env"].get(lab)
        if e is None:
            return "–"
        if e["case"]["status"] != "ok":
            if e["case"].get("error_kind") == "not-run":  # the run's stop reason is printed below the table
                failed = [lb for lb, o in r["by_env"].items() if lb != lab and o["case"]["status"] == "error"]
                if failed:  # not the run's stop: nothing to compare it with (new-user trial)
                    return f"[red]not timed[/]: it failed in {escape(', '.join(failed))}"
                return "[red]not timed[/]: the run stopped first"  # (was "not-run: not timed: ...": new-user trial)
            else:
                why = (e["case"].get("error") or "").split(": ", 1)[-1]
                if len(why) > 60:  # cut at a word, marked
                    why = why[:59].rsplit(" ", 1)[0] + "…"
            return f"[red]{escape(e['case'].get('error_kind') or e['case']['status'])}[/]: {escape(why)}"
        m = e["m"]
        g = kv_gbps(e["case"])
        return (" / ".join(fmt_us(m[k]["median"]) if m.get(k) else "–" for k in clocks)
                + (" [dim]HB[/]" if e["case"].get("host_bound") and len(clocks) > 1 else "")
                + (f" [dim]· {g:,.0f} GB/s[/]" if g else ""))

    def ratio_cell(c: dict) -> str:
        w = c["wall"]
        if not w:
            return "–"
        attr = f" · {w['attribution']}" if w.get("attribution") else ""
        if w["verdict"] == "provisional":  # one process set: a ratio, no interval (the header says so)
            k = between_kernel(c)
            return f"[{VERDICT_STYLE['provisional']}]provisional[/] {w['ratio']:.2f}x" + (f" · {escape(k)}" if k else "")
        return f"[{VERDICT_STYLE[w['verdict']]}]{w['verdict']}[/] {fmt_ratio(w)}{attr}"

    def table(labels: list[str], js: list[int], clocks: tuple[str, ...], title: str, delta: str = "") -> Table:
        """``js``: the comparisons (indices into vm["pairs"]) shown; ``delta``: "ci" gives each a
        column of its wall difference in µs per call with the interval, "point" without, "" none."""
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        # the case wraps at its words where the console is too narrow for it (a long varlen or paged
        # kvcache label had kept its full width while every number folded a character a line: second
        # new-user trial)
        t.add_column("case", overflow="fold")
        t.add_column("op", no_wrap=True)
        unit = "wall / host / dev µs" if len(clocks) > 1 else "wall µs"
        def head(lab: str) -> str:
            # a version x torch label wraps at its axis ("2.7.0.post2 +torch-inherit"), not mid-word
            return escape(lab.replace("+", " +"))

        for lab in labels:
            t.add_column(f"{head(lab)}\n{unit}", justify="right", overflow="fold")  # an error may wrap
        for j in js:
            b, k = vm["pairs"][j]
            t.add_column(f"{head(k)} vs {head(b)}\nwall ratio " + vm["ci_heads"][j], overflow="fold")
            if delta:
                t.add_column("Δ wall\nµs", justify="right", no_wrap=True)
        for r in vm["rows"]:
            comps = [r["comps"][j] for j in js]
            cells = []
            for c in comps:
                cells.append(ratio_cell(c))
                if delta:
                    cells.append(fmt_delta(c["wall"], delta == "ci"))
            t.add_row(escape(r["short"]), escape(str(r["op"])), *(env_cell(r, lab, clocks) for lab in labels), *cells)
        return t

    def fits(t: Table) -> bool:
        # the width the table takes unwrapped (measured unclamped: rich clamps to the console's width)
        return Measurement.get(console, console.options.update_width(1 << 16), t).maximum <= console.width

    if not vm["rows"]:  # no case at all (every env failed before timing): no empty table wrapped to a
        # column of the title's words (second new-user trial)
        console.print(title)
        why = "; ".join(f"{e['label']}: {e.get('error') or e.get('status')}" for e in res.get("envs") or []
                        if e.get("status") != "ok")
        stop = (res.get("timing") or {}).get("stop_reason")
        console.print("[red]nothing was timed in this run[/]" + (f": {escape(why)}" if why else "")
                      + (f" ({escape(str(stop))})" if stop else ""))
        return
    all_js = list(range(len(vm["pairs"])))

    def narrow(delta: str) -> list:
        return [table([lab for lab in pair if lab in vm["table_labels"]], [i], ("wall_us",), title if i == 0 else "",
                      delta) for i, pair in enumerate(vm["pairs"])]

    # the first layout that fits: every clock, then wall µs only in one block per candidate (host and
    # device are in the report), each with the Δ column and its interval, then Δ's point alone -- Δ
    # before the host and device clocks (new-user trial: Δ came and went as the width changed); the
    # narrowest, without Δ, is printed anyway
    layouts = ([(lambda d=d: [table(vm["table_labels"], all_js, SHOWN, title, d)], d, True) for d in ("ci", "point")]
               + [(lambda d=d: narrow(d), d, False) for d in ("ci", "point", "")]) if vm["candidates"] else \
        [(lambda: [table(vm["table_labels"], all_js, SHOWN, title, "")], "", True)]
    for make, delta, full in layouts:
        tables = make()
        if all(fits(t) for t in tables):
            break
    for t in tables:
        console.print(t)
    if full and any(e["case"].get("host_bound") for r in vm["rows"] for e in r["envs"]):
        console.print("[dim]HB: host-bound (host dispatch ≥ kernel time: the GPU waits for the CPU)[/]")
    if delta:
        shown = [fmt_delta(c["wall"], delta == "ci") for r in vm["rows"] for c in r["comps"]]
        tail = ("; the interval at the ratio's level" if any("[" in x for x in shown) else
                "" if delta == "ci" else "; its interval: the HTML report or --markdown")
        console.print(f"[dim]Δ wall µs: {escape(delta_def(res.get('comparisons') or [], tail))}[/]")
    elif vm["candidates"]:
        console.print("[dim]Δ wall µs (the difference in µs per call) does not fit this console's width: see the "
                      "HTML report or --markdown[/]")
    if vm["candidates"] and str((res.get("settings") or {}).get("method") or "").startswith("lockstep"):
        at_speed = " and taken at one CPU speed" if (res.get("settings") or {}).get("speed_adjust", True) else ""
        cmps = res.get("comparisons") or []
        unpaired = results.is_merge(res) and any(c.get("paired") is False for c in cmps)
        if any(c.get("paired") is not False for c in cmps if c.get("metric") == "wall_us"):
            gap = shown_gap(vm["rows"])
            console.print(f"[dim]µs: the bursts' plain medians; ratio{' within a run' if unpaired else ''}: paired "
                          f"cycle by cycle{at_speed}, so it can differ from the ratio of the µs shown"
                          + (f" ({'in these runs' if results.is_merge(res) else 'in this run'} by up to {gap:.1f} %)" if gap is not None else "") + "[/]")
        state = cpu_state_note(cmps)
        if state:
            console.print(f"[dim]{escape(state[0].upper() + state[1:])}[/]")
        # a merge's sets are every run's: no one run's count to set a comparison's sets against
        wide = wide_note(cmps, vm["case_names"], vm["min_effect"],
                         None if results.is_merge(res) else len(res.get("sets") or []) or None,
                         stopped=None if results.is_merge(res) else (res.get("timing") or {}).get("stop_reason"),
                         run_dir=run_dir)
        if wide:
            console.print(f"[dim]{escape(wide)}[/]")
        modes = mode_note(vm["modes"], terse=True)
        if modes:
            console.print(f"[dim]{escape(modes[0].upper() + modes[1:])} (the HTML report's set chart rings the slower "
                          "group)[/]")
        if unpaired:  # a merged report (new-user trial: its legend called every ratio paired)
            marked = any(str(e.get("label", "")).endswith("'") for e in res.get("envs") or [])
            console.print(f"[dim]merged runs: ratio {escape(merged_def(cmps))}"
                          + (" (a label marked ' was renamed: the same label in two runs)" if marked else "") + "[/]")
    note = level_note(res.get("comparisons") or [])
    if note:
        console.print(f"[dim]{escape(note)}[/]")
    if vm["steal_note"]:
        warn(vm["steal_note"], console)
    if vm["probe_note"]:
        console.print(f"[dim]{escape(vm['probe_note'])}[/]")
    resumed = resumed_note(res)
    if resumed:
        console.print(f"[dim]{escape(resumed)}[/]")
    if vm["rejudged_note"]:
        console.print(escape(vm["rejudged_note"]))
    if any(kv_gbps(e["case"]) for r in vm["rows"] for e in r["envs"]):
        console.print("[dim]GB/s: KV cache read per second at the kernel (device) time (kvcache cases)[/]")
    for w in vm["wrong"]:
        console.print(f"[red]wrong results:[/] {escape(w[0])} {escape(w[1])} {escape(w[2])}: output or gradients differ "
                      "from the fp32 reference beyond tolerance (a faster wrong answer is not faster)")
    colors = {"slower": "red", "faster": "green", "mixed": "yellow", "same": "white", "none": "dim"}
    for s in vm["summaries"]:
        console.print(f"[bold {colors[s['cls']]}]{escape(s['text'])}[/] [dim]{escape(s['detail'])}[/]")


# --------------------------------------------------------------------------------------------
# matrix-run compare: two saved runs
def run_meta(res: dict, path: str | None = None) -> dict:
    m = res.get("machine") or {}
    return {"path": path, "run_id": res.get("run_id"), "created": res.get("created"), "title": res.get("title"),
            "gpu": m.get("gpu") or "no GPU", "driver": m.get("driver"), "cuda": m.get("cuda"), "torch": m.get("torch"),
            "hostname": m.get("hostname"), "cpu": m.get("cpu"), "device": (res.get("settings") or {}).get("device"),
            "versions": [e["label"] for e in res.get("envs", [])]}


def pair_envs(a: dict, b: dict) -> list[tuple[str, str]]:
    """Env pairs (label in A, label in B): same label first; an env left over on both sides is then
    paired by flash-attn version when that version names exactly one env on each side, else by
    (version, torch) where that pair does (a plain run against a version x torch run: "2.6.3" on
    torch 2.11 meets "2.6.3+torch-inherit", not "2.6.3+torch2.5.1")."""
    ea = [e for e in a.get("envs", []) if e.get("status") == "ok"]
    eb = [e for e in b.get("envs", []) if e.get("status") == "ok"]
    lb = {e["label"] for e in eb}
    pairs = [(e["label"], e["label"]) for e in ea if e["label"] in lb]
    used_a = {p[0] for p in pairs}
    used_b = {p[1] for p in pairs}
    ver = lambda e: e.get("flash_attn_version") or e.get("requested_version")  # noqa: E731
    ra = [e for e in ea if e["label"] not in used_a]
    rb = [e for e in eb if e["label"] not in used_b]
    for key in (ver, lambda e: (ver(e), e.get("torch"))):
        for e in ra:
            if e["label"] in used_a:
                continue
            same = [f for f in rb if f["label"] not in used_b and key(f) == key(e)]
            if len(same) == 1 and sum(1 for g in ra if g["label"] not in used_a and key(g) == key(e)) == 1:
                pairs.append((e["label"], same[0]["label"]))
                used_a.add(e["label"])
                used_b.add(same[0]["label"])
    return pairs


#: How compare's intervals are made, said under its tables (new-user trial: "1.36x [0.82, 1.56]" read
#: as a run's own interval).
COMPARE_NOTE = ("B/A: the ratio of the two runs' medians of set medians. Two runs are not paired cycle by cycle as "
                "a run's versions are, and wall and host time follow the CPU speed each run met, so their ratios "
                "are provisional: no interval, no verdict (between runs of one build on the H200 the wall ratio "
                "spread 14 %). Kernel time is a GPU clock: its interval is a 95 % two-level bootstrap over the "
                "runs' process sets, widened to Welch, per comparison (not anytime-valid, not held together across "
                "comparisons as a run's own intervals are). For a verdict on wall time, time both in one run")


def compare_wall(w: dict) -> str:
    """The wall cell of a compare row: the ratio, with its interval where it has one (not between runs)."""
    return f"{w['ratio']:.2f}x" if w.get("between_runs") and not w.get("within_process_only") else fmt_ratio(w)


def compare_kernel(d: dict | None) -> str:
    """The kernel-time cell of a compare row: ratio, 95 % interval and verdict (``–`` where not timed)."""
    return f"{d['ratio']:.2f}x {fmt_ci(d)} {d['verdict']}" if d else "–"


def between_kernel(c: dict) -> str:
    """A merged report's between-run cell's kernel comparison, the one such cells can decide
    (:data:`BETWEEN_KERNEL`): "kernel 1.00x [0.99, 1.01] same" where ``c`` (a row's comparison:
    wall, device) is between runs and its kernel time was compared, else "". It had been given as
    counts in the headline alone: which cases, only in the HTML's case details."""
    w, d = c.get("wall"), c.get("device")
    return f"kernel {compare_kernel(d)}" if w and d and between_run(w) else ""


def compare_runs(a: dict, b: dict, min_effect: float | None = None, a_path: str | None = None,
                 b_path: str | None = None) -> dict:
    """Compare run B against run A: for each env in both (see pair_envs) and each case timed OK in
    both, the ratio B/A of wall, host and device time (stats.compare on the stored per-process
    samples: median of per-process medians, two-level bootstrap CI), its verdict and attribution.
    Above 1, B is slower than A."""
    eff = min_effect if min_effect is not None else ((a.get("settings") or {}).get("min_effect") or 0.05)
    pairs = pair_envs(a, b)
    ca = {(c["env"], c["id"]): c for c in a.get("cases", [])}
    cb = {(c["env"], c["id"]): c for c in b.get("cases", [])}
    short, common = short_labels(list(a.get("cases", [])) + list(b.get("cases", [])))
    rows, skipped = [], []
    for la, lb in pairs:
        ids = [c["id"] for c in a.get("cases", []) if c["env"] == la]
        for cid in ids:
            x, y = ca.get((la, cid)), cb.get((lb, cid))
            if y is None:
                skipped.append({"env": la, "case": cid, "why": "not in B"})
                continue
            if x["status"] != "ok" or y["status"] != "ok":
                skipped.append({"env": la, "case": cid, "why": f"A {x['status']}, B {y['status']}"})
                continue
            # two separate runs: their sets did not run back to back, so never paired
            per, attr, why = results.compare_case({"metrics": x.get("metrics") or {}}, {"metrics": y.get("metrics") or {}},
                                                  eff, paired=False, seed_key=f"{la}/{cid}", metrics=SHOWN)
            if not per.get("wall_us"):
                skipped.append({"env": la, "case": cid, "why": "no wall samples"})
                continue
            impl = x.get("impl", "flash_attn")
            w = dict(per["wall_us"], case=cid, attribution=attr, attribution_why=why, impl=impl)
            per = {m: (dict(v, impl=impl) if v else v) for m, v in per.items()}
            rows.append({"env": la, "env_b": lb, "id": cid, "label": x.get("label", cid), "short": short.get(cid, cid),
                         "op": x.get("op"), "wall": w, "host": per.get("host_us"), "device": per.get("device_us"),
                         "host_bound": {"a": x.get("host_bound"), "b": y.get("host_bound")}})
    in_b = {c["id"] for c in b.get("cases", [])}
    only_a = sorted({c["id"] for c in a.get("cases", [])} - in_b)
    only_b = sorted(in_b - {c["id"] for c in a.get("cases", [])})
    summaries = []
    for la, lb in pairs:
        rs = [r for r in rows if r["env"] == la]
        n = len([c for c in a.get("cases", []) if c["env"] == la])
        name = {r["id"]: f"{r['short']} {r['op']}" for r in rs}
        env_name = la if la == lb else f"{la} (A) / {lb} (B)"
        same = same_build(next((e for e in a.get("envs", []) if e["label"] == la), None),
                          next((e for e in b.get("envs", []) if e["label"] == lb), None))
        s = summarize([r["wall"] for r in rs], n, name, "B", "A", [r["device"] for r in rs if r["device"]],
                      [r["host"] for r in rs if r["host"]], eff,
                      prefix=f"{env_name}" + (f" ({SAME_BUILD_TAG})" if same else "") + " — ",
                      quick=any((x.get("settings") or {}).get("quick") for x in (a, b)),
                      n_control=len([c for c in a.get("cases", []) if c["env"] == la and c.get("impl") == "sdpa"]))
        if same:  # a difference is then the machine's between the runs (new-user trial)
            s["detail"] = " ".join(x for x in (same, s["detail"]) if x)
        s["env"] = la
        summaries.append(s)
    unpaired = ([f"A {e['label']}" for e in a.get("envs", []) if e["label"] not in {p[0] for p in pairs}] +
                [f"B {e['label']}" for e in b.get("envs", []) if e["label"] not in {p[1] for p in pairs}])
    return {"a": run_meta(a, a_path), "b": run_meta(b, b_path), "pairs": pairs, "rows": rows, "skipped": skipped,
            "unpaired": unpaired,
            "only_a": only_a, "only_b": only_b, "min_effect": eff, "common": common, "summaries": summaries}


def compare_terminal(cmp: dict, console=None) -> None:
    """The B / A table of ``matrix-run compare``: every column where rich measures that it fits the
    console's width, else one block per env with the wall ratio and verdict (fits 80 columns)."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.measure import Measurement
    from rich.table import Table

    console = console or Console()
    for side in ("a", "b"):
        x = cmp[side]
        console.print(escape(f"{side.upper()}: {x['run_id']} · {x['gpu']} · driver {x['driver'] or '–'} · CUDA "
                             f"{x['cuda'] or '–'} · torch {x['torch'] or '–'} · {x['created']} · {x['path'] or ''}"))
    title = "B / A per env and case" + (f" (every case: {escape(cmp['common'])})" if cmp["common"] else "")

    def verdict(w: dict) -> str:
        return f"[{VERDICT_STYLE[w['verdict']]}]{w['verdict']}[/]" + (f" · {escape(w['attribution'])}" if w.get("attribution") else "")

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col, j in (("env", "left"), ("case", "left"), ("op", "left"), ("A wall µs", "right"), ("B wall µs", "right"),
                   ("B/A wall", "left"), ("verdict · why", "left"), ("B/A host", "right"),
                   ("B/A kernel [95% CI] · verdict", "left")):
        t.add_column(col, justify=j, no_wrap=True)
    for r in cmp["rows"]:
        w = r["wall"]
        env = r["env"] if r["env"] == r["env_b"] else f"{r['env']}→{r['env_b']}"
        t.add_row(escape(env), escape(r["short"]), escape(str(r["op"])), fmt_us(w["base_median"]), fmt_us(w["cand_median"]),
                  escape(compare_wall(w)), verdict(w),
                  f"{r['host']['ratio']:.2f}x" if r["host"] else "–",
                  escape(compare_kernel(r["device"])))
    if Measurement.get(console, console.options.update_width(1 << 16), t).maximum <= console.width:
        console.print(t)
    else:  # narrow (80 columns, a log): one block per env, wall only (host and device: -o DIR's report)
        envs = list(dict.fromkeys((r["env"], r["env_b"]) for r in cmp["rows"]))
        console.print(f"[italic]{title}[/]")
        for ea, eb in envs:
            b = Table(title=escape(ea if ea == eb else f"{ea}→{eb}"), title_justify="left", box=box.SIMPLE_HEAD,
                      pad_edge=False, collapse_padding=True)
            for col, j in (("case", "left"), ("op", "left"), ("A µs", "right"), ("B µs", "right")):
                b.add_column(col, justify=j, no_wrap=True)
            b.add_column("B/A wall · verdict; kernel", overflow="fold")
            for r in cmp["rows"]:
                if (r["env"], r["env_b"]) == (ea, eb):
                    w = r["wall"]
                    d = r["device"]
                    b.add_row(escape(r["short"]), escape(str(r["op"])), fmt_us(w["base_median"]),
                              fmt_us(w["cand_median"]), f"{escape(compare_wall(w))} {verdict(w)}"
                              + (f"; kernel {d['ratio']:.2f}x {d['verdict']}" if d else ""))
            console.print(b)
    if cmp["rows"] and not any(r["device"] for r in cmp["rows"]):
        console.print("[dim]kernel: – (these runs have no kernel clock: CPU runs)[/]")
    colors = {"slower": "red", "faster": "green", "mixed": "yellow", "same": "white", "none": "dim"}
    for s in cmp["summaries"]:
        console.print(f"[bold {colors[s['cls']]}]{escape(s['text'])}[/] [dim]{escape(s['detail'])}[/]")
    if cmp["skipped"]:
        console.print(f"[dim]{len(cmp['skipped'])} case(s) not compared (failed, or missing on one side)[/]")
    if cmp.get("unpaired"):  # second new-user trial: a version in one run only was dropped without a word
        console.print(f"[yellow]not compared, without a partner of the same label or flash-attn version in the other "
                      f"run: {escape(', '.join(cmp['unpaired']))}; to set versions of different runs side by side, "
                      "matrix-run report A B (a merged report: ratios between runs are provisional)[/]")
    if cmp["rows"]:
        console.print(f"[dim]{escape(COMPARE_NOTE)}.[/]")


def compare_markdown(cmp: dict) -> str:
    esc = lambda x: html.escape(str(x), quote=False).replace("|", "\\|")  # noqa: E731  (Markdown shows &#x27; as is)
    a, b = cmp["a"], cmp["b"]
    lines = ["### matrix-run compare: B / A", "",
             f"- **A**: {esc(a['run_id'])} · {esc(a['gpu'])} · driver {esc(a['driver'] or '–')} · CUDA {esc(a['cuda'] or '–')} · torch {esc(a['torch'] or '–')} · {esc(a['created'])}",
             f"- **B**: {esc(b['run_id'])} · {esc(b['gpu'])} · driver {esc(b['driver'] or '–')} · CUDA {esc(b['cuda'] or '–')} · torch {esc(b['torch'] or '–')} · {esc(b['created'])}",
             ""]
    for w in cmp.get("warnings") or []:  # commands.compare_warnings: what the terminal warns, in the comment too
        lines.append(f"> **warning:** {esc(w)}")
    if cmp.get("warnings"):
        lines.append("")
    for s in cmp["summaries"]:
        lines.append(f"- **{esc(s['text'])}** {esc(s['detail'])}")
    lines += ["", "| env | case | op | A wall µs | B wall µs | B/A wall | verdict | B/A host | B/A kernel [95% CI] · verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in cmp["rows"]:
        w = r["wall"]
        cells = [r["env"] if r["env"] == r["env_b"] else f"{r['env']}→{r['env_b']}", r["label"], r["op"],
                 fmt_us(w["base_median"]), fmt_us(w["cand_median"]), compare_wall(w),
                 w["verdict"] + (f" ({w['attribution']})" if w.get("attribution") else ""),
                 f"{r['host']['ratio']:.2f}x" if r["host"] else "–", compare_kernel(r["device"])]
        lines.append("| " + " | ".join(esc(x) for x in cells) + " |")
    if cmp["rows"] and not any(r["device"] for r in cmp["rows"]):
        lines += ["", "kernel: – (these runs have no kernel clock: CPU runs)"]
    lines += ["", f"{COMPARE_NOTE}; above 1 B is slower."]
    if cmp.get("unpaired"):  # as the terminal and the HTML say it
        lines += ["", f"Not compared (no partner of the same label or flash-attn version in the other run): "
                      f"{esc(', '.join(cmp['unpaired']))}."]
    return "\n".join(lines) + "\n"


def render_compare_html(cmp: dict) -> str:
    by_env: dict = {}
    for r in cmp["rows"]:
        by_env.setdefault(r["env"], []).append(r)
    ratio_svgs = {}
    for env, rs in by_env.items():
        rows = [{"short": r["short"], "op": r["op"], "comps": [{"wall": r["wall"]}]} for r in rs]
        ch = charts.safe(charts.ratio_chart, rows, ["B"], "A", cmp["min_effect"], prefix=f"cmp{len(ratio_svgs)}",
                         what="B / A")
        ratio_svgs[env] = _svg(ch)
    return _env().get_template("compare.html.j2").render(cmp=cmp, by_env=by_env, svgs=ratio_svgs, note=COMPARE_NOTE)


def write_compare_html(cmp: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / "index.html"
    p.write_text(render_compare_html(cmp), encoding="utf-8")
    return p
