"""Stage 5b — the report: self-contained HTML (jinja2, autoescaped), the terminal table (rich) and a
Markdown summary. Everything here renders from a results dict (results.json), never from live state.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

VERDICT_WORD = {"faster": "faster", "slower": "slower", "same": "same", "ambiguous": "ambiguous"}
METRIC_NAMES = {"wall_us": "wall", "host_us": "host", "device_us": "device", "graph_us": "graph"}


def fmt_us(v) -> str:
    """µs with sensible precision: 5.31, 41.5, 1056."""
    if v is None:
        return "–"
    v = float(v)
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_ratio(c: dict | None) -> str:
    if not c:
        return "–"
    return f"{c['ratio']:.2f}x [{c['ci_low']:.2f}, {c['ci_high']:.2f}]"


def headline(c: dict) -> str:
    """'2.7.0.post2 3.06x slower' style phrase for a wall comparison."""
    r = c["ratio"]
    if c["verdict"] == "slower":
        return f"{r:.2f}x slower"
    if c["verdict"] == "faster":
        return f"{1 / r:.2f}x faster"
    if c["verdict"] == "same":
        return "same (within ±{:.0%})".format(0.05)
    return "ambiguous"


def view_model(res: dict) -> dict:
    """Reshape results for templates: per case rows with each env's clocks and each comparison."""
    envs = res.get("envs", [])
    labels = [e["label"] for e in envs]
    ok_labels = [e["label"] for e in envs if e["status"] == "ok"]
    base = ok_labels[0] if ok_labels else None
    cases = res.get("cases", [])
    by = {(c["env"], c["id"]): c for c in cases}
    ids = list(dict.fromkeys(c["id"] for c in cases))
    cmps = {}
    for c in res.get("comparisons", []):
        cmps[(c["candidate"], c["case"], c["metric"])] = c
    rows = []
    for cid in ids:
        any_case = next(by[(lab, cid)] for lab in labels if (lab, cid) in by)
        per_env = []
        for lab in labels:
            c = by.get((lab, cid))
            if c is None:
                continue
            m = c.get("metrics", {})
            per_env.append({"label": lab, "case": c, "m": {k: m.get(k) for k in METRIC_NAMES}})
        comps = []
        for lab in ok_labels[1:]:
            w = cmps.get((lab, cid, "wall_us"))
            comps.append({"candidate": lab, "wall": w, "host": cmps.get((lab, cid, "host_us")),
                          "device": cmps.get((lab, cid, "device_us")), "graph": cmps.get((lab, cid, "graph_us"))})
        host_bound = [e["label"] for e in per_env if e["case"].get("host_bound")]
        rows.append({"id": cid, "label": any_case["label"], "op": any_case["op"], "case": any_case,
                     "envs": per_env, "comps": comps, "host_bound": host_bound})
    wrong = [(c["env"], c["label"], c["op"]) for c in cases
             if (c.get("correctness") or {}).get("ok") is False]
    failed_cases = [c for c in cases if c["status"] not in ("ok",)]
    return {"res": res, "labels": labels, "ok_labels": ok_labels, "base": base, "rows": rows,
            "candidates": ok_labels[1:], "wrong": wrong, "failed_cases": failed_cases}


def _env() -> Environment:
    env = Environment(loader=PackageLoader("matrix_runner", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["us"] = fmt_us
    env.filters["ratio"] = fmt_ratio
    env.filters["headline"] = headline
    env.filters["pct"] = lambda v: "–" if v is None else f"{v:.0%}"
    env.filters["tf"] = lambda v: "–" if v is None else f"{v:.2f}"
    env.filters["sci"] = lambda v: "–" if v is None else f"{v:.1e}"
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=1, default=str)
    return env


def render_html(res: dict, json_name: str | None = "results.json") -> str:
    """The self-contained HTML report for ``res`` (no external fetches; CSS inline)."""
    vm = view_model(res)
    vm["json_name"] = json_name
    return _env().get_template("report.html.j2").render(**vm)


def write_html(res: dict, out_dir: Path, json_name: str | None = "results.json") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / "index.html"
    tmp = out_dir / ".index.html.tmp"
    tmp.write_text(render_html(res, json_name), encoding="utf-8")
    tmp.replace(p)
    return p


def markdown(res: dict) -> str:
    """A GitHub-comment-sized summary: the verdict table in Markdown."""
    vm = view_model(res)
    lines = [f"### {res.get('title', 'matrix-run')}", ""]
    m = res.get("machine") or {}
    lines.append(f"{m.get('gpu') or 'CPU'} · driver {m.get('driver') or '–'} · CUDA {m.get('cuda') or '–'} · "
                 f"torch {m.get('torch') or '–'} · baseline **{vm['base']}**")
    lines.append("")
    hdr = "| case | op | " + " | ".join(f"{lab} wall µs" for lab in vm["labels"]) + " | " + \
          " | ".join(f"{c} vs {vm['base']}" for c in vm["candidates"]) + " |"
    lines += [hdr, "|" + "---|" * (2 + len(vm["labels"]) + len(vm["candidates"]))]
    for r in vm["rows"]:
        cells = [r["label"], r["op"]]
        for e in r["envs"]:
            w = e["m"]["wall_us"]
            cells.append(fmt_us(w["median"]) if w else e["case"]["status"])
        for c in r["comps"]:
            w = c["wall"]
            cells.append(f"{w['verdict']} {fmt_ratio(w)}" + (f" ({w['attribution']})" if w.get("attribution") else "")
                         if w else "–")
        lines.append("| " + " | ".join(html.escape(str(x)) for x in cells) + " |")
    lines.append("")
    lines.append("ratio = candidate / baseline wall time (median of per-process medians), 95% bootstrap CI.")
    return "\n".join(lines) + "\n"


def terminal_table(res: dict, console=None) -> None:
    """Print the verdict table with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    vm = view_model(res)
    t = Table(title=res.get("title"), show_lines=False)
    t.add_column("case")
    t.add_column("op")
    for lab in vm["labels"]:
        t.add_column(f"{lab}\nwall / host / dev µs", justify="right")
    for c in vm["candidates"]:
        t.add_column(f"{c} vs {vm['base']}\nwall ratio [95% CI]", justify="left")
    colors = {"slower": "red", "faster": "green", "same": "white", "ambiguous": "yellow"}
    for r in vm["rows"]:
        cells = [r["label"], r["op"]]
        for e in r["envs"]:
            m = e["m"]
            if e["case"]["status"] != "ok":
                cells.append(f"[red]{e['case']['status']}: {e['case'].get('error_kind') or ''}[/]")
                continue
            cells.append(" / ".join(fmt_us(m[k]["median"]) if m.get(k) else "–" for k in ("wall_us", "host_us", "device_us"))
                         + (" [dim]host-bound[/]" if e["case"].get("host_bound") else ""))
        for c in r["comps"]:
            w = c["wall"]
            if not w:
                cells.append("–")
                continue
            col = colors[w["verdict"]]
            attr = f" · {w['attribution']}" if w.get("attribution") else ""
            cells.append(f"[{col}]{w['verdict']}[/] {fmt_ratio(w)}{attr}")
        t.add_row(*cells)
    console.print(t)
