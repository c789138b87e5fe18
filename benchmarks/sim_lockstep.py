"""Does the lockstep stop rule keep a run's false verdicts at <= 5 %? (simulation on real H200 data)

matrix-run's measurement (runner and stats module docs): process sets; per set and case one log
ratio (``stats.set_log_ratio``: 20 % trimmed mean of the paired per-cycle log ratios); per
comparison an anytime-valid t confidence sequence over the sets (``stats.t_cs``, mixing
``stats.lai_mixing(n_target, alpha)``), each alone at level alpha/m, the m = 12 wall-time comparisons
held together by e-BY (``stats.select_family``: k decided alike at alpha k/m; rows "Bonferroni:" and
results/2 method "/1": alpha/m alone, mixing tuned for it; alpha = 0.05); the runner looks after
every set and stops when every wall comparison is
decided (``stats.verdict``, min_effect 0.05), or at max_sets. A decided comparison whose interval
is within ``Sampling.precision`` (1 %) of its ratio is no longer sampled (runner ``_cycles``). The
claim: an A/A run of 12 comparisons ends with ANY false faster/slower verdict in <= 5 % of runs.

Each simulated run draws real process sets with replacement (the bootstrap: the pool's empirical
distribution plays the truth) and applies the runner's rule after every set from set 1:

(a) A/A: the pooled A/A sets of benchmarks/data/h200-lockstep-cycles-2026-12-01.json (runs aa1, aa2,
    aa3, aa-extra), per case; variants: as measured (pool mean log ratio not exactly 0, shown per
    case), sets and cycles within them resampled, whole process sets drawn jointly for the 12 cases,
    each case's pool re-centred to log ratio 0 (the null exactly true), and re-centred then offset
    by +1 % / -1 % (inside min_effect, so faster/slower is still false);
(b) pseudo-sets of 10 consecutive cycles (A1 vs A2 and B1 vs B2, real A/A pairs) cut from the
    earlier lockstep probe (../shared/data/lockstep-h200-2026-12-01.json): pinned sets (the
    design), unpinned sets (a stress case), and a "same processes" stress case where all of a
    comparison's sets come from one pair of worker processes (what fresh processes per set avoid);
(c) power: the seed run's sets (2.7.0.post2 vs 2.6.3): per case the share of runs ending slower
    (and the other verdicts), the half-width and sets at stop;
(d) contrast: the A/A resampling of (a) judged the old way (a fixed-n 95 % t interval over the
    sets' log ratios, ``stats._trimmed_ci``, re-tested after every set from set 2, no family
    correction), and one fixed-n look at 9 sets.

The runs are vectorized over the simulated runs (NumPy) with the stats module's own pieces: the
sets' log ratios from ``stats.set_log_ratio``, the interval's width factor from
``stats._t_cs_halfwidth`` (t_cs's half-width is sqrt(Q) times it), the mixing from
``stats.lai_mixing``, ``stats.verdict``'s rule, ``stats.trimmed_count``. Every variant is also
replayed for its first ``--check`` runs through ``stats.set_compare`` (A/A and power; the old way
through ``stats._trimmed_ci`` + ``stats.verdict``) set by set, exactly as the runner calls them, and
the verdicts and set counts are required to agree. The rule simulated is results method /5: from
a comparison's fourth set on, the glitch guard (stats.GLITCH_LOG, stats._unglitched) leaves out of a
drawn *pinned* set the cycles whose log ratio lies more than log 2 from the median of that
comparison's earlier sets' unguarded values in the same simulated run (:func:`guard`; the replay
calls set_compare with the guard on, the unpinned pools' sets in ``unguarded_sets``);
``--guard-unpinned``: method /4 (the guard in unpinned sets too); ``--no-guard``: method /3, as
benchmarks/results/sim-lockstep-s10.txt was made. Usage:
python benchmarks/sim_lockstep.py [--runs 2000] [--seed 20261201] [--check 40] [--no-guard | --guard-unpinned]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
import zlib
from pathlib import Path

import numpy as np
from scipy import stats as sps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, ROOT.as_posix())
from matrix_runner import stats
from matrix_runner.config import Sampling
from matrix_runner.results import read_text

DATA1 = ROOT / "benchmarks/data/h200-lockstep-cycles-2026-12-01.json"
DATA2 = ROOT / "../shared/data/lockstep-h200-2026-12-01.json"
AA_RUNS = ("aa1", "aa2", "aa3", "aa-extra")
M = 12
SAMPLING = Sampling()
E, ALPHA, PRECISION = SAMPLING.min_effect, SAMPLING.alpha, SAMPLING.precision
N_TARGET = SAMPLING.planned_sets  # 12 with the default 60 s budget and 3 s sets, before any machine pace is known
CYCLE_RESAMPLES = 100  # per real set, for "cycles resampled too"
PROBE_BLOCK = 10  # consecutive probe cycles per pseudo-set
CODES = ("ambiguous", "same", "faster", "slower")  # 0 also stands for provisional (one set)
GUARD = True  # the glitch guard of method /5 (--no-guard: method /3)
GUARD_UNPINNED = False  # --guard-unpinned: method /4's guard, in unpinned sets too
#: What :func:`guard` did over the whole simulation: drawn set values it changed, and sets it left
#: with no cycle (the runner leaves such a set out: it adds no observation, run_rule's ``valid``).
GUARD_COUNT: dict = {}  # family name -> {"values", "changed", "emptied"}


# ---------------------------------------------------------------------------------------- pools
class Pool:
    """Real (or pseudo-) process sets of one comparison: per item the paired cycles (base, cand µs)
    and its log ratio by stats.set_log_ratio."""

    def __init__(self, name: str, items: list, tags: list | None = None, pinned: bool = True):
        self.name, self.pinned = name, pinned
        self.items = [(np.asarray(b, float), np.asarray(k, float)) for b, k in items]
        self.tags = tags or [None] * len(items)
        self.lr = np.array([stats.set_log_ratio(dict(enumerate(b)), dict(enumerate(k))) for b, k in self.items])
        assert np.all(np.isfinite(self.lr)), name
        # the guard keeps every cycle of item i while its centre lies in [glo[i], ghi[i]]
        d = [np.log(k[(b > 0) & (k > 0)]) - np.log(b[(b > 0) & (k > 0)]) for b, k in self.items]
        self.glo = np.array([x.max() - stats.GLITCH_LOG for x in d])
        self.ghi = np.array([x.min() + stats.GLITCH_LOG for x in d])

    def guarded(self, i: int, center: float) -> float | None:
        """Item ``i``'s set log ratio with the glitch guard at ``center`` (stats._unglitched, then
        stats.set_log_ratio); None when it leaves no cycle."""
        b, k = self.items[i]
        kb, kc, _ = stats._unglitched(dict(enumerate(b.tolist())), dict(enumerate(k.tolist())), center)
        return stats.set_log_ratio(kb, kc)

    def __len__(self):
        return len(self.items)

    def cycles_resampled(self, rng: np.random.Generator, b: int) -> Pool:
        """Each set replaced by ``b`` copies with its cycles drawn with replacement (pairs kept);
        drawing an item uniformly = drawing a set, then its cycles."""
        items, tags = [], []
        for (base, cand), tag in zip(self.items, self.tags):
            for _ in range(b):
                ix = rng.integers(0, base.size, base.size)
                items.append((base[ix], cand[ix]))
                tags.append(tag)
        return Pool(self.name + " (cycles resampled)", items, tags, self.pinned)

    def subset(self, keep: list) -> Pool:
        return Pool(self.name, [self.items[i] for i in keep], [self.tags[i] for i in keep], self.pinned)

    def guarded_here(self) -> bool:
        """Whether the glitch guard cuts this pool's sets (method /5: pinned sets only)."""
        return GUARD and (self.pinned or GUARD_UNPINNED)


def short(cid: str) -> str:
    p = cid.split("-")
    return f"{p[0]} {p[1]} {p[2]}"


def read_data(path: Path) -> str:
    """A per-cycle data file as written, or gzipped beside it (``NAME.json.gz``: benchmarks/data/ keeps
    them gzipped, as archived runs are)."""
    return read_text(path if path.exists() else path.with_name(path.name + ".gz"))


def load_cycles() -> dict:
    d = json.loads(read_data(DATA1))
    out = {}
    for run, rv in d["runs"].items():
        for cid, cv in rv["cases"].items():
            out.setdefault(cid, {})[run] = {sid: np.asarray(cyc, float) for sid, cyc in cv["wall_us"].items()}
    return out


def aa_pools(cyc: dict) -> dict:
    pools = {}
    for cid, runs in cyc.items():
        items, tags = [], []
        for run in AA_RUNS:
            for sid, a in runs.get(run, {}).items():
                items.append((a[:, 0], a[:, 1]))
                tags.append((run, sid))
        pools[cid] = Pool(short(cid), items, tags)
    return pools


def joint(pools: dict) -> dict:
    """The pools restricted to the (run, set) present in every case, in one order: drawing one index
    for all cases draws whole process sets."""
    common = set.intersection(*(set(p.tags) for p in pools.values()))
    order = sorted(common)
    return {cid: p.subset([p.tags.index(t) for t in order]) for cid, p in pools.items()}


def probe_pools() -> dict | None:
    if not DATA2.exists():
        return None
    d = json.loads(DATA2.read_text())
    pools: dict = {}
    streams: dict = {}
    for pi, part in enumerate(d["parts"]):
        for si, s in enumerate(part["sets"]):
            key = ("pinned" if s["core"] is not None else "unpinned", s["op"], s["batch"])
            cyc = s["cycles"]
            for base, cand in (("A1", "A2"), ("B1", "B2")):
                b = np.array([c[base] for c in cyc])
                k = np.array([c[cand] for c in cyc])
                blocks = [(b[i:i + PROBE_BLOCK], k[i:i + PROBE_BLOCK])
                          for i in range(0, len(cyc) - PROBE_BLOCK + 1, PROBE_BLOCK)]
                tag = f"part{pi} set{si} core {s['core']} {cand}/{base}"
                pools.setdefault(key, []).extend(blocks)
                streams.setdefault(key, []).append(Pool(f"{s['op']} b{s['batch']} {tag}", blocks,
                                                        pinned=s["core"] is not None))
    return {"pools": {k: Pool(f"{k[0]} {k[1]} b{k[2]}", v, pinned=k[0] == "pinned") for k, v in pools.items()},
            "streams": streams}


# ------------------------------------------------------------------------------------- families
class Family:
    """The 12 comparisons of a simulated run: per comparison a pool (or, with ``streams``, a list
    of pools of which one is drawn per run) and a log shift added to the candidate."""

    def __init__(self, name: str, pools: list, shifts=None, joint: bool = False, streams: bool = False):
        self.name, self.pools, self.joint, self.streams = name, pools, joint, streams
        self.shifts = np.zeros(len(pools)) if shifts is None else np.asarray(shifts, float)
        assert len(pools) == M

    def draw(self, rng: np.random.Generator, runs: int, sets: int, guarded: bool = False):
        """(R, M, S) log ratios; the truth (R, M): the mean log ratio of what the sets are drawn from;
        per (r, j) the pool used and the item indices (for the replay); ``valid`` (R, M, S): whether
        the comparison's k-th drawn set gave an observation (all True unless ``guarded``, the glitch
        guard's values, :func:`guard`, whose L then holds each comparison's observations in order,
        NaN-padded)."""
        L = np.empty((runs, M, sets))
        truth = np.empty((runs, M))
        used = [[None] * M for _ in range(runs)]
        idx = np.empty((runs, M, sets), dtype=np.int64)
        if self.joint:
            n = len(self.pools[0])
            assert all(len(p) == n for p in self.pools)
            shared = rng.integers(0, n, (runs, sets))
        for j, p in enumerate(self.pools):
            if self.streams:
                pick = rng.integers(0, len(p), runs)
                for r in range(runs):
                    pool = p[pick[r]]
                    idx[r, j] = rng.integers(0, len(pool), sets)
                    L[r, j] = pool.lr[idx[r, j]]
                    truth[r, j] = pool.lr.mean()
                    used[r][j] = pool
            else:
                idx[:, j] = shared if self.joint else rng.integers(0, len(p), (runs, sets))
                L[:, j] = p.lr[idx[:, j]]
                truth[:, j] = p.lr.mean()
                for r in range(runs):
                    used[r][j] = p
        valid = np.ones(L.shape, bool)
        if guarded:
            L, valid = guard(L, used, idx, GUARD_COUNT.setdefault(self.name, {"values": 0, "changed": 0, "emptied": 0}))
        return L + self.shifts[None, :, None], truth + self.shifts[None, :], used, idx, valid


def guard(L: np.ndarray, used, idx: np.ndarray, count: dict) -> tuple[np.ndarray, np.ndarray]:
    """The glitch guard (method /5) on drawn set log ratios ``L`` (R, M, S; unshifted: a shift moves
    a set's cycles and the centre alike): from set stats.GLITCH_AFTER on, set k of comparison j in
    run r takes its item's value with the guard centred on the median of L[r, j, :k] (the earlier
    sets' unguarded values, as stats.set_compare); sets of an unpinned pool are left whole
    (Pool.guarded_here). Comparison j's k-th set is its k-th drawn item
    whether or not sets were skipped for it in between (a frozen comparison is not sampled), so the
    guard applies along the last axis before the rule runs. A set it leaves with no cycle gives no
    observation (stats.set_compare) but its unguarded value still enters later centres. Returns
    (each comparison's observations in draw order, NaN-padded at the end; per draw whether it gave
    one). Counts the values seen, changed and left with no cycle into ``count``."""
    R, J, S = L.shape
    out = L.copy()
    for k in range(stats.GLITCH_AFTER, S):
        C = np.median(L[..., :k], -1)  # (R, J)
        for j in range(J):
            pools = [used[r][j] for r in range(R)]
            if all(p is pools[0] for p in pools):
                lo, hi = pools[0].glo[idx[:, j, k]], pools[0].ghi[idx[:, j, k]]
                if not pools[0].guarded_here():
                    continue
            else:  # a pool per run (Family streams)
                lo = np.array([p.glo[i] if p.guarded_here() else -np.inf for p, i in zip(pools, idx[:, j, k])])
                hi = np.array([p.ghi[i] if p.guarded_here() else np.inf for p, i in zip(pools, idx[:, j, k])])
            count["values"] += R
            for r in np.flatnonzero((C[:, j] < lo) | (C[:, j] > hi)):
                v = pools[r].guarded(int(idx[r, j, k]), float(C[r, j]))
                if v is None:
                    count["emptied"] += 1
                    v = math.nan
                count["changed"] += v != L[r, j, k]
                out[r, j, k] = v
    valid = ~np.isnan(out)
    for r, j in zip(*np.nonzero(~valid.all(-1))):
        kept = out[r, j][valid[r, j]]
        out[r, j] = np.concatenate([kept, np.full(S - kept.size, math.nan)])
    return out, valid


# ----------------------------------------------------------------------------------- the rules
def prefix_cs(L: np.ndarray, n_target: int, selective: bool = True):
    """Per prefix length n (0..S): the t-CS (stats.t_cs) mean and half-widths of L[..., :n], at the
    levels e-BY reads (stats.select_family: 1 - ALPHA k/M for k = 1..M, mixing tuned for ALPHA), or,
    not ``selective`` (results/2 method "/1"), at 1 - ALPHA/M alone with its own mixing: hw has shape
    (R, J, S + 1, K)."""
    R, J, S = L.shape
    levels = [ALPHA * k / M for k in range(1, M + 1)] if selective else [ALPHA / M]
    c = stats.lai_mixing(n_target, ALPHA if selective else ALPHA / M)
    f = np.array([[stats._t_cs_halfwidth(n, 1.0, a, c) if n >= 1 else math.inf for a in levels]
                  for n in range(S + 1)])
    mean = np.full((R, J, S + 1), np.nan)
    hw = np.full((R, J, S + 1, len(levels)), np.inf)
    for n in range(1, S + 1):
        x = L[..., :n]
        m = x.mean(-1)
        q = ((x - m[..., None]) ** 2).sum(-1)
        mean[..., n] = m
        with np.errstate(invalid="ignore"):
            hw[..., n, :] = np.where(np.isfinite(f[n]), np.sqrt(q)[..., None] * f[n], math.inf)
    return mean, hw


def select(m: np.ndarray, h: np.ndarray, n: np.ndarray):
    """stats.select_family, vectorized over runs: ``h`` (R, J, K) half-widths at the K levels; per
    kind of decision (faster/slower, same) the largest k with >= k comparisons so decided at level
    k, those reported there; the rest at level 1 (ambiguous). Returns (codes, reported half-width)."""
    K = h.shape[-1]
    codes = np.stack([verdicts(m, h[..., k], n) for k in range(K)], -1)  # (R, J, K)
    code = verdicts(m, h[..., 0], n)
    hr = h[..., 0].copy()
    for kind in ((2, 3), (1,)):
        hit = np.isin(codes, kind)
        count = hit.sum(1)  # (R, K)
        ok = count >= np.arange(1, K + 1)[None, :]
        kstar = np.where(ok.any(1), K - 1 - np.argmax(ok[:, ::-1], 1), -1)  # largest k with count >= k
        for r in np.flatnonzero(kstar >= 0):
            sel = hit[r, :, kstar[r]]
            code[r, sel] = codes[r, sel, kstar[r]]
            hr[r, sel] = h[r, sel, kstar[r]]
    return code, hr


def prefix_t(L: np.ndarray, level: float = stats.CI_LEVEL):
    """Per prefix length n: stats._trimmed_ci (the old fixed-n paired t interval, trimmed from 7
    sets on) of L[..., :n], as (estimate, half-width) in log units."""
    R, J, S = L.shape
    mean = np.full((R, J, S + 1), np.nan)
    hw = np.full((R, J, S + 1), np.inf)
    for n in range(2, S + 1):
        d = np.sort(L[..., :n], axis=-1)
        g = stats.trimmed_count(n)
        est = d[..., g:n - g].mean(-1)
        w = np.clip(d, d[..., g:g + 1], d[..., n - g - 1:n - g])
        se = w.std(-1, ddof=1) / ((1 - 2 * g / n) * math.sqrt(n))
        t = float(sps.t.ppf(1 - (1 - level) / 2, n - 2 * g - 1))
        mean[..., n], hw[..., n] = est, t * se
    return mean, hw


def verdicts(m: np.ndarray, h: np.ndarray, n: np.ndarray) -> np.ndarray:
    """stats.verdict, vectorized (codes: CODES); fewer than 2 sets: provisional (0)."""
    up, down = 1.0 + E, 1.0 / (1.0 + E)
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = np.exp(m)
        lo = np.where(np.isfinite(h), np.exp(m - h), 0.0)
        hi = np.where(np.isfinite(h), np.exp(m + h), np.inf)
    slower = (ratio > up) & (lo > 1.0)
    faster = (ratio < down) & (hi < 1.0) & ~slower
    same = (lo >= down) & (hi <= up) & ~slower & ~faster
    code = np.where(slower, 3, np.where(faster, 2, np.where(same, 1, 0)))
    return np.where(n >= 2, code, 0)


def run_rule(L: np.ndarray, truth: np.ndarray, method: str, n_target: int = N_TARGET, freeze: bool = True,
             fixed_n: int | None = None, valid: np.ndarray | None = None):
    """The runner's loop on the drawn sets: after each set, every comparison's interval; stop when
    all are decided or at S sets. ``freeze``: a decided comparison within PRECISION is no longer
    sampled. ``fixed_n``: no looking, one verdict at that many sets. Also records whether an
    interval missed ``truth`` at the stop (``miss``) or at any look up to it (``miss_any``). ``valid``
    (R, J, S; Family.draw): whether a comparison's k-th sampled set gives an observation (L then
    holds the observations in order)."""
    R, J, S = L.shape
    mean, hw = prefix_cs(L, n_target, selective=method == "cs") if method in ("cs", "bonferroni") else prefix_t(L)
    if hw.ndim == 3:
        hw = hw[..., None]
    rr, jj = np.meshgrid(np.arange(R), np.arange(J), indexing="ij")
    if fixed_n is not None:
        n = np.full((R, J), fixed_n) if valid is None else valid[..., :fixed_n].sum(-1)
        m, h = mean[rr, jj, n], hw[rr, jj, n]
        code, h = select(m, h, n)
        miss = np.abs(m - truth) > h
        return {"code": code, "n": n, "hw": np.expm1(h), "sets": np.full(R, fixed_n),
                "by_decided": np.zeros(R, bool), "m": m, "miss": miss, "miss_any": miss}
    n = np.zeros((R, J), dtype=np.int64)
    frozen = np.zeros((R, J), bool)
    alive = np.ones(R, bool)
    out = {"code": np.zeros((R, J), np.int64), "n": np.zeros((R, J), np.int64), "hw": np.zeros((R, J)),
           "sets": np.zeros(R, np.int64), "by_decided": np.zeros(R, bool), "m": np.zeros((R, J)),
           "miss": np.zeros((R, J), bool), "miss_any": np.zeros((R, J), bool)}
    d = np.zeros((R, J), dtype=np.int64)  # sets sampled per comparison (n: observations)
    for s in range(1, S + 1):
        take = alive[:, None] & ~frozen
        if valid is None:
            n += take
        else:
            got = np.zeros_like(take)
            got[take] = valid[rr[take], jj[take], d[take]]
            d += take
            n += got
        m, h = mean[rr, jj, n], hw[rr, jj, n]
        code, h = select(m, h, n)
        decided = code > 0
        miss = np.abs(m - truth) > h  # inf half-width (too few sets): no miss
        out["miss_any"] |= alive[:, None] & miss
        done = alive & decided.all(1)
        stop = done | (alive & (s == S))
        for k, v in (("code", code), ("n", n), ("hw", np.expm1(h)), ("m", m), ("miss", miss)):
            out[k][stop] = v[stop]
        out["sets"][stop] = s
        out["by_decided"][done] = True
        alive &= ~stop
        if freeze:
            with np.errstate(over="ignore", invalid="ignore"):
                # recomputed at every look, as the runner does (runner._settled): with e-BY a settled
                # comparison is sampled again when the selection shrinks and its interval widens
                frozen = decided & (np.exp(m + h) / np.exp(m) - 1 <= PRECISION)
        if not alive.any():
            break
    return out


def replay(fam: Family, used, idx, r: int, S: int, method: str, n_target: int = N_TARGET, freeze: bool = True):
    """One run, scalar, exactly as the runner does it: per set, the sampled comparisons get the set's
    cycles (dicts cycle id -> µs, the candidate scaled by the family's shift); then every comparison
    is judged by stats.set_compare (or, old way, stats._trimmed_ci + stats.verdict); stop when all
    are decided or at S sets; a decided comparison within PRECISION is not sampled again."""
    base: list[dict] = [{} for _ in range(M)]
    cand: list[dict] = [{} for _ in range(M)]
    obs = [[] for _ in range(M)]
    k = [0] * M
    frozen = set()
    for s in range(S):
        for j in range(M):
            if j in frozen:
                continue
            b, c = used[r][j].items[idx[r, j, k[j]]]
            base[j][s] = dict(enumerate(b.tolist()))
            cand[j][s] = dict(enumerate((c * math.exp(fam.shifts[j])).tolist()))
            obs[j].append(stats.set_log_ratio(base[j][s], cand[j][s]))
            k[j] += 1
        res = []
        if method in ("cs", "bonferroni"):  # as runner.comparisons_now: each alone, then e-BY over them
            vs = [stats.set_compare(base[j], cand[j], min_effect=E, family_size=M, family_alpha=ALPHA,
                                    n_target=n_target, cycles=True, selective=method == "cs",
                                    glitch_guard=GUARD, unguarded_sets=frozenset() if used[r][j].guarded_here()
                                    else frozenset(range(S))) for j in range(M)]
            if method == "cs":
                stats.select_family(vs, family_alpha=ALPHA, family_size=M, min_effect=E)
        for j in range(M):
            if method in ("cs", "bonferroni"):
                v = vs[j]
                res.append((v["verdict"], v["n_sets"], v["ci_high"] / v["ratio"] - 1))
            else:
                if len(obs[j]) < 2:
                    res.append(("provisional", len(obs[j]), math.inf))
                    continue
                ratio, lo, hi, _ = stats._trimmed_ci(obs[j], exp=True)
                res.append((stats.verdict(ratio, lo, hi, E), len(obs[j]), hi / ratio - 1))
        decided = [v not in ("ambiguous", "provisional") for v, _, _ in res]
        if all(decided) or s + 1 == S:
            return res, s + 1
        if freeze:
            frozen = {j for j in range(M) if decided[j] and res[j][2] <= PRECISION}


def check(fam: Family, used, idx, out, S: int, method: str, n_runs: int, **kw) -> str:
    """Replays the first ``n_runs`` runs and up to ``n_runs`` runs with a false (A/A) or any
    faster/slower verdict; returns 'agreeing/replayed'."""
    first = list(range(min(n_runs, len(out["sets"]))))
    flagged = [r for r in np.flatnonzero((out["code"] >= 2).any(1)) if r >= n_runs][:n_runs]
    bad = 0
    for r in first + flagged:
        res, sets = replay(fam, used, idx, r, S, method, **kw)
        got = [(CODES[out["code"][r, j]], int(out["n"][r, j])) for j in range(M)]
        want = [("ambiguous" if v == "provisional" else v, n) for v, n, _ in res]
        if got != want or sets != out["sets"][r]:
            bad += 1
    n = len(first) + len(flagged)
    return f"{n - bad}/{n}"


# ------------------------------------------------------------------------------------- printing
def cp(k: int, n: int) -> tuple[float, float]:
    lo = 0.0 if k == 0 else float(sps.beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(sps.beta.ppf(0.975, k + 1, n - k))
    return lo, hi


def finite_mean(hw: np.ndarray) -> float:
    """Mean half-width in % over the finite ones (an unbounded interval: fewer than 5 sets)."""
    f = hw[np.isfinite(hw)]
    return 100 * float(f.mean()) if f.size else math.inf


def pct(x: float, d: int = 2) -> str:
    return f"{100 * x:.{d}f}%"


def summary_row(label: str, out: dict, chk: str, wrong_direction: bool = False) -> str:
    """``wrong_direction`` (real differences): false = a verdict against the sign of the truth."""
    code = out["code"]
    R = code.shape[0]
    if wrong_direction:
        false = ((code == 2) & (out["truth"] > 0)) | ((code == 3) & (out["truth"] < 0))
    else:
        false = (code >= 2)
    fam = int(false.any(1).sum())
    lo, hi = cp(fam, R)
    nf, ns = int((code == 2).sum()), int((code == 3).sum())
    return (f"{label:<58} {fam:>5}/{R:<5} {pct(fam / R):>7} [{pct(lo):>6},{pct(hi):>6}]  "
            f"{pct(false.mean(), 3):>7} ({nf:>3}f/{ns:>3}s) {pct((code == 1).mean(), 1):>6} "
            f"{pct((code == 0).mean(), 1):>6} {finite_mean(out['hw']):6.2f}% {out['sets'].mean():5.2f} "
            f"{pct(out['by_decided'].mean(), 1):>6} {pct(out['miss'].any(1).mean(), 1):>6} "
            f"{pct(out['miss_any'].any(1).mean(), 1):>6}  {chk}")


HEAD = (f"{'variant':<58} {'runs w/ any false':>17} {'(95% CI)':>16}  {'per-comparison false':>21} "
        f"{'same':>6} {'ambig':>6} {'hw@stop':>7} {'sets':>5} {'stop:all':>7} {'miss':>6} {'miss*':>6}  replay")
KEY = ("columns: runs ending with >= 1 false faster/slower verdict (Clopper-Pearson 95 % interval); share of\n"
       "the 12*runs comparisons ending faster/slower (f/s counts); ending 'same'; ending undecided (at the set\n"
       "cap); mean half-width at stop (ci_high/ratio - 1, as lockstep_summary prints it); mean sets per run;\n"
       "share of runs stopped because all 12 were decided (the rest hit the cap); miss: runs in which >= 1 of\n"
       "the 12 intervals at stop excludes the truth (the mean log ratio of what the sets are drawn from:\n"
       "the pool's mean, plus the offset); miss*: the same at ANY look up to the stop (what an anytime-valid\n"
       "interval bounds by alpha); replay: runs (the first --check, and up to --check more among those with a\n"
       "faster/slower verdict) whose verdicts and set counts stats.set_compare (old way: stats._trimmed_ci +\n"
       "stats.verdict) reproduced exactly when fed the same cycles set by set, agreeing/replayed.")


def per_case_table(names: list, out: dict, pools: list | None = None, shifts=None, truth: str = "pool mean") -> None:
    code = out["code"]
    print(f"  {'case':<22} {'pool':>4} {truth:>10} {'set sd':>7} {'faster':>7} {'slower':>7} {'same':>7} "
          f"{'ambig':>7} {'hw@stop':>8} {'sets':>5} {'miss':>6} {'miss*':>6}")
    for j, nm in enumerate(names):
        c = code[:, j]
        extra = ""
        if pools is not None:
            p = pools[j]
            mu = p.lr.mean() + (0 if shifts is None else shifts[j])
            extra = f"{len(p):>4} {100 * math.expm1(mu):>+9.2f}% {100 * p.lr.std(ddof=1):>6.2f}%"
        else:
            extra = f"{'':>4} {'':>10} {'':>7}"
        print(f"  {nm:<22} {extra} {pct((c == 2).mean()):>7} {pct((c == 3).mean()):>7} "
              f"{pct((c == 1).mean()):>7} {pct((c == 0).mean()):>7} {finite_mean(out['hw'][:, j]):7.2f}% "
              f"{out['n'][:, j].mean():5.2f} {pct(out['miss'][:, j].mean(), 1):>6} {pct(out['miss_any'][:, j].mean(), 1):>6}")


def rng_for(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# ----------------------------------------------------------------------------------------- main
def main() -> None:
    global DATA1, AA_RUNS, GUARD, GUARD_UNPINNED
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2000, help="simulated runs per variant (default 2000)")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--check", type=int, default=8, help="runs per variant replayed through stats.set_compare")
    ap.add_argument("--data", default=str(DATA1), help="per-cycle data (benchmarks/cycles_from_results.py format; "
                    "default: the morning runs)")
    ap.add_argument("--aa-runs", default=",".join(AA_RUNS), help="the A/A runs in --data (comma-separated)")
    ap.add_argument("--no-guard", action="store_true", help="method /3: no glitch guard (the default models method /5's)")
    ap.add_argument("--guard-unpinned", action="store_true", help="method /4: the glitch guard in unpinned sets too")
    a = ap.parse_args()
    DATA1, AA_RUNS = Path(a.data), tuple(r for r in a.aa_runs.split(",") if r)
    GUARD, GUARD_UNPINNED = not a.no_guard, a.guard_unpinned
    t0 = time.time()
    R, seed = a.runs, a.seed
    print(f"# python benchmarks/sim_lockstep.py --runs {R} --seed {seed} --check {a.check} --data {DATA1.name} "
          f"--aa-runs {','.join(AA_RUNS)}{' --no-guard' if not GUARD else ''}"
          f"{' --guard-unpinned' if GUARD_UNPINNED else ''}   "
          f"({datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, numpy {np.__version__})")
    print(f"# rule: t-CS, e-BY over the {M} comparisons (stats.select_family: decided ones at 1 - {ALPHA} k/{M}, "
          f"the rest at 1 - {ALPHA}/{M}), n_target {N_TARGET} (lai_mixing c = "
          f"{stats.lai_mixing(N_TARGET, ALPHA):.4f}), min_effect {E}, precision freeze {PRECISION}, "
          f"look after every set, stop when all {M} wall comparisons are decided or at the set cap; "
          f"rows 'Bonferroni:' judge every interval at 1 - {ALPHA}/{M} (results/2 method /1); "
          + (f"glitch guard (method {'/4' if GUARD_UNPINNED else '/5'}): from a comparison's set "
             f"{stats.GLITCH_AFTER + 1} on, cycles more than log {math.exp(stats.GLITCH_LOG):g} from the median of "
             f"its earlier sets left out of {'every set' if GUARD_UNPINNED else 'pinned sets'}" if GUARD
             else "no glitch guard (method /3)"))

    def go(fam: Family, S: int, method: str = "cs", label: str | None = None, n_target: int = N_TARGET,
           freeze: bool = True, fixed_n: int | None = None, wrong_direction: bool = False):
        rng = rng_for(seed, f"{fam.name}|{S}|{method}|{n_target}")
        L, truth, used, idx, valid = fam.draw(rng, R, S, guarded=GUARD and method in ("cs", "bonferroni"))
        out = run_rule(L, truth, method, n_target=n_target, freeze=freeze, fixed_n=fixed_n, valid=valid)
        out["truth"] = truth
        if fixed_n is None and a.check:
            chk = check(fam, used, idx, out, S, method, a.check, n_target=n_target, freeze=freeze)
        else:
            chk = "-"
        print(summary_row(label or f"{fam.name}, max {S} sets", out, chk, wrong_direction), flush=True)
        return out

    # ---------------------------------------------------------------------------------- (a)
    cyc = load_cycles()
    cids = list(cyc)
    names = [short(c) for c in cids]
    pools = aa_pools(cyc)
    plist = [pools[c] for c in cids]
    mu = np.array([p.lr.mean() for p in plist])
    print("\n(a) A/A: process sets of runs " + ", ".join(AA_RUNS) + " (flash-attn 2.6.3 on both sides), "
          "resampled per case with replacement")
    print("pool per case (sets, mean set log ratio as a ratio - 1, sd of the set log ratios):")
    for nm, p in zip(names, plist):
        per_run = {}
        for (run, _), v in zip(p.tags, p.lr):
            per_run.setdefault(run, []).append(v)
        print(f"  {nm:<22} {len(p):>3} sets  mean {100 * math.expm1(p.lr.mean()):+6.3f}%  sd {100 * p.lr.std(ddof=1):5.2f}%"
              f"  max |set| {100 * np.abs(p.lr).max():5.2f}%   per run: "
              + "  ".join(f"{r} {100 * np.mean(v):+.2f}" for r, v in per_run.items()))
    crng = rng_for(seed, "cycle resamples")
    cyc_pools = [p.cycles_resampled(crng, CYCLE_RESAMPLES) for p in plist]
    jpools = joint(pools)
    jlist = [jpools[c] for c in cids]
    fams = [
        Family("A/A as measured", plist),
        Family("A/A sets + cycles resampled", cyc_pools),
        Family(f"A/A whole sets (12 cases jointly, {len(jlist[0])})", jlist, joint=True),
        Family("A/A re-centred (log ratio 0)", plist, -mu),
        Family("A/A re-centred, offset +1%", plist, -mu + math.log(1.01)),
        Family("A/A re-centred, offset -1%", plist, -mu - math.log(1.01)),
        Family("A/A re-centred, sets + cycles resampled", cyc_pools, -np.array([p.lr.mean() for p in cyc_pools])),
    ]
    print(KEY)
    print(HEAD)
    outs_a = {}
    for S in (9, 20):
        for f in fams:
            outs_a[(f.name, S)] = go(f, S)
    for S in (9, 20):
        for f in (fams[0], fams[3]):
            go(f, S, method="bonferroni", label=f"Bonferroni: {f.name}, max {S} sets")
    go(fams[0], 20, label="A/A as measured, max 20 sets, n_target 20", n_target=20)
    go(fams[3], 20, label="A/A re-centred, max 20 sets, n_target 20", n_target=20)
    print("  'cycles resampled' adds the within-set cycle noise a second time (a real set's log ratio already\n"
          "  carries it): a pessimistic variant, wider intervals.")
    print("\ndiagnostic: the pool's size. Resampling a small pool repeats the same few sets (ties: a small sample\n"
          "variance), which real sets never do; with each A/A pool cut to 7 random sets (the seed run's size,\n"
          "see (c)) the intervals miss far more often than with the full pools:")
    print(HEAD)
    cut = rng_for(seed, "cut to 7")
    p7 = [p.subset(sorted(cut.choice(len(p), 7, replace=False).tolist())) for p in plist]
    for S in (9, 20):
        go(Family("A/A re-centred, pools cut to 7 sets", p7, -np.array([p.lr.mean() for p in p7])), S)
    print("\nsensitivity: a systematic bias below min_effect (re-centred pools + offset; faster/slower counted\n"
          "as false as above, though its direction would be right: the verdict needs ratio > 1.05 AND lo > 1)")
    print(HEAD)
    for S in (9, 20):
        for off in (2, 3, 4):
            go(Family(f"A/A re-centred, offset +{off}%", plist, -mu + math.log1p(off / 100)), S)
    print("\nper case, A/A as measured, max 9 sets (truth = the pool mean):")
    per_case_table(names, outs_a[("A/A as measured", 9)], plist)
    print("per case, A/A re-centred offset +1%, max 20 sets:")
    per_case_table(names, outs_a[("A/A re-centred, offset +1%", 20)], plist, -mu + math.log(1.01), truth="truth")

    # ---------------------------------------------------------------------------------- (b)
    print("\n(b) the earlier lockstep probe: pseudo-sets of "
          f"{PROBE_BLOCK} consecutive cycles (~40 ms bursts), A2/A1 and B2/B1 (real A/A pairs)")
    pr = probe_pools()
    if pr is None:
        print(f"  skipped: {DATA2} is absent")
    else:
        pp = pr["pools"]
        for k, p in sorted(pp.items(), key=lambda kv: str(kv[0])):
            print(f"  pool {p.name:<24} {len(p):>4} pseudo-sets  mean {100 * math.expm1(p.lr.mean()):+6.2f}%  "
                  f"sd {100 * p.lr.std(ddof=1):5.2f}%")
        for k, st in sorted(pr["streams"].items(), key=lambda kv: str(kv[0])):
            if k[0] == "pinned":
                print(f"  {k[0]} {k[1]} b{k[2]}: per pair of processes (15 pseudo-sets each), mean % : "
                      + " ".join(f"{100 * math.expm1(s.lr.mean()):+.2f}" for s in st))
        pin, unpin = pp[("pinned", "fwd", 2)], pp[("unpinned", "fwd", 2)]
        mixed = [pin] * 6 + [pp[("pinned", "fwd+bwd", 2)]] * 3 + [pp[("pinned", "fwd", 512)]] * 3
        mixed_mu = np.array([p.lr.mean() for p in mixed])
        famb = [
            Family("probe pinned, 12 x fwd b2", [pin] * M),
            Family("probe pinned, 12 x fwd b2, re-centred", [pin] * M, [-pin.lr.mean()] * M),
            Family("probe pinned, 6 fwd b2 + 3 fwd+bwd + 3 b512", mixed),
            Family("probe pinned, mixed, re-centred", mixed, -mixed_mu),
            Family("probe pinned, mixed, re-centred, +1%", mixed, -mixed_mu + math.log(1.01)),
            Family("probe unpinned (stress), 12 x fwd b2", [unpin] * M),
            Family("probe unpinned (stress), re-centred", [unpin] * M, [-unpin.lr.mean()] * M),
            Family("probe pinned, same processes (stress)", [pr["streams"][("pinned", "fwd", 2)]] * M, streams=True),
        ]
        print(KEY.split("\n")[0] + " ... (as in (a))")
        print(HEAD)
        outs_b = {}
        for S in (9, 20):
            for f in famb:
                outs_b[(f.name, S)] = go(f, S)
        print(f"  'same processes': every set of a comparison is cut from one pair of worker processes (one of the\n"
              f"  {len(pr['streams'][('pinned', 'fwd', 2)])} pinned fwd b2 pairs, drawn per comparison; truth for miss = that pair's mean), so a\n"
              "  per-process offset never averages out; the runner starts fresh processes for every set, which is\n"
              "  what the other rows model.")

    # ---------------------------------------------------------------------------------- (c)
    n_seed = len(next(iter(cyc.values()))["seed"])
    print(f"\n(c) power: the seed run (2.7.0.post2 vs 2.6.3), its {n_seed} process sets per case resampled; here 'false'\n"
          "is a verdict against the truth's direction (faster: every truth is > 1); slower is the right verdict\n"
          "where the truth is > +5 %; below +5 % (the three b512 sq150 bwd / sq300 cases) 'same' or undecided is")
    print("what the rule allows (see the per-case tables)")
    seed_pools = [Pool(short(c), [(a_[:, 0], a_[:, 1]) for a_ in cyc[c]["seed"].values()]) for c in cids]
    seed_cyc = [p.cycles_resampled(crng, CYCLE_RESAMPLES) for p in seed_pools]
    famc = [Family("seed", seed_pools), Family("seed, sets + cycles resampled", seed_cyc)]
    print(HEAD)
    outs_c = {}
    for S in (9, 20):
        for f in famc:
            outs_c[(f.name, S)] = go(f, S, wrong_direction=True)
    for S in (9, 20):
        for f in famc:
            print(f"per case, {f.name}, max {S} sets (truth = the pool's mean set ratio):")
            per_case_table(names, outs_c[(f.name, S)], f.pools, truth="truth")
    print("by case class (share of comparisons ending slower / same / undecided; mean half-width at stop):")
    classes = {"batch 2 fwd": [j for j, c in enumerate(cids) if c.startswith("fwd-b2-")],
               "batch 2 bwd": [j for j, c in enumerate(cids) if c.startswith("bwd-b2-")],
               "batch 512 fwd+bwd": [j for j, c in enumerate(cids) if "-b512-" in c]}
    for (fname, S), out in outs_c.items():
        parts = []
        for cl, js in classes.items():
            c = out["code"][:, js]
            parts.append(f"{cl}: slower {pct((c == 3).mean(), 1)} same {pct((c == 1).mean(), 1)} "
                         f"undecided {pct((c == 0).mean(), 1)} hw {finite_mean(out['hw'][:, js]):.2f}%")
        print(f"  {fname}, max {S}: " + "; ".join(parts))

    # ---------------------------------------------------------------------------------- (d)
    print("\n(d) contrast, the old way of looking: fixed-n 95 % t interval over the sets' log ratios "
          "(stats._trimmed_ci), re-tested after every set from set 2, no family correction, no freeze")
    print(HEAD)
    for S in (9, 20):
        for f in (fams[0], fams[3], fams[4]):
            go(f, S, method="t", label=f"old way: {f.name}, max {S} sets", freeze=False)
    for S in (9, 20):
        go(Family("A/A re-centred, offset +3%", plist, -mu + math.log1p(0.03)), S, method="t",
           label=f"old way: A/A re-centred, offset +3%, max {S} sets", freeze=False)
    for f in (fams[0], fams[3]):
        go(f, 9, method="t", label=f"old interval, one look at 9 sets: {f.name}", fixed_n=9)
        go(f, 9, method="cs", label=f"t-CS, one look at 9 sets: {f.name}", fixed_n=9)
    print("  With A/A set noise (set sd <= 2.7 %), a false faster/slower needs a point estimate beyond +/-5 %\n"
          "  (min_effect), which the old rule hardly produces either: on these data the false-verdict rate does\n"
          "  not tell the two rules apart; their intervals' coverage (miss, miss*) and the bias rows do.")
    if GUARD:
        print(f"\nglitch guard, per family (all its rows together): of the drawn set values from a comparison's set "
              f"{stats.GLITCH_AFTER + 1} on, the share it changed (a cycle left out), and how many it left with no cycle "
              "(no observation)")
        for name, g in GUARD_COUNT.items():
            if not g["values"]:
                print(f"  {name:<56} left whole (unpinned sets)")
                continue
            print(f"  {name:<56} {100 * g['changed'] / max(1, g['values']):7.3f} % of {g['values']:>7}, "
                  f"{g['emptied']} with no cycle")
    print(f"\n# {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
