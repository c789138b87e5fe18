"""Charts for the HTML report: matplotlib figures rendered to inline SVG.

Every function takes plain data (the report's view model rows) and returns an SVG string that is
safe to paste into the report as-is:

- drawn with matplotlib's object API (``Figure``, no pyplot: no global state, no GUI backend);
- text kept as ``<text>`` in the default DejaVu Sans (``svg.fonttype: none``), so nothing refers to
  a font file and the text stays searchable; the page falls back to a local sans-serif;
- no XML prolog, DOCTYPE, metadata or ``xmlns`` (inline SVG in HTML needs none of them), every
  ``id`` prefixed so that several charts on one page never share one, and any ``href`` that is not
  a same-document ``#fragment`` removed: a chart can never make the page fetch anything;
- user strings (case labels, version labels) are escaped by matplotlib's SVG writer and have ``$``
  neutralised so that they are never parsed as mathtext.

Charts degrade rather than fail: a CPU run has no device clock (the bars and curves show wall time
only), a run with one env has no ratio chart, and any exception while drawing is turned into a
short note by :func:`safe` so that the report is still written.
"""
from __future__ import annotations

import io
import math
import re

#: One colour per env (Okabe-Ito, colour-blind safe); baseline first.
ENV_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
VERDICT_COLORS = {"slower": "#c62828", "faster": "#2e7d32", "same": "#6b7280", "ambiguous": "#b7791f",
                  "provisional": "#0e7490"}
TENSOR_MARKERS = {"out": "o", "dq": "s", "dk": "^", "dv": "D"}
FONT = "'DejaVu Sans', 'Segoe UI', Roboto, Arial, sans-serif"

_RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "matrix-run",  # deterministic ids (then prefixed per chart)
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#9aa4ae",
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#e3e7eb",
    "grid.linewidth": 0.6,
    "xtick.color": "#3d4650",
    "ytick.color": "#3d4650",
    "legend.frameon": False,
    "legend.fontsize": 8.5,
    "hatch.linewidth": 0.7,
}


def env_color(i: int) -> str:
    return ENV_COLORS[i % len(ENV_COLORS)]


def plain(s) -> str:
    """A user string made safe for matplotlib text: no mathtext (``$``)."""
    return str(s).replace("$", r"\$")


# --------------------------------------------------------------------------------------------
# SVG post-processing
_PROLOG = re.compile(r"<\?xml[^>]*\?>\s*|<!DOCTYPE[^>]*>\s*", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
_XMLNS = re.compile(r'\s+xmlns(?::\w+)?="[^"]*"')
_FONTFAMILY = re.compile(r"font-family:\s*(?:'[^']*'|[\w -]+)(?:\s*,\s*(?:'[^']*'|[\w -]+))*")
_ID = re.compile(r'\bid="([^"]+)"')
_REF = re.compile(r'(url\(#|href="#)([^")]+)')
_EXTERNAL_HREF = re.compile(r'\s(?:xlink:)?href="(?!#)[^"]*"')
_URL = re.compile(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", re.I)


def clean_svg(svg: str, prefix: str) -> str:
    """Make matplotlib's SVG fit to inline in HTML (see module doc); raises if a URL survives."""
    svg = _PROLOG.sub("", svg)
    svg = _METADATA.sub("", svg)
    svg = _XMLNS.sub("", svg)
    svg = _FONTFAMILY.sub("font-family: " + FONT.replace('"', "'"), svg)
    svg = _ID.sub(lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = _REF.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", svg)
    svg = _EXTERNAL_HREF.sub("", svg)
    svg = svg.replace("*{stroke-linejoin", "svg.chart-svg *{stroke-linejoin")  # keep matplotlib's CSS to the chart
    # width/height in pt make the chart its natural size; CSS scales it down on narrow screens
    svg = re.sub(r"<svg ", '<svg role="img" class="chart-svg" ', svg, count=1)
    if _URL.search(svg):
        raise ValueError("chart SVG still refers to a URL")
    return svg.strip()


def to_svg(fig, prefix: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", pad_inches=0.08,
                metadata={"Date": None, "Creator": None})
    return clean_svg(buf.getvalue(), prefix)


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100)


def safe(fn, *args, **kw) -> dict:
    """Run a chart function; ``{"svg": ...}`` or ``{"error": "..."}`` (the report never fails on a chart)."""
    try:
        import matplotlib

        with matplotlib.rc_context(_RC):
            svg = fn(*args, **kw)
        return {"svg": svg} if svg else {}
    except Exception as e:  # noqa: BLE001 - a chart must never sink the report
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def _median(m: dict | None) -> float | None:
    return None if not m else m.get("median")


# --------------------------------------------------------------------------------------------
def ratio_chart(rows: list[dict], candidates: list[str], base: str, min_effect: float, prefix: str = "ratio",
                what: str | None = None) -> str | None:
    """Forest plot: per case, each candidate's wall ratio vs the baseline with its 95 % CI, log x,
    coloured by verdict; the grey band is the ±min_effect zone called "same"."""
    items = []  # (row index, candidate index, cmp)
    for i, r in enumerate(rows):
        for j, c in enumerate(r["comps"]):
            if c.get("wall"):
                items.append((i, j, c["wall"]))
    if not items:
        return None
    n, k = len(rows), max(1, len(candidates))
    fig = _figure(7.6, 0.9 + 0.27 * n * max(1, k * 0.75))
    ax = fig.add_subplot()
    ax.set_xscale("log")
    up, down = 1 + min_effect, 1 / (1 + min_effect)
    ax.axvspan(down, up, color="#eef0f2", zorder=0, lw=0)
    ax.axvline(1.0, color="#6b7280", lw=0.9, zorder=1)
    def bounds(c):  # an anytime interval still unbounded, or a ratio between runs (no interval), as its point only
        lo, hi = c.get("ci_low"), c.get("ci_high")
        if c.get("between_runs") or not lo or hi is None or hi == float("inf"):
            return c["ratio"], c["ratio"]
        return lo, hi

    lo_all = min(min(bounds(c)[0], c["ratio"]) for _, _, c in items)
    hi_all = max(max(bounds(c)[1], c["ratio"]) for _, _, c in items)
    lo_all, hi_all = min(lo_all, down) / 1.08, max(hi_all, up) * 1.08
    span = 0.7 / k
    for i, j, c in items:
        y = i + (j - (k - 1) / 2) * span
        col = VERDICT_COLORS.get(c["verdict"], "#333")
        ax.plot(list(bounds(c)), [y, y], color=col, lw=2.2, solid_capstyle="butt", zorder=3)
        mk = "os^Dv<>p"[j % 8]
        ax.plot([c["ratio"]], [y], marker=mk, ms=6, color=col, mec="white", mew=0.8, zorder=4, ls="none")
        txt = f"{c['ratio']:.2f}x" + (f" ({1 / c['ratio']:.2f}x faster)" if c["verdict"] == "faster" else "")
        ax.annotate(txt, (max(bounds(c)[1], c["ratio"]), y), xytext=(5, 0), textcoords="offset points",
                    va="center", fontsize=8, color=col)
    ax.set_xlim(lo_all, hi_all * (1.35 if hi_all / lo_all < 4 else 1.6))
    for i, j, c in items:  # an interval not yet bounded (too few sets): a dotted line across the axis
        lo, hi = c.get("ci_low"), c.get("ci_high")
        if not c.get("between_runs") and (not lo or hi is None or hi == float("inf")):
            y = i + (j - (k - 1) / 2) * span
            ax.plot(list(ax.get_xlim()), [y, y], ls=":", lw=1.2, color=VERDICT_COLORS.get(c["verdict"], "#333"),
                    zorder=2)
    for i, r in enumerate(rows):
        if not any(c.get("wall") for c in r["comps"]):
            ax.text(0.01, i, "not compared", transform=ax.get_yaxis_transform(), va="center", fontsize=7.5,
                    color="#6b7280")
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_yticklabels([plain(f"{r['short']}  {r['op']}") for r in rows])
    ax.grid(axis="y", visible=False)
    _ratio_ticks(ax, lo_all, hi_all)
    points = all(c.get("between_runs") for _, _, c in items)  # between runs: the ratios alone (no interval)
    some = any(c.get("between_runs") for _, _, c in items)
    ax.set_xlabel("wall time ratio, " + plain(what or f"candidate / baseline {base}") + "  (← faster · slower →)"
                  + (", provisional: no interval between runs" if points else
                     ", with its interval (between runs: a point, provisional)" if some else ", with its interval"))
    if k > 1:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], marker="os^Dv<>p"[j % 8], color="#444", ls="none", label=plain(cand))
                   for j, cand in enumerate(candidates)]
        ax.legend(handles=handles, loc="lower right", ncol=k)
    ax.text(1.0, 1.0, f"grey band: within ±{min_effect:.0%}" + ("" if points else " (\"same\" zone)"), transform=ax.transAxes,
            ha="right", va="bottom", fontsize=7.5, color="#6b7280")
    return to_svg(fig, prefix)


#: The set chart's marker for a set run in the machine's slow mode (report.machine_modes)
SLOW_MODE_COLOR = "#7c3aed"  # not among ENV_COLORS nor VERDICT_COLORS (new-user trial: blue was the baseline's)


def set_ratio_chart(comparisons: list[dict], prefix: str = "sets", titles: dict | None = None,
                    slow_sets=None) -> str | None:
    """Small multiples, one panel per wall comparison of a lockstep run: each process set's ratio
    (candidate / baseline wall time, exp of ``set_log_ratios``) against its set id, the run's ratio
    as a line and its interval as a band (both tinted by verdict; the y range always holds the
    whole interval). It shows what an interval's width is made of: sets scattered about one level
    (noise, which more sets narrow) or sets jumping between levels (the machine changed state
    during the run: on the H200 on 2026-12-05 a batch-2 forward ratio ran ~2.0x in some sets and
    ~2.9x in others, benchmarks/heavy_mode.py). ``comparisons``: results.json ``comparisons``; only
    paired wall comparisons with 3 or more sets are drawn (at most 24, in run order; the figure
    says so when it leaves some out). ``titles``: {case id: panel title} (the report's short
    labels, with the dtype where a run has several; else the comparison's label and op).
    ``slow_sets``: ids of the sets that ran in a slow mode of the machine (report.machine_modes),
    drawn as hollow violet rings. None when there is nothing to draw."""
    items = [c for c in comparisons if c.get("metric") == "wall_us" and c.get("paired") is not False
             and len(c.get("set_log_ratios") or []) >= 3 and len(c.get("sets") or []) == len(c["set_log_ratios"])
             and isinstance(c.get("ratio"), (int, float)) and c["ratio"] > 0]
    if not items:
        return None
    n_all, items = len(items), items[:24]
    from matplotlib.ticker import MaxNLocator

    many = len({(c.get("baseline"), c.get("candidate")) for c in items}) > 1
    ncol = min(4, len(items))
    nrow = math.ceil(len(items) / ncol)
    row_h = 1.5 + (0.15 if many else 0.0)  # a third title line: which pair
    height = 0.35 + row_h * nrow
    fig = _figure(7.6, height)
    for k, c in enumerate(items):
        ax = fig.add_subplot(nrow, ncol, k + 1)
        col = VERDICT_COLORS.get(c.get("verdict"), "#333")
        xs = [int(s) if str(s).lstrip("-").isdigit() else i for i, s in enumerate(c["sets"])]
        ys = [math.exp(v) for v in c["set_log_ratios"]]
        lo, hi = c.get("ci_low"), c.get("ci_high")
        shown = ys + [c["ratio"]]
        if lo and hi and math.isfinite(hi):
            ax.axhspan(lo, hi, color=col, alpha=0.15, lw=0, zorder=1)
            shown += [lo, hi]  # the whole interval in view (new-user trial: a short run's band filled the panel)
        ax.axhline(c["ratio"], color=col, lw=1.0, zorder=2)
        slow = {str(x) for x in slow_sets or ()}
        is_slow = [str(sid) in slow for sid in c["sets"]]
        pts = [(x, y) for x, y, f in zip(xs, ys, is_slow) if not f]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="none", marker="o", ms=2.6, color="#374151", zorder=3)
        if any(is_slow):  # the machine's slow mode (report.machine_modes): hollow rings
            pts = [(x, y) for x, y, f in zip(xs, ys, is_slow) if f]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="none", marker="o", ms=3.2, mfc="none",
                    mec=SLOW_MODE_COLOR, mew=0.9, zorder=3)
        top, bot = max(shown), min(shown)
        pad = max((top - bot) * 0.08, c["ratio"] * 0.01)
        ax.set_ylim(bot - pad, top + pad)
        title = (titles or {}).get(c.get("case")) or f"{c.get('label', '')} {c.get('op', '')}".strip()
        if many:  # on a line of its own (new-user trial: one line ran into the next panel's title)
            title += f"\n{c.get('candidate')} / {c.get('baseline')}"
        ax.set_title(plain(title) + f"\nsets {min(ys):.2f}-{max(ys):.2f}x", fontsize=7, pad=2, linespacing=1.1)
        ax.tick_params(labelsize=6.5, length=2, pad=1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
        ax.grid(axis="x", visible=False)
        if k // ncol == nrow - 1 or k + ncol >= len(items):
            ax.set_xlabel("process set", fontsize=7)
    if n_all > len(items):  # a wide run (several candidates): say what is left out, not silently
        fig.suptitle(f"the first {len(items)} of {n_all} wall comparisons (run order); every one is in results.json",
                     fontsize=7, color="#6b7280", y=0.999, va="top")
    fig.subplots_adjust(left=0.06, right=0.99, top=1 - (0.4 + (0.12 if many else 0.0)) / height, bottom=0.5 / height,
                        hspace=1.0 if many else 0.9, wspace=0.28)
    return to_svg(fig, prefix)


def _ratio_ticks(ax, lo: float, hi: float) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    cands = [0.25, 0.33, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 4, 6, 8, 10, 20, 50, 100]
    ticks = [t for t in cands if lo <= t <= hi]
    if len(ticks) > 9:
        ticks = [t for t in ticks if t in (0.25, 0.5, 1.0, 2, 4, 10, 20, 50, 100)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{t:g}" for t in ticks])


# --------------------------------------------------------------------------------------------
def breakdown_chart(rows: list[dict], labels: list[str], prefix: str = "brk") -> str | None:
    """Small multiples, one panel per case: a bar per env, stacked device (kernel) time and the
    rest of wall time (non-overlapped host time). Without a device clock (CPU) a bar is wall only."""
    panels = [r for r in rows if any(e["case"]["status"] == "ok" and e["m"].get("wall_us") for e in r["envs"])]
    if not panels:
        return None
    ncol = min(4, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    nenv = len(labels)
    ph = 0.62 + 0.24 * nenv
    from matplotlib.ticker import MaxNLocator

    fig = _figure(2.45 * ncol + 0.6, ph * nrow + 0.55)
    axes = fig.subplots(nrow, ncol, squeeze=False)
    any_device = False
    for idx, ax in enumerate(axes.flat):
        if idx >= len(panels):
            ax.set_visible(False)
            continue
        r = panels[idx]
        by = {e["label"]: e for e in r["envs"]}
        ymax = 0.0
        for y, lab in enumerate(labels):
            e = by.get(lab)
            col = env_color(y)
            if not e or e["case"]["status"] != "ok" or not e["m"].get("wall_us"):
                ax.text(0, y, "  " + ("failed" if e else "not run"), va="center", fontsize=7.5, color="#a4161a")
                continue
            wall = _median(e["m"]["wall_us"])
            dev = _median(e["m"].get("device_us"))
            if dev is not None:
                any_device = True
                d = min(dev, wall)
                ax.barh(y, d, color=col, height=0.62)
                ax.barh(y, max(wall - d, 0.0), left=d, facecolor=_tint(col, 0.78), height=0.62, hatch="/////",
                        edgecolor=_tint(col, 0.35), lw=0)
            else:
                ax.barh(y, wall, color=col, alpha=0.55, height=0.62)
            ymax = max(ymax, wall)
            ax.text(wall, y, f" {_fmt(wall)}", va="center", fontsize=7.5, color="#1b1f24")
        ax.set_xlim(0, (ymax or 1) * 1.42)
        ax.set_ylim(nenv - 0.5, -0.5)
        ax.set_yticks(range(nenv))
        ax.set_yticklabels([plain(lab) for lab in labels] if idx % ncol == 0 else [""] * nenv, fontsize=7.5)
        ax.tick_params(axis="x", labelsize=7)
        ax.tick_params(axis="y", length=0)
        ax.grid(axis="y", visible=False)
        ax.set_title(plain(f"{r['short']} {r['op']}"), fontsize=8.5, loc="left")
        ax.xaxis.set_major_locator(MaxNLocator(3))
    from matplotlib.patches import Patch

    if any_device:
        handles = [Patch(color="#555", label="device: kernel time (profiler)"),
                   Patch(facecolor=_tint("#555555", 0.78), hatch="/////", edgecolor=_tint("#555555", 0.35), lw=0,
                         label="rest of wall: non-overlapped host time (dispatch, sync)")]
        title = "µs per call (median): wall = device + non-overlapped host"
    else:
        handles = [Patch(color="#555", alpha=0.55, label="wall time (no device clock: CPU run)")]
        title = "µs per call (median wall time)"
    fig.tight_layout(h_pad=0.6, w_pad=0.8)
    fig.legend(handles=handles, loc="lower left", ncol=2, bbox_to_anchor=(0.0, 1.0), fontsize=8, title=title,
               title_fontsize=8.5, alignment="left")
    return to_svg(fig, prefix)


def _tint(color: str, f: float) -> str:
    """``color`` mixed with white: f=0 the colour, f=1 white."""
    c = color.lstrip("#")
    r, g, b = (int(c[i:i + 2], 16) for i in (0, 2, 4))
    return "#" + "".join(f"{round(x + (255 - x) * f):02x}" for x in (r, g, b))


def _fmt(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


# --------------------------------------------------------------------------------------------
def sweep_groups(rows: list[dict], axis: str) -> list[dict]:
    """Cases grouped so that only ``axis`` ("seqlen" or "batch") varies inside a group; groups with
    fewer than two x values are dropped. Each group: {title, x: [...], rows: [...]} sorted by x."""
    groups: dict = {}
    for r in rows:
        c = r["case"]
        sq, sk = c.get("seqlen_q"), c.get("seqlen_k")
        if axis == "seqlen":
            x = sq
            key = (c.get("op"), c.get("batch"), "=" if sk == sq else sk, c.get("nheads"), c.get("nheads_k"),
                   c.get("head_dim"), c.get("dtype"), c.get("causal"), c.get("dropout_p"), c.get("impl"))
            title = f"{c.get('op')} · B{c.get('batch')}"
        else:
            x = c.get("batch")
            key = (c.get("op"), sq, sk, c.get("nheads"), c.get("nheads_k"), c.get("head_dim"), c.get("dtype"),
                   c.get("causal"), c.get("dropout_p"), c.get("impl"))
            title = f"{c.get('op')} · S{sq}" + (f"/{sk}" if sk != sq else "")
        if c.get("impl") not in (None, "flash_attn"):  # impls are an axis too: sdpa is not the same curve
            title += f" [{c.get('impl')}]"
        if x is None:
            continue
        g = groups.setdefault(key, {"title": title, "pts": {}})
        g["pts"].setdefault(x, r)
    out = []
    for g in groups.values():
        if len(g["pts"]) < 2:
            continue
        xs = sorted(g["pts"])
        out.append({"title": g["title"], "x": xs, "rows": [g["pts"][x] for x in xs]})
    # disambiguate identical titles (two head dims, dtypes or causal settings): add what differs
    same: dict = {}
    for g in out:
        same.setdefault(g["title"], []).append(g)

    def parts(g: dict) -> list[str]:
        c = g["rows"][0]["case"]
        return [" ".join(t for t in str(g["rows"][0].get("label") or "").split() if t[0] in "HD"),
                str(c.get("dtype") or ""), "causal" if c.get("causal") else "non-causal"]

    for gs in same.values():
        if len(gs) > 1:
            ps = [parts(g) for g in gs]
            differ = [j for j in range(3) if len({p[j] for p in ps}) > 1]
            for g, p in zip(gs, ps):
                g["title"] += "".join(" · " + p[j] for j in differ if p[j])
    return out


def sweep_chart(rows: list[dict], labels: list[str], axis: str, bands: dict, prefix: str = "sweep") -> str | None:
    """Time vs seqlen (or batch), one panel per group, one colour per env: wall median (solid, with
    its 95 % CI band from ``bands[(env, case_id)] = (lo, hi)``) and device time (dashed). A filled
    marker is device-bound, an open one host-bound (host dispatch ≥ kernel time)."""
    groups = sweep_groups(rows, axis)
    if not groups:
        return None
    ncol = min(4, len(groups))
    nrow = math.ceil(len(groups) / ncol)
    fig = _figure(2.75 * ncol + 0.4, 2.25 * nrow + 0.6)
    axes = fig.subplots(nrow, ncol, squeeze=False)
    any_device = any_hb = False
    for idx, ax in enumerate(axes.flat):
        if idx >= len(groups):
            ax.set_visible(False)
            continue
        g = groups[idx]
        for j, lab in enumerate(labels):
            col = env_color(j)
            xs, wall, lo, hi, dev, hb = [], [], [], [], [], []
            for x, r in zip(g["x"], g["rows"]):
                e = next((e for e in r["envs"] if e["label"] == lab), None)
                if not e or e["case"]["status"] != "ok" or not e["m"].get("wall_us"):
                    continue
                w = _median(e["m"]["wall_us"])
                b = bands.get((lab, r["id"])) or (w, w)
                xs.append(x)
                wall.append(w)
                lo.append(b[0])
                hi.append(b[1])
                dev.append(_median(e["m"].get("device_us")))
                hb.append(e["case"].get("host_bound"))
            if not xs:
                continue
            ax.fill_between(xs, lo, hi, color=col, alpha=0.18, lw=0)
            ax.plot(xs, wall, color=col, lw=1.6, label=plain(lab))
            for x, w, h in zip(xs, wall, hb):
                any_hb = any_hb or bool(h)
                ax.plot([x], [w], marker="o", ms=5.5, color=col, mfc="white" if h else col, mew=1.4, ls="none")
            if any(d is not None for d in dev):
                any_device = True
                dx = [x for x, d in zip(xs, dev) if d is not None]
                dy = [d for d in dev if d is not None]
                ax.plot(dx, dy, color=col, lw=1.1, ls=(0, (4, 2.5)), alpha=0.9)
        ax.set_yscale("log")
        if g["x"][-1] / max(g["x"][0], 1) > 20:
            ax.set_xscale("log")
        ax.set_xticks(g["x"])
        ax.set_xticklabels([str(x) for x in g["x"]], fontsize=7.5)
        ax.minorticks_off()
        from matplotlib.ticker import LogLocator, FuncFormatter

        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.tick_params(axis="y", labelsize=7.5)
        ax.set_title(plain(g["title"]), loc="left", fontsize=8.5)
        if idx % ncol == 0:
            ax.set_ylabel("µs per call")
        ax.set_xlabel("seqlen" if axis == "seqlen" else "batch", fontsize=8)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=env_color(j), lw=1.8, label=plain(lab)) for j, lab in enumerate(labels)]
    handles.append(Line2D([], [], color="#555", lw=1.6, label="wall (band: 95% CI of the median)"))
    if any_device:
        handles.append(Line2D([], [], color="#555", lw=1.1, ls=(0, (4, 2.5)), label="device (kernel time)"))
        handles.append(Line2D([], [], color="#555", marker="o", mfc="white", ls="none", label="host-bound"))
        handles.append(Line2D([], [], color="#555", marker="o", ls="none", label="device-bound"))
    fig.legend(handles=handles, loc="lower left", ncol=min(len(handles), 7), bbox_to_anchor=(0.0, 1.0), fontsize=8)
    fig.tight_layout(h_pad=0.8, w_pad=0.8)
    return to_svg(fig, prefix)


# --------------------------------------------------------------------------------------------
def correctness_chart(rows: list[dict], labels: list[str], prefix: str = "corr") -> str | None:
    """Dot plot of the relative error vs the fp32 reference, per case, tensor (marker) and env
    (colour), log x, with each case's tolerance as a red tick."""
    have = [r for r in rows if any((e["case"].get("correctness") or {}).get("tensors") for e in r["envs"])]
    if not have:
        return None
    n, k = len(rows), max(1, len(labels))
    fig = _figure(7.6, 0.85 + 0.25 * n)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    span = 0.6 / k
    vals, tensors_seen = [], set()
    for i, r in enumerate(rows):
        tol = None
        checked = False
        for j, lab in enumerate(labels):
            e = next((e for e in r["envs"] if e["label"] == lab), None)
            cr = (e or {}).get("case", {}).get("correctness") or {}
            if not cr.get("tensors"):
                continue
            checked = True
            tol = cr.get("tolerance", tol)
            y = i + (j - (k - 1) / 2) * span
            for name, v in cr["tensors"].items():
                x = max(float(v.get("rel_err") or 0.0), 1e-9)
                bad = not v.get("finite", True) or (tol is not None and x > tol)
                tensors_seen.add(name)
                vals.append(x)
                ax.plot([x], [y], marker=TENSOR_MARKERS.get(name, "P"), ms=5, ls="none", color=env_color(j),
                        mec="#a4161a" if bad else "white", mew=1.2 if bad else 0.6, alpha=0.9)
        if tol is not None:
            ax.plot([tol, tol], [i - 0.42, i + 0.42], color="#c62828", lw=1.2)
            vals.append(tol)
        if not checked:
            ax.text(0.01, i, "not checked", transform=ax.get_yaxis_transform(), va="center", fontsize=7.5,
                    color="#6b7280")
    lo, hi = min(vals), max(vals)
    ax.set_xlim(lo / 3, hi * 3)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_yticklabels([plain(f"{r['short']}  {r['op']}") for r in rows])
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("relative error vs fp32 reference (‖x − ref‖ / ‖ref‖, worst over checks); red tick: tolerance")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=env_color(j), marker="o", ls="none", label=plain(lab)) for j, lab in enumerate(labels)]
    handles += [Line2D([], [], color="#555", marker=TENSOR_MARKERS.get(t, "P"), ls="none", label=plain(t))
                for t in sorted(tensors_seen, key=lambda t: list(TENSOR_MARKERS).index(t) if t in TENSOR_MARKERS else 9)]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles), fontsize=8)
    return to_svg(fig, prefix)
