"""Stage 4 — statistics: summaries, the ratio's confidence interval, verdicts and attribution.

The current method (results/2, :func:`set_compare`): the unit of evidence is the **process set**
(runner module doc: fresh worker processes of every version, pinned to one CPU core, timing each
case in turns of a few ms). Why: on the H200 machine a worker's CPU changes speed over time and from
core to core, and one worker process of a version can sit a few % off another for its whole life;
two workers on the same core at the same moment see the same speed. So inside a set, the bursts of
the versions are paired by cycle (same core, ms apart) and the set gives one log ratio (20 % trimmed
mean of its paired per-cycle log ratios); across sets, the per-process offsets average out and enter
the interval. The ratio's interval is an **anytime-valid confidence sequence** over the sets
(:func:`t_cs`, Lai's t-mixture): valid at every number of sets at once, so the runner may look after
every set and stop as soon as every verdict is decided, and the interval it stops on is the one it
reports (no fresh test at the end). The m comparisons of a clock in the run are held together by
e-BY (:func:`select_family`; Xu, Wang & Ramdas 2024): each alone is at 1 - alpha/m (Bonferroni), and
k comparisons decided alike (faster/slower, or same) at 1 - alpha k/m are reported at that level --
the expected share of reported intervals missing their truth stays <= alpha under any dependence,
and with no real difference anywhere (A/A) the chance of *any* false faster/slower verdict stays
<= alpha (5 %). ``benchmarks/sim_lockstep.py`` checks this by resampling real H200 process sets. A cycle's burst
values are taken at one reference CPU speed (:class:`SpeedSlope`: the slope is fixed from earlier
bursts and is the same for both versions, so a set's log ratio still estimates the versions' ratio
and the interval keeps its meaning; the plain medians are kept beside them).

Verdict, with ``e`` the minimum effect (default 0.05) and ``[lo, hi]`` the ratio's interval:
``slower`` if ratio > 1+e and lo > 1; ``faster`` if ratio < 1/(1+e) and hi < 1; ``same`` if
1/(1+e) <= lo and hi <= 1+e (an equivalence test); otherwise ``ambiguous`` (sample more);
``provisional`` for a ``--quick`` run or a single set (a ratio, never a verdict).

Comparisons of two separate runs (``matrix-run compare``, merged tox envs) and results/1 files use
:func:`compare`: rounds/sets as independent groups (two-level bootstrap widened to Welch), or, for a
results/1 run as it was written, paired by round with a trimmed t interval, as follows.

results/1 (one worker process per round). Why rounds matter: a worker process can land in a "mode" up to 2x slower than another process of
the same version (seen on the H200: one process in eight ran 43 % slow). Samples within one process
are therefore *not* independent draws of what the version costs. The unit of evidence is the
round (one worker process), and every statistic here is hierarchical:

- a metric's ``median`` is the **median of per-round medians** (``pooled_median`` is also kept);
- when both envs have the same rounds (the normal case), the comparison is **paired** by round
  (see :func:`compare`): the two processes of a round ran back to back, so a slow drift of the
  machine hits both alike. The ratio is the trimmed mean (20 %, fewer with few rounds: see
  :func:`trimmed_count`) of the per-round log ratios and its
  95 % CI the Tukey-McLaughlin trimmed t interval: a *transient* disturbance (seen on the 2-core CI
  machine: one case of one process running 1.2-2x slow for a few hundred ms) is one outlying round
  ratio, which trimming discards where a plain t interval would blow up (with 8 rounds, 1 per side);
- otherwise (unequal rounds after a crash or a resume) the sides are independent groups: the 95 %
  CI of the ratio of medians of round medians comes from a two-level bootstrap (resample rounds
  with replacement, and inside each drawn round its samples; the bootstrap distribution of a sample
  median is drawn exactly from order statistics: the median of a resample of n values is <= x_(k)
  iff at least ceil(n/2) draws are <= x_(k), a binomial tail), widened where wider to a Welch t
  interval on the log round medians (a percentile bootstrap of a few rounds is too narrow: it never
  reaches past the extreme round medians); the delta's interval likewise on the round medians;
- the rank test: paired, Wilcoxon's signed-rank test on round medians; independent, Mann-Whitney
  U on round medians when both sides have >= 3 rounds, else on the pooled samples (then it ignores the process effect; it is reported, not used for
  verdicts).

"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats as sps

N_BOOT = 2000
CI_LEVEL = 0.95


def _median(x) -> float:
    return float(np.median(np.asarray(x, dtype=float)))


def summarize(rounds: list[list[float]]) -> dict | None:
    """Summary of one metric for one (env, case): ``rounds`` holds one list of µs samples per round.

    Returns ``{median, pooled_median, iqr, q1, q3, n, n_rounds, round_medians, samples}`` (µs),
    or None when there are no samples."""
    rounds = [list(map(float, r)) for r in rounds if r]
    if not rounds:
        return None
    pooled = np.concatenate([np.asarray(r) for r in rounds])
    q1, q3 = np.percentile(pooled, [25, 75])
    rm = [_median(r) for r in rounds]
    return {
        "median": _median(rm),
        "pooled_median": _median(pooled),
        "iqr": float(q3 - q1),
        "q1": float(q1),
        "q3": float(q3),
        "n": int(pooled.size),
        "n_rounds": len(rounds),
        "round_medians": rm,
        "samples": rounds,
    }


def boot_medians(x, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` draws of the bootstrap distribution of the median of ``x`` (lower median for even n).

    Exact: with x sorted, P(median* <= x_(k)) = P(Binomial(n, k/n) >= m), m = ceil(n/2)."""
    xs = np.sort(np.asarray(x, dtype=float))
    n = xs.size
    if n == 1:
        return np.full(n_boot, xs[0])
    m = (n + 1) // 2
    k = np.arange(1, n + 1)
    cdf = sps.binom.sf(m - 1, n, k / n)  # P(at least m draws <= x_(k))
    cdf[-1] = 1.0
    u = rng.random(n_boot)
    idx = np.searchsorted(cdf, u, side="left")
    return xs[np.minimum(idx, n - 1)]


def boot_stat(rounds: list[list[float]], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Two-level bootstrap draws of the median of round medians (see module doc)."""
    rounds = [r for r in rounds if len(r)]
    r = len(rounds)
    if r == 1:
        return boot_medians(rounds[0], n_boot, rng)
    # an independent inner draw for every slot of every resample: a round drawn twice into one
    # resample gets two draws of its median, not one draw counted twice
    m = np.stack([boot_medians(x, n_boot * r, rng).reshape(n_boot, r) for x in rounds])  # (R, B, slots)
    pick = rng.integers(0, r, size=(n_boot, r))
    vals = m[pick, np.arange(n_boot)[:, None], np.arange(r)[None, :]]
    return np.median(vals, axis=1)


#: Share trimmed from each end of the per-round differences (Tukey-McLaughlin / Yuen: 20 %).
TRIM = 0.2
#: Fewest degrees of freedom trimming may leave (t_0.975 = 2.78 at 4).
MIN_TRIMMED_DF = 4


def trimmed_count(n: int, trim: float = TRIM) -> int:
    """Values trimmed from each end of ``n`` per-round differences: floor(trim * n) (Wilcox,
    *Introduction to Robust Estimation and Hypothesis Testing*, ch. 3-4), lowered until
    n - 2g - 1 >= MIN_TRIMMED_DF. With 5 or 6 rounds nothing is trimmed: trimming one round per
    side leaves df = 2-3 and t = 3.2-4.3, too wide to decide anything (on the H200, a 1.2-2.2x
    slowdown seen in 5 of 5 rounds came out "ambiguous" [0.83, 3.45] that way; untrimmed it is
    [1.21, 2.32]). From 7 rounds one per side is trimmed, from 10 two, from 15 three."""
    g = int(math.floor(trim * n))
    while g > 0 and n - 2 * g - 1 < MIN_TRIMMED_DF:
        g -= 1
    return g


def _trimmed_ci(d, exp: bool, level: float = CI_LEVEL) -> tuple[float, float, float, float]:
    """Trimmed mean of the per-round differences ``d`` (n >= 2) and its Tukey-McLaughlin 95 % t
    interval: with g = :func:`trimmed_count` (n) values trimmed from each end, the standard error is the
    winsorized standard deviation / ((1 - 2g/n) sqrt(n)) and df = n - 2g - 1 (Wilcox, *Introduction
    to Robust Estimation and Hypothesis Testing*, 3.6 and 4.4; with g = 0 this is the plain
    one-sample t interval). With ``exp`` the differences are log ratios and the
    estimate and bounds are returned as ratios. Returns (estimate, low, high, standard error)."""
    d = np.sort(np.asarray(d, dtype=float))
    n = d.size
    g = trimmed_count(n)
    est = float(d[g:n - g].mean())
    w = np.clip(d, d[g], d[n - g - 1])  # winsorized
    se = float(w.std(ddof=1) / ((1 - 2 * g / n) * math.sqrt(n)))
    t = float(sps.t.ppf(1 - (1 - level) / 2, n - 2 * g - 1))
    lo, hi = est - t * se, est + t * se
    if exp:
        return math.exp(est), math.exp(lo), math.exp(hi), se
    return est, lo, hi, se


def verdict(ratio: float, lo: float, hi: float, min_effect: float) -> str:
    """faster / slower / same / ambiguous from the ratio candidate/baseline and its CI (module doc)."""
    up, down = 1.0 + min_effect, 1.0 / (1.0 + min_effect)
    if ratio > up and lo > 1.0:
        return "slower"
    if ratio < down and hi < 1.0:
        return "faster"
    if lo >= down and hi <= up:
        return "same"
    return "ambiguous"


def compare(base: list[list[float]], cand: list[list[float]], min_effect: float = 0.05,
            seed: int = 0, n_boot: int = N_BOOT, paired: bool | None = None, level: float = CI_LEVEL) -> dict | None:
    """Compare one metric of one case between two envs (``rounds`` lists of µs samples each).

    With the same number (>= 2) of rounds on both sides the comparison is **paired**: round r of
    each env ran back to back (A B, B A, ...); the ratio is exp of the trimmed mean (:func:`trimmed_count`) of the
    per-round log ratios of medians, its CI the Tukey-McLaughlin trimmed t interval on them (delta
    likewise on the per-round differences in µs), and the rank test is Wilcoxon's signed-rank test
    (module doc). Otherwise the two sides are compared as independent groups (median of round
    medians, Welch-widened two-level bootstrap, Mann-Whitney U).

    ``paired=False`` forces the independent-groups comparison (for side-by-side checks of the two).
    ``level``: the confidence level of the intervals (0.95).
    Returns ``{ratio, ci_low, ci_high, delta_us, delta_ci_low, delta_ci_high, p_value, verdict,
    base_median, cand_median, n_rounds: [base, cand], paired, ci_method, trimmed_rounds,
    within_process_only}``; ratio > 1
    means the candidate is slower. None when either side has no samples."""
    base = [r for r in base if len(r)]
    cand = [r for r in cand if len(r)]
    if not base or not cand:
        return None
    rng = np.random.default_rng(seed)
    a = (1 - level) / 2
    rb = np.array([_median(r) for r in base])
    rc = np.array([_median(r) for r in cand])
    mb, mc = _median(rb), _median(rc)
    can_pair = len(base) == len(cand) >= 2 and (rb > 0).all() and (rc > 0).all()
    paired = can_pair if paired is None else (paired and can_pair)  # None: pair whenever possible
    widened = False
    if paired:
        d_log, d_abs = np.log(rc) - np.log(rb), rc - rb
        ratio, lo, hi, _ = _trimmed_ci(d_log, exp=True, level=level)
        delta, dl, dh, _ = _trimmed_ci(d_abs, exp=False, level=level)
        try:
            p = float(sps.wilcoxon(rc, rb).pvalue) if np.any(d_abs != 0) else 1.0
        except ValueError:
            p = float("nan")
    else:
        sb, sc = boot_stat(base, n_boot, rng), boot_stat(cand, n_boot, rng)
        lo, hi = (float(v) for v in np.quantile(sc / sb, [a, 1 - a]))
        dl, dh = (float(v) for v in np.quantile(sc - sb, [a, 1 - a]))
        ratio = mc / mb if mb > 0 else math.inf
        delta = mc - mb
        if len(base) >= 2 and len(cand) >= 2 and mb > 0 and mc > 0:
            # A percentile bootstrap over a handful of rounds is too narrow (it cannot reach past the
            # extreme round medians). Widen to a Welch t interval on log round medians (ratio) and on
            # round medians (delta), centred on the point estimates, whichever is wider.
            for logs in (True, False):
                xb, xc = (np.log(rb), np.log(rc)) if logs else (rb, rc)
                vb_, vc_ = xb.var(ddof=1) / xb.size, xc.var(ddof=1) / xc.size
                se = math.sqrt(vb_ + vc_)
                if se <= 0:
                    continue
                df = (vb_ + vc_) ** 2 / ((vb_ ** 2 / (xb.size - 1) if vb_ else 0) + (vc_ ** 2 / (xc.size - 1) if vc_ else 0))
                t = float(sps.t.ppf(1 - a, max(df, 1.0)))
                if logs:
                    c = math.log(ratio)
                    tl, th = math.exp(c - t * se), math.exp(c + t * se)
                    widened |= tl < lo or th > hi
                    lo, hi = min(lo, tl), max(hi, th)
                else:
                    dl, dh = min(dl, delta - t * se), max(dh, delta + t * se)
        if len(base) >= 3 and len(cand) >= 3:
            x, y = rb, rc
        else:
            x, y = np.concatenate(base), np.concatenate(cand)
        try:
            p = float(sps.mannwhitneyu(x, y, alternative="two-sided").pvalue)
        except ValueError:
            p = float("nan")
    one = len(base) < 2 or len(cand) < 2  # one process (set) on a side: no spread between them is known
    return {
        "ratio": ratio, "ci_low": lo, "ci_high": hi,
        "delta_us": delta, "delta_ci_low": dl, "delta_ci_high": dh,
        "p_value": p, "verdict": "provisional" if one else verdict(ratio, lo, hi, min_effect),
        "base_median": mb, "cand_median": mc, "n_rounds": [len(base), len(cand)], "paired": bool(paired),
        "within_process_only": len(base) < 2 or len(cand) < 2, "ci_widened_by_t": widened,
        "ci_method": "paired trimmed t" if paired else "independent bootstrap+Welch",
        "trimmed_rounds": trimmed_count(len(base)) if paired else 0, "min_effect": min_effect,
    }


def attribute(wall: dict | None, host: dict | None, device: dict | None) -> tuple[str | None, str]:
    """Is a wall-time difference host overhead, device (kernel) time, or both?

    Rules: no attribution when the wall verdict is same/ambiguous or there is no device clock (CPU).
    ``host`` if the device comparison is "same" (kernel time equal within the minimum effect);
    ``device`` if the host comparison is "same"; otherwise by the share of the wall delta that the
    device delta explains: >= 0.7 device, <= 0.3 host, else ``mixed``. Returns (attribution, why)."""
    if wall and wall["verdict"] == "provisional":
        return None, ("provisional ratio (" + (wall.get("provisional_why") or "one process set")
                      + "): no verdict, so nothing to attribute")
    if not wall or wall["verdict"] not in ("faster", "slower"):
        return None, "no wall-time difference to attribute"
    if not device:
        return None, "no device clock (CPU run): wall time is all host time"
    if device["verdict"] == "same":
        return "host", f"kernel time equal (device ratio {device['ratio']:.2f}) while wall ratio is {wall['ratio']:.2f}"
    if host and host["verdict"] == "same":
        return "device", f"host time equal (host ratio {host['ratio']:.2f}); device ratio {device['ratio']:.2f}"
    dw = wall["delta_us"]
    share = device["delta_us"] / dw if dw else 0.0
    if share >= 0.7:
        return "device", f"device time explains {share:.0%} of the wall difference"
    if share <= 0.3:
        return "host", f"device time explains only {share:.0%} of the wall difference"
    return "mixed", f"device time explains {share:.0%} of the wall difference"


def host_bound(host_median: float | None, device_median: float | None) -> bool | None:
    """A call is host-bound when its host dispatch time is >= its kernel time (µs medians)."""
    if host_median is None or device_median is None:
        return None
    return host_median >= device_median


def tflops(flops: float, us: float | None) -> float | None:
    """TFLOP/s for ``flops`` done in ``us`` microseconds."""
    if not us or us <= 0:
        return None
    return flops / (us * 1e-6) / 1e12


def gbps(nbytes: float | None, us: float | None) -> float | None:
    """GB/s (10^9 bytes per second) for ``nbytes`` moved in ``us`` microseconds (kvcache decode:
    the KV bytes a call must read, config.Case.kv_read_bytes)."""
    if nbytes is None or not us or us <= 0:
        return None
    return nbytes / (us * 1e-6) / 1e9


# -- anytime-valid comparison of lockstep process sets (the current method) ---------------------
#: Error rate of a run's verdicts on one clock (e-BY over its comparisons: select_family).
FAMILY_ALPHA = 0.05
#: ``ci_method`` of a :func:`set_compare` result.
SET_METHOD = "lockstep sets, anytime t-CS"
#: Share trimmed from each end of a set's per-cycle log ratios (Tukey-McLaughlin / Yuen: 20 %).
CYCLE_TRIM = 0.2
#: The glitch guard (method /4, :func:`set_compare`): a cycle whose log ratio lies more than this
#: from the comparison's centre so far (the median of the earlier sets' unguarded values, from the
#: fourth set on: :data:`GLITCH_AFTER`) is left out of its set's value, and counted
#: (``dropped_cycles``; :func:`_unglitched`). A set with few cycles of a case (2-3 once it is
#: nearly decided) cannot trim: on the H200 (2026-12-04, an A/A run, batch-512 S150 fwd, set 10 of
#: 28) one burst took 8,004 µs instead of ~550 (a stall of the whole ~5 ms burst) in a set of two
#: cycles; its set value, log ratio 1.25 against the others' +-0.05, widened that comparison's
#: interval to [0.866, 1.279] where its sibling runs had +-1 %, and no later set could undo it.
#: log 2: twice or half the comparison's typical ratio -- far beyond what the CPU's speed moves a
#: cycle's ratio by (the batch-512 S50 fwd ratio 1.10-1.20 from the fast to the slow state) and
#: 5-14 per-cycle SDs in an A/A run. The centre is the median of the earlier sets' unguarded
#: values (so one glitched set cannot move it, nor a guarded centre feed on itself) and the rule
#: treats both envs alike, so an A/A run's intervals keep their level.
#: Pinned sets only (method /5; /4 guarded every set): in sets that ran unpinned, cycles spread
#: widely around per-process offsets (per-cycle log-ratio SD 0.34-0.42 on the H200), and cutting
#: them at a centre taken from the earlier sets pulls each set towards those sets' median. The
#: simulation on the H200 probe's unpinned A/A pseudo-sets (benchmarks/sim_lockstep.py, 2,000 runs
#: of up to 20 sets): runs with a false faster/slower verdict 9.35 % with the guard vs 1.40 %
#: without; its pinned and A/A rows were unchanged (benchmarks/results/
#: sim-lockstep-guard-every-set.txt, method /4; sim-lockstep-guard.txt, /5).
GLITCH_LOG = math.log(2.0)
#: The guard starts once this many earlier sets give its centre (the first set has a case's most
#: cycles, 9 or more, and its trimmed mean).
GLITCH_AFTER = 3
#: A guard whose reach follows the comparison's own per-cycle spread, measured and NOT adopted
#: (off: the results methods all reach :data:`GLITCH_LOG`). With it, a cycle is left out when its
#: log ratio lies more than ``GLITCH_K`` robust SDs of the earlier sets' cycles from the centre
#: (:func:`glitch_reach`), never nearer than :data:`GLITCH_MIN_LOG` nor farther than
#: :data:`GLITCH_LOG`, from the second set on (:func:`glitch_centre`). Why it was tried: on the H200
#: in the CPU's slowest state yet (speed probe ~8 µs, 2026-12-04), single bursts 1.6-1.8x slow (one
#: batch-512 S150 bwd burst 2,860 µs beside ~1,610, in a set with one cycle of that case) came
#: through the log 2 guard, and each such set widened an A/A interval (to [0.90, 1.07] where its
#: sibling intervals had +-1-2 %). Why not: replayed on 58 H200 runs (benchmarks/guard_reach_replay.py,
#: benchmarks/results/guard-reach-replay-12-04.txt) it made 14 instead of 13 of 33 A/A runs hold
#: every wall interval inside +-3 %, and in the 25 2.6.3-vs-2.7.0.post2 runs it left out 2.7.0.post2's
#: slow cycles twice as often as 2.6.3's (344 of 524): the heavier version stalls more often, a cost of its own
#: that a tighter guard would hide from the ratio.
GLITCH_ADAPTIVE = False
#: Robust SDs of reach of the adaptive guard (:func:`glitch_reach`; 6, 10 and 15 replayed).
GLITCH_K = 10.0
#: The nearest the adaptive guard (:data:`GLITCH_ADAPTIVE`) reaches: a 10 % step is beyond anything the CPU's speed states
#: move a batch-512 set's ratio by (B512 S50 fwd 1.12-1.15x in the fast state, 1.16-1.21x in the
#: slow one), so a quiet comparison's real shifts are never cut.
GLITCH_MIN_LOG = math.log(1.1)
#: The sets the mixing of a *pass* clock's confidence sequence (kernel time, CUDA graph: one pass
#: per worker and set, taken "while undecided", runner._needed) is tuned for, whatever the run plans
#: for its wall clock. Kernel time hardly moves between processes, so these clocks stop as soon as
#: their sequence is finite and narrow; tuned for the ~24 planned sets it is unbounded below 6 sets,
#: tuned for 4 it is finite from 3 (at level 0.05) and at 10 sets as narrow (4.19 SE either way).
#: Replayed on the 65 committed H200 runs of method /2 (benchmarks/pass_clock_replay.py,
#: benchmarks/results/pass-clock-replay-12-03.txt): every kernel comparison decided after 4.8 sets
#: on average instead of 6.2, no false faster/slower (all were A/A: same kernel sources), ~1.5 s of
#: profiler passes per 60 s run given back to the cycles. Fixed before any data (method /3), so the
#: sequence stays valid at every n.
PASS_N_TARGET = 4


@functools.lru_cache(maxsize=256)
def lai_mixing(n_target: int, alpha: float) -> float:
    """The mixing precision ``c`` of :func:`t_cs` that makes the confidence sequence narrowest at
    ``n_target`` observations (for unit sample variance), searched on a log grid. Chosen from the
    planned number of process sets before any data is seen, so it does not affect validity."""
    grid = np.geomspace(0.005, 50.0, 400)
    best, arg = math.inf, 1.0
    for c in grid:
        w = _t_cs_halfwidth(n_target, float(n_target - 1), alpha, float(c))
        if w < best:
            best, arg = w, float(c)
    return arg


def _t_cs_halfwidth(n: int, q: float, alpha: float, c: float) -> float:
    """Half-width of the t-mixture confidence sequence at n observations with ``q`` = sum of squared
    deviations from their mean (see :func:`t_cs`); inf while it is unbounded."""
    if n < 2:
        return math.inf
    r = (alpha * alpha * c / (n + c)) ** (1.0 / n)
    den = n * n - (1.0 - r) * (n + c) * n
    if den <= 0:
        return math.inf
    return math.sqrt(max(q, 0.0) * (1.0 - r) * (n + c) / den)


def sets_for_finite(alpha: float, c: float, limit: int = 10_000) -> int | None:
    """The fewest observations (process sets) at which :func:`t_cs` at level 1 - ``alpha`` and mixing
    ``c`` gives a finite interval (its half-width's denominator n^2 - (1-r)(n+c)n > 0); None beyond
    ``limit``. It depends on the level and the mixing only, not on the data: the report's "about N
    are needed" (a fixed 5 had told a run with 6 sets at level 0.0125 that 5 were needed: new-user
    trial)."""
    for n in range(2, limit + 1):
        if math.isfinite(_t_cs_halfwidth(n, 1.0, alpha, c)):
            return n
    return None


def t_cs(x, alpha: float, c: float) -> tuple[float, float, float]:
    """Anytime-valid confidence sequence for the mean of i.i.d. Gaussian observations ``x`` with
    unknown variance: returns (mean, low, high), valid *simultaneously* over every n, so it can be
    looked at after every observation and the sampling stopped whenever (no peeking penalty).

    The Gaussian-mixture form of Lai's (1976) t confidence sequence (Wang & Ramdas, "Anytime-valid
    t-tests and confidence sequences for Gaussian means with unknown variance", 2023): with
    S = sum(x_i - mu) and V = sum (x_i - mu)^2, the scale-invariant likelihood ratio mixed over the
    standardized effect with a N(0, 1/c) prior is M_n(mu) = sqrt(c/(n+c)) (V/(V - S^2/(n+c)))^(n/2),
    a test martingale in the reduced (scale-invariant) filtration; by Ville's inequality
    P(exists n: M_n(mu) >= 1/alpha) <= alpha. Solving M_n(mu) < 1/alpha for mu gives
    |mean - mu| < sqrt(Q (1-r)(n+c) / (n^2 - (1-r)(n+c) n)), r = (alpha^2 c/(n+c))^(1/n),
    Q = sum (x_i - mean)^2: unbounded while the denominator is <= 0 (too few observations).
    Time-uniform coverage is checked by simulation in tests/test_stats.py. NaN/inf in ``x`` are
    dropped."""
    a = np.asarray([v for v in x if v is not None and math.isfinite(v)], dtype=float)
    n = a.size
    if n == 0:
        return math.nan, -math.inf, math.inf
    m = float(a.mean())
    q = float(((a - m) ** 2).sum())
    h = _t_cs_halfwidth(n, q, alpha, c)
    return m, m - h, m + h


#: ``sampling.cpu_state: usual`` (off by default; measured, see config.Sampling.cpu_state): a cycle
#: counts only when both of its bursts' speed-probe readings (``ref_by_set``, µs) lie within this
#: log distance of the comparison's usual CPU speed (:func:`usual_speed` of its first set's
#: readings). The H200 machine's vCPU reads the probe at two levels, ~3.0-4.5 µs and ~6-9 µs, with
#: almost nothing between 4.5 and 5.5 (the readings of the 54 default runs of 2026-12-04, 2,600-4,400
#: each): log 1.3 holds one level and none of the other.
STATE_REACH = math.log(1.3)


def usual_speed(readings: list) -> float | None:
    """The CPU's usual speed-probe reading, µs: the middle (median) of the shortest window of log
    readings that holds half of them (the shorth; Rousseeuw & Leroy 1988, a mode estimator that a
    second speed level holding fewer readings cannot move); None without a finite reading > 0."""
    x = sorted(math.log(v) for v in readings if isinstance(v, (int, float)) and math.isfinite(v) and v > 0)
    if not x:
        return None
    h = (len(x) + 1) // 2
    i = min(range(len(x) - h + 1), key=lambda j: x[j + h - 1] - x[j])
    return math.exp(_median(x[i:i + h]))


def _in_state(base: dict, cand: dict, bprobe: dict, kprobe: dict, usual: float,
              reach: float = STATE_REACH) -> tuple[dict, dict, int]:
    """One set's cycles (``base``/``cand``: cycle id -> burst median) kept to those whose two bursts'
    probe readings (``bprobe``/``kprobe``: cycle id -> µs) both lie within ``reach`` of ``usual``
    (log distance); a cycle without both readings is kept (nothing to judge it by). Returns the kept
    dicts and how many paired cycles (:func:`_paired`) were left out. Treats both envs alike, so an
    A/A comparison stays centred on 1."""
    kb, kc, left = {}, {}, 0
    lu = math.log(usual)
    for cy, b in base.items():
        k = cand.get(cy)
        pb, pk = bprobe.get(cy), kprobe.get(cy)
        judged = all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (pb, pk))
        if judged and (abs(math.log(pb) - lu) > reach or abs(math.log(pk) - lu) > reach):
            left += any(True for _ in _paired({cy: b}, {cy: k}))
            continue
        kb[cy] = b
        if k is not None:
            kc[cy] = k
    return kb, kc, left


def _trimmed_mean(d: list) -> float | None:
    if not d:
        return None
    d = sorted(d)
    g = int(math.floor(CYCLE_TRIM * len(d)))
    return float(np.mean(d[g:len(d) - g]))


def _paired(base: dict, cand: dict):
    """(baseline, candidate) burst medians of the cycles both have (paired by cycle id, never by
    position), both finite and > 0; a set's ratio and delta use the same pairs."""
    for cy, b in base.items():
        k = cand.get(cy)
        if b is not None and k is not None and math.isfinite(b) and math.isfinite(k) and b > 0 and k > 0:
            yield b, k


def _unglitched(base: dict, cand: dict, center: float, reach: float = GLITCH_LOG) -> tuple[dict, dict, int]:
    """The glitch guard on one set's cycles: ``base``/``cand`` (cycle id -> burst median) kept to
    the paired cycles (:func:`_paired`'s rule) whose log ratio lies within ``reach`` of ``center``
    (:data:`GLITCH_LOG`; :func:`glitch_reach` with :data:`GLITCH_ADAPTIVE`), and how many paired cycles it left out."""
    kb, kc, dropped = {}, {}, 0
    for cy, b in base.items():
        k = cand.get(cy)
        if not any(True for _ in _paired({cy: b}, {cy: k})):
            continue
        if abs(math.log(k) - math.log(b) - center) > reach:
            dropped += 1
        else:
            kb[cy], kc[cy] = b, k
    return kb, kc, dropped


def cycle_mad(base: dict, cand: dict) -> float | None:
    """One set's median absolute deviation of its paired per-cycle log ratios from their median
    (:func:`_paired`); None with fewer than two pairs. The adaptive guard's scale (:func:`glitch_reach`)."""
    d = [math.log(k) - math.log(b) for b, k in _paired(base, cand)]
    if len(d) < 2:
        return None
    m = _median(d)
    return _median([abs(x - m) for x in d])


def glitch_reach(mads: list) -> float:
    """How far from the centre the adaptive glitch guard (:data:`GLITCH_ADAPTIVE`) lets a cycle's log ratio lie: ``GLITCH_K``
    x 1.4826 x the median of the earlier sets' :func:`cycle_mad` values (1.4826 x MAD estimates a
    normal SD), clamped to [:data:`GLITCH_MIN_LOG`, :data:`GLITCH_LOG`]; :data:`GLITCH_LOG` while no
    earlier set had two cycles. Uses earlier sets only, so each set's value stays predictable from
    the past, and treats both envs alike."""
    m = [x for x in mads if x is not None and math.isfinite(x)]
    if not m:
        return GLITCH_LOG
    return min(GLITCH_LOG, max(GLITCH_MIN_LOG, GLITCH_K * 1.4826 * _median(m)))


def glitch_centre(raw: list, adaptive: bool = True) -> float | None:
    """The glitch guard's centre for the next set from the earlier sets' unguarded log ratios
    ``raw`` (in run order): their median once there are :data:`GLITCH_AFTER` (one glitched set
    among them cannot move it); before that, the adaptive guard (``adaptive``, :data:`GLITCH_ADAPTIVE`)
    takes the first set's value alone -- the trimmed mean of its 9 or more cycles of the case, which
    a stalled burst or two cannot move -- and the results methods have no guard yet (None)."""
    if len(raw) >= GLITCH_AFTER:
        return float(np.median(raw))
    return float(raw[0]) if adaptive and raw else None


def unpinned_sets(sets: list | None) -> frozenset:
    """Ids of the process sets that ran unpinned (set records' ``pinned`` false: results.json
    ``sets``, runner records), which the glitch guard leaves whole (:data:`GLITCH_LOG`, method /5).
    Set ids repeat across the shards or runs of a merged document: an id unpinned in any of them is
    left whole in all (no guard is method /3's rule, valid as well)."""
    return frozenset(s.get("set") for s in sets or [] if isinstance(s, dict) and s.get("pinned") is False)


def set_delta(base: dict, cand: dict) -> float | None:
    """One process set's observation of candidate - baseline in µs per call: the 20 % trimmed mean
    of the paired per-cycle differences (:func:`_paired`)."""
    return _trimmed_mean([k - b for b, k in _paired(base, cand)])


def set_log_ratio(base: dict, cand: dict) -> float | None:
    """One process set's observation of log(candidate / baseline) from its lockstep cycles:
    ``base``/``cand`` map cycle id -> burst median (µs per call); cycles are paired by id (never by
    position, :func:`_paired`), and the set's value is the 20 % trimmed mean of the paired per-cycle
    log ratios (a transient disturbance of one burst is one outlying cycle). None without a pair."""
    return _trimmed_mean([math.log(k) - math.log(b) for b, k in _paired(base, cand)])


def _set_order(s):
    """Process-set ids in the order they ran (ints, or their strings in JSON)."""
    try:
        return (0, int(s))
    except (TypeError, ValueError):
        return (1, str(s))


def comparison_pairs(envs: list) -> list[tuple[str, str]]:
    """The run's comparisons, as (baseline, candidate) env labels, from ``envs`` = [(label, axis)] in
    run order (the envs that can be compared). Without a torch axis (any ``axis`` None) every env
    is compared with the first. In a version x torch matrix (``axis`` = {version, torch}, envs.cross_torch):
    within each torch, every version with the first version there; within each version, every torch
    with the first torch there -- the two questions a torch axis asks ("which version is faster on
    this torch?", "did this torch change this version?"), never a version and a torch at once. The
    Bonferroni family is these pairs (x cases) of one clock."""
    labels = [lab for lab, _ in envs]
    if len(labels) < 2:
        return []
    if any(ax is None for _, ax in envs):
        return [(labels[0], lab) for lab in labels[1:]]
    out: list[tuple[str, str]] = []
    for key in ("torch", "version"):
        groups: dict = {}
        for lab, ax in envs:
            groups.setdefault(ax[key], []).append(lab)
        for labs in groups.values():
            out += [(labs[0], lab) for lab in labs[1:]]
    return out


def pairs_among(labels: list[str], pairs: list | None = None) -> list[tuple[str, str]]:
    """The (baseline, candidate) ``pairs`` whose two envs are both in ``labels`` (the envs still
    compared: a failed env drops out); None: every label against the first."""
    if pairs is None:
        return [(labels[0], lab) for lab in labels[1:]] if labels else []
    return [(b, k) for b, k in pairs if b in labels and k in labels]


def set_compare(base_sets: dict, cand_sets: dict, *, min_effect: float = 0.05, family_size: int = 1,
                family_alpha: float = FAMILY_ALPHA, n_target: int = 8, cycles: bool = True,
                provisional: bool = False, plain: tuple | None = None, selective: bool = True,
                pass_target: int | None = PASS_N_TARGET, glitch_guard: bool = True,
                unguarded_sets: frozenset = frozenset(), glitch_adaptive: bool | None = None,
                probes: tuple | None = None) -> dict | None:
    """Compare one clock of one case between two envs measured in lockstep process sets.

    ``base_sets``/``cand_sets`` map a process-set id to that set's data: with ``cycles`` a dict
    cycle id -> burst median (µs per call; wall and host clocks, paired by cycle inside the set), else a
    list of µs samples (device, graph: one profiler or graph pass per worker and set; the set's
    value is the log ratio of the two medians). Sets are paired by id. The process set is the unit:
    each set gives one log ratio (:func:`set_log_ratio`), and the ratio's interval is the
    anytime-valid t confidence sequence (:func:`t_cs`) over the sets' log ratios at level
    1 - family_alpha/family_size: Bonferroni over the run's comparisons of this clock, valid by
    itself however early the run stops. :func:`select_family` then narrows the intervals of the
    comparisons that are decided (e-BY); the runner and the results call it on every clock's
    comparisons. ``selective`` (results/2 method "/2"): the mixing is tuned for ``family_alpha`` (the
    level e-BY reports when every comparison is decided; one e-process per comparison at every
    level); False: for family_alpha/family_size, as runs of method "/1" were judged. ``provisional``
    (``--quick``, or a single set): the ratio is given, the verdict is "provisional", never
    faster/slower.

    Returns ``{ratio, ci_low, ci_high, delta_us, delta_ci_low, delta_ci_high, verdict, base_median,
    cand_median, n_sets, sets, set_log_ratios, set_deltas, alpha, ci_method, paired, selection}``;
    ``base_median``/``cand_median`` (µs): the median over the compared sets of each set's median, as
    the case tables give it; ratio > 1: the candidate is slower; ``alpha``: the interval's level is 1 - alpha; None when no
    set has both sides. ``delta_us`` (µs per call) is the mean over sets of each
    set's trimmed mean of the paired per-cycle differences (device/graph: difference of the set's
    medians), with the same kind of interval. ``unbounded``: too few sets yet for a finite interval.
    ``plain``: (baseline, candidate) sets of the bursts' plain medians where ``base_sets``/``cand_sets``
    hold them at one reference CPU speed (:class:`SpeedSlope`): the ratio and verdict come from the
    adjusted values, ``delta_us`` and the medians from the plain ones (what a call costs on this
    machine; a fixed-time cost is not rescaled by the speed). ``pass_target``: the sets the mixing
    is tuned for when not ``cycles`` (a pass clock: :data:`PASS_N_TARGET`, method /3); None: for
    ``n_target`` like the wall clock (methods /1 and /2, as their runs were judged). ``glitch_guard``
    (method /4; False: as runs of methods /1-/3 were judged): in the cycled clocks, from the
    fourth set on, a set's cycles whose log ratio lies more than :data:`GLITCH_LOG` from the median
    of the earlier sets' unguarded values are left out of that set's ratio and delta (a set left
    with none is not used); ``dropped_cycles`` counts them. ``unguarded_sets``: ids of sets the guard
    leaves whole (method /5: the sets that ran unpinned, :data:`GLITCH_LOG`); their values still
    enter the centre. ``glitch_adaptive`` (None: :data:`GLITCH_ADAPTIVE`, off): the guard's reach
    is :func:`glitch_reach` of the earlier sets' cycles instead of :data:`GLITCH_LOG`, and it starts
    from the second set (:func:`glitch_centre`) -- measured, not adopted (see GLITCH_ADAPTIVE).
    ``probes``: (baseline, candidate) sets of the bursts' speed-probe readings (set id -> cycle id ->
    µs; ``ref_by_set``) for ``sampling.cpu_state: usual``: in the cycled clocks, before the guard, a
    set keeps only the cycles whose two bursts both ran at the comparison's usual CPU speed
    (:func:`_in_state`: within :data:`STATE_REACH` of ``usual_probe_us``, :func:`usual_speed` of the
    first set's readings, fixed for the rest: one speed for every set, known before the later sets,
    and the readings are not the timings); ``state_dropped`` counts what it left out. The ratio is
    then the one at that speed. (The H200 runs ``reports/h200-variant-cpu-state-*`` took it from
    every earlier set's readings instead, and 483 of the day's 1,584 replayed comparisons then
    switched between the two speeds from set to set: fixed since.)"""
    if glitch_adaptive is None:
        glitch_adaptive = GLITCH_ADAPTIVE
    ids = sorted((s for s in base_sets if s in cand_sets), key=_set_order)
    obs, deltas, used, raw, mads = [], [], [], [], []
    dropped = state_dropped = 0
    usual = None  # probes: the comparison's usual CPU speed, fixed by its first set with readings
    pb, pk = plain if plain else (base_sets, cand_sets)
    for s in ids:
        b, k = base_sets[s], cand_sets[s]
        if cycles and probes:
            bp, kp = (probes[0] or {}).get(s) or {}, (probes[1] or {}).get(s) or {}
            if usual is None:
                usual = usual_speed([v for p in (bp, kp) for cy, v in p.items() if cy in b and cy in k])
            if usual is not None:
                b, k, n = _in_state(b, k, bp, kp, usual)
                state_dropped += n
        if cycles:
            # the guard's centre: the median of the earlier sets' unguarded values (predictable, and
            # one glitched set among them cannot move it), from the fourth set on
            ctr = glitch_centre(raw, glitch_adaptive) if glitch_guard and s not in unguarded_sets else None
            b0, k0 = b, k
            r0 = set_log_ratio(b, k)
            if r0 is not None:
                raw.append(r0)
            if ctr is not None:
                b, k, n = _unglitched(b, k, ctr, glitch_reach(mads) if glitch_adaptive else GLITCH_LOG)
                dropped += n
            if glitch_adaptive:  # the reach's scale, after this set's own guard: earlier sets only
                mads.append(cycle_mad(b0, k0))
            v = set_log_ratio(b, k)  # None when the guard left no cycle: the set is not used
            dv = (set_delta({cy: (pb.get(s) or {}).get(cy, x) for cy, x in b.items()},
                            {cy: (pk.get(s) or {}).get(cy, x) for cy, x in k.items()}) if plain else set_delta(b, k))
        else:
            bv = [x for x in b if x is not None and math.isfinite(x) and x > 0]
            kv = [x for x in k if x is not None and math.isfinite(x) and x > 0]
            v = math.log(_median(kv)) - math.log(_median(bv)) if bv and kv else None
            dv = _median(kv) - _median(bv) if bv and kv else None
        if v is not None:
            obs.append(v)
            deltas.append(dv if dv is not None else math.nan)
            used.append(s)
    if not obs:
        return None

    def med(sets):
        # the median over the compared sets of each set's median (bursts, or a pass's samples): the
        # case tables' "µs" (stats.summarize, in results.case_record); pooling every burst had given another number
        # beside the same table (new-user trial: 32.56 vs 33.0 µs)
        meds = []
        for s in used:
            d = sets[s]
            vals = [x for x in (d.values() if isinstance(d, dict) else d) if x is not None and math.isfinite(x)]
            if vals:
                meds.append(_median(vals))
        return _median(meds) if meds else math.nan

    mb, mc = med(pb if all(s in pb for s in used) else base_sets), med(pk if all(s in pk for s in used) else cand_sets)
    alpha = family_alpha / max(1, family_size)
    out = {
        "base_median": mb, "cand_median": mc, "n_sets": len(obs), "sets": used,
        "set_log_ratios": obs, "set_deltas": deltas, "family_size": family_size, "family_alpha": family_alpha,
        "cs_mixing": lai_mixing(n_target if cycles or not pass_target else pass_target,
                                family_alpha if selective else alpha),
        "ci_method": SET_METHOD, "paired": True,
        "n_rounds": [len(obs), len(obs)], "within_process_only": len(obs) < 2, "p_value": None,
        "provisional": bool(provisional or len(obs) < 2), "selection": None, "selected": None,
        "dropped_cycles": dropped, "min_effect": min_effect,
    }
    if probes:
        out["state_dropped"] = state_dropped
        out["usual_probe_us"] = usual
    out.update(_at_level(out, alpha, min_effect))
    return out


def _at_level(cmp: dict, alpha: float, min_effect: float) -> dict:
    """A :func:`set_compare` result's interval (ratio and delta) and verdict at level 1 - ``alpha``:
    the same e-process (its sets, its mixing ``cs_mixing``) read at another threshold."""
    c = cmp["cs_mixing"]
    m, lo, hi = t_cs(cmp["set_log_ratios"], alpha, c)
    ratio, rlo, rhi = math.exp(m), math.exp(lo) if lo > -math.inf else 0.0, math.exp(hi) if hi < math.inf else math.inf
    dm, dlo, dhi = t_cs(cmp["set_deltas"], alpha, c)
    v = "provisional" if cmp["provisional"] else verdict(ratio, rlo, rhi, min_effect)
    return {"ratio": ratio, "ci_low": rlo, "ci_high": rhi, "unbounded": rhi == math.inf,
            "delta_us": dm, "delta_ci_low": dlo, "delta_ci_high": dhi, "verdict": v, "alpha": alpha,
            "min_effect": min_effect}


#: The two kinds of decision :func:`select_family` selects separately.
SELECTIONS = (("faster", "slower"), ("same",))


def select_family(cmps: list, *, family_alpha: float = FAMILY_ALPHA, family_size: int | None = None,
                  min_effect: float = 0.05) -> None:
    """The run's verdicts on one clock, held together by **e-BY** (Xu, Wang & Ramdas, "Post-selection
    inference for e-value based confidence intervals", Electronic Journal of Statistics 2024): each
    comparison's confidence sequence is the level set of one e-process (:func:`t_cs`: its mixture
    martingale at the stop is an e-value), and for ANY data-dependent selection S of the m
    comparisons, reporting the selected ones' intervals at level 1 - alpha |S| / m keeps the false
    coverage rate (expected share of reported intervals missing their true ratio) <= alpha, under
    any dependence between the comparisons. The selection here, made separately for the
    faster/slower verdicts and for the "same" verdicts (:data:`SELECTIONS`): the largest k such that
    at least k comparisons reach that decision at level 1 - alpha k / m (a step-up, like BH; the
    intervals are nested, so exactly k do, and none outside S does at level 1 - alpha/m). The rest
    keep level 1 - alpha/m (Bonferroni: :func:`set_compare`), where they are "ambiguous".

    What it guarantees: among faster/slower verdicts, the expected share with an interval missing
    the true ratio is <= alpha; when no version differs at all (A/A) every such verdict misses, so
    the chance of ANY false faster/slower verdict in the run stays <= alpha (family-wise, as with
    Bonferroni); likewise for the intervals of "same" verdicts. What it buys: a run whose m
    comparisons are all decided alike (all faster/slower, or all same) reports each at 1 - alpha
    instead of 1 - alpha/m (the t-CS at 10 sets: 3.85 instead of 5.79 standard errors for m = 12,
    alpha 0.05); k of them decided alike, at 1 - alpha k/m.

    ``cmps``: :func:`set_compare` results of one clock (None entries are skipped), changed in place
    (``ratio``, interval, delta interval, ``verdict``, ``alpha``, ``selection`` = "faster/slower" or
    "same" with ``selected`` = k, the number selected with it); ``family_size``: m (default: the
    comparisons given; more when the run's other comparisons are timed elsewhere, shard module:
    a shard's selection is then a subset of the run's, which keeps its levels valid)."""
    live = [c for c in cmps if c and not c.get("provisional")]
    m = max(family_size or 0, len(live))
    if not live:
        return
    for kinds in SELECTIONS:
        for k in range(len(live), 0, -1):
            a = family_alpha * k / m
            at = [(c, _at_level(c, a, min_effect)) for c in live]
            hit = [(c, r) for c, r in at if r["verdict"] in kinds]
            if len(hit) >= k:
                for c, r in hit:
                    c.update(r, selection="/".join(kinds), selected=len(hit))
                break


# -- comparisons at equal CPU speed (the speed probe) ------------------------------------------
#: Bounds of the slope of log(call µs) on log(probe µs): 0 = the call does not follow the CPU's
#: speed (GPU-bound), 1 = it scales with it exactly; 1.5 leaves room for estimation noise.
SLOPE_BOUNDS = (0.0, 1.5)


def within_sums(groups) -> tuple[float, float, float, float]:
    """Pooled within-group sums for a least-squares slope with each group's own mean removed:
    ``groups`` are [n, sum x, sum y, sum x^2, sum x*y]; returns (S_xx, S_xy, n, sum x) over the groups
    with n >= 2. The slope is S_xy / S_xx (:class:`SpeedSlope`; benchmarks/speed_probe.py)."""
    sxx = sxy = n_all = sx_all = 0.0
    for n, sx, sy, xx, xy in groups:
        if n < 2:
            continue
        sxx += xx - sx * sx / n
        sxy += xy - sx * sy / n
        n_all += n
        sx_all += sx
    return sxx, sxy, n_all, sx_all


#: ``sampling.probe_share: estimated`` (the default): earlier pinned process sets needed before the
#: share is estimated (until then it is 1, the whole difference counts, as with ``full``). Replayed
#: (benchmarks/probe_center_replay.py --min-sets N; benchmarks/results/probe-center-replay-12-04-b.txt):
#: on the CPU self-check's 9 A/A runs of 2026-12-04 "same" 36 of 36 from 1, 2 or 3 earlier sets, 35 of
#: 36 from 8 (the set with the probe offset came before the share was estimated), 1-2 of 72 intervals
#: excluding 1 from any of them; on the H200's 65 default runs 1 to 8 earlier sets all gave nearly the
#: runs as made (A/A batch-2 median +-1.94-1.95 % vs +-1.92 %, seed batch-2 fwd +-3.44-3.46 % vs
#: +-3.44 %). 8 had been the first choice (2026-12-04), but a live CPU A/A run lost its four
#: comparisons to an offset in its 6th set; 3 leaves only the first three sets exposed.
PROBE_SHARE_MIN_SETS = 3
#: ``sampling.probe_share: estimated``: a set's between-worker probe difference counts (times the share)
#: only up to this many times the largest one of the earlier pinned sets (any case, any env): the share
#: is not carried beyond the probe differences it was estimated on. Why: CPU self-check of 2026-12-05
#: (this 2-core machine), A/A run 9 set 4: worker b's probe read 6.41 µs against a's 3.73 while their
#: calls matched (35.5 vs 35.0 µs); the first four sets had probe differences of ~1 %, which gave no
#: spread to judge a share by (1), and the adjustment turned the probe difference into a set ratio of
#: 0.61 that left all four of the run's comparisons "ambiguous" at +-5-12 %. Replayed
#: (benchmarks/probe_center_replay.py --as-full --clip K, benchmarks/results/probe-reach-replay-12-05.txt):
#: on the 39 CPU self-check A/A runs of 2026-12-04/05, 156 of 156 comparisons "same" with 2 or 3 (152
#: without, 154 with 5); on 139 H200 runs (95 A/A) 3 changed 4 runs by at most 0.2 %-points of one
#: interval and no verdict or +-3 % count, 2 changed 8.
PROBE_SHARE_REACH = 3.0
#: ... and before the share is estimated (the first PROBE_SHARE_MIN_SETS pinned sets, which count all of
#: the difference), an env's *set-wide* difference (the median over the set's cases of its dm, log, its
#: probe from the envs' mean: two envs' probes 0.2 apart, 1.22x) counts up to this; one case's dm may
#: go further (a case with 1-2 cycles in a set can meet a different CPU speed in each worker's turn,
#: which its calls felt). Why: same self-check, A/A run 2 set 0: worker b's probe read 6.39 µs against
#: a's 3.77, calls 36.3 vs 35.6 µs, set ratio 0.64 and four "ambiguous" comparisons. On the H200 the
#: co-pinned workers' set-wide probe difference (two envs) never exceeded 0.110 in 3,400 sets of 150
#: runs (p99 0.068): replayed (benchmarks/results/probe-reach-replay-12-05.txt), every H200 run as
#: with PROBE_SHARE_REACH alone; holding each case's dm instead changed 46 of 139 H200 runs, and
#: counting none of it before the share cost A/A runs (all 12 inside +-3 % in 9 of 95 instead of 18).
PROBE_FIRST_REACH = 0.1
#: The threshold of ``estimated`` runs whose results.json does not record one (made before
#: settings.probe_share_min_sets existed, with the first choice): what a resume keeps and the report names.
PROBE_SHARE_MIN_SETS_UNRECORDED = 8


def recorded_min_sets(settings: dict) -> int:
    """The threshold an ``estimated`` run's results record (settings.probe_share_min_sets, a whole
    number >= 1), else :data:`PROBE_SHARE_MIN_SETS_UNRECORDED`: what a --resume keeps and the report names."""
    k = settings.get("probe_share_min_sets")
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else PROBE_SHARE_MIN_SETS_UNRECORDED


def probe_share(groups) -> float:
    """How much of a process set's *between-worker* speed-probe difference its calls felt too, from
    earlier sets: the least-squares slope of y on x with each group's own mean removed, clamped to
    [0, 1]; 1 where there is no spread to judge by.

    ``groups``: per (case, env), the earlier sets' points (x, y): x = beta * dm, dm the mean over the
    set's cycles of the env's log probe reading less the mean over the set's envs (a whole-set
    difference between the workers' probes), beta the case's speed slope (:class:`SpeedSlope`); y
    the same for the plain log burst medians (µs). The speed adjustment moves a set's values by
    beta * dm, as if that difference were CPU speed the calls felt; the share says how much of it
    was. Why (benchmarks/results/probe-center-replay-12-04.txt): on the H200 the share over a run's
    sets is ~1 (median 0.95, 0.55-1.45 over 58 runs: the workers of a set meet different CPU
    speeds and the calls follow them), while on the 2-core CPU machine it is -0.03 to 0.52: there a
    worker's probe can read 20-25 % slower than its partner's for the whole set while their calls
    match (a per-process offset of the probe, not of the CPU), and the full adjustment turned that
    into a 20-25 % set ratio in an A/A run (CPU self-check 2026-12-04 evening: 8 of 40 comparisons
    not "same", all in the two runs with such sets). The share is estimated from earlier sets only,
    so a set's values are fixed before they are judged (the confidence sequence needs that)."""
    sums = []
    for pts in groups:
        pts = [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
        sums.append([len(pts), sum(x for x, _ in pts), sum(y for _, y in pts), sum(x * x for x, _ in pts),
                     sum(x * y for x, y in pts)])
    sxx, sxy, _, _ = within_sums(sums)  # each group's own mean removed, as SpeedSlope's slope
    if sxx <= 1e-12:
        return 1.0
    return min(1.0, max(0.0, sxy / sxx))


class SpeedSlope:
    """How a case's call time follows the CPU's speed, pooled over the bursts timed so far.

    Why (H200, 2026-12-01, benchmarks/speed_probe.py on traced runs): the vCPU a process set is
    pinned to runs at two speeds, the probe (worker.speed_probe) reading ~3.6 or ~7.5 µs, switching
    every 0.1-1 s (the host's doing, each vCPU by itself: benchmarks/results/h200-cpu-map-12-04.txt). A batch-2 call follows it (1.7x slower in the slow state), so two bursts of one
    cycle ms apart can differ by 2x, and that was most of the per-cycle noise (SD 0.08-0.14).
    Each timed sample is bracketed by two probe readings; with x = their mean log and y = the
    sample's log µs, the burst's value is the median of y - beta (x - center)
    (worker.speed_adjusted). This is the least-squares slope of y on x *within* each worker
    process (each process's own mean removed, so per-process offsets and the versions' difference
    do not enter it), pooled over workers and both versions, clamped to SLOPE_BOUNDS; ``center``
    is the median of the bursts' median x (so a burst's adjusted value stays near its plain median
    in level: the µs shown are what the calls typically took). Both are fixed before a cycle from earlier bursts only and are the
    same for both versions of a cycle, so: the centre cancels in the cycle's log ratio, and the
    adjusted ratio estimates the same thing as the raw one wherever the two versions' bursts see
    the same CPU speeds on average -- which the design gives (one core, turns in random order,
    reversed on the next cycle). Measured effect on the same cycles: batch-2 per-cycle SD
    0.08-0.11 -> 0.04-0.07 in an A/A run; batch-512 calls (slope ~0.1) are barely changed."""

    def __init__(self):
        self.per: dict = {}  # worker process id -> [n, sx, sy, sxx, sxy]
        self.x_medians: list = []  # the bursts' median log probe readings

    def add(self, proc_id, fit, x_median=None) -> None:
        """Add one burst's ``fit`` ([n, sum x, sum y, sum x^2, sum xy], worker.speed_adjusted) and
        its median x."""
        if isinstance(x_median, (int, float)) and math.isfinite(x_median):
            self.x_medians.append(float(x_median))
        if not fit or len(fit) != 5 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in fit):
            return
        acc = self.per.setdefault(proc_id, [0.0] * 5)
        for i, v in enumerate(fit):
            acc[i] += v

    def state(self) -> dict:
        """What a --resume needs to carry the slope on (:meth:`restored`), written into each set's speed
        record (results.json ``speed_by_set``): the pooled within-worker sums ``fit_n``, ``fit_sxx``,
        ``fit_sxy`` (log probe µs, log call µs), the centre ``fit_center`` and the bursts behind it
        ``fit_bursts``."""
        sxx, sxy, n_all, sx_all = within_sums(self.per.values())
        center = self._center(n_all, sx_all) if n_all else 0.0
        return {"fit_n": n_all, "fit_sxx": float(f"{sxx:.8g}"), "fit_sxy": float(f"{sxy:.8g}"),
                "fit_center": float(f"{center:.8g}"), "fit_bursts": len(self.x_medians)}

    @classmethod
    def restored(cls, rec: dict) -> "SpeedSlope":
        """A slope that carries on from a --resume's earlier sets: ``rec``, the latest set's speed record
        (:meth:`state`'s keys), stands in for their workers (one pooled group) and their bursts' centre.
        Why: a resume's workers are new processes, and a slope started afresh from their first few
        bursts could reach 1.3-1.5 where the run's had been 0.1-0.3 (new-user trial 2026-12-05: an A/A
        run extended by 2 sets, whose probes read 4.46 vs 3.97 µs, got set ratios 1.08-1.18 and all
        four comparisons "ambiguous"). A record without them (a run from before, 2026-12-05): afresh."""
        s = cls()
        try:
            n, sxx, sxy = float(rec["fit_n"]), float(rec["fit_sxx"]), float(rec["fit_sxy"])
        except (KeyError, TypeError, ValueError):
            return s
        if n >= 2 and math.isfinite(sxx) and math.isfinite(sxy) and sxx > 0:
            s.per["earlier sets"] = [n, 0.0, 0.0, sxx, sxy]  # its mean removed already: sum x = sum y = 0
        c, k = rec.get("fit_center"), rec.get("fit_bursts")
        if isinstance(c, (int, float)) and math.isfinite(c) and isinstance(k, (int, float)) and k >= 1:
            s.x_medians = [float(c)] * int(k)
        return s

    def beta_center(self) -> tuple[float, float]:
        """(slope, centre): 0 and 0 (no adjustment) until the workers have >= 8 samples with spread."""
        sxx, sxy, n_all, sx_all = within_sums(self.per.values())
        if n_all < 8 or sxx <= 1e-9:
            return 0.0, 0.0
        lo, hi = SLOPE_BOUNDS
        return min(hi, max(lo, sxy / sxx)), self._center(n_all, sx_all)

    def _center(self, n_all: float, sx_all: float) -> float:
        """The centre (log probe µs): the median of the bursts' median x, else the pooled mean x
        (``n_all`` > 0 samples summing to ``sx_all``)."""
        return _median(self.x_medians) if self.x_medians else sx_all / n_all


# --------------------------------------------------------------------------------------------
# Machine modes: process sets that ran at two speeds left after the CPU-speed adjustment (a mode of
# the machine the speed probe does not read, or a CPU speed state the adjustment missed:
# report.machine_modes tells them apart by the probe's readings).
#
# Seen on the H200 on 2026-12-05 (reports/h200-2.6.3-vs-2.7.0.post2-12-05-11/, -12/,
# benchmarks/heavy_mode.py): in 13-19 of a run's 21-28 sets the calls ran ~1.2x slower (speed-
# adjusted, the probe reading the same), and not by one factor: 2.7.0.post2's
# batch-2 forward ~1.7x, 2.6.3's ~1.2x, so that comparison's set ratio was ~2.0x in one group of
# sets and ~2.7x in the other and its interval ±12 % instead of ±2-5 %. The sampling cannot
# average that away (the ratio itself moved); the report can say so. The split is found from all
# of the run's timings at once (a set's common slowdown), not from the comparison being explained.

MODE_MIN_SETS = 3  # sets in each group: one or two odd sets are outliers, not a mode
MODE_MIN_SERIES = 6  # (env, case) wall series the index is the median over: 3 cases of 2 envs
MODE_FACTOR = 1.10  # the groups' common slowdown at least this (smaller ones: noise of the index)
MODE_LEVEL = 0.99  # the split's separation beyond this quantile of its value for normal noise
MODE_P = 0.01  # a comparison's two groups differ: Welch's t test on the sets' log ratios (A/A: 0 of 224 named at 0.01)


def set_slowdown_index(series: list) -> dict:
    """Each process set's common slowdown, as a log factor: for every (env, case) wall series
    ({set id: µs per call}, the set's median burst, speed-adjusted), log(set µs / the series'
    median over sets), then the median over the series a set appears in (a set in fewer than half
    of the series is left out). 0 is a typical set; log(1.2) one where calls ran 1.2x slower.
    {} with fewer than :data:`MODE_MIN_SERIES` usable series (3+ sets each)."""
    usable = [s for s in series if sum(1 for v in s.values() if _finite_pos(v)) >= 3]
    if len(usable) < MODE_MIN_SERIES:
        return {}
    logs: dict = {}
    for s in usable:
        vals = {k: math.log(v) for k, v in s.items() if _finite_pos(v)}
        mid = float(np.median(list(vals.values())))
        for k, v in vals.items():
            logs.setdefault(k, []).append(v - mid)
    return {k: float(np.median(v)) for k, v in logs.items() if 2 * len(v) >= len(usable)}


def _finite_pos(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _two_means(v: np.ndarray, min_n: int) -> tuple[int, float]:
    """Best split of sorted ``v`` (rows: samples) into a low and a high group of ``min_n`` or more
    (least within-group sum of squares, 1-D two-means, exact): (index of the first high value,
    separation = difference of the groups' means / pooled within-group SD). ``v``: 1-D or 2-D."""
    v = np.atleast_2d(v)
    n = v.shape[1]
    cs, cs2 = np.cumsum(v, axis=1), np.cumsum(v * v, axis=1)
    i = np.arange(min_n, n - min_n + 1)
    na, nb = i, n - i
    sa, sa2 = cs[:, i - 1], cs2[:, i - 1]
    sb, sb2 = cs[:, -1:] - sa, cs2[:, -1:] - sa2
    ss = (sa2 - sa * sa / na) + (sb2 - sb * sb / nb)
    k = np.argmin(ss, axis=1)
    rows = np.arange(v.shape[0])
    diff = sb[rows, k] / nb[k] - sa[rows, k] / na[k]
    sep = diff / np.sqrt(np.maximum(ss[rows, k], 1e-300) / (n - 2))
    return int(i[k[0]]), sep


@functools.lru_cache(maxsize=64)
def mode_threshold(n: int, level: float = MODE_LEVEL, draws: int = 4000) -> float:
    """The ``level`` quantile of :func:`_two_means`' separation for ``n`` sets of normal noise
    (one group, no mode): a split beyond it is not what one level's noise makes. Simulated with a
    fixed seed (4,000 draws; at 99 %: n=12 5.2, n=20 4.5, n=26 4.1, n=46 3.6). Heavier-tailed
    noise gives larger separations (Student t with 3 df, n=26: 4.6 at 99 %), hence also
    :data:`MODE_MIN_SETS`, :data:`MODE_FACTOR` and the test of each comparison (:func:`ratio_by_mode`);
    on the committed runs (benchmarks/machine_modes.py) no A/A comparison was found to differ."""
    x = np.sort(np.random.default_rng(20261205).standard_normal((draws, n)), axis=1)
    return float(np.quantile(_two_means(x, MODE_MIN_SETS)[1], level))


def mode_split(index: dict) -> dict | None:
    """Split process sets into a usual and a slow group when ``index`` (:func:`set_slowdown_index`)
    shows two levels: the exact 1-D two-means split with at least :data:`MODE_MIN_SETS` sets a
    side, kept when its separation exceeds :func:`mode_threshold` for this many sets and the slow
    group's median is :data:`MODE_FACTOR` or more times the usual group's. Returns {"usual":
    [set ids], "slow": [set ids], "factor": slow / usual median slowdown, "separation",
    "threshold"}, or None (fewer than 2 x MODE_MIN_SETS + 2 sets, or no such split)."""
    items = sorted(((v, k) for k, v in index.items() if math.isfinite(v)), key=lambda t: t[0])
    n = len(items)
    if n < 2 * MODE_MIN_SETS + 2:
        return None
    v = np.array([t[0] for t in items])
    cut, sep = _two_means(v, MODE_MIN_SETS)
    sep = float(sep[0])
    factor = math.exp(float(np.median(v[cut:])) - float(np.median(v[:cut])))
    thr = mode_threshold(n)
    if not (sep > thr and factor >= MODE_FACTOR):
        return None
    return {"usual": [k for _, k in items[:cut]], "slow": [k for _, k in items[cut:]],
            "factor": factor, "separation": sep, "threshold": thr}


def ratio_by_mode(sets: list, set_log_ratios: list, split: dict, min_effect: float = 0.05) -> dict | None:
    """A comparison's ratio in each group of :func:`mode_split`: the median over the group's sets
    of the set ratios (``sets``/``set_log_ratios``: results.json comparison fields, same order).
    Returns {"usual": ratio, "slow": ratio, "n_usual", "n_slow", "p": Welch's t test of the two
    groups' log ratios, "differs": p < :data:`MODE_P` and the two ratios more than
    ``min_effect`` apart}, or None when a group has fewer than 2 of this comparison's sets."""
    where = {str(k): g for g in ("usual", "slow") for k in split[g]}
    groups: dict = {"usual": [], "slow": []}
    for s, x in zip(sets, set_log_ratios):
        g = where.get(str(s))
        if g and isinstance(x, (int, float)) and math.isfinite(x):
            groups[g].append(float(x))
    a, b = groups["usual"], groups["slow"]
    if len(a) < 2 or len(b) < 2:
        return None
    ru, rs = math.exp(float(np.median(a))), math.exp(float(np.median(b)))
    if np.std(a) == 0 and np.std(b) == 0:
        p = 0.0 if ru != rs else 1.0
    else:
        p = float(sps.ttest_ind(a, b, equal_var=False).pvalue)
    return {"usual": ru, "slow": rs, "n_usual": len(a), "n_slow": len(b), "p": p,
            "differs": bool(p < MODE_P and abs(math.log(rs / ru)) > math.log1p(min_effect))}
